"""Fabrics commands from the host side: Connect and Property Get/Set, and the
host's identity (Host NQN and Host Identifier) that Connect carries."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from pynvmf.auth.host import AuthenticationFailed, HostAuth
from pynvmf.host.errors import (
    NvmeAuthenticationError,
    NvmeConnectRejected,
    NvmeError,
    NvmeStatusError,
)
from pynvmf.host.queue import HostQueue
from pynvmf.spec import command as C
from pynvmf.spec.auth import auth_cdw10
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import Status

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
    """Bind `queue` (its qid) to a controller; returns Connect's result DW0: the
    controller ID in bits 15:0, AUTHREQ above (pynvmf.spec.auth.AUTHREQ_ATR).

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
    try:
        result = await queue.execute(
            AdminOpcode.FABRICS, FabricsType.CONNECT, *cmd.cdws(), data=data
        )
    except NvmeStatusError as exc:
        parameter, reason = connect_refusal(exc, cmd, identity, subnqn, cntlid)
        raise NvmeConnectRejected(
            exc,
            parameter=parameter,
            reason=reason,
            qid=queue.qid,
            subnqn=subnqn,
            hostnqn=identity.hostnqn,
        ) from None
    return result & 0xFFFFFFFF


# What each Connect Invalid Parameters field means refused; formatted with the Connect's
# own values. The field comes from the completion's IATTR/IPO (spec.command).
_INVALID_PARAMETER_WORDS = {
    "subnqn": "subsystem {subnqn!r} is not served on this port",
    "hostnqn": "host NQN {hostnqn!r} refused",
    "hostid": "host ID {hostid} refused",
    "cntlid": "controller ID {cntlid:#x} refused (no such controller: gone?)",
    "qid": "queue ID {qid} refused (more queues than the controller has?)",
    "sqsize": "queue size {queue_size} refused",
    "cattr": "connect attributes {cattr:#x} refused",
    "kato": "keep alive timeout {kato} ms refused",
    "recfmt": "record format {recfmt} refused",
}
# The other Connect statuses, each in words.
_CONNECT_STATUS_WORDS = {
    Status.CONNECT_INVALID_HOST: "host {hostnqn!r} is not allowed to connect to subsystem "
    "{subnqn!r}",
    Status.CONNECT_CTRL_BUSY: "the controller is busy, or no controller is available",
    Status.CONNECT_INCOMPATIBLE_FORMAT: "record format {recfmt} is not supported",
    Status.CONNECT_RESTART_DISCOVERY: "the subsystem moved: discover it again",
    Status.AUTH_REQUIRED: "the controller requires authentication first",
}


def connect_refusal(
    error: NvmeStatusError, cmd: C.ConnectCommand, identity: HostIdentity, subnqn: str, cntlid: int
) -> tuple[str | None, str]:
    """(the Connect field the controller named, what it refused in words) for a Connect
    that completed with `error`'s status: one table for every Connect status."""
    values = {
        "subnqn": subnqn,
        "hostnqn": identity.hostnqn,
        "hostid": uuid.UUID(bytes=identity.hostid),
        "cntlid": cntlid,
        "qid": cmd.qid,
        "queue_size": cmd.sqsize + 1,
        "cattr": cmd.cattr,
        "kato": cmd.kato,
        "recfmt": cmd.recfmt,
    }
    if error.status == Status.CONNECT_INVALID_PARAM:
        in_data, offset, parameter = C.connect_parameter(error.result)
        if parameter is None:
            where = "data" if in_data else "command"
            return None, f"an invalid parameter at byte {offset} of the Connect {where}"
        return parameter, _INVALID_PARAMETER_WORDS[parameter].format(**values)
    words = _CONNECT_STATUS_WORDS.get(error.status)
    if words is None:
        return None, error.name.lower().replace("_", " ")
    parameter = "hostnqn" if error.status == Status.CONNECT_INVALID_HOST else None
    return parameter, words.format(**values)


# What an Authentication Receive allocates (Linux's host and SPDK's ask for as much).
AUTH_RECEIVE_SIZE = 4096


async def _auth_send(queue: HostQueue, message: bytes) -> None:
    await queue.execute(
        AdminOpcode.FABRICS, FabricsType.AUTH_SEND, auth_cdw10(), len(message), data=message
    )


async def _auth_receive(queue: HostQueue) -> bytes:
    buf = bytearray(AUTH_RECEIVE_SIZE)
    await queue.execute(
        AdminOpcode.FABRICS,
        FabricsType.AUTH_RECV,
        auth_cdw10(),
        AUTH_RECEIVE_SIZE,
        into=memoryview(buf),
    )
    return bytes(buf)


async def authenticate(queue: HostQueue, auth: HostAuth) -> None:
    """One DH-HMAC-CHAP transaction on `queue` (after its Connect, or again to
    re-authenticate); NvmeAuthenticationError if either side refuses."""
    try:
        await _auth_send(queue, auth.negotiate())
        reply = auth.reply(await _auth_receive(queue))
        await _auth_send(queue, reply)
        success2 = auth.success1(await _auth_receive(queue))
        if success2 is not None:
            await _auth_send(queue, success2)
    except AuthenticationFailed as e:
        if e.failure2 is not None:
            # Tell the controller why, then give up; its answer does not change that.
            with contextlib.suppress(NvmeError, ConnectionError):
                await _auth_send(queue, e.failure2)
        who = "the controller refused" if e.by_controller else "the host refused"
        raise NvmeAuthenticationError(
            f"queue {queue.qid}: DH-HMAC-CHAP failed, {who}: {e}",
            e.explanation,
            by_controller=e.by_controller,
        ) from None


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
