"""LinearDevice: segment mapping, I/O split across segments, capabilities, and copies
that pass through to the underlying devices (checked against a model of the bytes)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.copy import CopyTooLarge, SourceRange, copy, storage_extents
from pynvmf.block.device import BlockDevice, BlockRangeError, Buffer, Capabilities, CopyOffload
from pynvmf.block.file import FileDevice
from pynvmf.block.linear import LinearDevice, Segment
from pynvmf.block.memory import MemoryDevice

BS = 512


class Spy(MemoryDevice):
    """A MemoryDevice that records how it is used."""

    def __init__(self, nblocks: int, block_size: int = BS) -> None:
        super().__init__(nblocks * block_size, block_size)
        self.reads: list[tuple[int, int]] = []
        self.writes: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int, int]] = []
        self.flushes = 0

    async def read(self, lba: int, buf: memoryview) -> None:
        self.reads.append((lba, memoryview(buf).nbytes // self.capabilities.block_size))
        await super().read(lba, buf)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        self.writes.append((lba, memoryview(data).nbytes // self.capabilities.block_size))
        await super().write(lba, data, fua=fua)

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        self.copies.append((src_lba, dst_lba, nblocks))
        await super().copy_within(src_lba, dst_lba, nblocks, fua=fua)

    async def flush(self) -> None:
        self.flushes += 1
        await super().flush()

    def forget(self) -> None:
        self.reads.clear()
        self.writes.clear()
        self.copies.clear()
        self.flushes = 0


async def raw(device: BlockDevice) -> bytes:
    """The device's bytes, read past any spy."""
    assert isinstance(device, MemoryDevice)
    buf = bytearray(device.capabilities.size)
    await MemoryDevice.read(device, 0, memoryview(buf))
    return bytes(buf)


class Plain:
    """A BlockDevice with chosen capabilities over a MemoryDevice (no copy of its own)."""

    def __init__(self, nblocks: int, **caps: Any) -> None:
        self.mem = MemoryDevice(nblocks * BS, BS)
        self._caps = dataclasses.replace(self.mem.capabilities, native_copy=False, **caps)
        self.flushes = 0

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def read(self, lba: int, buf: memoryview) -> None:
        await self.mem.read(lba, buf)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self.mem.write(lba, data, fua=fua)

    async def flush(self) -> None:
        self.flushes += 1

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self.mem.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self.mem.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self.mem.close()


def blocks(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n * BS)


async def contents(dev: LinearDevice) -> bytes:
    buf = bytearray(dev.capabilities.size)
    await dev.read(0, memoryview(buf))
    return bytes(buf)


async def filled(dev: LinearDevice, seed: int = 1) -> bytearray:
    """Fill `dev` with random bytes; the model of its contents."""
    data = blocks(dev.capabilities.num_blocks, seed)
    await dev.write(0, data)
    return bytearray(data)


def model_copy(model: bytearray, ranges: list[tuple[int, int]], dst_lba: int) -> None:
    """What a copy does: every source is read before anything is written."""
    data = b"".join(bytes(model[lba * BS : (lba + n) * BS]) for lba, n in ranges)
    model[dst_lba * BS : dst_lba * BS + len(data)] = data


# -- construction and mapping ----------------------------------------------------------------


