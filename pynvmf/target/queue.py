"""One NVMe queue of the target: a transport's connection (NVMe/TCP's or NVMe/RDMA's, through
target/transport.py's QueueTransport) bound (by Connect) to a controller."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final

from pynvmf.aio import start_eager
from pynvmf.logs import about
from pynvmf.spec.command import CSTS_RDY, FUSE_MASK
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import CRD_MASK, DNR, Status
from pynvmf.target import admin, compare, fabrics
from pynvmf.target import auth as auth_commands
from pynvmf.target.budget import DataBudget
from pynvmf.target.faults import FaultTable, opcode_name
from pynvmf.target.fused import FusedPairing
from pynvmf.target.io import IoHandler
from pynvmf.target.port import endpoint
from pynvmf.target.transport import QueueParams, QueueTransport, Request
from pynvmf.tcp.errors import TransferAborted

if TYPE_CHECKING:
    from pynvmf.auth.controller import ControllerAuth
    from pynvmf.target.controller import Controller
    from pynvmf.target.port import Port
    from pynvmf.target.target import Target
    from pynvmf.tcp.psk import TlsPsk

log = logging.getLogger(__name__)

_FABRICS: Final = int(AdminOpcode.FABRICS)  # a plain int for the hot path's test
# The fault actions that complete a command with the rule's status (faults.py).
_STATUS_ACTIONS: Final = ("status", "not_ready")
# Until it has authenticated, a queue that must answers these Fabrics commands alone
# (Authentication Required for anything else, as nvmet and SPDK).
_BEFORE_AUTH = (FabricsType.AUTH_SEND, FabricsType.AUTH_RECV, FabricsType.PROPERTY_GET)
_AUTH_COMMANDS = (FabricsType.AUTH_SEND, FabricsType.AUTH_RECV)
# How long a queue that has not authenticated may wait between the steps of its
# transaction (from Connect to Negotiate, Negotiate to Reply, ...); nvmet: KATO or 120 s.
AUTH_DEADLINE_S = 60.0


def _deliver(fut: asyncio.Future[bytearray], req: Request) -> None:
    """A command's R2T transfer ended: with its data, or (req.data None) without."""
    if fut.done():
        return
    data = req.data
    if isinstance(data, bytearray):  # TargetConnection.fetch_data's buffer, filled
        fut.set_result(data)
    else:
        fut.set_exception(TransferAborted("data transfer failed"))


def _own_data(req: Request) -> None:
    """A command's in-capsule data as a buffer of its own, not a view of the receive
    buffer (QueueParams.borrow_capsule_data), for a command that may wait."""
    data = req.data
    if type(data) is memoryview:
        req.data = bytearray(data)


