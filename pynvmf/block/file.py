"""FileDevice: a block device over a regular file or a Linux block device.

I/O is buffered (no O_DIRECT): reads and writes go through the page cache with
os.preadv / os.pwritev straight on the caller's buffers, so there is no copy in
Python.  read, write, write_zeroes and deallocate make their syscalls inline, on
the event loop's thread: the file is expected to be mostly in the page cache,
where such a syscall takes a few microseconds, less than a hop to a worker
thread and back would cost.  What waits for the storage itself (flush, the
fdatasync of close and of a FUA fallback, zeroing or deallocating on a block
device) or may take long (zeroing, deallocating or copying within the file more
than 1 MiB, which may fall back to writing zeroes or copying through memory) runs
in a worker thread via asyncio.to_thread.  A FUA write uses RWF_DSYNC and is
also made inline, so it blocks the loop for one write-through.

write_zeroes and deallocate use fallocate(2), which both regular files and block
devices (Linux >= 4.9) implement; wherever it is refused they fall back to writing
zeroes, so a deallocated range always reads back as zeroes.

A file cut outside while served (another process truncates it): nothing here maps the
file (every process, `--cores` workers included, reads and writes with preadv/pwritev),
so no access past the new end can fault (SIGBUS). A read past it comes back short and
raises OSError(EIO) (the target's Unrecovered Read Error for that command); a write
past it extends the file again, as any pwrite does. `rescan` then reports the cut
(StorageShrank) and the target follows it (docs/control-plane.md, namespaces that are
cut).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import replace

from pynvmf.block.device import (
    Buffer,
    Capabilities,
    Medium,
    StorageShrank,
    block_shift,
    check_range,
)
from pynvmf.block.range_locks import RangeLocks

# linux/falloc.h
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
# linux/fs.h: _IOR(0x12, 114, size_t)
BLKGETSIZE64 = 0x80081272

_ZERO_CHUNK = 1 << 20
# Errors meaning "this file (system) or device cannot do that fallocate mode".
_FALLOC_UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS, errno.ENODEV}
)
_RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)

_zeros: memoryview | None = None


_COPY_CHUNK = 1 << 20
# copy_within up to this length runs on the event loop's thread, as writes do.
_INLINE_COPY = 1 << 20
# copy_file_range cannot serve this pair of offsets or this file: copy through memory.
_NO_COPY_FILE_RANGE = frozenset(
    (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF)
)


def _zero_chunk() -> memoryview:
    """1 MiB of zeroes to write from; an untouched anonymous mapping costs no memory."""
    global _zeros
    if _zeros is None:
        _zeros = memoryview(
            mmap.mmap(
                -1, _ZERO_CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ
            )
        )
    return _zeros


def _load_fallocate():  # -> ctypes function or None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    for name in ("fallocate64", "fallocate"):
        fn = getattr(libc, name, None)
        if fn is not None:
            fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            fn.restype = ctypes.c_int
            return fn
    return None


_libc_fallocate = _load_fallocate()


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2); raises OSError (EOPNOTSUPP if libc has no fallocate)."""
    if _libc_fallocate is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not available")
    if _libc_fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _blockdev_size(fd: int) -> int:
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, BLKGETSIZE64, buf)
        return struct.unpack("=Q", buf)[0]
    except OSError:
        return os.lseek(fd, 0, os.SEEK_END)


