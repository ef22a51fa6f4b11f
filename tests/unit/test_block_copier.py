"""The copy engine: chunking, depth, progress, cancellation, failure, and the data.

Concurrency is made deterministic with wrapper devices whose reads wait on futures
the test resolves, never with sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable

import pytest

from pynvmf.block.copier import Copier, CopyJob, JobState
from pynvmf.block.copy import CopyReport
from pynvmf.block.device import BlockRangeError, Buffer, Capabilities
from pynvmf.block.linear import LinearDevice, Segment
from pynvmf.block.memory import MemoryDevice

BS = 512


class Wrapped:
    """A BlockDevice over a MemoryDevice without a native copy, so the planner moves
    every chunk with one read and one write (chunks here stay under its 1 MiB step).
    Records the reads and flushes; `hold` makes reads wait until released."""

    def __init__(self, nblocks: int, *, hold: bool = False) -> None:
        self.mem = MemoryDevice(nblocks * BS, BS)
        self._caps = dataclasses.replace(self.mem.capabilities, native_copy=False)
        self.hold = hold
        self.reads: list[tuple[int, int]] = []
        self.waiting: list[asyncio.Future[None]] = []
        self.active = 0
        self.max_active = 0
        self.flushes = 0
        self.fail_at: int | None = None
        self.error = OSError(5, "injected read error")
        self.changed = asyncio.Condition()

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def read(self, lba: int, buf: memoryview) -> None:
        self.reads.append((lba, memoryview(buf).nbytes // BS))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.hold:
                fut = asyncio.get_running_loop().create_future()
                self.waiting.append(fut)
                async with self.changed:
                    self.changed.notify_all()
                await fut
            if self.fail_at is not None and lba <= self.fail_at < lba + len(buf) // BS:
                raise self.error
            await self.mem.read(lba, buf)
        finally:
            self.active -= 1

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self.mem.write(lba, data, fua=fua)

    async def flush(self) -> None:
        self.flushes += 1

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self.mem.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self.mem.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self.mem.close()

    async def until_waiting(self, n: int) -> None:
        """Until `n` reads are held."""
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.waiting) == n)

    async def until_any_waiting(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: bool(self.waiting))

    def release_newest(self) -> None:
        self.waiting.pop().set_result(None)

    def release(self, n: int | None = None) -> None:
        """Let the oldest `n` held reads (all if None) go on; later reads still wait."""
        ready = self.waiting if n is None else self.waiting[:n]
        for fut in ready:
            fut.set_result(None)
        self.waiting = [] if n is None else self.waiting[n:]


def data(nblocks: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(nblocks * BS)


async def raw(device: MemoryDevice, lba: int = 0, nblocks: int | None = None) -> bytes:
    n = device.capabilities.num_blocks - lba if nblocks is None else nblocks
    buf = bytearray(n * BS)
    await MemoryDevice.read(device, lba, memoryview(buf))
    return bytes(buf)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- chunks and depth -------------------------------------------------------------------------


@pytest.mark.parametrize(("nblocks", "chunk"), [(100, 16), (96, 16), (5, 16), (1, 1)])
async def test_chunks_cover_the_range_once(nblocks: int, chunk: int) -> None:
    src, dst = Wrapped(128), MemoryDevice(256 * BS)
    await src.mem.write(0, data(128, seed=1))
    job = Copier().submit(src, 20, dst, 100, min(nblocks, 108), chunk_blocks=chunk, depth=3)
    n = min(nblocks, 108)
    status = await job.wait()
    assert status.state is JobState.COMPLETED
    expected = [(20 + off, min(chunk, n - off)) for off in range(0, n, chunk)]
    assert sorted(src.reads) == expected
    assert await raw(dst, 100, n) == data(128, seed=1)[20 * BS : (20 + n) * BS]
    assert await raw(dst, 0, 100) == bytes(100 * BS)  # nothing outside the range


async def test_default_chunk_size_comes_from_the_copier() -> None:
    src, dst = Wrapped(64), MemoryDevice(64 * BS)
    job = Copier(chunk_bytes=8 * BS).submit(src, 0, dst, 0, 20)
    assert job.chunk_blocks == 8
    await job.wait()
    assert sorted(src.reads) == [(0, 8), (8, 8), (16, 4)]


@pytest.mark.parametrize("depth", [1, 3, 5])
async def test_never_more_than_depth_chunks_in_flight(depth: int) -> None:
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    await src.mem.write(0, data(64, seed=2))
    chunks = 12
    reaped = asyncio.Event()  # set each time the engine has accounted for finished chunks
    job = Copier(progress_interval=0).submit(
        src, 0, dst, 0, 48, chunk_blocks=4, depth=depth, on_progress=lambda _j: reaped.set()
    )
    await src.until_waiting(depth)
    assert job.in_flight == depth
    for released in range(1, chunks + 1):
        reaped.clear()
        src.release(1)
        await reaped.wait()
        # One chunk ended: the engine refilled up to `depth` at once, never beyond.
        expected = min(depth, chunks - released)
        assert job.in_flight == expected
        await src.until_waiting(expected)
    status = await job.wait()
    assert status.state is JobState.COMPLETED
    assert src.max_active == depth
    assert await raw(dst, 0, 48) == data(64, seed=2)[: 48 * BS]


async def test_chunks_offload_through_the_planner() -> None:
    """Each chunk is one planner call: on a LinearDevice copying within itself, one
    offloaded request per chunk, which pass through to the memory's own copy."""
    mem = MemoryDevice(256 * BS)
    dev = LinearDevice([Segment(mem, 128, 64), Segment(mem, 0, 64)])
    await dev.write(0, data(128, seed=3))
    status = await Copier().submit(dev, 0, dev, 64, 64, chunk_blocks=16).wait()
    assert status.report.offloaded_blocks == 64 and status.report.commands == 4
    assert status.report.emulated_blocks == 0
    assert dev.copy_stats.native_blocks == 64
    out = bytearray(64 * BS)
    await dev.read(64, memoryview(out))
    assert out == data(128, seed=3)[: 64 * BS]


