"""The data descriptor (SQE bytes 24-39) of a command on an NVMe/RDMA queue.

A command's data is either in the capsule, after the SQE (an SGL Data Block descriptor,
sub type Offset: the controller finds it in the receive buffer), or in host memory the host
registered (a Keyed SGL Data Block descriptor: the controller moves it with RDMA READ for a
write, RDMA WRITE for a read, naming the host's remote key). Layout of the keyed
descriptor, little endian: address 0-7, length 8-10 (24 bits, so at most 16 MiB - 1),
key 11-14, SGL identifier 15 (descriptor type in bits 7:4, sub type in bits 3:0). Sub type
Invalidate Key asks the controller to invalidate the key when it sends the completion
(SEND with Invalidate); sub type Address does not.

The statuses a bad descriptor earns are the ones Linux's nvmet-rdma answers with (all with
DNR): an unknown descriptor type SGL Descriptor Type Invalid; an unknown sub type, or
in-capsule data on a command that moves no data to the controller, Invalid Field; in-capsule
data past the capsule's limit SGL Offset Invalid; a length other than what the capsule
carries, or a keyed length short of the command's transfer or above the transport's limit,
Data SGL Length Invalid.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Final

from pynvmf.spec.status import DNR, Status

DESCRIPTOR_SIZE: Final = 16
# Where the descriptor starts in a submission queue entry (DPTR).
SQE_DPTR_OFFSET: Final = 24
KEYED_MAX_LENGTH: Final = (1 << 24) - 1

_KEYED = struct.Struct("<Q3sIB")
_PLAIN = struct.Struct("<QI3xB")


class DescriptorType(IntEnum):
    """SGL descriptor types (identifier bits 7:4) an NVMe/RDMA command may carry."""

    DATA_BLOCK = 0x0
    KEYED_DATA_BLOCK = 0x4


class SubType(IntEnum):
    """SGL descriptor sub types (identifier bits 3:0) used with those types."""

    ADDRESS = 0x0
    OFFSET = 0x1
    INVALIDATE_KEY = 0xF


class SglError(ValueError):
    """A descriptor the controller refuses: ``field`` names it, ``status`` is the completion
    status (with DNR) the command fails with."""

    def __init__(self, message: str, *, field: str, status: int) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status = status


@dataclasses.dataclass(frozen=True)
class KeyedSgl:
    """Host memory a command's data moves to or from by RDMA."""

    address: int
    length: int
    key: int
    invalidate: bool = False

    def encode(self) -> bytes:
        if not 0 <= self.length <= KEYED_MAX_LENGTH:
            raise ValueError(f"length: {self.length} is not in 0..{KEYED_MAX_LENGTH}")
        sub = SubType.INVALIDATE_KEY if self.invalidate else SubType.ADDRESS
        ident = (DescriptorType.KEYED_DATA_BLOCK << 4) | sub
        return _KEYED.pack(self.address, self.length.to_bytes(3, "little"), self.key, ident)


@dataclasses.dataclass(frozen=True)
class InCapsule:
    """Data carried in the command capsule, ``offset`` bytes after the SQE."""

    offset: int
    length: int

    def encode(self) -> bytes:
        ident = (DescriptorType.DATA_BLOCK << 4) | SubType.OFFSET
        return _PLAIN.pack(self.offset, self.length, ident)


DataDescriptor = KeyedSgl | InCapsule


@dataclasses.dataclass(frozen=True)
class CommandData:
    """What the controller knows of a command when it reads its descriptor."""

    # The command moves data from the host to the controller (a write).
    host_to_controller: bool
    # Bytes of data the capsule carried after the SQE.
    in_capsule_bytes: int
    # The largest in-capsule data the queue takes for this command (the port's in-capsule
    # size; a Connect's 1 KiB always).
    in_capsule_limit: int
    # Bytes the command transfers (NLB x block size, a log page's length...).
    transfer_length: int
    # The largest transfer the transport takes (MDTS in bytes).
    max_transfer: int


