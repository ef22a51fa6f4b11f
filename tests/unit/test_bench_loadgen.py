"""The load generator: a short mixed run against an in-process target, and the histogram."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import resource
import statistics
import time
from collections.abc import AsyncIterator

import pytest

from pynvmf.bench import (
    ConnectOptions,
    LatencyHistogram,
    Workload,
    merge_results,
    run_interleaved,
    run_remote,
    run_workload,
)
from pynvmf.bench.loadgen import (
    CpuUsage,
    RateSampler,
    RateSamples,
    SampleStats,
    bucket_bounds,
    bucket_index,
    cpu_usage,
)
from pynvmf.block.memory import MemoryDevice
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

NQN = "nqn.2024-01.io.pynvmf.test:loadgen"


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    subsystem = Subsystem(NQN)
    device = MemoryDevice(8 * 1024 * 1024)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "memory"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    yield target
    await target.stop()


async def test_randrw_against_target(target: Target) -> None:
    w = Workload("randrw", bs=4096, iodepth=8, rwmixread=70, runtime=0.5, ramp_time=0.1)
    res = await run_remote("127.0.0.1", target.ports[0].port, NQN, w, options=ConnectOptions())
    assert res.errors == 0 and res.error is None
    assert res.read.ios > 0 and res.write.ios > 0
    assert res.total.ios == res.read.ios + res.write.ios
    assert res.read.ios / res.total.ios == pytest.approx(0.7, abs=0.07)
    assert res.total.iops == pytest.approx(res.total.ios / res.elapsed)
    assert res.total.mbps == pytest.approx(res.total.ios * 4096 / res.elapsed / 1e6)
    assert res.elapsed == pytest.approx(0.5, abs=0.2)
    for op in (res.read, res.write, res.total):
        lat = op.latency
        assert lat.count == op.ios
        assert 0 < lat.min_us <= lat.p50_us <= lat.p90_us <= lat.p99_us <= lat.p999_us
        assert lat.p999_us <= lat.max_us
        assert lat.min_us <= lat.mean_us <= lat.max_us


async def test_sequential_write_on_a_local_device() -> None:
    """A device that never suspends still ends on time (the workers yield now and then)."""
    device = MemoryDevice(1024 * 1024)
    w = Workload("write", bs=8192, iodepth=4, runtime=0.2, ramp_time=0, size=64 * 1024)
    res = await run_workload(device, w)
    assert res.errors == 0 and res.read.ios == 0 and res.write.ios > 0


async def test_an_error_stops_the_run() -> None:
    class Failing(MemoryDevice):
        async def read(self, lba: int, buf: memoryview) -> None:
            raise OSError("media error")

    res = await run_workload(Failing(1024 * 1024), Workload("randread", runtime=5, ramp_time=0))
    assert res.errors == 1 and res.error is not None and "media error" in res.error
    assert res.elapsed < 1


def test_workload_validation() -> None:
    for bad in (
        {"rw": "trim"},
        {"bs": 0},
        {"iodepth": 0},
        {"rwmixread": 101},
        {"runtime": 0},
        {"size": 0},
        {"bw_avg_time": 0},
        {"iops_avg_time": -0.5},
        {"iops_avg_time": math.inf},
    ):
        with pytest.raises(ValueError):
            Workload(**bad)  # type: ignore[arg-type]
    assert Workload("randrw", 4096, 32, rwmixread=70).describe() == "4k randrw 70/30 QD32"
    assert Workload("read").read_fraction == 1 and Workload("randwrite").read_fraction == 0


def test_histogram_buckets_are_contiguous_and_narrow() -> None:
    previous_high = 0
    for index in range(bucket_index(1 << 40)):
        low, high = bucket_bounds(index)
        assert low == previous_high
        assert high - low == 1 or (high - low) / low <= 1 / 128
        previous_high = high
    for ns in (*range(1000), *random.Random(0).choices(range(1 << 40), k=1000)):
        low, high = bucket_bounds(bucket_index(ns))
        assert low <= ns < high


def test_histogram_percentiles_match_sorting() -> None:
    rng = random.Random(1)
    samples = [int(rng.lognormvariate(11, 0.6)) for _ in range(20000)]
    hist = LatencyHistogram()
    for ns in samples:
        hist.record(ns)
    samples.sort()
    for q, got in zip((50, 90, 99, 99.9), hist.percentiles((50, 90, 99, 99.9)), strict=True):
        exact = samples[max(0, math.ceil(len(samples) * q / 100) - 1)]
        assert got == pytest.approx(exact, rel=0.005)
    stats = hist.stats()
    assert stats.count == len(samples)
    assert stats.min_us == samples[0] / 1e3 and stats.max_us == samples[-1] / 1e3
    assert stats.mean_us == pytest.approx(sum(samples) / len(samples) / 1e3)


async def test_interleaved_runs_merge_their_slices() -> None:
    devices = [MemoryDevice(1024 * 1024), MemoryDevice(1024 * 1024)]
    w = Workload("randwrite", bs=4096, iodepth=2, runtime=0.2, ramp_time=0)
    a, b = await run_interleaved(devices, w, slices=2)
    for res in (a, b):
        assert res.errors == 0 and res.workload == w
        # Each slice ran its share of the runtime (longer when a busy machine stalls it).
        assert 0.19 <= res.elapsed < 2.0
        assert res.total.ios == res.write.ios == res.write_latency.count > 0
    both = merge_results([a, b])
    assert both.total.ios == a.total.ios + b.total.ios
    assert both.elapsed == pytest.approx(a.elapsed + b.elapsed)
    # The slices' windows are disjoint: their CPU usages add up.
    assert both.cpu.wall == pytest.approx(a.cpu.wall + b.cpu.wall)
    assert both.cpu.user == pytest.approx(a.cpu.user + b.cpu.user)
    assert both.cpu.ctx == a.cpu.ctx + b.cpu.ctx
    assert both.cpu.minf == a.cpu.minf + b.cpu.minf
    assert both.write.latency.min_us == min(a.write.latency.min_us, b.write.latency.min_us)


# -- stopping early ----------------------------------------------------------------------------


class SlowDevice(MemoryDevice):
    """A MemoryDevice whose I/Os suspend once (as a remote one's do), counting the I/Os
    started and completed, and setting `stop` after `stop_after` completions."""

    def __init__(self, stop: asyncio.Event, stop_after: int) -> None:
        super().__init__(1024 * 1024)
        self.stop = stop
        self.stop_after = stop_after
        self.started = 0
        self.completed = 0

    async def _io(self) -> None:
        self.started += 1
        await asyncio.sleep(0)
        self.completed += 1
        if self.completed == self.stop_after:
            self.stop.set()

    async def read(self, lba: int, buf: memoryview) -> None:
        await self._io()
        await super().read(lba, buf)


async def test_stop_ends_the_run_early_and_lets_in_flight_ios_complete() -> None:
    stop = asyncio.Event()
    device = SlowDevice(stop, stop_after=2000)
    w = Workload("randread", bs=4096, iodepth=8, runtime=600, ramp_time=0)
    res = await asyncio.wait_for(run_workload(device, w, stop=stop), timeout=60)
    assert res.error is None
    assert res.elapsed < 30  # far below the 600 s asked for
    # The I/Os that completed before the run saw `stop` count, those in flight then do not.
    assert 2000 <= res.read.ios <= device.completed
    # The rates are over the time measured, not over the runtime asked for.
    assert res.read.iops == pytest.approx(res.read.ios / res.elapsed)
    assert res.cpu.wall == res.elapsed
    # No I/O was cancelled: each one started also completed.
    assert device.started == device.completed


async def test_stop_during_the_ramp_measures_nothing() -> None:
    stop = asyncio.Event()
    device = SlowDevice(stop, stop_after=100)
    w = Workload("randread", bs=4096, iodepth=4, runtime=600, ramp_time=600)
    res = await asyncio.wait_for(run_workload(device, w, stop=stop), timeout=60)
    assert res.error is None and res.elapsed < 30
    assert res.read.iops >= 0 and res.read.ios <= device.completed
    assert device.started == device.completed


async def test_a_set_stop_ends_the_run_at_once() -> None:
    stop = asyncio.Event()
    stop.set()
    w = Workload("randwrite", bs=4096, iodepth=2, runtime=600, ramp_time=0)
    res = await asyncio.wait_for(run_workload(MemoryDevice(1024 * 1024), w, stop=stop), 60)
    assert res.error is None and res.elapsed < 5


# -- CPU usage ---------------------------------------------------------------------------------


async def test_cpu_usage_covers_the_measured_window_only() -> None:
    # A memory device never suspends: the run keeps this process busy, in its one thread,
    # during the ramp as during the measurement. Were the ramp counted, the usage over the
    # measured time would come out well above 100%.
    w = Workload("randrw", bs=4096, iodepth=4, runtime=0.3, ramp_time=0.6)
    res = await run_workload(MemoryDevice(1024 * 1024), w)
    cpu = res.cpu
    assert cpu.wall == res.elapsed
    assert cpu.user > 0 and cpu.system >= 0
    assert 0 < cpu.usr_percent + cpu.sys_percent < 150
    assert cpu.usr_percent == pytest.approx(cpu.user / res.elapsed * 100)
    for count in (cpu.ctx, cpu.majf, cpu.minf):
        assert isinstance(count, int) and count >= 0
    # getrusage and the process CPU clock see the same CPU time.
    assert cpu.user + cpu.system == pytest.approx(res.host_cpu * res.elapsed, abs=0.05)
    assert cpu.usr_percent + cpu.sys_percent <= 100 * (os.cpu_count() or 1) + 1


_RUSAGE_FIELDS: tuple[str, ...] = resource.struct_rusage.__match_args__  # in field order


def _rusage(**values: float) -> resource.struct_rusage:
    """A getrusage() sample with the given fields (zero elsewhere)."""
    return resource.struct_rusage([values.get(name, 0) for name in _RUSAGE_FIELDS])


def test_cpu_usage_between_two_samples() -> None:
    start = _rusage(
        ru_utime=1.0, ru_stime=0.5, ru_majflt=2, ru_minflt=100, ru_nvcsw=10, ru_nivcsw=3
    )
    end = _rusage(ru_utime=1.5, ru_stime=0.6, ru_majflt=3, ru_minflt=140, ru_nvcsw=30, ru_nivcsw=8)
    usage = cpu_usage(start, end, wall=2.0)
    assert (usage.wall, usage.ctx, usage.majf, usage.minf) == (2.0, 25, 1, 40)
    assert usage.user == pytest.approx(0.5) and usage.system == pytest.approx(0.1)
    assert usage.usr_percent == pytest.approx(25.0)
    assert usage.sys_percent == pytest.approx(5.0)
    assert CpuUsage().usr_percent == 0 and CpuUsage().sys_percent == 0  # no time, no division
    twice = usage + usage
    assert (twice.wall, twice.ctx, twice.majf, twice.minf) == (4.0, 50, 2, 80)
    assert twice.usr_percent == pytest.approx(usage.usr_percent)


# -- per-interval samples ----------------------------------------------------------------------


class Completed:
    """Cumulative counters a RateSampler reads: I/Os completed, reads and writes."""

    def __init__(self) -> None:
        self.reads = 0
        self.writes = 0

    def __call__(self) -> tuple[int, int]:
        return self.reads, self.writes


def test_sampler_rates_are_over_each_interval_actually_elapsed() -> None:
    done = Completed()
    sampler = RateSampler(done, (4096, 8192), bw_interval=0.5, iops_interval=0.25)
    sampler.start(100.0)
    assert sampler.next_due == 100.25
    done.reads, done.writes = 100, 50
    sampler.poll(100.125)  # nothing due yet
    assert sampler.samples() == (RateSamples(), RateSamples())
    sampler.poll(100.25)  # IOPS due: 100 reads, 50 writes in 0.25 s
    done.reads, done.writes = 300, 100
    sampler.poll(100.5)  # both due: IOPS over the last 0.25 s, bandwidth over 0.5 s
    reads, writes = sampler.samples()
    assert reads.iops == (400, 800) and writes.iops == (200, 200)
    assert reads.bw == (300 * 4 * 2,) and writes.bw == (100 * 8 * 2,)  # KiB/s
    assert sampler.next_due == 100.75


def test_sampler_keeps_to_its_grid_and_skips_what_it_overslept() -> None:
    done = Completed()
    sampler = RateSampler(done, (1024, 1024), bw_interval=0.5, iops_interval=0.5)
    sampler.start(0.0)
    done.reads = 75
    sampler.poll(0.75)  # late: one sample over the 0.75 s elapsed, the next due at 1.0
    assert sampler.samples()[0].iops == (100,)
    assert sampler.next_due == 1.0
    done.reads = 100
    sampler.poll(1.0)  # on time again: 25 I/Os over 0.25 s
    done.reads = 400
    sampler.poll(2.5)  # a stall of several intervals makes one sample, not several
    assert sampler.samples()[0].iops == (100, 100, 200)
    assert sampler.next_due == 3.0


def test_sampler_skips_idle_directions_and_unfinished_intervals() -> None:
    done = Completed()
    sampler = RateSampler(done, (4096, 4096), bw_interval=0.5, iops_interval=0.5)
    sampler.start(10.0)
    done.reads = 10
    sampler.poll(10.4995)  # within the slack of the due time: a timer firing a hair early
    done.reads = 20
    sampler.poll(10.75)  # the window ends mid-interval: no sample for it
    reads, writes = sampler.samples()
    assert len(reads.iops) == len(reads.bw) == 1
    # As fio: a direction that completed nothing in an interval gets no sample for it.
    assert writes == RateSamples()


def test_sample_stats_are_fios() -> None:
    assert SampleStats.of([]) == SampleStats(0, 0, 0, 0.0, 0.0)
    assert SampleStats.of([]).stddev == 0.0 and SampleStats.of([7]).stddev == 0.0
    values = [3, 5, 4, 10]
    stats = SampleStats.of(values)
    assert (stats.samples, stats.min_val, stats.max_val, stats.mean) == (4, 3, 10, 5.5)
    assert stats.stddev == pytest.approx(statistics.stdev(values))  # n - 1, as fio
    # group_reporting: fio adds the jobs' figures up; a job without samples adds nothing.
    other = SampleStats.of([1, 2, 3])
    both = stats.group_sum(other)
    assert (both.samples, both.min_val, both.max_val, both.mean) == (7, 4, 13, 7.5)
    assert both.ss == pytest.approx(stats.ss + other.ss)
    assert both.stddev == pytest.approx(math.sqrt((stats.ss + other.ss) / 6))
    assert stats.group_sum(SampleStats()) == stats == SampleStats().group_sum(stats)


class PacedDevice(MemoryDevice):
    """A MemoryDevice whose reads take `fast` seconds for `fast_for` seconds after the end of
    the ramp (`ramp` seconds after the first I/O) and `slow` seconds after that; during the
    ramp they only yield, so ramp I/Os would stand out in any sample that counted them."""

    def __init__(self, ramp: float, fast_for: float, fast: float, slow: float) -> None:
        super().__init__(1024 * 1024)
        self.ramp, self.fast_for, self.fast, self.slow = ramp, fast_for, fast, slow
        self.first: float | None = None

    async def read(self, lba: int, buf: memoryview) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        since = now - self.first - self.ramp
        if since < 0:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(self.fast if since < self.fast_for else self.slow)
        await super().read(lba, buf)


async def test_samples_follow_the_devices_speed_within_the_measured_window() -> None:
    # Twenty times slower after half-way: a busy machine stretches the fast reads, not
    # enough to hide that.
    iodepth, fast, slow = 4, 0.001, 0.02
    device = PacedDevice(ramp=0.2, fast_for=0.5, fast=fast, slow=slow)
    w = Workload(
        "randread",
        bs=4096,
        iodepth=iodepth,
        runtime=1.0,
        ramp_time=0.2,
        bw_avg_time=0.25,
        iops_avg_time=0.2,
    )
    res = await run_workload(device, w)
    assert res.error is None
    rates = res.read_rates
    # At most one sample per whole interval measured (a stall of a busy machine merges
    # intervals into one sample over the time actually elapsed, so fewer is allowed).
    assert 2 <= len(rates.bw) <= res.elapsed / 0.25 + 0.01
    assert 2 <= len(rates.iops) <= res.elapsed / 0.2 + 0.01
    assert res.write_rates == RateSamples()  # no writes, no write samples (not zeros)
    iops, bw = SampleStats.of(rates.iops), SampleStats.of(rates.bw)
    for stats in (iops, bw):
        assert 0 < stats.min_val <= stats.mean <= stats.max_val
        assert stats.stddev >= 0
    # No ramp I/O (hundreds of times faster) leaked in: each slot's reads take `fast` at least.
    assert iops.max_val <= iodepth / fast * 1.1
    # The samples see the device slow down half-way: rates per interval, not running means.
    assert rates.iops[0] > 1.5 * rates.iops[-1]
    assert rates.iops[-1] <= iodepth / slow * 1.1
    # The samples account for no more I/Os than the run did (whole intervals only).
    assert sum(rates.iops) * 0.2 <= res.read.ios * 1.02


class StoppingDevice(MemoryDevice):
    """Reads take `delay` seconds; `stop` is set once `stop_after` have completed."""

    def __init__(self, stop: asyncio.Event, stop_after: int, delay: float) -> None:
        super().__init__(1024 * 1024)
        self.stop, self.stop_after, self.delay = stop, stop_after, delay
        self.completed = 0

    async def read(self, lba: int, buf: memoryview) -> None:
        await asyncio.sleep(self.delay)
        await super().read(lba, buf)
        self.completed += 1
        if self.completed == self.stop_after:
            self.stop.set()


async def test_a_run_stopped_early_keeps_the_whole_intervals_it_measured() -> None:
    stop = asyncio.Event()
    # About 0.4 s at 4 x 1 ms per read: a few 0.1 s intervals, then a stop mid-interval.
    device = StoppingDevice(stop, stop_after=1500, delay=0.001)
    w = Workload("randread", bs=4096, iodepth=4, runtime=600, ramp_time=0, iops_avg_time=0.1)
    res = await asyncio.wait_for(run_workload(device, w, stop=stop), timeout=60)
    assert res.error is None and res.elapsed < 30
    samples = res.read_rates.iops
    assert 1 <= len(samples) <= res.elapsed / 0.1 + 0.01
    # The unfinished interval gives no sample: the samples account for the I/Os of whole
    # intervals only, fewer than the run's.
    assert sum(samples) * 0.1 <= res.read.ios * 1.02
    assert len(res.read_rates.bw) <= res.elapsed / 0.5 + 0.01


async def test_a_run_shorter_than_an_interval_has_no_samples() -> None:
    w = Workload("randrw", bs=4096, iodepth=2, runtime=0.1, ramp_time=0)
    res = await run_workload(MemoryDevice(1024 * 1024), w)
    assert res.read.ios > 0 and res.write.ios > 0
    assert res.read_rates == res.write_rates == RateSamples()
    assert SampleStats.of(res.read_rates.iops) == SampleStats()


async def test_merged_results_keep_every_slices_samples() -> None:
    w = Workload("randwrite", bs=4096, iodepth=2, runtime=0.1, ramp_time=0)
    a = await run_workload(MemoryDevice(1024 * 1024), w)
    a = dataclasses.replace(a, write_rates=RateSamples((10, 20), (3,)))
    b = dataclasses.replace(a, write_rates=RateSamples((30,), (4, 5)))
    merged = merge_results([a, b])
    assert merged.write_rates == RateSamples((10, 20, 30), (3, 4, 5))
    assert merged.read_rates == RateSamples()
