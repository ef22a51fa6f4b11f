"""The seam between the NVMe layer of a target queue and the transport under it.

`TargetQueue` (queue.py) and the command handlers above it (io.py, controller.py,
compare.py) speak to a queue's transport through `QueueTransport` alone: NVMe/TCP's
`pynvmf.tcp.target.TargetConnection` and NVMe/RDMA's `pynvmf.rdma.queue.RdmaConnection`
both implement it. The transport calls back up through `NvmeQueue` (given once, with
`attach`). A command travels between the two as a `Request`.

The transport is the controller's end of the queue: it decides whether a command's data
is in the capsule or fetched (R2T on TCP, RDMA READ on RDMA), how data and completions
go back, and what a malformed capsule earns. The NVMe layer decides what commands mean.

Why a trait and not a `typing.Protocol`: queue.py, io.py and tcp/target.py are compiled by
mypyc (setup.py). A method called on an attribute typed as a Protocol compiles to a
generic Python method call (a lookup and a vectorcall, hundreds of instructions); typed
as a compiled class or trait it stays a native C call (a trait adds a short search of the
class's trait vtables). `QueueTransport` is a mypyc trait (interpreted, a plain base
class), so the TCP hot path's `complete` and `send_data` keep native calls. A compiled
trait can only be implemented by compiled classes: the RDMA connection's module is
compiled with the others (the pyverbs adapter, which is not, holds one rather than
being one). Measured compiled (2026-12-05, `benchmarks/instructions.py --callgrind
--workloads read4k,write4k`, PYTHONHASHSEED=0): read4k 15,966 -> 16,029 and write4k
20,359 -> 20,448 instructions per command from 39d533f (TargetConnection typed
concretely) to the trait, +0.4%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pynvmf.compiled import trait
from pynvmf.spec.command import Sqe

if TYPE_CHECKING:
    from pynvmf.block.inplace import Loans

    # The NVMe layer's, for the type of Request.latency alone (set and read there).
    from pynvmf.target.command_counts import Histogram

    # What a fault rule asks of the wire (faults.py, tcp/wire_faults.py).
    from pynvmf.tcp.wire_faults import WireFault

Buffer = bytes | bytearray | memoryview


class Charges(Protocol):
    """What the transport needs of a memory budget: to give back what commands held."""

    def give(self, n: int) -> None: ...

    def close(self) -> None: ...


class Request:
    """One command in flight on this connection."""

    __slots__ = (
        "charge",
        "completed",
        "data",
        "dispatched",
        "latency",
        "length",
        "on_data",
        "received",
        "retired",
        "reusable",
        "sent",
        "sqe",
        "started",
        "ttag",
        "waited",
    )

    def __init__(self, sqe: Sqe) -> None:
        self.sqe = sqe
        # Bytes of data buffers this command holds against the connection's budget.
        self.charge = 0
        # A command that only waits for an event (an Asynchronous Event Request) holds no
        # data and may be given up by the host: a new command with its CID retires it, and
        # a retired command never completes.
        self.reusable = False
        self.retired = False
        # Host-to-controller data, once it has all arrived (in-capsule or via R2T).
        self.data: bytearray | memoryview | None = None
        self.length = sqe.sgl_length
        self.ttag = -1
        self.received = 0
        # Controller-to-host data already sent with send_data (a Read sent in pieces).
        self.sent = 0
        self.on_data: Callable[[Request], None] | None = None
        # While latency tracking is on (monotonic ns, else 0; docs/metrics.md): when
        # the capsule began to arrive; when it was dispatched, if in a later batch of
        # input than the one it began in (0: in that one, at `started`); when the NVMe
        # layer handed its completion over off the fast path (0: on it, or not yet);
        # and the ns of that it waited for host data or a buffer.
        self.started = 0
        self.dispatched = 0
        self.completed = 0
        self.waited = 0
        # Where its latency is counted (command_counts.Histogram), set by the NVMe layer
        # where it counts the command: the connection hands the commands that have one
        # to it at the flush that sends their completions (timed_sent).
        self.latency: Histogram | None = None


class NvmeQueue(Protocol):
    """The NVMe layer above one connection: what the transport calls upward. Given once,
    with `QueueTransport.attach`."""

    @property
    def budget(self) -> Charges:
        """Where the data buffers commands hold are given back (target/budget.py)."""
        ...

    def on_command(self, req: Request) -> None:
        """A command has arrived, with its in-capsule data if any (`req.data`)."""
        ...

    def on_refused(self, req: Request) -> None:
        """The transport failed `req` by itself (its submission queue entry is consumed
        all the same), so that the NVMe layer's view of the queue's order (fused
        operations pair adjacent entries) has no holes."""
        ...

    def log_context(self) -> dict[str, object]:
        """What each log record about this connection says of it (pynvmf/logs.py)."""
        ...


@dataclass(frozen=True, slots=True)
class QueueParams:
    """What Connect decided for the queue a connection carries (`QueueTransport.bind_queue`)."""

    qid: int
    sq_size: int
    sqhd_disabled: bool = False
    # In-capsule data is handed to on_command as a memoryview of the receive buffer,
    # valid only until on_command returns, when the NVMe layer says it copies what it
    # keeps; otherwise as a bytearray of its own.
    borrow_capsule_data: bool = False


@trait
class QueueTransport:
    """The controller's end of one queue's transport: what the NVMe layer calls downward.

    The methods' bodies are placeholders: each transport implements all of them."""

    # True once the queue's connection is closing: nothing more goes out.
    closing: bool
    # Where a Read's data may be a view of a memory namespace instead of a copy: the
    # record of what this connection's output holds (block/inplace.py), on a transport
    # that hands its output to the kernel before anything else runs and copies what the
    # device recalls; None where it copies.
    loans: Loans | None

    def attach(self, queue: NvmeQueue) -> None:
        """The NVMe layer's queue above this transport, once, before any command."""
        raise NotImplementedError

    def bind_queue(self, params: QueueParams) -> None:
        """Connect has bound this transport's connection to a queue: completions carry its
        QID and SQHD from now on, and its capsules may carry as much data as the port
        allows for its kind."""
        raise NotImplementedError

    def complete(
        self,
        req: Request,
        status: int,
        result: int = 0,
        data: Buffer | None = None,
        *,
        track: bool = True,
    ) -> None:
        """Send `data` (controller-to-host) if any, then the completion. After send_data,
        `data` is the rest of the command's data."""
        raise NotImplementedError

    def send_data(self, req: Request, data: Buffer) -> None:
        """Send the next part of a command's controller-to-host data (not its last part,
        which goes with complete)."""
        raise NotImplementedError

    def fetch_data(self, req: Request, on_data: Callable[[Request], None]) -> None:
        """Fetch a command's host-to-controller data into `req.data`; `on_data(req)` runs
        once it is all here, or with req.data None if the transfer failed."""
        raise NotImplementedError

    def close(self, reason: str) -> None:
        """End the queue's connection (`reason` for its log)."""
        raise NotImplementedError

    @property
    def commands_in_flight(self) -> int:
        """Commands received and not completed yet."""
        raise NotImplementedError

    def can_inject(self, req: Request, fault: WireFault) -> bool:
        """Whether a fault rule's wire action `fault` can act on `req` here (a rule that
        cannot selects nothing)."""
        raise NotImplementedError

    def inject(self, req: Request, fault: WireFault) -> bool:
        """Act on `req` as `fault` says: True if the command is to run on as usual, False
        if this took it."""
        raise NotImplementedError

    def faults_gone(self) -> None:
        """No fault rule can select this connection's commands any more."""
        raise NotImplementedError
