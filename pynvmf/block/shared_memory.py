"""SharedMemoryDevice: a MemoryDevice whose bytes several processes map.

`pynvmf target --cores N` serves one memory namespace from N worker processes, so
its storage cannot be a private mapping: it is a memfd (anonymous shared memory
with a file descriptor), mapped MAP_SHARED by the process that created it and by
every worker it is passed to (SCM_RIGHTS). All of them see the same bytes, with
the ordering a single mapping has (a write is visible to every reader once its
memcpy returned, which is before its completion leaves). Every copy into or out of it
holds the stripes it touches (block/range_locks.py), whose semaphores the creating
process makes and the others open by name (`locks`), so that no
process copies a block while another is writing it.

Deallocation differs from the private mapping: MADV_DONTNEED on a shared mapping
only drops page-table entries (the data comes back), so whole pages are punched
out of the memfd instead (MADV_REMOVE), which frees them and makes them read back
as zeroes in every process.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from pynvmf.block.device import Medium
from pynvmf.block.memory import MemoryDevice
from pynvmf.block.range_locks import RangeLocks


class SharedMemoryDevice(MemoryDevice):
    """`size_bytes` of zeroed shared memory; or, with `fd`, the memory another process
    created (its descriptor, received over a Unix socket) and with `locks`, the name and
    count of its stripes' semaphores (that process's `locks`)."""

    __slots__ = ("_fd",)
    # A shared mapping's pages come back after MADV_DONTNEED: punch them out of the memfd.
    _DISCARD = mmap.MADV_REMOVE

    def __init__(
        self,
        size_bytes: int,
        block_size: int = 512,
        *,
        fd: int | None = None,
        locks: tuple[str, int] | None = None,
    ) -> None:
        # The private mapping MemoryDevice makes is replaced before anything touches it
        # (an untouched mapping costs no memory).
        super().__init__(size_bytes, block_size)
        self._view.release()
        self._map.close()
        if fd is None:
            fd = os.memfd_create("pynvmf-namespace", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size_bytes)
                range_locks = RangeLocks.create(size_bytes)
            except BaseException:
                os.close(fd)
                raise
        else:
            if os.fstat(fd).st_size != size_bytes:
                raise ValueError(f"shared memory of {os.fstat(fd).st_size} bytes, not {size_bytes}")
            if locks is None:
                raise ValueError("shared memory of another process needs its locks' name")
            range_locks = RangeLocks.open(*locks)
        self._fd = fd
        self._locks = range_locks
        self._map = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED)
        self._view = memoryview(self._map)
        self._mapped()
        # The same storage in every process: a key that names the memfd's inode, so the
        # copy planner of one process treats two devices on it as one medium.
        st = os.fstat(fd)
        self._medium = Medium((("shmem", st.st_dev, st.st_ino),))

    def __repr__(self) -> str:
        c = self.capabilities
        return f"SharedMemoryDevice({c.size}, block_size={c.block_size})"

    def fileno(self) -> int:
        """The memfd, to pass to another process (which maps it with `fd=`)."""
        return self._fd

    @property
    def locks(self) -> tuple[str, int]:
        """The name and count of the stripes' semaphores, for another process (`locks=`)."""
        locks = self._locks
        if locks is None:
            raise ValueError("device is closed")
        return locks.name, locks.count

    async def rescan(self) -> int:
        """Take the size the memfd has now (the process that created it grew it: every
        other process that maps it takes the size this way); the new number of blocks.
        ValueError for a memfd smaller than the size served: a shrink tells every
        process its size first (`serve_only`)."""
        if self._fd < 0:
            raise ValueError("device is closed")
        size = os.fstat(self._fd).st_size
        if size < self.capabilities.size or size & (self.capabilities.block_size - 1):
            raise ValueError(
                f"shared memory of {size} bytes, not whole blocks of at least "
                f"{self.capabilities.size}"
            )
        return await super().grow(size)

    async def shrink(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` only, then cut the memfd to them (its pages past
        them are freed). Every other process mapping it must have stopped serving past
        them first (`serve_only`): touching a mapping past the end of its memfd faults."""
        num_blocks = await self.serve_only(size_bytes)
        if os.fstat(self._fd).st_size > size_bytes:
            os.ftruncate(self._fd, size_bytes)
        return num_blocks

    def _remap(self, size_bytes: int) -> None:
        """Extend the memfd (if this process has not, and the size is larger) and map it
        again at the new size: its pages are the same in every process, so nothing is
        copied. A smaller mapping leaves the memfd as it is (`shrink` cuts it). A view
        of the old mapping still held elsewhere keeps that mapping until it goes."""
        if os.fstat(self._fd).st_size < size_bytes:
            os.ftruncate(self._fd, size_bytes)
        new = mmap.mmap(self._fd, size_bytes, flags=mmap.MAP_SHARED)
        old = self._map
        self._unmapped()
        self._view.release()
        self._map = new
        self._view = memoryview(new)
        self._mapped()
        with contextlib.suppress(BufferError):
            old.close()

    def close_sync(self) -> None:
        super().close_sync()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
