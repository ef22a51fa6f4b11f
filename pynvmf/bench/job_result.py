"""What one `pynvmf bench` job measured (JobResult), and the group of them (aggregate)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pynvmf.bench.loadgen import (
    CpuUsage,
    LatencyHistogram,
    OpResult,
    RateSamples,
    SampleStats,
    bucket_bounds,
)


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


def rate_stats(reads: RateSamples, writes: RateSamples) -> dict[str, SampleStats]:
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
