"""The NVM command set on an I/O queue: Read, Write, Flush, Write Zeroes, Dataset Management,
Copy; Compare and Verify (compare.py, which also runs fused Compare and Write); the
reservation commands (reservations.py, which also decides what a reservation refuses).

Every command is validated completely (namespace, LBA range, transfer length)
before any data moves: a write that would fail never triggers an R2T, and a
range past the end of the namespace touches nothing.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

from pynvmf.aio import start_eager
from pynvmf.block import copy as block_copy
from pynvmf.block.copy_now import copy_one_range_now
from pynvmf.block.device import BlockRangeError, StorageUnavailable
from pynvmf.block.inplace import InPlace
from pynvmf.logs import about
from pynvmf.spec.command import (
    COPY_CDFE_FORMATS,
    COPY_DESCRIPTOR,
    COPY_DESCRIPTOR_SIZE,
    COPY_RANGE_SLBA_NLB,
    DSM_ATTR_DEALLOCATE,
    DSM_RANGE,
    RW_FUA,
    WZ_DEAC,
    CopyRange,
    parse_copy_ranges,
)
from pynvmf.spec.logpages import CmdEffects
from pynvmf.spec.opcodes import NSID_ALL, IoOpcode
from pynvmf.spec.status import (
    CMD_SIZE_LIMIT_EXCEEDED,
    DNR,
    INCOMPATIBLE_NS_OR_FORMAT,
    OVERLAPPING_IO_RANGE,
    Status,
)
from pynvmf.target import compare, reservations
from pynvmf.target.budget import READ_CHUNK, UNCHARGED_READ
from pynvmf.target.command_counts import NO_NAMESPACE, Histogram, NamespaceCounts, opcode_slot
from pynvmf.target.limits import COPY_FORMATS, MAX_TRANSFER, copy_limits, reported_nn
from pynvmf.target.outcome import Outcome
from pynvmf.target.quiesce import wait_resumed

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.target.fused import WriteGate
    from pynvmf.target.qos_gate import QosGate
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Namespace
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

# What Identify reports for each block size, made once (a Copy checks it every time).
_copy_limits = functools.cache(copy_limits)
# For _copy_now: the descriptor sizes of formats 0h and 1h.
_ONE_DESCRIPTOR_SIZE: Final[tuple[int, int]] = (COPY_DESCRIPTOR_SIZE[0], COPY_DESCRIPTOR_SIZE[1])
_SLBA_NLB: Final = COPY_RANGE_SLBA_NLB
# Plain ints for the hot path's tests (an enum member is a class attribute lookup).
_READ: Final = int(IoOpcode.READ)
_WRITE: Final = int(IoOpcode.WRITE)
_COPY: Final = int(IoOpcode.COPY)
# The builtin as a C static: compiled, the name `memoryview` is a lookup in the builtins
# module each time (a test per in-capsule Write).
_MEMORYVIEW: Final = memoryview
# The histogram of IoHandler's run of timed fast-path commands while it has none (no
# command is counted in it).
_NO_RUN: Final = Histogram()
_UNCHARGED_READ: Final = UNCHARGED_READ
_READ_CHUNK: Final = READ_CHUNK
_NSID_ALL: Final = NSID_ALL


@dataclass(frozen=True, slots=True)
class IoCommand:
    """An NVM command set opcode: the IoHandler method that executes it and its entry in
    the Commands Supported and Effects log."""

    method: str
    effects: int = CmdEffects.CSUPP
    # Its `opcode` label in the metrics (pynvmf_commands_total); the method's name unless
    # given.
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.method


_WRITES = CmdEffects.CSUPP | CmdEffects.LBCC

IO_COMMANDS: dict[int, IoCommand] = {
    IoOpcode.READ: IoCommand("read"),
    IoOpcode.WRITE: IoCommand("write", _WRITES),
    IoOpcode.FLUSH: IoCommand("flush"),
    IoOpcode.WRITE_ZEROES: IoCommand("write_zeroes", _WRITES),
    IoOpcode.DATASET_MANAGEMENT: IoCommand("dataset_management", _WRITES, "dsm"),
    IoOpcode.COPY: IoCommand("copy", _WRITES),
    IoOpcode.COMPARE: IoCommand("compare"),
    IoOpcode.VERIFY: IoCommand("verify"),
    IoOpcode.RESERVATION_REGISTER: IoCommand("reservation_register"),
    IoOpcode.RESERVATION_REPORT: IoCommand("reservation_report"),
    IoOpcode.RESERVATION_ACQUIRE: IoCommand("reservation_acquire"),
    IoOpcode.RESERVATION_RELEASE: IoCommand("reservation_release"),
}


@final
class FastNamespace:
    """What IoHandler.submit's fast path needs of a namespace that may take it: its
    device's InPlace and the namespace's WriteGate, read natively (compiled) where the
    namespace's and its device's attributes were four generic lookups a command."""

    __slots__ = ("gate", "inplace", "ns")

    def __init__(self, ns: Namespace, inplace: InPlace) -> None:
        self.ns = ns
        self.inplace = inplace
        self.gate = ns.gate


def fast_namespace(ns: Namespace) -> FastNamespace | None:
    """The fast path's entry for `ns` as it is now, or None where its Reads, Writes and
    Copies must take the general path: a namespace with rate limits (which waits its
    turn there) or on a device that does no I/O in place. The one rule; the Subsystem
    applies it whenever one of these may have changed (Subsystem.refresh_io_paths)."""
    if ns.qos is not None:
        return None
    inplace: InPlace | None = getattr(ns.device, "inplace", None)
    return None if inplace is None else FastNamespace(ns, inplace)


class IoHandler:
    """Executes I/O commands for one queue of one controller."""

    def __init__(self, ctrl: Controller, queue: TargetQueue) -> None:
        self.ctrl = ctrl
        self.queue = queue
        self.namespaces = ctrl.namespaces
        # The namespaces of that view that may take the fast path now, by NSID (kept in
        # place by Subsystem.refresh_io_paths).
        self.fast = ctrl.io_paths
        self.stats = ctrl.subsystem.stats
        # This host's counts of completed commands in this subsystem (command_counts.py),
        # and their per-namespace lists, looked up by NSID on the hot path.
        self.counts = ctrl.target.command_counts.of(ctrl.subsystem.nqn, ctrl.hostnqn)
        self.ns_counts = self.counts.namespaces
        # Latency tracking: the fast path's timed Reads and Writes since the last flush,
        # counted in runs (timed_now) rather than one by one. The current run of each:
        # the namespace's counts (the hot path's test: `is`), its histogram, the clock
        # read its commands began and were dispatched at (-1: no run), their number; and
        # the runs before them (histogram, clock read, number).
        self._read_run: NamespaceCounts | None = None
        self._read_latency = _NO_RUN
        self._read_at = -1
        self._read_n = 0
        self._write_run: NamespaceCounts | None = None
        self._write_latency = _NO_RUN
        self._write_at = -1
        self._write_n = 0
        self._runs: list[tuple[Histogram, int, int]] = []
        # The target's counters: Copy's bytes by the planner's path.
        self.counters = ctrl.target.counters
        self.budget = queue.budget
        # Namespaces with registrants (the subsystem keeps it current): empty, no I/O
        # command pays more than testing it.
        self.registered = ctrl.subsystem.registered
        # Namespaces being quiesced (quiesce.py): empty, likewise.
        self.quiesced = ctrl.subsystem.quiesced
        # ANA: while every group is usable through every port, one attribute test.
        self.ana = ctrl.subsystem.ana
        # The most blocks one Copy range may hold, by block size shift: what Identify
        # reports (copy_limits), found once (a call costs more than the check itself).
        self._one_range_blocks: dict[int, int] = {}

    def submit(self, req: Request) -> None:
        """Run a command that arrived, at once where it can: the hot path.

        A Read from, or a Write with in-capsule data to, a namespace whose device does
        I/O in place (memory: its `inplace`, block/inplace.py) completes here with no
        coroutine (the read's data is copied out of the device's memory at once, the
        write's from the receive buffer straight into it). Anything else, or
        anything unusual about these (a range or length that is wrong, reservations, an
        ANA group not usable through some port, a fused operation holding the namespace),
        takes the general path, which decides the status."""
        sqe = req.sqe
        opcode = sqe.opcode
        if (
            opcode in (_READ, _WRITE, _COPY)
            and not self.registered
            and not self.quiesced
            and not self.ana.any_blocked
        ):
            # Absent: no such namespace, rate limits (the general path waits its turn),
            # or a device that does no I/O in place.
            fast = self.fast.get(sqe.nsid)
            if fast is not None:
                inplace = fast.inplace
                try:
                    if opcode == _READ:
                        if self._read_now(req, inplace):
                            return
                    elif opcode == _COPY:
                        if self._copy_now(req, fast.gate, inplace):
                            return
                    else:
                        data = req.data
                        if (
                            type(data) is _MEMORYVIEW
                            and not fast.gate.closed
                            and inplace.write_now(
                                sqe.cdw10 | sqe.cdw11 << 32, (sqe.cdw12 & 0xFFFF) + 1, data
                            )
                        ):
                            stats = self.stats
                            stats.write_cmds += 1
                            stats.write_bytes += req.length
                            counts = self.ns_counts.get(sqe.nsid)
                            if counts is None:
                                counts = self.counts.namespace(sqe.nsid)
                            counts.writes += 1
                            counts.write_bytes += req.length
                            if req.started == self._write_at and counts is self._write_run:
                                self._write_n += 1  # timed_now's common case, inline
                            elif req.started:
                                self.timed_now(req, counts, _WRITE)
                            self.queue.conn.complete(req, 0)
                            return
                except (ValueError, TypeError):
                    pass  # a closed device: the general path reports it
        data = req.data
        if type(data) is memoryview:
            # In-capsule data borrowed from the receive buffer (TargetConnection
            # borrow_capsule_data): a command that may wait keeps a copy of its own.
            req.data = bytearray(data)
        task = start_eager(self.execute(req))
        if task is not None:
            self.queue.track(task)

    def _read_now(self, req: Request, inplace: InPlace) -> bool:
        """A Read of at most READ_CHUNK done at once (its data a copy of the device's
        memory, or above UNCHARGED_READ a view lent where the transport takes one;
        charged to the connection's budget above UNCHARGED_READ as any read buffer is).
        False, having done nothing, for anything else: read() decides."""
        length = req.length
        charge = 0
        if length > _UNCHARGED_READ:
            if length > _READ_CHUNK or not self.budget.try_take(length):
                return False
            charge = length
        sqe = req.sqe
        lba = sqe.cdw10 | sqe.cdw11 << 32
        nblocks = (sqe.cdw12 & 0xFFFF) + 1
        data: memoryview | bytes | None = None
        if charge:
            # Large: a view lent to the transport, where it takes one, saves the memcpy
            # (block/inplace.py).
            loans = self.queue.conn.loans
            if loans is not None:
                data = inplace.lend_now(lba, nblocks, length, loans)
        if data is None:
            data = inplace.read_now(lba, nblocks, length)
        if data is None:
            if charge:
                self.budget.give(charge)
            return False
        req.charge = charge
        stats = self.stats
        stats.read_cmds += 1
        stats.read_bytes += length
        counts = self.ns_counts.get(sqe.nsid)
        if counts is None:
            counts = self.counts.namespace(sqe.nsid)
        counts.reads += 1
        counts.read_bytes += length
        if req.started == self._read_at and counts is self._read_run:
            self._read_n += 1  # timed_now's common case, inline
        elif req.started:
            self.timed_now(req, counts, _READ)
        self.queue.conn.complete(req, 0, 0, data)
        return True

    def _copy_now(self, req: Request, gate: WriteGate, inplace: InPlace) -> bool:
        """A Copy of one range (formats 0h/1h, its descriptor in the capsule) that the copy
        planner can do at once (`copy_one_range_now`: a memory namespace), with copy()'s
        checks for it and no coroutine. False, having done nothing, for anything else:
        copy() then decides and says why."""
        sqe = req.sqe
        cdw12 = sqe.cdw12
        desfmt = (cdw12 >> 8) & 0xF
        data = req.data
        if (
            cdw12 & 0xFF  # more than one range
            or desfmt > 1
            or type(data) is not memoryview
            or req.length != _ONE_DESCRIPTOR_SIZE[desfmt]
            or gate.closed
        ):
            return False
        slba, nlb = _SLBA_NLB.unpack_from(data)
        nlb += 1
        shift = inplace.shift
        most = self._one_range_blocks.get(shift)
        if most is None:
            limits = _copy_limits(1 << shift)  # the device's block size
            most = self._one_range_blocks[shift] = min(limits.max_range_blocks, limits.max_blocks)
        if nlb > most:
            return False
        # FUA needs nothing more: a memory namespace has no volatile cache to flush. The
        # planner's rule is called natively (imported, not looked up in block/copy.py):
        # the lookup and boxed call cost 730 instructions a Copy (docs/performance.md).
        if not copy_one_range_now(inplace, slba, sqe.cdw10 | sqe.cdw11 << 32, nlb):
            return False
        stats = self.stats
        stats.copy_cmds += 1
        stats.copy_bytes += nlb << shift
        counts = self.counts.namespace(sqe.nsid)
        counts.copies += 1
        counts.copy_bytes += nlb << shift
        if req.started:
            self.timed_now(req, counts, _COPY)
        self.queue.conn.complete(req, 0)
        return True

    async def execute(self, req: Request) -> None:
        sqe = req.sqe
        opcode = sqe.opcode
        try:
            if self.quiesced:
                # Before anything else: no status is decided by a size about to change.
                await wait_resumed(self.quiesced, opcode, sqe.nsid)
            handler = _HANDLERS.get(opcode)
            if handler is None:
                status, result, data = Status.INVALID_OPCODE | DNR, 0, None
            elif self.ana.any_blocked and (blocked := self.path_status(sqe.nsid)):
                # Refused before anything moves (no R2T, no data read or written).
                status, result, data = blocked, 0, None
            elif self.registered:
                status, result, data = await self._reserved(req, handler)
            else:
                status, result, data = await handler(self, req)
        except BlockRangeError:
            status, result, data = Status.LBA_OUT_OF_RANGE | DNR, 0, None
        except ConnectionError:
            return  # the queue went away while the command waited for data
        except StorageUnavailable as exc:
            # The storage is not reachable through this target (a fenced or cut-off
            # network backend), the data is not damaged: a path-related status, without
            # DNR, so that a multipath host retries the command on another path.
            about(log, self.queue).error(
                "storage unavailable on %s nsid %d: %s", self.ctrl.subsystem.nqn, sqe.nsid, exc
            )
            status, result, data = Status.INTERNAL_PATH_ERROR, 0, None
        except OSError as exc:
            about(log, self.queue).error(
                "I/O error on %s nsid %d: %s", self.ctrl.subsystem.nqn, sqe.nsid, exc
            )
            status = (
                Status.WRITE_FAULT if opcode != IoOpcode.READ else Status.UNRECOVERED_READ_ERROR
            )
            result, data = 0, None
        except Exception:
            about(log, self.queue).exception("I/O command %#x failed", opcode)
            status, result, data = Status.INTERNAL_ERROR, 0, None
        if status:
            self.ctrl.record_error(self.queue.qid, req, status)
        self.count(req, status)
        self.queue.conn.complete(req, status, result, data)

    def count(self, req: Request, status: int) -> None:
        """Count a command that completes with `status` (off the hot path's fast
        completions, which count themselves; Copy counts its bytes where it copies)."""
        sqe = req.sqe
        nsid = sqe.nsid
        if nsid not in self.namespaces and nsid != _NSID_ALL:
            nsid = NO_NAMESPACE
        slot = opcode_slot(sqe.opcode)
        counts = self.counts.namespace(nsid)
        counts.command(slot, status, req.length)
        if status:
            self.counts.error(nsid, slot, status)
        if req.started:
            # Off the fast path a command may have waited for anything (a device's
            # thread, a file): its completion is timed here, where it is handed over.
            now = req.completed = time.monotonic_ns()
            latency = req.latency = counts.latency_of(slot)
            device = now - (req.dispatched or req.started) - req.waited
            self.counts.device.observe(device)
            if not status:
                latency.device(device)

    def timed_now(self, req: Request, counts: NamespaceCounts, opcode: int) -> None:
        """The fast path completed timed `req`, a Read, Write or Copy counted in `counts`.
        One dispatched in the batch of input it began in joins the run of such commands
        (they are alike: one histogram, the same times; `sent` counts a run at once);
        another (its capsule spread over batches, or a fault rule held it) is timed
        alone, by the connection's list of timed completions."""
        latency = counts.latency_of(opcode)
        if req.dispatched:
            req.latency = latency
            return
        started = req.started
        if opcode == _READ:
            if self._read_run is not None:
                self._runs.append((self._read_latency, self._read_at, self._read_n))
            self._read_run, self._read_latency = counts, latency
            self._read_at, self._read_n = started, 1
        elif opcode == _WRITE:
            if self._write_run is not None:
                self._runs.append((self._write_latency, self._write_at, self._write_n))
            self._write_run, self._write_latency = counts, latency
            self._write_at, self._write_n = started, 1
        else:
            self._runs.append((latency, started, 1))

    def sent(self, reqs: list[Request], now: int) -> None:
        """The completions of this queue's timed commands were handed to the socket at
        `now` (monotonic ns, one clock read a flush): the fast path's runs since the
        last flush (timed_now), and `reqs` (`req.latency` set where they were counted):
        their latency from capsule-in, and its stages (docs/metrics.md). A command the
        fast path completed has no clock read of its own: its completion was handed
        over no later than this flush, the first clock read after it, so its time from
        dispatch to here is its device stage (the device and the target's own work on
        the batch) and its send stage is 0."""
        if self._read_run is not None:
            self._sent_alike(self._read_latency, self._read_at, self._read_at, self._read_n, now)
            self._read_run, self._read_latency, self._read_at = None, _NO_RUN, -1
        if self._write_run is not None:
            at = self._write_at
            self._sent_alike(self._write_latency, at, at, self._write_n, now)
            self._write_run, self._write_latency, self._write_at = None, _NO_RUN, -1
        if self._runs:
            for histogram, at, n in self._runs:
                self._sent_alike(histogram, at, at, n, now)
            self._runs.clear()
        counts = self.counts
        run: Histogram | None = None  # alike fast-path commands timed alone, n of them
        started = dispatched = n = 0
        for req in reqs:
            latency = req.latency
            if latency is None:
                continue
            if req.completed:  # off the fast path: count() counted its device stage
                latency.observe(now - req.started)
                counts.receive.observe((req.dispatched or req.started) - req.started)
                counts.send.observe(now - req.completed)
            elif latency is run and req.started == started and req.dispatched == dispatched:
                n += 1
            else:
                if run is not None:
                    self._sent_alike(run, started, dispatched, n, now)
                run, started, dispatched, n = latency, req.started, req.dispatched, 1
        if run is not None:
            self._sent_alike(run, started, dispatched, n, now)

    def _sent_alike(
        self, latency: Histogram, started: int, dispatched: int, n: int, now: int
    ) -> None:
        """`n` fast-path commands of `latency`'s opcode and namespace, which began at
        `started` and were dispatched at `dispatched`, were sent at `now`."""
        counts = self.counts
        latency.observe(now - started, n)
        if dispatched == started:  # dispatched in the batch it arrived in: 0 ns
            counts.receive.b0 += n
        else:
            counts.receive.observe(dispatched - started, n)
        ns = now - dispatched
        counts.device.observe(ns, n)
        latency.device(ns, n)  # the fast path completes successful commands only
        counts.send.b0 += n  # 0 ns: b0 (observe's first bucket), and the sum unchanged

    def waited(self, req: Request, stage: str, since: int) -> None:
        """A timed command waited from `since` until now in `stage` ("data" or "budget",
        command_counts.STAGES)."""
        ns = time.monotonic_ns() - since
        req.waited += ns
        histogram: Histogram = getattr(self.counts, stage)
        histogram.observe(ns)

    async def take_budget(self, req: Request, n: int) -> None:
        """Wait until the connection's budget has `n` bytes for `req` (and take them)."""
        since = time.monotonic_ns() if req.started else 0
        await self.budget.take(n)
        if since:
            self.waited(req, "budget", since)

    async def qos_wait(self, req: Request, gate: QosGate, is_read: bool, length: int) -> None:
        """Wait until the namespace's rate limits admit `req` (qos_gate.py): counted in
        the `budget` stage, as a wait for what the target rations."""
        since = time.monotonic_ns() if req.started else 0
        await gate.wait(is_read, length)
        if since:
            self.waited(req, "budget", since)

    def path_status(self, nsid: int) -> int:
        """The ANA path-related status a command to `nsid` gets through this queue's
        port, or 0 (served; also for NSIDs naming no one namespace, which get the
        status they would anyway)."""
        ns = self.namespaces.get(nsid)
        if ns is None:
            return 0
        return self.ana.path_status(self.queue.port, ns.anagrpid)

    async def _reserved(
        self, req: Request, handler: Callable[[IoHandler, Request], Awaitable[Outcome]]
    ) -> Outcome:
        """A command while some namespace has registrants: its reservation decides."""
        reservation = self.registered.get(req.sqe.nsid)
        if reservation is None:
            return await handler(self, req)
        return await reservation.guard(self, req, handler)

    def rw_target(self, req: Request) -> tuple[int, Namespace | None, int, int, int]:
        """(status, namespace, slba, nblocks, byte length) of a Read or Write."""
        sqe = req.sqe
        ns = self.namespaces.get(sqe.nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, None, 0, 0, 0
        slba = sqe.cdw10 | sqe.cdw11 << 32
        nlb = (sqe.cdw12 & 0xFFFF) + 1
        length = nlb * ns.block_size
        if slba + nlb > ns.num_blocks:
            return Status.LBA_OUT_OF_RANGE | DNR, ns, slba, nlb, length
        if length > MAX_TRANSFER:
            return Status.INVALID_FIELD | DNR, ns, slba, nlb, length
        if req.length != length:
            return Status.SGL_INVALID_DATA | DNR, ns, slba, nlb, length
        return Status.SUCCESS, ns, slba, nlb, length

    async def read(self, req: Request) -> Outcome:
        status, ns, slba, _nlb, length = self.rw_target(req)
        if status or ns is None:
            return status, 0, None
        qos = ns.qos
        if qos is not None and not qos.try_admit(True, length):
            await self.qos_wait(req, qos, True, length)
        if length > READ_CHUNK:
            return await self._read_in_pieces(req, ns, slba, length)
        if length > UNCHARGED_READ:
            budget = self.budget
            if not budget.try_take(length):
                await self.take_budget(req, length)
            req.charge = length
        data = bytearray(length)
        await ns.device.read(slba, memoryview(data))
        stats = self.stats
        stats.read_cmds += 1
        stats.read_bytes += length
        return Status.SUCCESS, 0, data

    async def _read_in_pieces(self, req: Request, ns: Namespace, slba: int, length: int) -> Outcome:
        """A Read larger than READ_CHUNK from a device that needs a buffer: read and sent
        a piece at a time, each piece charged to the budget only until the socket has
        taken it, so that one command never holds MDTS of memory. The last piece goes
        with the completion."""
        budget = self.budget
        conn = self.queue.conn
        device = ns.device
        shift = ns.block_size.bit_length() - 1
        lba, offset = slba, 0
        while True:
            n = min(READ_CHUNK, length - offset)
            if not budget.try_take(n):
                await self.take_budget(req, n)
            req.charge += n
            buf = bytearray(n)
            await device.read(lba, memoryview(buf))
            offset += n
            if offset == length:
                stats = self.stats
                stats.read_cmds += 1
                stats.read_bytes += length
                return Status.SUCCESS, 0, buf
            if conn.closing:
                raise ConnectionError("the connection closed during a read")
            conn.send_data(req, buf)
            lba += n >> shift

    async def write(self, req: Request) -> Outcome:
        status, ns, slba, _nlb, length = self.rw_target(req)
        if status or ns is None:
            return status, 0, None
        # Before the data is asked for: a waiting Write holds no buffer for it.
        qos = ns.qos
        if qos is not None and not qos.try_admit(False, length):
            await self.qos_wait(req, qos, False, length)
        data = req.data if req.data is not None else await self.queue.fetch_data(req)
        fua = bool(req.sqe.cdw12 & RW_FUA) or not self.ctrl.volatile_write_cache
        # Writes stay out of a fused Compare and Write on the namespace (fused.WriteGate);
        # inline here, as it costs one attribute test and a counter while none runs.
        gate = ns.gate
        if gate.closed:
            await gate.wait_open()
        else:
            gate.writers += 1
        try:
            await ns.device.write(slba, data, fua=fua)
        finally:
            gate.writers -= 1
            if gate.closed:
                gate.left()
        stats = self.stats
        stats.write_cmds += 1
        stats.write_bytes += length
        return Status.SUCCESS, 0, None

    async def flush(self, req: Request) -> Outcome:
        nsid = req.sqe.nsid
        if nsid == NSID_ALL:
            # A copy: the target may remove a namespace while this waits for a flush.
            for each in list(self.namespaces.values()):
                await each.device.flush()
            return Status.SUCCESS, 0, None
        ns = self.namespaces.get(nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, 0, None
        await ns.device.flush()
        return Status.SUCCESS, 0, None

    async def write_zeroes(self, req: Request) -> Outcome:
        sqe = req.sqe
        ns = self.namespaces.get(sqe.nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, 0, None
        slba = sqe.cdw10 | sqe.cdw11 << 32
        nlb = (sqe.cdw12 & 0xFFFF) + 1
        if slba + nlb > ns.num_blocks:
            return Status.LBA_OUT_OF_RANGE | DNR, 0, None
        device = ns.device
        fua = bool(sqe.cdw12 & RW_FUA) or not self.ctrl.volatile_write_cache
        await ns.gate.enter()
        try:
            if sqe.cdw12 & WZ_DEAC and device.capabilities.deallocated_reads_zero and not fua:
                await device.deallocate(slba, nlb)
            else:
                await device.write_zeroes(slba, nlb, fua=fua)
        finally:
            ns.gate.leave()
        return Status.SUCCESS, 0, None

    async def dataset_management(self, req: Request) -> Outcome:
        sqe = req.sqe
        ns = self.namespaces.get(sqe.nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, 0, None
        nr = (sqe.cdw10 & 0xFF) + 1
        # The range list may sit in a larger buffer (the Linux host sends a whole page):
        # only a buffer too short for NR ranges is refused, as nvmet does.
        if not nr * DSM_RANGE.size <= req.length <= MAX_TRANSFER:
            return Status.SGL_INVALID_DATA | DNR, 0, None
        data = req.data if req.data is not None else await self.queue.fetch_data(req)
        ranges = [DSM_RANGE.unpack_from(data, i * DSM_RANGE.size) for i in range(nr)]
        for _attr, nlb, slba in ranges:
            if slba + nlb > ns.num_blocks:
                return Status.LBA_OUT_OF_RANGE | DNR, 0, None
        if sqe.cdw11 & DSM_ATTR_DEALLOCATE and ns.device.capabilities.deallocate:
            await ns.gate.enter()
            try:
                for _attr, nlb, slba in ranges:
                    if nlb:
                        await ns.device.deallocate(slba, nlb)
            finally:
                ns.gate.leave()
        return Status.SUCCESS, 0, None

    async def copy(self, req: Request) -> Outcome:
        """Copy (TP 4065 formats 0/1, TP 4130 formats 2/3 with a source NSID per range,
        accepted once the host enabled them in Host Behavior Support).

        The limits checked here are the ones Identify Namespace reports; the data
        path (native copy inside a device, or emulation across devices) is the copy
        planner's decision. The memory a plan needs (staged sources, emulation
        buffers) is taken from the connection's data budget before it runs.
        """
        sqe = req.sqe
        ns = self.namespaces.get(sqe.nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, 0, None
        cdw12 = sqe.cdw12
        nr = (cdw12 & 0xFF) + 1
        desfmt = (cdw12 >> 8) & 0xF
        if desfmt not in COPY_FORMATS:
            return Status.INVALID_FIELD | DNR, 0, None
        fmt_bit = 1 << desfmt
        if fmt_bit & COPY_CDFE_FORMATS and not fmt_bit & self.ctrl.copy_formats_enabled:
            # TP 4130: a format with source NSIDs only once the host enabled it (CDFE),
            # checked before the descriptors are fetched.
            return Status.INVALID_FIELD | DNR, 0, None
        device = ns.device
        caps = device.capabilities  # once: Namespace.block_size and num_blocks ask it each
        block_size = caps.block_size
        limits = _copy_limits(block_size)
        if nr > limits.max_ranges:
            return CMD_SIZE_LIMIT_EXCEEDED | DNR, 0, None
        if req.length != nr * COPY_DESCRIPTOR_SIZE[desfmt]:
            return Status.SGL_INVALID_DATA | DNR, 0, None
        data = req.data if req.data is not None else await self.queue.fetch_data(req)
        sdlba = sqe.cdw10 | sqe.cdw11 << 32
        fua = bool(cdw12 & RW_FUA) or not self.ctrl.volatile_write_cache
        if nr == 1 and desfmt < 2:
            # One range within the namespace (formats 0/1 name no source namespace): the
            # common small Copy, checked from its one descriptor without range objects.
            slba, nlb = COPY_DESCRIPTOR[desfmt].unpack_from(data)[1:3]
            nlb += 1
            if nlb > limits.max_range_blocks or nlb > limits.max_blocks:
                return CMD_SIZE_LIMIT_EXCEEDED | DNR, 0, None
            num_blocks = caps.num_blocks
            if slba + nlb > num_blocks or sdlba + nlb > num_blocks:
                return Status.LBA_OUT_OF_RANGE | DNR, 0, None
            gate = ns.gate
            if gate.closed:
                await gate.wait_open()
            else:
                gate.writers += 1
            try:
                report = await block_copy.copy_one_range(device, slba, sdlba, nlb, fua=fua)
            finally:
                gate.writers -= 1
                if gate.closed:
                    gate.left()
            if report is not None:
                self.counters.copied(report, block_size)
                stats = self.stats
                stats.copy_cmds += 1
                stats.copy_bytes += nlb * block_size
                self.counts.namespace(ns.nsid).copy_bytes += nlb * block_size
                return Status.SUCCESS, 0, None
            # The planner wants a plan for it (staging, emulation): the general path.
        ranges = parse_copy_ranges(data, desfmt, nr)
        total = sum(r.nlb for r in ranges)
        if any(r.nlb > limits.max_range_blocks for r in ranges) or total > limits.max_blocks:
            return CMD_SIZE_LIMIT_EXCEEDED | DNR, 0, None
        sources = []
        srcs = []
        for r in ranges:
            status, src = self._copy_source(ns, r, desfmt)
            if src is None:
                return status, 0, None
            srcs.append(src)
            sources.append(block_copy.SourceRange(src.device, r.slba, r.nlb))
        if sdlba + total > ns.num_blocks:
            return Status.LBA_OUT_OF_RANGE | DNR, 0, None
        if desfmt in (2, 3) and any(
            src.device is ns.device and s.lba < sdlba + total and sdlba < s.lba + s.nblocks
            for src, s in zip(srcs, sources, strict=True)
        ):
            # NVM Command Set 1.2: with formats 2h/3h a source range in the destination
            # namespace must not overlap the destination (formats 0h/1h leave the result
            # to the controller, and get the planner's read-all-sources-first result).
            return OVERLAPPING_IO_RANGE | DNR, 0, None
        budget = self.budget
        try:
            # The plan fits what this connection may ever hold, and the target in all:
            # it shrinks its emulation to fit, and is refused only for staging.
            plan = await block_copy.plan_copy(
                sources,
                ns.device,
                sdlba,
                memory_limit=min(budget.capacity, budget.pool.capacity),
            )
        except block_copy.CopyTooLarge:
            # Overlapping ranges that would have to be staged in more memory than the
            # connection's budget: a size limit of this target (docs/limits.md).
            return CMD_SIZE_LIMIT_EXCEEDED | DNR, 0, None
        need = plan.memory
        if need and not budget.try_take(need):
            await self.take_budget(req, need)
        try:
            await ns.gate.enter()
            try:
                ran = await plan.run(fua=fua)
            finally:
                ns.gate.leave()
        finally:
            if need:
                budget.give(need)
        self.counters.copied(ran, ns.block_size)
        self.stats.copy_cmds += 1
        self.stats.copy_bytes += total * ns.block_size
        self.counts.namespace(ns.nsid).copy_bytes += total * ns.block_size
        return Status.SUCCESS, 0, None

    async def compare(self, req: Request) -> Outcome:
        return await compare.compare(self, req)

    async def verify(self, req: Request) -> Outcome:
        return await compare.verify(self, req)

    def _copy_source(
        self, ns: Namespace, r: CopyRange, desfmt: int
    ) -> tuple[int, Namespace | None]:
        """(status, source namespace) of one range of a Copy to `ns`; None if refused."""
        # Formats 0 and 1 have no source NSID: the source is the command's namespace.
        if desfmt in (0, 1):
            src = ns
        elif not 0 < r.snsid <= reported_nn(self.ctrl.subsystem):
            # 0, FFFFFFFFh and NSIDs beyond NN name no namespace: Invalid Namespace or
            # Format; a valid NSID with no namespace behind it is Invalid Field.
            return Status.INVALID_NS | DNR, None
        else:
            named = self.namespaces.get(r.snsid)
            if named is None:
                return Status.INVALID_FIELD | DNR, None
            src = named
        if src is not ns and self.registered:
            # Another namespace is read: its reservation may refuse reads to this host.
            held = self.registered.get(src.nsid)
            if held is not None and held.refuses(self.ctrl.hostid, IoOpcode.READ):
                return reservations.CONFLICT, None
        if src.block_size != ns.block_size:
            return INCOMPATIBLE_NS_OR_FORMAT | DNR, None
        if r.slba + r.nlb > src.num_blocks:
            return Status.LBA_OUT_OF_RANGE | DNR, None
        return Status.SUCCESS, src

    # -- reservations (pynvmf.target.reservations) ------------------------------------------

    async def reservation_register(self, req: Request) -> Outcome:
        return await reservations.register_command(self, req)

    async def reservation_report(self, req: Request) -> Outcome:
        return await reservations.report_command(self, req, MAX_TRANSFER)

    async def reservation_acquire(self, req: Request) -> Outcome:
        return await reservations.acquire_command(self, req)

    async def reservation_release(self, req: Request) -> Outcome:
        return await reservations.release_command(self, req)


CommandHandler = Callable[[IoHandler, "Request"], Awaitable[Outcome]]

# The handlers as plain functions: a per-queue table of bound methods would be a
# reference cycle that keeps every closed queue alive until a full collection.
_HANDLERS: dict[int, CommandHandler] = {
    opcode: getattr(IoHandler, command.method) for opcode, command in IO_COMMANDS.items()
}


def set_handler(opcode: int, handler: CommandHandler) -> None:
    """Execute `opcode` with `handler` from now on, in this process (a worker of
    `--cores N` sends the reservation commands to the main process). Only an opcode of
    IO_COMMANDS: what the Commands Supported and Effects log lists is what is executed."""
    if opcode not in IO_COMMANDS:
        raise ValueError(f"opcode {opcode:#x} is not an I/O command of the NVM command set")
    _HANDLERS[opcode] = handler
