"""The copy engine (the analog of Linux's dm-kcopyd): a large copy between two
devices as a job of chunks, several in flight, with progress, cancellation and a
final status.

Each chunk is one call of the copy planner (`block.copy.copy` with a single source
range), so every chunk offloads, copies natively or is emulated exactly as the
planner decides for that pair of devices; the engine only cuts, schedules, counts
and stops. A chunk is never interrupted: cancelling, or a failed chunk, stops new
chunks from being issued and lets those in flight finish, so a chunk's blocks are
either all copied or untouched by the job.

A copy within one device whose ranges overlap keeps memmove semantics: chunks are
issued in the direction that never reads blocks an earlier chunk wrote (from the end
when the destination is after the source), and a chunk waits for any chunk in
flight that still has to read the blocks it is about to write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pynvmf.block.copy import STAGING_LIMIT, CopyReport, SourceRange, copy
from pynvmf.block.device import BlockDevice, check_range

DEFAULT_CHUNK_BYTES = 8 << 20
DEFAULT_DEPTH = 4
# An overlapping copy on a device without native memmove is cut into chunks no longer
# than the distance between its ranges, if that leaves chunks of at least this size.
MIN_OVERLAP_CHUNK_BYTES = 1 << 20
PROGRESS_INTERVAL = 0.1  # seconds: on_progress runs at most 10 times a second

ProgressCallback = Callable[["CopyJob"], None]


class JobState(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CopyStatus:
    """How a job ended. `error` is the exception that failed it (state FAILED).
    `prefix_blocks`: the blocks from the start of the range copied without a gap (what
    a destination holds for sure when a job ended early: chunks finish out of order)."""

    state: JobState
    done_blocks: int
    total_blocks: int
    block_size: int
    seconds: float
    report: CopyReport
    error: BaseException | None = None
    prefix_blocks: int = 0

    @property
    def done_bytes(self) -> int:
        return self.done_blocks * self.block_size

    @property
    def bytes_per_second(self) -> float:
        return self.done_bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Chunk:
    src_lba: int
    dst_lba: int
    nblocks: int


def add_report(total: CopyReport, part: CopyReport) -> None:
    """Add `part`'s counters to `total`, field by field (so counters the planner gains
    later are summed too)."""
    for f in dataclasses.fields(total):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


class CopyJob:
    """One copy submitted to a Copier; it runs as a task of the loop it was submitted on.

    `done_blocks` counts the blocks of completed chunks; with several chunks in flight
    they need not be a prefix of the range.
    """

    def __init__(
        self,
        src: BlockDevice,
        src_lba: int,
        dst: BlockDevice,
        dst_lba: int,
        nblocks: int,
        *,
        chunk_blocks: int,
        depth: int,
        fua: bool,
        on_progress: ProgressCallback | None,
        progress_interval: float,
        clock: Callable[[], float],
    ) -> None:
        self.src = src
        self.src_lba = src_lba
        self.dst = dst
        self.dst_lba = dst_lba
        self.total_blocks = nblocks
        self.block_size = src.capabilities.block_size
        self.chunk_blocks = chunk_blocks
        self.depth = depth
        self.fua = fua
        self.report = CopyReport()
        self._on_progress = on_progress
        self._progress_interval = progress_interval
        self._clock = clock
        self._done_blocks = 0
        # Chunks finished past the first gap, by offset in the range, and the blocks
        # before that gap.
        self._finished_after_gap: dict[int, int] = {}
        self._prefix_blocks = 0
        self._in_flight = 0
        self._cancel_requested = False
        self._error: BaseException | None = None
        self._state = JobState.RUNNING
        self._status: CopyStatus | None = None
        self._started = clock()
        self._finished: float | None = None
        self._last_progress: float | None = None
        self._overlapping = (
            src is dst and src_lba < dst_lba + nblocks and dst_lba < src_lba + nblocks
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name=repr(self))

    def __repr__(self) -> str:
        return (
            f"CopyJob({self.src!r}@{self.src_lba} -> {self.dst!r}@{self.dst_lba}, "
            f"{self.total_blocks} blocks)"
        )

    # -- progress ----------------------------------------------------------------------------

    @property
    def done_blocks(self) -> int:
        return self._done_blocks

    @property
    def done_bytes(self) -> int:
        return self._done_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.total_blocks * self.block_size

    @property
    def in_flight(self) -> int:
        """Chunks issued and not yet finished."""
        return self._in_flight

    @property
    def elapsed(self) -> float:
        """Seconds since the job started, until it ended."""
        end = self._finished if self._finished is not None else self._clock()
        return max(0.0, end - self._started)

    @property
    def bytes_per_second(self) -> float:
        """Average throughput since the start."""
        elapsed = self.elapsed
        return self.done_bytes / elapsed if elapsed > 0 else 0.0

    @property
    def state(self) -> JobState:
        return self._state

    @property
    def status(self) -> CopyStatus | None:
        """The final status once the job has ended, else None."""
        return self._status

    def done(self) -> bool:
        return self._status is not None

    # -- control -----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Issue no new chunk; the job ends (CANCELLED) once the chunks in flight finish.
        Safe to call from a signal handler added with loop.add_signal_handler, and
        after the job has ended (nothing happens then)."""
        self._cancel_requested = True

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    async def wait(self) -> CopyStatus:
        """The final status; a chunk's exception is in it, not raised. Cancelling the
        waiter does not cancel the job."""
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            # The job's own task was cancelled (e.g. the loop is shutting down): it
            # recorded a status on the way out. Otherwise the waiter was cancelled.
            if self._task.cancelled() and self._status is not None:
                return self._status
            raise

    # -- the job -----------------------------------------------------------------------------

    def _chunks(self) -> Iterator[_Chunk]:
        step = self.chunk_blocks
        offsets = range(0, self.total_blocks, step)
        if self._overlapping and self.dst_lba > self.src_lba:
            # memmove order: moving up, the last chunk goes first, so no chunk reads
            # blocks that an earlier one has already overwritten.
            offsets = offsets[::-1]
        for off in offsets:
            n = min(step, self.total_blocks - off)
            yield _Chunk(self.src_lba + off, self.dst_lba + off, n)

    def _must_wait_for(
        self, chunk: _Chunk, pending: dict[asyncio.Task[CopyReport], _Chunk]
    ) -> bool:
        """A chunk in flight still reads blocks this chunk would write. (The converse,
        reading what a chunk in flight writes, cannot happen in memmove order.)"""
        if not self._overlapping:
            return False
        return any(
            p.src_lba < chunk.dst_lba + chunk.nblocks and chunk.dst_lba < p.src_lba + p.nblocks
            for p in pending.values()
        )

    async def _copy_chunk(self, chunk: _Chunk) -> CopyReport:
        # FUA is left to one flush at the end: cheaper than one per chunk, and a
        # job's durability only matters once it has finished.
        return await copy(
            [SourceRange(self.src, chunk.src_lba, chunk.nblocks)], self.dst, chunk.dst_lba
        )

    async def _run(self) -> CopyStatus:
        pending: dict[asyncio.Task[CopyReport], _Chunk] = {}
        try:
            for chunk in self._chunks():
                while pending and (
                    len(pending) >= self.depth or self._must_wait_for(chunk, pending)
                ):
                    await self._reap(pending)
                if self._cancel_requested or self._error is not None:
                    break
                task = asyncio.get_running_loop().create_task(self._copy_chunk(chunk))
                pending[task] = chunk
                self._in_flight = len(pending)
            while pending:
                await self._reap(pending)
            if self.fua and self._done_blocks and self._error is None:
                await self.dst.flush()
        except asyncio.CancelledError:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._in_flight = 0
            self._finish(JobState.CANCELLED)
            raise
        except Exception as exc:  # flush, or the progress callback
            if self._error is None:
                self._error = exc
            # Chunks still in flight use the devices: let them finish first.
            await asyncio.gather(*pending, return_exceptions=True)
            self._in_flight = 0
        if self._on_progress is not None:
            # The last call, unthrottled, so a progress display ends on the final numbers.
            try:
                self._on_progress(self)
            except Exception as exc:
                if self._error is None:
                    self._error = exc
        if self._error is not None:
            state = JobState.FAILED
        elif self._done_blocks < self.total_blocks:
            state = JobState.CANCELLED
        else:
            state = JobState.COMPLETED
        return self._finish(state)

    async def _reap(self, pending: dict[asyncio.Task[CopyReport], _Chunk]) -> None:
        """Wait for at least one chunk in flight to finish and account for it."""
        finished, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            chunk = pending.pop(task)
            exc = task.exception()
            if exc is not None:
                if self._error is None:
                    self._error = exc
                continue
            self._done_blocks += chunk.nblocks
            self._finished_chunk(chunk.src_lba - self.src_lba, chunk.nblocks)
            add_report(self.report, task.result())
        self._in_flight = len(pending)
        self._progress()

    def _finished_chunk(self, offset: int, nblocks: int) -> None:
        after = self._finished_after_gap
        after[offset] = nblocks
        while self._prefix_blocks in after:
            self._prefix_blocks += after.pop(self._prefix_blocks)

    def _progress(self) -> None:
        if self._on_progress is None or self._done_blocks >= self.total_blocks:
            return  # the final call comes from _run, once the job has its status
        now = self._clock()
        last = self._last_progress
        if last is not None and now - last < self._progress_interval:
            return
        self._last_progress = now
        self._on_progress(self)

    def _finish(self, state: JobState) -> CopyStatus:
        self._finished = self._clock()
        self._state = state
        self._status = CopyStatus(
            state=state,
            done_blocks=self._done_blocks,
            total_blocks=self.total_blocks,
            block_size=self.block_size,
            seconds=self.elapsed,
            report=dataclasses.replace(self.report),
            error=self._error if state is JobState.FAILED else None,
            prefix_blocks=self._prefix_blocks,
        )
        return self._status


