"""A fio-like load generator for any BlockDevice, a remote NVMe/TCP namespace above all.

`run_workload(device, Workload(rw="randrw", bs=4096, iodepth=32, rwmixread=70))`
keeps `iodepth` I/Os in flight (one asyncio task per slot, each issuing its next
I/O as soon as the previous one completes), runs `ramp_time` seconds unmeasured
and then `runtime` seconds measured, and returns IOPS, MB/s and the latency
distribution for reads and writes separately. `run_remote()` connects first;
`run_interleaved()` compares several devices fairly on a busy machine by taking
turns in short slices, and `merge_results()` adds runs up.

The per-I/O path is kept short, since on one core the generator competes with
the host library for the CPU: buffers are preallocated per slot, offsets and
the read/write choice come from tables made before the clock starts, time is
`perf_counter_ns` (an int, no float rounding), and each latency goes into a
fixed-size log-linear histogram (an index computation and a list increment),
so memory does not grow with the run time and the run needs no sorting at the
end. Percentiles are therefore within 0.4% (half a bucket) of the exact value;
min, max and mean are exact.

Bandwidth and IOPS are also sampled per interval, as fio does (`bw_avg_time`,
`iops_avg_time`, 0.5 s by default): the coroutine that waits for the end of the
measurement wakes at each interval's end and reads the histograms' counts (the
I/O path does nothing more for it), and each sample is what completed since the
previous one over the time actually elapsed (`RateSampler`). Only intervals that
lie wholly within the measured window give samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import resource
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

from pynvmf.block.device import BlockDevice
from pynvmf.host import RemoteNamespace, connect

RW_MODES = ("read", "write", "randread", "randwrite", "rw", "randrw")
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

# Offsets and read/write choices are drawn from tables this long (a power of two,
# indexed with a mask): long enough that the pattern does not matter, small enough
# to build in a few milliseconds.
_TABLE_LEN = 1 << 16
# A device whose I/O never suspends (a memory device) would never let the event loop
# run the timer that ends the run; a worker yields once per this many I/Os.
_YIELD_MASK = 255
# The measuring wait wakes at least this often, to notice an error that stopped the workers.
_POLL = 0.05
# A sampling timer that fires a hair early still takes its sample (fio's LOG_MSEC_SLACK):
# event loops round their timeouts to the millisecond.
_SAMPLE_SLACK = 0.001


@dataclass(frozen=True, slots=True)
class Workload:
    """What to run, named as fio names it.

    `rw`: read | write (sequential), randread | randwrite, rw | randrw (mixed,
    `rwmixread` percent reads). `bs` bytes per I/O (a multiple of the device's block
    size). `size` bytes of the device starting at `offset` form the region I/O goes
    to (None: up to the end); random offsets are multiples of `bs`. `seed` makes
    the offset and mix tables reproducible. `bw_avg_time` and `iops_avg_time` are
    the intervals (seconds; fio's bwavgtime and iopsavgtime, in ms there) at which
    bandwidth and IOPS are sampled during the measurement.
    """

    rw: str = "randread"
    bs: int = 4096
    iodepth: int = 1
    rwmixread: int = 50
    runtime: float = 3.0
    ramp_time: float = 0.5
    size: int | None = None
    offset: int = 0
    seed: int = 0
    bw_avg_time: float = 0.5
    iops_avg_time: float = 0.5

    def __post_init__(self) -> None:
        if self.rw not in RW_MODES:
            raise ValueError(f"rw must be one of {', '.join(RW_MODES)}, not {self.rw!r}")
        if self.bs <= 0:
            raise ValueError("bs must be positive")
        if self.iodepth < 1:
            raise ValueError("iodepth must be at least 1")
        if not 0 <= self.rwmixread <= 100:
            raise ValueError("rwmixread is a percentage (0-100)")
        if self.runtime <= 0 or self.ramp_time < 0:
            raise ValueError("runtime must be positive and ramp_time not negative")
        if self.offset < 0 or (self.size is not None and self.size <= 0):
            raise ValueError("offset must not be negative, size must be positive")
        for interval in (self.bw_avg_time, self.iops_avg_time):
            if not (interval > 0 and math.isfinite(interval)):
                raise ValueError("bw_avg_time and iops_avg_time must be positive")

    @property
    def random(self) -> bool:
        return self.rw.startswith("rand")

    @property
    def read_fraction(self) -> float:
        """The share of I/Os that are reads."""
        base = self.rw.removeprefix("rand")
        if base == "read":
            return 1.0
        if base == "write":
            return 0.0
        return self.rwmixread / 100

    def describe(self) -> str:
        """E.g. "4k randrw 70/30 QD32"."""
        size = f"{self.bs // 1024}k" if self.bs % 1024 == 0 else f"{self.bs}b"
        mix = ""
        if self.rw in ("rw", "randrw"):
            mix = f" {self.rwmixread}/{100 - self.rwmixread}"
        return f"{size} {self.rw}{mix} QD{self.iodepth}"


# -- latency ---------------------------------------------------------------------------------

# Log-linear buckets: values below 2**_SUB_BITS+1 ns have a bucket each; above, every
# power of two is split into 2**_SUB_BITS buckets (a relative width of at most 1/128).
_SUB_BITS = 7
_EXACT = 1 << (_SUB_BITS + 1)  # 256
_BUCKETS = (64 - _SUB_BITS + 1) << _SUB_BITS


def bucket_index(ns: int) -> int:
    """The histogram bucket of a latency (the hot loop inlines this)."""
    shift = ns.bit_length() - _SUB_BITS - 1
    return ns if shift <= 0 else (shift << _SUB_BITS) + (ns >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) of the latencies (ns) that land in bucket `index`."""
    if index < _EXACT:
        return index, index + 1
    shift = (index >> _SUB_BITS) - 1
    low = (index - (shift << _SUB_BITS)) << shift
    return low, low + (1 << shift)


class LatencyHistogram:
    """Latencies in nanoseconds: counts per log-linear bucket, and the exact sum, min and max."""

    __slots__ = ("counts", "max_ns", "min_ns", "total_ns")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total_ns = 0
        self.min_ns = 1 << 63
        self.max_ns = 0

    def record(self, ns: int) -> None:
        self.counts[bucket_index(ns)] += 1
        self.total_ns += ns
        if ns < self.min_ns:
            self.min_ns = ns
        if ns > self.max_ns:
            self.max_ns = ns

    def reset(self) -> None:
        """Forget everything, in place (the workers hold a reference to `counts`)."""
        self.counts[:] = [0] * _BUCKETS
        self.total_ns = 0
        self.min_ns = 1 << 63
        self.max_ns = 0

    def copy(self) -> LatencyHistogram:
        other = LatencyHistogram()
        other.counts = list(self.counts)
        other.total_ns, other.min_ns, other.max_ns = self.total_ns, self.min_ns, self.max_ns
        return other

    def merge(self, other: LatencyHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total_ns += other.total_ns
        self.min_ns = min(self.min_ns, other.min_ns)
        self.max_ns = max(self.max_ns, other.max_ns)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """The latency (ns) below which q percent of the samples lie, for each q: the
        midpoint of the bucket holding that sample, kept within [min, max]."""
        total = self.count
        if not total:
            return [0.0 for _ in qs]
        wanted = sorted((max(1, -(-q * total // 100)), i) for i, q in enumerate(qs))
        out = [0.0] * len(qs)
        seen = 0
        k = 0
        for index, n in enumerate(self.counts):
            if not n:
                continue
            seen += n
            while k < len(wanted) and wanted[k][0] <= seen:
                low, high = bucket_bounds(index)
                value = min(max((low + high - 1) / 2, self.min_ns), self.max_ns)
                out[wanted[k][1]] = float(value)
                k += 1
            if k == len(wanted):
                break
        return out

    def stats(self) -> LatencyStats:
        n = self.count
        if not n:
            return LatencyStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p90, p99, p999 = self.percentiles(PERCENTILES)
        return LatencyStats(
            count=n,
            min_us=self.min_ns / 1e3,
            mean_us=self.total_ns / n / 1e3,
            max_us=self.max_ns / 1e3,
            p50_us=p50 / 1e3,
            p90_us=p90 / 1e3,
            p99_us=p99 / 1e3,
            p999_us=p999 / 1e3,
        )


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Completion latency, submission to completion as the caller sees it, in µs."""

    count: int
    min_us: float
    mean_us: float
    max_us: float
    p50_us: float
    p90_us: float
    p99_us: float
    p999_us: float


# -- CPU usage ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuUsage:
    """What this process used over a window of `wall` seconds, from getrusage(RUSAGE_SELF):
    fio's per-job cpu figures (usr_cpu, sys_cpu, ctx, majf, minf).

    It is the whole process's usage, every thread included: fio measures each job's own
    thread or process, but jobs running in one event loop share one thread and no
    finer account of the CPU exists. Usages of disjoint windows add up (`+`).
    """

    wall: float = 0.0
    user: float = 0.0  # CPU seconds in user mode
    system: float = 0.0  # CPU seconds in the kernel
    ctx: int = 0  # context switches, voluntary and involuntary (fio adds both up)
    majf: int = 0  # page faults that needed I/O
    minf: int = 0  # page faults that did not

    @property
    def usr_percent(self) -> float:
        """User CPU time in percent of the wall time (fio's usr_cpu)."""
        return self.user / self.wall * 100 if self.wall > 0 else 0.0

    @property
    def sys_percent(self) -> float:
        """System CPU time in percent of the wall time (fio's sys_cpu)."""
        return self.system / self.wall * 100 if self.wall > 0 else 0.0

    def __add__(self, other: CpuUsage) -> CpuUsage:
        return CpuUsage(
            wall=self.wall + other.wall,
            user=self.user + other.user,
            system=self.system + other.system,
            ctx=self.ctx + other.ctx,
            majf=self.majf + other.majf,
            minf=self.minf + other.minf,
        )


def rusage() -> resource.struct_rusage:
    """This process's resource usage so far (the start or end of a CpuUsage window)."""
    return resource.getrusage(resource.RUSAGE_SELF)


def cpu_usage(start: resource.struct_rusage, end: resource.struct_rusage, wall: float) -> CpuUsage:
    """The usage between two `rusage()` samples taken `wall` seconds apart."""
    return CpuUsage(
        wall=wall,
        user=end.ru_utime - start.ru_utime,
        system=end.ru_stime - start.ru_stime,
        ctx=end.ru_nvcsw + end.ru_nivcsw - start.ru_nvcsw - start.ru_nivcsw,
        majf=end.ru_majflt - start.ru_majflt,
        minf=end.ru_minflt - start.ru_minflt,
    )


# -- per-interval rates ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateSamples:
    """One direction's bandwidth (KiB/s) and IOPS over each sampling interval of a measured
    window, as fio samples them: whole numbers, truncated."""

    bw: tuple[int, ...] = ()
    iops: tuple[int, ...] = ()

    def __add__(self, other: RateSamples) -> RateSamples:
        """The samples of two windows (disjoint ones: slices of a run)."""
        return RateSamples(self.bw + other.bw, self.iops + other.iops)


@dataclass(frozen=True, slots=True)
class SampleStats:
    """fio's summary of a series of samples (its io_stat): their number, min, max, mean,
    and `ss`, the sum of the squared deviations from the mean."""

    samples: int = 0
    min_val: int = 0
    max_val: int = 0
    mean: float = 0.0
    ss: float = 0.0

    @classmethod
    def of(cls, values: Sequence[int]) -> SampleStats:
        """The summary of `values` (all zero for none, as fio prints it)."""
        if not values:
            return cls()
        mean = sum(values) / len(values)
        ss = math.fsum((v - mean) ** 2 for v in values)
        return cls(len(values), min(values), max(values), mean, ss)

    @property
    def stddev(self) -> float:
        """The sample standard deviation (divided by n - 1), as fio's."""
        return math.sqrt(self.ss / (self.samples - 1)) if self.samples > 1 else 0.0

    def group_sum(self, other: SampleStats) -> SampleStats:
        """fio's group_reporting sum of two jobs' bandwidth (or IOPS) statistics: what a
        job without samples lacks is ignored; otherwise min, max, mean, ss and the sample
        counts add up, so the mean is the group's, and min and max are bounds of the
        group's extremes (the sums of the jobs' own) rather than those of any interval."""
        if not other.samples:
            return self
        if not self.samples:
            return other
        return SampleStats(
            samples=self.samples + other.samples,
            min_val=self.min_val + other.min_val,
            max_val=self.max_val + other.max_val,
            mean=self.mean + other.mean,
            ss=self.ss + other.ss,
        )


class _Track:
    """One kind of sample (bandwidth or IOPS) on its own interval, for both directions."""

    __slots__ = ("due", "interval", "last", "last_time", "scale", "start", "values")

    def __init__(self, interval: float, scale: tuple[float, float]) -> None:
        self.interval = interval
        self.scale = scale  # what one completed I/O counts for, per direction
        self.start = self.last_time = 0.0
        self.due = math.inf  # nothing is due before start()
        self.last = (0, 0)
        self.values: tuple[list[int], list[int]] = ([], [])

    def begin(self, now: float, done: tuple[int, int]) -> None:
        self.start = self.last_time = now
        self.due = now + self.interval
        self.last = done
        self.values = ([], [])

    def sample(self, now: float, done: tuple[int, int]) -> None:
        spent = now - self.last_time
        for d in (0, 1):
            delta = done[d] - self.last[d]
            # fio's rule: a direction that completed nothing in the interval gets no sample
            # (a read-only run has no write samples rather than zeros).
            if delta and spent > 0:
                self.values[d].append(int(delta * self.scale[d] / spent))
        self.last_time, self.last = now, done
        # The next point of the grid from the start, past any the loop overslept: no drift,
        # and a stall longer than an interval makes one longer sample rather than several.
        k = math.floor((now + _SAMPLE_SLACK - self.start) / self.interval) + 1
        self.due = self.start + k * self.interval


class RateSampler:
    """Per-interval bandwidth and IOPS of a measured window, from cumulative counters.

    `completed()` returns the I/Os completed so far, reads and writes; `bytes_per_io`
    the bytes one of each moves. `start(now)` opens the window; `poll(now)`, called
    whenever convenient (see `sleep_sampling`), takes each sample that has fallen due:
    per direction, the bytes (or I/Os) completed since the previous sample over the
    time actually elapsed since it. Bandwidth samples fall every `bw_interval`
    seconds from the start, IOPS samples every `iops_interval`. An interval still
    running when the window ends gives no sample: whoever ends the window polls at
    its end, so that a sample due exactly then counts.
    """

    def __init__(
        self,
        completed: Callable[[], tuple[int, int]],
        bytes_per_io: tuple[int, int],
        *,
        bw_interval: float,
        iops_interval: float,
    ) -> None:
        self._completed = completed
        self._bw = _Track(bw_interval, (bytes_per_io[0] / 1024, bytes_per_io[1] / 1024))
        self._iops = _Track(iops_interval, (1.0, 1.0))

    def start(self, now: float) -> None:
        """Open the window at `now` (perf_counter seconds), counting from what has completed."""
        done = self._completed()
        self._bw.begin(now, done)
        self._iops.begin(now, done)

    @property
    def next_due(self) -> float:
        """When the next sample falls due (perf_counter seconds)."""
        return min(self._bw.due, self._iops.due)

    def poll(self, now: float) -> None:
        """Take the samples due by `now` (perf_counter seconds)."""
        done: tuple[int, int] | None = None
        for track in (self._bw, self._iops):
            if now >= track.due - _SAMPLE_SLACK:
                if done is None:
                    done = self._completed()
                track.sample(now, done)

    def samples(self) -> tuple[RateSamples, RateSamples]:
        """The samples taken so far: reads', writes'."""
        bw, iops = self._bw.values, self._iops.values
        return (
            RateSamples(tuple(bw[0]), tuple(iops[0])),
            RateSamples(tuple(bw[1]), tuple(iops[1])),
        )


async def sleep_sampling(
    sampler: RateSampler,
    start: float,
    seconds: float,
    stop: asyncio.Event | None,
    stopped: Callable[[], bool],
) -> None:
    """Wait until `seconds` after `start` (perf_counter seconds), taking `sampler`'s samples
    as they fall due; return early once `stopped()` is true or `stop` is set. The caller
    then polls the sampler once more, at the time it ends the window."""
    deadline = start + seconds
    while not stopped() and not (stop is not None and stop.is_set()):
        now = time.perf_counter()
        sampler.poll(now)
        left = deadline - now
        if left <= 0:
            return
        await sleep_unless_set(min(left, _POLL, max(0.0, sampler.next_due - now)), stop)


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpResult:
    """One direction (reads, writes, or both) over the measured window."""

    ios: int
    bytes: int
    iops: float
    mbps: float  # 10^6 bytes per second, as fio's MB/s
    latency: LatencyStats


@dataclass(frozen=True, slots=True)
class BenchResult:
    workload: Workload
    elapsed: float  # seconds measured
    read: OpResult
    write: OpResult
    total: OpResult
    host_cpu: float  # CPU time of this process over the window, in CPUs (1.0 = one core)
    target_cpu: float | None  # the same for the target, when a clock for it was given
    # Busy time of the CPUs the benchmark uses, by anyone, when a clock for it was given:
    # what neither the host nor the target used is other work disturbing the measurement.
    system_cpu: float | None
    errors: int
    error: str | None  # the first error, if any (the run stops at the first one)
    # The raw latencies, so that results can be merged (merge_results).
    read_latency: LatencyHistogram
    write_latency: LatencyHistogram
    cpu: CpuUsage  # this process's usage over the measured window, as fio reports it
    # Bandwidth and IOPS per sampling interval (Workload.bw_avg_time, iops_avg_time).
    read_rates: RateSamples = RateSamples()
    write_rates: RateSamples = RateSamples()

    @property
    def iops(self) -> float:
        return self.total.iops

    @property
    def mbps(self) -> float:
        return self.total.mbps

    @property
    def other_cpu(self) -> float | None:
        """CPU load on the benchmark's CPUs that was neither the host nor the target."""
        if self.system_cpu is None or self.target_cpu is None:
            return None
        return max(0.0, self.system_cpu - self.host_cpu - self.target_cpu)


def _result(
    workload: Workload,
    elapsed: float,
    reads: LatencyHistogram,
    writes: LatencyHistogram,
    *,
    host_cpu: float,
    target_cpu: float | None,
    system_cpu: float | None,
    errors: int,
    error: str | None,
    cpu: CpuUsage,
    read_rates: RateSamples,
    write_rates: RateSamples,
) -> BenchResult:
    both = reads.copy()
    both.merge(writes)
    bs = workload.bs
    return BenchResult(
        workload=workload,
        elapsed=elapsed,
        read=_op_result(reads, bs, elapsed),
        write=_op_result(writes, bs, elapsed),
        total=_op_result(both, bs, elapsed),
        host_cpu=host_cpu,
        target_cpu=target_cpu,
        system_cpu=system_cpu,
        errors=errors,
        error=error,
        read_latency=reads,
        write_latency=writes,
        cpu=cpu,
        read_rates=read_rates,
        write_rates=write_rates,
    )


def merge_results(results: Sequence[BenchResult]) -> BenchResult:
    """One result from runs of the same workload (e.g. slices of a run interleaved with
    other runs): I/Os and time add up, latency distributions merge, CPU loads average
    weighted by time, CPU usages and per-interval samples (of disjoint windows) add up."""
    if not results:
        raise ValueError("no results to merge")
    elapsed = sum(r.elapsed for r in results)
    reads, writes = LatencyHistogram(), LatencyHistogram()
    for r in results:
        reads.merge(r.read_latency)
        writes.merge(r.write_latency)

    def weighted(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        if len(known) != len(values):
            return None
        return sum(v * r.elapsed for v, r in zip(known, results, strict=True)) / elapsed

    host = weighted([r.host_cpu for r in results])
    assert host is not None
    return _result(
        results[0].workload,
        elapsed,
        reads,
        writes,
        host_cpu=host,
        target_cpu=weighted([r.target_cpu for r in results]),
        system_cpu=weighted([r.system_cpu for r in results]),
        errors=sum(r.errors for r in results),
        error=next((r.error for r in results if r.error), None),
        cpu=sum((r.cpu for r in results), CpuUsage()),
        read_rates=sum((r.read_rates for r in results), RateSamples()),
        write_rates=sum((r.write_rates for r in results), RateSamples()),
    )


def _op_result(hist: LatencyHistogram, bs: int, elapsed: float) -> OpResult:
    stats = hist.stats()
    # A run stopped before its measurement began measured (next to) no time, and no I/O.
    per_second = 1 / elapsed if elapsed > 0 else 0.0
    return OpResult(
        ios=stats.count,
        bytes=stats.count * bs,
        iops=stats.count * per_second,
        mbps=stats.count * bs * per_second / 1e6,
        latency=stats,
    )


# -- the generator ------------------------------------------------------------------------


class _Run:
    """The state one run's workers share."""

    def __init__(self, device: BlockDevice, w: Workload) -> None:
        caps = device.capabilities
        block = caps.block_size
        if w.bs % block:
            raise ValueError(f"bs {w.bs} is not a multiple of the block size {block}")
        if w.offset % block:
            raise ValueError(f"offset {w.offset} is not a multiple of the block size {block}")
        end = caps.size if w.size is None else w.offset + w.size
        if end > caps.size:
            raise ValueError(f"region ends at {end}, past the device's {caps.size} bytes")
        self.blocks_per_io = w.bs // block
        self.first_lba = w.offset // block
        slots = (end - w.offset) // w.bs
        if slots < 1:
            raise ValueError(f"region of {end - w.offset} bytes holds no {w.bs}-byte I/O")
        self.end_lba = self.first_lba + slots * self.blocks_per_io
        self.next_lba = self.first_lba  # the shared cursor of sequential workloads
        rng = random.Random(w.seed)
        self.offsets = [
            self.first_lba + rng.randrange(slots) * self.blocks_per_io for _ in range(_TABLE_LEN)
        ]
        fraction = w.read_fraction
        # Each entry says whether the I/O at that position is a read.
        self.reads = bytes(rng.random() < fraction for _ in range(_TABLE_LEN))
        self.read_hist = LatencyHistogram()
        self.write_hist = LatencyHistogram()
        self.stop = False
        self.errors = 0
        self.error: str | None = None
        self.device = device
        self.workload = w
        self.rng = rng

    async def worker(self, start: int) -> None:
        w = self.workload
        device = self.device
        read, write = device.read, device.write
        # Random content, so that nothing compresses or deduplicates it along the way.
        buf = memoryview(bytearray(self.rng.randbytes(w.bs)))
        offsets, reads = self.offsets, self.reads
        mask = _TABLE_LEN - 1
        sequential = not w.random
        step = self.blocks_per_io
        rhist, whist = self.read_hist, self.write_hist
        rcounts, wcounts = rhist.counts, whist.counts
        sub = _SUB_BITS
        clock = time.perf_counter_ns
        i = start
        while not self.stop:
            if sequential:
                lba = self.next_lba
                nxt = lba + step
                self.next_lba = nxt if nxt < self.end_lba else self.first_lba
            else:
                lba = offsets[i & mask]
            is_read = reads[i & mask]
            i += 1
            t0 = clock()
            try:
                if is_read:
                    await read(lba, buf)
                else:
                    await write(lba, buf)
            except Exception as exc:
                self.errors += 1
                if self.error is None:
                    self.error = f"{'read' if is_read else 'write'} at LBA {lba}: {describe(exc)}"
                self.stop = True
                return
            ns = clock() - t0
            # LatencyHistogram.record, inlined.
            if is_read:
                hist, counts = rhist, rcounts
            else:
                hist, counts = whist, wcounts
            shift = ns.bit_length() - sub - 1
            counts[ns if shift <= 0 else (shift << sub) + (ns >> shift)] += 1
            hist.total_ns += ns
            if ns < hist.min_ns:
                hist.min_ns = ns
            if ns > hist.max_ns:
                hist.max_ns = ns
            if not i & _YIELD_MASK:
                await asyncio.sleep(0)


def describe(exc: BaseException) -> str:
    """An exception in words, as a report shows it: its message, not its repr."""
    return str(exc) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class Measurement:
    """A measured window while it runs: the live latency histograms of its reads and
    writes (their counts grow as I/Os complete) from `start` (perf_counter seconds) on,
    and the process's resource usage then. What a periodic report or an interval log
    reads as the run goes."""

    start: float
    reads: LatencyHistogram
    writes: LatencyHistogram
    usage: resource.struct_rusage


async def run_workload(
    device: BlockDevice,
    workload: Workload,
    *,
    target_cpu_clock: Callable[[], float] | None = None,
    system_cpu_clock: Callable[[], float] | None = None,
    stop: asyncio.Event | None = None,
    on_measure: Callable[[Measurement], object] | None = None,
) -> BenchResult:
    """Run `workload` against `device` and measure it.

    `target_cpu_clock`, if given, returns the CPU seconds used so far by whatever
    serves the device (the target process): the result then has its CPU load too.
    `system_cpu_clock` likewise returns the busy seconds of the CPUs the benchmark
    runs on, by anyone (see target_process.busy_cpu_seconds).

    Setting `stop` ends the run early (e.g. on Ctrl-C) the way its end does: the
    result covers the time measured until then, and the I/Os in flight complete.
    `on_measure` is told the Measurement when the measured window opens.
    """
    run = _Run(device, workload)
    # Sampled from the histograms' counts: the I/O path keeps no counter for it.
    sampler = RateSampler(
        lambda: (run.read_hist.count, run.write_hist.count),
        (workload.bs, workload.bs),
        bw_interval=workload.bw_avg_time,
        iops_interval=workload.iops_avg_time,
    )
    stride = _TABLE_LEN // workload.iodepth
    tasks = [
        asyncio.create_task(run.worker(n * stride), name=f"loadgen slot {n}")
        for n in range(workload.iodepth)
    ]

    def clocks() -> tuple[float, float, float, float]:
        return (
            time.perf_counter(),
            time.process_time(),
            target_cpu_clock() if target_cpu_clock else 0.0,
            system_cpu_clock() if system_cpu_clock else 0.0,
        )

    try:
        if workload.ramp_time:
            await _sleep_unless_stopped(run, workload.ramp_time, stop)
        run.read_hist.reset()
        run.write_hist.reset()
        t0, cpu0, target0, system0 = clocks()
        usage0 = rusage()
        sampler.start(t0)
        if on_measure is not None:
            on_measure(Measurement(t0, run.read_hist, run.write_hist, usage0))
        await sleep_sampling(sampler, t0, workload.runtime, stop, lambda: run.stop)
        reads, writes = run.read_hist.copy(), run.write_hist.copy()
        t1, cpu1, target1, system1 = clocks()
        sampler.poll(t1)  # no I/O completes between the copies and this: they agree
        usage1 = rusage()
    finally:
        run.stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = t1 - t0
    per_second = 1 / elapsed if elapsed > 0 else 0.0
    read_rates, write_rates = sampler.samples()
    return _result(
        workload,
        elapsed,
        reads,
        writes,
        host_cpu=(cpu1 - cpu0) * per_second,
        target_cpu=(target1 - target0) * per_second if target_cpu_clock else None,
        system_cpu=(system1 - system0) * per_second if system_cpu_clock else None,
        errors=run.errors,
        error=run.error,
        cpu=cpu_usage(usage0, usage1, elapsed),
        read_rates=read_rates,
        write_rates=write_rates,
    )


async def run_interleaved(
    devices: Sequence[BlockDevice],
    workload: Workload,
    *,
    slices: int,
    first: int = 0,
    target_cpu_clocks: Sequence[Callable[[], float] | None] | None = None,
    system_cpu_clock: Callable[[], float] | None = None,
) -> list[BenchResult]:
    """Compare devices fairly on a busy machine: run `workload` on each device in turn,
    in `slices` slices of `workload.runtime / slices` seconds (each after its own
    `ramp_time`), rotating the order every slice (starting with device `first`), and
    merge each device's slices. Disturbances that last longer than a slice then fall
    on every device alike, instead of on whichever ran at the time.

    Returns one merged result per device, in the order of `devices`."""
    if slices < 1:
        raise ValueError("slices must be at least 1")
    clocks = list(target_cpu_clocks) if target_cpu_clocks else [None] * len(devices)
    piece = replace(workload, runtime=workload.runtime / slices)
    parts: list[list[BenchResult]] = [[] for _ in devices]
    n = len(devices)
    for k in range(slices):
        for j in range(n):
            i = (first + k + j) % n
            part = await run_workload(
                devices[i],
                piece,
                target_cpu_clock=clocks[i],
                system_cpu_clock=system_cpu_clock,
            )
            parts[i].append(part)
            if part.error:
                return [merge_results(p) if p else part for p in parts]
    return [replace(merge_results(p), workload=workload) for p in parts]


async def _sleep_unless_stopped(run: _Run, seconds: float, stop: asyncio.Event | None) -> None:
    """Sleep, waking early once an error has stopped the run or `stop` is set."""
    deadline = time.perf_counter() + seconds
    while not run.stop and not (stop is not None and stop.is_set()):
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        await sleep_unless_set(min(left, 0.05), stop)


async def sleep_unless_set(seconds: float, event: asyncio.Event | None) -> None:
    """Sleep `seconds`, or less if `event` is set meanwhile (at once if it is set)."""
    if event is None:
        await asyncio.sleep(seconds)
        return
    # Waiting on the event rather than polling it: the measured time then ends when
    # the event is set, not up to a polling interval later.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def prefill(
    device: BlockDevice, *, chunk: int = 1024 * 1024, concurrency: int = 4, seed: int = 0
) -> None:
    """Write every block once, so that reads touch real data rather than never-written
    (zero, or unmapped) blocks."""
    caps = device.capabilities
    chunk -= chunk % caps.block_size
    data = memoryview(random.Random(seed).randbytes(chunk))
    per = chunk // caps.block_size
    positions = iter(range(0, caps.num_blocks, per))

    async def writer() -> None:
        for lba in positions:
            n = min(per, caps.num_blocks - lba)
            await device.write(lba, data[: n * caps.block_size])

    await asyncio.gather(*(writer() for _ in range(concurrency)))


# -- remote namespaces ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """How to connect to the target (the arguments of pynvmf.host.connect)."""

    queues: int = 1
    # Commands in flight per I/O queue; None: enough for the largest iodepth run.
    queue_depth: int | None = None
    header_digest: bool = False
    data_digest: bool = False
    disable_sqflow: bool = False
    hostnqn: str | None = None
    timeout: float = 10.0
    # TLS 1.3 with this PSK (interchange format); ktls "off" keeps records in user space.
    tls_psk: str | None = None
    ktls: str = "auto"


@contextlib.asynccontextmanager
async def remote_namespace(
    address: str,
    port: int,
    subnqn: str,
    *,
    nsid: int = 1,
    options: ConnectOptions | None = None,
    iodepth: int = 128,
) -> AsyncIterator[RemoteNamespace]:
    """Connect, yield namespace `nsid`, disconnect. Queues are at least `iodepth` deep
    (spread over `options.queues`) unless `options.queue_depth` says otherwise."""
    options = options or ConnectOptions()
    depth = options.queue_depth or max(1, -(-iodepth // options.queues))
    async with await connect(
        address,
        port,
        subnqn,
        hostnqn=options.hostnqn,
        queues=options.queues,
        queue_depth=depth,
        header_digest=options.header_digest,
        data_digest=options.data_digest,
        disable_sqflow=options.disable_sqflow,
        timeout=options.timeout,
        tls_psk=options.tls_psk,
        ktls=options.ktls,
    ) as ctrl:
        yield ctrl.namespace(nsid)


async def run_remote(
    address: str,
    port: int,
    subnqn: str,
    workload: Workload,
    *,
    nsid: int = 1,
    options: ConnectOptions | None = None,
    target_cpu_clock: Callable[[], float] | None = None,
) -> BenchResult:
    """Connect to the target, run `workload` on namespace `nsid`, disconnect."""
    async with remote_namespace(
        address, port, subnqn, nsid=nsid, options=options, iodepth=workload.iodepth
    ) as ns:
        return await run_workload(ns, workload, target_cpu_clock=target_cpu_clock)


# -- summaries ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """Medians over repeated runs of one workload, each figure on its own (as benchmark
    tables report them); `runs` results went in."""

    runs: int
    iops: float
    mbps: float
    mean_us: float
    p99_us: float
    host_cpu: float
    target_cpu: float | None
    other_cpu: float | None  # see BenchResult.other_cpu


def summarize(results: Sequence[BenchResult]) -> Summary:
    if not results:
        raise ValueError("no results to summarize")
    target = [r.target_cpu for r in results if r.target_cpu is not None]
    other = [r.other_cpu for r in results if r.other_cpu is not None]
    return Summary(
        runs=len(results),
        iops=statistics.median(r.total.iops for r in results),
        mbps=statistics.median(r.total.mbps for r in results),
        mean_us=statistics.median(r.total.latency.mean_us for r in results),
        p99_us=statistics.median(r.total.latency.p99_us for r in results),
        host_cpu=statistics.median(r.host_cpu for r in results),
        target_cpu=statistics.median(target) if len(target) == len(results) else None,
        other_cpu=statistics.median(other) if len(other) == len(results) else None,
    )
