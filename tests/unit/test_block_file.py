"""FileDevice over a regular file."""

from __future__ import annotations

import errno
import os
import random

import pytest

from pynvmf.block import BlockDevice, BlockRangeError, Capabilities, FileDevice
from pynvmf.block.device import StorageShrank

BLOCK_SIZES = [512, 4096]


def pattern(nbytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def read_all(dev: FileDevice) -> bytes:
    buf = bytearray(dev.capabilities.size)
    await dev.read(0, memoryview(buf))
    return bytes(buf)


async def filled(path, size: int, bs: int, seed: int = 1) -> tuple[FileDevice, bytearray]:
    dev = FileDevice(path, bs, size_bytes=size, create=True)
    model = bytearray(pattern(size, seed))
    await dev.write(0, model)
    return dev, model


@pytest.fixture
def img(tmp_path):
    return tmp_path / "disk.img"


# -- opening ----------------------------------------------------------------------------


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_create_sparse(img, bs):
    size = 256 << 20
    dev = FileDevice(img, bs, size_bytes=size, create=True)
    assert isinstance(dev, BlockDevice)
    assert dev.capabilities == Capabilities(
        block_size=bs,
        num_blocks=size // bs,
        volatile_write_cache=True,
        write_zeroes=True,
        deallocate=True,
        deallocated_reads_zero=True,
        native_copy=True,
    )
    st = os.stat(img)
    assert st.st_size == size
    assert st.st_blocks * 512 < size // 16  # sparse
    buf = bytearray(1 << 20)
    await dev.read(dev.capabilities.num_blocks - len(buf) // bs, memoryview(buf))
    assert buf == bytes(len(buf))
    assert not dev.is_block_device
    assert dev.path == str(img)
    assert dev.fileno() >= 0
    await dev.close()


async def test_existing_file(img):
    data = pattern(64 * 512, 5)
    img.write_bytes(data)
    dev = FileDevice(img)  # default block size 512, size from the file
    assert dev.capabilities.num_blocks == 64
    assert await read_all(dev) == data
    await dev.close()
    # create=True on an existing file keeps it and its size.
    dev = FileDevice(img, 4096, create=True, size_bytes=4096)
    assert dev.capabilities.num_blocks == 8
    assert await read_all(dev) == data
    await dev.close()
    assert img.read_bytes() == data


async def test_existing_file_extended(img):
    data = pattern(8192, 6)
    img.write_bytes(data)
    dev = FileDevice(img, 512, size_bytes=1 << 20)
    assert dev.capabilities.size == 1 << 20
    assert os.path.getsize(img) == 1 << 20
    assert await read_all(dev) == data + bytes((1 << 20) - 8192)
    await dev.close()


async def test_existing_file_not_block_multiple(img):
    img.write_bytes(bytes(4096 + 100))
    fds = open_fds()
    with pytest.raises(ValueError):
        FileDevice(img, 512)
    with pytest.raises(ValueError):
        FileDevice(img, 4096, read_only=True)
    img.write_bytes(bytes(4096 + 512))
    with pytest.raises(ValueError):
        FileDevice(img, 4096)
    assert open_fds() == fds  # nothing leaked
    FileDevice(img, 512).close_sync()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 1000, "size_bytes": 8000, "create": True},
        {"block_size": 256, "size_bytes": 4096, "create": True},
        {"size_bytes": 1000, "create": True},
        {"size_bytes": 0, "create": True},
        {"create": True},  # a new file needs a size
        {"size_bytes": 4096, "create": True, "read_only": True},
    ],
)
def test_bad_arguments(img, kwargs):
    with pytest.raises(ValueError):
        FileDevice(img, **kwargs)
    assert not img.exists()


def test_missing_file(img):
    with pytest.raises(FileNotFoundError):
        FileDevice(img, size_bytes=4096)


def test_empty_file(img):
    img.write_bytes(b"")
    with pytest.raises(ValueError):
        FileDevice(img)


def test_not_a_file(tmp_path):
    with pytest.raises(ValueError):
        FileDevice(tmp_path)
    with pytest.raises(ValueError):
        FileDevice("/dev/null")


