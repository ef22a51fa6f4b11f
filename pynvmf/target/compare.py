"""Compare, Verify and the fused Compare and Write of the NVM command set.

Each is validated as Read and Write are (`IoHandler.rw_target`: namespace, LBA range,
MDTS, the SGL's length) before any data moves. A Compare reads the blocks and compares
them with the host's data: a difference is Compare Failure and touches nothing. A
Verify reads the blocks and moves no data. Both count as reads in the SMART log, as the
NVM command set says of them. The namespaces carry no protection information, so PRINFO
is ignored as Read and Write ignore it; FUA makes both commit what the device caches
(a flush) before they read, so they check what is on stable storage.

Which submission queue entries form a Compare and Write is decided in `fused.py`; the pair
runs here, under the namespace's WriteGate.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pynvmf.block.device import BlockRangeError, StorageUnavailable
from pynvmf.logs import about
from pynvmf.spec.command import RW_FUA
from pynvmf.spec.status import DNR, Status
from pynvmf.target import reservations
from pynvmf.target.fused import FUSED_FAIL
from pynvmf.target.limits import MAX_TRANSFER, VERIFY_MAX_BYTES
from pynvmf.target.outcome import Outcome
from pynvmf.target.quiesce import wait_resumed

if TYPE_CHECKING:
    from pynvmf.target.io import IoHandler
    from pynvmf.target.subsystem import Namespace
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

COMPARE_FAILED = Status.COMPARE_FAILED | DNR
_READ_ERROR = Status.UNRECOVERED_READ_ERROR
# Verify reads through one buffer of this size, whatever its length.
_VERIFY_CHUNK = MAX_TRANSFER


def _error_status(exc: OSError, media_error: int) -> int:
    """A device error's status: path-related when the storage is unreachable through
    this target (as IoHandler.execute answers), else the media error given."""
    if isinstance(exc, StorageUnavailable):
        return Status.INTERNAL_PATH_ERROR
    return media_error


async def compare(io: IoHandler, req: Request) -> Outcome:
    status, ns, slba, _nlb, length = io.rw_target(req)
    if status or ns is None:
        return status, 0, None
    data = req.data if req.data is not None else await io.queue.fetch_data(req)
    try:
        if req.sqe.cdw12 & RW_FUA:
            await ns.device.flush()
        await io.queue.hold(req, length)  # the namespace's data, to compare with
        same = await _matches(ns, slba, data)
    except OSError as exc:
        about(log, io.queue).error("read error in Compare on nsid %d: %s", ns.nsid, exc)
        return _error_status(exc, _READ_ERROR), 0, None
    _count_read(io, length)
    return (Status.SUCCESS if same else COMPARE_FAILED), 0, None


async def verify(io: IoHandler, req: Request) -> Outcome:
    sqe = req.sqe
    ns = io.namespaces.get(sqe.nsid)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    slba = sqe.cdw10 | sqe.cdw11 << 32
    nlb = (sqe.cdw12 & 0xFFFF) + 1
    if slba + nlb > ns.num_blocks:
        return Status.LBA_OUT_OF_RANGE | DNR, 0, None
    length = nlb * ns.block_size
    if length > VERIFY_MAX_BYTES:
        # Longer than the Verify Size Limit reported in Identify (CNS 06h).
        return Status.INVALID_FIELD | DNR, 0, None
    device = ns.device
    step = _VERIFY_CHUNK // ns.block_size
    await io.queue.hold(req, min(length, _VERIFY_CHUNK))
    buf = memoryview(bytearray(min(length, _VERIFY_CHUNK)))
    try:
        if sqe.cdw12 & RW_FUA:
            await device.flush()
        for lba in range(slba, slba + nlb, step):
            n = min(step, slba + nlb - lba)
            await device.read(lba, buf[: n * ns.block_size])
    except OSError as exc:
        about(log, io.queue).error("read error in Verify on nsid %d: %s", ns.nsid, exc)
        return _error_status(exc, _READ_ERROR), 0, None
    _count_read(io, length)
    return Status.SUCCESS, 0, None


async def compare_and_write(io: IoHandler, first: Request, second: Request) -> None:
    """Run a fused Compare (`first`) and Write (`second`), which `FusedPairing` matched,
    as one operation, and complete both."""
    finish = io.queue.finish
    try:
        if io.quiesced:  # both name the same namespace (a pair's rule)
            await wait_resumed(io.quiesced, first.sqe.opcode, first.sqe.nsid)
        statuses = await reservations.run_fused(
            io, first, second, lambda: _compare_and_write(io, first, second)
        )
    except ConnectionError:
        return  # the queue went away: nothing to complete
    except Exception:
        about(log, io.queue).exception("fused Compare and Write failed")
        statuses = (Status.INTERNAL_ERROR, Status.INTERNAL_ERROR)
    for req, status in zip((first, second), statuses, strict=True):
        if status is not None:
            io.count(req, status)
            finish(req, status)


async def _compare_and_write(
    io: IoHandler, first: Request, second: Request
) -> tuple[int | None, int | None]:
    """Statuses of the Compare and of the Write; None for one the transport completed."""
    if io.ana.any_blocked:
        # Through a path that does not serve the namespace both go back to the host,
        # which retries them on another.
        blocked = io.path_status(first.sqe.nsid) or io.path_status(second.sqe.nsid)
        if blocked:
            return blocked, blocked
    status, ns, slba, _nlb, length = io.rw_target(first)
    if status or ns is None:
        return status, FUSED_FAIL
    status = io.rw_target(second)[0]
    if status:
        return FUSED_FAIL, status
    fetched = await _fetch_both(io, first, second)
    if fetched is None:
        # A data digest error failed one (the transport completed it): the other is
        # aborted with it.
        return (None if first.data is None else FUSED_FAIL), (
            None if second.data is None else FUSED_FAIL
        )
    expected, new = fetched
    fua = bool(second.sqe.cdw12 & RW_FUA) or not io.ctrl.volatile_write_cache
    device = ns.device
    async with ns.gate.exclusive():
        try:
            if first.sqe.cdw12 & RW_FUA:
                await device.flush()
            same = await _matches(ns, slba, expected)
        except BlockRangeError:
            return Status.LBA_OUT_OF_RANGE | DNR, FUSED_FAIL
        except OSError as exc:
            about(log, io.queue).error(
                "read error in Compare and Write on nsid %d: %s", ns.nsid, exc
            )
            return _error_status(exc, _READ_ERROR), FUSED_FAIL
        _count_read(io, length)
        if not same:
            return COMPARE_FAILED, FUSED_FAIL
        try:
            await device.write(slba, new, fua=fua)
        except OSError as exc:
            # The Compare did succeed; what the Write left in the range is unknown.
            about(log, io.queue).error(
                "write error in Compare and Write on nsid %d: %s", ns.nsid, exc
            )
            return Status.SUCCESS, _error_status(exc, Status.WRITE_FAULT)
    stats = io.stats
    stats.write_cmds += 1
    stats.write_bytes += length
    return Status.SUCCESS, Status.SUCCESS


async def _fetch_both(
    io: IoHandler, first: Request, second: Request
) -> tuple[bytearray, bytearray] | None:
    """Both commands' data, the ones not in their capsule asked for together (one
    round trip), before the namespace is taken: nobody waits on the network for us.
    None if a transfer failed while the connection lives on."""
    queue = io.queue
    missing = [req for req in (first, second) if req.data is None]
    if missing:
        results = await asyncio.gather(
            *(queue.fetch_data(req) for req in missing), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                if queue.conn.closing or not isinstance(result, ConnectionError):
                    raise result
                return None
    assert first.data is not None and second.data is not None
    return first.data, second.data


async def _matches(ns: Namespace, slba: int, expected: bytearray) -> bool:
    buf = bytearray(len(expected))
    await ns.device.read(slba, memoryview(buf))
    return buf == expected


def _count_read(io: IoHandler, length: int) -> None:
    stats = io.stats
    stats.read_cmds += 1
    stats.read_bytes += length
