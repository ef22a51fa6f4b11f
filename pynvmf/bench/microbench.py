"""Timing one function call precisely: for CRC32C and other per-PDU costs.

A timed loop calls the function many times (enough for `min_time` seconds, so
the clock's resolution does not matter) and the per-call time is the median of
several such loops (so a burst of noise from the rest of the machine does not
either). The loop's own cost is included, as it is in real callers; compare
with `call_floor()` to see it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _loop_ns(fn: Callable[[T], object], arg: T, calls: int) -> int:
    clock = time.perf_counter_ns
    rng = range(calls)
    start = clock()
    for _ in rng:
        fn(arg)
    return clock() - start


def calibrate(fn: Callable[[T], object], arg: T, min_time: float = 0.1) -> int:
    """How many calls of `fn(arg)` take about `min_time` seconds."""
    calls = 1
    while True:
        elapsed = _loop_ns(fn, arg, calls)
        if elapsed >= min_time * 1e9 / 10:
            break
        calls *= 10 if elapsed < min_time * 1e9 / 1000 else 2
    return max(1, round(calls * min_time * 1e9 / elapsed))


def ns_per_call(fn: Callable[[T], object], arg: T, calls: int) -> float:
    """One timed loop of `calls` calls: nanoseconds per call."""
    return _loop_ns(fn, arg, calls) / calls


def time_per_call(
    fn: Callable[[T], object], arg: T, *, repeats: int = 5, min_time: float = 0.1
) -> float:
    """Median nanoseconds per `fn(arg)` over `repeats` loops of about `min_time` s each.
    (To compare several functions fairly, interleave `ns_per_call` loops of each
    instead, so a burst of noise hits them all.)"""
    calls = calibrate(fn, arg, min_time)
    return statistics.median(ns_per_call(fn, arg, calls) for _ in range(repeats))


def interleaved_times(
    cells: Sequence[tuple[Callable[[Any], object], Any]],
    *,
    repeats: int = 5,
    min_time: float = 0.1,
) -> list[float]:
    """Median nanoseconds per call for each (fn, arg) cell, with the cells' timed loops
    interleaved: each round times every cell once, so that a burst of noise from the
    rest of the machine hits every cell rather than whichever ran at the time."""
    calls = [calibrate(fn, arg, min_time) for fn, arg in cells]
    samples: list[list[float]] = [[] for _ in cells]
    for _ in range(repeats):
        for (fn, arg), n, out in zip(cells, calls, samples, strict=True):
            out.append(ns_per_call(fn, arg, n))
    return [statistics.median(s) for s in samples]


def call_floor(*, repeats: int = 5, min_time: float = 0.1) -> float:
    """Nanoseconds per call of a C builtin that does nothing useful (`len`): the loop and
    call overhead every other measurement includes."""
    return time_per_call(len, b"x" * 24, repeats=repeats, min_time=min_time)


def throughput_gbps(size: int, ns_per_call: float) -> float:
    """Bytes per call over nanoseconds per call is GB/s (10^9 bytes per second)."""
    return size / ns_per_call