# -- read / write ------------------------------------------------------------------------


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(("lba", "nblocks"), [(0, 1), (1, 1), (3, 5), (7, 9), (0, 64), (63, 1)])
async def test_round_trip(img, bs, lba, nblocks):
    dev = FileDevice(img, bs, size_bytes=64 * bs, create=True)
    data = pattern(nblocks * bs, lba * 1000 + nblocks)
    await dev.write(lba, data)
    buf = bytearray(nblocks * bs)
    await dev.read(lba, memoryview(buf))
    assert buf == data
    expect = bytearray(64 * bs)
    expect[lba * bs : (lba + nblocks) * bs] = data
    assert await read_all(dev) == expect
    await dev.close()
    assert img.read_bytes() == expect


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_buffer_kinds(img, bs):
    dev = FileDevice(img, bs, size_bytes=16 * bs, create=True)
    data = pattern(4 * bs, 7)
    await dev.write(2, bytearray(data))
    await dev.write(6, memoryview(data))
    await dev.write(10, memoryview(bytearray(data)).cast("I"))
    out = bytearray(4 * bs)
    for lba in (2, 6, 10):
        out[:] = bytes(len(out))
        await dev.read(lba, memoryview(out))
        assert out == data
    wide = memoryview(bytearray(4 * bs)).cast("Q")
    await dev.read(10, wide)
    assert wide.tobytes() == data
    ba = bytearray(4 * bs)
    await dev.read(6, ba)
    assert ba == data
    await dev.close()


async def test_large_io(img):
    # Bigger than one zero-fill chunk and spanning many pages.
    size = 8 << 20
    dev = FileDevice(img, 4096, size_bytes=size, create=True)
    data = pattern(size - 4096, 3)
    await dev.write(1, data)
    buf = bytearray(len(data))
    await dev.read(1, memoryview(buf))
    assert buf == data
    await dev.close()


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_out_of_range_leaves_data_untouched(img, bs):
    nb = 16
    dev, model = await filled(img, nb * bs, bs)
    bad = [(nb, 1), (nb - 1, 2), (nb - 3, 4), (-1, 1), (-1, 2), (nb + 100, 1), (0, nb + 1)]
    for lba, count in bad:
        with pytest.raises(BlockRangeError):
            await dev.read(lba, memoryview(bytearray(count * bs)))
        with pytest.raises(BlockRangeError):
            await dev.write(lba, b"\xee" * count * bs)
        with pytest.raises(BlockRangeError):
            await dev.write_zeroes(lba, count)
        with pytest.raises(BlockRangeError):
            await dev.deallocate(lba, count)
    for lba, count in [(0, -1), (3, -2), (nb + 1, 0), (-1, 0)]:
        with pytest.raises(BlockRangeError):
            await dev.write_zeroes(lba, count)
        with pytest.raises(BlockRangeError):
            await dev.deallocate(lba, count)
    assert await read_all(dev) == model
    await dev.close()
    assert os.path.getsize(img) == nb * bs  # never grown
    assert img.read_bytes() == model


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_partial_block_buffers_rejected(img, bs):
    dev, model = await filled(img, 8 * bs, bs)
    for n in (1, bs - 1, bs + 1, 3 * bs - 7):
        with pytest.raises(ValueError) as info:
            await dev.write(7, b"\xee" * n)
        assert not isinstance(info.value, BlockRangeError)
        with pytest.raises(ValueError):
            await dev.read(0, memoryview(bytearray(n)))
    assert await read_all(dev) == model
    await dev.close()
    assert os.path.getsize(img) == 8 * bs


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_zero_length(img, bs):
    nb = 8
    dev, model = await filled(img, nb * bs, bs)
    for lba in (0, 3, nb):
        await dev.read(lba, memoryview(bytearray()))
        await dev.write(lba, b"")
        await dev.write_zeroes(lba, 0)
        await dev.deallocate(lba, 0)
    with pytest.raises(BlockRangeError):
        await dev.read(nb + 1, memoryview(bytearray()))
    assert await read_all(dev) == model
    await dev.close()


async def test_file_shrunk_underneath(img):
    dev = FileDevice(img, 512, size_bytes=8192, create=True)
    os.truncate(img, 4096 + 100)
    buf = bytearray(512)
    await dev.read(7, memoryview(buf))  # entirely inside what is left
    with pytest.raises(OSError) as info:
        await dev.read(8, memoryview(buf))  # 100 bytes then end of file
    assert info.value.errno == errno.EIO
    await dev.close()


# -- durability -----------------------------------------------------------------------------


async def test_fua_write(img):
    dev = FileDevice(img, 512, size_bytes=1 << 20, create=True)
    data = pattern(8192, 11)
    await dev.write(16, data, fua=True)
    with open(img, "rb") as f:
        f.seek(16 * 512)
        assert f.read(8192) == data
    await dev.close()