def _refuse(message: str, field: str, status: Status) -> SglError:
    return SglError(message, field=field, status=status | DNR)


def _data_block(raw: bytes, sub: int, cmd: CommandData) -> DataDescriptor:
    offset, length, _ = _PLAIN.unpack(raw)
    if sub != SubType.OFFSET:
        raise _refuse(
            f"data block sub type {sub:#x} is not Offset", "sgl.subtype", Status.INVALID_FIELD
        )
    if length and not cmd.host_to_controller:
        raise _refuse(
            "in-capsule data on a command that moves no data to the controller",
            "sgl.subtype",
            Status.INVALID_FIELD,
        )
    if offset + length > cmd.in_capsule_limit:
        raise _refuse(
            f"in-capsule data at {offset}+{length} is past the limit {cmd.in_capsule_limit}",
            "sgl.address",
            Status.SGL_INVALID_OFFSET,
        )
    if offset + length != cmd.in_capsule_bytes:
        raise _refuse(
            f"{offset}+{length} bytes described, the capsule carried {cmd.in_capsule_bytes}",
            "sgl.length",
            Status.SGL_INVALID_DATA,
        )
    return InCapsule(offset=offset, length=length)


def _keyed(raw: bytes, sub: int, cmd: CommandData) -> DataDescriptor:
    address, length3, key, _ = _KEYED.unpack(raw)
    length = int.from_bytes(length3, "little")
    if sub not in (SubType.ADDRESS, SubType.INVALIDATE_KEY):
        raise _refuse(
            f"keyed data block sub type {sub:#x} is neither Address nor Invalidate Key",
            "sgl.subtype",
            Status.INVALID_FIELD,
        )
    if cmd.in_capsule_bytes:
        # Data in the capsule and a keyed descriptor: the command names two places.
        raise _refuse(
            f"{cmd.in_capsule_bytes} bytes in the capsule of a keyed command",
            "sgl.type",
            Status.SGL_INVALID_TYPE,
        )
    if length < cmd.transfer_length:
        raise _refuse(
            f"{length} bytes described, the command transfers {cmd.transfer_length}",
            "sgl.length",
            Status.SGL_INVALID_DATA,
        )
    if length > cmd.max_transfer:
        raise _refuse(
            f"{length} bytes is above the transport's largest transfer {cmd.max_transfer}",
            "sgl.length",
            Status.SGL_INVALID_DATA,
        )
    return KeyedSgl(
        address=address, length=length, key=key, invalidate=sub == SubType.INVALIDATE_KEY
    )


# Descriptor type -> its parser: the types an NVMe/RDMA command may carry.
_PARSERS: Final[dict[int, Callable[[bytes, int, CommandData], DataDescriptor]]] = {
    DescriptorType.DATA_BLOCK: _data_block,
    DescriptorType.KEYED_DATA_BLOCK: _keyed,
}


def parse_descriptor(raw: bytes | bytearray | memoryview, cmd: CommandData) -> DataDescriptor:
    """The command's data descriptor, checked against what the command and the queue allow;
    SglError (naming the field, with the status to complete the command with) otherwise."""
    raw = bytes(raw)
    if len(raw) != DESCRIPTOR_SIZE:
        raise ValueError(f"an SGL descriptor is {DESCRIPTOR_SIZE} bytes, got {len(raw)}")
    ident = raw[15]
    parser = _PARSERS.get(ident >> 4)
    if parser is None:
        raise _refuse(
            f"descriptor type {ident >> 4:#x} is not a data block or keyed data block",
            "sgl.type",
            Status.SGL_INVALID_TYPE,
        )
    return parser(raw, ident & 0xF, cmd)


def parse_sqe_descriptor(sqe: bytes | bytearray | memoryview, cmd: CommandData) -> DataDescriptor:
    """parse_descriptor of a 64-byte submission queue entry's DPTR."""
    view = memoryview(sqe)
    return parse_descriptor(view[SQE_DPTR_OFFSET : SQE_DPTR_OFFSET + DESCRIPTOR_SIZE], cmd)
