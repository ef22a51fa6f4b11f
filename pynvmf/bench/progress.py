"""`pynvmf bench`'s progress line on a terminal's stderr: the percentage of --ramp-time +
--runtime gone, the time left, and the IOPS and MB/s of the last refresh (a quarter second).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TextIO

from pynvmf.bench.job_device import Counter

PROGRESS_INTERVAL = 0.25  # at most 4 refreshes a second
CLEAR_LINE = "\r\x1b[K"


async def show_progress(counters: Sequence[Counter], err: TextIO, total: float) -> None:
    """Rewrite the line every PROGRESS_INTERVAL until cancelled; `total` is --ramp-time +
    --runtime in seconds."""
    start = last_t = time.perf_counter()
    last_ios = last_bytes = 0
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL)
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
