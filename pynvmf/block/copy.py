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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from pynvmf.block.device import (
    BlockDevice,
    CopyLimits,
    CopyOffload,
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
    """The copy's overlapping sources would need more staging memory than allowed."""


@dataclass(frozen=True, slots=True)
class SourceRange:
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
    buf: bytearray
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
) -> tuple[list[_Step], list[tuple[SourceRange, bytearray]]]:
    """The steps of the copy, and the sources to read into memory before any of them."""
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
    staging: list[tuple[SourceRange, bytearray]] = []
    steps: list[_Step] = []
    batcher = _Batcher(offload.copy_limits, steps) if offload is not None else None
    offloadable: dict[int, bool] = {}
    lba = dst_lba
    for s in live:
        if id(s) in staged_ids:
            buf = bytearray(s.nblocks * dcaps.block_size)
            staging.append((s, buf))
            step: _Step | None = _Staged(buf, lba)
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
    dcaps = dst.capabilities
    bs = dcaps.block_size
    total = sum(s.nblocks for s in sources)
    check_range(dcaps, dst_lba, total)
    for s in sources:
        if s.device.capabilities.block_size != bs:
            raise ValueError("source and destination block sizes differ")
        check_range(s.device.capabilities, s.lba, s.nblocks)

    await _prepare(dst, sources)
    steps, staging = _plan(sources, dst, dst_lba, total, staging_limit)
    report = CopyReport()
    for step in steps:
        if isinstance(step, _Offload):
            report.offloaded_blocks += step.nblocks
            report.commands += 1
        elif isinstance(step, _Native):
            report.native_blocks += step.nblocks
        elif isinstance(step, _Staged):
            report.staged_blocks += len(step.buf) // bs
            report.emulated_blocks += len(step.buf) // bs
        else:
            report.emulated_blocks += step.source.nblocks

    # Every overlapping source is read whole before the first block is written.
    if staging:
        await _run_bounded(
            (_reader(s, buf) for s, buf in staging), max(1, min(depth, len(staging)))
        )

    step_blocks = max(1, chunk_bytes // bs)
    largest = max(
        (min(step_blocks, s.source.nblocks) for s in steps if isinstance(s, _Emulate)), default=0
    )
    jobs = _jobs(steps, dst, step_blocks, fua)
    workers = max(1, min(depth, _count_jobs(steps, step_blocks)))
    await _run_bounded(jobs, workers, buffer_bytes=largest * bs)

    # Offload requests carried FUA themselves; anything else was written without it.
    if fua and (not steps or not all(isinstance(s, _Offload) for s in steps)):
        await dst.flush()
    return report


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
    return await copy(
        [SourceRange(src_device, src_lba, nblocks)],
        dst_device,
        dst_lba,
        fua=fua,
        chunk_bytes=chunk_bytes,
        depth=depth,
        staging_limit=staging_limit,
    )


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


def _count_jobs(steps: Sequence[_Step], step_blocks: int) -> int:
    return sum(-(-s.source.nblocks // step_blocks) if isinstance(s, _Emulate) else 1 for s in steps)


def _jobs(
    steps: Sequence[_Step], dst: BlockDevice, step_blocks: int, fua: bool
) -> Iterator[_Job | _Chunk]:
    """One job per offload request, native copy and staged write; one per emulation chunk."""
    bs = dst.capabilities.block_size
    for step in steps:
        if isinstance(step, _Offload):
            yield _offloader(step, dst, fua)
        elif isinstance(step, _Native):
            yield _native(step, dst)
        elif isinstance(step, _Staged):
            yield _staged_writer(step, dst)
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


def _staged_writer(step: _Staged, dst: BlockDevice) -> _Job:
    async def run(_worker: _Worker) -> None:
        await dst.write(step.dst_lba, step.buf)

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
