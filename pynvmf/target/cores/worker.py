"""A worker process of `pynvmf target --cores N` (workers.py starts it).

It serves the I/O queues the main process hands it, with the same TargetProtocol,
TargetQueue and IoHandler as the single-process target, over a replica of what
they read: subsystems with their namespaces (shared memory mapped here, files
opened here), controllers as the main process describes them, and reservations as
the main process last committed them. It decides nothing about the target's
state: reservation commands go to the main process (FORWARD), and its controllers
are the main process's (keep alive, events, Set Features live there).

Run as `python -m pynvmf.target.cores.worker FD PARENT_PID`; it dies with its parent
(PR_SET_PDEATHSIG, and the channel closing).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
from typing import Any

from pynvmf.aio import install_uvloop
from pynvmf.block.device import Resizable, Shrinkable
from pynvmf.block.file import FileDevice
from pynvmf.block.shared_memory import SharedMemoryDevice
from pynvmf.logs import LogLevels, configure, set_log_levels
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target import fabrics
from pynvmf.target import io as io_module
from pynvmf.target.budget import ConnectionLimits, keep_alive_check_ms
from pynvmf.target.command_counts import Report
from pynvmf.target.controller import Controller
from pynvmf.target.cores import shared_state as S
from pynvmf.target.cores.ana_table import AnaView
from pynvmf.target.cores.ipc import Channel
from pynvmf.target.drain import commands_waiting, commands_waiting_on, drain
from pynvmf.target.outcome import Outcome
from pynvmf.target.port import Port
from pynvmf.target.protocol import TargetProtocol
from pynvmf.target.qos_gate import QosGate
from pynvmf.target.quiesce import quiesced
from pynvmf.target.reservations import ReservationState
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.target.transport import Request

log = logging.getLogger("pynvmf.worker")

PR_SET_PDEATHSIG = 1
# How often traffic is reported at most, and at least (the keep-alive checks of the
# controllers served decide between the two).
REPORT_MIN_S = 0.005
REPORT_MAX_S = 0.5
# Far above anything: the main process admitted the connection against its limits.
_UNLIMITED = 1 << 30


_NOTHING = S.TransportCounts()


class WorkerProtocol(TargetProtocol):
    """A connection the main process handed over: it continues from where the main
    process left it, and reports its end."""

    def __init__(self, worker: Worker, target: Target, port: Port, token: int) -> None:
        super().__init__(target, port)
        self.worker = worker
        self.token = token

    def adopt(self, adoption: S.Adoption, ctrl: Controller) -> None:
        """Continue the connection in the transport state the main process left it in,
        bind its queue to `ctrl` as the Connect asked, and send the Connect's completion
        (the host is waiting for it and has sent nothing since)."""
        queue = self.queue
        assert queue is not None
        conn = self.conn
        if conn.established or conn.closing or conn.input_pending():
            # Bytes came before the Connect's completion (a host may send nothing then),
            # and this end read them first: there is no state to continue from.
            self.abort("the host sent more before its Connect completed")
            return
        conn.adopt(adoption.transport)
        # The receive buffer the handshake sized, charged as its first input would.
        self._charge_receive_buffer()
        if conn.closing:
            return
        if adoption.peer_address:
            queue.peer_address = adoption.peer_address
        connect = adoption.connect
        fabrics.bind(queue, ctrl, connect.command)
        conn.complete(Request(connect.sqe), Status.SUCCESS, connect.result)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        queue = self.queue
        ctrl = queue.controller if queue is not None else None
        super().connection_lost(exc)
        self.worker.queue_gone(self.token, ctrl)


class Worker:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.index = -1
        self.target: Target | None = None
        # Whether to time commands (LATENCY_TRACKING), also before the target exists.
        self.latency_tracking = False
        # The newest LOG_LEVELS, kept for _init if they came before it configured logging.
        self.log_levels: LogLevels | None = None
        # The fault rules (FAULTS), also before the target exists.
        self.fault_rules: list[tuple[int, Any]] = []
        self.channel: Channel | None = None
        self.done = asyncio.Event()
        self.protocols: dict[int, WorkerProtocol] = {}
        # Replica controllers by the main process's token, while they have queues here.
        self.controllers: dict[int, Controller] = {}
        self.tokens: dict[int, int] = {}  # id(replica controller) -> token
        self.ports: dict[int, Port] = {}
        self.reservation_seq: dict[tuple[str, int], int] = {}
        # The memfd of the main process's ANA table (ana_table.py): each subsystem here
        # maps its page of it.
        self.ana_table = -1
        self._reported_errors: dict[int, int] = {}
        self._reported_transport = S.TransportCounts()
        self._reported_in_flight: dict[str, int] = {}
        self._report_handle: asyncio.TimerHandle | None = None
        # The rate limits of namespaces' devices (qos_gate.py), by (NQN, NSID): kept
        # apart from the namespaces, since either message may come first.
        self.qos: dict[tuple[str, int], QosGate] = {}

    async def run(self) -> None:
        self.channel = Channel(self.sock, self._on_message, self.done.set)
        _install_forwarding(self)
        await self.done.wait()
        if self.target is not None:
            target = self.target
            await target.stop()
            # What this worker wrote through its own descriptors is flushed before it goes
            # (the main process flushes its own at its stop, possibly before these).
            for subsystem in target.subsystems.values():
                for ns in subsystem.namespaces.values():
                    try:
                        await ns.device.flush()
                    except (OSError, ValueError) as exc:
                        log.error("flushing namespace %d of %s: %s", ns.nsid, subsystem.nqn, exc)
                    await ns.device.close()
        if self._report_handle is not None:
            self._report_handle.cancel()

    # -- messages --------------------------------------------------------------------

    def _on_message(self, kind: str, args: tuple[Any, ...], fds: list[int]) -> Any:
        if kind == S.ADOPT:
            return self._adopt(args[0], fds[0])
        if kind == S.INIT:
            return self._init(args[0], fds[0])
        if kind == S.QOS:
            self._qos(*args, fds[0] if fds else None)
            return None
        for fd in fds[1:] if kind == S.NAMESPACE else fds:
            os.close(fd)
        if kind == S.NAMESPACE:
            return self._namespace(*args, fds[0] if fds else None)
        if kind == S.QUEUE_CLOSE:
            protocol = self.protocols.get(args[0])
            if protocol is not None:
                protocol.close(args[1])
            return None
        if kind == S.CONTROLLER:
            self._update_controller(args[0])
            return None
        if kind == S.RESERVATION:
            return self._reservation(*args)
        if kind == S.NAMESPACE_GONE:
            return self._namespace_gone(*args)
        if kind == S.NAMESPACE_HOSTS:
            return self._namespace_hosts(*args)
        if kind == S.NAMESPACE_RESIZED:
            return self._namespace_resized(*args)
        if kind == S.NAMESPACE_SHRINKING:
            return self._namespace_shrinking(*args)
        if kind == S.NAMESPACE_ANA_GROUP:
            self._namespace_ana_group(*args)
            return None
        if kind == S.SUBSYSTEM_GONE:
            return self._subsystem_gone(*args)
        if kind == S.EXIT:
            self.done.set()
            return None
        if kind == S.LATENCY_TRACKING:
            # It may come before INIT's target exists (_init awaits): kept for it.
            self.latency_tracking = args[0] is True
            if self.target is not None:
                self.target.set_latency_tracking(self.latency_tracking)
            return None
        if kind == S.LOG_LEVELS:
            self.log_levels = args[0]
            if self.index >= 0:  # logging configured (_init set the index with it)
                set_log_levels(args[0])
            return None
        if kind == S.FAULTS:
            self.fault_rules = args[0]
            if self.target is not None:
                self.target.follow_faults(self.fault_rules)
            return None
        log.error("worker: unknown message %r", kind)
        return None

    async def _init(self, init: S.WorkerInit, ana_fd: int) -> int:
        self.index = init.index
        self.ana_table = ana_fd
        configure(init.log_level, init.log_format, worker=init.index)
        set_log_levels(self.log_levels or init.log_levels)
        self.target = Target(
            limits=ConnectionLimits(
                max_connections=_UNLIMITED,
                max_connections_per_address=_UNLIMITED,
                connect_deadline_s=init.connect_deadline_s,
                pdu_deadline_s=init.pdu_deadline_s,
                max_memory=init.max_memory,
                connection_data=init.connection_data,
            ),
            busy_poll_us=init.busy_poll_us,
        )
        self.target.set_latency_tracking(self.latency_tracking)
        self.target.follow_faults(self.fault_rules)
        await self.target.start()  # no ports: only the sweep of unfinished input
        self._schedule_report()
        return os.getpid()

    def _subsystem(self, nqn: str, info: S.SubsystemInfo) -> Subsystem:
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        if subsystem is None:
            subsystem = Subsystem(nqn)
            self.target.subsystems[nqn] = subsystem
        subsystem.max_namespaces = info.max_namespaces
        if info.ana_slot >= 0 and self.ana_table >= 0 and not isinstance(subsystem.ana, AnaView):
            # The I/O path reads any_blocked and path_status of it, as of AnaGroups: here
            # they come from the page the main process keeps current. (A subsystem keeps
            # its page while it exists: a new one of the same NQN comes after
            # SUBSYSTEM_GONE, as a new Subsystem.)
            subsystem.ana = AnaView.open(self.ana_table, info.ana_slot)  # type: ignore[assignment]
        return subsystem

    async def _namespace(
        self, nqn: str, info: S.SubsystemInfo, spec: S.NamespaceSpec, fd: int | None
    ) -> None:
        subsystem = self._subsystem(nqn, info)
        if spec.kind == "memory":
            assert fd is not None
            device: Any = SharedMemoryDevice(spec.size, spec.block_size, fd=fd, locks=spec.locks)
        else:
            device = FileDevice(
                spec.path, spec.block_size, read_only=spec.read_only, locks=spec.locks
            )
        old = subsystem.namespaces.get(spec.nsid)
        # The identities are the main process's business (Identify runs there).
        ns = Namespace.create(
            nqn,
            spec.nsid,
            device,
            spec.kind,
            anagrpid=spec.anagrpid,
            auto_visible=spec.auto_visible,
        )
        ns.hosts = set(spec.hosts)
        ns.qos = self.qos.get((nqn, spec.nsid))
        if old is not None:
            old.reservation.detach()
        subsystem.namespaces[spec.nsid] = ns
        subsystem.refresh_views(spec.nsid)
        ns.reservation.attach(subsystem.registered, spec.nsid)
        self._apply_reservation(nqn, ns, spec.reservation_seq, spec.reservation)
        if old is not None:
            await old.device.close()

    def _apply_reservation(
        self, nqn: str, ns: Namespace, seq: int, state: ReservationState | None
    ) -> bool:
        key = (nqn, ns.nsid)
        if seq < self.reservation_seq.get(key, 0):
            return False  # an older state than the one applied
        self.reservation_seq[key] = seq
        if state is not None:
            ns.reservation.commit(state)
        return True

    async def _reservation(
        self, nqn: str, nsid: int, seq: int, state: ReservationState, preempted: list[bytes]
    ) -> None:
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if ns is None or not self._apply_reservation(nqn, ns, seq, state):
            return
        if preempted:
            # Preempt and Abort: the preempted hosts' commands admitted here have ended
            # before the preempting command completes.
            await ns.reservation.wait_for(preempted)

    def _namespace_ana_group(self, nqn: str, nsid: int, anagrpid: int) -> None:
        """The namespace moved to another ANA group: its I/O is judged by that group's
        state from the next command on (the device stays as it is)."""
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        ns = None if subsystem is None else subsystem.namespaces.get(nsid)
        if ns is not None:
            ns.anagrpid = anagrpid

    async def _namespace_gone(self, nqn: str, nsid: int) -> None:
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        if subsystem is None:
            return
        self._qos_gone(nqn, nsid)
        ns = subsystem.namespaces.pop(nsid, None)
        if ns is None:
            return
        subsystem.refresh_views(nsid)
        ns.reservation.detach()
        self.reservation_seq.pop((nqn, nsid), None)
        await drain(commands_waiting(subsystem), subsystem)
        await ns.device.close()

    def _qos(self, nqn: str, nsid: int, lock_name: str | None, fd: int | None) -> None:
        """Pace namespace `nsid` by the state in `fd` (its device's rate limits, shared
        with the main process and the other workers), or, without a lock name, no more."""
        self._qos_gone(nqn, nsid)
        gate = None
        if lock_name is not None and fd is not None:
            gate = self.qos[(nqn, nsid)] = QosGate.open(fd, lock_name)
        elif fd is not None:
            os.close(fd)
        # (It may come before INIT's target exists, or before the namespace: _namespace
        # finds it then.)
        subsystem = self.target.subsystems.get(nqn) if self.target is not None else None
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if subsystem is not None and ns is not None:
            ns.qos = gate
            subsystem.refresh_io_paths(nsid)  # limited: the general path waits its turn

    def _qos_gone(self, nqn: str, nsid: int) -> None:
        gate = self.qos.pop((nqn, nsid), None)
        if gate is not None:
            gate.close()  # its waiting commands go

    async def _namespace_hosts(self, nqn: str, nsid: int, hosts: tuple[str, ...]) -> None:
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if subsystem is None or ns is None:
            return
        ns.hosts = set(hosts)
        detached = [c for c in subsystem.refresh_views(nsid) if nsid not in c.namespaces]
        await drain(commands_waiting_on(detached), subsystem)

    async def _namespace_resized(self, nqn: str, nsid: int) -> int:
        """The size this process now serves namespace `nsid` with (in blocks)."""
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if subsystem is None or ns is None:
            return 0
        device = ns.device
        if isinstance(device, Resizable):
            try:
                return await device.rescan()
            finally:
                subsystem.refresh_io_paths(nsid)  # mapped again: another InPlace
        return device.capabilities.num_blocks

    async def _namespace_shrinking(self, nqn: str, nsid: int, size_bytes: int) -> int:
        """Namespace `nsid` is about to be (or was, outside) cut to `size_bytes`: its I/O
        here is quiesced while this process stops serving past them. The size served now
        (in blocks)."""
        assert self.target is not None
        subsystem = self.target.subsystems.get(nqn)
        ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
        if subsystem is None or ns is None:
            return 0
        device = ns.device
        if not isinstance(device, Shrinkable):
            return device.capabilities.num_blocks
        async with quiesced(subsystem, nsid):
            try:
                return await device.serve_only(size_bytes)
            finally:
                subsystem.refresh_io_paths(nsid)  # mapped again: another InPlace

    async def _subsystem_gone(self, nqn: str) -> None:
        assert self.target is not None
        subsystem = self.target.subsystems.pop(nqn, None)
        if subsystem is None:
            return
        waiting = commands_waiting(subsystem)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.destroy("subsystem removed")
        await drain(waiting)
        for ns in subsystem.namespaces.values():
            self._qos_gone(nqn, ns.nsid)
            ns.reservation.detach()
            self.reservation_seq.pop((nqn, ns.nsid), None)
            await ns.device.close()
        # Its AnaView stays mapped until nothing refers to it (a queue's last commands may
        # still read it): one page.

    # -- queues ----------------------------------------------------------------------

    def _port(self, info: S.PortInfo) -> Port:
        port = self.ports.get(info.portid)
        if port is None or port.transport != info.transport:
            port = Port(info.address, info.port, portid=info.portid, transport=info.transport)
            assert self.target is not None
            if info.portid in self.ports:
                self.target.ports.remove(self.ports[info.portid])
            self.ports[info.portid] = port
            self.target.ports.append(port)
        return port

    def _controller(self, info: S.ControllerInfo, subsystem: Subsystem, port: Port) -> Controller:
        ctrl = self.controllers.get(info.token)
        if ctrl is None or ctrl.destroyed:
            assert self.target is not None
            ctrl = Controller(
                self.target, subsystem, info.cntlid, info.hostnqn, info.hostid, info.kato_ms, port
            )
            stale = subsystem.controllers.get(info.cntlid)
            if stale is not None and stale is not ctrl:
                stale.destroy("replaced by a newer controller with its ID")
            subsystem.controllers[info.cntlid] = ctrl
            self.controllers[info.token] = ctrl
            self.tokens[id(ctrl)] = info.token
        self._apply_controller(ctrl, info)
        return ctrl

    def _update_controller(self, info: S.ControllerInfo) -> None:
        ctrl = self.controllers.get(info.token)
        if ctrl is not None:
            self._apply_controller(ctrl, info)
            assert self.target is not None
            # A failed controller's (CSTS.CFS) queues hold its commands (fault rules).
            self.target.arm_controller_faults(ctrl)
            self._schedule_report()

    @staticmethod
    def _apply_controller(ctrl: Controller, info: S.ControllerInfo) -> None:
        ctrl.kato_ms = info.kato_ms
        ctrl.cc = info.cc
        ctrl.csts = info.csts
        ctrl.io_queues = info.io_queues
        ctrl.volatile_write_cache = info.volatile_write_cache
        ctrl.host_behavior = info.host_behavior

    async def _adopt(self, adoption: S.Adoption, fd: int) -> None:
        assert self.target is not None
        sock = socket.socket(fileno=fd)
        try:
            subsystem = self._subsystem(adoption.controller.nqn, adoption.subsystem)
            port = self._port(adoption.port)
            if isinstance(subsystem.ana, AnaView):
                subsystem.ana.rows[port.portid] = adoption.ana_row
            ctrl = self._controller(adoption.controller, subsystem, port)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            _transport, protocol = await loop.connect_accepted_socket(
                lambda: WorkerProtocol(self, self.target, port, adoption.token),  # type: ignore[arg-type]
                sock,
            )
        except BaseException:
            sock.close()
            self._tell_gone(adoption.token)
            raise
        if protocol.queue is None:  # refused (it cannot be: no limits here)
            self._tell_gone(adoption.token)
            return
        self.protocols[adoption.token] = protocol
        protocol.adopt(adoption, ctrl)
        self._schedule_report()

    def queue_gone(self, token: int, ctrl: Controller | None) -> None:
        self.protocols.pop(token, None)
        if ctrl is not None and not ctrl.queues:
            # Its last queue here: the replica goes (a new queue brings a fresh one).
            ctoken = self.tokens.pop(id(ctrl), None)
            if ctoken is not None:
                self._report_errors(ctoken, ctrl, {})
                self.controllers.pop(ctoken, None)
            if ctrl.subsystem.controllers.get(ctrl.cntlid) is ctrl:
                del ctrl.subsystem.controllers[ctrl.cntlid]
        self._tell_gone(token)

    def _tell_gone(self, token: int) -> None:
        if self.channel is not None:
            self.channel.send(S.QUEUE_CLOSED, token)

    # -- reports -----------------------------------------------------------------------

    def _report_interval(self) -> float:
        interval = REPORT_MAX_S
        for ctrl in self.controllers.values():
            interval = min(interval, keep_alive_check_ms(ctrl.kato_ms) / 2000)
        return max(REPORT_MIN_S, interval)

    def _schedule_report(self) -> None:
        if self._report_handle is not None:
            self._report_handle.cancel()
        loop = asyncio.get_running_loop()
        self._report_handle = loop.call_later(self._report_interval(), self._report)

    def _report_errors(self, token: int, ctrl: Controller, errors: dict[int, list[Any]]) -> None:
        reported = self._reported_errors.get(token, 0)
        if ctrl.error_count > reported:
            fresh = min(ctrl.error_count - reported, len(ctrl.errors))
            errors[token] = list(reversed(list(ctrl.errors)[:fresh]))
            self._reported_errors[token] = ctrl.error_count
        if token not in self.controllers or not ctrl.queues:
            self._reported_errors.pop(token, None)

    def _report(self) -> None:
        """Tell the main process which controllers had I/O (their keep alive), their
        errors and the subsystems' statistics since the last report."""
        self._report_handle = None
        traffic = []
        errors: dict[int, list[Any]] = {}
        for token, ctrl in self.controllers.items():
            if ctrl.traffic:
                ctrl.traffic = False
                traffic.append(token)
            self._report_errors(token, ctrl, errors)
        # Each replica's counts since the last report (taken: they restart from zero), so
        # no baseline outlives the replica it was of.
        stats: dict[str, tuple[int, ...]] = {}
        if self.target is not None:
            for nqn, subsystem in self.target.subsystems.items():
                counts = subsystem.stats.take()
                if any(counts):
                    stats[nqn] = counts
        commands: Report = [] if self.target is None else self.target.command_counts.take()
        transport = self._transport_counts()
        fresh = transport - self._reported_transport
        self._reported_transport = transport
        # A gauge: sent when it changed.
        in_flight = {} if self.target is None else self.target.commands_in_flight()
        moved = in_flight != self._reported_in_flight
        self._reported_in_flight = in_flight
        faults = {} if self.target is None else self.target.faults.take_counts()
        busy = traffic or errors or stats or commands or fresh != _NOTHING or moved or faults
        if busy and self.channel is not None:
            self.channel.send(
                S.ACTIVITY, traffic, errors, stats, fresh, commands, in_flight, faults
            )
        if not self.done.is_set():
            self._schedule_report()

    def _transport_counts(self) -> S.TransportCounts:
        """What this worker's connections counted so far: the closed ones' (which
        TargetProtocol adds to the target's counters as each closes) and the open ones'."""
        if self.target is None:
            return _NOTHING
        counters = self.target.counters
        digest_errors, term_reqs = counters.data_digest_errors, counters.term_reqs_sent
        for port in self.ports.values():
            for protocol in port.connections:
                digest_errors += protocol.conn.stats.data_digest_errors
                term_reqs += protocol.conn.stats.term_reqs_sent
        return S.TransportCounts(
            digest_errors,
            term_reqs,
            self.target.memory_pool.waits,
            counters.copy_offloaded_bytes,
            counters.copy_emulated_bytes,
        )

    def controller_token(self, ctrl: Controller) -> int | None:
        return self.tokens.get(id(ctrl))


