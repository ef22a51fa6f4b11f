"""Reservations (NVMe Base 2.0 section 8.19, NVM Command Set "Reservations").

A namespace's reservation state is shared by every controller of the subsystem; a
registrant is a Host Identifier (controllers with the same host ID share a registration).

The state machine is pure: `register`, `acquire` and `release` take the current
`ReservationState` and the command's fields and return a `Decision` (a status, the new
state to commit, the notifications to deliver, the hosts whose commands to wait for).
`NamespaceReservation` is the per-namespace glue: it serializes the commands that change
the state, persists it (Persist Through Power Loss), commits it, and gates I/O.

Gating costs one attribute test on the I/O path while no namespace of the subsystem has a
registrant: `Subsystem.registered` holds exactly the namespaces that have one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pynvmf.config.files import write_atomically
from pynvmf.spec import reservations as R
from pynvmf.spec.logpages import LogPageId
from pynvmf.spec.opcodes import NSID_ALL, AsyncEventType
from pynvmf.spec.reservations import (
    ALL_REGISTRANTS_TYPES,
    REGISTRANTS_ONLY_TYPES,
    AcquireAction,
    AcquireReleaseFields,
    Cptpl,
    NotificationType,
    RegisterAction,
    RegisterFields,
    ReleaseAction,
    ReservationType,
)
from pynvmf.spec.status import DNR, Status
from pynvmf.target.fused import FUSED_FAIL
from pynvmf.target.outcome import Outcome

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.target.io import IoHandler
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Namespace, Subsystem
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

CONFLICT = Status.RESERVATION_CONFLICT | DNR
INVALID_FIELD = Status.INVALID_FIELD | DNR
_U32 = 0xFFFFFFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
# Commands whose data is the keys: at least the structure, at most a page (the Linux host
# sends 16 bytes for Release, nvme-cli the 8 the structure has), never an unbounded fetch.
_DATA_MAX = 4096
# The read and write command groups: the commands a reservation may refuse, and the ones
# Preempt and Abort waits for.
_DATA_COMMANDS = R.READ_GROUP | R.WRITE_GROUP
_VALID_TYPES = frozenset(int(t) for t in ReservationType)
# Registrations outlive controllers, so hosts could grow them without end: one namespace
# keeps at most this many (a Report of them all is 64 KiB). The specification has no
# status for it; SPDK (16 registrants) fails such a Register with an internal error too.
MAX_REGISTRANTS = 1024

Notice = tuple[bytes, NotificationType]  # (host ID to notify, what happened)


@dataclass(slots=True)
class ReservationState:
    """Registrants (host ID -> reservation key, in registration order) and the reservation.

    `holder` is the host holding a reservation of a type other than the all registrants
    ones; with those, every registrant holds it and `holder` is None.
    """

    registrants: dict[bytes, int] = field(default_factory=dict)
    rtype: int = 0  # 0: no reservation
    holder: bytes | None = None
    generation: int = 0
    ptpl: bool = False

    def copy(self) -> ReservationState:
        return ReservationState(
            dict(self.registrants), self.rtype, self.holder, self.generation, self.ptpl
        )

    def holds(self, host: bytes) -> bool:
        if not self.rtype:
            return False
        if self.rtype in ALL_REGISTRANTS_TYPES:
            return host in self.registrants
        return host == self.holder

    def reserve(self, rtype: int, host: bytes) -> None:
        self.rtype = rtype
        self.holder = None if rtype in ALL_REGISTRANTS_TYPES else host

    def release(self) -> None:
        self.rtype = 0
        self.holder = None

    def bump(self) -> None:
        self.generation = (self.generation + 1) & _U32

    def unregister(self, host: bytes) -> int:
        """Remove a registrant; the type of the reservation this released, or 0.

        The holder leaving releases the reservation; with the all registrants types the
        reservation stays while any registrant does."""
        del self.registrants[host]
        rtype = self.rtype
        if not rtype:
            return 0
        if rtype in ALL_REGISTRANTS_TYPES:
            if self.registrants:
                return 0
        elif host != self.holder:
            return 0
        self.release()
        return rtype

    def others(self, host: bytes) -> list[bytes]:
        return [h for h in self.registrants if h != host]


@dataclass(slots=True)
class Decision:
    status: int = Status.SUCCESS
    state: ReservationState | None = None  # None: nothing to commit
    notices: list[Notice] = field(default_factory=list)
    # Hosts preempted by Preempt and Abort: their commands in flight are waited for.
    preempted: tuple[bytes, ...] = ()


# -- the state machine --------------------------------------------------------------------


def check_register(fields: RegisterFields) -> int:
    if fields.action not in iter(RegisterAction) or fields.cptpl == R.CPTPL_RESERVED:
        return INVALID_FIELD
    return Status.SUCCESS


def register(
    state: ReservationState,
    host: bytes,
    fields: RegisterFields,
    crkey: int,
    nrkey: int,
    *,
    ptpl_capable: bool,
) -> Decision:
    """Reservation Register: register, unregister or replace the host's key."""
    status = check_register(fields)
    if status:
        return Decision(status)
    current = state.registrants.get(host)
    new = state.copy()
    notices: list[Notice] = []
    action = fields.action
    if action == RegisterAction.REGISTER:
        # Registering again with the key already held is not an error; another key is.
        if current is not None and current != nrkey:
            return Decision(CONFLICT)
        if current is None and len(state.registrants) >= MAX_REGISTRANTS:
            return Decision(Status.INTERNAL_ERROR | DNR)
        new.registrants[host] = nrkey
    elif action == RegisterAction.UNREGISTER:
        if current is None or (not fields.iekey and current != crkey):
            return Decision(CONFLICT)
        released = new.unregister(host)
        if released in REGISTRANTS_ONLY_TYPES:
            notices = [(h, NotificationType.RESERVATION_RELEASED) for h in new.registrants]
    else:
        # Replace changes a registration: a host that has none has nothing to replace,
        # IEKEY or not (IEKEY only skips the CRKEY check).
        if current is None or (not fields.iekey and current != crkey):
            return Decision(CONFLICT)
        new.registrants[host] = nrkey
    if fields.cptpl == Cptpl.CLEAR:
        new.ptpl = False
    elif fields.cptpl == Cptpl.PERSIST and ptpl_capable:
        # A namespace that cannot persist keeps PTPL 0 (RESCAP.PTPLS 0, Report PTPLS and
        # Feature 83h say so): the Linux host's pr_ops ask for 11b on every register.
        new.ptpl = True
    new.bump()
    return Decision(Status.SUCCESS, new, notices)


