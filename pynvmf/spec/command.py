"""Submission and completion queue entries, SGL descriptors, and the Fabrics
command layouts (Connect, Property Get/Set). Pure data: parse and build bytes."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple

SQE_SIZE: Final = 64
CQE_SIZE: Final = 16

# opcode, flags, cid, nsid, (cdw2, cdw3, mptr skipped), sgl addr, sgl length, sgl type,
# cdw10..cdw15
_SQE = struct.Struct("<BBHI16xQI3xB6I")
_CQE = struct.Struct("<IIHHHH")

# SGL descriptor type byte: (descriptor type << 4) | sub type
SGL_DATA_BLOCK_OFFSET: Final = 0x01  # in-capsule data: address is an offset into the capsule
SGL_TRANSPORT_DATA_BLOCK: Final = 0x5A  # data moved by the transport (R2T/H2CData, C2HData)

# Command flags byte: PSDT in bits 7:6; 01b or 10b select SGLs (fabrics require them).
FLAG_PSDT_MASK: Final = 0xC0
FUSE_MASK: Final = 0x03
# FUSE (flags bits 1:0): the first and the second command of a fused operation; 11b is
# reserved. Compare and Write is the one fused operation (Compare first, Write second).
FUSE_FIRST: Final = 0x01
FUSE_SECOND: Final = 0x02


class Sqe(NamedTuple):
    """A decoded submission queue entry. `cdw` holds CDW10..CDW15.

    A tuple: decoding one is a single C call (`Sqe.unpack`, or `new_sqe` on the hot
    path), where a class with an __init__ would cost a Python call per command."""

    opcode: int
    flags: int
    cid: int
    nsid: int
    sgl_addr: int
    sgl_length: int
    sgl_type: int
    cdw10: int
    cdw11: int
    cdw12: int
    cdw13: int
    cdw14: int
    cdw15: int

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, offset: int = 0) -> Sqe:
        return tuple.__new__(cls, _SQE.unpack_from(data, offset))

    def pack(self) -> bytes:
        return _SQE.pack(
            self.opcode,
            self.flags,
            self.cid,
            self.nsid,
            self.sgl_addr,
            self.sgl_length,
            self.sgl_type,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
        )

    @property
    def fctype(self) -> int:
        """Fabrics command type: byte 4, where other commands have the NSID."""
        return self.nsid & 0xFF


# The decoding of a submission queue entry for the transport's hot path:
# new_sqe(Sqe, unpack_sqe(pdu, offset)) builds one without a Python-level call.
new_sqe = tuple.__new__
unpack_sqe = _SQE.unpack_from


def build_sqe(
    opcode: int,
    cid: int,
    nsid: int = 0,
    cdw10: int = 0,
    cdw11: int = 0,
    cdw12: int = 0,
    cdw13: int = 0,
    cdw14: int = 0,
    cdw15: int = 0,
    *,
    sgl_type: int = SGL_TRANSPORT_DATA_BLOCK,
    sgl_addr: int = 0,
    sgl_length: int = 0,
    flags: int = 0x40,
) -> bytes:
    return _SQE.pack(
        opcode,
        flags,
        cid,
        nsid,
        sgl_addr,
        sgl_length,
        sgl_type,
        cdw10,
        cdw11,
        cdw12,
        cdw13,
        cdw14,
        cdw15,
    )


@dataclass(slots=True)
class Cqe:
    result: int  # DW0 | DW1 << 32
    sq_head: int
    sq_id: int
    cid: int
    status: int  # the status value (see spec.status), without the phase bit

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, offset: int = 0) -> Cqe:
        dw0, dw1, sqhd, sqid, cid, sf = _CQE.unpack_from(data, offset)
        return cls(dw0 | dw1 << 32, sqhd, sqid, cid, sf >> 1)

    def pack(self) -> bytes:
        return _CQE.pack(
            self.result & 0xFFFFFFFF,
            self.result >> 32,
            self.sq_head,
            self.sq_id,
            self.cid,
            (self.status << 1) & 0xFFFF,
        )


# ---- Fabrics: Connect ----------------------------------------------------------

# Connect SQE fields live in CDW10..CDW12: RECFMT u16, QID u16, SQSIZE u16, CATTR u8, KATO u32.
CONNECT_DATA_SIZE = 1024
CATTR_DISABLE_SQ_FLOW = 0x04
CNTLID_DYNAMIC = 0xFFFF

_CONNECT_DATA = struct.Struct("<16sH238x256s256s256x")


@dataclass(slots=True)
class ConnectCommand:
    recfmt: int
    qid: int
    sqsize: int  # 0's based
    cattr: int
    kato: int  # milliseconds

    @classmethod
    def from_sqe(cls, sqe: Sqe) -> ConnectCommand:
        return cls(
            recfmt=sqe.cdw10 & 0xFFFF,
            qid=sqe.cdw10 >> 16,
            sqsize=sqe.cdw11 & 0xFFFF,
            cattr=(sqe.cdw11 >> 16) & 0xFF,
            kato=sqe.cdw12,
        )

    def cdws(self) -> tuple[int, int, int]:
        return (
            self.recfmt | self.qid << 16,
            self.sqsize | (self.cattr & 0xFF) << 16,
            self.kato,
        )


# Byte offsets reported in a Connect error's IATTR/IPO result.
CONNECT_SQE_OFFSET_RECFMT = 40
CONNECT_SQE_OFFSET_QID = 42
CONNECT_SQE_OFFSET_SQSIZE = 44
CONNECT_SQE_OFFSET_CATTR = 46
CONNECT_SQE_OFFSET_KATO = 48
CONNECT_DATA_OFFSET_HOSTID = 0
CONNECT_DATA_OFFSET_CNTLID = 16
CONNECT_DATA_OFFSET_SUBNQN = 256
CONNECT_DATA_OFFSET_HOSTNQN = 512

# The Connect field at each (IATTR: in the data?, IPO) a controller may point at.
_CONNECT_PARAMETERS = {
    (False, CONNECT_SQE_OFFSET_RECFMT): "recfmt",
    (False, CONNECT_SQE_OFFSET_QID): "qid",
    (False, CONNECT_SQE_OFFSET_SQSIZE): "sqsize",
    (False, CONNECT_SQE_OFFSET_CATTR): "cattr",
    (False, CONNECT_SQE_OFFSET_KATO): "kato",
    (True, CONNECT_DATA_OFFSET_HOSTID): "hostid",
    (True, CONNECT_DATA_OFFSET_CNTLID): "cntlid",
    (True, CONNECT_DATA_OFFSET_SUBNQN): "subnqn",
    (True, CONNECT_DATA_OFFSET_HOSTNQN): "hostnqn",
}


def connect_invalid_param_result(offset: int, *, in_data: bool) -> int:
    """Result DW0 of a Connect Invalid Parameters status: IATTR bit 16, IPO bits 15:0."""
    return (1 << 16 if in_data else 0) | offset


def connect_parameter(result: int) -> tuple[bool, int, str | None]:
    """A Connect error's IATTR/IPO result: (in the data?, byte offset, the field there or
    None for an offset that starts no field)."""
    in_data = bool(result >> 16 & 1)
    offset = result & 0xFFFF
    return in_data, offset, _CONNECT_PARAMETERS.get((in_data, offset))


def _nqn(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(slots=True)
class ConnectData:
    hostid: bytes
    cntlid: int
    subnqn: str
    hostnqn: str

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> ConnectData:
        hostid, cntlid, subnqn, hostnqn = _CONNECT_DATA.unpack_from(data)
        return cls(bytes(hostid), cntlid, _nqn(subnqn), _nqn(hostnqn))

    def pack(self) -> bytes:
        return _CONNECT_DATA.pack(
            self.hostid, self.cntlid, self.subnqn.encode(), self.hostnqn.encode()
        )


# ---- Fabrics: properties (the controller registers, over the wire) -----------------

PROP_CAP = 0x00
PROP_VS = 0x08
PROP_INTMS = 0x0C
PROP_INTMC = 0x10
PROP_CC = 0x14
PROP_CSTS = 0x1C
PROP_NSSR = 0x20

# CAP.CSS (bits 44:37): the command sets CC.CSS may select.
CAP_CSS_NVM = 1 << 37  # 000b: the NVM command set
CAP_CSS_IOCS = 1 << 43  # 110b: every I/O command set the controller supports (NVMe 2.0)
CAP_CSS_ADMIN_ONLY = 1 << 44  # 111b: no I/O command set

CC_EN = 1 << 0
CC_CSS_SHIFT = 4
CC_MPS_SHIFT = 7
CC_AMS_SHIFT = 11
CC_CSS_NVM = 0b000
CC_CSS_IOCS = 0b110
CC_CSS_ADMIN_ONLY = 0b111
CC_SHN_SHIFT = 14
CC_SHN_MASK = 0x3 << CC_SHN_SHIFT
CC_IOSQES_SHIFT = 16
CC_IOCQES_SHIFT = 20

CSTS_RDY: Final = 1 << 0
CSTS_CFS: Final = 1 << 1
CSTS_SHST_COMPLETE = 0x2 << 2
CSTS_SHST_MASK = 0x3 << 2


def property_size(attrib: int) -> int:
    """Property Get/Set ATTRIB bits 2:0: 0 = 4 bytes, 1 = 8 bytes."""
    return 8 if attrib & 0x7 == 1 else 4


def nvme_version(major: int, minor: int, tertiary: int = 0) -> int:
    return major << 16 | minor << 8 | tertiary


# ---- NVM command set fields shared by hosts and targets ----------------------------

RW_FUA = 1 << 30  # Read/Write/Write Zeroes/Compare/Verify CDW12: Force Unit Access
WZ_DEAC = 1 << 25  # Write Zeroes CDW12: deallocate the blocks if that reads back zeroes
DSM_ATTR_DEALLOCATE = 1 << 2  # Dataset Management CDW11: AD
# Dataset Management range: context attributes, length in LBAs, starting LBA.
DSM_RANGE = struct.Struct("<IIQ")
DSM_MAX_RANGES = 256


# ---- Copy (NVM command set; TP 4065 formats 0/1, TP 4130 formats 2/3) ---------------

COPY_DESCRIPTOR_SIZE = {0: 32, 1: 40, 2: 32, 3: 40}
# Each format starts the same way: SNSID (formats 2/3; reserved in 0/1), 4 reserved
# bytes, SLBA, NLB (0's based), CETYPE, reserved, CEV, then SOPT in formats 2/3.
_COPY_RANGE_HEAD = struct.Struct("<I4xQHBxHH")
COPY_SOPT_FAST_COPY_ONLY = 1 << 15
# Just a descriptor's SLBA and NLB, the same in every format.
COPY_RANGE_SLBA_NLB = struct.Struct("<8xQH")


@dataclass(frozen=True, slots=True)
class CopyRange:
    slba: int
    nlb: int  # number of blocks (1's based here; the wire carries it 0's based)
    # Source namespace, formats 2 and 3 only. Formats 0 and 1 carry none (0 here): their
    # source is the command's namespace.
    snsid: int = 0
    sopt: int = 0


def copy_cdw12(nr: int, desfmt: int, *, fua: bool = False) -> int:
    """CDW12 of a Copy: NR (0's based) in bits 7:0, DESFMT in 11:8, FUA in bit 30."""
    return (nr - 1) & 0xFF | (desfmt & 0xF) << 8 | (RW_FUA if fua else 0)


def parse_copy_ranges(
    data: bytes | bytearray | memoryview, desfmt: int, nr: int
) -> list[CopyRange]:
    size = COPY_DESCRIPTOR_SIZE[desfmt]
    cross = desfmt in (2, 3)
    out = []
    for i in range(nr):
        snsid, slba, nlb, _cetype, _cev, sopt = _COPY_RANGE_HEAD.unpack_from(data, i * size)
        out.append(CopyRange(slba, nlb + 1, snsid if cross else 0, sopt if cross else 0))
    return out


# One whole descriptor of each format (the head padded to its size): a Copy of one range,
# the common small one, is packed and parsed with one call and no intermediate objects.
COPY_DESCRIPTOR = {
    f: struct.Struct(_COPY_RANGE_HEAD.format + f"{size - _COPY_RANGE_HEAD.size}x")
    for f, size in COPY_DESCRIPTOR_SIZE.items()
}


def one_range_copy(
    desfmt: int, snsid: int
) -> tuple[int, Callable[[int, int, int, int, int], bytes]]:
    """What every one-range Copy in format `desfmt` of namespace `snsid`'s blocks shares:
    its CDW12 (no FUA), and the packer of its descriptor, called with (slba, nlb - 1, 0,
    0, 0) (`snsid` is only sent in formats 2/3). The packer is C alone, with no Python
    frame per call, for a host that sends many."""
    pack = functools.partial(COPY_DESCRIPTOR[desfmt].pack, snsid if desfmt & 2 else 0)
    return copy_cdw12(1, desfmt), pack


def pack_copy_ranges(ranges: list[CopyRange], desfmt: int) -> bytes:
    size = COPY_DESCRIPTOR_SIZE[desfmt]
    cross = desfmt in (2, 3)
    buf = bytearray(size * len(ranges))
    for i, r in enumerate(ranges):
        _COPY_RANGE_HEAD.pack_into(
            buf,
            i * size,
            r.snsid if cross else 0,
            r.slba,
            r.nlb - 1,
            0,
            0,
            r.sopt if cross else 0,
        )
    return bytes(buf)


# ---- Host Behavior Support (Feature Identifier 16h) --------------------------------------

# Its data (Set and Get Features): byte 0 ACRE, 1 ETDAS, 2 LBAFEE, 3 reserved, bytes 5:4
# CDFE (Copy Descriptor Formats Enable, bit N for format N), the rest reserved.
HOST_BEHAVIOR_SIZE = 512
_HBS_CDFE = struct.Struct("<H")
_HBS_CDFE_OFFSET = 4
_HBS_ACRE_OFFSET = 0
# The Copy descriptor formats a host must enable in CDFE before it may use them (TP 4130:
# the ones with a source NSID per range).
COPY_CDFE_FORMATS = 1 << 2 | 1 << 3


def host_behavior_acre(data: bytes | bytearray | memoryview) -> bool:
    """ACRE of a Host Behavior Support structure: the host honours Command Retry Delay."""
    return bool(data[_HBS_ACRE_OFFSET] & 1)


def host_behavior_cdfe(data: bytes | bytearray | memoryview) -> int:
    """CDFE of a Host Behavior Support structure."""
    return int(_HBS_CDFE.unpack_from(data, _HBS_CDFE_OFFSET)[0])


def set_host_behavior_cdfe(data: bytearray, cdfe: int) -> None:
    """Replace CDFE in a Host Behavior Support structure, leaving every other byte."""
    _HBS_CDFE.pack_into(data, _HBS_CDFE_OFFSET, cdfe)
