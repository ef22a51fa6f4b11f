"""The copy planner (block.copy) and the devices' native copies, against a model.

The model of every device is a bytearray; the model of a copy is "read every
source first, then write their concatenation to the destination" (snapshot
semantics), and of `copy_within` it is memmove.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import tracemalloc
import types
from collections.abc import Generator, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynvmf.block import copy as block_copy
from pynvmf.block import file as block_file
from pynvmf.block.copy import CopyReport, CopyTooLarge, SourceRange
from pynvmf.block.device import (
    BlockDevice,
    BlockRangeError,
    Buffer,
    Capabilities,
    CopyLimits,
    CopyOffload,
    CopyOne,
    CopyPreparation,
    KnownMedium,
    Medium,
    NativeCopy,
)
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice

pytestmark = pytest.mark.timeout(60)

BS = 512

Device = MemoryDevice | FileDevice


# -- helpers ----------------------------------------------------------------------------------


def pattern(nbytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


async def memory(nblocks: int, seed: int, bs: int = BS) -> tuple[MemoryDevice, bytearray]:
    """A MemoryDevice filled with random data, and its model."""
    dev = MemoryDevice(nblocks * bs, bs)
    model = bytearray(pattern(nblocks * bs, seed))
    await dev.write(0, model)
    return dev, model


async def file_device(
    path: Path, nblocks: int, seed: int, bs: int = BS
) -> tuple[FileDevice, bytearray]:
    dev = FileDevice(path, bs, size_bytes=nblocks * bs, create=True)
    model = bytearray(pattern(nblocks * bs, seed))
    await dev.write(0, model)
    return dev, model


async def contents(dev: Any) -> bytes:
    buf = bytearray(dev.capabilities.size)
    await dev.read(0, memoryview(buf))
    return bytes(buf)


def model_copy(
    models: dict[int, bytearray], sources: Sequence[SourceRange], dst: object, dst_lba: int
) -> None:
    """Snapshot semantics: read all sources, then write them one after another."""
    data = b"".join(
        bytes(models[id(s.device)][s.lba * BS : (s.lba + s.nblocks) * BS]) for s in sources
    )
    models[id(dst)][dst_lba * BS : dst_lba * BS + len(data)] = data


def naive_copy(
    models: dict[int, bytearray], sources: Sequence[SourceRange], dst: object, dst_lba: int
) -> None:
    """Range by range, each read just before it is written: what snapshot semantics is not."""
    lba = dst_lba
    for s in sources:
        chunk = bytes(models[id(s.device)][s.lba * BS : (s.lba + s.nblocks) * BS])
        models[id(dst)][lba * BS : lba * BS + len(chunk)] = chunk
        lba += s.nblocks


def memmove(model: bytearray, src: int, dst: int, length: int) -> None:
    model[dst : dst + length] = bytes(model[src : src + length])


@types.coroutine
def yield_to_loop() -> Generator[None, None, None]:
    """Let every other ready task run once (a bare yield to the event loop)."""
    yield


class SpyDevice:
    """Forwards to a device and records what the planner asks of it. Reads yield to the
    loop once, so that concurrent reads really overlap and can be counted.
    Not a NativeCopy (no copy_within) whatever its capabilities say."""

    def __init__(self, inner: Device, *, native_copy: bool | None = None) -> None:
        self.inner = inner
        caps = inner.capabilities
        self._caps = Capabilities(
            block_size=caps.block_size,
            num_blocks=caps.num_blocks,
            volatile_write_cache=caps.volatile_write_cache,
            native_copy=caps.native_copy if native_copy is None else native_copy,
        )
        self.events: list[tuple[Any, ...]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def read(self, lba: int, buf: memoryview) -> None:
        self.events.append(("read", lba, len(buf)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await yield_to_loop()
            await self.inner.read(lba, buf)
        finally:
            self.in_flight -= 1

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        self.events.append(("write", lba, len(memoryview(data).cast("B")), fua))
        await self.inner.write(lba, data, fua=fua)

    async def flush(self) -> None:
        self.events.append(("flush",))
        await self.inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        raise AssertionError("a copy never zeroes")

    async def deallocate(self, lba: int, nblocks: int) -> None:
        raise AssertionError("a copy never deallocates")

    async def close(self) -> None:
        await self.inner.close()

    def kinds(self) -> list[str]:
        return [e[0] for e in self.events]


class NativeSpyDevice(SpyDevice):
    """A SpyDevice that forwards copy_within too (a NativeCopy)."""

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        self.events.append(("copy_within", src_lba, dst_lba, nblocks, fua))
        await self.inner.copy_within(src_lba, dst_lba, nblocks, fua=fua)


@pytest.fixture
def cfr_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every os.copy_file_range call (count, src offset, dst offset); still performed."""
    calls: list[tuple[int, int, int]] = []
    real = os.copy_file_range

    def spy(src: int, dst: int, count: int, offset_src: int, offset_dst: int) -> int:
        calls.append((count, offset_src, offset_dst))
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", spy)
    return calls