async def test_reports_add_up_over_chunks() -> None:
    src, dst = Wrapped(64), MemoryDevice(64 * BS)
    status = await Copier().submit(src, 0, dst, 0, 40, chunk_blocks=8).wait()
    assert status.report == CopyReport(emulated_blocks=40)
    mem = MemoryDevice(64 * BS)
    status = await Copier().submit(mem, 0, mem, 32, 20, chunk_blocks=8).wait()
    assert status.report == CopyReport(native_blocks=20)


# -- progress ---------------------------------------------------------------------------------


async def test_progress_is_monotonic_and_ends_at_the_total() -> None:
    src, dst = Wrapped(256), MemoryDevice(256 * BS)
    seen: list[int] = []
    copier = Copier(progress_interval=0)
    job = copier.submit(
        src,
        0,
        dst,
        0,
        250,
        chunk_blocks=8,
        depth=4,
        on_progress=lambda j: seen.append(j.done_blocks),
    )
    status = await job.wait()
    assert status.state is JobState.COMPLETED
    assert seen == sorted(seen)
    assert seen[-1] == 250 == job.total_blocks
    assert len(seen) > 5  # unthrottled: a call per completion round
    assert all(b % 8 == 0 for b in seen[:-1])  # whole chunks only


async def test_progress_is_throttled() -> None:
    clock = ManualClock()
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    calls: list[tuple[float, int]] = []
    job = Copier(clock=clock, progress_interval=0.1).submit(
        src, 0, dst, 0, 40, chunk_blocks=8, depth=1,
        on_progress=lambda j: calls.append((clock.now, j.done_blocks)),
    )  # fmt: skip
    await src.until_waiting(1)
    src.release(1)  # chunk 1 ends at t=100.0: the first call
    await src.until_waiting(1)
    src.release(1)  # chunk 2 at t=100.0: too soon
    await src.until_waiting(1)
    clock.now = 100.05
    src.release(1)  # chunk 3 at t=100.05: still too soon
    await src.until_waiting(1)
    clock.now = 100.2
    src.release(1)  # chunk 4 at t=100.2: due
    await src.until_waiting(1)
    src.release(1)  # chunk 5, the last: the final call, never throttled
    await job.wait()
    assert calls == [(100.0, 8), (100.2, 32), (100.2, 40)]


