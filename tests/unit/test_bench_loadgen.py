"""The load generator: a short mixed run against an in-process target, and the histogram."""

from __future__ import annotations

import math
import random
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
from pynvmf.bench.loadgen import bucket_bounds, bucket_index
from pynvmf.block.memory import MemoryDevice
from pynvmf.target.server import Port, Target
from pynvmf.target.subsystem import Namespace, Subsystem

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
        assert res.elapsed == pytest.approx(0.2, abs=0.05)
        assert res.total.ios == res.write.ios == res.write_latency.count > 0
    both = merge_results([a, b])
    assert both.total.ios == a.total.ios + b.total.ios
    assert both.elapsed == pytest.approx(a.elapsed + b.elapsed)
    assert both.write.latency.min_us == min(a.write.latency.min_us, b.write.latency.min_us)
