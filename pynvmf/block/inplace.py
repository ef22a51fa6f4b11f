"""InPlace: a whole Read, Write or one-range Copy of a memory device done at once, on
its mapping.

The target's hot path (target/io.py `IoHandler.submit`) calls these for every Read and
in-capsule Write to a memory namespace, and the copy planner's `copy_one_range_now`
(block/copy.py) for a single-range Copy inside one. They live in a class of their own, apart
from MemoryDevice, so that the compiled build (docs/performance.md) can compile them
(MemoryDevice is subclassed by interpreted classes, which a compiled class does not
allow): a call to an interpreted method costs more than the copy of a 4 KiB block.
"""

from __future__ import annotations

import mmap

Buffer = bytes | bytearray | memoryview


class InPlace:
    """Reads, writes and copies of `mapping` (the device's whole mmap; `view` a
    memoryview of it) in blocks of 1 << `shift` bytes. `reads` / `writes` / `copies`
    False where the device wants its own read, write or copy_within called for every I/O
    (a subclass that overrides it): the target's hot path and the copy planner then
    leave it alone (copy_within itself is also MemoryDevice's, so it ignores `copies`)."""

    __slots__ = ("copies", "mapping", "reads", "shift", "size", "view", "writes")

    def __init__(
        self,
        mapping: mmap.mmap,
        view: memoryview,
        shift: int,
        *,
        reads: bool,
        writes: bool,
        copies: bool,
    ) -> None:
        self.mapping = mapping
        self.view = view
        self.shift = shift
        self.size = view.nbytes
        self.reads = reads
        self.writes = writes
        self.copies = copies

    def read_view(self, lba: int, nblocks: int, length: int) -> memoryview | None:
        """The `nblocks` blocks at `lba` as a read-only view of the mapping, or None if
        the range is not inside the device or is not `length` bytes long."""
        shift = self.shift
        off = lba << shift
        end = off + (nblocks << shift)
        if not self.reads or end - off != length or lba < 0 or end > self.size:
            return None
        return self.view[off:end].toreadonly()

    def write_now(self, lba: int, nblocks: int, data: Buffer) -> bool:
        """Copy `data` (`nblocks` blocks) to `lba`; False, touching nothing, if the range
        is not inside the device or `data` is not that long."""
        shift = self.shift
        off = lba << shift
        end = off + (nblocks << shift)
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if not self.writes or end - off != n or lba < 0 or end > self.size:
            return False
        # mmap slice assignment takes any contiguous buffer and does one memcpy.
        self.mapping[off:end] = data
        return True

    def copy_within(self, src_lba: int, dst_lba: int, nblocks: int) -> bool:
        """Copy `nblocks` blocks from `src_lba` to `dst_lba` as memmove does (overlapping
        ranges as if through a buffer); False, touching nothing, if a range is not inside
        the device."""
        shift = self.shift
        length = nblocks << shift
        last = src_lba if src_lba > dst_lba else dst_lba  # not max(): a call, compiled
        if src_lba < 0 or dst_lba < 0 or nblocks < 0 or (last << shift) + length > self.size:
            return False
        self.mapping.move(dst_lba << shift, src_lba << shift, length)
        return True