async def test_throughput_since_the_start() -> None:
    clock = ManualClock()
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    job = Copier(clock=clock).submit(src, 0, dst, 0, 32, chunk_blocks=8, depth=4)
    await src.until_waiting(4)
    assert job.bytes_per_second == 0.0  # nothing done, no time passed
    clock.now += 2.0
    src.release()
    status = await job.wait()
    assert status.seconds == job.elapsed == 2.0
    assert status.bytes_per_second == job.bytes_per_second == 32 * BS / 2.0
    clock.now += 10.0  # a finished job's numbers stay put
    assert job.elapsed == 2.0


# -- cancel and failure ------------------------------------------------------------------------


async def test_cancel_lets_chunks_in_flight_finish_and_issues_no_more() -> None:
    src, dst = Wrapped(128, hold=True), MemoryDevice(128 * BS)
    await src.mem.write(0, data(128, seed=4))
    job = Copier().submit(src, 0, dst, 0, 80, chunk_blocks=8, depth=2)
    await src.until_waiting(2)
    job.cancel()
    assert job.cancel_requested and not job.done()
    src.release()
    status = await job.wait()
    assert status.state is JobState.CANCELLED and status.error is None
    assert status.done_blocks == job.done_blocks == 16
    assert src.reads == [(0, 8), (8, 8)]  # nothing issued after the cancel
    # The two chunks in flight completed; the rest is untouched.
    assert await raw(dst, 0, 16) == data(128, seed=4)[: 16 * BS]
    assert await raw(dst, 16) == bytes(112 * BS)
    job.cancel()  # after the end: nothing happens
    assert job.state is JobState.CANCELLED


async def test_the_prefix_counts_only_blocks_from_the_start_without_a_gap() -> None:
    # Chunks finish out of order: the second (8..15) before the first (0..7).
    src, dst = Wrapped(128, hold=True), MemoryDevice(128 * BS)
    job = Copier().submit(src, 0, dst, 0, 80, chunk_blocks=8, depth=3)
    await src.until_waiting(3)
    job.cancel()
    src.waiting.pop(1).set_result(None)  # chunk 8..15 first
    for _ in range(100):  # a memory copy: done within a few turns of the loop
        if job.done_blocks:
            break
        await asyncio.sleep(0)
    assert job.done_blocks == 8  # a block count, with a gap before it
    src.release()
    status = await job.wait()
    assert status.state is JobState.CANCELLED
    assert (status.done_blocks, status.prefix_blocks) == (24, 24)


async def test_a_failed_chunk_ends_the_prefix() -> None:
    src, dst = Wrapped(128), MemoryDevice(128 * BS)
    src.fail_at = 27  # in the fourth chunk
    status = await Copier().submit(src, 0, dst, 0, 100, chunk_blocks=8, depth=1).wait()
    assert status.state is JobState.FAILED and status.prefix_blocks == 24


async def test_cancel_before_the_first_chunk_copies_nothing() -> None:
    src, dst = Wrapped(64), MemoryDevice(64 * BS)
    job = Copier().submit(src, 0, dst, 0, 64, chunk_blocks=8)
    job.cancel()
    status = await job.wait()
    assert status.state is JobState.CANCELLED and status.done_blocks == 0
    assert src.reads == []


