"""Fabrics commands from the host side: Connect and Property Get/Set, and the
host's identity (Host NQN and Host Identifier) that Connect carries."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from pynvmf.host.queue import HostQueue
from pynvmf.spec import command as C
from pynvmf.spec.opcodes import AdminOpcode, FabricsType

_UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"
# One identity per process, so every controller this process creates presents the
# same host to the target (its allow lists and reservations key on it).
_PROCESS_UUID = uuid.uuid4()

PROPERTY_SIZE_4 = 0
PROPERTY_SIZE_8 = 1


@dataclass(frozen=True, slots=True)
class HostIdentity:
    hostnqn: str
    hostid: bytes  # 16 bytes

    @classmethod
    def resolve(cls, hostnqn: str | None = None, hostid: bytes | None = None) -> HostIdentity:
        """Defaults: the process's UUID NQN; a UUID NQN's own UUID as the Host ID."""
        if hostid is not None and len(hostid) != 16:
            raise ValueError(f"hostid must be 16 bytes, not {len(hostid)}")
        if hostnqn is None:
            hostnqn = f"{_UUID_NQN_PREFIX}{_PROCESS_UUID}"
        if hostid is None:
            hostid = _PROCESS_UUID.bytes
            if hostnqn.startswith(_UUID_NQN_PREFIX):
                with contextlib.suppress(ValueError):  # not a UUID after all
                    hostid = uuid.UUID(hostnqn[len(_UUID_NQN_PREFIX) :]).bytes
        if not hostnqn or len(hostnqn.encode()) > 223:
            raise ValueError(f"invalid host NQN {hostnqn!r}")
        return cls(hostnqn, bytes(hostid))


async def connect_queue(
    queue: HostQueue,
    identity: HostIdentity,
    subnqn: str,
    *,
    sqsize: int,
    cntlid: int = C.CNTLID_DYNAMIC,
    kato_ms: int = 0,
    disable_sqflow: bool = False,
) -> int:
    """Bind `queue` (its qid) to a controller; returns the controller ID.

    `sqsize` is 0's based, as on the wire.
    """
    cmd = C.ConnectCommand(
        recfmt=0,
        qid=queue.qid,
        sqsize=sqsize,
        cattr=C.CATTR_DISABLE_SQ_FLOW if disable_sqflow else 0,
        kato=kato_ms if queue.qid == 0 else 0,
    )
    data = C.ConnectData(identity.hostid, cntlid, subnqn, identity.hostnqn).pack()
    result = await queue.execute(AdminOpcode.FABRICS, FabricsType.CONNECT, *cmd.cdws(), data=data)
    return result & 0xFFFF


async def property_get(queue: HostQueue, offset: int, size: int = 4) -> int:
    attrib = PROPERTY_SIZE_8 if size == 8 else PROPERTY_SIZE_4
    value = await queue.execute(AdminOpcode.FABRICS, FabricsType.PROPERTY_GET, attrib, offset)
    return value if size == 8 else value & 0xFFFFFFFF


async def property_set(queue: HostQueue, offset: int, value: int, size: int = 4) -> None:
    attrib = PROPERTY_SIZE_8 if size == 8 else PROPERTY_SIZE_4
    await queue.execute(
        AdminOpcode.FABRICS,
        FabricsType.PROPERTY_SET,
        attrib,
        offset,
        value & 0xFFFFFFFF,
        value >> 32,
    )
