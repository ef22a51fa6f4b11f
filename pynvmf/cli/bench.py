"""`pynvmf bench`: a fio-like load generator against a namespace of any NVMe/TCP target.

    pynvmf bench -a 10.0.0.1 -s 4420 --nqn NQN --rw randread --bs 4k --iodepth 32 \\
        --numjobs 2 --runtime 10 [--size 1G] [--rwmixread 70] [--verify] \\
        [--inline-data-size BYTES] [-o json] [--group-reporting] \\
        [--bwavgtime MS] [--iopsavgtime MS]
    pynvmf bench ... --rw copy --bs 64k --copy-ranges 4 --copy-mode offload|emulate|auto

Each of the `--numjobs` jobs owns one I/O queue of the connection and keeps
`--iodepth` I/Os in flight on it; the jobs run concurrently in one event loop and
their results are reported per job (fio's default) or as one entry with
`--group-reporting` (fio's semantics: I/Os and bandwidth add up, the runtime is
the longest job's). Read/write workloads run on the load generator engine
(pynvmf.bench.loadgen); `--rw copy` issues copies through the copy planner
(pynvmf.block.copy), one copy of `--copy-ranges` ranges of `--bs` each per I/O.

`--output-format json` follows the key names of fio 3.x's JSON output for what
it reports; lat_ns and clat_ns are the same figure (submission to completion as
the host library's caller sees it, there is no separate submission latency), and
stddev is computed from the latency histogram, so it is approximate like the
percentiles (within half a bucket, 0.4%). The cpu figures (usr_cpu, sys_cpu, ctx,
majf, minf) are the whole process's over each job's measured time: all jobs run in
one thread, so every job reports (nearly) the same process-wide usage.

Bandwidth and IOPS are sampled per job every --bwavgtime / --iopsavgtime ms (500,
fio's default) of the measured time and reported per direction as fio does: in JSON
bw_min, bw_max, bw_agg (the job's mean bandwidth in percent of the group's aggregate
bandwidth, at most 100), bw_mean, bw_dev, bw_samples (KiB/s), iops_min, iops_max,
iops_mean, iops_stddev, iops_samples; in the human report the `   bw (  KiB/s):` and
`   iops        :` lines after the latency lines (none for a direction without
samples; MiB/s above 1 GiB/s). As fio's: a sample is what completed since the
previous one over the time actually elapsed, truncated to a whole number; an
interval in which a direction completed nothing gives that direction no sample (a
stall shows as fewer samples, not as a zero); standard deviations divide by n - 1;
a run shorter than one interval has no samples and reports zeros; and the group
entry (--group-reporting, and the human report's "all jobs") adds the jobs'
statistics up: its mean is the group's, but its min and max are the sums of the
jobs' minima and maxima and its samples the jobs' total, fio's arithmetic rather
than a sum per interval. What differs from fio: samples fall on a grid from the
start of the measurement, taken by the coroutine that waits for its end, so they
all lie wholly within it (the ramp and the last, unfinished interval give none) and
a run stopped by Ctrl-C keeps the whole intervals it measured; copy mode samples
its copies in the write direction (bw: bytes copied, iops: copies), as it reports
them.

Ctrl-C during the measurement stops the jobs as the end of --runtime does and
reports the time measured so far (exit status 130); a second Ctrl-C aborts at once.

On a terminal, stderr shows a progress line: the percentage of --ramp-time + --runtime
gone, the time left, and the IOPS and MB/s of the last quarter second.
--status-interval prints the report so far, as fio's, from each job's live histograms
(loadgen.Measurement; the per-interval bw/iops lines only come with the final report).
--write_bw_log, --write_iops_log and --write_lat_log write fio's log files
(pynvmf.cli.bench_logs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import math
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO, cast

from pynvmf import __version__
from pynvmf.aio import uvloop_factory
from pynvmf.bench.loadgen import (
    PERCENTILES,
    CpuUsage,
    LatencyHistogram,
    LatencyStats,
    Measurement,
    OpResult,
    RateSampler,
    RateSamples,
    SampleStats,
    Workload,
    bucket_bounds,
    cpu_usage,
    describe,
    run_workload,
    rusage,
    sleep_sampling,
    sleep_unless_set,
)
from pynvmf.block.copy import SourceRange, copy
from pynvmf.block.device import BlockDevice, Buffer, Capabilities, CopyOffload
from pynvmf.cli.bench_logs import DEFAULT_LOG_AVG_MSEC, IntervalLogs, LogNames
from pynvmf.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CommandError,
    active_namespace,
    connect_arguments,
    connection_options,
    host_identity,
    int_at_least,
    namespace_option,
    output_option,
    size,
)
from pynvmf.cli.failures import Attempt, connect_failure
from pynvmf.cli.identity import CommandIdentity
from pynvmf.host import Controller, NvmeError, RemoteNamespace, connect
from pynvmf.host.namespace import remote_namespace
from pynvmf.host.queue import HostQueue
from pynvmf.target.server import NVME_TCP_PORT

BENCH_RW_MODES = ("randread", "randwrite", "read", "write", "randrw", "copy")
COPY_MODES = ("auto", "offload", "emulate")
FIO_VERSION = f"pynvmf-bench {__version__}"
# fio's error field is an errno: EILSEQ for a verify failure, EIO for anything else.
_EILSEQ = 84
_EIO = 5
_PROGRESS_INTERVAL = 0.25  # at most 4 refreshes a second
_PREFILL_CHUNK = 1 << 20
_PREFILL_DEPTH = 8
_AVG_TIME_MS = 500  # fio's bwavgtime and iopsavgtime

# -- argument parsing --------------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number of seconds")
    return value


def _percent(text: str) -> int:
    value = int_at_least(0)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"{value} is not a percentage (0-100)")
    return value


def add_bench_command(subparsers: Any) -> None:
    """Register `bench` on the `pynvmf` parser."""
    p = subparsers.add_parser(
        "bench",
        help="fio-like load generator against a remote namespace",
        description="Keep --iodepth I/Os in flight on each of --numjobs I/O queues for "
        "--runtime seconds and report IOPS, bandwidth and latency like fio. The workload "
        "options are fio's, with fio's meaning and defaults unless said otherwise.",
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    namespace_option(p)
    output_option(p)
    p.add_argument("--rw", choices=BENCH_RW_MODES, default="randread", help="I/O pattern")
    p.add_argument("--bs", type=size(), default=4096, metavar="SIZE", help="block size")
    p.add_argument(
        "--iodepth", type=int_at_least(1), default=1, metavar="N", help="I/Os in flight per job"
    )
    p.add_argument(
        "--numjobs", type=int_at_least(1), default=1, metavar="N", help="jobs (one I/O queue each)"
    )
    p.add_argument(
        "--runtime", type=_seconds, default=10.0, metavar="SECONDS", help="measured time"
    )
    p.add_argument(
        "--ramp-time", type=_seconds, default=0.0, metavar="SECONDS", help="unmeasured warm-up"
    )
    p.add_argument(
        "--size",
        type=size(),
        metavar="SIZE",
        help="region size (default: to the end of the namespace)",
    )
    p.add_argument("--offset", type=size(0), default=0, metavar="SIZE", help="region start")
    p.add_argument(
        "--rwmixread", type=_percent, default=50, metavar="PCT", help="reads in percent (randrw)"
    )
    p.add_argument("--verify", action="store_true", help="write patterns and check every read")
    p.add_argument(
        "--inline-data-size",
        type=int_at_least(0),
        metavar="BYTES",
        help="most write data the host sends in-capsule (default: what the target's IOCCSZ allows)",
    )
    p.add_argument(
        "--copy-ranges",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="source ranges of --bs each per copy (--rw copy)",
    )
    p.add_argument(
        "--copy-mode",
        choices=COPY_MODES,
        default="auto",
        help="offload: NVMe Copy; emulate: read and write through this host; auto: as the "
        "copy planner decides (--rw copy)",
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed of the offsets and patterns"
    )
    p.add_argument(
        "--group-reporting", action="store_true", help="report all jobs as one, as fio's"
    )
    p.add_argument(
        "--bwavgtime",
        type=int_at_least(1),
        default=_AVG_TIME_MS,
        metavar="MS",
        help="bandwidth sampling interval",
    )
    p.add_argument(
        "--iopsavgtime",
        type=int_at_least(1),
        default=_AVG_TIME_MS,
        metavar="MS",
        help="IOPS sampling interval",
    )
    p.add_argument(
        "--status-interval",
        type=_seconds,
        metavar="SECONDS",
        help="print the report so far every SECONDS, as fio's (the figures since the "
        "measurement started; no per-interval bw/iops lines until the end)",
    )
    for kind, what in (("bw", "bandwidth"), ("iops", "IOPS"), ("lat", "latency")):
        p.add_argument(
            f"--write_{kind}_log",
            f"--write-{kind}-log",
            metavar="NAME",
            help=f"log the {what} of each --log_avg_msec window to NAME_{kind}.N.log"
            + (" and NAME_clat.N.log" if kind == "lat" else "")
            + ", fio's format (pynvmf.cli.bench_logs)",
        )
    p.add_argument(
        "--log_avg_msec",
        "--log-avg-msec",
        type=int_at_least(1),
        default=DEFAULT_LOG_AVG_MSEC,
        metavar="MS",
        help="the window of the --write_*_log lines (fio's default, 0: every I/O, is not offered)",
    )


def run_bench_command(args: argparse.Namespace) -> int:
    """Run `pynvmf bench`; the exit status (1 for any failure, verify included; 130 when
    interrupted, with or without a report)."""
    try:
        identity = host_identity(args)
        with asyncio.Runner(loop_factory=uvloop_factory()) as runner:
            return runner.run(_bench(args, identity, sys.stdout, sys.stderr))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as exc:
        print(f"pynvmf bench: {_os_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except (CommandError, NvmeError, ValueError) as exc:
        print(f"pynvmf bench: {describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _os_error_text(exc: OSError) -> str:
    if exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"  # not "[Errno 2] ..." with a repr
    return describe(exc)


# -- verification ----------------------------------------------------------------------------


class VerifyError(Exception):
    """Data read back is not what this run last wrote there."""


class Verifier:
    """The expected content of every block this run wrote, shared by all jobs.

    A block's content is derived from (LBA, seed, generation): the generation
    counts the writes to that block, so a stale block (a lost write) is caught as
    well as a corrupted one. Blocks never written are not checked. I/Os of one
    run never partially overlap (all start on the same --bs grid), so I/Os to the
    same start LBA are serialised: which of two concurrent writes lands last, or
    whether a concurrent read sees the old or the new data, would be undefined.
    """

    def __init__(self, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self._seed = seed.to_bytes(8, "little")
        self._repeat = block_size // 64
        self.generations: dict[int, int] = {}
        self._busy: dict[int, asyncio.Event] = {}
        self.failure: str | None = None

    def pattern(self, lba: int, generation: int) -> bytes:
        key = lba.to_bytes(8, "little") + self._seed + generation.to_bytes(8, "little")
        return hashlib.blake2b(key, digest_size=64).digest() * self._repeat

    @contextlib.asynccontextmanager
    async def exclusive(self, lba: int) -> AsyncIterator[None]:
        busy = self._busy
        while (event := busy.get(lba)) is not None:
            await event.wait()
        mine = busy[lba] = asyncio.Event()
        try:
            yield
        finally:
            del busy[lba]
            mine.set()

    def fill(self, lba: int, view: memoryview) -> None:
        """Put the next generation's pattern of each block into `view`."""
        bs = self.block_size
        gens = self.generations
        for i in range(view.nbytes // bs):
            g = gens.get(lba + i, 0) + 1
            gens[lba + i] = g
            view[i * bs : (i + 1) * bs] = self.pattern(lba + i, g)

    def check(self, lba: int, view: memoryview) -> None:
        bs = self.block_size
        gens = self.generations
        for i in range(view.nbytes // bs):
            g = gens.get(lba + i)
            if g is None:
                continue
            block = view[i * bs : (i + 1) * bs]
            if block != self.pattern(lba + i, g):
                stale = g > 1 and block == self.pattern(lba + i, g - 1)
                what = "stale data (the previous write)" if stale else "unexpected data"
                message = f"verify failed at LBA {lba + i}: {what}, expected write #{g}"
                if self.failure is None:
                    self.failure = message
                raise VerifyError(message)


# -- the device each job sees ----------------------------------------------------------------


@dataclass(slots=True)
class Counter:
    """Completed I/Os and bytes, for the progress line."""

    ios: int = 0
    bytes: int = 0


class JobDevice:
    """A namespace as one job uses it: counts completions for the progress line,
    writes and checks patterns with --verify. It does not offer CopyOffload, so
    the copy planner emulates copies to it (--copy-mode emulate)."""

    def __init__(
        self, inner: BlockDevice, counter: Counter | None = None, verifier: Verifier | None = None
    ) -> None:
        self._inner = inner
        self._counter = counter
        self._verifier = verifier

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    async def read(self, lba: int, buf: memoryview) -> None:
        verifier = self._verifier
        if verifier is None:
            await self._inner.read(lba, buf)
        else:
            async with verifier.exclusive(lba):
                await self._inner.read(lba, buf)
                verifier.check(lba, memoryview(buf).cast("B"))
        if self._counter is not None:
            self._counter.ios += 1
            self._counter.bytes += memoryview(buf).nbytes

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        verifier = self._verifier
        view = memoryview(data).cast("B")
        if verifier is None:
            await self._inner.write(lba, view, fua=fua)
        else:
            async with verifier.exclusive(lba):
                if view.readonly:
                    view = memoryview(bytearray(view.nbytes))
                verifier.fill(lba, view)
                await self._inner.write(lba, view, fua=fua)
        if self._counter is not None:
            self._counter.ios += 1
            self._counter.bytes += view.nbytes

    async def flush(self) -> None:
        await self._inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._inner.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._inner.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self._inner.close()


class _OneQueue:
    """The controller as one job's namespace sees it: every command goes to the job's
    own I/O queue instead of round-robin over all of them (fio: one queue per job)."""

    def __init__(self, ctrl: Controller, queue: HostQueue) -> None:
        self._ctrl = ctrl
        self._queue = queue

    def next_queue(self) -> HostQueue:
        return self._queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctrl, name)


def job_namespace(ctrl: Controller, ns: RemoteNamespace, queue: HostQueue) -> RemoteNamespace:
    """`ns` bound to `queue` (a CopyingNamespace if `ns` is one)."""
    return remote_namespace(cast(Controller, _OneQueue(ctrl, queue)), ns.nsid, ns.identify)


# -- results -----------------------------------------------------------------------------------


@dataclass(slots=True)
class CopyStats:
    copies: int = 0
    copied_bytes: int = 0
    offloaded_blocks: int = 0
    emulated_blocks: int = 0
    commands: int = 0
    wire_sent: int = 0
    wire_received: int = 0


@dataclass(slots=True)
class JobResult:
    name: str
    elapsed: float  # seconds measured
    read_bytes_per_io: int
    write_bytes_per_io: int
    read_hist: LatencyHistogram
    write_hist: LatencyHistogram
    # The process's usage over the measured time: the same for all jobs of a run, since
    # they share the process's one thread (see CpuUsage).
    cpu: CpuUsage
    error: str | None = None
    verify_failed: bool = False
    copy: CopyStats | None = None
    # Per-interval bandwidth (KiB/s) and IOPS, per direction.
    read_bw: SampleStats = field(default_factory=SampleStats)
    read_iops: SampleStats = field(default_factory=SampleStats)
    write_bw: SampleStats = field(default_factory=SampleStats)
    write_iops: SampleStats = field(default_factory=SampleStats)

    def rates(self, which: str) -> tuple[SampleStats, SampleStats]:
        """Bandwidth and IOPS sample statistics of `which` direction."""
        if which == "read":
            return self.read_bw, self.read_iops
        return self.write_bw, self.write_iops

    def op(self, which: str) -> OpResult:
        hist = self.read_hist if which == "read" else self.write_hist
        per_io = self.read_bytes_per_io if which == "read" else self.write_bytes_per_io
        stats = hist.stats()
        elapsed = self.elapsed or 1e-9
        return OpResult(
            ios=stats.count,
            bytes=stats.count * per_io,
            iops=stats.count / elapsed,
            mbps=stats.count * per_io / elapsed / 1e6,
            latency=stats,
        )


def _rate_stats(reads: RateSamples, writes: RateSamples) -> dict[str, SampleStats]:
    """JobResult's sample statistics fields, from the samples."""
    return {
        "read_bw": SampleStats.of(reads.bw),
        "read_iops": SampleStats.of(reads.iops),
        "write_bw": SampleStats.of(writes.bw),
        "write_iops": SampleStats.of(writes.iops),
    }


def aggregate(results: Sequence[JobResult]) -> JobResult:
    """fio's group_reporting: I/Os add up over the longest job's runtime, and so do the
    per-interval statistics (SampleStats.group_sum)."""
    first = results[0]
    reads, writes = LatencyHistogram(), LatencyHistogram()
    copy_total = CopyStats() if first.copy is not None else None
    for r in results:
        reads.merge(r.read_hist)
        writes.merge(r.write_hist)
        if copy_total is not None and r.copy is not None:
            for name in CopyStats.__slots__:
                setattr(copy_total, name, getattr(copy_total, name) + getattr(r.copy, name))
    failed = next((r for r in results if r.error), None)
    longest = max(results, key=lambda r: r.elapsed)
    rates = {
        name: functools.reduce(SampleStats.group_sum, (getattr(r, name) for r in results))
        for name in ("read_bw", "read_iops", "write_bw", "write_iops")
    }
    return JobResult(
        name=first.name,
        elapsed=longest.elapsed,
        read_bytes_per_io=first.read_bytes_per_io,
        write_bytes_per_io=first.write_bytes_per_io,
        read_hist=reads,
        write_hist=writes,
        # Not a sum as fio's: the jobs' windows overlap and each already holds the whole
        # process's usage. The longest window is the group's runtime.
        cpu=longest.cpu,
        error=failed.error if failed else None,
        verify_failed=any(r.verify_failed for r in results),
        copy=copy_total,
        **rates,
    )


def stddev_ns(hist: LatencyHistogram) -> float:
    """Standard deviation from bucket midpoints (the histogram keeps no sum of squares)."""
    n = hist.count
    if n < 2:
        return 0.0
    mean = hist.total_ns / n
    acc = 0.0
    for index, count in enumerate(hist.counts):
        if count:
            low, high = bucket_bounds(index)
            acc += count * ((low + high - 1) / 2 - mean) ** 2
    return math.sqrt(acc / n)


# -- running -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
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
    bw_avg_time: float = _AVG_TIME_MS / 1000  # seconds
    iops_avg_time: float = _AVG_TIME_MS / 1000


def _plan(args: argparse.Namespace) -> _Plan:
    if args.runtime <= 0:
        raise CommandError("--runtime must be positive")
    if args.rw == "copy" and args.verify:
        raise CommandError("--verify is not supported with --rw copy")
    if args.rw != "copy" and (args.copy_ranges != 1 or args.copy_mode != "auto"):
        raise CommandError("--copy-ranges and --copy-mode apply to --rw copy only")
    return _Plan(
        rw=args.rw,
        bs=args.bs,
        iodepth=args.iodepth,
        runtime=args.runtime,
        ramp_time=args.ramp_time,
        rwmixread=args.rwmixread,
        offset=args.offset,
        size=args.size,
        seed=args.seed,
        copy_ranges=args.copy_ranges,
        copy_mode=args.copy_mode,
        verify=args.verify,
        bw_avg_time=args.bwavgtime / 1000,
        iops_avg_time=args.iopsavgtime / 1000,
    )


def _region(plan: _Plan, caps: Capabilities) -> tuple[int, int]:
    """[first, end) LBAs of the region, whole --bs slots only."""
    block = caps.block_size
    if plan.bs % block:
        raise CommandError(f"--bs {plan.bs} is not a multiple of the block size {block}")
    if plan.offset % block:
        raise CommandError(f"--offset {plan.offset} is not a multiple of the block size {block}")
    end = caps.size if plan.size is None else plan.offset + plan.size
    if end > caps.size:
        raise CommandError(f"region ends at byte {end}, past the namespace's {caps.size} bytes")
    slots = (end - plan.offset) // plan.bs
    if slots < 1:
        raise CommandError(f"region of {end - plan.offset} bytes holds no {plan.bs}-byte I/O")
    first = plan.offset // block
    return first, first + slots * (plan.bs // block)


async def _prefill(device: JobDevice, first: int, end: int, block: int) -> None:
    """Write the whole region once (--verify of a read workload: reads then check it)."""
    per = max(1, _PREFILL_CHUNK // block)
    positions = iter(range(first, end, per))

    async def writer() -> None:
        buf = bytearray(per * block)
        for lba in positions:
            n = min(per, end - lba)
            await device.write(lba, memoryview(buf)[: n * block])

    await asyncio.gather(*(writer() for _ in range(_PREFILL_DEPTH)))


async def _rw_job(
    name: str,
    device: BlockDevice,
    plan: _Plan,
    job: int,
    stop: asyncio.Event,
    live: list[Measurement | None],
) -> JobResult:
    caps = device.capabilities
    first, end = _region(plan, caps)
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
        **_rate_stats(result.read_rates, result.write_rates),
    )


async def _copy_job(
    name: str,
    ns: RemoteNamespace,
    queue: HostQueue,
    plan: _Plan,
    job: int,
    counter: Counter | None,
    stop: asyncio.Event,
    live: list[Measurement | None],
) -> JobResult:
    """Copies of --copy-ranges random --bs ranges of the region's first half to a
    random destination in its second half (no overlap, so the planner never stages).
    Setting `stop` ends the measurement early; the copies in flight complete."""
    caps = ns.capabilities
    first, end = _region(plan, caps)
    nb = plan.bs // caps.block_size
    slots = (end - first) // nb
    src_slots = slots // 2
    dst_groups = (slots - src_slots) // plan.copy_ranges
    if src_slots < 1 or dst_groups < 1:
        raise CommandError(
            f"region too small for copies of {plan.copy_ranges} x {plan.bs} bytes: it needs "
            f"{plan.copy_ranges + 1} slots of --bs after halving, it has {slots}"
        )
    if plan.copy_mode == "offload" and not isinstance(ns, CopyOffload):
        raise CommandError(f"namespace {ns.nsid} does not support Copy (--copy-mode offload)")
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
        **_rate_stats(RateSamples(), copy_rates),
    )


def set_inline_limit(ctrl: Controller, limit: int) -> int:
    """Send at most `limit` bytes of write data in-capsule (never more than the target's
    IOCCSZ allows); the limit in effect."""
    effective = min(limit, ctrl.io_inline_limit)
    ctrl.io_inline_limit = effective
    for queue in ctrl.io_queues:
        queue.conn.inline_limit = effective
    return effective


async def _bench(
    args: argparse.Namespace, identity: CommandIdentity, out: TextIO, err: TextIO
) -> int:
    plan = _plan(args)
    depth = plan.iodepth * (plan.copy_ranges + 1 if plan.rw == "copy" else 1)
    try:
        ctrl = await connect(
            args.traddr,
            args.trsvcid,
            args.nqn,
            queues=args.numjobs,
            queue_depth=depth,
            **connect_arguments(args, identity),
        )
    except NvmeError as exc:
        raise connect_failure(Attempt(args.traddr, args.trsvcid, identity), exc) from exc
    async with ctrl:
        ns = active_namespace(ctrl, args)
        if args.inline_data_size is not None:
            set_inline_limit(ctrl, args.inline_data_size)
        queues = ctrl.io_queues
        if len(queues) < args.numjobs:
            print(
                f"pynvmf bench: the target granted {len(queues)} I/O queues for "
                f"{args.numjobs} jobs; jobs share them",
                file=err,
            )
        _region(plan, ns.capabilities)  # refuse a bad region before anything is written
        show_progress = err.isatty()
        verifier = Verifier(ns.capabilities.block_size, plan.seed) if plan.verify else None
        if verifier is not None and plan.rw in ("read", "randread"):
            first, end = _region(plan, ns.capabilities)
            await _prefill(JobDevice(ns, None, verifier), first, end, verifier.block_size)
        jobs: list[Callable[[], Awaitable[JobResult]]] = []
        counters: list[Counter] = []
        live: list[Measurement | None] = [None] * args.numjobs
        stop = asyncio.Event()
        for j in range(args.numjobs):
            queue = queues[j % len(queues)]
            job_ns = job_namespace(ctrl, ns, queue)
            counter = Counter() if show_progress else None
            if counter is not None:
                counters.append(counter)
            name = f"job{j}"
            if plan.rw == "copy":
                jobs.append(
                    functools.partial(_copy_job, name, job_ns, queue, plan, j, counter, stop, live)
                )
                continue
            # The wrapper costs a coroutine per I/O: only when something needs it.
            wrapped = counter is not None or verifier is not None
            device: BlockDevice = JobDevice(job_ns, counter, verifier) if wrapped else job_ns
            jobs.append(functools.partial(_rw_job, name, device, plan, j, stop, live))

        helpers: list[asyncio.Task[None]] = []
        logs = _interval_logs(args, plan)
        if logs is not None:
            helpers.append(asyncio.create_task(logs.run(live, plan.runtime, stop)))
        if args.status_interval:
            helpers.append(
                asyncio.create_task(_status_reports(args, plan, live, out, args.status_interval))
            )
        if show_progress and counters:
            helpers.append(asyncio.create_task(_progress(counters, err, plan)))
        interrupt = _Interrupt(stop, err, show_progress)
        try:
            interrupt.install()
            results: list[JobResult] = await asyncio.gather(*(job() for job in jobs))
        finally:
            interrupt.uninstall()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if logs is not None:
                logs.close()
            if show_progress and counters:
                err.write("\r\x1b[K")
                err.flush()

    if verifier is not None and verifier.failure is not None:
        for r in results:
            if r.error and verifier.failure in r.error:
                r.verify_failed = True
                r.error = verifier.failure
    options = _job_options(args)
    if args.output_format == "json":
        print(
            json.dumps(fio_json(results, options, group=args.group_reporting), indent=2), file=out
        )
    else:
        out.write(human_report(results, plan))
    failed = [r for r in results if r.error]
    if failed:
        print(f"pynvmf bench: {failed[0].name}: {failed[0].error}", file=err)
        return EXIT_FAILURE
    return EXIT_INTERRUPTED if interrupt.interrupted else 0


def _interval_logs(args: argparse.Namespace, plan: _Plan) -> IntervalLogs | None:
    names = LogNames(args.write_bw_log, args.write_iops_log, args.write_lat_log)
    if not names.any():
        return None
    per_io = (0, plan.copy_ranges * plan.bs) if plan.rw == "copy" else (plan.bs, plan.bs)
    return IntervalLogs(names, args.numjobs, per_io, args.log_avg_msec)


def snapshot(name: str, m: Measurement, plan: _Plan, now: float) -> JobResult:
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


async def _status_reports(
    args: argparse.Namespace,
    plan: _Plan,
    live: Sequence[Measurement | None],
    out: TextIO,
    interval: float,
) -> None:
    """fio's --status-interval: the report so far, every `interval` seconds."""
    options = _job_options(args)
    while True:
        await asyncio.sleep(interval)
        now = time.perf_counter()
        results = [snapshot(f"job{j}", m, plan, now) for j, m in enumerate(live) if m]
        if not results:
            continue  # still ramping up
        if args.output_format == "json":
            text = json.dumps(fio_json(results, options, group=args.group_reporting), indent=2)
            out.write(text + "\n")
        else:
            out.write(human_report(results, plan))
        out.flush()


class _Interrupt:
    """Ctrl-C during the measurement: the first sets `stop`, which ends the jobs as the
    end of --runtime does (the report then covers the time measured); a second one does
    what the handler before ours does (asyncio.Runner's cancels the main task: the run
    aborts without a report). The second is handled in the loop too, not by handing
    SIGINT back to a Python-level handler: that one runs only when the main thread next
    runs bytecode, and a loop waiting on a target that stopped answering, with the
    transport compiled (make compiled), may not do so for a long time."""

    def __init__(self, stop: asyncio.Event, err: TextIO, progress_line: bool) -> None:
        self._stop = stop
        self._err = err
        self._progress_line = progress_line
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self.interrupted = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            # Started with Ctrl-C ignored (a background job of a script, nohup): keep it so.
            return
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread (or no signals here): Ctrl-C keeps aborting the run.
            return
        self._loop, self._previous = loop, previous

    def uninstall(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.remove_signal_handler(signal.SIGINT)
        # remove_signal_handler installs Python's default handler; the one before ours
        # (asyncio.Runner's, which cancels the main task) lets the run clean up.
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self) -> None:
        if self.interrupted:
            previous = self._previous
            self.uninstall()
            if callable(previous):
                previous(signal.SIGINT, None)
                return
            raise KeyboardInterrupt
        self.interrupted = True
        self._stop.set()
        # Said now rather than after the report: the jobs may take a while to drain
        # their I/Os, and the user should know that a second Ctrl-C is what aborts.
        clear = "\r\x1b[K" if self._progress_line else ""
        self._err.write(
            f"{clear}pynvmf bench: interrupted, reporting the time measured so far "
            "(Ctrl-C again to abort)\n"
        )
        self._err.flush()


async def _progress(counters: Sequence[Counter], err: TextIO, plan: _Plan) -> None:
    start = last_t = time.perf_counter()
    last_ios = last_bytes = 0
    total = plan.ramp_time + plan.runtime
    while True:
        await asyncio.sleep(_PROGRESS_INTERVAL)
        now = time.perf_counter()
        ios = sum(c.ios for c in counters)
        nbytes = sum(c.bytes for c in counters)
        span = now - last_t
        iops, rate = (ios - last_ios) / span, (nbytes - last_bytes) / span
        err.write("\r" + format_progress(now - start, total, iops, rate))
        err.flush()
        last_t, last_ios, last_bytes = now, ios, nbytes


def format_progress(elapsed: float, total: float, iops: float, bytes_per_second: float) -> str:
    """One progress line: how far into --ramp-time + --runtime, the time left, and the
    rates of the last refresh."""
    fraction = min(1.0, elapsed / total) if total > 0 else 1.0
    left = max(0.0, total - elapsed)
    return (
        f"[{fraction:6.1%}] {elapsed:6.1f}s ETA {left:5.1f}s {iops:10.0f} IOPS  "
        f"{bytes_per_second / 1e6:9.1f} MB/s"
    )


# -- fio-shaped output -------------------------------------------------------------------------


def _job_options(args: argparse.Namespace) -> dict[str, str]:
    """fio's "job options": the options as given, all strings."""
    options = {
        "rw": args.rw,
        "bs": str(args.bs),
        "iodepth": str(args.iodepth),
        "numjobs": str(args.numjobs),
        "runtime": f"{args.runtime:g}",
        "ramp_time": f"{args.ramp_time:g}",
        "offset": str(args.offset),
        "rwmixread": str(args.rwmixread),
        "randseed": str(args.seed),
        "ioengine": "pynvmf-tcp",
        "filename": f"nvme-tcp://{args.traddr}:{args.trsvcid}/{args.nqn}/{args.namespace_id}",
    }
    if args.size is not None:
        options["size"] = str(args.size)
    if args.verify:
        options["verify"] = "pattern"
    if args.rw == "copy":
        options["copy_ranges"] = str(args.copy_ranges)
        options["copy_mode"] = args.copy_mode
    for name in ("bwavgtime", "iopsavgtime"):
        if getattr(args, name) != _AVG_TIME_MS:
            options[name] = str(getattr(args, name))
    return options


def _lat_json(hist: LatencyHistogram, *, with_percentiles: bool = True) -> dict[str, Any]:
    n = hist.count
    if not n:
        out: dict[str, Any] = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
    else:
        out = {
            "min": hist.min_ns,
            "max": hist.max_ns,
            "mean": hist.total_ns / n,
            "stddev": stddev_ns(hist),
            "N": n,
        }
    if with_percentiles and n:
        values = hist.percentiles(PERCENTILES)
        out["percentile"] = {f"{q:f}": round(v) for q, v in zip(PERCENTILES, values, strict=True)}
    return out


_EMPTY_LAT = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}


