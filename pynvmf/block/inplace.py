"""InPlace: a whole Read, Write or one-range Copy of a memory device done at once, on
its mapping.

A Read's data is a copy of the blocks taken at once (one memcpy), or a view of the
mapping lent (`lend_now`) to a consumer that hands it to the kernel before anything else
runs. A view read by the socket later, after a Write to the same blocks (a later command
of the same batch, another connection) changed them, would carry bytes that no longer
match the data digest computed with the PDU, and a block could leave half old and half
new. So every view lent is recorded (`Loans`), and before this memory changes (a Write,
zeroes, a Copy into it, a new mapping, the device closing) every consumer still holding
one is told to copy it (`Loans.recall`): the bytes sent are those of the Read's moment
either way. A copy costs little more than making a view at 4 KiB (a view and its
read-only wrapper are two objects; the copy is one, and a memcpy), so only large Reads
are lent; at 128 KiB the memcpy is a sixth of the target's time (docs/performance.md).
Where other processes map the same memory (`--cores`), nothing is lent (their Writes
cannot recall it), and every copy also holds the stripes it touches
(block/range_locks.py), so a block is wholly from before or wholly from after any Write,
as Identify's AWUN/AWUPF (one block) promise.

The target's hot path (target/io.py `IoHandler.submit`) calls these for every Read and
in-capsule Write to a memory namespace, and the copy planner's `copy_one_range_now`
(block/copy.py) for a single-range Copy inside one. They live in a class of their own, apart
from MemoryDevice, so that the compiled build (docs/performance.md) can compile them
(MemoryDevice is subclassed by interpreted classes, which a compiled class does not
allow): a call to an interpreted method costs more than the copy of a 4 KiB block.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

from pynvmf.block.range_locks import RangeLocks

Buffer = bytes | bytearray | memoryview


class Loans:
    """The views of memory (`InPlace.lend_now`) one consumer holds: a connection's output
    until its transport hands it to the kernel. `copy_out` replaces every view the
    consumer still holds by a copy of its bytes; the consumer calls `returned` once it
    holds none (handed to the kernel, or copied)."""

    __slots__ = ("_copy_out", "lenders", "lent", "recalled")

    def __init__(self, copy_out: Callable[[], None]) -> None:
        self._copy_out = copy_out
        # The InPlaces this consumer holds views of (usually one).
        self.lenders: list[InPlace] = []
        # Views lent, and times the consumer had to copy them (recall).
        self.lent = 0
        self.recalled = 0

    def recall(self) -> None:
        """A lender's memory is about to change: copy what was lent, now."""
        self.recalled += 1
        self._copy_out()
        self.returned()

    def returned(self) -> None:
        """The consumer holds no view any more."""
        for lender in self.lenders:
            lender.loans.remove(self)
        self.lenders.clear()


class InPlace:
    """Reads, writes and copies of `mapping` (the device's whole mmap; `view` a
    memoryview of it) in blocks of 1 << `shift` bytes. `reads` / `writes` / `copies`
    False where the device wants its own read, write or copy_within called for every I/O
    (a subclass that overrides it): the target's hot path and the copy planner then
    leave it alone (copy_within itself is also MemoryDevice's, so it ignores `copies`)."""

    __slots__ = ("copies", "loans", "locks", "mapping", "reads", "shift", "size", "view", "writes")

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
        # The consumers holding views of the mapping (lend_now): recalled before it changes.
        self.loans: list[Loans] = []

    def changing(self) -> None:
        """The memory is about to change: every consumer copies what it was lent first."""
        loans = self.loans
        while loans:
            loans[-1].recall()  # removes itself from every lender's loans

    def retire(self) -> None:
        """The device no longer does I/O through this (its memory mapped again, or
        closed): every call refuses from now on, so that a table that still holds it
        (the target's fast-path table, until the Target refreshes it) sends the command
        to the device's own methods, which know the new size."""
        if self.loans:
            self.changing()
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

    def lend_now(self, lba: int, nblocks: int, length: int, loans: Loans) -> memoryview | None:
        """A view of the `nblocks` blocks at `lba`, lent to `loans`' consumer, which hands it
        to the kernel before anything else runs or copies it when recalled; None if the
        range is not inside the device or is not `length` bytes long, or if other processes
        map this memory (the caller then copies: read_now)."""
        shift = self.shift
        off = lba << shift
        end = off + (nblocks << shift)
        if (
            not self.reads
            or self.locks is not None
            or end - off != length
            or lba < 0
            or end > self.size
        ):
            return None
        lenders = loans.lenders
        if self not in lenders:
            lenders.append(self)
            self.loans.append(loans)
        loans.lent += 1
        return self.view[off:end]

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
        if self.loans:
            self.changing()
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
        if self.loans:
            self.changing()
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
