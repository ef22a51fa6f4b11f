"""MemoryDevice: the RAM-backed block device."""

from __future__ import annotations

import mmap
import os
import random

import pytest

from pynvmf.block import BlockDevice, BlockRangeError, Capabilities, MemoryDevice
from pynvmf.block.shared_memory import SharedMemoryDevice

PAGE = mmap.PAGESIZE
BLOCK_SIZES = [512, 4096]


def pattern(nbytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def run_now(coro):
    """Drive a coroutine that must complete without ever suspending."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("coroutine suspended")


async def read_all(dev: MemoryDevice) -> bytes:
    buf = bytearray(dev.capabilities.size)
    await dev.read(0, memoryview(buf))
    return bytes(buf)


async def filled(size: int, bs: int, seed: int = 1) -> tuple[MemoryDevice, bytearray]:
    dev = MemoryDevice(size, bs)
    model = bytearray(pattern(size, seed))
    await dev.write(0, model)
    return dev, model


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- construction ---------------------------------------------------------------


@pytest.mark.parametrize("bs", [*BLOCK_SIZES, 1024, 65536])
async def test_capabilities(bs):
    dev = MemoryDevice(bs * 100, bs)
    assert isinstance(dev, BlockDevice)
    assert dev.capabilities == Capabilities(
        block_size=bs,
        num_blocks=100,
        volatile_write_cache=False,
        write_zeroes=True,
        deallocate=True,
        deallocated_reads_zero=True,
        native_copy=True,
    )
    assert dev.capabilities.size == bs * 100
    await dev.close()


@pytest.mark.parametrize(
    ("size", "bs"),
    [(1000, 512), (4096 + 512, 4096), (0, 512), (-512, 512), (4096, 256), (3072, 768), (4096, 0)],
)
def test_bad_geometry(size, bs):
    with pytest.raises(ValueError):
        MemoryDevice(size, bs)


async def test_default_block_size():
    dev = MemoryDevice(1 << 20)
    assert dev.capabilities.block_size == 512
    assert dev.capabilities.num_blocks == 2048


# -- read / write -----------------------------------------------------------------


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_fresh_device_reads_zeroes(bs):
    dev = MemoryDevice(64 * bs, bs)
    assert await read_all(dev) == bytes(64 * bs)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize(
    ("lba", "nblocks"), [(0, 1), (1, 1), (3, 5), (7, 9), (0, 64), (63, 1), (40, 24)]
)
async def test_round_trip(bs, lba, nblocks):
    dev = MemoryDevice(64 * bs, bs)
    data = pattern(nblocks * bs, lba * 1000 + nblocks)
    await dev.write(lba, data)
    buf = bytearray(nblocks * bs)
    await dev.read(lba, memoryview(buf))
    assert buf == data
    expect = bytearray(64 * bs)
    expect[lba * bs : (lba + nblocks) * bs] = data
    assert await read_all(dev) == expect


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_buffer_kinds(bs):
    dev = MemoryDevice(16 * bs, bs)
    data = pattern(4 * bs, 7)
    await dev.write(2, bytearray(data))
    await dev.write(6, memoryview(data))
    await dev.write(10, memoryview(bytearray(data)).cast("I"))  # nbytes, not len()
    out = bytearray(4 * bs)
    for lba in (2, 6, 10):
        out[:] = bytes(len(out))
        await dev.read(lba, memoryview(out))
        assert out == data
    wide = memoryview(bytearray(4 * bs)).cast("Q")
    await dev.read(10, wide)
    assert wide.tobytes() == data
    ba = bytearray(4 * bs)
    await dev.read(6, ba)  # a bytearray works too
    assert ba == data


async def test_read_into_slice_of_larger_buffer():
    dev = MemoryDevice(8 * 512)
    await dev.write(0, b"\xab" * 4096)
    big = bytearray(b"\x11" * 3000)
    await dev.read(2, memoryview(big)[1000:2024])
    assert big[:1000] == b"\x11" * 1000
    assert big[1000:2024] == b"\xab" * 1024
    assert big[2024:] == b"\x11" * 976


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_overwrite(bs):
    dev = MemoryDevice(8 * bs, bs)
    await dev.write(0, b"\x01" * 8 * bs)
    await dev.write(3, b"\x02" * 2 * bs)
    assert await read_all(dev) == b"\x01" * 3 * bs + b"\x02" * 2 * bs + b"\x01" * 3 * bs


def test_methods_never_suspend():
    dev = MemoryDevice(16 * 512)
    run_now(dev.write(1, b"x" * 1024, fua=True))
    buf = bytearray(1024)
    run_now(dev.read(1, memoryview(buf)))
    assert buf == b"x" * 1024
    run_now(dev.write_zeroes(1, 1))
    run_now(dev.deallocate(2, 1))
    run_now(dev.flush())
    run_now(dev.read(1, memoryview(buf)))
    assert buf == bytes(1024)
    run_now(dev.close())


# -- ranges -----------------------------------------------------------------------


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_out_of_range_leaves_data_untouched(bs):
    nb = 16
    dev, model = await filled(nb * bs, bs)
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


async def test_range_error_is_value_error():
    dev = MemoryDevice(4096)
    with pytest.raises(ValueError):
        await dev.read(8, memoryview(bytearray(512)))


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_last_block(bs):
    nb = 10
    dev = MemoryDevice(nb * bs, bs)
    await dev.write(nb - 1, b"\x5a" * bs)
    buf = bytearray(bs)
    await dev.read(nb - 1, memoryview(buf))
    assert buf == b"\x5a" * bs
    await dev.write_zeroes(nb - 1, 1)
    await dev.read(nb - 1, memoryview(buf))
    assert buf == bytes(bs)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_partial_block_buffers_rejected(bs):
    dev, model = await filled(8 * bs, bs)
    for n in (1, bs - 1, bs + 1, 3 * bs - 7):
        with pytest.raises(ValueError) as info:
            await dev.write(7, b"\xee" * n)
        assert not isinstance(info.value, BlockRangeError)
        with pytest.raises(ValueError):
            await dev.read(0, memoryview(bytearray(n)))
    assert await read_all(dev) == model


@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_zero_length(bs):
    nb = 8
    dev, model = await filled(nb * bs, bs)
    for lba in (0, 3, nb):  # an empty range may start at the very end
        await dev.read(lba, memoryview(bytearray()))
        await dev.write(lba, b"")
        await dev.write_zeroes(lba, 0)
        await dev.deallocate(lba, 0)
    with pytest.raises(BlockRangeError):
        await dev.read(nb + 1, memoryview(bytearray()))
    with pytest.raises(BlockRangeError):
        await dev.write(-1, b"")
    assert await read_all(dev) == model


# -- write_zeroes / deallocate -------------------------------------------------------


def zero_ranges(bs: int, nb: int) -> list[tuple[int, int]]:
    per_page = max(1, PAGE // bs)
    return [
        (0, 1),
        (1, 1),
        (nb - 1, 1),
        (3, per_page * 2 + 5),  # unaligned start and end around whole pages
        (per_page - 1, 2),  # straddles one page boundary, no whole page
        (per_page, per_page),  # exactly one page
        (per_page + 1, per_page - 1),  # tail of a page, ends page aligned
        (2 * per_page, per_page * 3 + 1),  # page aligned start, unaligned end
        (0, nb),
    ]


@pytest.mark.parametrize("op", ["write_zeroes", "deallocate"])
@pytest.mark.parametrize("bs", BLOCK_SIZES)
async def test_zeroing_ranges(bs, op):
    nb = max(64, 8 * PAGE // bs)
    for i, (lba, count) in enumerate(zero_ranges(bs, nb)):
        dev, model = await filled(nb * bs, bs, seed=i)
        await getattr(dev, op)(lba, count)
        model[lba * bs : (lba + count) * bs] = bytes(count * bs)
        assert await read_all(dev) == model, (lba, count)
        # The zeroed range is writable again and its neighbours are still intact.
        data = pattern(count * bs, 99)
        await dev.write(lba, data)
        model[lba * bs : (lba + count) * bs] = data
        assert await read_all(dev) == model, (lba, count)


async def test_random_ops_against_model():
    rng = random.Random(1234)
    for bs in BLOCK_SIZES:
        nb = 3 * PAGE // bs * 8 + 3
        dev = MemoryDevice(nb * bs, bs)
        model = bytearray(nb * bs)
        for step in range(300):
            lba = rng.randrange(nb)
            count = rng.randint(0, nb - lba)
            op = rng.choice(["write", "write", "write_zeroes", "deallocate", "read"])
            if op == "write":
                data = rng.randbytes(count * bs)
                await dev.write(lba, data, fua=rng.random() < 0.5)
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


# -- memory use -----------------------------------------------------------------------


async def test_large_device_costs_no_memory():
    before = rss_bytes()
    dev = MemoryDevice(1 << 30, 4096)
    assert dev.capabilities.num_blocks == 1 << 18
    # A few scattered writes and reads touch a few pages only.
    buf = bytearray(4096)
    for lba in range(0, 1 << 18, 1 << 14):
        await dev.write(lba, b"\x01" * 4096)
        await dev.read(lba + 1, memoryview(buf))
    await dev.write_zeroes(5, 1000)
    await dev.deallocate(100_000, 50_000)
    grown = rss_bytes() - before
    assert grown < 64 << 20, f"RSS grew by {grown >> 20} MiB"
    await dev.close()


async def test_deallocate_releases_memory():
    size = 64 << 20
    dev = MemoryDevice(size, 4096)
    before = rss_bytes()
    chunk = b"\x77" * (1 << 20)
    for i in range(size >> 20):
        await dev.write(i * 256, chunk)
    written = rss_bytes()
    assert written - before > size // 2
    await dev.deallocate(0, dev.capabilities.num_blocks)
    released = rss_bytes()
    assert written - released > size // 2
    buf = bytearray(1 << 20)
    await dev.read(1000, memoryview(buf))
    assert buf == bytes(len(buf))
    await dev.close()


# -- close ------------------------------------------------------------------------------


async def test_close_idempotent():
    dev = MemoryDevice(8192)
    assert not dev.closed
    await dev.close()
    assert dev.closed
    await dev.close()
    dev.close_sync()
    with pytest.raises(ValueError):
        await dev.read(0, memoryview(bytearray(512)))
    with pytest.raises(ValueError):
        await dev.write(0, bytes(512))
    with pytest.raises(ValueError):
        await dev.write_zeroes(0, 1)
    with pytest.raises(ValueError):
        await dev.deallocate(0, 1)
    with pytest.raises(ValueError):
        await dev.flush()


async def test_async_context_manager():
    async with MemoryDevice(8192) as dev:
        await dev.write(0, bytes(512))
    assert dev.closed


async def test_shared_memory_deallocated_pages_read_back_zero_in_every_mapping() -> None:
    # Whole pages go back through MADV_REMOVE: MADV_DONTNEED on a shared mapping would
    # only drop this mapping's page-table entries, and the data would come back.
    device = SharedMemoryDevice(1 << 20, 512)
    other = SharedMemoryDevice(1 << 20, 512, fd=os.dup(device.fileno()), locks=device.locks)
    try:
        await device.write(8, b"\x5a" * (64 * 512))
        await device.deallocate(8, 64)
        buf = bytearray(64 * 512)
        await other.read(8, memoryview(buf))
        assert buf == bytes(len(buf))
        await device.read(8, memoryview(buf))
        assert buf == bytes(len(buf))
    finally:
        await other.close()
        await device.close()


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
async def test_grow_keeps_the_data_and_adds_zeroes(shared: bool) -> None:
    device = SharedMemoryDevice(1 << 20, 512) if shared else MemoryDevice(1 << 20, 512)
    try:
        data = pattern(4096, 7)
        await device.write(2040, data)
        assert await device.grow(3 << 20) == (3 << 20) // 512
        assert device.capabilities.num_blocks == (3 << 20) // 512
        back = bytearray(4096)
        await device.read(2040, memoryview(back))
        assert back == data
        await device.read((3 << 20) // 512 - 8, memoryview(back))
        assert back == bytes(4096)
        await device.write((3 << 20) // 512 - 8, data)  # past the old end
        assert device.read_now((3 << 20) // 512 - 8, 8, 4096) == data  # the in-place path too
        for size in (1 << 19, (3 << 20) + 100):  # smaller; not whole blocks
            with pytest.raises(ValueError):
                await device.grow(size)
        assert device.capabilities.num_blocks == (3 << 20) // 512
        assert await device.rescan() == (3 << 20) // 512
    finally:
        device.close_sync()


async def test_grow_refused_while_a_view_of_the_memory_is_held() -> None:
    """A private mapping moves when it grows: not while someone holds a view of it;
    refused, the device as it was."""
    device = MemoryDevice(1 << 20, 512)
    try:
        held = memoryview(device.inplace.view)[:512]  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="cannot resize"):
            await device.grow(2 << 20)
        held.release()
        await device.write(0, b"x" * 512)
        assert device.read_now(0, 1, 512) == b"x" * 512
        assert await device.grow(2 << 20) == (2 << 20) // 512
    finally:
        device.close_sync()


async def test_shared_memory_grown_in_one_process_is_taken_by_the_others_rescan() -> None:
    device = SharedMemoryDevice(1 << 20, 512)
    other = SharedMemoryDevice(1 << 20, 512, fd=os.dup(device.fileno()), locks=device.locks)
    try:
        await device.grow(2 << 20)
        assert other.capabilities.num_blocks == 2048  # until it rescans
        assert await other.rescan() == 4096
        await device.write(4095, b"z" * 512)
        back = bytearray(512)
        await other.read(4095, memoryview(back))
        assert back == b"z" * 512
    finally:
        other.close_sync()
        device.close_sync()


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
async def test_shrink_keeps_the_blocks_below_the_new_end_and_refuses_io_past_it(
    shared: bool,
) -> None:
    device = SharedMemoryDevice(1 << 20, 512) if shared else MemoryDevice(1 << 20, 512)
    try:
        data = pattern(4096, 9)
        await device.write(1016, data)  # the last 8 blocks kept
        await device.write(2040, data)  # cut
        for size in (0, 1 << 19 | 100, 2 << 20):  # none; not whole blocks; larger
            with pytest.raises(ValueError):
                await device.shrink(size)
        assert device.capabilities.num_blocks == 2048
        assert await device.shrink(1 << 19) == 1024
        assert device.capabilities.num_blocks == 1024
        back = bytearray(4096)
        await device.read(1016, memoryview(back))
        assert back == data
        assert device.read_now(1016, 8, 4096) == data
        with pytest.raises(BlockRangeError):
            await device.read(1020, memoryview(back))
        with pytest.raises(BlockRangeError):
            await device.write(1024, b"\0" * 512)
        assert device.read_now(1020, 8, 4096) is None  # the in-place path: out of range
        assert not device.write_now(1023, 2, b"\0" * 1024)
        if shared:
            assert os.fstat(device.fileno()).st_size == 1 << 19
        # Grown again, the blocks that were cut read as zeroes.
        assert await device.grow(1 << 20) == 2048
        await device.read(2040, memoryview(back))
        assert back == bytes(4096)
    finally:
        device.close_sync()


async def test_shared_memory_is_cut_only_once_every_process_serves_less() -> None:
    """Another process stops serving past the new end (serve_only) before the one that
    cuts the memfd does: it never maps memory past the memfd's end."""
    device = SharedMemoryDevice(1 << 20, 512)
    other = SharedMemoryDevice(1 << 20, 512, fd=os.dup(device.fileno()), locks=device.locks)
    try:
        await other.write(2047, b"o" * 512)
        assert await other.serve_only(1 << 19) == 1024
        assert os.fstat(device.fileno()).st_size == 1 << 20  # not cut yet
        assert other.inplace is not None and other.inplace.size == 1 << 19
        with pytest.raises(BlockRangeError):
            await other.write(2047, b"o" * 512)
        await device.read(2047, memoryview(bytearray(512)))  # still served there
        assert await device.shrink(1 << 19) == 1024
        assert os.fstat(device.fileno()).st_size == 1 << 19
        assert await other.rescan() == 1024  # the size it serves is the memfd's
        await device.write(1023, b"d" * 512)
        back = bytearray(512)
        await other.read(1023, memoryview(back))
        assert back == b"d" * 512
    finally:
        other.close_sync()
        device.close_sync()


# -- views lent instead of copies (block/inplace.py Loans) ------------------------------


class Outbox:
    """A consumer of lent views, as a connection's output is: its list, copied on recall."""

    def __init__(self) -> None:
        from pynvmf.block.inplace import Loans

        self.out: list[bytes | memoryview] = []
        self.loans = Loans(self.copy_out)

    def copy_out(self) -> None:
        self.out = [bytes(b) for b in self.out]


def _lend(device: MemoryDevice, box: Outbox, lba: int, nblocks: int) -> memoryview | None:
    inplace = device.inplace
    assert inplace is not None
    return inplace.lend_now(lba, nblocks, nblocks * device.capabilities.block_size, box.loans)


@pytest.mark.parametrize(
    "change",
    ["write", "write_now", "write_zeroes", "deallocate", "copy_within", "grow", "close"],
)
async def test_a_lent_view_is_copied_before_the_memory_changes(change: str) -> None:
    device = MemoryDevice(64 * 512, 512)
    old = pattern(8 * 512, 1)
    await device.write(0, old)
    box = Outbox()
    view = _lend(device, box, 0, 8)
    assert isinstance(view, memoryview) and bytes(view) == old
    box.out.append(view)
    del view
    assert box.loans.lenders == [device.inplace]
    if change == "write":
        await device.write(2, pattern(512, 2))
    elif change == "write_now":
        assert device.write_now(2, 1, pattern(512, 2))
    elif change == "write_zeroes":
        await device.write_zeroes(0, 16)
    elif change == "deallocate":
        await device.deallocate(0, 16)
    elif change == "copy_within":
        await device.copy_within(32, 0, 8)
    elif change == "grow":
        # mremap, refused while a view of the memory is held: the recall lets it go.
        assert await device.grow(128 * 512) == 128
    else:
        await device.close()
    assert box.out == [old]
    assert type(box.out[0]) is bytes
    assert (box.loans.lent, box.loans.recalled, box.loans.lenders) == (1, 1, [])


async def test_loans_returned_leave_nothing_to_recall() -> None:
    device = MemoryDevice(64 * 512, 512)
    box = Outbox()
    first, second = _lend(device, box, 0, 8), _lend(device, box, 8, 8)
    assert first is not None and second is not None
    inplace = device.inplace
    assert inplace is not None and inplace.loans == [box.loans]  # recorded once
    box.out = [first, second]
    box.loans.returned()  # the consumer handed them on
    assert inplace.loans == [] and box.loans.lenders == []
    await device.write(0, pattern(512, 3))
    assert box.loans.recalled == 0 and type(box.out[0]) is memoryview


async def test_shared_memory_lends_nothing_and_a_bad_range_nothing() -> None:
    shared = SharedMemoryDevice(64 * 512, 512)
    box = Outbox()
    try:
        assert _lend(shared, box, 0, 8) is None  # other processes write it at any time
    finally:
        shared.close_sync()
    device = MemoryDevice(64 * 512, 512)
    inplace = device.inplace
    assert inplace is not None
    assert inplace.lend_now(60, 8, 8 * 512, box.loans) is None
    assert inplace.lend_now(0, 8, 4 * 512, box.loans) is None
    assert box.loans.lenders == [] and box.loans.lent == 0