def group_bandwidth(results: Sequence[JobResult], which: str) -> float:
    """fio's aggregate bandwidth of a group in `which` direction (bytes/s): all its jobs'
    bytes over the longest runtime of those that moved any."""
    ops = [(r.op(which), r.elapsed) for r in results]
    longest = max((elapsed for op, elapsed in ops if op.ios), default=0.0)
    return sum(op.bytes for op, _ in ops) / longest if longest > 0 else 0.0


def bw_share(bw: SampleStats, group_bytes_per_s: float) -> float:
    """fio's bw_agg (the human report's per=): a job's mean sampled bandwidth in percent
    of its group's aggregate bandwidth, at most 100; 0 without samples."""
    if not bw.samples:
        return 0.0
    if group_bytes_per_s <= 1024:  # fio's threshold: no meaningful share of (next to) nothing
        return 100.0
    return min(100.0, bw.mean * 100 / (group_bytes_per_s / 1024))


def _rates_json(bw: SampleStats, iops: SampleStats, group_bytes_per_s: float) -> dict[str, Any]:
    return {
        "bw_min": bw.min_val,
        "bw_max": bw.max_val,
        "bw_agg": bw_share(bw, group_bytes_per_s),
        "bw_mean": float(bw.mean),
        "bw_dev": bw.stddev,
        "bw_samples": bw.samples,
        "iops_min": iops.min_val,
        "iops_max": iops.max_val,
        "iops_mean": float(iops.mean),
        "iops_stddev": iops.stddev,
        "iops_samples": iops.samples,
    }


