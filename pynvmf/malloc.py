"""glibc malloc tuning for processes that allocate and free many large I/O buffers.

A read of 128 KiB or more gets a fresh buffer per command. With glibc's defaults,
buffers that size come from mmap, or from heap memory that is trimmed back to the
kernel as soon as a burst of them is freed; every new buffer then faults its pages
in again. Measured on the target: 40 µs of a 128 KiB read went to that, against
2.7 µs with the thresholds raised (docs/scaling.md). Raising them keeps freed
buffers in the heap for reuse; the memory held is bounded by the peak in flight.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20  # above MDTS (1 MiB) with room for R2T-assembled writes
TRIM_THRESHOLD = 64 << 20


def tune_for_io_buffers() -> bool:
    """Apply the thresholds; False (and nothing changed) where malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not ok:
        log.debug("mallopt refused the I/O buffer thresholds")
    return ok


def trim() -> bool:
    """Return free heap memory to the kernel (glibc's malloc_trim); False elsewhere."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(malloc_trim(0))
