"""`pynvmf target --cores N`: I/O queues served by N worker processes.

The main process stays the one owner of the target: it accepts every connection,
runs the admin queues, the controllers (cntlid, features, keep alive, events), the
subsystems and namespaces, and the reservations. When an I/O queue's Connect has
been validated against its controller table, the connection goes to a worker
(SCM_RIGHTS) with its transport state and the decoded Connect, as data: the worker
binds the queue and answers the Connect itself, and from then on that queue lives
wholly on that worker. docs/cores.md says why this routing and not SO_REUSEPORT, and
what bounds it.

What a worker needs and the main process keeps current (shared_state.py):
- namespaces: memory namespaces are shared memory (a memfd every worker maps),
  file namespaces a descriptor each worker opens; added, replaced and removed
  (a removal answered once the worker's commands on it finished);
- controllers: the state I/O reads (hostid, VWC, Host Behavior Support), sent with
  each queue and again, acknowledged, after a Set Features;
- reservations: each worker holds a replica, replaced (acknowledged) before a
  reservation command completes; the reservation commands themselves run here;
- ANA: the path status of every (subsystem, listener, group) is in a shared-memory
  table (ana_table.py) that this process rewrites whenever a subsystem's ANA states
  change, before any host hears of it, and that workers read with each command;
- teardown: a controller destroyed here closes its queues on every worker.
What workers tell the main process: I/O traffic per controller (keep alive, TBKAS),
their error log entries and I/O statistics, and queues that closed.

A worker that dies takes its connections with it (the hosts see them drop and
reconnect); its queues leave their controllers and a new worker takes its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import time
import weakref
from enum import Enum
from typing import TYPE_CHECKING, Any

from pynvmf.block import range_locks
from pynvmf.block.shared_memory import SharedMemoryDevice
from pynvmf.logs import LogLevels, about, configured_format, log_levels
from pynvmf.spec.command import ConnectCommand, Sqe
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target import reservations
from pynvmf.target.budget import ConnectionLimits, default_max_memory
from pynvmf.target.changes import ChangeError
from pynvmf.target.command_counts import Report
from pynvmf.target.cores import shared_state as S
from pynvmf.target.cores.ana_table import AnaTable
from pynvmf.target.cores.ipc import Channel, RemoteError, socket_pair, wait_all
from pynvmf.target.limits import MAX_TRANSFER
from pynvmf.target.outcome import Outcome
from pynvmf.target.poll_groups import PollGroup, group_name, report_commands
from pynvmf.target.port import Port
from pynvmf.target.qos import QosLimits
from pynvmf.target.qos_gate import QosGate
from pynvmf.target.target import Target
from pynvmf.target.transport import Request
from pynvmf.tcp.target import TargetConnection

if TYPE_CHECKING:
    from pynvmf.auth.controller import ControllerAuth
    from pynvmf.block.memory import MemoryDevice
    from pynvmf.record.tap import Recorder
    from pynvmf.target.controller import Controller
    from pynvmf.target.devices import NamedDevice
    from pynvmf.target.faults import FaultSpec, FaultTable
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Namespace, Subsystem
    from pynvmf.tcp.psk import TlsPsk

log = logging.getLogger(__name__)

# A worker that dies this soon after it started is not restarted at once (a worker
# that cannot start would otherwise be respawned in a loop).
RESPAWN_BACKOFF_S = 1.0
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 5.0
# How long the events about a new namespace wait for the workers to have it.
NAMESPACE_ACK_TIMEOUT_S = 5.0


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), the default of --cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class RemoteQueue:
    """An I/O queue of a controller that a worker serves: what the controller's queue
    table holds for it here, so that teardown, listener removal and statistics see it."""

    def __init__(
        self,
        worker: WorkerHandle,
        token: int,
        ctrl: Controller,
        qid: int,
        port: Port,
        peer_address: tuple[str, int] | None,
        admitted_from: str,
        tls_psk: TlsPsk | None = None,
    ) -> None:
        self.worker = worker
        self.token = token
        self.controller = ctrl
        self.qid = qid
        self.port = port
        self.peer_address = peer_address
        self.admitted_from = admitted_from
        # What the statistics calls show of its security, as of a TargetQueue: a queue
        # that authenticates stays in this process, so a remote one never has `auth`.
        self.auth: ControllerAuth | None = None
        self.tls_psk = tls_psk
        # No command of a remote queue waits here (drain.commands_waiting), and none is
        # in flight here: its worker reports those (WorkerHandle.in_flight).
        self.commands_waiting: set[asyncio.Task[None]] = set()
        self.commands_in_flight = 0
        self.closed = False

    def close(self, reason: str) -> None:
        if not self.closed:
            self.worker.channel_send(S.QUEUE_CLOSE, self.token, reason)

    def abort_held(self, cid: int) -> bool:
        """A command a rule holds on a worker's queue stays held ("not aborted")."""
        return False

    def arm_faults(self, faults: FaultTable | None) -> None:
        """Its worker judges its commands by its own copy of the rules (FAULTS)."""