def _dir_json(r: JobResult, which: str, group_bytes_per_s: float) -> dict[str, Any]:
    op = r.op(which)
    hist = r.read_hist if which == "read" else r.write_hist
    bw_bytes = op.bytes / r.elapsed if r.elapsed else 0.0
    lat = _lat_json(hist)
    return {
        "io_bytes": op.bytes,
        "io_kbytes": op.bytes // 1024,
        "bw_bytes": round(bw_bytes),
        "bw": round(bw_bytes / 1024),
        "iops": op.iops,
        "runtime": round(r.elapsed * 1000) if op.ios else 0,
        "total_ios": op.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": dict(_EMPTY_LAT),
        "clat_ns": lat,
        "lat_ns": dict(lat),
        **_rates_json(*r.rates(which), group_bytes_per_s),
    }


def _empty_dir() -> dict[str, Any]:
    return {
        "io_bytes": 0,
        "io_kbytes": 0,
        "bw_bytes": 0,
        "bw": 0,
        "iops": 0.0,
        "runtime": 0,
        "total_ios": 0,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": dict(_EMPTY_LAT),
        "clat_ns": dict(_EMPTY_LAT),
        "lat_ns": dict(_EMPTY_LAT),
        **_rates_json(SampleStats(), SampleStats(), 0.0),
    }