def test_segments_map_back_to_back() -> None:
    a, b = MemoryDevice(64 * BS), MemoryDevice(64 * BS)
    dev = LinearDevice([Segment(a, 10, 5), Segment(b, 0, 20), Segment(a, 40, 8)])
    assert dev.capabilities.num_blocks == 33 and dev.capabilities.block_size == BS
    assert dev.map_range(3, 25) == [Segment(a, 13, 2), Segment(b, 0, 20), Segment(a, 40, 3)]
    assert dev.map_range(25, 8) == [Segment(a, 40, 8)]
    assert dev.map_range(7, 0) == []


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ("none", "at least one segment"),
        ("block sizes", "4096-byte blocks"),
        ("past the end", "outside its device"),
        ("negative start", "outside its device"),
        ("empty", "segment 1 is empty"),
        ("alias", "segments 0 and 2 map overlapping blocks"),
    ],
)
def test_bad_segments_are_refused(segments: str, message: str) -> None:
    a = MemoryDevice(64 * BS)
    big = MemoryDevice(64 * 4096, 4096)
    layouts: dict[str, list[Segment]] = {
        "none": [],
        "block sizes": [Segment(a, 0, 8), Segment(big, 0, 8)],
        "past the end": [Segment(a, 60, 8)],
        "negative start": [Segment(a, -1, 8)],
        "empty": [Segment(a, 0, 8), Segment(a, 8, 0)],
        "alias": [Segment(a, 0, 8), Segment(a, 20, 8), Segment(a, 7, 4)],
    }
    with pytest.raises(ValueError, match=message):
        LinearDevice(layouts[segments])


def test_adjacent_segments_of_one_device_are_no_alias() -> None:
    a = MemoryDevice(64 * BS)
    assert LinearDevice([Segment(a, 8, 8), Segment(a, 0, 8)]).capabilities.num_blocks == 16


def test_capabilities_combine_the_segments(tmp_path: Path) -> None:
    cached = FileDevice(tmp_path / "f.img", BS, size_bytes=64 * BS, create=True)
    try:
        mem = MemoryDevice(64 * BS)
        no_zeroes = Plain(64, write_zeroes=False)
        no_dealloc = Plain(64, deallocate=False, deallocated_reads_zero=False)

        both = LinearDevice([Segment(mem, 0, 8), Segment(cached, 0, 8)]).capabilities
        assert both.volatile_write_cache  # the file's cache makes the whole device volatile
        assert both.write_zeroes and both.deallocate and both.deallocated_reads_zero
        assert not both.native_copy  # copies go through CopyOffload

        memory_only = LinearDevice([Segment(mem, 0, 8)]).capabilities
        assert not memory_only.volatile_write_cache

        mixed = LinearDevice([Segment(mem, 0, 8), Segment(no_zeroes, 0, 8)]).capabilities
        assert not mixed.write_zeroes and mixed.deallocate and mixed.deallocated_reads_zero

        mixed = LinearDevice([Segment(no_dealloc, 0, 8), Segment(mem, 8, 8)]).capabilities
        assert mixed.write_zeroes and not mixed.deallocate and not mixed.deallocated_reads_zero
    finally:
        cached.close_sync()


def test_is_a_copy_offload_device_for_itself_only() -> None:
    a = MemoryDevice(64 * BS)
    dev = LinearDevice([Segment(a, 0, 32)])
    assert isinstance(dev, CopyOffload)
    assert dev.can_copy_from(dev)
    assert not dev.can_copy_from(a)
    assert not dev.can_copy_from(LinearDevice([Segment(a, 0, 32)]))
    # Unlimited as far as the planner is concerned: the device splits requests itself.
    limits = dev.copy_limits
    assert limits.max_blocks == limits.max_range_blocks == 32 and limits.max_ranges >= 256


# -- I/O -------------------------------------------------------------------------------------


async def test_read_write_across_segments_match_a_model() -> None:
    a, b = Spy(128), Spy(128)
    segments = [Segment(a, 50, 7), Segment(b, 0, 30), Segment(a, 0, 13), Segment(b, 100, 28)]
    dev = LinearDevice(segments)
    model = await filled(dev)
    rng = random.Random(7)
    for i in range(300):
        n = rng.randrange(0, 30)
        lba = rng.randrange(0, dev.capabilities.num_blocks - n + 1)
        if rng.random() < 0.5:
            data = blocks(n, seed=i)
            await dev.write(lba, data, fua=rng.random() < 0.2)
            model[lba * BS : (lba + n) * BS] = data
        else:
            buf = bytearray(n * BS)
            await dev.read(lba, memoryview(buf))
            assert buf == model[lba * BS : (lba + n) * BS], (lba, n)
    assert await contents(dev) == model
    # Each segment's bytes are where the map says, on the underlying devices.
    offset = 0
    for seg in segments:
        mem = await raw(seg.device)
        part = mem[seg.start_lba * BS : (seg.start_lba + seg.nblocks) * BS]
        assert part == model[offset * BS : (offset + seg.nblocks) * BS]
        offset += seg.nblocks