def check_acquire(fields: AcquireReleaseFields) -> int:
    # IEKEY in Acquire and Release is not used since revision 1.3 (RESCAP.IEKEY): set, it
    # is refused, as the Linux and SPDK targets do.
    if fields.action not in iter(AcquireAction) or fields.rtype not in _VALID_TYPES or fields.iekey:
        return INVALID_FIELD
    return Status.SUCCESS


def acquire(
    state: ReservationState, host: bytes, fields: AcquireReleaseFields, crkey: int, prkey: int
) -> Decision:
    """Reservation Acquire: acquire, preempt, or preempt and abort."""
    status = check_acquire(fields)
    if status:
        return Decision(status)
    current = state.registrants.get(host)
    if current is None or current != crkey:
        return Decision(CONFLICT)
    rtype = fields.rtype
    if fields.action == AcquireAction.ACQUIRE:
        if not state.rtype:
            new = state.copy()
            new.reserve(rtype, host)
            return Decision(Status.SUCCESS, new)
        if state.holds(host) and state.rtype == rtype:
            return Decision(Status.SUCCESS)  # acquiring what it holds is not an error
        return Decision(CONFLICT)
    decision = _preempt(state, host, rtype, prkey)
    if fields.action != AcquireAction.PREEMPT_AND_ABORT:
        decision.preempted = ()
    return decision


