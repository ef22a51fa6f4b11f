"""InPlace: a whole Read, Write or one-range Copy of a memory device done at once, on
its mapping.

A Read's data is a copy of the blocks taken at once (one memcpy), never a view of the
mapping: a view would be read by the socket later, after a Write to the same blocks
(a later command of the same batch, another connection, another worker) may have
changed them, so the data digest computed with the PDU would no longer match the bytes
sent, and a block could leave half old and half new. The copy costs little more than
making the view did (a 4 KiB view and its read-only wrapper are two objects; the copy is
one, and a memcpy). Where other processes map the same memory (`--cores`), every copy
also holds the stripes it touches (block/range_locks.py), so a block is wholly from
before or wholly from after any Write, as Identify's AWUN/AWUPF (one block) promise.

The target's hot path (target/io.py `IoHandler.submit`) calls these for every Read and
in-capsule Write to a memory namespace, and the copy planner's `copy_one_range_now`
(block/copy.py) for a single-range Copy inside one. They live in a class of their own, apart
from MemoryDevice, so that the compiled build (docs/performance.md) can compile them
(MemoryDevice is subclassed by interpreted classes, which a compiled class does not
allow): a call to an interpreted method costs more than the copy of a 4 KiB block.
"""

from __future__ import annotations

import mmap

from pynvmf.block.range_locks import RangeLocks

Buffer = bytes | bytearray | memoryview


class InPlace:
    """Reads, writes and copies of `mapping` (the device's whole mmap; `view` a
    memoryview of it) in blocks of 1 << `shift` bytes. `reads` / `writes` / `copies`
    False where the device wants its own read, write or copy_within called for every I/O
    (a subclass that overrides it): the target's hot path and the copy planner then
    leave it alone (copy_within itself is also MemoryDevice's, so it ignores `copies`)."""

    __slots__ = ("copies", "locks", "mapping", "reads", "shift", "size", "view", "writes")

    def __init__(
        self,
        mapping: mmap.mmap,
        view: memoryview,
        shift: int,
        *,
        reads: bool,
        writes: bool,
        copies: bool,
        locks: RangeLocks | None = None,
    ) -> None:
        self.mapping = mapping
        # The stripes other processes mapping the same memory hold: None if none does.
        self.locks = locks
        self.view = view
        self.shift = shift
        self.size = view.nbytes
        self.reads = reads
        self.writes = writes
        self.copies = copies

    def retire(self) -> None:
        """The device no longer does I/O through this (its memory mapped again, or
        closed): every call refuses from now on, so that a table that still holds it
        (the target's fast-path table, until the Target refreshes it) sends the command
        to the device's own methods, which know the new size."""
        self.reads = self.writes = self.copies = False
        self.size = 0

    def read_now(self, lba: int, nblocks: int, length: int) -> bytes | None:
        """The `nblocks` blocks at `lba`, copied, or None if the range is not inside the
        device or is not `length` bytes long."""
        shift = self.shift
        off = lba << shift
        end = off + (nblocks << shift)
        if not self.reads or end - off != length or lba < 0 or end > self.size:
            return None
        locks = self.locks
        if locks is None:
            return self.mapping[off:end]
        locks.hold(off, end)
        try:
            return self.mapping[off:end]
        finally:
            locks.release(off, end)

    def write_now(self, lba: int, nblocks: int, data: Buffer) -> bool:
        """Copy `data` (`nblocks` blocks) to `lba`; False, touching nothing, if the range
        is not inside the device or `data` is not that long. A memoryview is of bytes, one
        dimension (what slicing a receive buffer gives), so its len() is its size: compiled,
        `isinstance(data, memoryview)` and `.nbytes` were two lookups (530 instructions)
        an in-capsule Write."""
        shift = self.shift
        off = lba << shift
        end = off + (nblocks << shift)
        n = len(data)
        if not self.writes or end - off != n or lba < 0 or end > self.size:
            return False
        # mmap slice assignment takes any contiguous buffer and does one memcpy.
        locks = self.locks
        if locks is None:
            self.mapping[off:end] = data
            return True
        locks.hold(off, end)
        try:
            self.mapping[off:end] = data
        finally:
            locks.release(off, end)
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
        src = src_lba << shift
        dst = dst_lba << shift
        locks = self.locks
        if locks is None:
            self.mapping.move(dst, src, length)
            return True
        held = locks.hold_two(src, src + length, dst, dst + length)
        try:
            self.mapping.move(dst, src, length)
        finally:
            locks.release_stripes(held)
        return True
