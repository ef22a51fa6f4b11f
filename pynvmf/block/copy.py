"""The copy planner: the one place that decides, for each source range of a copy,
whether the destination device copies it natively or the data is moved by
emulation (read + write with bounded memory).

A copy takes source ranges, possibly on several devices, and writes them one
after another to consecutive blocks of one destination. Its result is defined
even when sources and the destination overlap: every source is read before any
destination block it overlaps is written (the result of reading all sources
first), so the outcome never depends on the order in which ranges are processed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pynvmf.block.device import BlockDevice, NativeCopy, check_range

EMULATION_CHUNK = 1 << 20  # bytes per read + write step of an emulated copy
EMULATION_DEPTH = 4  # chunks in flight at once: memory is DEPTH * CHUNK
STAGING_LIMIT = 64 << 20  # the most a copy may buffer to honour overlapping ranges


class CopyTooLarge(ValueError):
    """The copy's overlapping sources would need more staging memory than allowed."""


@dataclass(frozen=True, slots=True)
class SourceRange:
    device: BlockDevice
    lba: int
    nblocks: int


@dataclass(slots=True)
class CopyReport:
    """What the planner did: how many blocks each path moved."""

    native_blocks: int = 0
    emulated_blocks: int = 0
    staged_blocks: int = 0


def _overlaps(a_lba: int, a_n: int, b_lba: int, b_n: int) -> bool:
    return a_lba < b_lba + b_n and b_lba < a_lba + a_n


async def copy(
    sources: Sequence[SourceRange],
    dst: BlockDevice,
    dst_lba: int,
    *,
    fua: bool = False,
    chunk_bytes: int = EMULATION_CHUNK,
    depth: int = EMULATION_DEPTH,
    staging_limit: int = STAGING_LIMIT,
) -> CopyReport:
    """Copy `sources` in order to `dst` starting at `dst_lba`.

    Raises BlockRangeError (before anything is written) when a range lies outside
    its device, ValueError when block sizes differ, CopyTooLarge when overlapping
    ranges would need more than `staging_limit` bytes of memory.
    """
    dcaps = dst.capabilities
    bs = dcaps.block_size
    total = sum(s.nblocks for s in sources)
    check_range(dcaps, dst_lba, total)
    for s in sources:
        if s.device.capabilities.block_size != bs:
            raise ValueError("source and destination block sizes differ")
        check_range(s.device.capabilities, s.lba, s.nblocks)

    report = CopyReport()
    # Sources on the destination device that the destination range overlaps must be
    # read before anything is written; a single such range copied natively is safe
    # as it is (copy_within has memmove semantics).
    staged: dict[int, bytearray] = {}
    single_native = len(sources) == 1 and dcaps.native_copy and sources[0].device is dst
    if not single_native:
        for i, s in enumerate(sources):
            if s.device is dst and _overlaps(s.lba, s.nblocks, dst_lba, total):
                staged[i] = bytearray(s.nblocks * bs)
        if sum(len(b) for b in staged.values()) > staging_limit:
            raise CopyTooLarge("overlapping copy needs more staging memory than allowed")
        for i, buf in staged.items():
            await sources[i].device.read(sources[i].lba, memoryview(buf))
            report.staged_blocks += sources[i].nblocks

    lba = dst_lba
    for i, s in enumerate(sources):
        if i in staged:
            await dst.write(lba, staged[i])
            report.emulated_blocks += s.nblocks
        elif s.device is dst and dcaps.native_copy and isinstance(dst, NativeCopy):
            await dst.copy_within(s.lba, lba, s.nblocks)
            report.native_blocks += s.nblocks
        else:
            await _emulate(s, dst, lba, chunk_bytes, depth)
            report.emulated_blocks += s.nblocks
        lba += s.nblocks
    if fua:
        await dst.flush()
    return report


async def _emulate(
    s: SourceRange, dst: BlockDevice, dst_lba: int, chunk_bytes: int, depth: int
) -> None:
    """Read + write in chunks, `depth` of them in flight: memory stays bounded and a
    remote device sees several commands at once."""
    bs = dst.capabilities.block_size
    step = max(1, chunk_bytes // bs)
    buffers = [
        bytearray(min(step, s.nblocks) * bs) for _ in range(min(depth, 1 + s.nblocks // step))
    ]

    async def move(offset: int, buf: bytearray) -> None:
        n = min(step, s.nblocks - offset)
        view = memoryview(buf)[: n * bs]
        await s.device.read(s.lba + offset, view)
        await dst.write(dst_lba + offset, view)

    offsets = list(range(0, s.nblocks, step))
    for group in range(0, len(offsets), len(buffers)):
        batch = offsets[group : group + len(buffers)]
        await asyncio.gather(*(move(off, buf) for off, buf in zip(batch, buffers, strict=False)))