def _preempt(state: ReservationState, host: bytes, rtype: int, prkey: int) -> Decision:
    new = state.copy()
    notices: list[Notice] = []
    by_key = [h for h, key in state.registrants.items() if key == prkey]
    if not state.rtype:
        # No reservation: only registrations are preempted.
        if not by_key:
            return Decision(CONFLICT)
        victims = by_key
        for h in victims:
            del new.registrants[h]
    elif state.rtype in ALL_REGISTRANTS_TYPES:
        if prkey == 0:
            # Every other registrant goes, and the host takes a new reservation.
            victims = state.others(host)
            for h in victims:
                del new.registrants[h]
            new.reserve(rtype, host)
        else:
            if not by_key:
                return Decision(CONFLICT)
            victims = by_key
            for h in victims:
                new.unregister(h)
    else:
        assert state.holder is not None
        if prkey == state.registrants[state.holder]:
            # The holder's key: its reservation is preempted (a holder preempting itself
            # changes the type), and the registrations with that key but the host's go.
            victims = [h for h in by_key if h != host]
            for h in victims:
                del new.registrants[h]
            new.reserve(rtype, host)
            if rtype != state.rtype:
                notices += [(h, NotificationType.RESERVATION_RELEASED) for h in new.others(host)]
        elif prkey:
            if not by_key:
                return Decision(CONFLICT)
            victims = by_key
            for h in victims:
                new.unregister(h)
        else:
            return Decision(INVALID_FIELD)
    preempted = tuple(h for h in victims if h != host)
    notices = [(h, NotificationType.REGISTRATION_PREEMPTED) for h in preempted] + notices
    new.bump()
    return Decision(Status.SUCCESS, new, notices, preempted)


def check_release(fields: AcquireReleaseFields) -> int:
    if fields.action not in iter(ReleaseAction) or fields.iekey:
        return INVALID_FIELD
    return Status.SUCCESS


def release(
    state: ReservationState, host: bytes, fields: AcquireReleaseFields, crkey: int
) -> Decision:
    """Reservation Release: release the reservation, or clear every registration."""
    status = check_release(fields)
    if status:
        return Decision(status)
    if host not in state.registrants or state.registrants[host] != crkey:
        return Decision(CONFLICT)
    if fields.action == ReleaseAction.CLEAR:
        notices = [(h, NotificationType.RESERVATION_PREEMPTED) for h in state.others(host)]
        new = state.copy()
        new.registrants.clear()
        new.release()
        new.bump()
        return Decision(Status.SUCCESS, new, notices)
    if not state.holds(host):
        # No reservation, or another host's: success with no effect.
        return Decision(Status.SUCCESS)
    if fields.rtype != state.rtype:
        return Decision(INVALID_FIELD)
    new = state.copy()
    new.release()
    notices = []
    if state.rtype not in (ReservationType.WRITE_EXCLUSIVE, ReservationType.EXCLUSIVE_ACCESS):
        notices = [(h, NotificationType.RESERVATION_RELEASED) for h in state.others(host)]
    return Decision(Status.SUCCESS, new, notices)


def refused(state: ReservationState) -> tuple[dict[bytes, frozenset[int]], frozenset[int]]:
    """(opcodes refused to each registrant, opcodes refused to any other host)."""
    if not state.rtype:
        return {}, frozenset()
    to_registrant, to_other = R.refused_opcodes(ReservationType(state.rtype))
    per_host = {h: frozenset() if state.holds(h) else to_registrant for h in state.registrants}
    return per_host, to_other


def access_status(state: ReservationState, host: bytes, opcode: int) -> int:
    """The status a command from `host` gets from the reservation (0: allowed)."""
    per_host, to_other = refused(state)
    return CONFLICT if opcode in per_host.get(host, to_other) else Status.SUCCESS


def status_report(state: ReservationState) -> R.ReservationStatus:
    # One entry per registrant host: its controllers share the registration, and with
    # dynamic controllers the entry names none (CNTLID FFFFh), as the Linux target does.
    return R.ReservationStatus(
        generation=state.generation,
        rtype=state.rtype,
        ptpls=state.ptpl,
        registrants=[
            R.RegisteredController(hostid=h, rkey=key, holds=state.holds(h))
            for h, key in state.registrants.items()
        ],
    )


# -- Persist Through Power Loss ---------------------------------------------------------

_FILE_FORMAT = 1


