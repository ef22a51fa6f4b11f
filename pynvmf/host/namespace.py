"""RemoteNamespace: a namespace of a remote controller as a local BlockDevice.

Requests larger than one command may carry (MDTS, or 64 Ki blocks) are split
into commands issued concurrently, spread over the I/O queues; read data lands
directly in slices of the caller's buffer.

A namespace of a controller that supports the NVMe Copy command (ONCS bit 8) is a
`CopyingNamespace`, which also implements `pynvmf.block.device.CopyOffload`: the
copy planner (`pynvmf.block.copy`) then offloads copies to it; any other namespace
gets its copies emulated by the planner. `remote_namespace()` picks the class.

A source in another namespace of the same controller needs descriptor format 2h or 3h
(TP 4130), which the host must first enable in Host Behavior Support: the controller
does that once, before the first such copy is planned; if it refuses, those sources are
no longer offered for offload and the planner emulates them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from pynvmf.block.device import (
    BlockDevice,
    Buffer,
    Capabilities,
    CopyLimits,
    Medium,
    check_range,
)
from pynvmf.host import compare
from pynvmf.host.errors import NvmeConnectionError
from pynvmf.host.reservations import NamespaceReservations
from pynvmf.spec import identify as I
from pynvmf.spec.command import (
    COPY_CDFE_FORMATS,
    COPY_DESCRIPTOR_SIZE,
    DSM_ATTR_DEALLOCATE,
    DSM_MAX_RANGES,
    DSM_RANGE,
    RW_FUA,
    CopyRange,
    copy_cdw12,
    one_range_copy,
    pack_copy_ranges,
)
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.tcp.host import HostCommand

if TYPE_CHECKING:
    from pynvmf.host.controller import AnyQueue, Controller

# Read/Write/Write Zeroes CDW12 and Dataset Management CDW11 bits.
# Dataset Management range: context attributes, length in LBAs, starting LBA.
_DSM_MAX_NLB = 0xFFFFFFFF
_MAX_NLB = 0x10000  # NLB is a 16-bit 0's based field
_ZERO_CHUNK = 1024 * 1024
# Copy: NR (CDW12 bits 7:0) is 0's based, so one command carries at most 256 ranges.
_COPY_MAX_NR = 256
# Descriptor formats in order of preference, for a copy within one namespace and for
# one with a source in another namespace (TP 4130). Formats 1 and 3 only add
# end-to-end protection fields, which stay zero: same result, bigger descriptors.
_OWN_FORMATS = (0, 2, 1, 3)
_CROSS_FORMATS = (2, 3)
_ALL_FORMATS = 0xF


def capabilities_from_identify(ns: I.IdentifyNamespace, ctrl: I.IdentifyController) -> Capabilities:
    return Capabilities(
        block_size=ns.block_size,
        num_blocks=ns.nsze,
        volatile_write_cache=bool(ctrl.vwc & I.Vwc.PRESENT),
        write_zeroes=bool(ctrl.oncs & I.Oncs.WRITE_ZEROES),
        deallocate=bool(ctrl.oncs & I.Oncs.DSM),
        deallocated_reads_zero=ns.dlfeat & 0x7 == I.Dlfeat.READ_ZEROES,
    )


class RemoteNamespace(NamespaceReservations):
    """One namespace of `controller` (implements pynvmf.block.device.BlockDevice), with
    the reservation commands (pynvmf.host.reservations)."""

    def __init__(self, controller: Controller, nsid: int, identify: I.IdentifyNamespace) -> None:
        self.controller = controller
        self.nsid = nsid
        self.identify = identify
        info = controller.info
        assert info is not None
        self._caps = capabilities_from_identify(identify, info)
        block_size = self._caps.block_size
        self._block_size = block_size
        self._shift = block_size.bit_length() - 1
        self._mask = block_size - 1
        self._num_blocks = self._caps.num_blocks
        # The most blocks one Read or Write may move.
        self._max_blocks = max(1, min(controller.max_transfer // block_size, _MAX_NLB))
        self._closed = False
        self._medium = _namespace_medium(controller.subnqn, nsid, identify)

    def __repr__(self) -> str:
        c = self._caps
        return f"RemoteNamespace(nsid={self.nsid}, {c.num_blocks} x {c.block_size} B)"

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def max_io_blocks(self) -> int:
        return self._max_blocks

    @property
    def medium(self) -> Medium:
        """The namespace this is (pynvmf.block.device.KnownMedium): the same namespace
        reached through another controller or connection is the same storage."""
        return self._medium

    # -- I/O -------------------------------------------------------------------------------

    async def read(self, lba: int, buf: memoryview) -> None:
        view = _byte_view(buf)
        nblocks = self._blocks(lba, view.nbytes)
        if not nblocks:
            return
        if nblocks <= self._max_blocks:
            await self.controller.next_queue().execute(
                IoOpcode.READ, self.nsid, lba & 0xFFFFFFFF, lba >> 32, nblocks - 1, into=view
            )
            return
        await self._split(IoOpcode.READ, lba, view, 0, into=True)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        view = _byte_view(data)
        nblocks = self._blocks(lba, view.nbytes)
        if not nblocks:
            return
        flags = RW_FUA if fua else 0
        if nblocks <= self._max_blocks:
            await self.controller.next_queue().execute(
                IoOpcode.WRITE,
                self.nsid,
                lba & 0xFFFFFFFF,
                lba >> 32,
                (nblocks - 1) | flags,
                data=view,
            )
            return
        await self._split(IoOpcode.WRITE, lba, view, flags, into=False)

    async def flush(self) -> None:
        self._check_open()
        await self.controller.next_queue().execute(IoOpcode.FLUSH, self.nsid)

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        self._check_open()
        check_range(self._caps, lba, nblocks)
        if not nblocks:
            return
        if not self._caps.write_zeroes:
            await self._write_zeroes_emulated(lba, nblocks, fua)
            return
        flags = RW_FUA if fua else 0
        ctrl = self.controller
        submitted: list[tuple[AnyQueue, HostCommand]] = []
        try:
            for start in range(lba, lba + nblocks, _MAX_NLB):
                n = min(_MAX_NLB, lba + nblocks - start)
                queue = ctrl.next_queue()
                cmd = await queue.submit(
                    IoOpcode.WRITE_ZEROES,
                    self.nsid,
                    start & 0xFFFFFFFF,
                    start >> 32,
                    (n - 1) | flags,
                )
                submitted.append((queue, cmd))
        finally:
            await _wait_all(submitted)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        self._check_open()
        check_range(self._caps, lba, nblocks)
        if not nblocks or not self._caps.deallocate:
            return  # deallocation is advisory: without support, nothing to do
        ranges = []
        for start in range(lba, lba + nblocks, _DSM_MAX_NLB):
            ranges.append((start, min(_DSM_MAX_NLB, lba + nblocks - start)))
        ctrl = self.controller
        for i in range(0, len(ranges), DSM_MAX_RANGES):
            batch = ranges[i : i + DSM_MAX_RANGES]
            data = b"".join(DSM_RANGE.pack(0, n, start) for start, n in batch)
            await ctrl.next_queue().execute(
                IoOpcode.DATASET_MANAGEMENT,
                self.nsid,
                len(batch) - 1,
                DSM_ATTR_DEALLOCATE,
                data=data,
            )

    # -- Compare, Verify, Compare and Write (pynvmf.host.compare) ---------------------

    async def compare(self, lba: int, data: Buffer, *, fua: bool = False) -> bool:
        """Whether the blocks from `lba` hold `data` (Compare; False on Compare Failure)."""
        return await compare.compare(self, lba, data, fua=fua)

    async def verify(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        """Have the controller check the blocks are readable; no data moves (Verify)."""
        await compare.verify(self, lba, nblocks, fua=fua)

    async def compare_and_write(
        self, lba: int, expected: Buffer, new: Buffer, *, fua: bool = False
    ) -> bool:
        """Atomically write `new` if the blocks hold `expected` (the fused Compare and
        Write): True if written, False if they did not match and nothing was written."""
        return await compare.compare_and_write(self, lba, expected, new, fua=fua)

    async def close(self) -> None:
        """Stop using this namespace; the controller and its queues stay up."""
        self._closed = True

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NvmeConnectionError(f"namespace {self.nsid} is closed")

    def _blocks(self, lba: int, nbytes: int) -> int:
        """Validate a transfer before anything is sent; its length in blocks."""
        if self._closed:
            raise NvmeConnectionError(f"namespace {self.nsid} is closed")
        if nbytes & self._mask:
            raise ValueError(f"buffer of {nbytes} bytes is not a whole number of blocks")
        nblocks = nbytes >> self._shift
        if lba < 0 or lba + nblocks > self._num_blocks:
            check_range(self._caps, lba, nblocks)
        return nblocks

    async def _split(
        self, opcode: int, lba: int, view: memoryview, flags: int, *, into: bool
    ) -> None:
        """Issue one command per max-size piece, all in flight together."""
        ctrl = self.controller
        step = self._max_blocks
        shift = self._shift
        nblocks = view.nbytes >> shift
        submitted: list[tuple[AnyQueue, HostCommand]] = []
        try:
            for off in range(0, nblocks, step):
                n = min(step, nblocks - off)
                start = lba + off
                piece = view[off << shift : (off + n) << shift]
                queue = ctrl.next_queue()
                cmd = await queue.submit(
                    opcode,
                    self.nsid,
                    start & 0xFFFFFFFF,
                    start >> 32,
                    (n - 1) | flags,
                    into=piece if into else None,
                    data=None if into else piece,
                )
                submitted.append((queue, cmd))
        finally:
            # Every piece already sent must be waited for, even after a failure,
            # so no command still uses the caller's buffer when we return.
            await _wait_all(submitted)

    async def _write_zeroes_emulated(self, lba: int, nblocks: int, fua: bool) -> None:
        zeros = memoryview(bytes(min(_ZERO_CHUNK, nblocks << self._shift)))
        step = zeros.nbytes >> self._shift
        for start in range(lba, lba + nblocks, step):
            n = min(step, lba + nblocks - start)
            await self.write(start, zeros[: n << self._shift], fua=fua)


class CopyingNamespace(RemoteNamespace):
    """A namespace of a controller that supports Copy: a RemoteNamespace that also
    implements pynvmf.block.device.CopyOffload (one NVMe Copy command per request) and
    CopyOne (one command with one descriptor, for a single range within it)."""

    def __init__(self, controller: Controller, nsid: int, identify: I.IdentifyNamespace) -> None:
        super().__init__(controller, nsid, identify)
        info = controller.info
        assert info is not None
        # OCFS without any format with Copy in ONCS: a controller from before formats
        # were advertised, when format 0 was the only one.
        self._ocfs = info.ocfs if info.ocfs & _ALL_FORMATS else 1
        self._usable = -1  # the formats `_formats` was picked from
        self._formats: tuple[int | None, int | None] = (None, None)
        # A one-range Copy's CDW12 and descriptor packer in the own format, set with it.
        self._one_range: tuple[int, Callable[[int, int, int, int, int], bytes]] | None = None
        own, cross = self._copy_formats()
        # The descriptors travel as the command's data: they must fit one transfer.
        formats = [f for f in (own, cross) if f is not None]
        descriptor = max(COPY_DESCRIPTOR_SIZE[f] for f in formats)
        # A controller with Copy must report non-zero MSSRL and MCL; for one that does
        # not, the fields' own widths are the limit.
        max_range = min(identify.mssrl or _MAX_NLB, _MAX_NLB)
        max_ranges = max(
            1, min(identify.msrc + 1, _COPY_MAX_NR, controller.max_transfer // descriptor)
        )
        max_blocks = identify.mcl or max_range * max_ranges
        self._copy_limits = CopyLimits(min(max_range, max_blocks), max_blocks, max_ranges)

    @property
    def copy_limits(self) -> CopyLimits:
        return self._copy_limits

    @property
    def cross_namespace_format(self) -> int | None:
        """The descriptor format for sources in other namespaces (2 or 3), if any."""
        return self._copy_formats()[1]

    def can_copy_from(self, source: BlockDevice) -> bool:
        return self._format_for(source) is not None

    async def prepare_copy(self, sources: Iterable[BlockDevice]) -> None:
        """Enable descriptor formats 2h/3h on the controller (once for all its namespaces)
        if a Copy from one of `sources` would use them; the copy planner awaits this
        before it asks `can_copy_from`, which says no to such sources if the controller
        refused (pynvmf.block.device.CopyPreparation)."""
        if self.controller.copy_formats_enabled is not None:
            return
        for s in sources:
            if _needs_enabling(self._format_for(s)):
                await self.controller.enable_copy_formats()
                return

    def _format_for(self, source: BlockDevice) -> int | None:
        """The descriptor format of a Copy from `source`; None if no Copy can name it."""
        own, cross = self._copy_formats()
        if source is self:
            return own
        if (
            isinstance(source, RemoteNamespace)
            and source.controller is self.controller
            and source.capabilities.block_size == self._block_size
        ):
            return cross
        return None

    def _copy_formats(self) -> tuple[int | None, int | None]:
        """(format for a copy within this namespace, format for one with sources in other
        namespaces): the preferred ones usable, that is in OCFS and, for 2h/3h, not
        refused when the controller was asked to enable them (before it is asked they
        count: nothing is sent in them without asking)."""
        enabled = self.controller.copy_formats_enabled
        usable = self._ocfs if enabled is None else self._ocfs & ~COPY_CDFE_FORMATS | enabled
        if usable != self._usable:
            self._usable = usable
            self._formats = (
                _first_format(_OWN_FORMATS, usable),
                _first_format(_CROSS_FORMATS, usable),
            )
            own = self._formats[0]
            self._one_range = None if own is None else one_range_copy(own, self.nsid)
        return self._formats

    async def copy_one(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> bool:
        """One Copy command of one range of this namespace (pynvmf.block.device.CopyOne);
        False, having sent nothing, over MSSRL or MCL or while the descriptor format it
        would use is still to be enabled."""
        self._check_open()
        own = self._copy_formats()[0]
        if own is None or (self.controller.copy_formats_enabled is None and _needs_enabling(own)):
            return False
        limits = self._copy_limits
        if nblocks > limits.max_range_blocks or nblocks > limits.max_blocks or nblocks <= 0:
            return False
        end = self._num_blocks
        if src_lba < 0 or src_lba + nblocks > end:
            check_range(self._caps, src_lba, nblocks)
        if dst_lba < 0 or dst_lba + nblocks > end:
            check_range(self._caps, dst_lba, nblocks)
        one = self._one_range
        assert one is not None  # set whenever `own` is
        cdw12, pack = one
        await self.controller.next_queue().execute(
            IoOpcode.COPY,
            self.nsid,
            dst_lba & 0xFFFFFFFF,
            dst_lba >> 32,
            cdw12 | RW_FUA if fua else cdw12,
            data=pack(src_lba, nblocks - 1, 0, 0, 0),
        )
        return True

    async def copy_offload(
        self, sources: Sequence[tuple[BlockDevice, int, int]], dst_lba: int, *, fua: bool = False
    ) -> None:
        """One Copy command; raises ValueError for a request outside copy_limits or a
        source it cannot copy from, BlockRangeError for a range outside its namespace,
        NvmeStatusError for a command the controller fails."""
        self._check_open()
        if len(sources) == 1 and sources[0][0] is self:
            # One range of this namespace, the common small copy: no range objects, and
            # no preparation when the format needs no enabling (or is settled).
            _device, lba, nblocks = sources[0]
            own = self._copy_formats()[0]
            if (
                nblocks > 0
                and own is not None
                and (self.controller.copy_formats_enabled is not None or not _needs_enabling(own))
            ):
                limits = self._copy_limits
                if nblocks > limits.max_range_blocks:
                    raise ValueError(
                        f"range of {nblocks} blocks over MSSRL {limits.max_range_blocks}"
                    )
                if nblocks > limits.max_blocks:
                    raise ValueError(f"1 range of {nblocks} blocks: over the limits {limits}")
                end = self._num_blocks
                if lba < 0 or lba + nblocks > end:
                    check_range(self._caps, lba, nblocks)
                if dst_lba < 0 or dst_lba + nblocks > end:
                    check_range(self._caps, dst_lba, nblocks)
                one = self._one_range
                assert one is not None  # set whenever `own` is
                cdw12, pack = one
                await self.controller.next_queue().execute(
                    IoOpcode.COPY,
                    self.nsid,
                    dst_lba & 0xFFFFFFFF,
                    dst_lba >> 32,
                    cdw12 | RW_FUA if fua else cdw12,
                    data=pack(lba, nblocks - 1, 0, 0, 0),
                )
                return
        # A direct caller may not have let the planner prepare: the formats must be
        # settled before the sources are checked against them.
        await self.prepare_copy(device for device, _lba, nblocks in sources if nblocks)
        limits = self._copy_limits
        ranges: list[CopyRange] = []
        cross = False
        total = 0
        for device, lba, nblocks in sources:
            if not nblocks:
                continue  # NLB is 0's based: an empty range cannot be expressed, nor needed
            if not self.can_copy_from(device):
                raise ValueError(f"{self!r} cannot copy from {device!r}")
            assert isinstance(device, RemoteNamespace)
            if nblocks > limits.max_range_blocks:
                raise ValueError(f"range of {nblocks} blocks over MSSRL {limits.max_range_blocks}")
            check_range(device.capabilities, lba, nblocks)
            cross = cross or device.nsid != self.nsid
            ranges.append(CopyRange(lba, nblocks, device.nsid))
            total += nblocks
        if len(ranges) > limits.max_ranges or total > limits.max_blocks:
            raise ValueError(f"{len(ranges)} ranges of {total} blocks: over the limits {limits}")
        check_range(self._caps, dst_lba, total)
        if not ranges:
            return
        own, cross_format = self._copy_formats()
        desfmt = cross_format if cross else own
        assert desfmt is not None  # can_copy_from admits a source only with a format
        await self.controller.next_queue().execute(
            IoOpcode.COPY,
            self.nsid,
            dst_lba & 0xFFFFFFFF,
            dst_lba >> 32,
            copy_cdw12(len(ranges), desfmt, fua=fua),
            data=pack_copy_ranges(ranges, desfmt),
        )


def remote_namespace(
    controller: Controller, nsid: int, identify: I.IdentifyNamespace
) -> RemoteNamespace:
    """The namespace object for `nsid`: a CopyingNamespace when the controller has Copy."""
    info = controller.info
    assert info is not None
    if info.oncs & I.Oncs.COPY:
        return CopyingNamespace(controller, nsid, identify)
    return RemoteNamespace(controller, nsid, identify)


def _namespace_medium(subnqn: str, nsid: int, identify: I.IdentifyNamespace) -> Medium:
    """The storage a namespace is, by every name it has that another path may share.

    Its NSID in its NVM subsystem's NQN is the name every controller of the subsystem
    knows it by, and where the commands of an object holding it land, even a stale one
    (a namespace deleted and another made with that NSID). Its NGUID and EUI64 are
    names too, not parts of that one: a dispersed namespace (NVMe 2.0) keeps them in
    every subsystem it belongs to. An all-zero NGUID or EUI64 is not reported, so not
    a name. (The UUID is a name as well, but only the Namespace Identification
    Descriptor list carries it, which this library does not ask for.) A duplicate NGUID
    or EUI64 on different namespaces (some devices report one for all) makes copies
    between them stage overlapping ranges: that costs memory (or refuses a copy over
    the staging limit), never data.
    """
    keys: list[Hashable] = [("nvme-ns", subnqn, nsid)]
    if any(identify.nguid):
        keys.append(("nvme-nguid", bytes(identify.nguid)))
    if any(identify.eui64):
        keys.append(("nvme-eui64", bytes(identify.eui64)))
    return Medium(tuple(keys))


def _first_format(preference: tuple[int, ...], usable: int) -> int | None:
    return next((f for f in preference if usable & 1 << f), None)


def _needs_enabling(desfmt: int | None) -> bool:
    return desfmt is not None and bool(1 << desfmt & COPY_CDFE_FORMATS)


async def _wait_all(submitted: list[tuple[AnyQueue, HostCommand]]) -> None:
    first: BaseException | None = None
    for queue, cmd in submitted:
        try:
            await queue.wait(cmd)
        except Exception as exc:
            if first is None:
                first = exc
    if first is not None:
        raise first


def _byte_view(buf: Buffer) -> memoryview:
    view = buf if type(buf) is memoryview else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if not view.contiguous:
        raise ValueError("buffer is not contiguous")
    return view