def _job_json(r: JobResult, options: dict[str, str], group_bw: dict[str, float]) -> dict[str, Any]:
    error = 0 if r.error is None else (_EILSEQ if r.verify_failed else _EIO)
    job: dict[str, Any] = {
        "jobname": r.name,
        "groupid": 0,
        "error": error,
        "elapsed": round(r.elapsed),
        "job options": {"name": r.name, **options},
        "read": _dir_json(r, "read", group_bw["read"]),
        "write": _dir_json(r, "write", group_bw["write"]),
        "trim": _empty_dir(),
        "job_runtime": round(r.elapsed * 1000),
        "usr_cpu": r.cpu.usr_percent,
        "sys_cpu": r.cpu.sys_percent,
        "ctx": r.cpu.ctx,
        "majf": r.cpu.majf,
        "minf": r.cpu.minf,
    }
    if r.error is not None:
        job["pynvmf_error"] = r.error
    if r.copy is not None:
        c = r.copy
        elapsed = r.elapsed or 1e-9
        job["pynvmf_copy"] = {
            "copies": c.copies,
            "copies_per_sec": c.copies / elapsed,
            "copied_bytes": c.copied_bytes,
            "copied_bytes_per_sec": c.copied_bytes / elapsed,
            "offloaded_blocks": c.offloaded_blocks,
            "emulated_blocks": c.emulated_blocks,
            "copy_commands": c.commands,
            "wire_bytes_sent": c.wire_sent,
            "wire_bytes_received": c.wire_received,
        }
    return job


