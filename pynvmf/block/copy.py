"""The copy planner: the one place that decides, for each source range of a copy,
whether the destination offloads it (a multi-range copy request the device carries
out itself: an NVMe Copy command on a remote namespace), copies it natively inside
a local device, or the data is moved by emulation (read + write with bounded memory).

A copy takes source ranges, possibly on several devices, and writes them one
after another to consecutive blocks of one destination. Its result is defined
even when sources and the destination overlap: every source is read before any
destination block it overlaps is written (the result of reading all sources
first), so the outcome never depends on the order in which ranges are processed.

"On the destination device" is about storage, not objects: two objects may be the same
storage (two FileDevices on one file, two RemoteNamespaces for one namespace reached
through two controllers, a LinearDevice whose segments lie on the destination). A
source object that is the destination object is compared by LBA; any other source is
compared with the destination by what each device says its storage is
(`storage_extents`: the `medium` of a `KnownMedium`, the segments of a `MappedDevice`,
else the object itself), byte ranges on the same storage key being what overlaps. A
native copy (`copy_within`) is still a method of the destination: only a source that is
the destination object itself can use it.

Decision rules, per source range, in order of preference:

1. Staged: a source on the destination device that overlaps the destination range
   is read into memory before anything is written, then written back (emulation).
   The one exception is a copy of a single range on a device with a native copy,
   which has memmove semantics and needs no staging.
2. Offloaded: the destination implements `CopyOffload` and `can_copy_from` the
   source's device (asked once the destination, if it is a `CopyPreparation`, has
   prepared for the copy's sources: enabled what such copies need, or found that it
   cannot). Consecutive offloaded ranges are batched into requests that fit
   the destination's `copy_limits`: a range longer than `max_range_blocks` is
   split, a batch is cut at `max_ranges` ranges and at `max_blocks` blocks.
3. Native: the source is the destination device (the same object) and that device
   copies within itself (`Capabilities.native_copy` and `NativeCopy`).
4. Emulated: read + write in chunks, any mix of devices.

Once sources overlapping the destination are staged, no step reads a block another
step writes, so every step (an offload request, a native copy, an emulation chunk)
may run concurrently with the others: up to `depth` of them are in flight at once.
Each of the `depth` workers reads its next emulation chunk while the previous one is
being written, so an emulated copy over a network keeps both directions busy instead
of alternating between a read phase and a write phase.

A plan says how much memory carrying it out holds at most (`CopyPlan.memory`: staging
buffers plus emulation buffers), so that a caller with a memory budget (the target,
for a host's Copy) can acquire it before anything runs; with `memory_limit` the plan
shrinks its emulation (fewer workers, then smaller chunks) to fit, and refuses with
CopyTooLarge only when the staging alone cannot.

A copy of one range inside one device is the common small case (a host's 8 KiB Copy):
`copy_blocks` and `copy` decide it without building a plan (the same rules: a native
copy has memmove semantics, an offload device gets one request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from pynvmf.block import copy_now as _copy_now
from pynvmf.block.device import (
    BlockDevice,
    CopyLimits,
    CopyOffload,
    CopyOne,
    CopyPreparation,
    KnownMedium,
    MappedDevice,
    Medium,
    NativeCopy,
    check_range,
)

EMULATION_CHUNK = 1 << 20  # bytes per read + write step of an emulated copy
EMULATION_DEPTH = 4  # steps in flight at once: emulation memory is 2 * DEPTH * CHUNK
STAGING_LIMIT = 64 << 20  # the most a copy may buffer to honour overlapping ranges


class CopyTooLarge(ValueError):
    """The copy's overlapping sources would need more staging memory than allowed
    (`staging_limit`), or more memory in all than `memory_limit`."""


@dataclass(slots=True)
class SourceRange:
    """`nblocks` blocks of `device` from `lba`. Not frozen, only because a frozen
    dataclass is built through object.__setattr__, which costs more than the rest of a
    small copy's planning; treat it as immutable (the planner tells ranges apart by
    identity, never by value)."""

    device: BlockDevice
    lba: int
    nblocks: int


@dataclass(slots=True)
class CopyReport:
    """What the planner did: how many blocks each path moved, and how many copy
    requests (NVMe Copy commands, for a remote namespace) were offloaded."""

    native_blocks: int = 0
    emulated_blocks: int = 0
    staged_blocks: int = 0  # also counted in emulated_blocks: staged data is written back
    offloaded_blocks: int = 0
    commands: int = 0


# -- the plan -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Offload:
    dst_lba: int
    pieces: list[tuple[BlockDevice, int, int]] = field(default_factory=list)
    nblocks: int = 0


@dataclass(frozen=True, slots=True)
class _Native:
    src_lba: int
    dst_lba: int
    nblocks: int


@dataclass(frozen=True, slots=True)
class _Staged:
    index: int  # of its source in the plan's staging list (its buffer, when run)
    dst_lba: int


@dataclass(frozen=True, slots=True)
class _Emulate:
    source: SourceRange
    dst_lba: int


_Step = _Offload | _Native | _Staged | _Emulate


def _overlaps(a_lba: int, a_n: int, b_lba: int, b_n: int) -> bool:
    return a_lba < b_lba + b_n and b_lba < a_lba + a_n


class _Batcher:
    """Packs consecutive offloadable ranges into requests that fit the limits."""

    def __init__(self, limits: CopyLimits, steps: list[_Step]) -> None:
        # Defensive against a device reporting a zero limit: one block, one range at least.
        self.max_blocks = max(1, limits.max_blocks)
        self.max_range = max(1, min(limits.max_range_blocks, self.max_blocks))
        self.max_ranges = max(1, limits.max_ranges)
        self.steps = steps
        self.current: _Offload | None = None

    def add(self, device: BlockDevice, lba: int, nblocks: int, dst_lba: int) -> None:
        while nblocks:
            cur = self.current
            if cur is None or cur.nblocks == self.max_blocks or len(cur.pieces) == self.max_ranges:
                self.cut()
                cur = self.current = _Offload(dst_lba)
            # Filling the batch exactly (splitting the range at the batch boundary)
            # gives the fewest requests when max_blocks is what limits them.
            n = min(nblocks, self.max_range, self.max_blocks - cur.nblocks)
            cur.pieces.append((device, lba, n))
            cur.nblocks += n
            lba += n
            dst_lba += n
            nblocks -= n

    def cut(self) -> None:
        if self.current is not None:
            self.steps.append(self.current)
            self.current = None


def _plan(
    sources: Sequence[SourceRange],
    dst: BlockDevice,
    dst_lba: int,
    total: int,
    staging_limit: int,
) -> tuple[list[_Step], list[SourceRange]]:
    """The steps of the copy, and the sources to read into memory before any of them
    (nothing is allocated here: a plan that is refused or waits for memory holds none)."""
    dcaps = dst.capabilities
    native = dcaps.native_copy and _offers(dst, NativeCopy)
    offload = cast(CopyOffload, dst) if _offers(dst, CopyOffload) else None
    live = [s for s in sources if s.nblocks]
    overlapping: list[SourceRange] = []
    elsewhere: list[SourceRange] = []
    for s in live:
        if s.device is not dst:
            elsewhere.append(s)
        elif _overlaps(s.lba, s.nblocks, dst_lba, total):
            # One object: its LBAs compare as they are (the common case, no lookups).
            overlapping.append(s)
    if elsewhere:
        overlapping += _on_destination_storage(elsewhere, dst, dst_lba, total)
    # copy_within has memmove semantics: a single range copied natively needs no
    # staging (and must then be copied natively, whatever else the device offers).
    memmove_ids: set[int] = set()
    if native and len(live) == 1 and live[0].device is dst:
        memmove_ids = {id(s) for s in overlapping}
        overlapping = []
    need = sum(s.nblocks for s in overlapping) * dcaps.block_size
    # Checked before allocating: the limit bounds memory, so a refusal must not use it.
    if need > staging_limit:
        raise CopyTooLarge(
            f"overlapping copy needs {need} bytes of staging memory, over the {staging_limit}"
        )
    staged_ids = {id(s) for s in overlapping}
    staging: list[SourceRange] = []
    steps: list[_Step] = []
    batcher = _Batcher(offload.copy_limits, steps) if offload is not None else None
    offloadable: dict[int, bool] = {}
    lba = dst_lba
    for s in live:
        if id(s) in staged_ids:
            step: _Step | None = _Staged(len(staging), lba)
            staging.append(s)
        elif id(s) in memmove_ids:
            step = _Native(s.lba, lba, s.nblocks)
        elif offload is not None and batcher is not None and _can_offload(offload, s, offloadable):
            batcher.add(s.device, s.lba, s.nblocks, lba)
            step = None
        elif native and s.device is dst:
            step = _Native(s.lba, lba, s.nblocks)
        else:
            step = _Emulate(s, lba)
        if step is not None:
            # An offload request writes consecutive destination blocks: anything else
            # in between ends the batch.
            if batcher is not None:
                batcher.cut()
            steps.append(step)
        lba += s.nblocks
    if batcher is not None:
        batcher.cut()
    return steps, staging


_OFFERS: dict[tuple[type, type], bool] = {}


def _offers(device: object, protocol: type) -> bool:
    """isinstance(device, protocol), remembered per device type: a runtime-checkable
    Protocol check inspects attributes on every call, which costs more than a small
    copy. What a type offers does not change between its instances."""
    key = (type(device), protocol)
    found = _OFFERS.get(key)
    if found is None:
        found = _OFFERS[key] = isinstance(device, protocol)
    return found


async def _prepare(dst: BlockDevice, sources: Sequence[SourceRange]) -> None:
    """Let the destination settle what `can_copy_from` depends on before the plan asks."""
    if _offers(dst, CopyOffload) and _offers(dst, CopyPreparation):
        devices = {id(s.device): s.device for s in sources if s.nblocks}
        await cast(CopyPreparation, dst).prepare_copy(devices.values())


def _can_offload(dst: CopyOffload, s: SourceRange, cache: dict[int, bool]) -> bool:
    key = id(s.device)
    if key not in cache:
        cache[key] = dst.can_copy_from(s.device)
    return cache[key]


# -- what storage a device is -------------------------------------------------------------------

# A device's own storage when it cannot say (no `medium`, no `map_range`): the object.
# Tagged, so that it cannot equal a key some `medium` returns; by id, since a device
# type may define equality. The device is alive while its key is in use (a copy, a
# LinearDevice's construction), so its id names it alone.
_OBJECT = object()
_BY_OBJECT, _BY_MEDIUM, _BY_MAP = 0, 1, 2
_STORAGE_KIND: dict[type, int] = {}


def _storage_kind(device: object) -> int:
    """How `device` says what storage it is, remembered per type (as `_offers` does)."""
    kind = _STORAGE_KIND.get(type(device))
    if kind is None:
        if isinstance(device, MappedDevice):
            kind = _BY_MAP
        elif isinstance(device, KnownMedium):
            kind = _BY_MEDIUM
        else:
            kind = _BY_OBJECT
        _STORAGE_KIND[type(device)] = kind
    return kind


# (keys, first byte, end byte): a range of a device with one medium, on that medium.
_Piece = tuple[tuple[Hashable, ...], int, int]


def _one_piece(device: BlockDevice, lba: int, nblocks: int) -> _Piece | None:
    """Where [lba, lba + nblocks) of `device` is stored, unless `device` maps ranges
    onto others (None): the shape nearly every device has, found without lists."""
    kind = _storage_kind(device)
    if kind == _BY_MAP:
        return None
    bs = device.capabilities.block_size
    if kind == _BY_MEDIUM:
        # A KnownMedium, by _storage_kind; not cast(): that is one more call per range.
        medium: Medium = device.medium  # type: ignore[attr-defined]
        start = medium.offset + lba * bs
        return medium.keys, start, start + nblocks * bs
    return ((_OBJECT, id(device)),), lba * bs, (lba + nblocks) * bs


def storage_extents(device: BlockDevice, lba: int, nblocks: int) -> list[tuple[Hashable, int, int]]:
    """The storage blocks [lba, lba + nblocks) of `device` are, as (key, first byte, end
    byte) on the storage `key` names: one entry per key of each piece (a storage may
    have several names, see `Medium`). Two devices' ranges are the same data where they
    have a key in common and their byte ranges intersect."""
    piece = _one_piece(device, lba, nblocks)
    if piece is None:
        # A MappedDevice (a LinearDevice, possibly over other LinearDevices): its pieces'
        # storage, with their offsets, so a range that lies beside another on the same
        # storage is not taken for an overlap.
        return [
            extent
            for part in cast(MappedDevice, device).map_range(lba, nblocks)
            for extent in storage_extents(part.device, part.start_lba, part.nblocks)
        ]
    keys, start, end = piece
    return [(key, start, end) for key in keys]


def _on_destination_storage(
    sources: list[SourceRange], dst: BlockDevice, dst_lba: int, total: int
) -> list[SourceRange]:
    """The sources, on objects other than `dst`, that are storage the copy writes: the
    destination under another name."""
    found: list[SourceRange] = []
    written = _one_piece(dst, dst_lba, total)
    footprint: dict[Hashable, list[tuple[int, int]]] | None = None
    for s in sources:
        if written is not None:
            src = _one_piece(s.device, s.lba, s.nblocks)
            if src is not None:
                # Both on one medium (nearly every copy): bytes first, and the keys
                # (hashing, comparing) only if the bytes would overlap.
                keys, lo, hi = written
                src_keys, start, end = src
                if start < hi and lo < end and any(k in keys for k in src_keys):
                    found.append(s)
                continue
        if footprint is None:
            footprint = {}
            for key, lo, hi in storage_extents(dst, dst_lba, total):
                footprint.setdefault(key, []).append((lo, hi))
        if any(
            start < hi and lo < end
            for key, start, end in storage_extents(s.device, s.lba, s.nblocks)
            for lo, hi in footprint.get(key, ())
        ):
            found.append(s)
    return found


# -- execution ----------------------------------------------------------------------------------


@dataclass(slots=True)
class CopyPlan:
    """A copy decided and not yet run: `run()` carries it out. `memory` is the most it
    holds in buffers while it runs (staged sources and emulation chunks), the figure a
    caller with a memory budget acquires first."""

    dst: BlockDevice
    steps: list[_Step]
    staging: list[SourceRange]  # read whole, before any step, into buffers of their size
    chunk_blocks: int  # blocks per emulation chunk
    workers: int  # jobs in flight at once
    buffer_bytes: int  # one emulation buffer: the largest chunk
    memory: int
    report: CopyReport

    async def run(self, *, fua: bool = False) -> CopyReport:
        """Carry the plan out (once). A device error is raised once every step already
        started has finished; no step starts after it."""
        steps = self.steps
        dst = self.dst
        bs = dst.capabilities.block_size
        buffers = [bytearray(s.nblocks * bs) for s in self.staging]
        # Every overlapping source is read whole before the first block is written.
        if buffers:
            await _run_bounded(
                (_reader(s, buf) for s, buf in zip(self.staging, buffers, strict=True)),
                max(1, min(self.workers, len(buffers))),
            )
        jobs = _jobs(steps, dst, self.chunk_blocks, fua, buffers)
        await _run_bounded(jobs, self.workers, buffer_bytes=self.buffer_bytes)
        # Offload requests carried FUA themselves; anything else was written without it.
        if fua and (not steps or not all(isinstance(s, _Offload) for s in steps)):
            await dst.flush()
        return self.report


def _emulation(steps: Sequence[_Step], chunk_blocks: int, depth: int) -> tuple[int, int, int]:
    """(workers, blocks of the largest chunk, emulation buffers at most) of running
    `steps` with chunks of `chunk_blocks` and `depth` jobs in flight. A worker allocates
    a buffer only when it takes a chunk, two at most (one read while the other is
    written): no more buffers than chunks, nor than two per worker."""
    jobs = chunks = largest = 0
    for s in steps:
        if isinstance(s, _Emulate):
            n = s.source.nblocks
            chunks += -(-n // chunk_blocks)
            largest = max(largest, min(chunk_blocks, n))
        else:
            jobs += 1
    jobs += chunks
    workers = max(1, min(depth, jobs))
    return workers, largest, min(chunks, 2 * workers)


async def plan_copy(
    sources: Sequence[SourceRange],
    dst: BlockDevice,
    dst_lba: int,
    *,
    chunk_bytes: int = EMULATION_CHUNK,
    depth: int = EMULATION_DEPTH,
    staging_limit: int = STAGING_LIMIT,
    memory_limit: int | None = None,
) -> CopyPlan:
    """Check and plan a copy of `sources` in order to `dst` from `dst_lba`.

    Raises BlockRangeError when a range lies outside its device, ValueError when block
    sizes differ, CopyTooLarge when overlapping ranges would need more than
    `staging_limit` bytes of memory, or the plan more than `memory_limit` even with its
    emulation at the smallest (one worker, one-block chunks). Nothing is written or
    allocated before it returns; only a CopyPreparation destination may have been asked
    to prepare (`prepare_copy`)."""
    dcaps = dst.capabilities
    bs = dcaps.block_size
    total = sum(s.nblocks for s in sources)
    check_range(dcaps, dst_lba, total)
    for s in sources:
        if s.device.capabilities.block_size != bs:
            raise ValueError("source and destination block sizes differ")
        check_range(s.device.capabilities, s.lba, s.nblocks)

    await _prepare(dst, sources)
    if memory_limit is not None:
        staging_limit = min(staging_limit, memory_limit)
    steps, staging = _plan(sources, dst, dst_lba, total, staging_limit)
    report = CopyReport()
    for step in steps:
        if isinstance(step, _Offload):
            report.offloaded_blocks += step.nblocks
            report.commands += 1
        elif isinstance(step, _Native):
            report.native_blocks += step.nblocks
        elif isinstance(step, _Staged):
            n = staging[step.index].nblocks
            report.staged_blocks += n
            report.emulated_blocks += n
        else:
            report.emulated_blocks += step.source.nblocks

    staged = sum(s.nblocks for s in staging) * bs
    chunk_blocks = max(1, chunk_bytes // bs)
    depth = max(1, depth)
    while True:
        workers, largest, buffers = _emulation(steps, chunk_blocks, depth)
        memory = staged + buffers * largest * bs
        if memory_limit is None or memory <= memory_limit:
            break
        # Over the limit: fewer workers first (the same I/O sizes), then smaller chunks.
        if depth > 1:
            depth //= 2
        elif chunk_blocks > 1:
            chunk_blocks //= 2
        else:
            raise CopyTooLarge(f"the copy needs {memory} bytes of memory, over {memory_limit}")
    return CopyPlan(dst, steps, staging, chunk_blocks, workers, largest * bs, memory, report)


async def copy(
    sources: Sequence[SourceRange],
    dst: BlockDevice,
    dst_lba: int,
    *,
    fua: bool = False,
    chunk_bytes: int = EMULATION_CHUNK,
    depth: int = EMULATION_DEPTH,
    staging_limit: int = STAGING_LIMIT,
) -> CopyReport:
    """Copy `sources` in order to `dst` starting at `dst_lba`.

    Raises BlockRangeError (before anything is written) when a range lies outside
    its device, ValueError when block sizes differ, CopyTooLarge when overlapping
    ranges would need more than `staging_limit` bytes of memory. A device error
    (OSError, NvmeStatusError, ...) is raised once every step already started has
    finished; no step starts after it.
    """
    if len(sources) == 1:
        s = sources[0]
        if s.device is dst:
            report = await copy_one_range(dst, s.lba, dst_lba, s.nblocks, fua=fua)
            if report is not None:
                return report
    plan = await plan_copy(
        sources,
        dst,
        dst_lba,
        chunk_bytes=chunk_bytes,
        depth=depth,
        staging_limit=staging_limit,
    )
    return await plan.run(fua=fua)


async def copy_blocks(
    src_device: BlockDevice,
    src_lba: int,
    dst_device: BlockDevice,
    dst_lba: int,
    nblocks: int,
    *,
    fua: bool = False,
    chunk_bytes: int = EMULATION_CHUNK,
    depth: int = EMULATION_DEPTH,
    staging_limit: int = STAGING_LIMIT,
) -> CopyReport:
    """Copy one range: `nblocks` from `src_device` at `src_lba` to `dst_device` at `dst_lba`."""
    if src_device is dst_device:
        report = await copy_one_range(dst_device, src_lba, dst_lba, nblocks, fua=fua)
        if report is not None:
            return report
    return await copy(
        [SourceRange(src_device, src_lba, nblocks)],
        dst_device,
        dst_lba,
        fua=fua,
        chunk_bytes=chunk_bytes,
        depth=depth,
        staging_limit=staging_limit,
    )


async def copy_one_range(
    dev: BlockDevice, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
) -> CopyReport | None:
    """One range inside one device, decided by the planner's rules without a plan: a
    native copy (memmove semantics, so an overlap needs no staging), or one offload
    request for a range that does not overlap its destination and fits the limits.
    None, having done nothing, when neither applies or a range is outside the device:
    then a plan decides (staging, splitting, emulation) or raises. Holds no buffers."""
    if nblocks <= 0:
        return None
    caps = dev.capabilities
    num_blocks = caps.num_blocks
    if (
        src_lba < 0
        or dst_lba < 0
        or src_lba + nblocks > num_blocks
        or dst_lba + nblocks > num_blocks
    ):
        return None  # the plan raises the error
    kind = _ONE_KIND.get(type(dev))
    if kind is None:
        kind = _one_kind(dev)
    # The devices' methods are called without cast(): a call each, on the hot path; the
    # kind says the device has them.
    if kind & _NATIVE and caps.native_copy:
        await dev.copy_within(src_lba, dst_lba, nblocks)  # type: ignore[attr-defined]
        if fua:
            await dev.flush()
        return CopyReport(nblocks)  # positional: keywords cost more than the rest here
    if not kind & _OFFLOAD or (src_lba < dst_lba + nblocks and dst_lba < src_lba + nblocks):
        return None
    if kind & _ONE and await dev.copy_one(src_lba, dst_lba, nblocks, fua=fua):  # type: ignore[attr-defined]
        return CopyReport(0, 0, 0, nblocks, 1)  # offloaded_blocks, commands
    limits: CopyLimits = dev.copy_limits  # type: ignore[attr-defined]
    if nblocks > limits.max_range_blocks or nblocks > limits.max_blocks:
        return None
    if kind & _PREPARE:
        await dev.prepare_copy((dev,))  # type: ignore[attr-defined]
    if not dev.can_copy_from(dev):  # type: ignore[attr-defined]
        return None
    await dev.copy_offload(((dev, src_lba, nblocks),), dst_lba, fua=fua)  # type: ignore[attr-defined]
    return CopyReport(0, 0, 0, nblocks, 1)  # offloaded_blocks, commands


# The rule for a copy done at once lives in a module the compiled build compiles
# (block/copy_now.py); the target calls it there, natively.
copy_one_range_now = _copy_now.copy_one_range_now


def watch_copies_now(watcher: Callable[[int], object]) -> Callable[[], None]:
    """Have `watcher` told the block count of every copy `copy_one_range_now` does (each
    one a CopyReport(native_blocks=n)); returns what stops it. The other paths report
    through what they return (copy_one_range, CopyPlan.run)."""
    _copy_now.WATCHERS.append(watcher)
    return lambda: _copy_now.WATCHERS.remove(watcher)


# What a device type offers copy_one_range, found once per type (as `_offers` does).
_NATIVE, _OFFLOAD, _PREPARE, _ONE = 1, 2, 4, 8
_ONE_KIND: dict[type, int] = {}


def _one_kind(dev: object) -> int:
    kind = _NATIVE if _offers(dev, NativeCopy) else 0
    if _offers(dev, CopyOffload):
        kind |= _OFFLOAD
        if _offers(dev, CopyPreparation):
            kind |= _PREPARE
        if _offers(dev, CopyOne):
            kind |= _ONE
    _ONE_KIND[type(dev)] = kind
    return kind


# A job gets the worker's emulation buffer (allocated on first use, reused after).
_Job = Callable[["_Worker"], Awaitable[None]]


@dataclass(frozen=True)
class _Chunk:
    """One emulation step, in two halves so a worker can overlap them across chunks."""

    src: BlockDevice
    src_lba: int
    dst: BlockDevice
    dst_lba: int
    nbytes: int

    async def read(self, buf: memoryview) -> None:
        await self.src.read(self.src_lba, buf[: self.nbytes])

    async def write(self, buf: memoryview) -> None:
        await self.dst.write(self.dst_lba, buf[: self.nbytes])


def _reader(s: SourceRange, buf: bytearray) -> _Job:
    async def run(_worker: _Worker) -> None:
        await s.device.read(s.lba, memoryview(buf))

    return run


def _jobs(
    steps: Sequence[_Step],
    dst: BlockDevice,
    step_blocks: int,
    fua: bool,
    buffers: Sequence[bytearray],
) -> Iterator[_Job | _Chunk]:
    """One job per offload request, native copy and staged write; one per emulation chunk."""
    bs = dst.capabilities.block_size
    for step in steps:
        if isinstance(step, _Offload):
            yield _offloader(step, dst, fua)
        elif isinstance(step, _Native):
            yield _native(step, dst)
        elif isinstance(step, _Staged):
            yield _staged_writer(buffers[step.index], step.dst_lba, dst)
        else:
            s = step.source
            for off in range(0, s.nblocks, step_blocks):
                n = min(step_blocks, s.nblocks - off)
                yield _Chunk(s.device, s.lba + off, dst, step.dst_lba + off, n * bs)


def _offloader(step: _Offload, dst: BlockDevice, fua: bool) -> _Job:
    async def run(_worker: _Worker) -> None:
        await cast(CopyOffload, dst).copy_offload(step.pieces, step.dst_lba, fua=fua)

    return run


def _native(step: _Native, dst: BlockDevice) -> _Job:
    async def run(_worker: _Worker) -> None:
        await cast(NativeCopy, dst).copy_within(step.src_lba, step.dst_lba, step.nblocks)

    return run


def _staged_writer(buf: bytearray, dst_lba: int, dst: BlockDevice) -> _Job:
    async def run(_worker: _Worker) -> None:
        await dst.write(dst_lba, buf)

    return run


class _Worker:
    """Two chunk buffers, allocated on first use: one being written while the next
    chunk is read into the other."""

    def __init__(self, buffer_bytes: int) -> None:
        self._size = buffer_bytes
        self._bufs: list[memoryview] = []
        self._turn = 1

    def buffer(self) -> memoryview:
        """The buffer not held by the write in flight (the other one next time)."""
        self._turn ^= 1
        if self._turn == len(self._bufs):
            self._bufs.append(memoryview(bytearray(self._size)))
        return self._bufs[self._turn]


async def _work(jobs: Iterator[_Job | _Chunk], worker: _Worker, stop: list[BaseException]) -> None:
    """Take jobs until none are left or `stop` holds a failure. A chunk's write runs in
    the background while the worker reads its next chunk; it is always awaited before
    its buffer is reused or the worker returns, even when something failed (a remote
    command cannot be taken back, and its buffer must stay untouched until it ends)."""
    writing: asyncio.Future[None] | None = None
    try:
        job = next(jobs, None)
        while job is not None and not stop:
            if isinstance(job, _Chunk):
                buf = worker.buffer()
                await job.read(buf)
                if writing is not None:
                    await writing
                    writing = None
                # The next job is taken only now, so that while this worker was reading
                # the others could take theirs: taking it earlier would idle a worker.
                following = None if stop else next(jobs, None)
                if following is None:
                    await job.write(buf)  # nothing to overlap with: no Task
                else:
                    writing = asyncio.ensure_future(job.write(buf))
            else:
                if writing is not None:
                    await writing
                    writing = None
                await job(worker)
                following = next(jobs, None)
            job = following
        if writing is not None:
            await writing
            writing = None
    finally:
        if writing is not None:
            await asyncio.wait([writing])
            if not writing.cancelled():
                writing.exception()  # retrieved: the first failure is the one reported


async def _run_bounded(
    jobs: Iterator[_Job | _Chunk], workers: int, *, buffer_bytes: int = 0
) -> None:
    """Run `jobs` with `workers` of them in flight: a pipeline rather than waves, so a
    slow chunk holds up one worker, not the whole group. On the first failure no new
    job starts; the ones in flight are waited for, then it is raised."""
    if workers == 1:
        # One worker: run it here, without a Task or an event-loop round trip.
        await _work(jobs, _Worker(buffer_bytes), [])
        return
    failure: list[BaseException] = []

    async def work() -> None:
        try:
            await _work(jobs, _Worker(buffer_bytes), failure)
        except Exception as exc:
            failure.append(exc)

    await asyncio.gather(*(work() for _ in range(workers)))
    if failure:
        raise failure[0]
