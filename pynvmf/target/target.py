"""The target: the subsystems it serves, their namespaces and hosts, the block devices
and keys behind them, and the ports they are reached on.

`Target` is an object that changes while it runs: one method per change (add or
remove a block device, subsystem, namespace, host, port, listener). Each method
validates the whole change before it applies any of it, so a refused change (a
ChangeError naming the argument at fault) leaves the target as it was; and each
decides what connected hosts see: controllers torn down, Changed Namespace List
entries and Namespace Attribute Changed events, a new discovery log generation
and Discovery Log Page Change events. The configuration loaders and the RPC
methods only translate their formats into these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pynvmf.auth.controller import ALL_DHGROUPS, ALL_HASHES, HostAuthConfig
from pynvmf.auth.keys import DhchapKey
from pynvmf.block.copy import CopyReport
from pynvmf.block.device import GrowsOutside, Resizable, Shrinkable, StorageShrank
from pynvmf.block.memory import MemoryDevice
from pynvmf.logs import LogLevels, set_log_levels
from pynvmf.malloc import trim
from pynvmf.rdma.counters import RdmaTransportCounters
from pynvmf.record.tap import RECORDING_STOPPED, Recorder
from pynvmf.spec.auth import DhGroupId, HashId
from pynvmf.spec.command import COPY_CDFE_FORMATS
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.nqn import nqn_problem
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.target.budget import (
    SWEEP_INTERVAL_S,
    ConnectionBudget,
    ConnectionLimits,
    MemoryPool,
    default_max_memory,
)
from pynvmf.target.changes import (
    FIRMWARE_MAX,
    MODEL_MAX,
    NSID_MAX,
    SERIAL_MAX,
    ChangeError,
    ChangeListener,
    check_grpid,
    check_hostnqn,
    check_state,
    check_text,
    check_transport,
)
from pynvmf.target.command_counts import CommandCounts
from pynvmf.target.controller_faults import ScheduledFaults
from pynvmf.target.device_io import DeviceIo, DeviceIoLedger
from pynvmf.target.devices import NamedDevice, close_device
from pynvmf.target.drain import commands_waiting, commands_waiting_on, drain
from pynvmf.target.faults import CRD_MAX, FaultRule, FaultSpec, FaultTable, ScheduledFault
from pynvmf.target.generated_psks import GeneratedPsks
from pynvmf.target.keyring import KeyringEntry, parse_key, psk_lookup, read_key_file
from pynvmf.target.notifications import (
    BDEV_REGISTER,
    BDEV_RESIZE,
    BDEV_UNREGISTER,
    TARGET_TYPES,
    NotificationLog,
)
from pynvmf.target.poll_groups import PollGroup, completed_commands, group_name
from pynvmf.target.port import (
    Port,
    SecureChannelPolicy,
    check_port,
    listen,
    normal_address,
    secure_channel_policy,
)
from pynvmf.target.protocol import BusyPoller, TargetProtocol
from pynvmf.target.qos import QosLimits
from pynvmf.target.qos_gate import QosGate
from pynvmf.target.quiesce import quiesced
from pynvmf.target.referrals import Referral, check_referral
from pynvmf.target.subsystem import (
    CNTLID_MAX,
    CNTLID_MIN,
    DEFAULT_VERSION,
    Namespace,
    Subsystem,
)
from pynvmf.tcp.psk import ConfiguredPsk, PskError, TlsPsk
from pynvmf.tcp.target import TransportConfig
from pynvmf.tls.channel import TlsCounters

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

MAX_SUBSYSTEMS = 1024  # SPDK's default, and plenty for one process


class TargetState(Enum):
    """Where a target is in its life: started once, stopped once."""

    NEW = "new"  # built, not listening yet
    RUNNING = "running"  # listening on its ports
    STOPPED = "stopped"  # for good: ports, connections and block devices closed


# The states each state may become (a start that fails stops the target).
_TRANSITIONS: dict[TargetState, tuple[TargetState, ...]] = {
    TargetState.NEW: (TargetState.RUNNING, TargetState.STOPPED),
    TargetState.RUNNING: (TargetState.STOPPED,),
    TargetState.STOPPED: (),
}


@dataclass
class TargetCounters:
    """Cumulative counts for statistics (SPDK's nvmf_get_stats, the metrics endpoint),
    each bumped where a rare event happens, never per command."""

    admin_queues: int = 0
    io_queues: int = 0
    keep_alive_expiries: int = 0
    # What the connections this process served counted, added when each closes (the
    # metrics add the open ones' own counts to these), and what the workers of --cores
    # reported of theirs.
    data_digest_errors: int = 0
    term_reqs_sent: int = 0
    # Requests for data buffers that waited, in the workers (this process's own are its
    # memory pool's).
    worker_budget_waits: int = 0
    # DH-HMAC-CHAP transactions ended in this process: successes, failures by reason
    # (the names of the spec's failure reason explanations: a bounded set).
    auth_successes: int = 0
    auth_failures: dict[str, int] = field(default_factory=dict)
    # Bytes of successful Copy commands that the copy planner (block/copy.py) sent as copy
    # requests to a remote namespace (offloaded), or read and wrote again itself
    # (emulated, staged data included); with the workers' reports added. The rest of
    # Copy's bytes (command_counts.py counts them all) were copied inside the device:
    # the memory namespaces' at-once path counts nothing more.
    copy_offloaded_bytes: int = 0
    copy_emulated_bytes: int = 0

    def copied(self, report: CopyReport, block_size: int) -> None:
        """A Copy command done by the planner: count its offloaded and emulated bytes."""
        self.copy_offloaded_bytes += report.offloaded_blocks * block_size
        self.copy_emulated_bytes += report.emulated_blocks * block_size


class Target:
    def __init__(
        self,
        subsystems: Iterable[Subsystem] = (),
        ports: Iterable[Port] = (),
        *,
        transport: TransportConfig | None = None,
        limits: ConnectionLimits | None = None,
        busy_poll_us: int = 0,
    ) -> None:
        self.subsystems: dict[str, Subsystem] = {}
        # DH-HMAC-CHAP secrets by name (SPDK's keyring), and the hashes and DH groups a
        # host's authentication allows unless its own configuration says otherwise.
        self.keyring: dict[str, KeyringEntry] = {}
        self.dhchap_hashes: tuple[HashId, ...] = ALL_HASHES
        self.dhchap_dhgroups: tuple[DhGroupId, ...] = ALL_DHGROUPS
        self.block_devices: dict[str, NamedDevice] = {}
        # What happened to the block devices, for a client that polls (SPDK's notify).
        self.notifications = NotificationLog(TARGET_TYPES)
        self.discovery = Subsystem(DISCOVERY_NQN, model="pynvmf discovery")
        self.ports: list[Port] = []
        # The transport options of listeners added with add_listener (SPDK creates a
        # transport once and every listener has its options).
        self.transport = transport or TransportConfig()
        self.max_subsystems = MAX_SUBSYSTEMS
        self.genctr = 1
        # Where the discovery log sends hosts besides this target (SPDK's referrals).
        self.referrals: list[Referral] = []
        self.started = time.monotonic()
        self.counters = TargetCounters()
        # Secure-channel decisions (handshakes, kTLS or user space per direction).
        self.tls_counters = TlsCounters()
        # What the NVMe/RDMA queues counted, per rdma port (nvmf_get_stats).
        self.rdma_counters = RdmaTransportCounters()
        # Completed I/O commands by subsystem, host, namespace and opcode (metrics); kept
        # by NQN, past the controllers and subsystems that counted them.
        self.command_counts = CommandCounts()
        # Each block device's share of those counts (SPDK's bdev_get_iostat).
        self.device_io = DeviceIoLedger(self.command_counts)
        # TLS PSKs that secure channel concatenation generated (generated_psks.py).
        self.generated_psks = GeneratedPsks()
        self.connection_budget = ConnectionBudget(limits or ConnectionLimits())
        limits = self.connection_budget.limits
        self.memory_pool = MemoryPool(limits.max_memory or default_max_memory())
        if busy_poll_us < 0:
            raise ChangeError("busy_poll_us", f"{busy_poll_us} is not a number of microseconds")
        self.busy_poll_us = busy_poll_us
        self.poller = BusyPoller(busy_poll_us / 1e6) if busy_poll_us else None
        self._sweeper: asyncio.TimerHandle | None = None
        # Fault rules (faults.py) and the timers of a scenario's rules still to come or go.
        self.faults = FaultTable()
        self._fault_timers: set[asyncio.TimerHandle] = set()
        # The controller-level rules running on a schedule (controller_faults.py).
        self.scheduled_faults = ScheduledFaults(self)
        # Where new connections are recorded (pynvmf/record, docs/record-replay.md), if anywhere.
        self.recorder: Recorder | None = None
        # Command Retry Delay Times 1-3 (Identify Controller CRDT1-3), in 100 ms units.
        self.crdt: tuple[int, int, int] = (0, 0, 0)
        # Told the NQN of every subsystem whose configuration changed (see _changed).
        self._change_listeners: list[ChangeListener] = []
        # Per block device that hears of outside growth (GrowsOutside): its listener, and
        # the rescans those started.
        self._size_listeners: dict[str, Callable[[], None]] = {}
        self._rescans: set[asyncio.Future[None]] = set()
        self._resizing = asyncio.Lock()
        self._state = TargetState.NEW
        for subsystem in subsystems:
            self._adopt(subsystem)
        for port in ports:
            self._check_port(port)
            self._place_port(port)

    # -- running -------------------------------------------------------------------------

    @property
    def state(self) -> TargetState:
        return self._state

    def _check_transition(self, state: TargetState) -> None:
        if state not in _TRANSITIONS[self._state]:
            raise RuntimeError(f"a {self._state.value} target cannot become {state.value}")

    def _enter(self, state: TargetState) -> None:
        """The one place the target's state changes."""
        self._check_transition(state)
        self._state = state

    async def start(self) -> None:
        self._check_transition(TargetState.RUNNING)
        try:
            for port in self.ports:
                await self._listen(port)
        except BaseException:
            await self.stop()
            raise
        if self._state is TargetState.STOPPED:
            return  # stop() ran while the ports opened
        self._enter(TargetState.RUNNING)
        self.started = time.monotonic()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections that hold the target waiting on input a host never finishes."""
        now = time.monotonic()
        for protocol in [p for port in self.ports for p in port.connections]:
            reason = protocol.overdue(now)
            if reason:
                protocol.logger().warning(
                    "closing the connection from %s on %s: %s",
                    protocol.peer_address,
                    protocol.port,
                    reason,
                )
                protocol.abort(reason)
        if self.memory_pool.should_trim():
            trim()
        if self._state is not TargetState.STOPPED:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    async def stop(self) -> None:
        if self._state is TargetState.STOPPED:
            return
        self._enter(TargetState.STOPPED)
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._rescans):
            task.cancel()
        for timer in self._fault_timers:
            timer.cancel()
        self._fault_timers.clear()
        self.scheduled_faults.stop_all()
        servers = [port.server for port in self.ports if port.server is not None]
        for server in servers:
            server.close()
        for subsystem in [*self.subsystems.values(), self.discovery]:
            for ctrl in list(subsystem.controllers.values()):
                ctrl.destroy("target shutting down")
        for port in self.ports:
            for proto in list(port.connections):
                proto.close("target shutting down")
        for server in servers:
            await server.wait_closed()
        if self.recorder is not None:
            self.recorder.close()
        for port in self.ports:
            port.server = None
        closed: set[int] = set()
        for entry in self.block_devices.values():
            if id(entry.device) not in closed:  # one device may back several namespaces
                closed.add(id(entry.device))
                # A device whose flush fails (storage gone) is still closed, and so are
                # the ones after it.
                await close_device(entry)

    def find_subsystem(self, nqn: str, port: Port) -> Subsystem | None:
        if not port.exposes(nqn) or not any(p is port for p in self.ports):
            return None
        if nqn == DISCOVERY_NQN:
            return self.discovery
        return self.subsystems.get(nqn)

    def poll_groups(self) -> list[PollGroup]:
        """The processes that serve the queues and what each counted (SPDK's poll groups,
        target/poll_groups.py): this one, here."""
        admin = io = 0
        for subsystem in [self.discovery, *self.subsystems.values()]:
            queues = subsystem.queue_counts()
            admin += queues[0]
            io += queues[1]
        return [
            PollGroup(
                name=group_name(0),
                pid=os.getpid(),
                admin_qpairs=self.counters.admin_queues,
                io_qpairs=self.counters.io_queues,
                current_admin_qpairs=admin,
                current_io_qpairs=io,
                completed_nvme_io=completed_commands(self.command_counts),
                started=self.started,
            )
        ]

    def commands_in_flight(self) -> dict[str, int]:
        """I/O commands received and not completed yet, by subsystem NQN."""
        counts = {}
        for nqn, subsystem in self.subsystems.items():
            n = 0
            for ctrl in subsystem.controllers.values():
                for qid, queue in ctrl.queues.items():
                    if qid:
                        n += queue.commands_in_flight
            counts[nqn] = n
        return counts

    def poll_group_of(self, queue: object) -> str:
        """The name of the poll group that serves `queue`, one of a controller's."""
        return group_name(0)

    # -- where I/O queues are served: here, every one of them (cores/workers.py's
    # MultiCoreTarget overrides these for `pynvmf target --cores N`) ---------------------

    def memory_device(self, size_bytes: int, block_size: int) -> MemoryDevice:
        """A new memory device for the configuration or the RPC to serve: private memory,
        or shared memory the worker processes map when they serve the I/O queues."""
        return MemoryDevice(size_bytes, block_size)

    def hand_off(self, queue: TargetQueue, req: Request, result: int) -> bool:
        """Whether another process serves I/O queue `queue` from now on, and answers its
        Connect `req` (validated and bound here) with `result`: never, here."""
        return False

    async def controller_changed(self, ctrl: Controller) -> None:
        """A Set Features changed what I/O reads of `ctrl`: whatever serves its queues
        elsewhere takes the change before the host hears of it. Nothing, here."""

    def record_connections(self, recorder: Recorder | None) -> None:
        """Record every connection accepted from now on to `recorder`'s directory (None:
        stop). A recorder replaced or stopped closes the files it still has open."""
        old, self.recorder = self.recorder, recorder
        if old is not None and old is not recorder:
            old.close(RECORDING_STOPPED)

    def set_latency_tracking(self, enable: bool) -> None:
        """Time every I/O command (latency histograms: command_counts.py) from now on,
        or stop, wherever the I/O queues are served."""
        self.command_counts.set_tracking(enable)

    def qos_gate(self, limits: QosLimits) -> QosGate:
        """New rate limits for a block device: paced by this process alone, or by the
        worker processes too (then with a lock they share)."""
        return QosGate.create(limits)

    async def qos_changed(self, name: str) -> None:
        """Block device `name` got rate limits, or lost them: whatever serves its
        namespace's I/O elsewhere applies them before the change is answered. Nothing,
        here."""

    async def set_log_levels(self, levels: LogLevels) -> None:
        """Log as `levels` says from now on, in this process and wherever I/O queues are
        served (the worker processes): once it returns, every process does."""
        set_log_levels(levels)

    # -- fault rules (faults.py, docs/faults.md) ---------------------------------------------

    def faults_for(self, ctrl: Controller) -> FaultTable | None:
        """What a queue of `ctrl` judges its commands by: the rules while there are any,
        or while the controller is failed (CSTS.CFS: its queues hold what comes)."""
        if ctrl.is_discovery or not (self.faults or ctrl.failed):
            return None
        return self.faults

    def arm_controller_faults(self, ctrl: Controller) -> None:
        """The queues of `ctrl` judge by faults_for(ctrl) from their next command (its
        CSTS changed: fail_controller, controller_faults.py)."""
        faults = self.faults_for(ctrl)
        for queue in ctrl.queues.values():
            queue.arm_faults(faults)

    def add_fault(self, spec: FaultSpec, for_ms: float | None = None) -> FaultRule:
        """Add a rule, acting from the next command it selects, or, a controller-level
        one, from now (check_fault says what it may be refused for); removed `for_ms`
        later if given."""
        self.check_fault(spec)
        if not spec.per_command:
            self.scheduled_faults.check_start(spec)
        rule = self.faults.add(spec)
        log.info("fault rule %d added: %s", rule.id, spec.as_dict())
        self.faults_changed()
        if not spec.per_command:
            self.scheduled_faults.start(rule)
        if for_ms is not None:
            loop = asyncio.get_running_loop()
            self._fault_timer(loop, for_ms, self._scenario_rule_ends, rule.id)
        return rule

    def check_fault(self, spec: FaultSpec) -> None:
        """ChangeError naming the field if `spec` is malformed, selects a subsystem or
        namespace that does not exist, or asks for a Command Retry Delay whose CRDT is 0."""
        spec.check()
        if spec.subsystem is not None:
            subsystem = self._subsystem(spec.subsystem, "subsystem")
            if spec.nsid is not None and spec.nsid not in subsystem.namespaces:
                raise ChangeError("nsid", f"{spec.subsystem} has no namespace {spec.nsid}")
        elif spec.nsid is not None and not any(
            spec.nsid in s.namespaces for s in self.subsystems.values()
        ):
            raise ChangeError("nsid", f"no subsystem has namespace {spec.nsid}")
        if spec.action == "ana_flap":
            self.ana_state_of(spec.subsystem or "", spec.anagrpid or 0, spec.traddr, spec.trsvcid)
        if spec.action in ("status", "not_ready") and spec.crd and not self.crdt[spec.crd - 1]:
            raise ChangeError(
                "crd", f"CRDT{spec.crd} is 0: set the retry delay times first (set_crdt)"
            )

    def remove_fault(self, rule_id: int) -> FaultRule:
        rule = self.faults.remove(rule_id)
        self.scheduled_faults.stop(rule_id)
        log.info("fault rule %d removed after %d hits", rule.id, rule.hits)
        self.faults_changed()
        return rule

    def schedule_faults(self, scenario: Iterable[ScheduledFault]) -> None:
        """Add each rule of a scenario `at_ms` from now (those at 0 at once), and remove it
        `for_ms` after. Every rule is checked first: a scenario with one the target
        refuses adds none (ChangeError naming the entry and field)."""
        entries = list(scenario)
        for i, entry in enumerate(entries):
            try:
                self.check_fault(entry.spec)
            except ChangeError as exc:
                raise ChangeError(f"faults[{i}].{exc.field}", exc.reason) from None
        loop = asyncio.get_running_loop()
        for entry in entries:
            if entry.at_ms:
                self._fault_timer(loop, entry.at_ms, self._scenario_rule, entry)
            else:
                self._scenario_rule(entry)

    def _fault_timer(
        self, loop: asyncio.AbstractEventLoop, ms: float, call: Callable[..., None], *args: object
    ) -> None:
        def run() -> None:
            self._fault_timers.discard(handle)
            call(*args)

        handle = loop.call_later(ms / 1000.0, run)
        self._fault_timers.add(handle)

    def _scenario_rule(self, entry: ScheduledFault) -> None:
        try:
            self.add_fault(entry.spec, entry.for_ms)
        except ChangeError as exc:
            log.error("scenario: fault rule not added: %s", exc)

    def _scenario_rule_ends(self, rule_id: int) -> None:
        if rule_id in self.faults.rules:
            self.remove_fault(rule_id)

    def set_crdt(self, crdt: tuple[int, int, int]) -> None:
        """The Command Retry Delay Times (100 ms units) Identify Controller reports: a host
        reads them when it connects (the Linux host enables ACRE only if CRDT1 is set)."""
        for i, value in enumerate(crdt):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFF:
                raise ChangeError(f"crdt{i + 1}", f"{value!r} is not in 0..65535")
        if len(crdt) != CRD_MAX:
            raise ChangeError("crdt", "three values")
        self.crdt = (crdt[0], crdt[1], crdt[2])

    def follow_faults(self, rules: list[tuple[int, FaultSpec]]) -> None:
        """Take the rules another process decided (a worker its main process's: checked
        there), as they are."""
        self.faults.follow(rules)
        self._arm_faults()

    def faults_changed(self) -> None:
        """The rules changed: every queue judges its commands by them from its next one,
        wherever the queues are served (the workers: cores/workers.py)."""
        self._arm_faults()

    async def faults_applied(self) -> None:
        """Until every process that serves queues judges their commands by the rules as
        they are now: at once here, the workers answer theirs (cores/workers.py)."""

    def _arm_faults(self) -> None:
        for subsystem in self.subsystems.values():
            for ctrl in subsystem.controllers.values():
                faults = self.faults_for(ctrl)
                for queue in ctrl.queues.values():
                    queue.arm_faults(faults)

    def set_transport(self, config: TransportConfig) -> None:
        """The transport options of the listeners add_listener opens from now on."""
        check_transport(config)
        self.transport = config

    # -- block devices ------------------------------------------------------------------

    def add_block_device(self, entry: NamedDevice) -> NamedDevice:
        """Make `entry` available to add_namespace under its name."""
        if not entry.name or not isinstance(entry.name, str):
            raise ChangeError("name", "a block device needs a name")
        if entry.name in self.block_devices:
            raise ChangeError("name", f"a block device named {entry.name!r} exists")
        if entry.uuid is not None:
            for other in self.block_devices.values():
                if other.uuid == entry.uuid:
                    raise ChangeError("uuid", f"{entry.uuid} is block device {other.name!r}'s")
        self._place_device(entry)
        return entry

    def _place_device(self, entry: NamedDevice) -> None:
        """The one way a block device joins the target, whoever adds it."""
        self.block_devices[entry.name] = entry
        self.notifications.send(BDEV_REGISTER, entry.name)
        device = entry.device
        if isinstance(device, GrowsOutside):
            listener = self._size_listener(entry.name)
            self._size_listeners[entry.name] = listener
            device.add_size_listener(listener)

    def _drop_device(self, entry: NamedDevice) -> None:
        """The one way a block device leaves the target (it is closed after)."""
        listener = self._size_listeners.pop(entry.name, None)
        if listener is not None and isinstance(entry.device, GrowsOutside):
            entry.device.remove_size_listener(listener)
        del self.block_devices[entry.name]
        if entry.qos is not None:
            entry.qos.close()
            entry.qos = None
        self.device_io.device_gone(entry.name)
        self.notifications.send(BDEV_UNREGISTER, entry.name)

    def device_io_of(self, name: str, *, reset_extremes: bool = False) -> DeviceIo:
        """What block device `name` did for the hosts (device_io.py); with
        `reset_extremes`, its device time's maxima and minima start again after this."""
        namespaces = [(s.nqn, ns.nsid) for s, ns in self.device_users(name)]
        io = self.device_io.of(name, namespaces)
        if reset_extremes:
            self.device_io.reset_extremes(name, namespaces)
        return io

    def device_users(self, name: str) -> list[tuple[Subsystem, Namespace]]:
        return [
            (subsystem, ns)
            for subsystem in self.subsystems.values()
            for ns in subsystem.namespaces.values()
            if ns.device_name == name
        ]

    async def remove_block_device(self, name: str) -> None:
        """Remove a block device; the namespaces on it are removed first (hot removal:
        their hosts see them go), then it is flushed and closed."""
        entry = self._block_device(name)
        for subsystem, ns in self.device_users(name):
            await self.remove_namespace(subsystem.nqn, ns.nsid)
        if self.block_devices.get(name) is entry:
            self._drop_device(entry)
            await close_device(entry)

    async def resize_block_device(
        self, name: str, size_bytes: int | None = None, *, force: bool = False
    ) -> int:
        """Block device `name` takes a new size: `size_bytes` (a regular file, memory or an
        RBD image is extended or, forced, cut to it), or, without it, the size its
        storage has now (it grew outside: SPDK's bdev_aio_rescan, another Ceph client's
        resize). Every controller that sees a namespace on it is told (Namespace
        Attribute Changed, Changed Namespace List): a Linux host's block device takes
        the size without reconnecting. A smaller size drops the data past the new end,
        which a host may hold: refused (ChangeError naming `force`) unless `force`; then
        the namespaces' I/O is quiesced while the device is cut (`_shrink`). Storage
        a rescan finds smaller was cut outside (a file truncated, another Ceph client's
        `rbd resize --allow-shrink`): its data is gone already, so the target follows
        it with the same steps, cutting nothing (`_shrunk_outside`). The new number of
        blocks."""
        entry = self._block_device(name)
        device = entry.device
        if not isinstance(device, Resizable):
            raise ChangeError(
                "name", f"{name!r} cannot change size (a file, memory or RBD device can)"
            )
        # One at a time: a rescan the watch started while a grow is under way compares
        # with the size that grow left; a quiesce never waits for another (quiesce.py).
        async with self._resizing:
            before = device.capabilities.num_blocks
            try:
                if size_bytes is None:
                    try:
                        num_blocks = await device.rescan()
                    except StorageShrank as shrank:
                        num_blocks = await self._shrunk_outside(name, shrank)
                elif size_bytes < device.capabilities.size:
                    num_blocks = await self._shrink(name, size_bytes, force=force)
                else:
                    num_blocks = await device.grow(size_bytes)
            except ChangeError:
                raise
            except (ValueError, OSError) as exc:
                raise ChangeError("name" if size_bytes is None else "size", str(exc)) from exc
            finally:
                # The device may have mapped its storage again (a memory device's InPlace
                # is then another), whatever the outcome.
                for subsystem, ns in self.device_users(name):
                    subsystem.refresh_io_paths(ns.nsid)
        if num_blocks == before:
            return num_blocks  # as SPDK: no size change, no event and no notification
        users = self.device_users(name)
        log.info("block device %s: %d blocks", name, num_blocks)
        for subsystem, ns in users:
            for ctrl in subsystem.controllers.values():
                if ctrl.namespaces.get(ns.nsid) is ns:
                    ctrl.namespace_changed(ns.nsid)
        self.notifications.send(BDEV_RESIZE, name)
        for nqn in {subsystem.nqn for subsystem, _ns in users}:
            self._changed(nqn)
        return num_blocks

    async def _shrink(self, name: str, size_bytes: int, *, force: bool) -> int:
        """Cut block device `name` to `size_bytes` (`_serve_less`, then the storage).
        Resize lock held."""
        device = self.block_devices[name].device
        size = device.capabilities.size
        if not force:
            raise ChangeError(
                "force",
                f"{size_bytes} bytes is less than the {size} bytes of {name!r}: a shrink "
                "drops the data past the new end, which hosts may hold, so it is done only "
                "when forced (pynvmf_bdev_resize's force)",
            )
        num_blocks = await self._serve_less(name, size_bytes, cut=True)
        log.warning(
            "block device %s cut from %d to %d bytes (forced): the data past it is gone",
            name,
            size,
            size_bytes,
        )
        return num_blocks

    async def _shrunk_outside(self, name: str, shrank: StorageShrank) -> int:
        """Block device `name`'s storage was cut outside to `shrank.size_bytes`: every
        process serves that much only (`_serve_less`, nothing cut). Not refused as SPDK
        does (-EBUSY while the bdev is open): the data past the end is gone whatever the
        answer, and a target still serving the old size would give its hosts read
        errors there, and have their writes extend a file again. Resize lock held."""
        size = self.block_devices[name].device.capabilities.size
        num_blocks = await self._serve_less(name, shrank.size_bytes, cut=False)
        log.warning(
            "block device %s was cut outside from %d to %d bytes: served at that size",
            name,
            size,
            shrank.size_bytes,
        )
        return num_blocks

    async def _serve_less(self, name: str, size_bytes: int, *, cut: bool) -> int:
        """Have block device `name` served at `size_bytes` only: the I/O of every
        namespace on it is quiesced (quiesce.py) while every process that serves it
        stops serving past the new end (`shrink_served`), and then, if `cut`, the
        storage is cut, so that no command reads or writes past the end of what is
        left. The one place a namespace gets smaller. Resize lock held."""
        device = self.block_devices[name].device
        if not isinstance(device, Shrinkable):
            raise ChangeError(
                "name", f"{name!r} cannot be made smaller (a file, memory or RBD device can)"
            )
        users = self.device_users(name)
        async with contextlib.AsyncExitStack() as stack:
            for subsystem, ns in users:
                await stack.enter_async_context(quiesced(subsystem, ns.nsid))
            # Here first: a size it refuses (not whole blocks, a block device to cut) is
            # refused before any other process changed anything.
            num_blocks = await device.serve_only(size_bytes)
            try:
                await self.shrink_served(users, size_bytes)
                if cut:
                    num_blocks = await device.shrink(size_bytes)
            except BaseException:
                # Not cut: served at the size the storage still has, here (the other
                # processes take it from the caller's rescan: shrink_served's contract).
                with contextlib.suppress(ValueError, OSError):
                    await device.rescan()
                raise
        return num_blocks

    async def shrink_served(
        self, users: list[tuple[Subsystem, Namespace]], size_bytes: int
    ) -> None:
        """The namespaces `users` (on one device, their I/O quiesced here) are about to be
        cut to `size_bytes`: whatever serves their I/O elsewhere stops serving past it
        first, and answers once it did. Should the cut fail, the caller has it take the
        size the storage kept as after any resize. Nothing, here."""

    async def set_qos_limits(self, name: str, given: dict[str, int]) -> QosLimits:
        """Change the rate limits of block device `name` (SPDK's bdev_set_qos_limit:
        `given` by qos.LIMIT_NAMES, 0 removes one, one not given keeps its value), shared
        by every host and queue of the namespace on it, at once, commands waiting
        included. The limits now in force (SPDK's rounding applied, qos.normalized)."""
        entry = self._block_device(name)
        gate = entry.qos
        limits = (gate.limits if gate is not None else QosLimits()).changed(given)
        if gate is not None and limits.any:
            gate.set_limits(limits)
        elif gate is not None or limits.any:
            entry.qos = self.qos_gate(limits) if limits.any else None
            for subsystem, ns in self.device_users(name):
                ns.qos = entry.qos
                subsystem.refresh_io_paths(ns.nsid)  # limited: the general path waits
            try:
                await self.qos_changed(name)
            finally:
                if gate is not None:
                    gate.close()  # its waiting commands go, unlimited
        log.info("block device %s: rate limits %s", name, limits.as_dict())
        for nqn in {subsystem.nqn for subsystem, _ns in self.device_users(name)}:
            self._changed(nqn)
        return limits

    def _size_listener(self, name: str) -> Callable[[], None]:
        """What block device `name` calls when its storage may have changed size outside
        (another Ceph client resized the image): it is rescanned, as bdev_aio_rescan
        would, and taken grown or followed cut."""

        def changed() -> None:
            task = asyncio.ensure_future(self._rescan_outside(name))
            self._rescans.add(task)
            task.add_done_callback(self._rescans.discard)

        return changed

    async def _rescan_outside(self, name: str) -> None:
        if name not in self.block_devices:
            return
        try:
            await self.resize_block_device(name)
        except ChangeError as exc:
            log.warning("block device %s: the size it has now is not taken: %s", name, exc)

    def _block_device(self, name: str, field: str = "name") -> NamedDevice:
        entry = self.block_devices.get(name)
        if entry is None:
            raise ChangeError(field, f"no block device named {name!r}")
        return entry

    # -- changes ------------------------------------------------------------------------

    def add_change_listener(self, listener: ChangeListener) -> None:
        """Call `listener(nqn)` after every change of subsystem `nqn`'s configuration
        (added, removed, its namespaces, hosts, listeners), whoever made it: the one
        place a gateway learns what changed (to share it, or to give a new namespace its
        ANA state). Called on the event loop's thread once the change is complete."""
        self._change_listeners.append(listener)

    def remove_change_listener(self, listener: ChangeListener) -> None:
        if listener in self._change_listeners:
            self._change_listeners.remove(listener)

    def _changed(self, nqn: str) -> None:
        for listener in list(self._change_listeners):
            try:
                listener(nqn)
            except Exception:  # a listener's fault must not undo or fail the change
                log.exception("change listener %r failed for %s", listener, nqn)

    # -- subsystems ---------------------------------------------------------------------

    def add_subsystem(
        self,
        nqn: str,
        *,
        serial: str = "",
        model: str = "pynvmf",
        allow_any_host: bool = True,
        hosts: Iterable[str] = (),
        max_namespaces: int = 0,
        cntlid_min: int = CNTLID_MIN,
        cntlid_max: int = CNTLID_MAX,
        max_io_queues: int | None = None,
        version: int = DEFAULT_VERSION,
        firmware: str = "",
        ieee_oui: int = 0,
        copy_formats: int = 0,
    ) -> Subsystem:
        """A new subsystem, with no namespaces, on the ports that expose every subsystem."""
        subsystem = Subsystem(
            nqn,
            allow_any_host=allow_any_host,
            allowed_hosts=set(hosts),
            serial=serial,
            model=model,
            max_namespaces=max_namespaces,
            cntlid_min=cntlid_min,
            cntlid_max=cntlid_max,
            max_io_queues=max_io_queues,
            version=version,
            firmware=firmware,
            ieee_oui=ieee_oui,
            copy_formats=copy_formats,
        )
        self._check_subsystem(subsystem)
        self.subsystems[nqn] = subsystem
        log.info("subsystem %s added", nqn)
        self._discovery_changed()
        self._changed(nqn)
        return subsystem

    def _check_subsystem(self, subsystem: Subsystem) -> None:
        nqn = subsystem.nqn
        problem = nqn_problem(nqn)
        if problem:
            raise ChangeError("nqn", f"{nqn!r} is not a valid NQN: {problem}")
        if nqn == DISCOVERY_NQN:
            raise ChangeError("nqn", "the discovery subsystem's NQN is reserved")
        if nqn in self.subsystems:
            raise ChangeError("nqn", f"subsystem {nqn} exists")
        if len(self.subsystems) >= self.max_subsystems:
            raise ChangeError("nqn", f"the target has its maximum of {self.max_subsystems}")
        for hostnqn in subsystem.allowed_hosts:
            check_hostnqn(hostnqn)
        check_text("serial", subsystem.serial, SERIAL_MAX)
        check_text("model", subsystem.model, MODEL_MAX)
        check_text("firmware", subsystem.firmware, FIRMWARE_MAX)
        if not CNTLID_MIN <= subsystem.cntlid_min <= subsystem.cntlid_max <= CNTLID_MAX:
            raise ChangeError(
                "cntlid_min",
                f"controller IDs {subsystem.cntlid_min}..{subsystem.cntlid_max} are not a "
                f"range within {CNTLID_MIN}..{CNTLID_MAX}",
            )
        if not 0 <= subsystem.max_namespaces <= NSID_MAX:
            raise ChangeError("max_namespaces", f"{subsystem.max_namespaces} not in 0..{NSID_MAX}")
        if subsystem.max_io_queues is not None and not 1 <= subsystem.max_io_queues <= 0xFFFF:
            raise ChangeError("max_io_queues", f"{subsystem.max_io_queues} not in 1..65535")
        if not 0 < subsystem.version <= 0xFFFFFFFF:
            raise ChangeError("version", f"{subsystem.version:#x} is not an NVMe version")
        if not 0 <= subsystem.ieee_oui < 1 << 24:
            raise ChangeError("ieee_oui", f"{subsystem.ieee_oui:#x} is not a 24-bit OUI")
        if subsystem.copy_formats & ~COPY_CDFE_FORMATS:
            raise ChangeError("copy_formats", "only Copy formats 2 and 3 need enabling")
        for ns in subsystem.namespaces.values():
            self._check_nsid(subsystem, ns.nsid)

    def _adopt(self, subsystem: Subsystem) -> None:
        """Take a Subsystem built by the caller, with its namespaces, whose devices
        become block devices of its own (owned: they go with their namespaces)."""
        self._check_subsystem(subsystem)
        entries = []
        for ns in subsystem.namespaces.values():
            name = ns.device_name or f"{subsystem.nqn}/{ns.nsid}"
            if name in self.block_devices or any(e.name == name for e in entries):
                raise ChangeError("name", f"a block device named {name!r} exists")
            entries.append(NamedDevice.wrap(name, ns.device, owned=True))
            ns.device_name = name
        for entry in entries:
            self._place_device(entry)
        self.subsystems[subsystem.nqn] = subsystem

    def _subsystem(self, nqn: str, field: str = "nqn") -> Subsystem:
        subsystem = self.subsystems.get(nqn)
        if subsystem is None:
            raise ChangeError(field, f"no subsystem {nqn!r}")
        return subsystem

    async def remove_subsystem(self, nqn: str) -> None:
        """Remove a subsystem: new Connects to it fail at once, its controllers are torn
        down (their connections closed), its listeners go; once the commands that were in
        flight have finished, its namespaces' devices are flushed (and closed if owned)."""
        subsystem = self._subsystem(nqn)
        waiting = commands_waiting(subsystem)
        del self.subsystems[nqn]
        self.generated_psks.forget(subnqn=nqn)
        log.info("subsystem %s removed", nqn)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.destroy("subsystem removed")
        emptied = []
        for port in self.ports:
            if port.subsystems is not None and nqn in port.subsystems:
                port.subsystems.remove(nqn)
                if not port.subsystems and not port.discovery_only:
                    emptied.append(port)
        for port in emptied:
            await self._emptied(port)
        self._discovery_changed()
        await drain(waiting)
        for ns in subsystem.namespaces.values():
            self.device_io.namespace_gone(nqn, ns.nsid, ns.device_name)
            await self._release(ns)
        self._changed(nqn)

    # -- namespaces ---------------------------------------------------------------------

    def add_namespace(
        self,
        nqn: str,
        device: str | NamedDevice,
        *,
        nsid: int | None = None,
        ns_uuid: uuid.UUID | None = None,
        nguid: bytes | None = None,
        eui64: bytes | None = None,
        ptpl_file: Path | None = None,
        anagrpid: int | None = None,
        auto_visible: bool = True,
        hosts: Iterable[str] = (),
    ) -> Namespace:
        """Serve a block device, by name, as namespace `nsid` (default: the lowest free)
        of subsystem `nqn`; or a new one (a NamedDevice, added with the namespace: it
        must be `owned` then, to go away with it). Its controllers' hosts are told
        (Changed Namespace List, Namespace Attribute Changed): a Linux host adds it
        without reconnecting. Without `auto_visible` it is attached to the controllers
        of `hosts` only (and of those `ns_add_host` names later).

        Identities the caller does not give are the device's UUID (if it has one) or
        derived from the NQN, NSID and what backs the device, so stable across restarts.
        With `ptpl_file` its reservations can persist through power loss; a state saved
        there is restored (a damaged one is refused: the hosts it fences would get in).
        The namespace is in ANA group `anagrpid` (default 1), which is created (optimized
        on every listener) if the subsystem has no such group yet.
        """
        subsystem = self._subsystem(nqn)
        grpid = ana.DEFAULT_GROUP if anagrpid is None else anagrpid
        check_grpid(grpid)
        hosts = set(hosts)
        if hosts and auto_visible:
            raise ChangeError("hosts", "a namespace visible to every host names no hosts")
        for hostnqn in hosts:
            check_hostnqn(hostnqn)
        if isinstance(device, NamedDevice):
            entry = device
            if entry.name in self.block_devices:
                raise ChangeError("device", f"a block device named {entry.name!r} exists")
            if not entry.owned:
                raise ChangeError("device", "a device added with its namespace is owned by it")
        else:
            entry = self._block_device(device, "device")
        device_name = entry.name
        users = self.device_users(device_name)
        if users:
            other, used = users[0]
            raise ChangeError(
                "device", f"{device_name!r} is in use by namespace {used.nsid} of {other.nqn}"
            )
        if nsid is None:
            nsid = self._free_nsid(subsystem)
        self._check_nsid(subsystem, nsid)
        if nsid in subsystem.namespaces:
            raise ChangeError("nsid", f"NSID {nsid} of {nqn} is in use")
        if nguid is not None and len(nguid) != 16:
            raise ChangeError("nguid", "an NGUID is 16 bytes")
        if eui64 is not None and len(eui64) != 8:
            raise ChangeError("eui64", "an EUI-64 is 8 bytes")
        if ns_uuid is None:
            ns_uuid = entry.uuid
        if nguid is None and entry.uuid is not None:
            nguid = entry.uuid.bytes
        try:
            ns = Namespace.create(
                nqn,
                nsid,
                entry.device,
                entry.identity_key,
                ns_uuid,
                nguid=nguid,
                eui64=eui64,
                device_name=device_name,
                ptpl_file=ptpl_file,
                anagrpid=grpid,
                auto_visible=auto_visible,
            )
        except (OSError, ValueError) as exc:
            raise ChangeError("ptpl_file", str(exc)) from exc
        for other in subsystem.namespaces.values():
            for what, mine, theirs in (
                ("uuid", ns.uuid.bytes, other.uuid.bytes),
                ("nguid", ns.nguid, other.nguid),
                ("eui64", ns.eui64, other.eui64),
            ):
                if mine == theirs and any(mine):
                    raise ChangeError(what, f"namespace {other.nsid} of {nqn} has it")
        ns.hosts = hosts
        ns.qos = entry.qos
        if isinstance(device, NamedDevice):
            self._place_device(entry)
        subsystem.namespaces[nsid] = ns
        self.device_io.namespace_added(nqn, nsid)
        ns.reservation.attach(subsystem.registered, nsid)
        log.info("namespace %d of %s added on %s", nsid, nqn, device_name)
        group = subsystem.ana.add(grpid)
        subsystem.ana.changed([group])  # its NSID list grew
        # Only the hosts that see it are told (their ANA logs list it).
        for ctrl in subsystem.refresh_views(nsid):
            ctrl.namespace_changed(nsid)
            ctrl.ana_changed()
        self._changed(nqn)
        return ns

    def set_namespace_ana_group(self, nqn: str, nsid: int, anagrpid: int) -> None:
        """Move namespace `nsid` to ANA group `anagrpid` (created, optimized on every
        listener, if new), as SPDK's nvmf_subsystem_set_ns_ana_group: hosts get the
        Namespace Attribute Changed and ANA Change events and read ANAGRPID again."""
        subsystem = self._subsystem(nqn)
        check_grpid(anagrpid)
        ns = subsystem.namespaces.get(nsid)
        if ns is None:
            raise ChangeError("nsid", f"{nqn} has no namespace {nsid!r}")
        if ns.anagrpid == anagrpid:
            return
        old = subsystem.ana.group(ns.anagrpid)
        ns.anagrpid = anagrpid
        new = subsystem.ana.add(anagrpid)
        subsystem.ana.changed([new] if old is None else [old, new])
        log.info("namespace %d of %s moved to ANA group %d", nsid, nqn, anagrpid)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.namespace_changed(nsid)
            ctrl.ana_changed()
        self._changed(nqn)

    def _free_nsid(self, subsystem: Subsystem) -> int:
        limit = subsystem.max_namespaces or NSID_MAX
        nsid = 1
        while nsid in subsystem.namespaces:
            nsid += 1
        if nsid > limit:
            raise ChangeError("nsid", f"{subsystem.nqn} has no free NSID (at most {limit})")
        return nsid

    @staticmethod
    def _check_nsid(subsystem: Subsystem, nsid: int) -> None:
        limit = subsystem.max_namespaces or NSID_MAX
        if not isinstance(nsid, int) or not 1 <= nsid <= limit:
            raise ChangeError("nsid", f"{nsid!r} not in 1..{limit}")

    async def remove_namespace(self, nqn: str, nsid: int) -> Namespace:
        """Stop serving namespace `nsid`: new commands to it fail with Invalid Namespace at
        once, hosts are told, and the commands in flight finish (each with a status)
        before its device is flushed, and closed if it was opened for it."""
        subsystem = self._subsystem(nqn)
        ns = subsystem.namespaces.get(nsid)
        if ns is None:
            raise ChangeError("nsid", f"{nqn} has no namespace {nsid!r}")
        waiting = commands_waiting(subsystem)
        del subsystem.namespaces[nsid]
        ns.reservation.detach()
        log.info("namespace %d of %s removed", nsid, nqn)
        group = subsystem.ana.group(ns.anagrpid)
        subsystem.ana.changed([group] if group is not None else [])
        for ctrl in subsystem.refresh_views(nsid):
            ctrl.namespace_changed(nsid)
            ctrl.ana_changed()
        await drain(waiting, subsystem)
        self.device_io.namespace_gone(nqn, nsid, ns.device_name)
        await self._release(ns)
        self._changed(nqn)
        return ns

    async def ns_add_host(self, nqn: str, nsid: int, hostnqn: str) -> list[Controller]:
        """Attach namespace `nsid` (added without auto_visible) to `hostnqn`'s controllers,
        now and later ones; each is told (Changed Namespace List, Namespace Attribute
        Changed), no other host is. The controllers it was attached to."""
        ns = self._hidden_namespace(nqn, nsid, hostnqn)
        ns.hosts.add(hostnqn)
        return self._visibility_changed(nqn, ns, hostnqn)

    async def ns_remove_host(self, nqn: str, nsid: int, hostnqn: str) -> list[Controller]:
        """Detach namespace `nsid` from `hostnqn`'s controllers: their new commands to it
        fail with Invalid Namespace at once, and it returns once the commands they had in
        flight finished (each with a status): nothing they sent is written after."""
        ns = self._hidden_namespace(nqn, nsid, hostnqn)
        ns.hosts.discard(hostnqn)
        detached = self._visibility_changed(nqn, ns, hostnqn)
        await drain(commands_waiting_on(detached), self._subsystem(nqn))
        return detached

    def _hidden_namespace(self, nqn: str, nsid: int, hostnqn: str) -> Namespace:
        subsystem = self._subsystem(nqn)
        check_hostnqn(hostnqn)
        ns = subsystem.namespaces.get(nsid) if isinstance(nsid, int) else None
        if ns is None:
            raise ChangeError("nsid", f"{nqn} has no namespace {nsid!r}")
        if ns.auto_visible:
            raise ChangeError(
                "nsid",
                f"namespace {nsid} of {nqn} is visible to every host (no_auto_visible unset)",
            )
        return ns

    def _visibility_changed(self, nqn: str, ns: Namespace, hostnqn: str) -> list[Controller]:
        subsystem = self._subsystem(nqn)
        changed = subsystem.refresh_views(ns.nsid)
        for ctrl in changed:
            ctrl.namespace_changed(ns.nsid)
            ctrl.ana_changed()
        log.info(
            "namespace %d of %s %s host %s",
            ns.nsid,
            nqn,
            "attached to" if ns.visible_to(hostnqn) else "detached from",
            hostnqn,
        )
        self._changed(nqn)
        return changed

    async def _release(self, ns: Namespace) -> None:
        entry = self.block_devices.get(ns.device_name)
        if entry is None or entry.device is not ns.device:
            return
        if entry.owned:
            self._drop_device(entry)
            shared = any(e.device is entry.device for e in self.block_devices.values())
            if not shared:
                await close_device(entry)
        else:
            try:
                await entry.device.flush()
            except OSError as exc:
                log.error("flushing %s failed: %s", entry.name, exc)

    # -- keys ---------------------------------------------------------------------------

    def add_key(self, name: str, path: str) -> KeyringEntry:
        """Add a DH-HMAC-CHAP secret or a TLS PSK (NVMeTLSkey-1) from a key file (mode
        0600) to the keyring under `name` (SPDK's keyring_file_add_key); hosts refer to
        keys by name."""
        self._check_key_name(name)
        entry = KeyringEntry(name, path, read_key_file(path))
        self.keyring[name] = entry
        log.info("key %s added from %s", name, path)
        return entry

    def add_key_text(self, name: str, text: str) -> KeyringEntry:
        """Add a DH-HMAC-CHAP secret (DHHC-1) or a TLS PSK (NVMeTLSkey-1) given as text,
        for a controller that has no access to the target's files (blktests' control
        script runs on the host under test). Its entry has no path: outputs show the name
        alone, and a saved configuration names no file to restore it from."""
        self._check_key_name(name)
        entry = KeyringEntry(name, "", parse_key(text))
        self.keyring[name] = entry
        log.info("key %s added (given over the control plane)", name)
        return entry

    def _check_key_name(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ChangeError("name", "a key needs a name")
        if name in self.keyring:
            raise ChangeError("name", f"key {name!r} exists")

    def remove_key(self, name: str) -> None:
        if name not in self.keyring:
            raise ChangeError("name", f"no key named {name!r}")
        for subsystem in self.subsystems.values():
            users = [
                h
                for h, c in subsystem.host_auth.items()
                if name in (c.host_key_name, c.ctrl_key_name)
            ]
            users += [h for h, used in subsystem.host_psk_names.items() if used == name]
            for hostnqn in users:
                raise ChangeError("name", f"key {name!r} is in use by {hostnqn} on {subsystem.nqn}")
        del self.keyring[name]
        log.info("key %s removed", name)

    def auth_config(
        self,
        dhchap_key: str | DhchapKey,
        dhchap_ctrl_key: str | DhchapKey | None = None,
        *,
        hashes: Iterable[HashId] | None = None,
        dhgroups: Iterable[DhGroupId] | None = None,
    ) -> HostAuthConfig:
        """A host's authentication from keyring names (or keys), with the target's
        hashes and DH groups unless given."""

        def resolve(ref: str | DhchapKey, field: str) -> tuple[DhchapKey, str]:
            if isinstance(ref, DhchapKey):
                return ref, ""
            entry = self.keyring.get(ref)
            if entry is None:
                raise ChangeError(field, f"no key named {ref!r} in the keyring")
            if not isinstance(entry.key, DhchapKey):
                raise ChangeError(field, f"key {ref!r} is a TLS PSK, not a DH-HMAC-CHAP secret")
            return entry.key, entry.name

        host_key, host_name = resolve(dhchap_key, "dhchap_key")
        ctrl_key, ctrl_name = (
            resolve(dhchap_ctrl_key, "dhchap_ctrlr_key")
            if dhchap_ctrl_key is not None
            else (None, "")
        )
        hash_list = tuple(hashes) if hashes is not None else self.dhchap_hashes
        group_list = tuple(dhgroups) if dhgroups is not None else self.dhchap_dhgroups
        if not hash_list:
            raise ChangeError("dhchap_hash", "at least one hash")
        if not group_list:
            raise ChangeError("dhchap_dhgroup", "at least one DH group")
        return HostAuthConfig(host_key, ctrl_key, hash_list, group_list, host_name, ctrl_name)

    # -- hosts --------------------------------------------------------------------------

    def add_host(
        self,
        nqn: str,
        hostnqn: str,
        *,
        auth: HostAuthConfig | None = None,
        psk: str | ConfiguredPsk | None = None,
    ) -> None:
        """Allow `hostnqn` to connect to `nqn` (when it does not allow any host); with
        `auth`, the host must authenticate with DH-HMAC-CHAP; with `psk` (a keyring name
        or a key), its TLS connections use that PSK (a port that does not require TLS
        takes it in plain too, as nvmet does)."""
        subsystem = self._subsystem(nqn)
        check_hostnqn(hostnqn)
        if hostnqn in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn} is already allowed on {nqn}")
        key = self._resolve_psk(psk) if psk is not None else None
        subsystem.allowed_hosts.add(hostnqn)
        if auth is not None:
            subsystem.host_auth[hostnqn] = auth
        if key is not None:
            subsystem.host_psks[hostnqn] = key[1]
            subsystem.host_psk_names[hostnqn] = key[0]
        self._discovery_changed()
        self._changed(nqn)

    def set_host_keys(self, nqn: str, hostnqn: str, auth: HostAuthConfig | None) -> None:
        """Change (or, with None, remove) the DH-HMAC-CHAP keys of a host on `nqn`.

        Queues already authenticated stay so; every authentication from now on (a new
        queue, or the host re-authenticating) uses the new keys, as with nvmet. A host
        that must rotate its key re-authenticates with it (Linux: writing the new secret
        to /sys/class/nvme/nvmeX/dhchap_secret)."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts and hostnqn not in subsystem.host_auth:
            raise ChangeError("host", f"{hostnqn!r} is not a host of {nqn}")
        if auth is None:
            subsystem.host_auth.pop(hostnqn, None)
            # What it authenticated for goes with the key; new keys leave it, as they leave
            # the queues that already authenticated.
            self.generated_psks.forget(hostnqn=hostnqn, subnqn=nqn)
        else:
            subsystem.host_auth[hostnqn] = auth
        log.info("DH-HMAC-CHAP keys of %s on %s %s", hostnqn, nqn, "changed" if auth else "removed")
        self._changed(nqn)

    def set_host_psk(self, nqn: str, hostnqn: str, psk: str | ConfiguredPsk | None) -> None:
        """Give a host of `nqn` a TLS PSK (a keyring name or a key), or take it away
        (None). Connections already made stay; the next handshake uses the new key."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn!r} is not a host of {nqn}")
        if psk is None:
            subsystem.host_psks.pop(hostnqn, None)
            subsystem.host_psk_names.pop(hostnqn, None)
        else:
            name, key = self._resolve_psk(psk)
            subsystem.host_psks[hostnqn] = key
            subsystem.host_psk_names[hostnqn] = name
        self._changed(nqn)

    def _resolve_psk(self, psk: str | ConfiguredPsk) -> tuple[str, ConfiguredPsk]:
        if isinstance(psk, ConfiguredPsk):
            return "", psk
        if not isinstance(psk, str):
            raise ChangeError("psk", "a keyring name or a PSK in the interchange format")
        entry = self.keyring.get(psk)
        if entry is not None:
            if not isinstance(entry.key, ConfiguredPsk):
                raise ChangeError("psk", f"key {psk!r} is not a TLS PSK")
            return psk, entry.key
        try:
            return "", ConfiguredPsk.parse(psk)
        except PskError as exc:
            if psk.startswith("NVMeTLSkey-1:"):
                raise ChangeError("psk", str(exc)) from None
            raise ChangeError("psk", f"no key named {psk!r} in the keyring") from None

    def tls_lookup(self, port: Port) -> Callable[[bytes], list[TlsPsk]]:
        """The PSK for a TLS identity a host offers on `port` (keyring.psk_lookup)."""
        return psk_lookup(self.subsystems, self.generated_psks, port)

    def remove_host(self, nqn: str, hostnqn: str) -> None:
        """Take `hostnqn` off the subsystem's hosts; its controllers there are torn down."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn!r} is not a host of {nqn}")
        subsystem.allowed_hosts.discard(hostnqn)
        subsystem.host_auth.pop(hostnqn, None)
        self.generated_psks.forget(hostnqn=hostnqn, subnqn=nqn)
        subsystem.host_psks.pop(hostnqn, None)
        subsystem.host_psk_names.pop(hostnqn, None)
        for ctrl in list(subsystem.controllers.values()):
            if ctrl.hostnqn == hostnqn:
                ctrl.destroy("host removed from the subsystem")
        self._discovery_changed()
        self._changed(nqn)

    def set_allow_any_host(self, nqn: str, allow: bool) -> None:
        """Let any host connect, or only the subsystem's hosts: the controllers of hosts
        that may no longer connect are torn down."""
        subsystem = self._subsystem(nqn)
        if not isinstance(allow, bool):
            raise ChangeError("allow_any_host", "not a boolean")
        if subsystem.allow_any_host == allow:
            return
        subsystem.allow_any_host = allow
        for ctrl in list(subsystem.controllers.values()):
            if not subsystem.host_allowed(ctrl.hostnqn):
                ctrl.destroy("host no longer allowed on the subsystem")
        self._discovery_changed()
        self._changed(nqn)

    # -- ports and listeners ------------------------------------------------------------

    def find_port(self, address: str, port: int, trtype: str = "tcp") -> Port | None:
        """The `trtype` port listening on address:port (a TCP and an rdma port may share
        an address and number)."""
        for candidate in self.ports:
            if candidate.trtype == trtype and candidate.same_address(address, port):
                return candidate
        return None

    async def add_port(self, port: Port) -> Port:
        """Listen on a new port (at once, if the target is running)."""
        self._check_port(port)
        if self._state is TargetState.RUNNING:
            await self._listen(port)
        self._place_port(port)
        self._discovery_changed()
        return port

    def _check_port(self, port: Port) -> None:
        check_port(port, self.ports)

    def _place_port(self, port: Port) -> None:
        used = {p.portid for p in self.ports}
        if not port.portid or port.portid in used:
            port.portid = next(i for i in range(1, len(used) + 2) if i not in used)
        self.ports.append(port)

    async def _listen(self, port: Port) -> None:
        if port.trtype == "rdma":
            # pyverbs (rdma-core's Python bindings) is imported only for an rdma port.
            from pynvmf.rdma import verbs

            try:
                port.server = await verbs.listen(self, port)
            except (ImportError, OSError) as exc:
                raise ChangeError("trtype", f"cannot listen on {port}: {exc}") from exc
            return
        await listen(port, lambda: TargetProtocol(self, port))

    async def remove_port(self, port: Port) -> None:
        """Stop listening on `port`: every controller with a queue through it is torn
        down and every connection through it closed."""
        if not any(p is port for p in self.ports):
            raise ChangeError("port", f"the target does not listen on {port}")
        self.ports = [p for p in self.ports if p is not port]
        for subsystem in self.subsystems.values():
            subsystem.ana.forget_port(port)
        for subsystem in [*self.subsystems.values(), self.discovery]:
            for ctrl in list(subsystem.controllers.values()):
                if any(queue.port is port for queue in ctrl.queues.values()):
                    ctrl.destroy(f"port {port} removed")
        for proto in list(port.connections):
            proto.close(f"port {port} removed")
        server, port.server = port.server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        log.info("stopped listening on %s", port)
        self._discovery_changed()

    async def add_listener(
        self,
        nqn: str,
        address: str,
        port_number: int,
        *,
        secure_channel: str | None = None,
        trtype: str = "tcp",
        transport: TransportConfig | None = None,
    ) -> Port:
        """Let subsystem `nqn` (or the discovery subsystem) be reached on address:port
        over `trtype`, opening the port if the target does not listen there yet (with
        `transport`'s options, the target's by default). `secure_channel` sets a new port's
        TLS requirement; on a port that exists it must match."""
        if nqn != DISCOVERY_NQN:
            self._subsystem(nqn)
        policy = None if secure_channel is None else secure_channel_policy(secure_channel)
        port = self.find_port(address, port_number, trtype) if port_number else None
        if port is None:
            if nqn == DISCOVERY_NQN:
                new = Port(address, port_number, discovery_only=True, discovery_listener=True)
            else:
                new = Port(address, port_number, subsystems=[nqn])
            new.trtype = trtype
            new.transport = transport if transport is not None else self.transport
            new.secure_channel = policy or SecureChannelPolicy.NONE
            await self.add_port(new)
            if nqn != DISCOVERY_NQN:
                self._changed(nqn)
            return new
        if policy is not None and policy != port.secure_channel:
            raise ChangeError(
                "secure_channel",
                f"{port} already listens with secure channel {port.secure_channel.value!r}",
            )
        if nqn == DISCOVERY_NQN:
            port.discovery_listener = True
            return port
        if port.discovery_only:
            port.discovery_only = False
            port.subsystems = [nqn]
        elif port.subsystems is None:
            return port  # it exposes every subsystem: this one already listens there
        elif nqn in port.subsystems:
            raise ChangeError("address", f"{nqn} already listens on {port}")
        else:
            port.subsystems.append(nqn)
        self._discovery_changed()
        self._changed(nqn)
        return port

    async def remove_listener(
        self, nqn: str, address: str, port_number: int, trtype: str = "tcp"
    ) -> None:
        """Subsystem `nqn` is no longer reached on address:port (over `trtype`): its
        controllers with a queue through the port are torn down; a port left with nothing
        to serve closes."""
        port = self.find_port(address, port_number, trtype)
        if port is None:
            raise ChangeError("address", f"the target does not listen on {address} {port_number}")
        if nqn == DISCOVERY_NQN:
            if port.discovery_only:
                await self.remove_port(port)
            else:
                port.discovery_listener = False
            return
        subsystem = self._subsystem(nqn)
        if not port.exposes(nqn):
            raise ChangeError("address", f"{nqn} does not listen on {port}")
        if port.subsystems is None:
            port.subsystems = [other for other in self.subsystems if other != nqn]
        else:
            port.subsystems.remove(nqn)
        subsystem.ana.forget_port(port)
        for ctrl in list(subsystem.controllers.values()):
            if any(queue.port is port for queue in ctrl.queues.values()):
                ctrl.destroy(f"listener {port} removed")
        if not port.subsystems:
            await self._emptied(port)
        self._discovery_changed()
        self._changed(nqn)

    async def _emptied(self, port: Port) -> None:
        """An I/O port whose last subsystem left: discovery-only if asked for, else gone."""
        if port.discovery_listener:
            port.discovery_only = True
        elif any(p is port for p in self.ports):
            await self.remove_port(port)

    # -- ANA ----------------------------------------------------------------------------

    def listener(self, nqn: str, address: str, port_number: int, trtype: str = "tcp") -> Port:
        """The port through which subsystem `nqn` is reached on address:port over `trtype`."""
        self._subsystem(nqn)
        port = self.find_port(address, port_number, trtype)
        if port is None or port.discovery_only or not port.exposes(nqn):
            raise ChangeError("address", f"{nqn} does not listen on {address} {port_number}")
        return port

    def ana_state_of(
        self, nqn: str, grpid: int, address: str | None = None, port_number: int | None = None
    ) -> AnaState:
        """The state of ANA group `grpid` of subsystem `nqn` on listener address:port (or
        on listeners without a state of their own). ChangeError naming the field if there
        is no such group or listener."""
        subsystem = self._subsystem(nqn, "subsystem")
        group = subsystem.ana.group(grpid)
        if group is None:
            raise ChangeError("anagrpid", f"{nqn} has no ANA group {grpid}")
        if address is None:
            return group.state
        try:
            port = self.listener(nqn, address, port_number or 0)
        except ChangeError as exc:
            raise ChangeError("traddr", exc.reason) from None
        return group.state_on(port)

    def add_ana_group(
        self, nqn: str, grpid: int, state: AnaState | str = AnaState.OPTIMIZED
    ) -> ana.AnaGroup:
        """A new ANA group of subsystem `nqn`, in `state` on every listener, with no
        namespaces yet (they name it when they are added)."""
        subsystem = self._subsystem(nqn)
        check_grpid(grpid)
        new_state = check_state(state)
        if subsystem.ana.group(grpid) is not None:
            raise ChangeError("anagrpid", f"{nqn} has ANA group {grpid}")
        group = subsystem.ana.add(grpid, new_state)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.ana_changed()
        return group

    def set_ana_state(
        self,
        nqn: str,
        anagrpid: int | None,
        state: AnaState | str,
        address: str | None = None,
        port_number: int | None = None,
        trtype: str = "tcp",
    ) -> int:
        """Put ANA group `anagrpid` of subsystem `nqn` (every group of it if None) in
        `state` on the listener address:port_number (over `trtype`), or, without an
        address, on every listener of the subsystem (and on those added later). The
        controllers whose ANA log says something new, and only they, get an ANA Change
        event; the log's change count moves on. Returns the number of controllers told."""
        subsystem = self._subsystem(nqn)
        new_state = check_state(state)
        if anagrpid is None:
            groups = list(subsystem.ana.groups.values())
        else:
            check_grpid(anagrpid)
            group = subsystem.ana.group(anagrpid)
            if group is None:
                raise ChangeError(
                    "anagrpid",
                    f"{nqn} has no ANA group {anagrpid} (groups: "
                    f"{', '.join(map(str, sorted(subsystem.ana.groups)))})",
                )
            groups = [group]
        port = None if address is None else self.listener(nqn, address, port_number or 0, trtype)
        controllers = list(subsystem.controllers.values())
        ports = {ctrl.port for ctrl in controllers}
        if port is not None:
            ports.add(port)
        before = {(g.grpid, p): g.state_on(p) for g in groups for p in ports}
        changed = []
        for g in groups:
            old = (g.state, dict(g.on_port))
            if port is None:
                g.state = new_state
                g.on_port.clear()
            else:
                g.on_port[port] = new_state
            if (g.state, g.on_port) != old:
                changed.append(g)
        if not changed:
            return 0
        subsystem.ana.changed(changed)
        groups_now = subsystem.ana.groups
        moved = {p for (grpid, p), was in before.items() if groups_now[grpid].state_on(p) != was}
        log.info(
            "ANA group%s %s of %s %s on %s",
            "" if len(changed) == 1 else "s",
            ",".join(str(g.grpid) for g in changed),
            nqn,
            ana.NAMES[new_state],
            port if port is not None else "every listener",
        )
        told = 0
        for ctrl in controllers:
            if ctrl.port in moved:
                ctrl.ana_changed()
                told += 1
        return told

    # -- gateways ------------------------------------------------------------------------

    def add_peer_listener(self, nqn: str, address: str, port_number: int, portid: int = 0) -> None:
        """Another gateway serves subsystem `nqn` on address:port_number: the discovery log
        lists it, so a host that discovers through this target finds that path too."""
        subsystem = self._subsystem(nqn)
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ChangeError("address", f"{address!r} is not an IP address") from None
        if not isinstance(port_number, int) or not 1 <= port_number <= 0xFFFF:
            raise ChangeError("port", f"{port_number!r} is not a TCP port")
        if not isinstance(portid, int) or not 0 <= portid <= 0xFFFF:
            raise ChangeError("portid", f"{portid!r} is not a port ID")
        for peer_address, peer_port, _ in subsystem.peer_listeners:
            if peer_port == port_number and normal_address(peer_address) == normal_address(address):
                raise ChangeError("address", f"{address} {port_number} is a peer of {nqn}")
        subsystem.peer_listeners.append((address, port_number, portid or port_number))
        self._discovery_changed()

    def remove_peer_listener(self, nqn: str, address: str, port_number: int) -> None:
        subsystem = self._subsystem(nqn)
        for entry in subsystem.peer_listeners:
            if entry[1] == port_number and normal_address(entry[0]) == normal_address(address):
                subsystem.peer_listeners.remove(entry)
                self._discovery_changed()
                return
        raise ChangeError("address", f"{address} {port_number} is not a peer listener of {nqn}")

    # -- discovery ------------------------------------------------------------------------

    def add_referral(self, referral: Referral) -> bool:
        """List `referral` in every host's discovery log; False (and nothing changes) if
        the same referral is there already, as SPDK ignores it."""
        check_referral(referral, self.ports)
        if self.find_referral(referral.address, referral.port, referral.subnqn) is not None:
            return False
        self.referrals.append(referral)
        self._discovery_changed()
        return True

    def remove_referral(self, address: str, port_number: int, subnqn: str) -> Referral:
        found = self.find_referral(address, port_number, subnqn)
        if found is None:
            raise ChangeError("address", f"no referral to {address} {port_number} {subnqn}")
        self.referrals.remove(found)
        self._discovery_changed()
        return found

    def find_referral(self, address: str, port_number: int, subnqn: str) -> Referral | None:
        for referral in self.referrals:
            if referral.same(address, port_number, subnqn):
                return referral
        return None

    def _discovery_changed(self) -> None:
        """What some host's discovery log holds may have changed: a new generation, and
        an event to every discovery controller that asked for one."""
        self.genctr += 1
        for ctrl in list(self.discovery.controllers.values()):
            ctrl.discovery_changed()