async def test_a_request_over_several_segments_runs_them_concurrently() -> None:
    class Gated(Plain):
        """Writes wait until every piece of the request has started."""

        active = 0
        everyone = asyncio.Event()

        async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
            Gated.active += 1
            if Gated.active == 3:
                Gated.everyone.set()
            await Gated.everyone.wait()
            await super().write(lba, data, fua=fua)

    a, b = Gated(32), Gated(32)
    dev = LinearDevice([Segment(a, 0, 8), Segment(b, 0, 8), Segment(a, 8, 8)])
    # Run one after another, the first piece would wait for ever: the timeout is
    # only there to fail such a bug instead of hanging.
    async with asyncio.timeout(10):
        await dev.write(4, blocks(16, seed=3))
    assert Gated.active == 3
    buf = bytearray(16 * BS)
    await dev.read(4, memoryview(buf))
    assert buf == blocks(16, seed=3)


async def test_non_byte_buffers_are_accepted() -> None:
    a, b = MemoryDevice(16 * BS), MemoryDevice(16 * BS)
    dev = LinearDevice([Segment(a, 0, 4), Segment(b, 0, 4)])
    data = blocks(8, seed=5)
    await dev.write(0, memoryview(data).cast("I"))
    words = memoryview(bytearray(8 * BS)).cast("I")
    await dev.read(0, words)
    assert words.tobytes() == data


@pytest.mark.parametrize(("lba", "n"), [(-1, 1), (15, 2), (0, 17), (16, 1)])
async def test_out_of_range_changes_nothing(lba: int, n: int) -> None:
    a, b = Spy(16), Spy(16)
    dev = LinearDevice([Segment(a, 0, 8), Segment(b, 8, 8)])
    model = await filled(dev)
    a.forget()
    b.forget()
    with pytest.raises(BlockRangeError):
        await dev.write(lba, bytes(n * BS))
    with pytest.raises(BlockRangeError):
        await dev.read(lba, memoryview(bytearray(n * BS)))
    with pytest.raises(BlockRangeError):
        await dev.write_zeroes(lba, n)
    with pytest.raises(BlockRangeError):
        await dev.deallocate(lba, n)
    assert a.writes == b.writes == [] and a.reads == b.reads == []
    assert await contents(dev) == model


async def test_partial_block_buffers_are_refused() -> None:
    dev = LinearDevice([Segment(MemoryDevice(16 * BS), 0, 16)])
    with pytest.raises(ValueError, match="whole number of blocks"):
        await dev.write(0, bytes(BS + 1))


async def test_write_zeroes_and_deallocate_across_segments() -> None:
    a, b = MemoryDevice(64 * BS), MemoryDevice(64 * BS)
    dev = LinearDevice([Segment(a, 30, 10), Segment(b, 5, 10), Segment(a, 0, 10)])
    model = await filled(dev)
    await dev.write_zeroes(7, 10)
    model[7 * BS : 17 * BS] = bytes(10 * BS)
    await dev.deallocate(18, 12)
    model[18 * BS : 30 * BS] = bytes(12 * BS)
    assert await contents(dev) == model
    # Outside the segments the devices are untouched.
    assert (await raw(a))[10 * BS : 30 * BS] == bytes(20 * BS)


async def test_flush_reaches_every_device_once() -> None:
    a, b = Spy(64), Spy(64)
    dev = LinearDevice([Segment(a, 0, 8), Segment(b, 0, 8), Segment(a, 8, 8), Segment(b, 8, 8)])
    await dev.flush()
    assert (a.flushes, b.flushes) == (1, 1)


