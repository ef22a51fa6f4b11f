"""RemoteNamespace: a namespace of a remote controller as a local BlockDevice.

Requests larger than one command may carry (MDTS, or 64 Ki blocks) are split
into commands issued concurrently, spread over the I/O queues; read data lands
directly in slices of the caller's buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pynvmf.block.device import Buffer, Capabilities, check_range
from pynvmf.host.errors import NvmeConnectionError
from pynvmf.spec import identify as I
from pynvmf.spec.command import DSM_ATTR_DEALLOCATE, DSM_MAX_RANGES, DSM_RANGE, RW_FUA
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.tcp.host import HostCommand

if TYPE_CHECKING:
    from pynvmf.host.controller import Controller
    from pynvmf.host.queue import HostQueue

# Read/Write/Write Zeroes CDW12 and Dataset Management CDW11 bits.
# Dataset Management range: context attributes, length in LBAs, starting LBA.
_DSM_MAX_NLB = 0xFFFFFFFF
_MAX_NLB = 0x10000  # NLB is a 16-bit 0's based field
_ZERO_CHUNK = 1024 * 1024


def capabilities_from_identify(ns: I.IdentifyNamespace, ctrl: I.IdentifyController) -> Capabilities:
    return Capabilities(
        block_size=ns.block_size,
        num_blocks=ns.nsze,
        volatile_write_cache=bool(ctrl.vwc & I.Vwc.PRESENT),
        write_zeroes=bool(ctrl.oncs & I.Oncs.WRITE_ZEROES),
        deallocate=bool(ctrl.oncs & I.Oncs.DSM),
        deallocated_reads_zero=ns.dlfeat & 0x7 == I.Dlfeat.READ_ZEROES,
    )


class RemoteNamespace:
    """One namespace of `controller` (implements pynvmf.block.device.BlockDevice)."""

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

    def __repr__(self) -> str:
        c = self._caps
        return f"RemoteNamespace(nsid={self.nsid}, {c.num_blocks} x {c.block_size} B)"

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def max_io_blocks(self) -> int:
        return self._max_blocks

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
        submitted: list[tuple[HostQueue, HostCommand]] = []
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
        submitted: list[tuple[HostQueue, HostCommand]] = []
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


async def _wait_all(submitted: list[tuple[HostQueue, HostCommand]]) -> None:
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