def encode_state(state: ReservationState) -> bytes:
    """The persistence file: the whole state with PTPL 1; without it, only that (nothing
    is restored after a power loss)."""
    if not state.ptpl:
        return json.dumps({"format": _FILE_FORMAT, "ptpl": False}).encode() + b"\n"
    doc = {
        "format": _FILE_FORMAT,
        "ptpl": True,
        "generation": state.generation,
        "rtype": state.rtype,
        "holder": None if state.holder is None else state.holder.hex(),
        "registrants": [{"hostid": h.hex(), "key": key} for h, key in state.registrants.items()],
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


def decode_state(data: bytes, where: str = "reservation state") -> ReservationState:
    try:
        doc = json.loads(data)
        return _decode(doc)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{where}: not a reservation state file ({exc})") from exc


def _decode(doc: Any) -> ReservationState:
    if not isinstance(doc, dict) or doc.get("format") != _FILE_FORMAT:
        raise ValueError("unknown format")
    if not doc["ptpl"]:
        return ReservationState()
    registrants: dict[bytes, int] = {}
    for entry in doc["registrants"]:
        hostid = bytes.fromhex(entry["hostid"])
        key = entry["key"]
        if len(hostid) != 16 or not isinstance(key, int) or not 0 <= key <= _U64:
            raise ValueError(f"invalid registrant {entry!r}")
        if hostid in registrants:
            raise ValueError(f"host {hostid.hex()} registered twice")
        registrants[hostid] = key
    rtype = doc["rtype"]
    holder = None if doc["holder"] is None else bytes.fromhex(doc["holder"])
    generation = doc["generation"]
    if not isinstance(generation, int) or not 0 <= generation <= _U32:
        raise ValueError(f"invalid generation {generation!r}")
    if rtype not in (0, *_VALID_TYPES):
        raise ValueError(f"invalid reservation type {rtype!r}")
    if rtype and rtype not in ALL_REGISTRANTS_TYPES and holder not in registrants:
        raise ValueError("the reservation's holder is not a registrant")
    if rtype in ALL_REGISTRANTS_TYPES and (holder is not None or not registrants):
        raise ValueError("an all registrants reservation without registrants")
    if not rtype and holder is not None:
        raise ValueError("a holder without a reservation")
    return ReservationState(registrants, rtype, holder, generation, True)


def load_state(path: Path) -> ReservationState:
    """The state persisted at `path`; an empty state when there is no file yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ReservationState()
    return decode_state(data, str(path))


# -- per namespace ----------------------------------------------------------------------

Handler = Callable[["IoHandler", "Request"], Awaitable[Outcome]]
Pair = tuple[int | None, int | None]  # statuses of a fused pair's commands (None: completed)


class NamespaceReservation:
    """The reservation state of one namespace and what enforces it."""

    def __init__(self, ptpl_file: Path | None = None) -> None:
        # A persistence file makes the namespace PTPL capable; its state is loaded now.
        self.ptpl_file = ptpl_file
        self.state = load_state(ptpl_file) if ptpl_file is not None else ReservationState()
        self.nsid = 0
        # Commands that change the state run one at a time (with their file write).
        self.lock = asyncio.Lock()
        self._index: dict[int, NamespaceReservation] | None = None
        self._refused: dict[bytes, frozenset[int]] = {}
        self._refused_other: frozenset[int] = frozenset()
        # Data commands under way per host, and Preempt and Abort waiting for them to end.
        self._inflight: dict[bytes, int] = {}
        self._drain: dict[bytes, list[asyncio.Future[None]]] = {}
        # Where a committed change goes before its command completes: the worker
        # processes' replicas (target/cores/workers.py), with the preempted hosts; None: nowhere.
        self.replicate: Callable[[NamespaceReservation, list[bytes]], Awaitable[None]] | None = None
        self._update_access()

    @property
    def ptpl_capable(self) -> bool:
        return self.ptpl_file is not None

    @property
    def rescap(self) -> int:
        rescap = R.RESCAP_ALL_TYPES | R.Rescap.IEKEY
        return rescap | R.Rescap.PTPLS if self.ptpl_capable else rescap

    def attach(self, index: dict[int, NamespaceReservation], nsid: int) -> None:
        """Join the subsystem's index of namespaces with registrants (I/O checks it)."""
        self._index = index
        self.nsid = nsid
        self._reindex()

    def detach(self) -> None:
        """The namespace is gone: out of the index, and kept out."""
        if self._index is not None and self._index.get(self.nsid) is self:
            del self._index[self.nsid]
        self._index = None

    def _reindex(self) -> None:
        index = self._index
        if index is None:
            return
        if self.state.registrants:
            index[self.nsid] = self
        else:
            index.pop(self.nsid, None)

    def _update_access(self) -> None:
        self._refused, self._refused_other = refused(self.state)

    def commit(self, state: ReservationState) -> None:
        self.state = state
        self._update_access()
        self._reindex()

    async def save(self, state: ReservationState) -> None:
        """Persist `state` before it is committed, when PTPL is (or was) set."""
        path = self.ptpl_file
        if path is None or not (state.ptpl or self.state.ptpl):
            return
        await asyncio.to_thread(write_atomically, path, encode_state(state))

    async def change(
        self, subsystem: Subsystem, decide: Callable[[ReservationState], Decision]
    ) -> int:
        """Run one state change: decide, persist, commit, notify, then (Preempt and Abort)
        wait for the preempted hosts' commands. Nothing changes unless it succeeds."""
        async with self.lock:
            decision = decide(self.state)
            state = decision.state
            if decision.status or state is None:
                return decision.status
            try:
                await self.save(state)
            except OSError as exc:
                log.error("reservation state of NSID %d not saved: %s", self.nsid, exc)
                return Status.INTERNAL_ERROR
            self.commit(state)
        deliver(subsystem, self.nsid, decision.notices)
        if self.replicate is not None:
            await self.replicate(self, list(decision.preempted))
        if decision.preempted:
            await self.wait_for(decision.preempted)
        return Status.SUCCESS

    # -- the I/O path ----------------------------------------------------------------

    def refuses(self, host: bytes, opcode: int) -> bool:
        return opcode in self._refused.get(host, self._refused_other)

    async def guard(self, io: IoHandler, req: Request, handler: Handler) -> Outcome:
        """Run an I/O command of `io`'s host under this reservation: refused with
        Reservation Conflict (touching nothing) if it forbids it, else counted while it
        runs."""
        host = io.ctrl.hostid
        opcode = req.sqe.opcode
        if opcode in self._refused.get(host, self._refused_other):
            return CONFLICT, 0, None
        if opcode not in _DATA_COMMANDS:
            return await handler(io, req)
        self._enter(host)
        try:
            return await handler(io, req)
        finally:
            self._leave(host)

    async def guard_fused(
        self, host: bytes, first: Request, second: Request, run: Callable[[], Awaitable[Pair]]
    ) -> Pair:
        """A fused Compare (a read) and Write (a write) under this reservation: a refused
        half fails the pair (the other half aborted as a failed fused command)."""
        if self.refuses(host, first.sqe.opcode):
            return CONFLICT, FUSED_FAIL
        if self.refuses(host, second.sqe.opcode):
            return FUSED_FAIL, CONFLICT
        self._enter(host)
        try:
            return await run()
        finally:
            self._leave(host)

    def _enter(self, host: bytes) -> None:
        inflight = self._inflight
        inflight[host] = inflight.get(host, 0) + 1

    def _leave(self, host: bytes) -> None:
        inflight = self._inflight
        left = inflight[host] - 1
        if left:
            inflight[host] = left
            return
        del inflight[host]
        for fut in self._drain.pop(host, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_for(self, hosts: Iterable[bytes]) -> None:
        """Until the data commands of `hosts` that are under way have ended.

        This is what "abort" is here: a command already admitted completes normally
        (nothing can stop a device write half done), and the preempting command does not
        complete before it has, so no write of a preempted host lands after it. Commands
        admitted from then on meet the new reservation."""
        loop = asyncio.get_running_loop()
        waits = []
        for host in hosts:
            if self._inflight.get(host):
                fut: asyncio.Future[None] = loop.create_future()
                self._drain.setdefault(host, []).append(fut)
                waits.append(fut)
        if waits:
            await asyncio.gather(*waits)


_LOG_PAGE = LogPageId.RESERVATION


async def run_fused(
    io: IoHandler, first: Request, second: Request, run: Callable[[], Awaitable[Pair]]
) -> Pair:
    """A fused Compare and Write: run by `run` unless the namespace's reservation refuses
    it (one truth test while no namespace of the subsystem has registrants)."""
    registered = io.registered
    reservation = registered.get(first.sqe.nsid) if registered else None
    if reservation is None:
        return await run()
    return await reservation.guard_fused(io.ctrl.hostid, first, second, run)


def deliver(subsystem: Subsystem, nsid: int, notices: Iterable[Notice]) -> None:
    """Queue each notice on every controller of its host, and raise the event."""
    for host, kind in notices:
        for ctrl in list(subsystem.controllers.values()):
            if ctrl.hostid != host or ctrl.destroyed:
                continue
            if ctrl.reservation_log.add(nsid, kind):
                ctrl.notify(AsyncEventType.IO_CMD_SET, R.AEN_RESERVATION_LOG_AVAILABLE, _LOG_PAGE)


# -- per controller: the Reservation Notification log and mask ------------------------------

LOG_CAPACITY = 64


class NotificationLog:
    """A controller's queue of Reservation Notification log pages, and its mask."""

    def __init__(self, capacity: int = LOG_CAPACITY) -> None:
        self.capacity = capacity
        self.masks: dict[int, int] = {}  # NSID -> Reservation Notification Mask
        self._pages: deque[list[int]] = deque()  # [count, type, nsid]
        self._count = 0

    def __len__(self) -> int:
        return len(self._pages)

    def add(self, nsid: int, kind: NotificationType) -> bool:
        """Queue a page unless the mask suppresses it; whether one was queued."""
        if self.masks.get(nsid, 0) & R.MASK_BIT[kind]:
            return False
        self._count = self._count + 1 if self._count < _U64 else 1
        if len(self._pages) >= self.capacity:
            # Full: this page is lost. The newest page kept takes its count, so the host
            # sees the gap in the counts (the queue's memory stays bounded).
            self._pages[-1][0] = self._count
            return True
        self._pages.append([self._count, kind, nsid])
        return True

    def take(self) -> R.ReservationNotification:
        """The oldest page, removed from the queue (an empty page when there is none)."""
        if not self._pages:
            return R.ReservationNotification()
        count, kind, nsid = self._pages.popleft()
        return R.ReservationNotification(count, kind, len(self._pages), nsid)


# -- I/O commands -------------------------------------------------------------------------


async def _keys(io: IoHandler, req: Request, size: int) -> bytes | bytearray | int:
    """The command's data (the keys), or the status that refuses it."""
    if not size <= req.length <= _DATA_MAX:
        return Status.SGL_INVALID_DATA | DNR
    data = req.data if req.data is not None else await io.queue.fetch_data(req)
    return data


def _namespace(io: IoHandler, req: Request) -> Namespace | None:
    return io.namespaces.get(req.sqe.nsid)


async def register_command(io: IoHandler, req: Request) -> Outcome:
    ns = _namespace(io, req)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    fields = RegisterFields.from_cdw10(req.sqe.cdw10)
    status = check_register(fields)
    if status:
        return status, 0, None
    data = await _keys(io, req, R.REGISTER_DATA.size)
    if isinstance(data, int):
        return data, 0, None
    crkey, nrkey = R.REGISTER_DATA.unpack_from(data)
    host = io.ctrl.hostid
    res = ns.reservation
    status = await res.change(
        io.ctrl.subsystem,
        lambda state: register(state, host, fields, crkey, nrkey, ptpl_capable=res.ptpl_capable),
    )
    return status, 0, None


async def acquire_command(io: IoHandler, req: Request) -> Outcome:
    ns = _namespace(io, req)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    fields = AcquireReleaseFields.from_cdw10(req.sqe.cdw10)
    status = check_acquire(fields)
    if status:
        return status, 0, None
    data = await _keys(io, req, R.ACQUIRE_DATA.size)
    if isinstance(data, int):
        return data, 0, None
    crkey, prkey = R.ACQUIRE_DATA.unpack_from(data)
    host = io.ctrl.hostid
    status = await ns.reservation.change(
        io.ctrl.subsystem, lambda state: acquire(state, host, fields, crkey, prkey)
    )
    return status, 0, None


async def release_command(io: IoHandler, req: Request) -> Outcome:
    ns = _namespace(io, req)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    fields = AcquireReleaseFields.from_cdw10(req.sqe.cdw10)
    status = check_release(fields)
    if status:
        return status, 0, None
    data = await _keys(io, req, R.RELEASE_DATA.size)
    if isinstance(data, int):
        return data, 0, None
    (crkey,) = R.RELEASE_DATA.unpack_from(data)
    host = io.ctrl.hostid
    status = await ns.reservation.change(
        io.ctrl.subsystem, lambda state: release(state, host, fields, crkey)
    )
    return status, 0, None


async def report_command(io: IoHandler, req: Request, max_transfer: int) -> Outcome:
    sqe = req.sqe
    ns = _namespace(io, req)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    if not sqe.cdw11 & R.REPORT_EDS:
        # Fabrics hosts have 128-bit host identifiers, which only the extended data
        # structure carries.
        return Status.HOST_ID_INCONSISTENT | DNR, 0, None
    length = (sqe.cdw10 + 1) * 4
    if length > max_transfer:
        return INVALID_FIELD, 0, None
    if req.length < length:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    # A buffer too small gets the structure's first NUMD dwords: REGCTL still counts every
    # registrant, so the host learns how large a buffer it needs.
    page = status_report(ns.reservation.state).pack(extended=True)
    return Status.SUCCESS, 0, page[:length].ljust(length, b"\x00")


# -- admin: features and the log page ---------------------------------------------------------


def _feature_namespace(ctrl: Controller, nsid: int) -> tuple[int, Namespace | None]:
    if nsid == NSID_ALL:
        # One namespace's value is asked for: "all" names none.
        return INVALID_FIELD, None
    ns = ctrl.namespaces.get(nsid)
    if ns is None:
        return Status.INVALID_NS | DNR, None
    return Status.SUCCESS, ns


def _targets(ctrl: Controller, nsid: int) -> tuple[int, list[Namespace]]:
    """The namespaces a Set Features names: one, or every one for NSID FFFFFFFFh."""
    if nsid == NSID_ALL:
        return Status.SUCCESS, list(ctrl.namespaces.values())
    ns = ctrl.namespaces.get(nsid)
    if ns is None:
        return Status.INVALID_NS | DNR, []
    return Status.SUCCESS, [ns]


def get_notification_mask(ctrl: Controller, req: Request, sel: int) -> Outcome:
    status, ns = _feature_namespace(ctrl, req.sqe.nsid)
    if status or ns is None:
        return status, 0, None
    if sel in (1, 2):
        return Status.SUCCESS, 0, None  # default, and saved (the feature is not saveable)
    return Status.SUCCESS, ctrl.reservation_log.masks.get(ns.nsid, 0), None


async def set_notification_mask(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    mask = req.sqe.cdw11
    if mask & ~R.NOTIFICATION_MASK_ALL:
        return INVALID_FIELD, 0, None
    status, namespaces = _targets(ctrl, req.sqe.nsid)
    if status:
        return status, 0, None
    for ns in namespaces:
        ctrl.reservation_log.masks[ns.nsid] = mask
    return Status.SUCCESS, 0, None


def get_persistence(ctrl: Controller, req: Request, sel: int) -> Outcome:
    status, ns = _feature_namespace(ctrl, req.sqe.nsid)
    if status or ns is None:
        return status, 0, None
    if sel in (1, 2):
        return Status.SUCCESS, 0, None
    return Status.SUCCESS, int(ns.reservation.state.ptpl), None


async def set_persistence(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    ptpl = bool(req.sqe.cdw11 & R.FEATURE_PTPL)
    status, namespaces = _targets(ctrl, req.sqe.nsid)
    if status:
        return status, 0, None
    capable = [ns for ns in namespaces if ns.reservation.ptpl_capable]
    if ptpl and not capable:
        # Nothing named can persist its reservations (RESCAP.PTPLS 0).
        return INVALID_FIELD, 0, None
    for ns in capable:
        status = await ns.reservation.change(ctrl.subsystem, lambda s: _with_ptpl(s, ptpl))
        if status:
            return status, 0, None
    return Status.SUCCESS, 0, None


def _with_ptpl(state: ReservationState, ptpl: bool) -> Decision:
    if state.ptpl == ptpl:
        return Decision(Status.SUCCESS)
    new = state.copy()
    new.ptpl = ptpl
    return Decision(Status.SUCCESS, new)


def notification_log_page(ctrl: Controller, offset: int) -> bytes:
    """Get Log Page 80h: the oldest notification, which the read removes."""
    if offset >= R.RESERVATION_LOG_SIZE:
        return bytes(R.RESERVATION_LOG_SIZE)
    return ctrl.reservation_log.take().pack()