async def test_fua_write_without_rwf_dsync(img):
    dev = FileDevice(img, 512, size_bytes=1 << 20, create=True)
    dev._dsync = 0  # as on a kernel without RWF_DSYNC: pwritev, then fdatasync
    data = pattern(4096, 12)
    await dev.write(3, data, fua=True)
    buf = bytearray(4096)
    await dev.read(3, memoryview(buf))
    assert buf == data
    await dev.close()


async def test_flush(img):
    dev = FileDevice(img, 4096, size_bytes=1 << 20, create=True)
    await dev.write(0, b"\x42" * 4096)
    await dev.flush()
    await dev.flush()
    assert img.read_bytes()[:4096] == b"\x42" * 4096
    await dev.close()


async def test_close_idempotent(img):
    dev = FileDevice(img, 512, size_bytes=8192, create=True)
    await dev.write(0, b"\x01" * 512)
    fds = open_fds()
    await dev.close()
    assert dev.closed
    assert dev.fileno() == -1
    assert open_fds() == fds - 1
    await dev.close()
    dev.close_sync()
    assert open_fds() == fds - 1
    for call in (
        dev.read(0, memoryview(bytearray(512))),
        dev.write(0, bytes(512)),
        dev.write_zeroes(0, 1),
        dev.deallocate(0, 1),
        dev.flush(),
    ):
        with pytest.raises(OSError):
            await call
    assert img.read_bytes()[:512] == b"\x01" * 512


def test_close_sync(img):
    dev = FileDevice(img, 512, size_bytes=8192, create=True)
    dev.close_sync()
    assert dev.closed
    dev.close_sync()


async def test_async_context_manager(img):
    async with FileDevice(img, 512, size_bytes=8192, create=True) as dev:
        await dev.write(1, b"\x09" * 512)
    assert dev.closed
    assert img.read_bytes()[512:1024] == b"\x09" * 512


async def test_read_only(img):
    data = pattern(8192, 13)
    img.write_bytes(data)
    dev = FileDevice(img, 512, read_only=True)
    assert dev.read_only
    assert await read_all(dev) == data
    for call in (dev.write(0, bytes(512)), dev.write_zeroes(0, 1), dev.deallocate(0, 16)):
        with pytest.raises(OSError) as info:
            await call
        assert info.value.errno == errno.EROFS
    await dev.flush()
    await dev.close()
    assert img.read_bytes() == data


# -- write_zeroes / deallocate -----------------------------------------------------------------