class TargetQueue:
    """The NVMe layer's queue above one connection (transport.py's NvmeQueue: it attaches
    itself to the connection when made)."""

    def __init__(
        self, target: Target, port: Port, conn: QueueTransport, local_address: str
    ) -> None:
        self.target = target
        self.port = port
        self.conn = conn
        self.local_address = local_address
        # The host's (address, port), as the socket reports it.
        self.peer_address: tuple[str, int] | None = None
        self.controller: Controller | None = None
        self.qid = -1
        # The host and subsystem NQNs as this queue's Connect named them (accepted or not),
        # for its log records.
        self.hostnqn = ""
        self.subnqn = ""
        # The PSK this connection's TLS handshake used (its identity names the host and
        # the subsystem Connect must name), or None on a plain connection.
        self.tls_psk: TlsPsk | None = None
        self.io: IoHandler | None = None
        # Consulted on an I/O queue only, for commands with FUSE bits or after a held first.
        self.fused = FusedPairing(self.finish, self._start_pair)
        self._waiters: set[asyncio.Future[bytearray]] = set()
        # Commands that are waiting for something (data, storage): what the target waits
        # for before it closes a namespace's device. Commands that never suspend (most, on
        # memory or the page cache) finish before anything else can run, so cost nothing.
        self.commands_waiting: set[asyncio.Task[None]] = set()
        # The data buffers this connection's commands may hold (budget.py); the transport
        # gives back what completed commands held.
        limits = target.connection_budget.limits
        self.budget = DataBudget(target.memory_pool, limits.connection_data)
        # DH-HMAC-CHAP on this queue (None: its host has no key); an I/O queue gets its
        # handler only once authenticated, so the I/O path never tests for it.
        self.auth: ControllerAuth | None = None
        self.auth_deadline = 0.0
        self._io_after_auth: IoHandler | None = None
        # The target's fault rules while it has any (Target.arm_faults), else None: the
        # one test the commands of a target without rules pay.
        self.faults: FaultTable | None = None
        # Commands a delay rule holds (with their timers) and those a drop rule dropped,
        # by CID (at most SQSIZE: they are among the connection's commands in flight),
        # and the one whose delay just ended (it passes the rules once).
        self._delayed: dict[int, tuple[Request, asyncio.TimerHandle]] = {}
        self._dropped: dict[int, Request] = {}
        self._released: Request | None = None
        conn.attach(self)

    @property
    def commands_in_flight(self) -> int:
        """Commands received on this queue and not completed yet."""
        return self.conn.commands_in_flight

    @property
    def commands_delayed(self) -> int:
        """Commands a fault rule's delay holds (faults.py)."""
        return len(self._delayed)

    @property
    def held_cids(self) -> list[int]:
        """The CIDs of the commands fault rules hold: delayed, or dropped."""
        return [*self._delayed, *self._dropped]

    def abort_held(self, cid: int) -> bool:
        """Abort (the admin command) of a command a fault rule holds: it completes now with
        Command Abort Requested. False if no rule holds command `cid` here."""
        held = self._delayed.pop(cid, None)
        if held is not None:
            req = held[0]
            held[1].cancel()
        else:
            dropped = self._dropped.pop(cid, None)
            if dropped is None:
                return False
            req = dropped
        self.finish(req, Status.ABORT_REQUESTED)
        return True

    def log_context(self) -> dict[str, object]:
        """What each log record about this queue's connection says of it (pynvmf/logs.py):
        asked for only when a record is emitted."""
        context: dict[str, object] = {}
        peer = self.peer_address
        if peer is not None:
            context["peer"] = endpoint(peer[0], peer[1])
        context["local_port"] = self.port.port
        if self.hostnqn:
            context["host"] = self.hostnqn
        if self.subnqn:
            context["subsystem"] = self.subnqn
        if self.qid >= 0:
            context["qid"] = self.qid
        ctrl = self.controller
        if ctrl is not None:
            context["cntlid"] = ctrl.cntlid
        return context

    def named(self, hostnqn: str, subnqn: str) -> None:
        """The host and subsystem NQNs this queue's Connect names."""
        self.hostnqn = hostnqn
        self.subnqn = subnqn

    def on_command(self, req: Request) -> None:
        faults = self.faults
        if faults is not None and self._faulted(faults, req):
            return
        ctrl = self.controller
        opcode = req.sqe.opcode
        io = self.io
        if io is not None:
            owner = io.ctrl
            if not owner.traffic:  # a test: setting it every command cost twice as much
                owner.traffic = True
            fused = self.fused
            if req.sqe.flags & FUSE_MASK or fused.first is not None:
                _own_data(req)  # a fused command may wait for its partner
                if fused.arrive(req):
                    return
            if opcode != _FABRICS:
                io.submit(req)  # the hot path
            else:
                _own_data(req)
                self._run(self._admin(req))
            return
        if req.sqe.flags & FUSE_MASK:
            # Fused operations belong to I/O command sets: none on the admin queue, and
            # Connect has no FUSE field.
            self.conn.complete(req, Status.INVALID_FIELD | DNR)
            return
        if ctrl is None:
            if opcode == AdminOpcode.FABRICS and req.sqe.fctype == FabricsType.CONNECT:
                start_eager(self._connect(req))
            else:
                # Connect must be the first command on every queue.
                self.conn.complete(req, Status.CMD_SEQ_ERROR | DNR)
            return
        auth = self.auth
        if (
            auth is not None
            and not auth.authenticated
            and not (opcode == AdminOpcode.FABRICS and req.sqe.fctype in _BEFORE_AUTH)
        ):
            self.finish(req, Status.AUTH_REQUIRED | DNR)
            return
        ctrl.traffic = True
        _own_data(req)  # an I/O queue still authenticating lends its capsule data too
        self._run(self._admin(req))

    def on_refused(self, req: Request) -> None:
        self.fused.refused(req)

    def timed_sent(self, reqs: list[Request], now: int) -> None:
        """The glue handed the completions of these timed commands to the socket at `now`
        (monotonic ns)."""
        io = self.io
        if io is not None:
            io.sent(reqs, now)

    def arm_faults(self, faults: FaultTable | None) -> None:
        """Judge this queue's commands by `faults` from now on (None: by nothing)."""
        self.faults = faults
        if faults is None:
            self.conn.faults_gone()

    def _faulted(self, faults: FaultTable, req: Request) -> bool:
        """Whether a fault rule took `req` (delayed, completed, dropped, its connection
        closed, or the transport's wire fault took it); False to run it as usual (a wire
        fault may have marked its PDUs)."""
        if req is self._released:
            self._released = None
            return False
        ctrl = self.controller
        if ctrl is None:
            return False  # Connect, before any rule can say whom it selects
        sqe = req.sqe
        if ctrl.failed and sqe.opcode != _FABRICS:
            # A failed controller (fail_controller) answers nothing but Fabrics commands
            # (Property Get shows CSTS.CFS): held as a dropped command, at most SQSIZE.
            req.data = None
            self._dropped[sqe.cid] = req
            return True
        conn = self.conn
        hit = faults.judge(
            self.subnqn, self.hostnqn, self.qid, sqe, functools.partial(conn.can_inject, req)
        )
        if hit is None:
            return False
        rule = hit.rule
        about(log, self).info(
            "fault rule %d: %s qid %d cid %d opcode %s nsid %d",
            rule.id,
            hit.action,
            self.qid,
            sqe.cid,
            opcode_name(self.qid, sqe.opcode),
            sqe.nsid,
        )
        action = hit.action
        wire = hit.wire
        if wire is not None:
            # The transport decides what goes on the wire; the command runs on unless
            # that took it (a TermReq, a malformed PDU in place of its answer).
            return not conn.inject(req, wire)
        if action == "delay":
            _own_data(req)
            timer = asyncio.get_running_loop().call_later(hit.delay_s, self._release, req)
            self._delayed[sqe.cid] = (req, timer)
        elif action in _STATUS_ACTIONS:
            status = rule.spec.status
            if rule.spec.crd and not ctrl.acre:
                # CRD is for hosts that enabled it (Host Behavior Support ACRE); 0 otherwise.
                status &= ~CRD_MASK
            self.finish(req, status)
        elif action == "drop":
            # Never completed (but by an Abort): the command keeps its place among the
            # connection's commands in flight (at most SQSIZE) until the connection ends.
            req.data = None
            self._dropped[sqe.cid] = req
        else:
            self.close(f"fault rule {rule.id}")
        return True

    def _release(self, req: Request) -> None:
        """A delayed command's time came: it runs as if it had just arrived."""
        self._delayed.pop(req.sqe.cid, None)
        if self.conn.closing:
            return
        # It passes the rules once, if there are still rules to pass.
        self._released = req if self.faults is not None else None
        # Timed, the fast path times it alone (its run was flushed long ago), the hold in
        # its device stage: dispatched when it arrived.
        if req.started and not req.dispatched:
            req.dispatched = req.started
        self.on_command(req)

    def require_auth(self, auth: ControllerAuth) -> None:
        """The host must authenticate this queue before it is of any use."""
        self.auth = auth
        self.auth_deadline = time.monotonic() + AUTH_DEADLINE_S

    def auth_progressed(self) -> None:
        """An authentication command went through the state machine."""
        auth = self.auth
        if auth is None:
            return
        if not auth.authenticated:
            self.auth_deadline = time.monotonic() + AUTH_DEADLINE_S
            return
        self.auth_deadline = 0.0
        if self._io_after_auth is not None:
            self.io, self._io_after_auth = self._io_after_auth, None
        ctrl = self.controller
        if self.qid == 0 and ctrl is not None and not ctrl.keep_alive_running:
            ctrl.start_keep_alive()

    def _run(self, command: Coroutine[Any, Any, None]) -> None:
        task = start_eager(command)
        if task is not None:
            self.track(task)

    def track(self, task: asyncio.Task[None]) -> None:
        """A command of this queue that waits for something (data, a device, a
        reservation): removals wait for it (drain.py) until it is done."""
        waiting = self.commands_waiting
        waiting.add(task)
        task.add_done_callback(waiting.discard)

    def finish(self, req: Request, status: int) -> None:
        """Complete a command that carries no data back, recording a failure."""
        ctrl = self.controller
        if status and ctrl is not None:
            ctrl.record_error(self.qid, req, status)
        self.conn.complete(req, status)

    def _start_pair(self, first: Request, second: Request) -> None:
        assert self.io is not None
        self._run(compare.compare_and_write(self.io, first, second))

    def bind(self, ctrl: Controller, qid: int, sq_size: int, sqhd_disabled: bool) -> None:
        self.controller = ctrl
        self.qid = qid
        self.named(ctrl.hostnqn, ctrl.subsystem.nqn)
        ctrl.queues[qid] = self
        # On an I/O queue, every path from on_command copies what it keeps (_own_data,
        # IoHandler.submit), so the transport may lend it its receive buffer.
        self.conn.bind_queue(QueueParams(qid, sq_size, sqhd_disabled, borrow_capsule_data=qid > 0))
        self.faults = self.target.faults_for(ctrl)
        counters = self.target.counters
        if qid:
            if self.auth is not None and not self.auth.authenticated:
                self._io_after_auth = IoHandler(ctrl, self)
            else:
                self.io = IoHandler(ctrl, self)
            counters.io_queues += 1
        else:
            counters.admin_queues += 1

    async def _connect(self, req: Request) -> None:
        try:
            status, result, _ = await fabrics.connect(self, req)
        except ConnectionError:
            return
        except Exception:
            about(log, self).exception("connect failed")
            status, result = Status.INTERNAL_ERROR, 0
        if not status and self.qid > 0 and self.target.hand_off(self, req, result):
            return  # a worker process serves the queue from here on, and completes the Connect
        self.conn.complete(req, status, result)

    async def _admin(self, req: Request) -> None:
        ctrl = self.controller
        assert ctrl is not None
        try:
            if req.sqe.opcode == AdminOpcode.FABRICS:
                if req.sqe.fctype in _AUTH_COMMANDS:
                    status, result, data = await auth_commands.execute(self, req)
                else:
                    status, result, data = await fabrics.execute(self, req)
            elif not ctrl.csts & CSTS_RDY:
                # Only Fabrics commands until the host enables the controller (CC.EN).
                status, result, data = Status.CMD_SEQ_ERROR | DNR, 0, None
            else:
                outcome = await admin.execute(ctrl, self, req)
                if outcome is None:
                    return  # completes later (Asynchronous Event Request)
                status, result, data = outcome
                if not status and req.sqe.opcode == AdminOpcode.SET_FEATURES:
                    # The workers serving this controller's I/O queues, if any, take the
                    # change before the host hears of it.
                    await self.target.controller_changed(ctrl)
        except ConnectionError:
            return
        except Exception:
            about(log, self).exception("admin command %#x failed", req.sqe.opcode)
            status, result, data = Status.INTERNAL_ERROR, 0, None
        if status:
            ctrl.record_error(self.qid, req, status)
        self.conn.complete(req, status, result, data)
        auth = self.auth
        if auth is not None and auth.closing:
            # A failed authentication ends this queue's connection once its last message
            # (AUTH_Failure1, or the completion of the host's Failure2) has gone out.
            self.close(auth.closing)

    async def hold(self, req: Request, n: int) -> None:
        """Charge `req` with `n` bytes of data buffer before it allocates them, waiting (and
        reading no more of the host's PDUs meanwhile) while the budget is spent. The
        transport gives the charge back when the command completes."""
        budget = self.budget
        if not budget.try_take(n):
            io = self.io
            if io is not None:
                await io.take_budget(req, n)
            else:
                await budget.take(n)
        req.charge += n

    async def fetch_data(self, req: Request) -> bytearray:
        """The host-to-controller data of `req`, fetched with R2T once its buffer fits the
        budget (so a host cannot have the target hold data it never sends)."""
        await self.hold(req, req.length)
        fut: asyncio.Future[bytearray] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        arrived = functools.partial(_deliver, fut)
        # A timed command's wait for the data is its `data` stage (metrics).
        since = time.monotonic_ns() if req.started else 0
        self.conn.fetch_data(req, arrived)
        try:
            data = await fut
            if since and self.io is not None:
                self.io.waited(req, "data", since)
            return data
        finally:
            self._waiters.discard(fut)
            # A failed future holds its exception, whose traceback holds this frame: the
            # frame lets go of the future, or the three would keep the queue alive.
            del fut, arrived

    def close(self, reason: str) -> None:
        self.conn.close(reason)

    def connection_lost(self) -> None:
        self.fused.release()
        for _, timer in self._delayed.values():
            timer.cancel()
        self._delayed.clear()
        self._dropped.clear()
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(TransferAborted("connection closed"))
        self._waiters.clear()
        self._io_after_auth = None
        ctrl = self.controller
        if ctrl is not None:
            ctrl.remove_queue(self.qid, self)
        # Commands still running keep their own reference to the handler.
        self.io = None