async def test_a_failing_piece_fails_the_request_after_the_others_finish() -> None:
    class Broken(Plain):
        async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
            raise OSError(5, "broken segment")

    good, bad = Spy(16), Broken(16)
    dev = LinearDevice([Segment(good, 0, 8), Segment(bad, 0, 8)])
    with pytest.raises(OSError, match="broken segment"):
        await dev.write(0, blocks(16, seed=2))
    assert good.writes == [(0, 8)]  # the healthy piece was written, not abandoned


async def test_close() -> None:
    a = MemoryDevice(16 * BS)
    dev = LinearDevice([Segment(a, 0, 16)])
    await dev.close()
    assert dev.closed and not a.closed  # the device is the caller's
    with pytest.raises(OSError, match="closed"):
        await dev.read(0, memoryview(bytearray(BS)))
    owner = LinearDevice([Segment(a, 0, 16)], close_devices=True)
    await owner.close()
    assert a.closed


# -- copies: passing through ------------------------------------------------------------------


async def test_copy_inside_one_segment_is_the_devices_own_copy() -> None:
    a = Spy(256)
    dev = LinearDevice([Segment(a, 100, 50), Segment(a, 0, 50)])
    model = await filled(dev)
    a.forget()
    report = await copy([SourceRange(dev, 55, 20)], dev, 80)
    model_copy(model, [(55, 20)], 80)
    assert report.offloaded_blocks == 20 and report.emulated_blocks == 0
    # Linear 55.. and 80.. are both in the second segment (device blocks 0..50).
    assert a.copies == [(5, 30, 20)]
    assert a.reads == a.writes == []
    assert dev.copy_stats.native_blocks == 20 and dev.copy_stats.emulated_blocks == 0
    assert await contents(dev) == model


async def test_copy_spanning_segment_boundaries_is_split_per_segment_and_stays_native() -> None:
    a = Spy(256)
    # Four segments of one device, out of order, with gaps between them.
    dev = LinearDevice(
        [Segment(a, 200, 10), Segment(a, 100, 10), Segment(a, 0, 10), Segment(a, 150, 10)]
    )
    model = await filled(dev)
    a.forget()
    # Linear 5..20 -> 22..37: source pieces cut at 10, destination pieces cut at 30.
    report = await copy([SourceRange(dev, 5, 15)], dev, 22)
    model_copy(model, [(5, 15)], 22)
    assert report.offloaded_blocks == 15
    assert sorted(a.copies) == sorted(
        [
            (205, 2, 5),  # linear 5..10 (segment 0) -> 22..27 (segment 2)
            (100, 7, 3),  # linear 10..13 (segment 1) -> 27..30 (segment 2)
            (103, 150, 7),  # linear 13..20 (segment 1) -> 30..37 (segment 3)
        ]
    )
    assert a.reads == a.writes == []
    assert dev.copy_stats.native_blocks == 15 and dev.copy_stats.emulated_blocks == 0
    assert await contents(dev) == model


async def test_contiguous_segments_collapse_into_one_underlying_copy() -> None:
    a = Spy(64)
    dev = LinearDevice([Segment(a, 0, 8), Segment(a, 8, 8), Segment(a, 16, 8), Segment(a, 24, 8)])
    model = await filled(dev)
    a.forget()
    await copy([SourceRange(dev, 0, 14)], dev, 16)
    model_copy(model, [(0, 14)], 16)
    assert a.copies == [(0, 16, 14)]
    assert await contents(dev) == model