def zero_ranges(bs: int, nb: int) -> list[tuple[int, int]]:
    per_page = max(1, 4096 // bs)
    return [
        (0, 1),
        (1, 1),
        (nb - 1, 1),
        (3, per_page * 2 + 5),
        (per_page - 1, 2),
        (per_page, per_page),
        (per_page + 1, per_page - 1),
        (2 * per_page, per_page * 3 + 1),
        (0, nb),
    ]


@pytest.mark.parametrize("fallback", [False, True])
@pytest.mark.parametrize("op", ["write_zeroes", "deallocate"])
@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_zeroing_ranges(img, bs, op, fallback):
    nb = max(64, 8 * 4096 // bs)
    for i, (lba, count) in enumerate(zero_ranges(bs, nb)):
        dev, model = await filled(img, nb * bs, bs, seed=i)
        if fallback:  # as on a file system without fallocate modes
            dev._zero_range_ok = dev._punch_ok = False
        await getattr(dev, op)(lba, count)
        model[lba * bs : (lba + count) * bs] = bytes(count * bs)
        assert await read_all(dev) == model, (lba, count)
        data = pattern(count * bs, 99)
        await dev.write(lba, data)
        model[lba * bs : (lba + count) * bs] = data
        assert await read_all(dev) == model, (lba, count)
        await dev.close()
        assert os.path.getsize(img) == nb * bs
        assert img.read_bytes() == model
        img.unlink()


@pytest.mark.parametrize("fallback", [False, True])
async def test_zeroing_large_range(img, fallback):
    size = 8 << 20  # several zero-fill chunks
    dev, model = await filled(img, size, 512)
    if fallback:
        dev._zero_range_ok = dev._punch_ok = False
    await dev.write_zeroes(7, (3 << 20) // 512, fua=True)
    model[7 * 512 : 7 * 512 + (3 << 20)] = bytes(3 << 20)
    await dev.deallocate(9000, 5000)
    model[9000 * 512 : 14000 * 512] = bytes(5000 * 512)
    assert await read_all(dev) == model
    await dev.close()


async def test_deallocate_punches_hole(img):
    size = 16 << 20
    dev, _ = await filled(img, size, 4096)
    await dev.flush()
    before = os.stat(img).st_blocks
    await dev.deallocate(0, dev.capabilities.num_blocks)
    if dev._punch_ok:  # the file system can punch holes (ext4, xfs, btrfs, tmpfs...)
        assert os.stat(img).st_blocks < before // 2
    assert os.path.getsize(img) == size
    assert await read_all(dev) == bytes(size)
    await dev.close()


async def test_random_ops_against_model(img):
    rng = random.Random(4321)
    bs = 512
    nb = 203
    dev = FileDevice(img, bs, size_bytes=nb * bs, create=True)
    model = bytearray(nb * bs)
    for step in range(300):
        lba = rng.randrange(nb)
        count = rng.randint(0, nb - lba)
        op = rng.choice(["write", "write", "write_zeroes", "deallocate", "read"])
        if op == "write":
            data = rng.randbytes(count * bs)
            await dev.write(lba, data, fua=rng.random() < 0.2)
            model[lba * bs : (lba + count) * bs] = data
        elif op == "read":
            buf = bytearray(count * bs)
            await dev.read(lba, memoryview(buf))
            assert buf == model[lba * bs : (lba + count) * bs], step
        else:
            await getattr(dev, op)(lba, count)
            model[lba * bs : (lba + count) * bs] = bytes(count * bs)
    assert await read_all(dev) == model
    await dev.close()
    assert img.read_bytes() == model


async def test_shrink_truncates_the_file_and_refuses_io_past_the_new_end(img):
    dev, model = await filled(img, 1 << 20, 512)
    other = FileDevice(img, 512)  # another process serving the same file
    try:
        for size in (0, (1 << 19) + 100, 2 << 20):  # none; not whole blocks; larger
            with pytest.raises(ValueError):
                await dev.shrink(size)
        assert await other.serve_only(1 << 19) == 1024
        assert os.path.getsize(img) == 1 << 20  # serve_only leaves the file alone
        with pytest.raises(BlockRangeError):
            await other.write(1024, b"\0" * 512)
        assert await dev.shrink(1 << 19) == 1024
        assert os.path.getsize(img) == 1 << 19
        assert await read_all(dev) == model[: 1 << 19]
        with pytest.raises(BlockRangeError):
            await dev.read(1023, memoryview(bytearray(1024)))
        assert await other.rescan() == 1024
        assert os.path.getsize(img) == 1 << 19  # nothing wrote past the end
    finally:
        await other.close()
        await dev.close()


async def test_a_read_only_file_is_not_shrunk(img):
    dev, _model = await filled(img, 1 << 20, 512)
    await dev.close()
    ro = FileDevice(img, 512, read_only=True)
    try:
        with pytest.raises(ValueError, match="writable regular file"):
            await ro.shrink(1 << 19)
        assert ro.capabilities.num_blocks == 2048
        assert os.path.getsize(img) == 1 << 20
    finally:
        await ro.close()


async def test_a_file_truncated_outside_gives_read_errors_then_is_followed(img):
    """Another process truncates the file: nothing maps it, so a read past the new end is
    an EIO (never a fault), a rescan reports the cut with its size (StorageShrank) and
    keeps the old size until `serve_only` follows it; then I/O past it is out of range."""
    dev, model = await filled(img, 1 << 20, 512)
    try:
        os.truncate(img, 1 << 19)
        for lba, nblocks in ((1024, 1), (1023, 2), (2047, 1)):
            with pytest.raises(OSError) as err:
                await dev.read(lba, memoryview(bytearray(nblocks * 512)))
            assert err.value.errno == errno.EIO
        with pytest.raises(StorageShrank) as shrank:
            await dev.rescan()
        assert shrank.value.size_bytes == 1 << 19
        assert dev.capabilities.num_blocks == 2048  # not taken yet
        assert await dev.serve_only(1 << 19) == 1024
        with pytest.raises(BlockRangeError):
            await dev.read(1024, memoryview(bytearray(512)))
        assert await read_all(dev) == model[: 1 << 19]
        assert await dev.rescan() == 1024
    finally:
        await dev.close()


async def test_a_read_only_file_follows_a_cut_made_outside(img):
    """A device that cannot cut (read-only) still follows storage cut outside, and still
    refuses to serve less than storage that would have to be cut."""
    dev, _model = await filled(img, 1 << 20, 512)
    await dev.close()
    ro = FileDevice(img, 512, read_only=True)
    try:
        with pytest.raises(ValueError, match="writable regular file"):
            await ro.serve_only(1 << 19)
        os.truncate(img, 1 << 19)
        with pytest.raises(StorageShrank):
            await ro.rescan()
        assert await ro.serve_only(1 << 19) == 1024
        assert ro.capabilities.num_blocks == 1024
    finally:
        await ro.close()