@pytest.fixture
def fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors os.fdatasync was called on (still performed)."""
    calls: list[int] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    return calls


# -- the planner: which path, and the data ------------------------------------------------------


async def test_single_range_on_the_destination_is_native() -> None:
    dev, model = await memory(256, 1)
    report = await block_copy.copy([SourceRange(dev, 10, 20)], dev, 100)
    memmove(model, 10 * BS, 100 * BS, 20 * BS)
    assert await contents(dev) == model
    assert report == CopyReport(native_blocks=20, emulated_blocks=0, staged_blocks=0)


async def test_many_ranges_on_the_destination_are_native() -> None:
    dev, model = await memory(512, 2)
    spy = NativeSpyDevice(dev)
    sources = [SourceRange(spy, lba, n) for lba, n in ((0, 3), (50, 1), (7, 40), (200, 17))]
    models = {id(spy): model}
    report = await block_copy.copy(sources, spy, 300)
    model_copy(models, sources, spy, 300)
    assert await contents(dev) == model
    assert report.native_blocks == 61 and report.emulated_blocks == 0
    assert report.staged_blocks == 0
    # One copy_within per range, to consecutive destination blocks; nothing moved through
    # the caller.
    assert spy.events == [
        ("copy_within", 0, 300, 3, False),
        ("copy_within", 50, 303, 1, False),
        ("copy_within", 7, 304, 40, False),
        ("copy_within", 200, 344, 17, False),
    ]


async def test_memory_to_file_is_emulated(tmp_path: Path) -> None:
    src, src_model = await memory(128, 3)
    dst, dst_model = await file_device(tmp_path / "dst.img", 256, 4)
    sources = [SourceRange(src, 5, 30), SourceRange(src, 100, 28)]
    models = {id(src): src_model, id(dst): dst_model}
    report = await block_copy.copy(sources, dst, 40, chunk_bytes=8 * BS)
    model_copy(models, sources, dst, 40)
    assert await contents(dst) == dst_model
    assert await contents(src) == src_model  # the source is only read
    assert report == CopyReport(native_blocks=0, emulated_blocks=58, staged_blocks=0)
    await dst.close()
    assert (tmp_path / "dst.img").read_bytes() == dst_model


async def test_file_to_memory_is_emulated(tmp_path: Path) -> None:
    src, src_model = await file_device(tmp_path / "src.img", 128, 5)
    dst, dst_model = await memory(128, 6)
    sources = [SourceRange(src, 0, 64), SourceRange(src, 127, 1)]
    models = {id(src): src_model, id(dst): dst_model}
    report = await block_copy.copy(sources, dst, 63)
    model_copy(models, sources, dst, 63)
    assert await contents(dst) == dst_model
    assert report == CopyReport(native_blocks=0, emulated_blocks=65, staged_blocks=0)
    await src.close()


async def test_mixed_sources_native_and_emulated(tmp_path: Path) -> None:
    dst, dst_model = await file_device(tmp_path / "dst.img", 256, 7)
    other, other_model = await memory(64, 8)
    sources = [
        SourceRange(dst, 0, 10),
        SourceRange(other, 3, 20),
        SourceRange(dst, 50, 5),
        SourceRange(other, 60, 4),
    ]
    models = {id(dst): dst_model, id(other): other_model}
    report = await block_copy.copy(sources, dst, 128)
    model_copy(models, sources, dst, 128)
    assert await contents(dst) == dst_model
    assert report == CopyReport(native_blocks=15, emulated_blocks=24, staged_blocks=0)
    await dst.close()


# -- overlap: every source is read before any write ---------------------------------------------


@pytest.mark.parametrize(("src", "dst"), [(10, 14), (14, 10), (0, 1), (1, 0)])
@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_single_range_overlapping_itself_is_memmove(
    tmp_path: Path, kind: str, src: int, dst: int
) -> None:
    dev, model = (
        await memory(64, 9) if kind == "memory" else await file_device(tmp_path / "d", 64, 9)
    )
    report = await block_copy.copy([SourceRange(dev, src, 20)], dev, dst)
    memmove(model, src * BS, dst * BS, 20 * BS)
    assert await contents(dev) == model
    assert report.native_blocks == 20
    await dev.close()


# (sources as (lba, nblocks) on the destination device, dst_lba, naive order gives another result)
OVERLAP_CASES = {
    "later-source-overlaps-earlier-destination": ([(40, 8), (4, 8)], 0, True),
    "forward-chain": ([(0, 8), (8, 8), (16, 8)], 4, True),
    "backward-chain": ([(8, 8), (16, 8)], 0, False),
    "earlier-source-overlaps-later-destination": ([(12, 8), (30, 4)], 4, False),
    "source-repeated-and-overwritten": ([(0, 6), (2, 6), (0, 6)], 3, True),
    "one-overlapping-among-others": ([(100, 4), (20, 10), (110, 2)], 18, True),
}


@pytest.mark.parametrize("native", [True, False], ids=["native-dst", "plain-dst"])
@pytest.mark.parametrize("case", list(OVERLAP_CASES))
async def test_overlapping_ranges_read_all_sources_first(case: str, native: bool) -> None:
    ranges, dst_lba, discriminating = OVERLAP_CASES[case]
    dev, model = await memory(128, 10)
    spy = NativeSpyDevice(dev) if native else SpyDevice(dev, native_copy=False)
    sources = [SourceRange(spy, lba, n) for lba, n in ranges]
    naive = {id(spy): bytearray(model)}
    naive_copy(naive, sources, spy, dst_lba)
    models = {id(spy): model}
    model_copy(models, sources, spy, dst_lba)
    if discriminating:  # the case tells the two semantics apart
        assert naive[id(spy)] != model

    report = await block_copy.copy(sources, spy, dst_lba, chunk_bytes=2 * BS)

    assert await contents(dev) == model
    total = sum(n for _lba, n in ranges)
    assert report.native_blocks + report.emulated_blocks == total
    overlapping = [(lba, n) for lba, n in ranges if lba < dst_lba + total and dst_lba < lba + n]
    assert report.staged_blocks == sum(n for _lba, n in overlapping)
    # Every overlapping source was read whole before the first block was written.
    kinds = spy.kinds()
    first_change = min(i for i, k in enumerate(kinds) if k in ("write", "copy_within"))
    early_reads = [(lba, nbytes // BS) for _k, lba, nbytes in spy.events[:first_change]]
    assert all(r in early_reads for r in overlapping), (overlapping, early_reads)


async def test_overlap_with_a_source_on_another_device_is_not_staged() -> None:
    dst, dst_model = await memory(64, 11)
    other, other_model = await memory(64, 12)
    # The other device's range 0..16 has the same LBAs as the destination: no overlap.
    sources = [SourceRange(other, 0, 16), SourceRange(dst, 30, 4)]
    models = {id(dst): dst_model, id(other): other_model}
    report = await block_copy.copy(sources, dst, 0)
    model_copy(models, sources, dst, 0)
    assert await contents(dst) == dst_model
    assert report == CopyReport(native_blocks=4, emulated_blocks=16, staged_blocks=0)


# -- overlap through another object of the same storage ----------------------------------------

# (sources as (lba, nblocks), dst_lba): ranges the processing order changes the result of.
SAME_STORAGE_CASES = {
    # One range, moved forward by more than the emulation pipeline reads ahead: chunks
    # copied in order read what earlier chunks have already written.
    "forward-shift": ([(0, 48)], 8),
    "backward-shift": ([(8, 48)], 0),
    **{name: (ranges, dst) for name, (ranges, dst, _naive) in OVERLAP_CASES.items()},
}


async def open_again(path: Path, how: str) -> FileDevice:
    """A second FileDevice on the file at `path`: by the same path, through a hard link,
    or read-only (a source need not be writable)."""
    if how == "hard-link":
        link = path.with_name(path.name + ".link")
        os.link(path, link)
        return FileDevice(link, BS)
    return FileDevice(path, BS, read_only=how == "read-only")


@pytest.mark.parametrize(
    ("case", "how", "depth"),
    [
        *[(case, "same-path", d) for case in SAME_STORAGE_CASES for d in (1, 4)],
        ("forward-shift", "hard-link", 4),
        ("forward-shift", "read-only", 4),
    ],
)
async def test_two_file_devices_on_one_file_are_one_storage(
    tmp_path: Path, case: str, how: str, depth: int
) -> None:
    ranges, dst_lba = SAME_STORAGE_CASES[case]
    path = tmp_path / "one.img"
    dst, model = await file_device(path, 128, 50)
    src = await open_again(path, how)
    assert src is not dst and src.medium == dst.medium
    sources = [SourceRange(src, lba, n) for lba, n in ranges]
    # One model for both objects: they are one file.
    models = {id(src): model, id(dst): model}
    model_copy(models, sources, dst, dst_lba)

    report = await block_copy.copy(sources, dst, dst_lba, chunk_bytes=2 * BS, depth=depth)

    assert await contents(dst) == model
    assert await contents(src) == model
    total = sum(n for _lba, n in ranges)
    overlapping = [n for lba, n in ranges if lba < dst_lba + total and dst_lba < lba + n]
    assert overlapping  # every case has a source to stage
    # copy_within is the destination object's: a source through another object is not
    # copied natively, even on the same file.
    assert report == CopyReport(emulated_blocks=total, staged_blocks=sum(overlapping))
    await src.close()
    await dst.close()
    assert path.read_bytes() == model


async def test_file_devices_on_different_files_are_not_one_storage(tmp_path: Path) -> None:
    dst, dst_model = await file_device(tmp_path / "a.img", 64, 51)
    other, other_model = await file_device(tmp_path / "b.img", 64, 52)
    assert dst.medium != other.medium
    # The same LBAs as the destination, on another file: nothing to stage.
    sources = [SourceRange(other, 0, 16), SourceRange(other, 10, 8)]
    report = await block_copy.copy(sources, dst, 4)
    model_copy({id(dst): dst_model, id(other): other_model}, sources, dst, 4)
    assert await contents(dst) == dst_model
    assert report == CopyReport(emulated_blocks=24)
    await dst.close()
    await other.close()


async def test_two_memory_devices_are_not_one_storage() -> None:
    dst, dst_model = await memory(64, 53)
    other, other_model = await memory(64, 54)
    assert not set(dst.medium.keys) & set(other.medium.keys)
    # Overlapping LBAs, two private mappings: no staging.
    sources = [SourceRange(other, 0, 16), SourceRange(other, 4, 8)]
    report = await block_copy.copy(sources, dst, 2)
    model_copy({id(dst): dst_model, id(other): other_model}, sources, dst, 2)
    assert await contents(dst) == dst_model
    assert report.staged_blocks == 0 and report.emulated_blocks == 24


class NamedDevice(SpyDevice):
    """A SpyDevice that says it is the storage `keys`, from `offset` blocks on (only says:
    its I/O goes to the device it wraps, at the LBAs it is given)."""

    def __init__(self, inner: Device, keys: tuple[str, ...], offset: int = 0) -> None:
        super().__init__(inner, native_copy=False)
        self._medium = Medium(keys, offset * BS)

    @property
    def medium(self) -> Medium:
        return self._medium


@pytest.mark.parametrize(
    ("dst_keys", "dst_offset", "src_keys", "src_offset", "src_lba", "staged"),
    [
        # One name in common is enough (a namespace's NQN + NSID, or its NGUID).
        (("nqn:1", "nguid:a"), 0, ("nqn:2", "nguid:a"), 0, 14, 8),
        (("nqn:1",), 0, ("nqn:2",), 0, 14, 0),
        # Offsets translate LBAs to the storage: source LBA 20 is storage block 20, as
        # is destination LBA 12 with its offset of 8 blocks.
        (("disk",), 8, ("disk",), 0, 20, 8),
        # The same LBAs, apart on the storage.
        (("disk",), 0, ("disk",), 64, 14, 0),
    ],
    ids=["shared-key", "no-shared-key", "offsets-meet", "offsets-apart"],
)
async def test_media_with_a_key_in_common_overlap_at_their_offsets(
    dst_keys: tuple[str, ...],
    dst_offset: int,
    src_keys: tuple[str, ...],
    src_offset: int,
    src_lba: int,
    staged: int,
) -> None:
    storage, _model = await memory(128, 55)
    dst = NamedDevice(storage, dst_keys, dst_offset)
    src = NamedDevice(storage, src_keys, src_offset)
    report = await block_copy.copy([SourceRange(src, src_lba, 8)], dst, 12)
    assert report == CopyReport(emulated_blocks=8, staged_blocks=staged)


async def test_a_device_that_does_not_say_is_its_own_storage() -> None:
    dev, _model = await memory(64, 56)
    spy = SpyDevice(dev)
    assert not isinstance(spy, KnownMedium)
    (extent,) = block_copy.storage_extents(spy, 3, 2)
    _key, start, end = extent
    assert (start, end) == (3 * BS, 5 * BS)
    assert block_copy.storage_extents(SpyDevice(dev), 3, 2)[0][0] != extent[0]
    # Another wrapper of the same memory is taken for another device: nothing tells.
    report = await block_copy.copy([SourceRange(SpyDevice(dev), 0, 8)], spy, 4)
    assert report.staged_blocks == 0


# -- refusals: nothing written -----------------------------------------------------------------


async def test_staging_limit_refuses_and_writes_nothing() -> None:
    dev, model = await memory(128, 13)
    spy = NativeSpyDevice(dev)
    sources = [SourceRange(spy, 0, 8), SourceRange(spy, 8, 8)]  # both overlap dst 4..20
    with pytest.raises(CopyTooLarge):
        await block_copy.copy(sources, spy, 4, staging_limit=16 * BS - 1)
    assert await contents(dev) == model
    assert [k for k in spy.kinds() if k != "read"] == []
    # Exactly at the limit it is allowed.
    report = await block_copy.copy(sources, spy, 4, staging_limit=16 * BS)
    model_copy({id(spy): model}, sources, spy, 4)
    assert await contents(dev) == model
    assert report.staged_blocks == 16


async def test_staging_limit_refuses_before_allocating_the_staging_memory() -> None:
    """The limit bounds memory: a refused copy must not first allocate what it refuses."""
    nblocks = (32 << 20) // BS
    dev = MemoryDevice(2 * nblocks * BS, BS)
    sources = [SourceRange(dev, 0, nblocks // 2), SourceRange(dev, nblocks // 2, nblocks // 2)]
    tracemalloc.start()
    try:
        with pytest.raises(CopyTooLarge):
            await block_copy.copy(sources, dev, 1, staging_limit=1 << 20)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        dev.close_sync()
    assert peak < 2 << 20, f"{peak} bytes allocated to refuse a copy over a 1 MiB staging limit"


@pytest.mark.parametrize(
    "bad",
    [
        "source-past-end",
        "source-negative",
        "other-device-source-past-end",
        "destination-past-end",
        "destination-negative",
    ],
)
async def test_range_outside_its_device_raises_and_writes_nothing(bad: str) -> None:
    dev, model = await memory(64, 14)
    other, other_model = await memory(32, 15)
    spy = NativeSpyDevice(dev)
    other_spy = SpyDevice(other)
    sources = [SourceRange(spy, 0, 4), SourceRange(other_spy, 0, 4), SourceRange(spy, 8, 4)]
    dst_lba = 40
    if bad == "source-past-end":
        sources.append(SourceRange(spy, 62, 3))
    elif bad == "source-negative":
        sources.append(SourceRange(spy, -1, 2))
    elif bad == "other-device-source-past-end":
        sources.append(SourceRange(other_spy, 30, 3))
    elif bad == "destination-past-end":
        dst_lba = 64 - 11
    else:
        dst_lba = -1
    with pytest.raises(BlockRangeError):
        await block_copy.copy(sources, spy, dst_lba)
    assert await contents(dev) == model
    assert await contents(other) == other_model
    assert spy.events == [] and other_spy.events == []


async def test_block_size_mismatch_raises_and_writes_nothing() -> None:
    dev, model = await memory(64, 16)
    big, _ = await memory(16, 17, bs=4096)
    spy = NativeSpyDevice(dev)
    with pytest.raises(ValueError, match="block size"):
        await block_copy.copy([SourceRange(spy, 0, 4), SourceRange(big, 0, 1)], spy, 20)
    assert await contents(dev) == model
    assert spy.events == []


@pytest.mark.parametrize("where", ["native", "emulated", "staged"])
async def test_fua_flushes_the_destination_after_every_write(where: str) -> None:
    dev, model = await memory(64, 18)
    other, other_model = await memory(64, 19)
    spy = NativeSpyDevice(dev)
    if where == "native":
        sources = [SourceRange(spy, 0, 4), SourceRange(spy, 10, 4)]
    elif where == "emulated":
        sources = [SourceRange(other, 0, 4), SourceRange(other, 10, 4)]
    else:
        sources = [SourceRange(spy, 20, 4), SourceRange(spy, 26, 4)]  # both overlap 22..30
    dst_lba = 22 if where == "staged" else 24
    report = await block_copy.copy(sources, spy, dst_lba, fua=True, chunk_bytes=BS)
    model_copy({id(spy): model, id(other): other_model}, sources, spy, dst_lba)
    assert await contents(dev) == model
    kinds = spy.kinds()
    assert kinds.count("flush") == 1
    assert kinds[-1] == "flush", kinds  # after the last write, before returning
    assert getattr(report, f"{where}_blocks") == 8


# -- emulation: depth and chunking ------------------------------------------------------------


@pytest.mark.parametrize(("depth", "nblocks"), [(4, 1000), (4, 3), (1, 100), (3, 64)])
async def test_emulation_chunks_with_bounded_depth(depth: int, nblocks: int) -> None:
    src_dev, src_model = await memory(1024, 20)
    dst, dst_model = await memory(1024, 21)
    src = SpyDevice(src_dev)
    chunk_blocks = 16
    sources = [SourceRange(src, 7, nblocks)]
    report = await block_copy.copy(sources, dst, 11, chunk_bytes=chunk_blocks * BS, depth=depth)
    model_copy({id(src): src_model, id(dst): dst_model}, sources, dst, 11)
    assert await contents(dst) == dst_model
    assert report == CopyReport(emulated_blocks=nblocks)
    reads = [e for e in src.events if e[0] == "read"]
    nchunks = -(-nblocks // chunk_blocks)
    assert len(reads) == nchunks
    assert all(n <= chunk_blocks * BS for _k, _lba, n in reads)
    # Every block read exactly once.
    assert sorted((lba, lba + n // BS) for _k, lba, n in reads) == [
        (lba, min(lba + chunk_blocks, 7 + nblocks)) for lba in range(7, 7 + nblocks, chunk_blocks)
    ]
    assert src.max_in_flight <= depth
    assert src.max_in_flight == min(depth, nchunks)  # and the depth is actually used


class PipelineSpy(SpyDevice):
    """Logs when reads start and writes start and end, and makes writes take a few
    loop turns, so a test can see what ran while a write was in flight."""

    def __init__(self, inner: Device, log: list[tuple[str, int]], fail_at: int = -1) -> None:
        super().__init__(inner)
        self.log = log
        self.fail_at = fail_at

    async def read(self, lba: int, buf: memoryview) -> None:
        self.log.append(("read start", lba))
        await super().read(lba, buf)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        self.log.append(("write start", lba))
        for _ in range(3):
            await yield_to_loop()
        if lba == self.fail_at:
            raise OSError(errno.EIO, "I/O error")
        await super().write(lba, data, fua=fua)
        self.log.append(("write end", lba))


async def test_emulation_reads_the_next_chunk_while_writing_the_previous() -> None:
    # One worker: an emulated copy over a network would otherwise leave the link's
    # read direction idle during every write and the write direction during every read.
    src_dev, src_model = await memory(256, 40)
    dst_dev, dst_model = await memory(256, 41)
    log: list[tuple[str, int]] = []
    src, dst = PipelineSpy(src_dev, log), PipelineSpy(dst_dev, log)
    sources = [SourceRange(src, 0, 64)]
    await block_copy.copy(sources, dst, 100, chunk_bytes=16 * BS, depth=1)
    model_copy({id(src): src_model, id(dst): dst_model}, sources, dst, 100)
    assert await contents(dst_dev) == dst_model
    for k in range(1, 4):
        # Chunk k is read before chunk k - 1's write has ended (the write's task may
        # start on the next loop turn, after the read was issued).
        assert log.index(("read start", 16 * k)) < log.index(("write end", 100 + 16 * (k - 1)))
    # Never more than one write in flight per worker: its other buffer is being read.
    in_flight = 0
    for what, _lba in log:
        in_flight += {"write start": 1, "write end": -1}.get(what, 0)
        assert in_flight <= 1


async def test_emulation_failed_background_write_stops_the_copy() -> None:
    src_dev, _ = await memory(256, 42)
    dst_dev, _ = await memory(256, 43)
    log: list[tuple[str, int]] = []
    src, dst = PipelineSpy(src_dev, log), PipelineSpy(dst_dev, log, fail_at=116)
    with pytest.raises(OSError) as info:
        await block_copy.copy([SourceRange(src, 0, 128)], dst, 100, chunk_bytes=16 * BS, depth=1)
    assert info.value.errno == errno.EIO
    # The chunk read while the write failed is not written; nothing after it is read.
    assert ("write start", 132) not in log
    assert ("read start", 48) not in log, log


async def test_emulation_writes_through_a_non_native_destination() -> None:
    src, src_model = await memory(64, 22)
    dst_dev, dst_model = await memory(64, 23)
    dst = SpyDevice(dst_dev, native_copy=False)
    # A source on the destination device itself, not overlapping: emulated as well.
    sources = [SourceRange(dst, 0, 8), SourceRange(src, 0, 8)]
    report = await block_copy.copy(sources, dst, 32, chunk_bytes=3 * BS)
    model_copy({id(src): src_model, id(dst): dst_model}, sources, dst, 32)
    assert await contents(dst_dev) == dst_model
    assert report == CopyReport(emulated_blocks=16)
    assert "copy_within" not in dst.kinds()


# -- zero-length copies ------------------------------------------------------------------------


class PreparingOffloadDevice(SpyDevice):
    """A CopyOffload whose other-device sources are offloadable only if its
    prepare_copy was granted (as a remote namespace after enabling Copy formats 2h/3h)."""

    def __init__(self, inner: Device, *, grant: bool) -> None:
        super().__init__(inner)
        self.grant = grant
        self.granted: set[int] = set()

    @property
    def copy_limits(self) -> CopyLimits:
        return CopyLimits(1 << 16, 1 << 16, 256)

    async def prepare_copy(self, sources: Iterable[BlockDevice]) -> None:
        devices = list(sources)
        self.events.append(("prepare", devices))
        await yield_to_loop()
        if self.grant:
            self.granted = {id(d) for d in devices}

    def can_copy_from(self, source: BlockDevice) -> bool:
        self.events.append(("can_copy_from", source))
        return source is self or id(source) in self.granted

    async def copy_offload(
        self, sources: Sequence[tuple[BlockDevice, int, int]], dst_lba: int, *, fua: bool = False
    ) -> None:
        self.events.append(("offload", [(lba, n) for _d, lba, n in sources], dst_lba))
        for device, lba, n in sources:
            buf = bytearray(n * BS)
            await device.read(lba, memoryview(buf))
            await self.inner.write(dst_lba, buf)
            dst_lba += n


@pytest.mark.parametrize("grant", [True, False], ids=["granted", "refused"])
async def test_planner_prepares_the_destination_before_asking_can_copy_from(grant: bool) -> None:
    a, model_a = await memory(256, 1)
    b, model_b = await memory(256, 2)
    dst = PreparingOffloadDevice(a, grant=grant)
    other, unused = SpyDevice(b), SpyDevice(MemoryDevice(8 * BS, BS))
    assert isinstance(dst, CopyOffload) and isinstance(dst, CopyPreparation)
    models = {id(dst): model_a, id(other): model_b, id(unused): bytearray(8 * BS)}
    sources = [
        SourceRange(other, 0, 8),
        SourceRange(dst, 100, 8),
        SourceRange(unused, 0, 0),  # empty: not among the copy's devices
        SourceRange(other, 20, 4),
    ]

    report = await block_copy.copy(sources, dst, 200)

    model_copy(models, sources, dst, 200)
    assert await contents(a) == model_a
    # Prepared once, with each device of a non-empty source once, before any question.
    assert dst.kinds()[0] == "prepare" and dst.kinds().count("prepare") == 1
    assert dst.events[0][1] == [other, dst]
    if grant:
        assert report == CopyReport(offloaded_blocks=20, commands=1)
    else:
        assert report == CopyReport(offloaded_blocks=8, emulated_blocks=12, commands=1)


class CopyOneDevice(PreparingOffloadDevice):
    """A PreparingOffloadDevice that also takes one range of itself in one call
    (CopyOne), or declines it when `take_one` is false."""

    def __init__(self, inner: Device, *, take_one: bool) -> None:
        super().__init__(inner, grant=True)
        self.take_one = take_one

    async def copy_one(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> bool:
        self.events.append(("one", src_lba, dst_lba, nblocks, fua))
        if not self.take_one:
            return False
        await self.copy_offload([(self, src_lba, nblocks)], dst_lba)
        return True


@pytest.mark.parametrize("take_one", [True, False], ids=["taken", "declined"])
async def test_a_single_range_within_a_copy_one_device_is_one_call(take_one: bool) -> None:
    a, model = await memory(256, 3)
    dev = CopyOneDevice(a, take_one=take_one)
    assert isinstance(dev, CopyOne)
    report = await block_copy.copy([SourceRange(dev, 10, 8)], dev, 100, fua=True)
    model[100 * BS : 108 * BS] = model[10 * BS : 18 * BS]
    assert await contents(a) == model
    assert report == CopyReport(offloaded_blocks=8, commands=1)
    assert dev.events[0] == ("one", 10, 100, 8, True)
    if take_one:
        assert dev.kinds() == ["one", "offload", "read"]
    else:
        # Declined: the planner's general rules (prepare, ask, one offload request).
        assert dev.kinds()[1:] == ["prepare", "can_copy_from", "offload", "read"]
    # A range over its own destination is never sent to copy_one: it is staged.
    dev.events.clear()
    await block_copy.copy([SourceRange(dev, 100, 8)], dev, 104)
    assert "one" not in dev.kinds()


async def test_zero_length_copies_change_nothing(tmp_path: Path) -> None:
    dev, model = await memory(32, 24)
    fdev, fmodel = await file_device(tmp_path / "z.img", 32, 25)
    assert await block_copy.copy([], dev, 32) == CopyReport()  # at the very end: still inside
    report = await block_copy.copy([SourceRange(dev, 5, 0), SourceRange(fdev, 32, 0)], dev, 0)
    assert report.native_blocks == 0 and report.emulated_blocks == 0
    await dev.copy_within(0, 32, 0)
    await fdev.copy_within(3, 7, 0)
    await fdev.copy_within(32, 0, 0)
    assert await contents(dev) == model
    assert await contents(fdev) == fmodel
    with pytest.raises(BlockRangeError):
        await block_copy.copy([], dev, 33)
    await fdev.close()


# -- the devices' native copies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "n"), [(0, 64, 64), (64, 0, 64), (0, 1, 127), (1, 0, 127), (5, 5, 10)]
)
async def test_memory_copy_within_is_memmove(src: int, dst: int, n: int) -> None:
    dev, model = await memory(128, 26)
    assert isinstance(dev, NativeCopy) and dev.capabilities.native_copy
    await dev.copy_within(src, dst, n)
    memmove(model, src * BS, dst * BS, n * BS)
    assert await contents(dev) == model


@pytest.mark.parametrize(("src", "dst", "n"), [(0, 1, 128), (1, 0, 128), (-1, 0, 1), (0, -1, 1)])
async def test_memory_copy_within_out_of_range(src: int, dst: int, n: int) -> None:
    dev, model = await memory(128, 27)
    with pytest.raises(BlockRangeError):
        await dev.copy_within(src, dst, n)
    assert await contents(dev) == model


@pytest.mark.parametrize(("src", "dst", "n"), [(0, 100, 50), (100, 0, 50), (10, 60, 50)])
async def test_file_copy_within_disjoint_uses_copy_file_range(
    tmp_path: Path, cfr_calls: list[tuple[int, int, int]], src: int, dst: int, n: int
) -> None:
    dev, model = await file_device(tmp_path / "f.img", 256, 28)
    assert isinstance(dev, NativeCopy) and dev.capabilities.native_copy
    await dev.copy_within(src, dst, n)
    memmove(model, src * BS, dst * BS, n * BS)
    assert await contents(dev) == model
    assert cfr_calls, "copy_file_range was not used for disjoint ranges"
    assert cfr_calls[0] == (n * BS, src * BS, dst * BS)
    await dev.close()
    assert (tmp_path / "f.img").read_bytes() == model


@pytest.mark.parametrize("err", [errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP])
async def test_file_copy_within_falls_back_when_copy_file_range_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    dev, model = await file_device(tmp_path / "f.img", 256, 29)
    real = os.copy_file_range
    calls: list[int] = []

    def partial_then_refuse(src: int, dst: int, count: int, osrc: int, odst: int) -> int:
        calls.append(count)
        if len(calls) == 1:  # the first call copies part of the range, then it stops working
            return real(src, dst, min(count, 3 * BS), osrc, odst)
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "copy_file_range", partial_then_refuse)
    monkeypatch.setattr(block_file, "_COPY_CHUNK", 5 * BS)
    await dev.copy_within(10, 120, 40)
    memmove(model, 10 * BS, 120 * BS, 40 * BS)
    assert await contents(dev) == model
    assert len(calls) == 2
    await dev.close()


async def test_file_copy_within_other_copy_file_range_errors_propagate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, _model = await file_device(tmp_path / "f.img", 64, 30)

    def broken(*_args: int) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "copy_file_range", broken)
    with pytest.raises(OSError) as info:
        await dev.copy_within(0, 32, 8)
    assert info.value.errno == errno.EIO
    await dev.close()


@pytest.mark.parametrize("chunk", [1000, 3 * BS, 64 * BS, 1 << 20], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize(
    ("src", "dst", "n"),
    [(10, 11, 40), (11, 10, 40), (0, 20, 40), (20, 0, 40), (3, 9, 7), (9, 3, 7)],
    ids=["fwd1", "back1", "fwd-half", "back-half", "fwd-small", "back-small"],
)
async def test_file_copy_within_overlapping_bounces_as_memmove(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cfr_calls: list[tuple[int, int, int]],
    chunk: int,
    src: int,
    dst: int,
    n: int,
) -> None:
    monkeypatch.setattr(block_file, "_COPY_CHUNK", chunk)
    dev, model = await file_device(tmp_path / "f.img", 64, 31)
    await dev.copy_within(src, dst, n)
    memmove(model, src * BS, dst * BS, n * BS)
    assert await contents(dev) == model
    assert cfr_calls == []  # the kernel refuses overlapping ranges of one file: not tried
    await dev.close()
    assert (tmp_path / "f.img").read_bytes() == model


async def test_file_copy_within_fua_syncs(tmp_path: Path, fdatasyncs: list[int]) -> None:
    dev, model = await file_device(tmp_path / "f.img", 64, 32)
    await dev.copy_within(0, 32, 8)
    assert fdatasyncs == []
    await dev.copy_within(8, 40, 8, fua=True)
    assert fdatasyncs == [dev.fileno()]
    memmove(model, 0, 32 * BS, 8 * BS)
    memmove(model, 8 * BS, 40 * BS, 8 * BS)
    assert os.pread(dev.fileno(), len(model), 0) == model
    await dev.close()


async def test_file_copy_within_checks_range_and_read_only(tmp_path: Path) -> None:
    path = tmp_path / "f.img"
    dev, model = await file_device(path, 64, 33)
    for src, dst, n in ((0, 60, 5), (60, 0, 5), (-1, 0, 1), (0, 0, 65)):
        with pytest.raises(BlockRangeError):
            await dev.copy_within(src, dst, n)
    await dev.close()
    ro = FileDevice(path, BS, read_only=True)
    with pytest.raises(OSError) as info:
        await ro.copy_within(0, 10, 4)
    assert info.value.errno == errno.EROFS
    await ro.close()
    assert path.read_bytes() == model


# -- property: random range lists on memory devices --------------------------------------------

PROP_BLOCKS = 48

range_st = st.tuples(
    st.booleans(),  # on the destination device (else on the other one)
    st.integers(-2, PROP_BLOCKS + 2),
    st.integers(0, 20),
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ranges=st.lists(range_st, max_size=6),
    dst_lba=st.integers(-1, PROP_BLOCKS),
    chunk_blocks=st.integers(1, 8),
    depth=st.integers(1, 4),
    native=st.booleans(),
    seed=st.integers(0, 1 << 16),
)
def test_property_random_ranges_match_the_model(
    ranges: list[tuple[bool, int, int]],
    dst_lba: int,
    chunk_blocks: int,
    depth: int,
    native: bool,
    seed: int,
) -> None:
    async def scenario() -> None:
        dev, model = await memory(PROP_BLOCKS, seed)
        other, other_model = await memory(PROP_BLOCKS, seed + 1)
        dst: Any = dev if native else SpyDevice(dev, native_copy=False)
        sources = [SourceRange(dst if on_dst else other, lba, n) for on_dst, lba, n in ranges]
        total = sum(n for _d, _l, n in ranges)
        valid = all(lba >= 0 and lba + n <= PROP_BLOCKS for _d, lba, n in ranges) and (
            dst_lba >= 0 and dst_lba + total <= PROP_BLOCKS
        )
        if not valid:
            with pytest.raises(BlockRangeError):
                await block_copy.copy(sources, dst, dst_lba)
        else:
            models = {id(dst): model, id(other): other_model}
            model_copy(models, sources, dst, dst_lba)
            report = await block_copy.copy(
                sources, dst, dst_lba, chunk_bytes=chunk_blocks * BS, depth=depth
            )
            assert report.native_blocks + report.emulated_blocks == total
            if not native:
                assert report.native_blocks == 0
        assert await contents(dev) == model
        assert await contents(other) == other_model

    run(scenario())


# -- the memory a plan holds ------------------------------------------------------------------


async def _run_traced(plan: block_copy.CopyPlan) -> int:
    """Run `plan`; the most memory Python allocated while it ran, above what it started with."""
    tracemalloc.start()
    try:
        base, _peak = tracemalloc.get_traced_memory()
        await plan.run()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base


# Besides its buffers a run allocates small objects (tasks, views, frames): a few KiB.
_RUN_OVERHEAD = 64 << 10


@pytest.mark.parametrize(
    "kind", ["emulated", "staged", "staged-and-emulated", "native", "many-small-emulated"]
)
async def test_plan_memory_bounds_what_the_copy_allocates(kind: str) -> None:
    nblocks = (8 << 20) // BS
    dev, model = await memory(nblocks, 40)
    other, other_model = await memory(nblocks, 41)
    mib = (1 << 20) // BS
    if kind == "emulated":  # 4 MiB from another device: 4 workers x 2 chunks of 1 MiB
        sources, dst_lba = [SourceRange(other, 0, 4 * mib)], 0
    elif kind == "staged":  # two ranges over the destination: staged, 3 MiB
        sources, dst_lba = [SourceRange(dev, mib, mib), SourceRange(dev, 2 * mib, 2 * mib)], mib
    elif kind == "staged-and-emulated":
        sources = [SourceRange(dev, 0, mib), SourceRange(other, 0, 3 * mib)]
        dst_lba = mib // 2
    elif kind == "native":
        sources, dst_lba = [SourceRange(dev, 0, mib), SourceRange(dev, 2 * mib, mib)], 5 * mib
    else:  # many ranges smaller than a chunk: buffers of the largest one, not of a chunk
        sources = [SourceRange(other, i * 64, 16) for i in range(100)]
        dst_lba = 0
    expected = model.copy()
    data = b"".join(
        bytes((model if s.device is dev else other_model)[s.lba * BS : (s.lba + s.nblocks) * BS])
        for s in sources
    )
    expected[dst_lba * BS : dst_lba * BS + len(data)] = data
    plan = await block_copy.plan_copy(sources, dev, dst_lba)
    if kind == "native":
        assert plan.memory == 0
    elif kind == "many-small-emulated":
        assert plan.memory == 2 * 4 * 16 * BS
    used = await _run_traced(plan)
    assert used <= plan.memory + _RUN_OVERHEAD, (used, plan.memory)
    assert plan.memory <= 2 * block_copy.EMULATION_DEPTH * block_copy.EMULATION_CHUNK + (4 << 20)
    got = bytearray(nblocks * BS)
    await dev.read(0, memoryview(got))
    assert got == expected
    del other_model


async def test_a_memory_limit_shrinks_the_emulation_to_fit() -> None:
    nblocks = (16 << 20) // BS
    dev, _model = await memory(nblocks, 42)
    other, other_model = await memory(nblocks, 43)
    limit = 300 << 10
    sources = [SourceRange(other, 0, nblocks // 2), SourceRange(other, nblocks // 2 + 7, 100)]
    unlimited = await block_copy.plan_copy(sources, dev, 5)
    assert unlimited.memory == 2 * block_copy.EMULATION_DEPTH * block_copy.EMULATION_CHUNK
    plan = await block_copy.plan_copy(sources, dev, 5, memory_limit=limit)
    assert 0 < plan.memory <= limit
    used = await _run_traced(plan)
    assert used <= limit + _RUN_OVERHEAD
    got = bytearray((nblocks // 2 + 100) * BS)
    await dev.read(5, memoryview(got))
    half = nblocks // 2 * BS
    assert got == other_model[:half] + other_model[half + 7 * BS : half + 107 * BS]


async def test_staging_over_the_memory_limit_is_refused_before_anything_is_written() -> None:
    dev, model = await memory(4096, 44)
    spy = NativeSpyDevice(dev)
    sources = [SourceRange(spy, 0, 1024), SourceRange(spy, 1024, 1024)]
    with pytest.raises(CopyTooLarge):
        await block_copy.plan_copy(sources, spy, 512, memory_limit=1024 * BS)
    # Staging that fits, with emulation beside it that must shrink around it, is planned.
    plan = await block_copy.plan_copy(sources, spy, 512, memory_limit=2048 * BS + 64 * BS)
    assert plan.memory <= 2048 * BS + 64 * BS
    assert spy.events == []
    got = bytearray(4096 * BS)
    await dev.read(0, memoryview(got))
    assert got == model
