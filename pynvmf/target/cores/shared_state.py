"""What the main process tells its workers about the target's state, as plain data.

The main process owns the target (subsystems, namespaces, controllers, keep-alive,
reservations); a worker holds a replica of what its I/O queues need, built from
these records and kept current by messages (workers.py sends, worker.py applies).
Everything here is plain data that pickles: no sockets, no devices.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pynvmf.block.file import FileDevice
from pynvmf.block.shared_memory import SharedMemoryDevice
from pynvmf.logs import LogLevels
from pynvmf.spec.command import ConnectCommand, Sqe
from pynvmf.target.ana import DEFAULT_GROUP
from pynvmf.target.reservations import ReservationState
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.tcp.config import EstablishedState, TransportConfig

# Message kinds, main process -> worker.
INIT = "init"  # (WorkerInit) + the ANA table's memfd: the first message
NAMESPACE = "namespace"  # (nqn, SubsystemInfo, NamespaceSpec) + memfd: add or replace; request
NAMESPACE_GONE = "namespace_gone"  # (nqn, nsid): request, answered once drained and closed
NAMESPACE_ANA_GROUP = "namespace_ana_group"  # (nqn, nsid, anagrpid): request
SUBSYSTEM_GONE = "subsystem_gone"  # (nqn): request
ADOPT = "adopt"  # (Adoption) + the connection's socket
CONTROLLER = "controller"  # (ControllerInfo): a controller's I/O-relevant state; request
QUEUE_CLOSE = "queue_close"  # (queue token, reason)
RESERVATION = "reservation"  # (nqn, nsid, seq, state, preempted host IDs): request
# (nqn, nsid, host NQNs): the hosts a namespace without auto_visible is attached to;
# request, answered once the commands of controllers it was detached from finished
NAMESPACE_HOSTS = "namespace_hosts"
# (nqn, nsid): the namespace's file grew, take its size; request
NAMESPACE_RESIZED = "namespace_resized"
# (nqn, nsid, size in bytes): the namespace is about to be cut to that size: quiesce its
# I/O and serve that much only; request, answered once done (quiesce.py)
NAMESPACE_SHRINKING = "namespace_shrinking"
# (nqn, nsid, lock name): the namespace's device has rate limits, paced in the state of the
# memfd that comes with it (qos_gate.py), or (nqn, nsid, None): none any more; request
QOS = "qos"
EXIT = "exit"  # ()
LATENCY_TRACKING = "latency_tracking"  # (enable): time commands (command_counts.py) or stop
LOG_LEVELS = "log_levels"  # (pynvmf.logs.LogLevels): log as they say; request
# ([(rule id, FaultSpec)]): the fault rules in force (faults.py), replacing the last
FAULTS = "faults"
# Worker -> main process.
QUEUE_CLOSED = "queue_closed"  # (queue token)
# (controller tokens with traffic, {token: [ErrorLogEntry]}, {nqn: stats}, TransportCounts,
#  command_counts.Report, {nqn: I/O commands in flight},
#  {fault rule id: (matches, hits)})
ACTIVITY = "activity"
FORWARD = "forward"  # (controller token, sqe bytes, data or None): request -> its Outcome


@dataclass(frozen=True, slots=True)
class TransportCounts:
    """What a worker's connections counted since its last report (ACTIVITY): data
    digest errors, TermReqs sent, requests for data buffers that waited."""

    data_digest_errors: int = 0
    term_reqs_sent: int = 0
    budget_waits: int = 0
    # Copy's bytes by the planner's path (TargetCounters.copied).
    copy_offloaded_bytes: int = 0
    copy_emulated_bytes: int = 0

    def __sub__(self, other: TransportCounts) -> TransportCounts:
        return TransportCounts(
            *(getattr(self, f.name) - getattr(other, f.name) for f in fields(self))
        )

    def valid(self) -> bool:
        """Counts that only grow."""
        return all(getattr(self, f.name) >= 0 for f in fields(self))


@dataclass(frozen=True, slots=True)
class WorkerInit:
    index: int
    log_level: int
    log_format: str
    # What the log methods changed in the main process so far (pynvmf.logs).
    log_levels: LogLevels
    max_memory: int
    connection_data: int
    connect_deadline_s: float
    pdu_deadline_s: float
    # Poll mode (server.BusyPoller) for the worker's queues: its window, 0 for off.
    busy_poll_us: int = 0


@dataclass(frozen=True, slots=True)
class SubsystemInfo:
    """What I/O commands read of a subsystem."""

    max_namespaces: int
    # Its place in the ANA table (ana_table.py) the worker reads its ANA statuses from.
    ana_slot: int

    @classmethod
    def of(cls, subsystem: Subsystem, ana_slot: int) -> SubsystemInfo:
        return cls(subsystem.max_namespaces, ana_slot)


@dataclass(frozen=True, slots=True)
class NamespaceSpec:
    """How a worker opens a namespace's device: the memfd that comes with the message
    (kind "memory") or the file at `path` (kind "file"), and its identity."""

    nsid: int
    kind: str
    block_size: int
    size: int
    path: str = ""
    read_only: bool = False
    # The stripes' semaphores (SharedMemoryDevice.locks, FileDevice.share): name, count.
    locks: tuple[str, int] = ("", 0)
    # The reservation state at the time of sending (a dataclass of plain values).
    reservation: ReservationState | None = None
    reservation_seq: int = 0
    anagrpid: int = DEFAULT_GROUP
    # Attached to every host's controllers, or to those of `hosts` only.
    auto_visible: bool = True
    hosts: tuple[str, ...] = ()


def shareable(ns: Namespace) -> bool:
    """Whether worker processes can serve I/O to `ns` on their own: shared memory, or a
    regular file each opens for itself. (A block device is opened with O_EXCL, which a
    second open fails; other devices live in the main process alone.)"""
    device = ns.device
    if isinstance(device, SharedMemoryDevice):
        return True
    return isinstance(device, FileDevice) and not device.is_block_device


def namespace_spec(ns: Namespace, reservation_seq: int) -> NamespaceSpec:
    device = ns.device
    caps = device.capabilities
    reservation = ns.reservation.state.copy()
    if isinstance(device, SharedMemoryDevice):
        return NamespaceSpec(
            ns.nsid,
            "memory",
            caps.block_size,
            caps.size,
            locks=device.locks,
            reservation=reservation,
            reservation_seq=reservation_seq,
            anagrpid=ns.anagrpid,
            auto_visible=ns.auto_visible,
            hosts=tuple(sorted(ns.hosts)),
        )
    assert isinstance(device, FileDevice)
    return NamespaceSpec(
        ns.nsid,
        "file",
        caps.block_size,
        caps.size,
        path=device.path,
        read_only=device.read_only,
        locks=device.share(),
        reservation=reservation,
        reservation_seq=reservation_seq,
        anagrpid=ns.anagrpid,
        auto_visible=ns.auto_visible,
        hosts=tuple(sorted(ns.hosts)),
    )


@dataclass(frozen=True, slots=True)
class ControllerInfo:
    """A controller as its I/O queues see it (the rest stays with the main process)."""

    token: int
    nqn: str
    cntlid: int
    hostnqn: str
    hostid: bytes
    kato_ms: int
    cc: int
    csts: int
    io_queues: int
    volatile_write_cache: bool
    host_behavior: bytes


@dataclass(frozen=True, slots=True)
class PortInfo:
    portid: int
    address: str
    port: int
    transport: TransportConfig


@dataclass(frozen=True, slots=True)
class ValidatedConnect:
    """An I/O queue's Connect as the main process decoded and validated it: the worker
    binds the queue as `command` asks and sends the completion (`sqe`'s CID, `result`)."""

    sqe: Sqe
    command: ConnectCommand
    result: int


@dataclass(frozen=True, slots=True)
class Adoption:
    """A connection handed to a worker after its I/O queue Connect was validated: the
    worker continues it from `transport` (the ICResp went out from the main process),
    binds the queue and sends the Connect's completion; from then on the connection is
    the worker's."""

    token: int
    controller: ControllerInfo
    subsystem: SubsystemInfo
    port: PortInfo
    # The row of the ANA table with the statuses of the subsystem on this port.
    ana_row: int
    peer_address: tuple[str, int] | None
    transport: EstablishedState
    connect: ValidatedConnect