async def test_segments_on_two_devices_emulate_only_the_cross_device_pieces() -> None:
    a, b = Spy(64), Spy(64)
    dev = LinearDevice([Segment(a, 0, 16), Segment(b, 0, 16), Segment(a, 16, 16)])
    model = await filled(dev)
    a.forget()
    b.forget()
    # Sources linear 4..12 (a 4..12) and 20..28 (b 4..12) to linear 28..44, which is
    # b 12..16 then a 16..28: a 4..8 -> b 12..16 crosses devices, a 8..12 -> a 16..20
    # stays on a, b 4..12 -> a 20..28 crosses devices.
    report = await copy([SourceRange(dev, 4, 8), SourceRange(dev, 20, 8)], dev, 28)
    model_copy(model, [(4, 8), (20, 8)], 28)
    assert report.offloaded_blocks == 16 and report.emulated_blocks == 0
    assert dev.copy_stats.native_blocks == 4 and dev.copy_stats.emulated_blocks == 12
    assert a.copies == [(8, 16, 4)]
    assert a.reads == [(4, 4)] and b.writes == [(12, 4)]
    assert b.reads == [(4, 8)] and a.writes == [(20, 8)]
    assert await contents(dev) == model


async def test_copy_into_a_segment_of_another_device_is_emulated() -> None:
    a, b = Spy(64), Spy(64)
    dev = LinearDevice([Segment(a, 0, 32), Segment(b, 0, 32)])
    model = await filled(dev)
    a.forget()
    b.forget()
    await copy([SourceRange(dev, 0, 10)], dev, 40)
    model_copy(model, [(0, 10)], 40)
    assert a.copies == [] and b.copies == []
    assert a.reads == [(0, 10)] and b.writes == [(8, 10)]
    assert dev.copy_stats.emulated_blocks == 10
    assert await contents(dev) == model


async def test_fua_flushes_each_written_device_with_a_volatile_cache() -> None:
    a, cached = Spy(64), Plain(64, volatile_write_cache=True)
    dev = LinearDevice(
        [Segment(cached, 0, 8), Segment(a, 0, 8), Segment(cached, 16, 8), Segment(a, 8, 32)]
    )
    # Linear 4..20 is cached 4..8, a 0..8, cached 16..20: two planner calls write to
    # `cached`, and it is flushed once.
    await dev.copy_offload([(dev, 30, 16)], 4, fua=True)
    assert cached.flushes == 1
    assert a.flushes == 0  # no volatile cache, nothing to flush
    await dev.copy_offload([(dev, 30, 16)], 4)
    assert cached.flushes == 1


async def test_copy_offload_checks_before_copying() -> None:
    a = Spy(64)
    dev = LinearDevice([Segment(a, 0, 32)])
    with pytest.raises(ValueError, match="cannot copy from"):
        await dev.copy_offload([(a, 0, 8)], 16)
    with pytest.raises(BlockRangeError):
        await dev.copy_offload([(dev, 0, 8), (dev, 30, 4)], 0)
    with pytest.raises(BlockRangeError):
        await dev.copy_offload([(dev, 0, 8)], 28)
    assert a.copies == [] and a.writes == [] and a.reads == []


async def test_copy_from_another_device_into_a_linear_device_is_emulated() -> None:
    a, src = Spy(64), MemoryDevice(64 * BS)
    dev = LinearDevice([Segment(a, 32, 16), Segment(a, 0, 16)])
    data = blocks(20, seed=9)
    await src.write(0, data)
    report = await copy([SourceRange(src, 0, 20)], dev, 6)
    assert report.emulated_blocks == 20 and report.offloaded_blocks == 0
    buf = bytearray(20 * BS)
    await dev.read(6, memoryview(buf))
    assert buf == data


# -- copies: overlap --------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [-7, -1, 1, 3, 12])
async def test_overlapping_single_range_is_memmove(shift: int) -> None:
    a = Spy(64)
    dev = LinearDevice([Segment(a, 0, 8), Segment(a, 40, 8), Segment(a, 16, 8), Segment(a, 28, 8)])
    model = await filled(dev)
    src_lba = 4 if shift > 0 else 15
    ranges = [(src_lba, 14)]
    # Straight to copy_offload: the planner would stage this; a direct caller may not.
    await dev.copy_offload([(dev, src_lba, 14)], src_lba + shift)
    model_copy(model, ranges, src_lba + shift)
    assert await contents(dev) == model
    # Ordered, not staged: the pieces were copied within the device.
    assert dev.copy_stats.staged_blocks == 0 and dev.copy_stats.emulated_blocks == 0


