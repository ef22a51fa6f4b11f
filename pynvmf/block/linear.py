"""LinearDevice: a device made of segments of other devices, mapped back to back
(the analog of Linux's dm-linear).

Reads, writes, zeroing and deallocation are cut at segment boundaries and the
pieces issued concurrently. Copies are where it does better than dm-linear, which
refuses a copy offload request as soon as it crosses a target boundary: a
LinearDevice implements `CopyOffload` for copies within itself, cuts every request
at the segment boundaries of both the sources and the destination, and hands the
pieces back to the copy planner with the underlying devices. So a piece whose source
and destination lie on one device that copies natively (a file, memory) or offloads
(a remote namespace with the NVMe Copy command) keeps doing so, and only the pieces
between different devices are emulated. Whatever is decided is the planner's call,
as everywhere else.

Segments may not map overlapping blocks of one storage: an alias would make two
blocks of the linear device one, so concurrent writes to both would race, and the
copy hazard analysis below relies on distinct linear blocks being distinct
underlying blocks. Storage, not objects: two segments alias if their devices say
they are the same storage (`block.copy.storage_extents`: two FileDevices on one
file, a LinearDevice over the other segment's device). With that, each block of
storage is one (segment device, LBA), so the hazard analysis may compare devices by
object. (Aliasing that no device can tell, e.g. a file and a loop device over it,
cannot be detected.)

A LinearDevice is a `MappedDevice`: `map_range` is what the copy planner uses to
tell whether a copy's sources and destination are the same storage.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import errno
import itertools
from collections.abc import Awaitable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pynvmf.block.copy import (
    STAGING_LIMIT,
    CopyReport,
    CopyTooLarge,
    SourceRange,
    copy,
    storage_extents,
)
from pynvmf.block.device import (
    BlockDevice,
    Buffer,
    Capabilities,
    CopyLimits,
    check_range,
)

# Every request is split inside copy_offload, so the planner need not split anything;
# a bound still has to be a number (NVMe caps a Copy command at 256 ranges, 2**16 is
# comfortably more than any batch worth keeping in one request).
_MAX_COPY_RANGES = 1 << 16

# Planner calls of one copy_offload in flight at once.
_CALL_DEPTH = 4

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Segment:
    """`nblocks` blocks of `device` from `start_lba` on."""

    device: BlockDevice
    start_lba: int
    nblocks: int


@dataclass(frozen=True, slots=True)
class _Piece:
    """A linear range's share of one segment: `offset` blocks into the request."""

    offset: int
    device: BlockDevice
    lba: int
    nblocks: int


@dataclass(slots=True)
class _CopyCall:
    """One planner call of a copy_offload: sources to consecutive blocks of one device."""

    dst: BlockDevice
    dst_lba: int
    nblocks: int
    sources: list[SourceRange]


