"""MemoryDevice: a RAM-backed block device (the benchmarks' hot path).

The storage is one private anonymous mapping, so an untouched (or deallocated)
page costs no memory and reads back as zeroes.  Note that it must be
MAP_PRIVATE: `mmap.mmap(-1, n)` defaults to MAP_SHARED, which is shmem-backed,
and MADV_DONTNEED on a shared mapping only drops the page-table entries (the data
comes back on the next access) instead of discarding the pages.

Every method is `async def` but never suspends (there is no await inside), so a
caller may drive one synchronously with `coro.send(None)`, which raises
StopIteration on completion, instead of a round trip through the event loop.
The target's hot path goes further: `read_now` and `write_now` are plain methods
that do a whole Read or Write at once (block/inplace.py: a read's data is a copy taken
at once, or a view lent to a consumer that copies it when this memory is about to change).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import replace

from pynvmf.block.device import Buffer, Capabilities, Medium, block_shift, check_range
from pynvmf.block.inplace import InPlace
from pynvmf.block.range_locks import RangeLocks

_PAGE = mmap.PAGESIZE


def _physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


_PAGE_MASK = _PAGE - 1
# Partial-page edges of a zeroed range are shorter than a page; a range that
# contains no whole page is shorter than two.  Untouched anonymous memory maps the
# shared zero page, so this buffer costs nothing resident.
_ZEROS = mmap.mmap(-1, 2 * _PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
_ZERO_VIEW = memoryview(_ZEROS)
# What a device closed while views of its memory were still being sent holds instead
# of its mapping (the mapping goes with the last of those views).
_CLOSED = mmap.mmap(-1, _PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
_CLOSED.close()


class MemoryDevice:
    """`size_bytes` of zeroed memory in blocks of `block_size` (a power of two >= 512)."""

    __slots__ = (
        "_caps",
        "_locks",
        "_map",
        "_mask",
        "_medium",
        "_shift",
        "_size",
        "_view",
        "inplace",
    )
    # How whole zeroed pages go back to the kernel: a private anonymous mapping's read back
    # as zeroes once dropped.
    _DISCARD = mmap.MADV_DONTNEED

    def __init__(self, size_bytes: int, block_size: int = 512) -> None:
        shift = block_shift(block_size)
        if not isinstance(size_bytes, int) or size_bytes <= 0 or size_bytes % block_size:
            raise ValueError(
                f"size {size_bytes!r} is not a positive multiple of the block size {block_size}"
            )
        self._shift = shift
        self._mask = block_size - 1
        self._size = size_bytes
        self._caps = Capabilities(
            block_size=block_size,
            num_blocks=size_bytes >> shift,
            volatile_write_cache=False,
            write_zeroes=True,
            deallocate=True,
            deallocated_reads_zero=True,
            native_copy=True,
        )
        try:
            self._map = mmap.mmap(-1, size_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot reserve {size_bytes} bytes of memory for the namespace "
                f"({exc.strerror}; the machine has {_physical_memory()} bytes)",
            ) from None
        self._view = memoryview(self._map)
        # No other process maps a private mapping: copies need no locks.
        self._locks: RangeLocks | None = None
        self._mapped()
        # A private mapping is no other device's storage: a key of its own. A token
        # rather than the device itself, which would make device and key a cycle.
        self._medium = Medium((object(),))

    def _mapped(self) -> None:
        """The mapping is (re)made: the target's in-place path works on it, None once the
        device is closed (the general path then reports it)."""
        cls = type(self)
        self.inplace: InPlace | None = InPlace(
            self._map,
            self._view,
            self._shift,
            reads=cls.read_now is not None,  # type: ignore[comparison-overlap]
            writes=cls.write_now is not None,  # type: ignore[comparison-overlap]
            copies=cls.copy_within is MemoryDevice.copy_within,
            locks=self._locks,
        )

    def _unmapped(self) -> None:
        """The mapping is about to change or go: the InPlace made for it refuses from now
        on (a caller that still holds it, the target's fast-path table, falls back to
        this device's own methods) and the device has none until `_mapped`."""
        if self.inplace is not None:
            self.inplace.retire()
            self.inplace = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass that overrides read or write wants it called for every I/O: the
        # target's in-place path (read_now / write_now) would go around it.
        if cls.read is not MemoryDevice.read:
            cls.read_now = None  # type: ignore[assignment]
        if cls.write is not MemoryDevice.write:
            cls.write_now = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        c = self._caps
        return f"MemoryDevice({c.size}, block_size={c.block_size})"

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def closed(self) -> bool:
        return self._map.closed

    @property
    def medium(self) -> Medium:
        """Storage of its own, shared with no other device (block.device.KnownMedium)."""
        return self._medium

    # -- size --------------------------------------------------------------------

    async def rescan(self) -> int:
        """The number of blocks: nothing outside this device changes a private mapping's
        size (block.device.Resizable)."""
        if self._map.closed:
            raise ValueError("device is closed")
        return self._caps.num_blocks

    async def grow(self, size_bytes: int) -> int:
        """Take `size_bytes` (whole blocks, at least the present size): the blocks kept,
        the new ones zeroes; the new number of blocks. ValueError, the size kept, for a
        smaller size (that is `shrink`, which drops data), one that is not whole blocks,
        or memory that cannot be had."""
        if self._map.closed:
            raise ValueError("device is closed")
        if not isinstance(size_bytes, int) or size_bytes < self._size or size_bytes & self._mask:
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of at least "
                f"{self._size} bytes"
            )
        if size_bytes > self._size:
            self._take_size(size_bytes)
        return self._caps.num_blocks

    async def serve_only(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` (whole blocks, more than none, at most the present
        size) only: the mapping is made that short (block.device.Shrinkable). The memory
        past it is given back, since no other process maps a private mapping."""
        if self._map.closed:
            raise ValueError("device is closed")
        if (
            not isinstance(size_bytes, int)
            or not 0 < size_bytes <= self._size
            or size_bytes & self._mask
        ):
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of more than 0 "
                f"and at most {self._size} bytes"
            )
        if size_bytes < self._size:
            self._take_size(size_bytes)
        return self._caps.num_blocks

    async def shrink(self, size_bytes: int) -> int:
        """`serve_only`: a private mapping is all the storage there is."""
        return await self.serve_only(size_bytes)

    def _take_size(self, size_bytes: int) -> None:
        """Map `size_bytes` and serve that many: both in one step, with no I/O between
        (every method of this device completes without suspending)."""
        self._remap(size_bytes)
        self._size = size_bytes
        self._caps = replace(self._caps, num_blocks=size_bytes >> self._shift)
        self._mapped()

    def _remap(self, size_bytes: int) -> None:
        """Make the mapping `size_bytes` long, the bytes below both ends kept: mremap,
        which moves page table entries, never the data (pages never touched stay
        unallocated; those past a smaller end are freed)."""
        self._unmapped()
        self._view.release()
        try:
            self._map.resize(size_bytes)
        except (BufferError, OSError) as exc:
            # BufferError: a caller still holds a view of the memory (mremap may move it).
            raise ValueError(f"cannot resize the memory to {size_bytes} bytes: {exc}") from None
        finally:
            self._view = memoryview(self._map)
            self._mapped()

    # -- I/O ---------------------------------------------------------------------

    async def read(self, lba: int, buf: memoryview) -> None:
        try:
            n = buf.nbytes
        except AttributeError:  # a bytearray
            n = len(buf)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        off = lba << self._shift
        end = off + n
        if lba < 0 or end > self._size:
            check_range(self._caps, lba, n >> self._shift)
        locks = self._locks
        if locks is not None:
            locks.hold(off, end)
        try:
            try:
                buf[:] = self._view[off:end]
            except (TypeError, ValueError):
                # A memoryview whose format is not "B": copy into a byte view of it.
                # (A released view, i.e. a closed device, fails here again.)
                memoryview(buf).cast("B")[:] = self._view[off:end]
        finally:
            if locks is not None:
                locks.release(off, end)

    def read_now(self, lba: int, nblocks: int, length: int) -> bytes | None:
        """The `nblocks` blocks at `lba`, copied at once, or None if the range is not
        inside the device or is not `length` bytes long (the caller's slow path then
        says why)."""
        inplace = self.inplace
        if inplace is None:
            raise ValueError("device is closed")
        return inplace.read_now(lba, nblocks, length)

    def write_now(self, lba: int, nblocks: int, data: Buffer) -> bool:
        """Write `data` (`nblocks` blocks) at `lba` at once; False, touching nothing, if
        the range is not inside the device or `data` is not that long."""
        inplace = self.inplace
        if inplace is None:
            raise ValueError("device is closed")
        return inplace.write_now(lba, nblocks, data)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        n = data.nbytes if type(data) is memoryview else len(data)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        off = lba << self._shift
        end = off + n
        if lba < 0 or end > self._size:
            check_range(self._caps, lba, n >> self._shift)
        self._changing()
        # mmap slice assignment takes any contiguous buffer and does one memcpy.
        locks = self._locks
        if locks is None:
            self._map[off:end] = data
            return
        locks.hold(off, end)
        try:
            self._map[off:end] = data
        finally:
            locks.release(off, end)

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        inplace = self.inplace
        if inplace is None:
            raise ValueError("device is closed")
        if not inplace.copy_within(src_lba, dst_lba, nblocks):
            # A range outside the device (checked inline, for a Copy's hot path):
            # check_range says which one.
            check_range(self._caps, src_lba, nblocks)
            check_range(self._caps, dst_lba, nblocks)

    async def flush(self) -> None:
        if self._map.closed:
            raise ValueError("device is closed")

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        check_range(self._caps, lba, nblocks)
        self._zero_held(lba << self._shift, (lba + nblocks) << self._shift)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        check_range(self._caps, lba, nblocks)
        self._zero_held(lba << self._shift, (lba + nblocks) << self._shift)

    async def close(self) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """Unmap the memory (its contents are gone); idempotent."""
        if not self._map.closed:
            self._unmapped()
            if self._locks is not None:
                self._locks.close()
                self._locks = None
            self._view.release()
            try:
                self._map.close()
            except BufferError:
                # Views of the memory still held elsewhere (a caller's buffer) hold the
                # mapping: it is unmapped when the last of them goes.
                self._map = _CLOSED

    async def __aenter__(self) -> MemoryDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close_sync()

    # -- internals ---------------------------------------------------------------

    def _changing(self) -> None:
        """The memory is about to change: views of it lent (InPlace.lend_now) are copied."""
        inplace = self.inplace
        if inplace is not None and inplace.loans:
            inplace.changing()

    def _zero_held(self, off: int, end: int) -> None:
        self._changing()
        locks = self._locks
        if locks is None or end <= off:
            self._zero(off, end)
            return
        locks.hold(off, end)
        try:
            self._zero(off, end)
        finally:
            locks.release(off, end)

    def _zero(self, off: int, end: int) -> None:
        """Zero bytes [off, end): whole pages are given back to the kernel
        (`_DISCARD`: they read back as zeroes and stop counting as resident), the
        partial-page edges are memset."""
        lo = (off + _PAGE_MASK) & ~_PAGE_MASK
        hi = end & ~_PAGE_MASK
        view = self._view
        if lo < hi:
            if off < lo:
                view[off:lo] = _ZERO_VIEW[: lo - off]
            self._map.madvise(self._DISCARD, lo, hi - lo)
            if hi < end:
                view[hi:end] = _ZERO_VIEW[: end - hi]
        elif off < end:
            view[off:end] = _ZERO_VIEW[: end - off]
        elif self._map.closed:  # an empty range on a closed device
            raise ValueError("device is closed")