async def test_swapping_segments_stages_the_cycle() -> None:
    a = Spy(32)
    # Linear 0..10 is device 10..20 and linear 10..20 is device 0..10: copying linear
    # 10..20 to 0..10 and 0..10 to 10..20 makes each piece read what the other writes.
    dev = LinearDevice([Segment(a, 10, 10), Segment(a, 0, 10)])
    model = await filled(dev)
    await dev.copy_offload([(dev, 10, 10), (dev, 0, 10)], 0)
    model_copy(model, [(10, 10), (0, 10)], 0)
    assert await contents(dev) == model
    assert dev.copy_stats.emulated_blocks == 20  # both read into memory first


async def test_staging_a_cycle_over_the_limit_refuses_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pynvmf.block.linear as linear

    monkeypatch.setattr(linear, "STAGING_LIMIT", 8 * BS)
    a = Spy(32)
    dev = LinearDevice([Segment(a, 10, 10), Segment(a, 0, 10)])
    model = await filled(dev)
    a.forget()
    with pytest.raises(CopyTooLarge):
        await dev.copy_offload([(dev, 10, 10), (dev, 0, 10)], 0)
    assert a.writes == [] and a.copies == []
    assert await contents(dev) == model


@pytest.mark.parametrize("seed", range(40))
async def test_random_copies_match_the_model(seed: int) -> None:
    """Random layouts over two devices, random multi-range copies that may overlap
    the destination, through the planner and straight to copy_offload."""
    rng = random.Random(seed)
    devices = [Spy(96), Spy(96)]
    segments: list[Segment] = []
    for device in devices:
        # Cut each device into pieces, keep some, and shuffle them all together.
        cuts = sorted(rng.sample(range(1, 96), 6))
        bounds = list(zip([0, *cuts], [*cuts, 96], strict=True))
        segments += [Segment(device, lo, hi - lo) for lo, hi in bounds if rng.random() < 0.8]
    rng.shuffle(segments)
    dev = LinearDevice(segments)
    total = dev.capabilities.num_blocks
    model = await filled(dev, seed=seed)
    for _ in range(6):
        ranges = []
        for _ in range(rng.randrange(1, 4)):
            n = rng.randrange(0, 12)
            ranges.append((rng.randrange(0, total - n + 1), n))
        count = sum(n for _lba, n in ranges)
        dst_lba = rng.randrange(0, total - count + 1)
        if rng.random() < 0.5:
            report = await copy([SourceRange(dev, lba, n) for lba, n in ranges], dev, dst_lba)
            assert report.offloaded_blocks + report.emulated_blocks == count
        else:
            await dev.copy_offload([(dev, lba, n) for lba, n in ranges], dst_lba)
        model_copy(model, ranges, dst_lba)
        assert await contents(dev) == model, (ranges, dst_lba)


# -- copies: the same storage through other objects -------------------------------------------


def storage_model(model: bytearray, src_block: int, dst_block: int, nblocks: int) -> None:
    """A copy on the storage itself: read first, then written (blocks of the storage)."""
    data = bytes(model[src_block * BS : (src_block + nblocks) * BS])
    model[dst_block * BS : dst_block * BS + len(data)] = data


@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize(
    ("src_lba", "file_block", "staged"),
    [
        # Linear 32.. is file block 0..: the source, file 0..24, overlaps file 8..32.
        (32, 0, 24),
        # Linear 0.. is file block 32..: LBAs that overlap as numbers, apart in the file.
        (0, 32, 0),
    ],
    ids=["overlapping-in-the-file", "apart-in-the-file"],
)
async def test_source_on_a_linear_device_over_the_destinations_file(
    tmp_path: Path, src_lba: int, file_block: int, staged: int, depth: int
) -> None:
    path = tmp_path / "one.img"
    model = bytearray(blocks(64, seed=60))
    path.write_bytes(model)
    under, dst = FileDevice(path, BS), FileDevice(path, BS)  # two objects, one file
    try:
        src = LinearDevice([Segment(under, 32, 32), Segment(under, 0, 32)])
        report = await copy(
            [SourceRange(src, src_lba, 24)], dst, 8, chunk_bytes=2 * BS, depth=depth
        )
        storage_model(model, file_block, 8, 24)
        buf = bytearray(64 * BS)
        await dst.read(0, memoryview(buf))
        assert buf == model
        assert report.staged_blocks == staged and report.emulated_blocks == 24
    finally:
        under.close_sync()
        dst.close_sync()