class Copier:
    """Runs copy jobs; the defaults given here apply to every submit that does not
    override them. `clock` (monotonic seconds) is there for tests."""

    def __init__(
        self,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        depth: int = DEFAULT_DEPTH,
        progress_interval: float = PROGRESS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk size {chunk_bytes} is not positive")
        if depth < 1:
            raise ValueError(f"depth {depth} is less than 1")
        self.chunk_bytes = chunk_bytes
        self.depth = depth
        self.progress_interval = progress_interval
        self._clock = clock
        self._jobs: set[CopyJob] = set()

    @property
    def jobs(self) -> frozenset[CopyJob]:
        """The jobs still running."""
        return frozenset(j for j in self._jobs if not j.done())

    def submit(
        self,
        src: BlockDevice,
        src_lba: int,
        dst: BlockDevice,
        dst_lba: int,
        nblocks: int,
        *,
        chunk_blocks: int | None = None,
        depth: int | None = None,
        fua: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> CopyJob:
        """Start copying `nblocks` from src at src_lba to dst at dst_lba; needs a running
        loop. Raises (before anything is copied) BlockRangeError for a range outside its
        device and ValueError for differing block sizes or a bad chunk size or depth.
        `chunk_blocks` defaults to the copier's chunk_bytes in blocks."""
        bs = src.capabilities.block_size
        if dst.capabilities.block_size != bs:
            raise ValueError(
                f"block sizes differ: source {bs}, destination {dst.capabilities.block_size}"
            )
        check_range(src.capabilities, src_lba, nblocks)
        check_range(dst.capabilities, dst_lba, nblocks)
        if chunk_blocks is None:
            chunk_blocks = max(1, self.chunk_bytes // bs)
        if chunk_blocks < 1:
            raise ValueError(f"chunk of {chunk_blocks} blocks")
        depth = self.depth if depth is None else depth
        if depth < 1:
            raise ValueError(f"depth {depth} is less than 1")
        overlapping = src is dst and src_lba < dst_lba + nblocks and dst_lba < src_lba + nblocks
        if overlapping and not src.capabilities.native_copy:
            # The planner stages a chunk that overlaps itself (only a native copy has
            # memmove semantics): its data crosses through memory instead of being
            # offloaded. Chunks no longer than the distance between the ranges never
            # overlap themselves; that is worth it unless the distance is small.
            shift = abs(dst_lba - src_lba)
            if shift * bs >= MIN_OVERLAP_CHUNK_BYTES:
                chunk_blocks = min(chunk_blocks, shift)
            # Staged or not, a chunk must fit the staging limit.
            chunk_blocks = min(chunk_blocks, max(1, STAGING_LIMIT // bs))
        job = CopyJob(
            src,
            src_lba,
            dst,
            dst_lba,
            nblocks,
            chunk_blocks=chunk_blocks,
            depth=depth,
            fua=fua,
            on_progress=on_progress,
            progress_interval=self.progress_interval,
            clock=self._clock,
        )
        self._jobs.add(job)
        job._task.add_done_callback(lambda _t: self._jobs.discard(job))
        return job

    async def close(self) -> None:
        """Cancel every running job and wait for them to end."""
        jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        for job in jobs:
            await job.wait()