async def test_cancel_after_the_last_chunk_completes() -> None:
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    job = Copier().submit(src, 0, dst, 0, 16, chunk_blocks=8, depth=2)
    await src.until_waiting(2)  # every chunk is issued
    job.cancel()
    src.release()
    assert (await job.wait()).state is JobState.COMPLETED


async def test_a_failing_chunk_fails_the_job_and_stops_it() -> None:
    src, dst = Wrapped(128), MemoryDevice(128 * BS)
    await src.mem.write(0, data(128, seed=5))
    src.fail_at = 27  # in the fourth chunk
    job = Copier().submit(src, 0, dst, 0, 100, chunk_blocks=8, depth=1)
    status = await job.wait()
    assert status.state is JobState.FAILED
    assert status.error is src.error
    assert status.done_blocks == 24
    assert src.reads == [(0, 8), (8, 8), (16, 8), (24, 8)]  # none after the failure
    assert await raw(dst, 0, 24) == data(128, seed=5)[: 24 * BS]
    assert await raw(dst, 24) == bytes(104 * BS)


async def test_a_failure_waits_for_the_chunks_in_flight() -> None:
    src, dst = Wrapped(128, hold=True), MemoryDevice(128 * BS)
    src.fail_at = 0
    reaped = asyncio.Event()
    job = Copier(progress_interval=0).submit(
        src, 0, dst, 0, 64, chunk_blocks=8, depth=3, on_progress=lambda _j: reaped.set()
    )
    await src.until_waiting(3)
    src.release(1)  # the first chunk fails; two are still in flight
    await reaped.wait()
    assert job.in_flight == 2  # the failed chunk was not replaced
    assert not job.done()  # it waits for the two
    src.hold = False  # were another chunk issued now, it would be read and counted
    src.release()
    status = await job.wait()
    assert status.state is JobState.FAILED and status.done_blocks == 16
    assert len(src.reads) == 3


async def test_a_failing_progress_callback_fails_the_job() -> None:
    src, dst = Wrapped(64), MemoryDevice(64 * BS)
    boom = RuntimeError("display broke")

    def callback(_job: CopyJob) -> None:
        raise boom

    status = await Copier().submit(src, 0, dst, 0, 64, chunk_blocks=8, on_progress=callback).wait()
    assert status.state is JobState.FAILED and status.error is boom
    assert status.done_blocks < 64


async def test_cancelling_a_waiter_does_not_cancel_the_job() -> None:
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    job = Copier().submit(src, 0, dst, 0, 16, chunk_blocks=8, depth=2)
    waiter = asyncio.create_task(job.wait())
    await src.until_waiting(2)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    src.release()
    assert (await job.wait()).state is JobState.COMPLETED


async def test_close_cancels_running_jobs() -> None:
    src, dst = Wrapped(64, hold=True), MemoryDevice(64 * BS)
    copier = Copier()
    job = copier.submit(src, 0, dst, 0, 64, chunk_blocks=8, depth=1)
    assert copier.jobs == {job}
    await src.until_waiting(1)
    closing = asyncio.create_task(copier.close())
    await src.until_waiting(1)  # still held: close waits for it
    src.release()
    await closing
    assert job.state is JobState.CANCELLED and job.done_blocks == 8
    assert copier.jobs == frozenset()


# -- durability and checks ---------------------------------------------------------------------


@pytest.mark.parametrize("fua", [False, True])
async def test_fua_flushes_the_destination_once_at_the_end(fua: bool) -> None:
    src, dst = MemoryDevice(64 * BS), Wrapped(64)
    await Copier().submit(src, 0, dst, 0, 64, chunk_blocks=8, fua=fua).wait()
    assert dst.flushes == (1 if fua else 0)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda c, s, d: c.submit(s, 60, d, 0, 8), BlockRangeError),
        (lambda c, s, d: c.submit(s, 0, d, 60, 8), BlockRangeError),
        (lambda c, s, d: c.submit(s, 0, d, 0, 8, depth=0), ValueError),
        (lambda c, s, d: c.submit(s, 0, d, 0, 8, chunk_blocks=0), ValueError),
        (lambda c, s, d: c.submit(s, 0, MemoryDevice(64 * 4096, 4096), 0, 8), ValueError),
    ],
)
async def test_bad_jobs_are_refused_up_front(
    make: Callable[[Copier, MemoryDevice, MemoryDevice], CopyJob], error: type[Exception]
) -> None:
    copier = Copier()
    src, dst = MemoryDevice(64 * BS), MemoryDevice(64 * BS)
    with pytest.raises(error):
        make(copier, src, dst)
    assert copier.jobs == frozenset()