class WorkerState(Enum):
    """Where a worker process is, as the main process sees it."""

    DOWN = "down"  # not started yet, or its channel closed (it exited or died)
    STARTING = "starting"  # its channel is open; it is being told every namespace
    READY = "ready"  # it has every namespace: it may take queues


class WorkerHandle:
    """One worker process, as the main process sees it."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Channel | None = None
        self.queues: dict[int, RemoteQueue] = {}
        self.started = 0.0
        self.state = WorkerState.DOWN
        # Its poll group's counts (target/poll_groups.py), kept across a replaced process:
        # I/O queues handed to it, and the I/O commands its reports counted.
        self.adopted = 0
        self.completed = 0
        # I/O commands in flight on its queues by subsystem NQN, as of its last report.
        self.in_flight: dict[str, int] = {}

    @property
    def alive(self) -> bool:
        return self.state is not WorkerState.DOWN

    @property
    def ready(self) -> bool:
        return self.state is WorkerState.READY

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def channel_send(self, kind: str, *args: Any, fds: list[int] | None = None) -> None:
        if self.channel is None:
            for fd in fds or []:
                os.close(fd)
            return
        self.channel.send(kind, *args, fds=fds)

    def request(self, kind: str, *args: Any, fds: list[int] | None = None) -> asyncio.Future[Any]:
        if self.channel is None or not self.alive:
            for fd in fds or []:
                os.close(fd)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(ConnectionError("worker gone"))
            return fut
        return self.channel.request(kind, *args, fds=fds)


class WorkerPool:
    def __init__(self, target: Target, count: int) -> None:
        self.target = target
        self.count = count
        self.workers: list[WorkerHandle] = []
        self._next_token = 1
        self._ctrl_tokens: weakref.WeakKeyDictionary[Controller, int] = weakref.WeakKeyDictionary()
        self._ctrls: weakref.WeakValueDictionary[int, Controller] = weakref.WeakValueDictionary()
        # Per namespace (by its object): how many reservation states were sent, so that a
        # worker applies them in order even when a snapshot crosses an update.
        self._reservation_seq: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._stopping = False
        self._respawns: set[asyncio.TimerHandle] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self.handed_off = 0
        # What path-related status an I/O command gets, as this process decides it.
        self.ana_table = AnaTable(lambda port: any(p is port for p in target.ports))

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        for index in range(self.count):
            self.workers.append(WorkerHandle(self, index))
        await asyncio.gather(*(self._spawn(w) for w in self.workers))

    async def _spawn(self, worker: WorkerHandle) -> None:
        main_end, worker_end = socket_pair()
        fd = worker_end.fileno()
        os.set_inheritable(fd, True)
        try:
            worker.proc = subprocess.Popen(
                [sys.executable, "-m", "pynvmf.target.cores.worker", str(fd), str(os.getpid())],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
            )
        finally:
            worker_end.close()
        worker.started = time.monotonic()
        worker.queues = {}
        worker.channel = Channel(
            main_end,
            lambda kind, args, fds: self._on_message(worker, kind, args, fds),
            lambda: self._on_closed(worker),
        )
        worker.state = WorkerState.STARTING
        limits = self.target.connection_budget.limits
        capacity = self.target.memory_pool.capacity or limits.max_memory or default_max_memory()
        init = S.WorkerInit(
            index=worker.index,
            log_level=logging.getLogger("pynvmf").getEffectiveLevel(),
            log_format=configured_format(),
            log_levels=log_levels(),
            max_memory=max(capacity // self.count, 64 << 20),
            connection_data=limits.connection_data,
            connect_deadline_s=limits.connect_deadline_s,
            pdu_deadline_s=limits.pdu_deadline_s,
            busy_poll_us=self.target.busy_poll_us,
        )
        ready = worker.request(S.INIT, init, fds=[os.dup(self.ana_table.fileno())])
        if self.target.command_counts.tracking:
            worker.channel_send(S.LATENCY_TRACKING, True)
        if self.target.faults:
            worker.channel_send(S.FAULTS, self.target.faults.specs())
        # Everything the worker must know before its first queue: every namespace.
        waits = [ready]
        for subsystem in list(self.target.subsystems.values()):
            for ns in list(subsystem.namespaces.values()):
                if S.shareable(ns):
                    waits.append(self._send_namespace(worker, subsystem.nqn, ns))
                    if ns.qos is not None:
                        waits.append(self._send_qos(worker, subsystem.nqn, ns))
        try:
            await asyncio.wait_for(asyncio.gather(*waits), START_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:
            log.error("worker %d did not start: %r", worker.index, exc)
            if worker.channel is not None:
                worker.channel.close()
            raise
        if worker.state is WorkerState.STARTING:  # not closed while it started
            worker.state = WorkerState.READY
        log.info("worker %d started (pid %d)", worker.index, worker.pid)
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_ready(self) -> None:
        """Until every worker is ready (after a start, or a dead one's replacement)."""
        while not all(w.ready for w in self.workers):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def stop(self) -> None:
        self._stopping = True
        for handle in self._respawns:
            handle.cancel()
        self._respawns.clear()
        for worker in self.workers:
            if worker.alive:
                worker.channel_send(S.EXIT)
        loop = asyncio.get_running_loop()
        for worker in self.workers:
            proc = worker.proc
            if proc is None:
                continue
            try:
                await loop.run_in_executor(None, proc.wait, EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not exit; killing it", worker.index)
                proc.kill()
                await loop.run_in_executor(None, proc.wait)
            if worker.channel is not None:
                worker.channel.close()
        self.ana_table.close()

    def _on_closed(self, worker: WorkerHandle) -> None:
        """The worker's channel closed: it exited or died, and its connections with it."""
        worker.state = WorkerState.DOWN
        worker.channel = None
        queues, worker.queues = worker.queues, {}
        worker.in_flight = {}  # its commands ended with it
        if queues and not self._stopping:
            log.error(
                "worker %d (pid %d) is gone with %d I/O queues; their hosts reconnect",
                worker.index,
                worker.pid,
                len(queues),
            )
        for rq in queues.values():
            self._queue_gone(rq)
        if worker.proc is not None:
            worker.proc.poll()
        if self._stopping:
            return
        delay = max(0.0, worker.started + RESPAWN_BACKOFF_S - time.monotonic())
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def respawn() -> None:
            self._respawns.discard(handle)
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.kill()  # its channel closed: it is of no use any more
                worker.proc.wait()
            task = loop.create_task(self._spawn(worker))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

        handle = loop.call_later(delay, respawn)
        self._respawns.add(handle)

    # -- routing ----------------------------------------------------------------------

    def hand_off(self, queue: TargetQueue, req: Request, result: int) -> bool:
        """Give the I/O queue `queue`, whose Connect `req` was validated and bound here,
        to a worker, which answers the Connect (with `result`). False: it stays here (no
        worker can take it, or its subsystem has a namespace only this process can
        serve)."""
        ctrl = queue.controller
        if ctrl is None:
            return False
        if queue.auth is not None:
            # DH-HMAC-CHAP: the queue authenticates after its Connect, with the keys and
            # the state machine here; it is served here (docs/cores.md).
            return False
        if not all(S.shareable(ns) for ns in ctrl.subsystem.namespaces.values()):
            return False
        worker = self._choose()
        if worker is None:
            return False
        protocol = next((p for p in queue.port.connections if p.queue is queue), None)
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            return False
        if protocol.tls is not None:
            # A TLS connection's record state (user space, or the kernel's) is not in
            # what a worker adopts: the connection stays with this process.
            return False
        conn = queue.conn
        if not isinstance(conn, TargetConnection):
            return False  # workers adopt NVMe/TCP connections alone
        if conn.input_pending():
            # The host sent more before the Connect completed: served here, in order.
            return False
        sock = protocol.transport.get_extra_info("socket")
        if sock is None:
            return False
        port = queue.port
        # Its ANA statuses, from now on current in the table the worker reads (full: a
        # table of thousands of subsystem listeners, served here).
        ana_row = self.ana_table.row(ctrl.subsystem, port)
        if ana_row is None:
            return False
        fd = os.dup(sock.fileno())
        token = self._token()
        ctrl_token = self._ctrl_token(ctrl)
        adoption = S.Adoption(
            token=token,
            controller=self._controller_info(ctrl, ctrl_token),
            subsystem=self._subsystem_info(ctrl.subsystem),
            port=S.PortInfo(port.portid, port.address, port.port, port.transport),
            ana_row=ana_row,
            peer_address=queue.peer_address,
            transport=conn.export_state(),
            connect=S.ValidatedConnect(req.sqe, ConnectCommand.from_sqe(req.sqe), result),
        )
        qid = queue.qid
        rq = RemoteQueue(
            worker, token, ctrl, qid, port, queue.peer_address, protocol.peer_address, queue.tls_psk
        )
        worker.queues[token] = rq
        worker.adopted += 1
        ctrl.queues[qid] = rq
        # The connection leaves this process: the queue is no longer this controller's
        # here (its closing must not remove the remote one), and the connection's
        # admission stays counted until the worker reports the queue gone.
        queue.controller = None
        queue.io = None
        protocol.admitted = False
        conn.close(f"handed to worker {worker.index}")
        protocol.transport.abort()
        worker.channel_send(S.ADOPT, adoption, fds=[fd])
        self.handed_off += 1
        about(log, queue).debug(
            "queue %d of controller %d of %s handed to worker %d",
            qid,
            ctrl.cntlid,
            ctrl.subsystem.nqn,
            worker.index,
        )
        return True

    def _subsystem_info(self, subsystem: Subsystem) -> S.SubsystemInfo:
        slot = self.ana_table.slot(subsystem)
        return S.SubsystemInfo.of(subsystem, -1 if slot is None else slot)

    def _choose(self) -> WorkerHandle | None:
        """The live worker with the fewest queues (the first of them on a tie), so that
        one controller's queues spread over every worker and churn evens out."""
        live = [w for w in self.workers if w.ready]
        if not live:
            return None
        return min(live, key=lambda w: len(w.queues))

    def _token(self) -> int:
        token = self._next_token
        self._next_token += 1
        return token

    def _ctrl_token(self, ctrl: Controller) -> int:
        token = self._ctrl_tokens.get(ctrl)
        if token is None:
            token = self._token()
            self._ctrl_tokens[ctrl] = token
            self._ctrls[token] = ctrl
        return token

    @staticmethod
    def _controller_info(ctrl: Controller, token: int) -> S.ControllerInfo:
        return S.ControllerInfo(
            token=token,
            nqn=ctrl.subsystem.nqn,
            cntlid=ctrl.cntlid,
            hostnqn=ctrl.hostnqn,
            hostid=ctrl.hostid,
            kato_ms=ctrl.kato_ms,
            cc=ctrl.cc,
            csts=ctrl.csts,
            io_queues=ctrl.io_queues,
            volatile_write_cache=ctrl.volatile_write_cache,
            host_behavior=bytes(ctrl.host_behavior),
        )

    def _queue_gone(self, rq: RemoteQueue) -> None:
        if rq.closed:
            return
        rq.closed = True
        rq.worker.queues.pop(rq.token, None)
        rq.controller.remove_queue(rq.qid, rq)  # type: ignore[arg-type]
        self.target.connection_budget.release(rq.admitted_from)

    # -- what the workers report --------------------------------------------------------

    def _on_message(
        self, worker: WorkerHandle, kind: str, args: tuple[Any, ...], fds: list[int]
    ) -> Any:
        for fd in fds:  # workers send no descriptors
            os.close(fd)
        if kind == S.QUEUE_CLOSED:
            rq = worker.queues.get(args[0])
            if rq is not None:
                self._queue_gone(rq)
            return None
        if kind == S.ACTIVITY:
            self._activity(worker, *args)
            return None
        if kind == S.FORWARD:
            return self._forwarded(*args)
        log.error("worker %d sent an unknown message %r", worker.index, kind)
        return None

    def _activity(
        self,
        worker: WorkerHandle,
        traffic: list[int],
        errors: dict[int, list[Any]],
        stats: dict[str, tuple[int, ...]],
        transport: S.TransportCounts,
        commands: Report,
        in_flight: dict[str, int],
        faults: dict[int, tuple[int, int]],
    ) -> None:
        try:
            self.target.faults.add_counts(faults)
        except (ValueError, AttributeError) as exc:
            log.error("fault rule counts from a worker refused: %s", exc)
        if isinstance(in_flight, dict) and all(
            isinstance(k, str) and isinstance(n, int) and n >= 0 for k, n in in_flight.items()
        ):
            worker.in_flight = in_flight
        else:
            log.error("commands in flight from a worker refused: %r", in_flight)
        ctrls = self._ctrls
        for token in traffic:
            ctrl = ctrls.get(token)
            if ctrl is not None:
                ctrl.traffic = True
        for token, entries in errors.items():
            ctrl = ctrls.get(token)
            if ctrl is None:
                continue
            for entry in entries:
                ctrl.error_count += 1
                ctrl.errors.appendleft(dataclasses.replace(entry, error_count=ctrl.error_count))
        # The counts are of the worker's replica of the subsystem of that NQN, which is
        # this process's current one: a removal reaches the workers (SUBSYSTEM_GONE,
        # ordered after their earlier reports) and is answered before a subsystem of the
        # same NQN can be created, and a worker's new replica starts from zero.
        for nqn, counts in stats.items():
            subsystem = self.target.subsystems.get(nqn)
            if subsystem is None:
                continue
            try:
                subsystem.stats.add(counts)
            except ValueError as exc:
                log.error("statistics of %s from a worker refused: %s", nqn, exc)
        # Keyed by NQNs, not by this process's objects: counts of a controller or a
        # subsystem that is gone by now still count (command_counts.py).
        try:
            self.target.command_counts.add(commands)
        except ValueError as exc:
            log.error("command counts from a worker refused: %s", exc)
        else:
            worker.completed += report_commands(commands)
        if not transport.valid():
            log.error("transport counts from a worker refused: %s", transport)
            return
        counters = self.target.counters
        counters.data_digest_errors += transport.data_digest_errors
        counters.term_reqs_sent += transport.term_reqs_sent
        counters.worker_budget_waits += transport.budget_waits
        counters.copy_offloaded_bytes += transport.copy_offloaded_bytes
        counters.copy_emulated_bytes += transport.copy_emulated_bytes

    async def _forwarded(
        self, ctrl_token: int, sqe_bytes: bytes, data: bytes | None, length: int
    ) -> Outcome:
        """A reservation command from a worker's queue: it runs here, against the one
        state, and its change reaches every worker before it completes."""
        ctrl = self._ctrls.get(ctrl_token)
        if ctrl is None or ctrl.destroyed:
            return Status.ABORT_SQ_DELETED, 0, None
        sqe = Sqe.unpack(sqe_bytes)
        req = Request(sqe)
        req.length = length
        req.data = bytearray(data) if data is not None else None
        io = _ForwardedIo(ctrl)
        opcode = sqe.opcode
        if opcode == IoOpcode.RESERVATION_REGISTER:
            status, result, out = await reservations.register_command(io, req)  # type: ignore[arg-type]
        elif opcode == IoOpcode.RESERVATION_ACQUIRE:
            status, result, out = await reservations.acquire_command(io, req)  # type: ignore[arg-type]
        elif opcode == IoOpcode.RESERVATION_RELEASE:
            status, result, out = await reservations.release_command(io, req)  # type: ignore[arg-type]
        elif opcode == IoOpcode.RESERVATION_REPORT:
            status, result, out = await reservations.report_command(io, req, MAX_TRANSFER)  # type: ignore[arg-type]
        else:
            return Status.INVALID_OPCODE | DNR, 0, None
        return status, result, None if out is None else bytes(out)

    # -- what the workers are told -----------------------------------------------------

    def _send_namespace(self, worker: WorkerHandle, nqn: str, ns: Namespace) -> asyncio.Future[Any]:
        subsystem = self.target.subsystems[nqn]
        seq = self._reservation_seq.get(ns.reservation, 0)
        spec = S.namespace_spec(ns, seq)
        fds = [os.dup(ns.device.fileno())] if isinstance(ns.device, SharedMemoryDevice) else []
        info = self._subsystem_info(subsystem)
        return worker.request(S.NAMESPACE, nqn, info, spec, fds=fds)

    def _send_qos(self, worker: WorkerHandle, nqn: str, ns: Namespace) -> asyncio.Future[Any]:
        gate = ns.qos
        if gate is None:
            return worker.request(S.QOS, nqn, ns.nsid, None)
        return worker.request(S.QOS, nqn, ns.nsid, gate.lock_name, fds=[os.dup(gate.fd)])

    def _live(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.alive]

    def namespace_added(self, nqn: str, ns: Namespace) -> list[asyncio.Future[Any]]:
        """Send the new namespace `ns` to every worker; the futures of their answers."""
        ns.reservation.replicate = self.reservation_changed
        if not S.shareable(ns):
            return []
        futures = []
        for worker in self._live():
            fut = self._send_namespace(worker, nqn, ns)
            fut.add_done_callback(_ignore_result)
            futures.append(fut)
            if ns.qos is not None:
                fut = self._send_qos(worker, nqn, ns)
                fut.add_done_callback(_ignore_result)
                futures.append(fut)
        return futures

    async def qos_changed(self, nqn: str, ns: Namespace) -> None:
        """Every worker paces `ns` by its device's limits from now on, or stops (a
        command waiting there goes)."""
        if not S.shareable(ns):
            return
        await wait_all([self._send_qos(w, nqn, ns) for w in self._live()])

    def namespace_ana_group(self, nqn: str, nsid: int, anagrpid: int) -> list[asyncio.Future[Any]]:
        """Tell every worker namespace `nsid` moved to group `anagrpid`; the futures of
        their answers."""
        futures = []
        for worker in self._live():
            fut = worker.request(S.NAMESPACE_ANA_GROUP, nqn, nsid, anagrpid)
            fut.add_done_callback(_ignore_result)
            futures.append(fut)
        return futures

    async def namespace_removing(self, nqn: str, nsid: int) -> None:
        await wait_all([w.request(S.NAMESPACE_GONE, nqn, nsid) for w in self._live()])

    async def namespace_hosts(self, nqn: str, ns: Namespace) -> None:
        """Tell every worker which hosts namespace `ns` is attached to; answered once the
        commands of the controllers it was detached from finished."""
        if not S.shareable(ns):
            return
        hosts = tuple(sorted(ns.hosts))
        await wait_all([w.request(S.NAMESPACE_HOSTS, nqn, ns.nsid, hosts) for w in self._live()])

    async def namespace_shrinking(self, nqn: str, ns: Namespace, size_bytes: int) -> None:
        """Have every worker quiesce `ns`'s I/O and serve its first `size_bytes` only (the
        storage is cut next, or was cut outside); answered once they all do."""
        if not S.shareable(ns):
            return
        await wait_all(
            [w.request(S.NAMESPACE_SHRINKING, nqn, ns.nsid, size_bytes) for w in self._live()]
        )

    async def namespace_resized(self, nqn: str, ns: Namespace) -> None:
        """Have every worker take the new size of `ns`'s file; answered once they did."""
        if not S.shareable(ns):
            return
        await wait_all([w.request(S.NAMESPACE_RESIZED, nqn, ns.nsid) for w in self._live()])

    def faults_changed(self, rules: list[tuple[int, FaultSpec]]) -> list[asyncio.Future[Any]]:
        """Every worker judges its commands by `rules` from its next one; the answers come
        once each took them (a remove must not be undone by a worker that has not heard)."""
        return [worker.request(S.FAULTS, rules) for worker in self._live()]

    def latency_tracking(self, enable: bool) -> None:
        """Every worker times its commands from now on, or stops."""
        for worker in self._live():
            worker.channel_send(S.LATENCY_TRACKING, enable)

    async def log_levels(self, levels: LogLevels) -> None:
        """Every worker logs as `levels` says; answered once they all do."""
        await wait_all([w.request(S.LOG_LEVELS, levels) for w in self._live()])

    async def subsystem_removed(self, nqn: str) -> None:
        await wait_all([w.request(S.SUBSYSTEM_GONE, nqn) for w in self._live()])
        # No worker reads its places in the ANA table any more.
        self.ana_table.release(nqn)

    async def controller_changed(self, ctrl: Controller) -> None:
        """A Set Features completed on `ctrl`: the workers with its queues take the new
        state before the host hears of it (a write after VWC is off must be FUA)."""
        token = self._ctrl_tokens.get(ctrl)
        if token is None:
            return
        info = self._controller_info(ctrl, token)
        workers = {rq.worker for rq in ctrl.queues.values() if isinstance(rq, RemoteQueue)}
        await wait_all([w.request(S.CONTROLLER, info) for w in workers if w.alive])

    async def reservation_changed(
        self, res: reservations.NamespaceReservation, preempted: list[bytes]
    ) -> None:
        """A reservation changed here: every worker holds the new state (and has let the
        preempted hosts' commands finish) before the command that changed it completes."""
        seq = self._reservation_seq.get(res, 0) + 1
        self._reservation_seq[res] = seq
        nqn = _subsystem_of(self.target, res)
        if nqn is None:
            return
        state = res.state.copy()
        await wait_all(
            [
                w.request(S.RESERVATION, nqn, res.nsid, seq, state, list(preempted))
                for w in self._live()
            ]
        )


def _ignore_result(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _subsystem_of(target: Target, res: reservations.NamespaceReservation) -> str | None:
    for subsystem in target.subsystems.values():
        ns = subsystem.namespaces.get(res.nsid)
        if ns is not None and ns.reservation is res:
            return subsystem.nqn
    return None


class _ForwardedIo:
    """What the reservation commands read of an IoHandler, for one run here."""

    def __init__(self, ctrl: Controller) -> None:
        self.ctrl = ctrl
        self.namespaces = ctrl.namespaces
        self.queue = self

    async def fetch_data(self, req: Request) -> bytearray:
        # The worker fetched the data of every command whose data reservations read.
        raise ConnectionError("no data was forwarded")


class MultiCoreTarget(Target):
    """A Target whose I/O queues worker processes serve (`cores` of them); with the
    same methods, which also keep the workers current."""

    def __init__(self, cores: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workers = WorkerPool(self, cores)
        self._background: set[asyncio.Task[None]] = set()
        self._faults_sent: list[asyncio.Future[Any]] = []
        # What a killed target left in /dev/shm goes before this one adds its own.
        range_locks.remove_stale()

    def memory_device(self, size_bytes: int, block_size: int) -> MemoryDevice:
        return SharedMemoryDevice(size_bytes, block_size)

    def qos_gate(self, limits: QosLimits) -> QosGate:
        # The workers pace against the same state: each admission under one semaphore.
        return QosGate.create(limits, range_locks.RangeLocks.create(1))

    async def qos_changed(self, name: str) -> None:
        for subsystem, ns in self.device_users(name):
            await self.workers.qos_changed(subsystem.nqn, ns)

    def hand_off(self, queue: TargetQueue, req: Request, result: int) -> bool:
        return self.workers.hand_off(queue, req, result)

    def poll_group_of(self, queue: object) -> str:
        if isinstance(queue, RemoteQueue):
            return group_name(queue.worker.index + 1)
        return super().poll_group_of(queue)

    def commands_in_flight(self) -> dict[str, int]:
        counts = super().commands_in_flight()
        for worker in self.workers.workers:
            for nqn, n in worker.in_flight.items():
                if nqn in counts:
                    counts[nqn] += n
        return counts

    def poll_groups(self) -> list[PollGroup]:
        """This process's poll group (what it serves itself), then one per worker."""
        (main,) = super().poll_groups()
        groups = [main]
        for worker in self.workers.workers:
            current = len(worker.queues)
            main.current_io_qpairs -= current
            main.io_qpairs -= worker.adopted
            main.completed_nvme_io -= worker.completed
            groups.append(
                PollGroup(
                    name=group_name(worker.index + 1),
                    pid=worker.pid if worker.alive else 0,
                    admin_qpairs=0,  # admin queues stay in the main process
                    io_qpairs=worker.adopted,
                    current_admin_qpairs=0,
                    current_io_qpairs=current,
                    completed_nvme_io=worker.completed,
                    started=worker.started,
                )
            )
        return groups

    async def controller_changed(self, ctrl: Controller) -> None:
        await self.workers.controller_changed(ctrl)

    def set_latency_tracking(self, enable: bool) -> None:
        super().set_latency_tracking(enable)
        self.workers.latency_tracking(enable)

    def record_connections(self, recorder: Recorder | None) -> None:
        # The workers' I/O queues would be recorded in other processes, each on its own
        # clock and counter: one association's files would not replay as one.
        if recorder is not None:
            raise ChangeError("record", "recording needs a target on one core (--cores 1)")
        super().record_connections(None)

    async def set_log_levels(self, levels: LogLevels) -> None:
        await super().set_log_levels(levels)
        await self.workers.log_levels(levels)

    def faults_changed(self) -> None:
        super().faults_changed()
        self._faults_sent = self.workers.faults_changed(self.faults.specs())

    async def faults_applied(self) -> None:
        await wait_all(self._faults_sent)

    async def start(self) -> None:
        for subsystem in self.subsystems.values():
            for ns in subsystem.namespaces.values():
                ns.reservation.replicate = self.workers.reservation_changed
        await self.workers.start()
        try:
            await super().start()
        except BaseException:
            await self.workers.stop()
            raise

    async def stop(self) -> None:
        await super().stop()
        await self.workers.stop()

    def add_namespace(self, nqn: str, device: str | NamedDevice, **kwargs: Any) -> Namespace:
        subsystem = self.subsystems.get(nqn)
        # The events about it (Namespace Attribute Changed, ANA Change) wait, on the
        # controllers with queues on workers, until every worker has the namespace: a
        # host uses a new namespace once it heard of it, and its first command to it may
        # reach a worker that a loaded machine has not let read the message yet.
        held = [] if subsystem is None else _on_workers(subsystem)
        for ctrl in held:
            ctrl.hold_events()
        try:
            ns = super().add_namespace(nqn, device, **kwargs)
        except BaseException:
            for ctrl in held:
                ctrl.release_events()
            raise
        answers = self.workers.namespace_added(nqn, ns)
        if held:  # (controllers: the target runs, in a loop)
            task = asyncio.get_running_loop().create_task(_release_when(held, answers))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if not S.shareable(ns):
            # Its I/O can be served here alone: the controllers with queues on workers
            # are torn down, and their hosts reconnect with every queue here.
            for ctrl in _on_workers(self.subsystems[nqn]):
                ctrl.destroy(f"namespace {ns.nsid} cannot be served by the worker processes")
        return ns

    async def remove_namespace(self, nqn: str, nsid: int) -> Namespace:
        subsystem = self.subsystems.get(nqn)
        if subsystem is None or nsid not in subsystem.namespaces:
            return await super().remove_namespace(nqn, nsid)  # refuses it
        # The workers first: once they answered, none of their commands uses it.
        await self.workers.namespace_removing(nqn, nsid)
        return await super().remove_namespace(nqn, nsid)

    async def ns_add_host(self, nqn: str, nsid: int, hostnqn: str) -> list[Controller]:
        # The events wait until every worker has the host's view: a host uses the
        # namespace once it heard of it, maybe through a worker.
        subsystem = self.subsystems.get(nqn)
        held = [] if subsystem is None else _on_workers(subsystem)
        for ctrl in held:
            ctrl.hold_events()
        try:
            attached = await super().ns_add_host(nqn, nsid, hostnqn)
            await self.workers.namespace_hosts(nqn, self.subsystems[nqn].namespaces[nsid])
        finally:
            for ctrl in held:
                ctrl.release_events()
        return attached

    async def ns_remove_host(self, nqn: str, nsid: int, hostnqn: str) -> list[Controller]:
        # Here first (new commands here fail at once), then the workers, whose answer
        # says their commands to it finished.
        detached = await super().ns_remove_host(nqn, nsid, hostnqn)
        # The namespace (or its subsystem) may have gone while this one's commands drained:
        # its removal told the workers then.
        subsystem = self.subsystems.get(nqn)
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if ns is not None:
            await self.workers.namespace_hosts(nqn, ns)
        return detached

    async def resize_block_device(
        self, name: str, size_bytes: int | None = None, *, force: bool = False
    ) -> int:
        # The events wait until every worker serves the new size: a host reads past the
        # old end once it heard of the change, maybe through a worker.
        users = self.device_users(name)
        held = [ctrl for subsystem, _ns in users for ctrl in _on_workers(subsystem)]
        for ctrl in held:
            ctrl.hold_events()
        try:
            try:
                num_blocks = await super().resize_block_device(name, size_bytes, force=force)
            except BaseException:
                if force or size_bytes is None:
                    # A cut (or the following of an outside cut) that failed once some
                    # workers served less (shrink_served): each serves what the storage
                    # has again. The first error is the answer, whatever a worker says.
                    with contextlib.suppress(Exception):
                        await self._workers_take_sizes(users)
                raise
            await self._workers_take_sizes(users)
        finally:
            for ctrl in held:
                ctrl.release_events()
        return num_blocks

    async def _workers_take_sizes(self, users: list[tuple[Subsystem, Namespace]]) -> None:
        for subsystem, ns in users:
            await self.workers.namespace_resized(subsystem.nqn, ns)

    async def shrink_served(
        self, users: list[tuple[Subsystem, Namespace]], size_bytes: int
    ) -> None:
        for subsystem, ns in users:
            await self.workers.namespace_shrinking(subsystem.nqn, ns, size_bytes)

    async def remove_subsystem(self, nqn: str) -> None:
        await super().remove_subsystem(nqn)
        await self.workers.subsystem_removed(nqn)

    def set_namespace_ana_group(self, nqn: str, nsid: int, anagrpid: int) -> None:
        # As add_namespace: the events wait, on controllers with queues on workers, until
        # every worker judges the namespace's I/O by its new group.
        subsystem = self.subsystems.get(nqn)
        held = [] if subsystem is None else _on_workers(subsystem)
        for ctrl in held:
            ctrl.hold_events()
        try:
            super().set_namespace_ana_group(nqn, nsid, anagrpid)
        except BaseException:
            for ctrl in held:
                ctrl.release_events()
            raise
        answers = self.workers.namespace_ana_group(nqn, nsid, anagrpid)
        if held:
            task = asyncio.get_running_loop().create_task(_release_when(held, answers))
            self._background.add(task)
            task.add_done_callback(self._background.discard)


def _on_workers(subsystem: Subsystem) -> list[Controller]:
    """The controllers of `subsystem` with I/O queues on workers."""
    return [
        ctrl
        for ctrl in subsystem.controllers.values()
        if any(isinstance(q, RemoteQueue) for q in ctrl.queues.values())
    ]


async def _release_when(held: list[Controller], answers: list[asyncio.Future[Any]]) -> None:
    """Deliver the events of `held` once every worker answered (or after
    NAMESPACE_ACK_TIMEOUT_S: a worker that hangs delays them no longer)."""
    try:
        await asyncio.wait_for(wait_all(answers), NAMESPACE_ACK_TIMEOUT_S)
    except (TimeoutError, RemoteError) as exc:
        log.warning("a worker did not take a new namespace in time: %r", exc)
    finally:
        for ctrl in held:
            ctrl.release_events()


def _check_cores(cores: int) -> None:
    if not isinstance(cores, int) or cores < 1:
        raise ChangeError("cores", f"{cores!r} is not a positive number of cores")


def make_target(
    cores: int, *, limits: ConnectionLimits | None = None, busy_poll_us: int = 0
) -> Target:
    """The target `pynvmf target --cores N` runs: today's single process for 1.
    `busy_poll_us`: poll mode (server.BusyPoller) in every process that serves queues:
    this one (admin queues, and whatever is served here) and each worker."""
    _check_cores(cores)
    if cores == 1:
        return Target(limits=limits, busy_poll_us=busy_poll_us)
    return MultiCoreTarget(cores, limits=limits, busy_poll_us=busy_poll_us)


__all__ = ["MultiCoreTarget", "RemoteQueue", "WorkerPool", "available_cores", "make_target"]
