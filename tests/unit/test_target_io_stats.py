"""A subsystem's I/O counters (SMART / Health log): what a worker process takes from its
replica and the main process adds to the subsystem's own."""

from __future__ import annotations

from bisect import bisect_left

import pytest

from pynvmf.target.command_counts import BUCKETS_NS, Histogram
from pynvmf.target.subsystem import IoStats


def test_take_gives_the_counts_so_far_and_starts_again_from_zero() -> None:
    stats = IoStats(read_cmds=3, write_cmds=2, read_bytes=1536, write_bytes=1024)
    stats.copy_cmds, stats.copy_bytes = 1, 4096
    assert stats.take() == (3, 2, 1536, 1024, 1, 4096)
    assert stats == IoStats()
    stats.write_cmds += 1
    stats.write_bytes += 512
    assert stats.take() == (0, 1, 0, 512, 0, 0)


def test_add_sums_reports_in_the_order_take_gives_them() -> None:
    worker, main = IoStats(), IoStats(read_cmds=5, read_bytes=2560)
    worker.read_cmds, worker.read_bytes, worker.copy_cmds, worker.copy_bytes = 2, 1024, 1, 512
    main.add(worker.take())
    assert main == IoStats(read_cmds=7, read_bytes=3584, copy_cmds=1, copy_bytes=512)


@pytest.mark.parametrize("counts", [(0, -1, 0, 0, 0, 0), (1, 2, 3)])
def test_add_refuses_what_would_make_a_counter_shrink_or_is_not_counts(
    counts: tuple[int, ...],
) -> None:
    stats = IoStats(write_cmds=4)
    with pytest.raises(ValueError):
        stats.add(counts)
    assert stats == IoStats(write_cmds=4)


def test_a_histogram_counts_a_sample_in_the_bucket_bisect_finds() -> None:
    """Histogram.observe's tree of comparisons, against BUCKETS_NS: each bound, one
    below and above it, zero and far past the last."""
    samples = [0, 1, 10**13]
    for bound in BUCKETS_NS:
        samples += [bound - 1, bound, bound + 1]
    for ns in samples:
        histogram = Histogram()
        histogram.observe(ns)
        want = [0] * (len(BUCKETS_NS) + 1)
        want[bisect_left(BUCKETS_NS, ns)] = 1
        assert histogram.as_list() == [*want, ns], ns
    histogram = Histogram()
    for ns in samples:
        histogram.observe(ns)
    histogram.device(7)
    histogram.device(3)
    histogram.device(5)
    assert histogram.count() == len(samples)
    # A worker's report: the counts, the sum, then the device time's sum, most, least.
    assert histogram.take()[len(BUCKETS_NS) + 1 :] == [sum(samples), 15, 7, 3]
    assert histogram.as_list() == [0] * (len(BUCKETS_NS) + 2)
    assert (histogram.device_total, histogram.device_max, histogram.device_min) == (0, 0, 0)