def _install_forwarding(worker: Worker) -> None:
    """The reservation commands run in the main process: this worker's dispatch table
    sends them there (a process of its own, so its table is its own)."""

    async def forward(io: io_module.IoHandler, req: Request) -> Outcome:
        token = worker.controller_token(io.ctrl)
        if token is None or worker.channel is None:
            return Status.ABORT_SQ_DELETED, 0, None
        data = req.data
        wants_data = req.sqe.opcode & 1 and 0 < req.length <= 4096
        if data is None and wants_data:
            data = await io.queue.fetch_data(req)
        answer = await worker.channel.request(
            S.FORWARD, token, req.sqe.pack(), None if data is None else bytes(data), req.length
        )
        status, result, payload = answer
        return status, result, payload

    for opcode in (
        IoOpcode.RESERVATION_REGISTER,
        IoOpcode.RESERVATION_REPORT,
        IoOpcode.RESERVATION_ACQUIRE,
        IoOpcode.RESERVATION_RELEASE,
    ):
        io_module.set_handler(opcode, forward)


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    fd, parent = int(argv[1]), int(argv[2])
    _die_with_parent(parent)
    # The main process handles the signals (SIGINT from a terminal reaches us too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd)
    install_uvloop()
    asyncio.run(Worker(sock).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