class LinearDevice:
    """`segments` mapped back to back: linear block 0 is the first segment's first block.

    Implements BlockDevice and CopyOffload (for copies whose source is this device).
    The underlying devices stay the caller's: close() only closes them with
    `close_devices=True`. `copy_stats` sums what the planner did underneath every
    copy_offload (the planner's own report only sees one offloaded request).
    """

    __slots__ = (
        "_caps",
        "_close_devices",
        "_closed",
        "_copy_limits",
        "_devices",
        "_segments",
        "_starts",
        "copy_stats",
    )

    def __init__(self, segments: Sequence[Segment], *, close_devices: bool = False) -> None:
        if not segments:
            raise ValueError("a linear device needs at least one segment")
        block_size = segments[0].device.capabilities.block_size
        starts: list[int] = []
        total = 0
        for i, seg in enumerate(segments):
            caps = seg.device.capabilities
            if caps.block_size != block_size:
                raise ValueError(
                    f"segment {i} has {caps.block_size}-byte blocks, segment 0 {block_size}-byte"
                )
            if seg.nblocks <= 0:
                raise ValueError(f"segment {i} is empty")
            if seg.start_lba < 0 or seg.start_lba + seg.nblocks > caps.num_blocks:
                raise ValueError(
                    f"segment {i} (blocks {seg.start_lba}..{seg.start_lba + seg.nblocks}) is "
                    f"outside its device of {caps.num_blocks} blocks"
                )
            starts.append(total)
            total += seg.nblocks
        _check_no_alias(segments)
        caps_all = [s.device.capabilities for s in segments]
        self._segments = tuple(segments)
        self._starts = starts
        # One entry per distinct device, in segment order (flush, close).
        self._devices = tuple({id(s.device): s.device for s in segments}.values())
        self._caps = Capabilities(
            block_size=block_size,
            num_blocks=total,
            volatile_write_cache=any(c.volatile_write_cache for c in caps_all),
            write_zeroes=all(c.write_zeroes for c in caps_all),
            deallocate=all(c.deallocate for c in caps_all),
            deallocated_reads_zero=all(c.deallocated_reads_zero for c in caps_all),
            # Copies go through CopyOffload instead: copy_within would be taken for a
            # single range on one device, with no say over how the pieces are copied.
            native_copy=False,
        )
        self._copy_limits = CopyLimits(
            max_range_blocks=total, max_blocks=total, max_ranges=_MAX_COPY_RANGES
        )
        self._close_devices = close_devices
        self._closed = False
        self.copy_stats = CopyReport()

    def __repr__(self) -> str:
        c = self._caps
        return f"LinearDevice({len(self._segments)} segments, {c.num_blocks} x {c.block_size} B)"

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    @property
    def closed(self) -> bool:
        return self._closed

    def map_range(self, lba: int, nblocks: int) -> list[Segment]:
        """Where linear blocks [lba, lba + nblocks) live: one Segment per device piece."""
        return [Segment(p.device, p.lba, p.nblocks) for p in self._pieces(lba, nblocks)]

    # -- I/O ---------------------------------------------------------------------------------

    async def read(self, lba: int, buf: memoryview) -> None:
        view = self._byte_view(buf)
        pieces = self._pieces(lba, view.nbytes // self._caps.block_size)
        bs = self._caps.block_size
        await _all(
            p.device.read(p.lba, view[p.offset * bs : (p.offset + p.nblocks) * bs]) for p in pieces
        )

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        view = self._byte_view(data)
        pieces = self._pieces(lba, view.nbytes // self._caps.block_size)
        bs = self._caps.block_size
        await _all(
            p.device.write(p.lba, view[p.offset * bs : (p.offset + p.nblocks) * bs], fua=fua)
            for p in pieces
        )

    async def flush(self) -> None:
        self._check_open()
        await _all(d.flush() for d in self._devices)

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        pieces = self._pieces(lba, nblocks)
        await _all(p.device.write_zeroes(p.lba, p.nblocks, fua=fua) for p in pieces)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        pieces = self._pieces(lba, nblocks)
        await _all(p.device.deallocate(p.lba, p.nblocks) for p in pieces)

    async def close(self) -> None:
        """Stop serving I/O; with close_devices=True also close every underlying device."""
        if self._closed:
            return
        self._closed = True
        if self._close_devices:
            await _all(d.close() for d in self._devices)

    async def __aenter__(self) -> LinearDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- CopyOffload -------------------------------------------------------------------------

    @property
    def copy_limits(self) -> CopyLimits:
        return self._copy_limits

    def can_copy_from(self, source: BlockDevice) -> bool:
        return source is self

    async def copy_offload(
        self, sources: Sequence[tuple[BlockDevice, int, int]], dst_lba: int, *, fua: bool = False
    ) -> None:
        """Copy ranges of this device, in order, to consecutive blocks from dst_lba.

        Every source and the destination are cut at segment boundaries; each run of
        destination blocks that is consecutive on one underlying device becomes one
        planner call (`block.copy.copy`) with the underlying source pieces. The result
        is that of reading every source before writing anything, even if the caller
        passes ranges that overlap the destination (the planner stages those before
        calling here, but a direct caller may not): calls are ordered so none writes
        what another has yet to read, and where no order exists (a cycle, e.g. two
        segments swapping places) the sources involved are read into memory first.
        """
        self._check_open()
        total = 0
        for device, lba, nblocks in sources:
            if not self.can_copy_from(device):
                raise ValueError(f"{self!r} cannot copy from {device!r}")
            check_range(self._caps, lba, nblocks)
            total += nblocks
        check_range(self._caps, dst_lba, total)
        calls = self._copy_calls(sources, dst_lba, total)
        if not calls:
            return
        waves = _order(calls)
        if waves is None:
            await self._stage_cycles(calls)
            waves = [calls]
        for wave in waves:
            await self._run_calls(wave)
        if fua:
            # The planner calls ran without FUA: one flush per device instead of one per
            # call. A device without a volatile cache needs none.
            written = {id(c.dst): c.dst for c in calls}.values()
            await _all(d.flush() for d in written if d.capabilities.volatile_write_cache)

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OSError(errno.EBADF, "linear device is closed")

    def _byte_view(self, buf: Buffer) -> memoryview:
        self._check_open()
        view = buf if type(buf) is memoryview else memoryview(buf)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if view.nbytes % self._caps.block_size:
            raise ValueError(f"buffer of {view.nbytes} bytes is not a whole number of blocks")
        return view

    def _pieces(self, lba: int, nblocks: int) -> list[_Piece]:
        """The segment pieces of linear blocks [lba, lba + nblocks), in order."""
        self._check_open()
        check_range(self._caps, lba, nblocks)
        pieces: list[_Piece] = []
        if not nblocks:
            return pieces
        i = bisect.bisect_right(self._starts, lba) - 1
        offset = 0
        while offset < nblocks:
            seg = self._segments[i]
            into = lba + offset - self._starts[i]
            n = min(seg.nblocks - into, nblocks - offset)
            pieces.append(_Piece(offset, seg.device, seg.start_lba + into, n))
            offset += n
            i += 1
        return pieces

    def _copy_calls(
        self, sources: Sequence[tuple[BlockDevice, int, int]], dst_lba: int, total: int
    ) -> list[_CopyCall]:
        """Pair source and destination pieces, cut where either crosses a segment
        boundary, and group them by runs of destination blocks consecutive on one device."""
        src_pieces = [p for _dev, lba, n in sources for p in self._pieces(lba, n)]
        dst_pieces = self._pieces(dst_lba, total)
        calls: list[_CopyCall] = []
        si = di = 0
        s_used = d_used = 0  # blocks of the current pieces already paired
        while di < len(dst_pieces):
            s, d = src_pieces[si], dst_pieces[di]
            n = min(s.nblocks - s_used, d.nblocks - d_used)
            s_dev, s_lba = s.device, s.lba + s_used
            d_dev, d_lba = d.device, d.lba + d_used
            call = calls[-1] if calls else None
            if call is None or call.dst is not d_dev or call.dst_lba + call.nblocks != d_lba:
                call = _CopyCall(d_dev, d_lba, 0, [])
                calls.append(call)
            last = call.sources[-1] if call.sources else None
            if last is not None and last.device is s_dev and last.lba + last.nblocks == s_lba:
                # Consecutive on the source device too (e.g. adjacent segments of one
                # device): one range instead of two.
                call.sources[-1] = SourceRange(s_dev, last.lba, last.nblocks + n)
            else:
                call.sources.append(SourceRange(s_dev, s_lba, n))
            call.nblocks += n
            s_used += n
            d_used += n
            if s_used == s.nblocks:
                si, s_used = si + 1, 0
            if d_used == d.nblocks:
                di, d_used = di + 1, 0
        return _split_self_overlaps(calls)

    async def _run_calls(self, calls: list[_CopyCall]) -> None:
        """The planner calls of one wave, _CALL_DEPTH at a time: each may emulate with
        several MiB of buffers, so a copy over many segments must not start them all.
        After a failure no call starts; the ones running finish, then it is raised."""
        pending = iter(calls)
        failure: list[Exception] = []

        async def work() -> None:
            for c in pending:
                if failure:
                    return
                try:
                    report = await copy(c.sources, c.dst, c.dst_lba)
                except Exception as exc:
                    failure.append(exc)
                    return
                _add_report(self.copy_stats, report)

        await asyncio.gather(*(work() for _ in range(min(_CALL_DEPTH, len(calls)))))
        if failure:
            raise failure[0]

    async def _stage_cycles(self, calls: list[_CopyCall]) -> None:
        """Replace every source that another call writes by a snapshot in memory, so no
        call depends on another; the planner then copies from the snapshot."""
        # A source may overlap several destinations: stage it once.
        hazards = sorted({(k, i) for k, i, _writer in _hazards(calls)})
        bs = self._caps.block_size
        need = sum(calls[k].sources[i].nblocks for k, i in hazards) * bs
        # Checked before allocating: the limit bounds memory, so a refusal must not use it.
        if need > STAGING_LIMIT:
            raise CopyTooLarge(
                f"overlapping copy needs {need} bytes of staging memory, over the {STAGING_LIMIT}"
            )
        snapshots = [_Snapshot(bs, calls[k].sources[i].nblocks) for k, i in hazards]
        # Every read completes before anything is written.
        await _all(
            calls[k].sources[i].device.read(calls[k].sources[i].lba, snap.view)
            for (k, i), snap in zip(hazards, snapshots, strict=True)
        )
        for (k, i), snap in zip(hazards, snapshots, strict=True):
            calls[k].sources[i] = SourceRange(snap, 0, snap.capabilities.num_blocks)


class _Snapshot:
    """A read-only BlockDevice over a buffer: a source read before the copy wrote over it."""

    __slots__ = ("_buf", "_caps", "view")

    def __init__(self, block_size: int, nblocks: int) -> None:
        self._buf = bytearray(block_size * nblocks)
        self.view = memoryview(self._buf)
        self._caps = Capabilities(block_size=block_size, num_blocks=nblocks)

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def read(self, lba: int, buf: memoryview) -> None:
        bs = self._caps.block_size
        n = memoryview(buf).nbytes
        check_range(self._caps, lba, n // bs)
        memoryview(buf).cast("B")[:] = self.view[lba * bs : lba * bs + n]

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        raise OSError(errno.EROFS, "a copy snapshot is read-only")

    async def flush(self) -> None:
        return None

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        raise OSError(errno.EROFS, "a copy snapshot is read-only")

    async def deallocate(self, lba: int, nblocks: int) -> None:
        raise OSError(errno.EROFS, "a copy snapshot is read-only")

    async def close(self) -> None:
        return None


def _check_no_alias(segments: Sequence[Segment]) -> None:
    # Byte ranges per storage key, so two objects on one storage are compared too.
    by_storage: dict[Hashable, list[tuple[int, int, int]]] = {}
    for i, seg in enumerate(segments):
        for key, start, end in storage_extents(seg.device, seg.start_lba, seg.nblocks):
            by_storage.setdefault(key, []).append((start, end, i))
    for ranges in by_storage.values():
        ranges.sort()
        # Sorted by start, any overlap shows between neighbours too.
        for (_a_start, a_end, a_i), (b_start, _b_end, b_i) in itertools.pairwise(ranges):
            if b_start < a_end:
                first, second = sorted((a_i, b_i))
                raise ValueError(
                    f"segments {first} and {second} map overlapping blocks of one storage"
                )


def _split_self_overlaps(calls: list[_CopyCall]) -> list[_CopyCall]:
    """One call per source where a call's sources overlap its own destination: the
    planner would stage such a multi-range call, while single ranges get memmove from
    a native device, and the order between the calls is then _order's business."""
    out: list[_CopyCall] = []
    for c in calls:
        end = c.dst_lba + c.nblocks
        if len(c.sources) > 1 and any(
            s.device is c.dst and s.lba < end and c.dst_lba < s.lba + s.nblocks for s in c.sources
        ):
            lba = c.dst_lba
            for s in c.sources:
                out.append(_CopyCall(c.dst, lba, s.nblocks, [s]))
                lba += s.nblocks
        else:
            out.append(c)
    return out


def _hazards(calls: list[_CopyCall]) -> list[tuple[int, int, int]]:
    """(call index, source index, index of the other call whose destination that
    source overlaps). Destinations are disjoint (distinct linear blocks, no aliasing
    segments), so per device they sort into a list searchable by bisection."""
    dsts: dict[int, list[tuple[int, int, int]]] = {}
    for k, c in enumerate(calls):
        dsts.setdefault(id(c.dst), []).append((c.dst_lba, c.dst_lba + c.nblocks, k))
    starts: dict[int, list[int]] = {}
    for key, by_start in dsts.items():
        by_start.sort()
        starts[key] = [r[0] for r in by_start]
    found: list[tuple[int, int, int]] = []
    for k, c in enumerate(calls):
        for i, s in enumerate(c.sources):
            ranges = dsts.get(id(s.device))
            if ranges is None:
                continue
            end = s.lba + s.nblocks
            j = max(0, bisect.bisect_right(starts[id(s.device)], s.lba) - 1)
            while j < len(ranges) and ranges[j][0] < end:
                lo, hi, other = ranges[j]
                # A call's own overlap is the planner's business (it stages or memmoves).
                if other != k and lo < end and s.lba < hi:
                    found.append((k, i, other))
                j += 1
    return found


def _order(calls: list[_CopyCall]) -> list[list[_CopyCall]] | None:
    """Waves of calls that may run concurrently, each wave after the previous: a call
    that reads blocks another call writes runs in an earlier wave than that writer.
    None if that is impossible (a cycle)."""
    after: list[set[int]] = [set() for _ in calls]  # reader -> writers that must wait for it
    blockers = [0] * len(calls)
    for reader, _i, writer in _hazards(calls):
        if writer not in after[reader]:
            after[reader].add(writer)
            blockers[writer] += 1
    wave = [k for k, n in enumerate(blockers) if n == 0]
    waves: list[list[_CopyCall]] = []
    placed = 0
    while wave:
        waves.append([calls[k] for k in wave])
        placed += len(wave)
        nxt: list[int] = []
        for k in wave:
            for w in after[k]:
                blockers[w] -= 1
                if blockers[w] == 0:
                    nxt.append(w)
        wave = nxt
    return waves if placed == len(calls) else None


def _add_report(total: CopyReport, part: CopyReport) -> None:
    # Field by field, so counters the planner gains later are summed too.
    for f in dataclasses.fields(total):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


async def _all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Await `aws` concurrently; once every one has finished, raise the first failure.
    Waiting for all even after a failure matters: a piece still in flight may be
    using a slice of the caller's buffer."""
    items = list(aws)
    if len(items) == 1:
        return [await items[0]]  # the common case: no task, no gather
    results = await asyncio.gather(*items, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]  # no exceptions left among them