def fio_json(
    results: Sequence[JobResult], options: dict[str, str], *, group: bool
) -> dict[str, Any]:
    now = time.time()
    jobs = [aggregate(results)] if group else list(results)
    # All jobs form fio's group 0, reported jointly or not.
    group_bw = {which: group_bandwidth(results, which) for which in ("read", "write")}
    return {
        "fio version": FIO_VERSION,
        "timestamp": int(now),
        "timestamp_ms": int(now * 1000),
        "time": time.ctime(now),
        "jobs": [_job_json(r, options, group_bw) for r in jobs],
    }


# -- human output ------------------------------------------------------------------------------


def _num(value: float) -> str:
    """fio's short counts: 950, 12.3k, 1.23M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def _binary(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def _decimal(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def _lat_lines(stats: LatencyStats, hist: LatencyHistogram) -> list[str]:
    return [
        f"    lat (usec): min={stats.min_us:.2f}, max={stats.max_us:.2f}, "
        f"avg={stats.mean_us:.2f}, stdev={stddev_ns(hist) / 1e3:.2f}",
        f"    lat percentiles (usec): 50.00th=[{stats.p50_us:.1f}], "
        f"90.00th=[{stats.p90_us:.1f}], 99.00th=[{stats.p99_us:.1f}], "
        f"99.90th=[{stats.p999_us:.1f}]",
    ]


def rate_lines(bw: SampleStats, iops: SampleStats, share: float) -> list[str]:
    """fio's per-interval lines of one direction; none for a statistic without samples."""
    lines = []
    if bw.samples:
        # fio switches to MiB/s above 1 GiB/s, min and max truncated to whole MiB/s.
        unit, scale = ("MiB", 1024) if bw.mean > 1024 * 1024 else ("KiB", 1)
        lines.append(
            f"   bw ({unit:>5}/s): min={bw.min_val // scale:5d}, max={bw.max_val // scale:5d}, "
            f"per={share:3.2f}%, avg={bw.mean / scale:5.2f}, stdev={bw.stddev / scale:5.2f}, "
            f"samples={bw.samples}"
        )
    if iops.samples:
        lines.append(
            f"   iops        : min={iops.min_val:5d}, max={iops.max_val:5d}, "
            f"avg={iops.mean:5.2f}, stdev={iops.stddev:5.2f}, samples={iops.samples}"
        )
    return lines