@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize(
    ("src_lba", "staged"),
    # Linear 40..56 is device 8..24: device 0..16 overlaps it, device 40..56 does not
    # (though its LBAs are the destination's numbers).
    [(0, 16), (40, 0)],
    ids=["overlapping-on-the-device", "apart-on-the-device"],
)
async def test_destination_linear_device_over_the_source_device(
    src_lba: int, staged: int, depth: int
) -> None:
    under = Spy(64)
    model = bytearray(blocks(64, seed=61))
    await under.write(0, model)
    dst = LinearDevice([Segment(under, 32, 32), Segment(under, 0, 32)])
    report = await copy([SourceRange(under, src_lba, 16)], dst, 40, chunk_bytes=2 * BS, depth=depth)
    storage_model(model, src_lba, 8, 16)
    assert await raw(under) == model
    assert report.staged_blocks == staged
    assert report.emulated_blocks == 16 and report.offloaded_blocks == 0


async def test_two_linear_devices_over_one_device_are_one_storage() -> None:
    under = Spy(64)
    layout = [Segment(under, 40, 24), Segment(under, 0, 40)]
    src, dst = LinearDevice(layout), LinearDevice(layout)
    model = await filled(dst, seed=62)
    report = await copy([SourceRange(src, 0, 30)], dst, 6, chunk_bytes=2 * BS, depth=1)
    model_copy(model, [(0, 30)], 6)
    assert await contents(dst) == model == await contents(src)
    assert report.staged_blocks == 30


def test_storage_extents_follow_linear_devices_down_to_the_devices() -> None:
    a, b = MemoryDevice(64 * BS), MemoryDevice(64 * BS)
    inner = LinearDevice([Segment(b, 10, 10), Segment(a, 0, 10)])
    outer = LinearDevice([Segment(a, 30, 5), Segment(inner, 5, 15)])
    (key_a,) = a.medium.keys
    (key_b,) = b.medium.keys
    # Outer 3..15: a 33..35, then inner 5..15 = b 15..20 and a 0..5.
    assert storage_extents(outer, 3, 12) == [
        (key_a, 33 * BS, 35 * BS),
        (key_b, 15 * BS, 20 * BS),
        (key_a, 0, 5 * BS),
    ]


@pytest.mark.parametrize(
    "layout", ["two-objects-one-file", "through-a-linear-device", "nested-overlap"]
)
def test_segments_aliasing_through_other_objects_are_refused(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "one.img"
    path.write_bytes(bytes(64 * BS))
    fa, fb = FileDevice(path, BS), FileDevice(path, BS)
    mem = MemoryDevice(64 * BS)
    try:
        if layout == "two-objects-one-file":
            segments = [Segment(fa, 0, 16), Segment(fb, 8, 16)]
        elif layout == "through-a-linear-device":
            segments = [Segment(mem, 0, 16), Segment(LinearDevice([Segment(mem, 10, 4)]), 0, 4)]
        else:
            inner = LinearDevice([Segment(mem, 40, 8), Segment(mem, 0, 8)])
            segments = [Segment(inner, 8, 8), Segment(mem, 4, 2)]
        with pytest.raises(ValueError, match="segments 0 and 1 map overlapping blocks"):
            LinearDevice(segments)
        # Beside each other on the same storage is fine.
        LinearDevice([Segment(fa, 0, 16), Segment(fb, 16, 16)])
    finally:
        fa.close_sync()
        fb.close_sync()
