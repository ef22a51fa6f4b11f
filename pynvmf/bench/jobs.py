"""The jobs `pynvmf bench` runs: read/write on the load generator engine (pynvmf.bench.loadgen),
copies through the copy planner (pynvmf.block.copy), and the prefill that gives reads data.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from dataclasses import dataclass

from pynvmf.bench.job_device import Counter, JobDevice
from pynvmf.bench.job_result import CopyStats, JobResult, rate_stats
from pynvmf.bench.loadgen import (
    LatencyHistogram,
    Measurement,
    RateSampler,
    RateSamples,
    Workload,
    cpu_usage,
    describe,
    run_workload,
    rusage,
    sleep_sampling,
    sleep_unless_set,
)
from pynvmf.block.copy import SourceRange, copy
from pynvmf.block.device import BlockDevice, Capabilities, CopyOffload
from pynvmf.host import RemoteNamespace
from pynvmf.host.queue import HostQueue

_PREFILL_CHUNK = 1 << 20


_PREFILL_DEPTH = 8


class JobError(Exception):
    """A job that cannot run as asked (its region, its copy mode): one line on stderr."""


AVG_TIME_MS = 500  # fio's bwavgtime and iopsavgtime


@dataclass(slots=True)
class Plan:
    rw: str
    bs: int
    iodepth: int
    runtime: float
    ramp_time: float
    rwmixread: int
    offset: int
    size: int | None
    seed: int
    copy_ranges: int
    copy_mode: str
    verify: bool
    bw_avg_time: float = AVG_TIME_MS / 1000  # seconds
    iops_avg_time: float = AVG_TIME_MS / 1000


async def prefill(device: JobDevice, first: int, end: int, block: int) -> None:
    """Write the whole region once (--verify of a read workload: reads then check it)."""
    per = max(1, _PREFILL_CHUNK // block)
    positions = iter(range(first, end, per))

    async def writer() -> None:
        buf = bytearray(per * block)
        for lba in positions:
            n = min(per, end - lba)
            await device.write(lba, memoryview(buf)[: n * block])

    await asyncio.gather(*(writer() for _ in range(_PREFILL_DEPTH)))


async def rw_job(
    name: str,
    device: BlockDevice,
    plan: Plan,
    job: int,
    stop: asyncio.Event,
    live: list[Measurement | None],
) -> JobResult:
    caps = device.capabilities
    first, end = region(plan, caps)
    workload = Workload(
        rw=plan.rw,
        bs=plan.bs,
        iodepth=plan.iodepth,
        rwmixread=plan.rwmixread,
        runtime=plan.runtime,
        ramp_time=plan.ramp_time,
        size=(end - first) * caps.block_size,
        offset=first * caps.block_size,
        # Jobs on one region would otherwise issue the very same offsets.
        seed=plan.seed + job,
        bw_avg_time=plan.bw_avg_time,
        iops_avg_time=plan.iops_avg_time,
    )
    result = await run_workload(
        device, workload, stop=stop, on_measure=functools.partial(live.__setitem__, job)
    )
    return JobResult(
        name=name,
        elapsed=result.elapsed,
        read_bytes_per_io=plan.bs,
        write_bytes_per_io=plan.bs,
        read_hist=result.read_latency,
        write_hist=result.write_latency,
        cpu=result.cpu,
        error=result.error,
        **rate_stats(result.read_rates, result.write_rates),
    )


async def copy_job(
    name: str,
    ns: RemoteNamespace,
    queue: HostQueue,
    plan: Plan,
    job: int,
    counter: Counter | None,
    stop: asyncio.Event,
    live: list[Measurement | None],
) -> JobResult:
    """Copies of --copy-ranges random --bs ranges of the region's first half to a
    random destination in its second half (no overlap, so the planner never stages).
    Setting `stop` ends the measurement early; the copies in flight complete."""
    caps = ns.capabilities
    first, end = region(plan, caps)
    nb = plan.bs // caps.block_size
    slots = (end - first) // nb
    src_slots = slots // 2
    dst_groups = (slots - src_slots) // plan.copy_ranges
    if src_slots < 1 or dst_groups < 1:
        raise JobError(
            f"region too small for copies of {plan.copy_ranges} x {plan.bs} bytes: it needs "
            f"{plan.copy_ranges + 1} slots of --bs after halving, it has {slots}"
        )
    if plan.copy_mode == "offload" and not isinstance(ns, CopyOffload):
        raise JobError(f"namespace {ns.nsid} does not support Copy (--copy-mode offload)")
    device: BlockDevice = JobDevice(ns) if plan.copy_mode == "emulate" else ns
    dst_base = first + src_slots * nb
    copy_bytes = plan.copy_ranges * plan.bs
    hist = LatencyHistogram()
    stats = CopyStats()
    rng = random.Random(plan.seed + job)
    stopping = False
    failure: list[str] = []

    async def worker() -> None:
        while not stopping:
            sources = [
                SourceRange(device, first + rng.randrange(src_slots) * nb, nb)
                for _ in range(plan.copy_ranges)
            ]
            dst = dst_base + rng.randrange(dst_groups) * plan.copy_ranges * nb
            t0 = time.perf_counter_ns()
            try:
                report = await copy(sources, device, dst)
            except Exception as exc:
                failure.append(f"copy to LBA {dst}: {describe(exc)}")
                return
            hist.record(time.perf_counter_ns() - t0)
            stats.copies += 1
            stats.offloaded_blocks += report.offloaded_blocks
            stats.emulated_blocks += report.emulated_blocks
            stats.commands += report.commands
            if counter is not None:
                counter.ios += 1
                counter.bytes += copy_bytes

    async def until(seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        while not failure and not stop.is_set() and (left := deadline - time.perf_counter()) > 0:
            await sleep_unless_set(min(left, 0.05), stop)

    # Copies are reported in the write direction: sampled there, from the copy counter
    # (read at call time: `stats` is replaced when the measurement starts).
    sampler = RateSampler(
        lambda: (0, stats.copies),
        (0, copy_bytes),
        bw_interval=plan.bw_avg_time,
        iops_interval=plan.iops_avg_time,
    )
    tasks = [asyncio.create_task(worker()) for _ in range(plan.iodepth)]
    try:
        await until(plan.ramp_time)
        hist.reset()
        stats = CopyStats()
        sent0, recv0 = queue.bytes_sent, queue.bytes_received
        t0 = time.perf_counter()
        usage0 = rusage()
        sampler.start(t0)
        live[job] = Measurement(t0, LatencyHistogram(), hist, usage0)
        await sleep_sampling(sampler, t0, plan.runtime, stop, lambda: bool(failure))
        measured = hist.copy()
        t1 = time.perf_counter()
        sampler.poll(t1)
        elapsed = t1 - t0
        usage = cpu_usage(usage0, rusage(), elapsed)
        done = CopyStats(**{k: getattr(stats, k) for k in CopyStats.__slots__})
        done.wire_sent = queue.bytes_sent - sent0
        done.wire_received = queue.bytes_received - recv0
    finally:
        stopping = True
        await asyncio.gather(*tasks, return_exceptions=True)
    done.copies = measured.count
    done.copied_bytes = measured.count * copy_bytes
    _, copy_rates = sampler.samples()
    return JobResult(
        name=name,
        elapsed=elapsed,
        read_bytes_per_io=0,
        write_bytes_per_io=copy_bytes,
        read_hist=LatencyHistogram(),
        write_hist=measured,
        cpu=usage,
        error=failure[0] if failure else None,
        copy=done,
        **rate_stats(RateSamples(), copy_rates),
    )


def region(plan: Plan, caps: Capabilities) -> tuple[int, int]:
    """[first, end) LBAs of the region, whole --bs slots only."""
    block = caps.block_size
    if plan.bs % block:
        raise JobError(f"--bs {plan.bs} is not a multiple of the block size {block}")
    if plan.offset % block:
        raise JobError(f"--offset {plan.offset} is not a multiple of the block size {block}")
    end = caps.size if plan.size is None else plan.offset + plan.size
    if end > caps.size:
        raise JobError(f"region ends at byte {end}, past the namespace's {caps.size} bytes")
    slots = (end - plan.offset) // plan.bs
    if slots < 1:
        raise JobError(f"region of {end - plan.offset} bytes holds no {plan.bs}-byte I/O")
    first = plan.offset // block
    return first, first + slots * (plan.bs // block)


def snapshot(name: str, m: Measurement, plan: Plan, now: float) -> JobResult:
    """A job's figures from the start of its measurement until `now`, as the final report
    has them (but for the per-interval statistics, which the job keeps to itself)."""
    elapsed = max(now - m.start, 1e-9)
    reads, writes = m.reads.copy(), m.writes.copy()
    copy_stats = None
    if plan.rw == "copy":
        copy_bytes = plan.copy_ranges * plan.bs
        copy_stats = CopyStats(copies=writes.count, copied_bytes=writes.count * copy_bytes)
    return JobResult(
        name=name,
        elapsed=elapsed,
        read_bytes_per_io=0 if plan.rw == "copy" else plan.bs,
        write_bytes_per_io=plan.copy_ranges * plan.bs if plan.rw == "copy" else plan.bs,
        read_hist=reads,
        write_hist=writes,
        cpu=cpu_usage(m.usage, rusage(), elapsed),
        copy=copy_stats,
    )