# -- the data ---------------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("shift", [-37, -8, -3, -1, 1, 3, 8, 37])
async def test_overlapping_copy_within_one_device_is_memmove(native: bool, shift: int) -> None:
    dev: MemoryDevice | Wrapped = MemoryDevice(256 * BS) if native else Wrapped(256)
    mem = dev if isinstance(dev, MemoryDevice) else dev.mem
    original = data(256, seed=6)
    await mem.write(0, original)
    src_lba = 60
    status = await Copier().submit(dev, src_lba, dev, src_lba + shift, 120, chunk_blocks=8).wait()
    assert status.state is JobState.COMPLETED
    model = bytearray(original)
    model[(src_lba + shift) * BS : (src_lba + shift + 120) * BS] = original[
        src_lba * BS : (src_lba + 120) * BS
    ]
    assert await raw(mem) == model


async def test_overlapping_chunks_wait_for_the_reads_they_would_overwrite() -> None:
    """Reads finishing newest first, the worst order: a chunk that wrote before an
    earlier chunk in flight had read its source would corrupt that source."""
    dev = Wrapped(64, hold=True)
    original = data(64, seed=9)
    await dev.mem.write(0, original)
    # Moving 32 blocks up by 3 in chunks of 8: each chunk writes over the source of
    # the chunk issued before it (memmove order runs from the end).
    reaped = asyncio.Event()
    job = Copier(progress_interval=0).submit(
        dev, 0, dev, 3, 32, chunk_blocks=8, depth=4, on_progress=lambda _j: reaped.set()
    )
    for _ in range(4):  # one (staging) read per chunk
        await dev.until_any_waiting()
        reaped.clear()
        dev.release_newest()
        await reaped.wait()  # that chunk has written its destination
    assert (await job.wait()).state is JobState.COMPLETED
    model = bytearray(original)
    model[3 * BS : 35 * BS] = original[: 32 * BS]
    assert await raw(dev.mem) == model


async def test_overlapping_copy_on_an_offload_device_keeps_chunks_offloadable() -> None:
    """Far enough apart, an overlapping copy is cut into chunks no longer than the
    distance, so no chunk overlaps itself and none is staged through memory."""
    mem = MemoryDevice(8192 * BS)
    dev = LinearDevice([Segment(mem, 4096, 4096), Segment(mem, 0, 4096)])
    original = data(8192, seed=7)
    await dev.write(0, original)
    status = await Copier().submit(dev, 0, dev, 2048, 6000).wait()  # 1 MiB apart
    assert status.report.staged_blocks == 0 and status.report.emulated_blocks == 0
    model = bytearray(original)
    model[2048 * BS : 8048 * BS] = original[: 6000 * BS]
    out = bytearray(8192 * BS)
    await dev.read(0, memoryview(out))
    assert out == model


async def test_copy_between_devices_is_exact() -> None:
    src, dst = MemoryDevice(1024 * BS), MemoryDevice(1024 * BS)
    original = data(1024, seed=8)
    await src.write(0, original)
    status = await Copier().submit(src, 3, dst, 500, 517, chunk_blocks=37, depth=4).wait()
    assert status.state is JobState.COMPLETED and status.done_bytes == 517 * BS
    assert await raw(dst, 500, 517) == original[3 * BS : 520 * BS]
    assert await raw(dst, 0, 500) == bytes(500 * BS)