def _cpu_line(cpu: CpuUsage) -> str:
    return (
        f"  cpu          : usr={cpu.usr_percent:.2f}%, sys={cpu.sys_percent:.2f}%, "
        f"ctx={cpu.ctx}, majf={cpu.majf}, minf={cpu.minf}"
    )


def _job_block(r: JobResult, plan: _Plan, jobs: int, group_bw: dict[str, float]) -> list[str]:
    lines = _io_lines(r, plan, jobs, group_bw)
    lines.append(_cpu_line(r.cpu))
    return lines


def _io_lines(r: JobResult, plan: _Plan, jobs: int, group_bw: dict[str, float]) -> list[str]:
    err = 0 if r.error is None else (_EILSEQ if r.verify_failed else _EIO)
    lines = [f"{r.name}: (groupid=0, jobs={jobs}): err={err:2d}"]
    ms = round(r.elapsed * 1000)
    if r.copy is not None:
        c = r.copy
        per_s = c.copied_bytes / r.elapsed if r.elapsed else 0.0
        rate = c.copies / r.elapsed if r.elapsed else 0.0
        lines.append(
            f"  copy: copies/s={_num(rate)}, BW={_binary(per_s)}/s ({_decimal(per_s)}/s)"
            f"({_binary(c.copied_bytes)}/{ms}msec), {plan.copy_ranges} x {_binary(plan.bs)} "
            f"per copy, mode={plan.copy_mode}"
        )
        lines.extend(_lat_lines(r.write_hist.stats(), r.write_hist))
        bw, iops = r.rates("write")
        lines.extend(rate_lines(bw, iops, bw_share(bw, group_bw["write"])))
        wire = c.wire_sent + c.wire_received
        share = wire / c.copied_bytes * 100 if c.copied_bytes else 0.0
        lines.append(
            f"    planner: offloaded={c.offloaded_blocks} blocks in {c.commands} Copy commands,"
            f" emulated={c.emulated_blocks} blocks"
        )
        lines.append(
            f"    wire: sent={_binary(c.wire_sent)}, received={_binary(c.wire_received)} "
            f"({share:.2f}% of the bytes copied)"
        )
        return lines
    for which, hist in (("read", r.read_hist), ("write", r.write_hist)):
        op = r.op(which)
        if not op.ios:
            continue
        bw = op.bytes / r.elapsed if r.elapsed else 0.0
        lines.append(
            f"  {which}: IOPS={_num(op.iops)}, BW={_binary(bw)}/s ({_decimal(bw)}/s)"
            f"({_binary(op.bytes)}/{ms}msec)"
        )
        lines.extend(_lat_lines(op.latency, hist))
        bw, iops = r.rates(which)
        lines.extend(rate_lines(bw, iops, bw_share(bw, group_bw[which])))
    return lines


def human_report(results: Sequence[JobResult], plan: _Plan) -> str:
    lines: list[str] = []
    total = aggregate(results)
    group_bw = {which: group_bandwidth(results, which) for which in ("read", "write")}
    if len(results) > 1:
        for r in results:
            lines.extend(_job_block(r, plan, 1, group_bw))
        lines.append("")
    block = _job_block(total, plan, len(results), group_bw)
    block[0] = block[0].replace(total.name, "all jobs", 1)
    lines.extend(block)
    lines.append("")
    lines.append("Run status group 0 (all jobs):")
    ms = round(total.elapsed * 1000)
    write_label = "COPY" if total.copy is not None else "WRITE"
    for which, label in (("read", "READ"), ("write", write_label)):
        op = total.op(which)
        if not op.ios:
            continue
        bw = op.bytes / total.elapsed if total.elapsed else 0.0
        lines.append(
            f"  {label:>5}: bw={_binary(bw)}/s ({_decimal(bw)}/s), io={_binary(op.bytes)} "
            f"({_decimal(op.bytes)}), run={ms}-{ms}msec"
        )
    return "\n".join(lines) + "\n"