class FileDevice:
    """A regular file or block device at `path`, in blocks of `block_size` bytes.

    Regular file: with `create=True` a missing file is created (sparse) with
    `size_bytes`; an existing file keeps its size, extended to `size_bytes` if
    that is larger, and its size must be a whole number of blocks.
    Block device: its size, rounded down to whole blocks, or `size_bytes` if
    given and not larger.  Opened with O_EXCL unless read-only, so a mounted
    device is refused (EBUSY).
    A write to a read-only device raises OSError(EROFS).
    """

    __slots__ = (
        "_caps",
        "_dsync",
        "_fd",
        "_is_blockdev",
        "_locks",
        "_mask",
        "_medium",
        "_path",
        "_punch_ok",
        "_read_only",
        "_shift",
        "_size",
        "_zero_range_ok",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        block_size: int = 512,
        *,
        size_bytes: int | None = None,
        create: bool = False,
        read_only: bool = False,
        locks: tuple[str, int] | None = None,
    ) -> None:
        self._fd = -1
        # The stripes other processes serving the same file hold (`share`): None while
        # this process is the only one.
        self._locks: RangeLocks | None = None
        shift = block_shift(block_size)
        if size_bytes is not None and (
            not isinstance(size_bytes, int) or size_bytes <= 0 or size_bytes % block_size
        ):
            raise ValueError(
                f"size {size_bytes!r} is not a positive multiple of the block size {block_size}"
            )
        if create and read_only:
            raise ValueError("create and read_only exclude each other")
        self._path = os.fspath(path)
        flags = (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC
        try:
            mode = os.stat(self._path).st_mode
        except FileNotFoundError:
            if not create:
                raise
            if size_bytes is None:
                raise ValueError(f"creating {self._path} needs size_bytes") from None
            flags |= os.O_CREAT
        else:
            if stat.S_ISBLK(mode):
                if not read_only:
                    flags |= os.O_EXCL  # for a block device: fail if it is mounted/in use
            elif not stat.S_ISREG(mode):
                raise ValueError(f"{self._path} is neither a regular file nor a block device")
        fd = os.open(self._path, flags, 0o644)
        try:
            st = os.fstat(fd)
            if stat.S_ISBLK(st.st_mode):
                is_blockdev = True
                # The device number: every node and path of one block device has it.
                medium = Medium((("blockdev", st.st_rdev),))
                size = _blockdev_size(fd)
                if size_bytes is not None:
                    if size_bytes > size:
                        raise ValueError(
                            f"{self._path} holds {size} bytes, less than size_bytes={size_bytes}"
                        )
                    size = size_bytes
                size -= size % block_size
            elif stat.S_ISREG(st.st_mode):
                is_blockdev = False
                # The inode: every path (hard link, bind mount) to one file has it, and it
                # is not reused while this descriptor holds the file open.
                medium = Medium((("file", st.st_dev, st.st_ino),))
                size = st.st_size
                if size_bytes is not None and size < size_bytes:
                    if read_only:
                        raise ValueError(
                            f"{self._path} holds {size} bytes, less than size_bytes={size_bytes}"
                        )
                    os.ftruncate(fd, size_bytes)  # sparse
                    size = size_bytes
                if size % block_size:
                    raise ValueError(
                        f"{self._path}: size {size} is not a multiple of the block size "
                        f"{block_size}"
                    )
            else:
                raise ValueError(f"{self._path} is neither a regular file nor a block device")
            if size <= 0:
                raise ValueError(f"{self._path} is empty")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._shift = shift
        self._mask = block_size - 1
        self._size = size
        self._is_blockdev = is_blockdev
        self._medium = medium
        self._read_only = read_only
        self._dsync = _RWF_DSYNC
        self._zero_range_ok = True
        self._punch_ok = True
        if locks is not None:
            self._locks = RangeLocks.open(*locks)
        self._caps = Capabilities(
            block_size=block_size,
            num_blocks=size >> shift,
            volatile_write_cache=True,
            write_zeroes=True,
            deallocate=True,
            deallocated_reads_zero=True,
            native_copy=True,
        )

    def __repr__(self) -> str:
        c = self._caps
        return (
            f"FileDevice({self._path!r}, block_size={c.block_size}, size={c.size}"
            f"{', read_only' if self._read_only else ''}{', closed' if self._fd < 0 else ''})"
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def rescan(self) -> int:
        """Take the size the file or block device has now (it grew: `truncate`, `lvextend`,
        another process), in whole blocks; the new number of blocks. StorageShrank, the
        size kept, if it shrank (block.device.Resizable); ValueError if a regular file
        is not a whole number of blocks."""
        size = self._stored_size()
        if size < self._size:
            raise StorageShrank(self._path, self._size, size)
        self._size = size
        self._caps = replace(self._caps, num_blocks=size >> self._shift)
        return self._caps.num_blocks

    def _stored_size(self) -> int:
        """The size the file or block device has now, in whole blocks (a block device's
        rounded down; a regular file's must be: ValueError)."""
        if self._fd < 0:
            raise ValueError(f"{self._path} is closed")
        if self._is_blockdev:
            size = _blockdev_size(self._fd)
            return size - (size & self._mask)
        size = os.fstat(self._fd).st_size
        if size & self._mask:
            raise ValueError(
                f"{self._path}: size {size} is not a multiple of the block size "
                f"{self._caps.block_size}"
            )
        return size

    async def grow(self, size_bytes: int) -> int:
        """Extend a regular file to `size_bytes` (sparse) and take that size; the new
        number of blocks. ValueError for a block device, a read-only file, a size that
        is smaller (that is `shrink`, which drops data) or not whole blocks."""
        self._resizable_here()
        if size_bytes < self._size or size_bytes & self._mask:
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of at least "
                f"{self._size} bytes"
            )
        os.ftruncate(self._fd, size_bytes)
        return await self.rescan()

    async def serve_only(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` (whole blocks, more than none, at most the present
        size) only, the file left as it is (block.device.Shrinkable): another process
        serving the same file cuts it next, or it was cut to them outside already (then
        a block device or a read-only file follows too)."""
        if self._fd < 0:
            raise ValueError(f"{self._path} is closed")
        if size_bytes < self._stored_size():
            self._resizable_here()  # the file is to be cut: only a writable one can be
        if not 0 < size_bytes <= self._size or size_bytes & self._mask:
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of more than 0 "
                f"and at most {self._size} bytes"
            )
        self._size = size_bytes
        self._caps = replace(self._caps, num_blocks=size_bytes >> self._shift)
        return self._caps.num_blocks

    async def shrink(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` only, then truncate the regular file to them. The
        other processes serving it must have stopped serving past them first: a write
        past the end would extend the file again."""
        self._resizable_here()
        num_blocks = await self.serve_only(size_bytes)
        try:
            os.ftruncate(self._fd, size_bytes)
        except OSError:
            await self.rescan()  # the file kept its size: served again
            raise
        return num_blocks

    def _resizable_here(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self._path} is closed")
        if self._is_blockdev or self._read_only:
            raise ValueError(f"{self._path}: only a writable regular file can change size here")

    @property
    def path(self) -> str:
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def is_block_device(self) -> bool:
        return self._is_blockdev

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def share(self) -> tuple[str, int]:
        """Let other processes serve this file too (`--cores` workers): from now on every
        read and write holds the stripes it touches (block/range_locks.py), as those
        processes' FileDevices opened with `locks=` the returned name and count do, so
        that a block is wholly from before or after a write on any of them. ext4 and
        tmpfs copy the page cache without the lock that would give that (XFS has it)."""
        if self._locks is None:
            self._locks = RangeLocks.create(self._size)
        return self._locks.name, self._locks.count

    @property
    def medium(self) -> Medium:
        """The file or block device this is (pynvmf.block.device.KnownMedium): another
        FileDevice on it, under any path, is the same storage."""
        return self._medium

    def fileno(self) -> int:
        """The open file descriptor (e.g. for sendfile); -1 once closed."""
        return self._fd

    # -- I/O ---------------------------------------------------------------------

    async def read(self, lba: int, buf: memoryview) -> None:
        try:
            n = buf.nbytes
        except AttributeError:  # a bytearray
            n = len(buf)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        off = lba << self._shift
        if lba < 0 or off + n > self._size:
            check_range(self._caps, lba, n >> self._shift)
        locks = self._locks
        if locks is None:
            done = os.preadv(self._fd, (buf,), off)
            if done != n:
                self._read_rest(buf, off, done, n)
            return
        locks.hold(off, off + n)
        try:
            done = os.preadv(self._fd, (buf,), off)
            if done != n:
                self._read_rest(buf, off, done, n)
        finally:
            locks.release(off, off + n)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        n = data.nbytes if type(data) is memoryview else len(data)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        off = lba << self._shift
        if lba < 0 or off + n > self._size:
            check_range(self._caps, lba, n >> self._shift)
        flags = self._dsync if fua else 0
        locks = self._locks
        try:
            if locks is None:
                done = os.pwritev(self._fd, (data,), off, flags)
                if done != n:
                    self._write_rest(data, off, done, n, flags)
            else:
                locks.hold(off, off + n)
                try:
                    done = os.pwritev(self._fd, (data,), off, flags)
                    if done != n:
                        self._write_rest(data, off, done, n, flags)
                finally:
                    locks.release(off, off + n)
        except OSError as e:
            if flags and e.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                # No pwritev2 (ENOSYS) or no RWF_DSYNC (EOPNOTSUPP) in this kernel:
                # pwritev + fdatasync from now on.
                self._dsync = 0
                await self.write(lba, data, fua=True)
                return
            raise self._write_error(e) from None
        if fua and not flags:
            await asyncio.to_thread(os.fdatasync, self._fd)

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        """copy_file_range inside the file: on XFS and Btrfs a reflink (metadata only),
        elsewhere an in-kernel copy; overlapping ranges go through a bounce buffer."""
        check_range(self._caps, src_lba, nblocks)
        check_range(self._caps, dst_lba, nblocks)
        if self._read_only:
            raise OSError(errno.EROFS, "read-only device")
        src, dst, length = src_lba << self._shift, dst_lba << self._shift, nblocks << self._shift
        if length == 0 or src == dst:
            return
        if length <= _INLINE_COPY and not self._is_blockdev:
            # A small copy_file_range in the page cache (or a reflink) takes microseconds,
            # less than the hop to a worker thread and back, as reads and writes do.
            self._copy_within(src, dst, length)
        else:
            await asyncio.to_thread(self._copy_within, src, dst, length)
        if fua:
            await asyncio.to_thread(os.fdatasync, self._fd)

    def _copy_within(self, src: int, dst: int, length: int) -> None:
        locks = self._locks
        if locks is None:
            self._copy_unheld(src, dst, length)
            return
        held = locks.hold_two(src, src + length, dst, dst + length)
        try:
            self._copy_unheld(src, dst, length)
        finally:
            locks.release_stripes(held)

    def _copy_unheld(self, src: int, dst: int, length: int) -> None:
        fd = self._checked_fd()
        done = 0
        if not (src < dst + length and dst < src + length):
            # The kernel refuses overlapping ranges of one file; and block devices and
            # some file systems have no copy_file_range at all.
            while done < length:
                try:
                    n = os.copy_file_range(fd, fd, length - done, src + done, dst + done)
                except OSError as e:
                    if e.errno not in _NO_COPY_FILE_RANGE:
                        raise
                    break
                if n == 0:
                    break
                done += n
        if done < length:
            self._bounce_copy(src + done, dst + done, length - done)

    def _bounce_copy(self, src: int, dst: int, length: int) -> None:
        # Chunks run backwards when the destination is after an overlapping source,
        # so no chunk overwrites source data not yet copied (memmove order).
        chunk = bytearray(min(length, _COPY_CHUNK))
        starts = range(0, length, len(chunk))
        order = reversed(starts) if src < dst < src + length else starts
        for start in order:
            n = min(len(chunk), length - start)
            view = memoryview(chunk)[:n]
            self._read_rest(view, src + start, 0, n)
            self._write_rest(view, dst + start, 0, n, 0)

    async def flush(self) -> None:
        # fdatasync can wait a long time for the storage: not on the loop's thread.
        await asyncio.to_thread(os.fdatasync, self._checked_fd())

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        check_range(self._caps, lba, nblocks)
        if nblocks == 0:
            self._checked_fd()
            return
        off, length = lba << self._shift, nblocks << self._shift
        if self._is_blockdev or length > _ZERO_CHUNK:
            await asyncio.to_thread(self._held, self._zero_range, off, length)
        else:
            self._held(self._zero_range, off, length)
        if fua:
            await asyncio.to_thread(os.fdatasync, self._fd)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        check_range(self._caps, lba, nblocks)
        if nblocks == 0:
            self._checked_fd()
            return
        off, length = lba << self._shift, nblocks << self._shift
        if self._is_blockdev or length > _ZERO_CHUNK:
            await asyncio.to_thread(self._held, self._punch, off, length)
        else:
            self._held(self._punch, off, length)

    async def close(self) -> None:
        """fdatasync, then close; idempotent."""
        fd = self._fd
        if fd < 0:
            return
        try:
            if not self._read_only:
                await asyncio.to_thread(os.fdatasync, fd)
        finally:
            self._close_fd()

    def close_sync(self) -> None:
        """close() without an event loop (e.g. from a signal handler or atexit)."""
        fd = self._fd
        if fd < 0:
            return
        try:
            if not self._read_only:
                os.fdatasync(fd)
        finally:
            self._close_fd()

    async def __aenter__(self) -> FileDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __del__(self) -> None:
        # Never leak the descriptor; no fdatasync here (close() is the durable way).
        if getattr(self, "_fd", -1) >= 0:
            self._close_fd()

    # -- internals ---------------------------------------------------------------

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1  # forget it first: the number may be reused at once
        if fd >= 0:
            os.close(fd)
        locks, self._locks = self._locks, None
        if locks is not None:
            locks.close()

    def _held(self, zero: Callable[[int, int], None], off: int, length: int) -> None:
        """`zero(off, length)` (a zeroing or a deallocation) holding its stripes."""
        locks = self._locks
        if locks is None:
            zero(off, length)
            return
        locks.hold(off, off + length)
        try:
            zero(off, length)
        finally:
            locks.release(off, off + length)

    def _checked_fd(self) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, f"{self._path} is closed")
        return self._fd

    def _write_error(self, e: OSError) -> OSError:
        if self._read_only and e.errno == errno.EBADF:
            return OSError(errno.EROFS, f"{self._path} is open read-only")
        return e

    def _read_rest(self, buf: Buffer, off: int, done: int, n: int) -> None:
        view = memoryview(buf).cast("B")
        while done < n:
            got = os.preadv(self._fd, (view[done:],), off + done)
            if got == 0:  # the file shrank under us
                raise OSError(errno.EIO, f"{self._path}: unexpected end of file at {off + done}")
            done += got

    def _write_rest(self, data: Buffer, off: int, done: int, n: int, flags: int) -> None:
        view = memoryview(data).cast("B")
        while done < n:
            put = os.pwritev(self._fd, (view[done:],), off + done, flags)
            if put == 0:
                raise OSError(errno.EIO, f"{self._path}: no progress writing at {off + done}")
            done += put

    def _zero_range(self, off: int, length: int) -> None:
        """Make [off, off + length) read as zeroes, keeping it allocated if possible."""
        if self._zero_range_ok:
            try:
                fallocate(
                    self._checked_fd(), FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, off, length
                )
                return
            except OSError as e:
                if e.errno not in _FALLOC_UNSUPPORTED:
                    raise self._write_error(e) from None
                if e.errno != errno.EINVAL:
                    self._zero_range_ok = False  # EINVAL may be this range's alignment only
        self._write_zeroes(off, length)

    def _punch(self, off: int, length: int) -> None:
        """Deallocate [off, off + length); it reads back as zeroes in any case.

        On a regular file a punched hole reads as zeroes.  On a block device
        (Linux >= 4.9) PUNCH_HOLE|KEEP_SIZE is a zero-out that may unmap, i.e. a
        deallocation guaranteed to read back as zeroes (unlike BLKDISCARD)."""
        if self._punch_ok:
            try:
                fallocate(
                    self._checked_fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, length
                )
                return
            except OSError as e:
                if e.errno not in _FALLOC_UNSUPPORTED:
                    raise self._write_error(e) from None
                if e.errno != errno.EINVAL:
                    self._punch_ok = False
        self._zero_range(off, length)

    def _write_zeroes(self, off: int, length: int) -> None:
        """Write zeroes in 1 MiB chunks (the fallback of write_zeroes and deallocate)."""
        fd = self._checked_fd()
        zeros = _zero_chunk()
        end = off + length
        try:
            while off < end:
                put = os.pwritev(fd, (zeros[: min(_ZERO_CHUNK, end - off)],), off)
                if put == 0:
                    raise OSError(errno.EIO, f"{self._path}: no progress writing at {off}")
                off += put
        except OSError as e:
            raise self._write_error(e) from None
