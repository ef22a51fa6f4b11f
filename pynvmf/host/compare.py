"""Compare, Verify and the fused Compare and Write, on a RemoteNamespace.

A miscompare is an answer, not an error: `compare` and `compare_and_write` return whether
the data matched (False for Compare Failure, with nothing written); any other failure
raises NvmeStatusError. Each checks what the controller reported before anything is
sent (ONCS for Compare and Verify, FUSES for Compare and Write) and raises
NvmeUnsupportedError without it: a controller that does not know fused operations might
run the Write on its own.

A compare-and-write is one fused pair, so at most as many blocks as the controller
writes atomically for it (ACWU, or the namespace's NACWU) and as one command carries;
it goes on one queue, its two capsules back to back (`HostQueue.submit_fused`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pynvmf.block.device import Buffer, check_range
from pynvmf.host.errors import NvmeError, NvmeStatusError, NvmeUnsupportedError
from pynvmf.host.queue import Submission
from pynvmf.spec import identify as I
from pynvmf.spec.command import RW_FUA
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status

if TYPE_CHECKING:
    from pynvmf.host.controller import AnyQueue
    from pynvmf.host.namespace import RemoteNamespace
    from pynvmf.tcp.host import HostCommand

_MAX_NLB = 0x10000  # NLB is a 16-bit 0's based field
_NSFEAT_NSABP = 1 << 1  # NAWUN, NAWUPF and NACWU apply to this namespace


async def compare(ns: RemoteNamespace, lba: int, data: Buffer, *, fua: bool = False) -> bool:
    """Whether blocks `lba`... hold `data` (one Compare per command-sized piece)."""
    _require(ns, _info(ns).oncs & I.Oncs.COMPARE, "Compare")
    view = _byte_view(data)
    nblocks = ns._blocks(lba, view.nbytes)
    if not nblocks:
        return True
    step = ns.max_io_blocks
    shift = ns._shift
    flags = RW_FUA if fua else 0
    ctrl = ns.controller
    submitted: list[tuple[AnyQueue, HostCommand]] = []
    try:
        for off in range(0, nblocks, step):
            n = min(step, nblocks - off)
            start = lba + off
            queue = ctrl.next_queue()
            cmd = await queue.submit(
                IoOpcode.COMPARE,
                ns.nsid,
                start & 0xFFFFFFFF,
                start >> 32,
                (n - 1) | flags,
                data=view[off << shift : (off + n) << shift],
            )
            submitted.append((queue, cmd))
    finally:
        errors = [await _outcome(queue, cmd) for queue, cmd in submitted]
    failures = [e for e in errors if e is not None and e.status != Status.COMPARE_FAILED]
    if failures:
        raise failures[0]
    return all(e is None for e in errors)


async def verify(ns: RemoteNamespace, lba: int, nblocks: int, *, fua: bool = False) -> None:
    """Have the controller check that blocks `lba`..`lba + nblocks - 1` are readable,
    without moving their data; raises NvmeStatusError (e.g. Unrecovered Read Error) if not."""
    _require(ns, _info(ns).oncs & I.Oncs.VERIFY, "Verify")
    ns._check_open()
    check_range(ns.capabilities, lba, nblocks)
    if not nblocks:
        return
    ctrl = ns.controller
    limit = ctrl.size_limit_bytes((await ctrl.nvm_limits()).vsl)
    step = min(_MAX_NLB, limit // ns.capabilities.block_size if limit else _MAX_NLB)
    flags = RW_FUA if fua else 0
    submitted: list[tuple[AnyQueue, HostCommand]] = []
    try:
        for start in range(lba, lba + nblocks, step):
            n = min(step, lba + nblocks - start)
            queue = ctrl.next_queue()
            cmd = await queue.submit(
                IoOpcode.VERIFY, ns.nsid, start & 0xFFFFFFFF, start >> 32, (n - 1) | flags
            )
            submitted.append((queue, cmd))
    finally:
        errors = [await _outcome(queue, cmd) for queue, cmd in submitted]
    for error in errors:
        if error is not None:
            raise error


def compare_and_write_limit(ns: RemoteNamespace) -> int:
    """The most blocks one compare-and-write may cover: what the controller guarantees to
    write atomically for it (NACWU where the namespace reports its own, else ACWU) and
    what one command may carry."""
    ident = ns.identify
    own = ident.nsfeat & _NSFEAT_NSABP and ident.nacwu
    atomic = (ident.nacwu if own else _info(ns).acwu) + 1
    return min(atomic, ns.max_io_blocks)


async def compare_and_write(
    ns: RemoteNamespace, lba: int, expected: Buffer, new: Buffer, *, fua: bool = False
) -> bool:
    """Atomically: if blocks `lba`... hold `expected`, write `new` there (True); if not,
    write nothing (False). No other write to the namespace comes in between."""
    _require(
        ns,
        _info(ns).fuses & I.Fuses.COMPARE_AND_WRITE,
        "the Compare and Write fused operation",
    )
    old_view, new_view = _byte_view(expected), _byte_view(new)
    if old_view.nbytes != new_view.nbytes:
        raise ValueError(
            f"expected data of {old_view.nbytes} bytes and new data of {new_view.nbytes}"
        )
    nblocks = ns._blocks(lba, old_view.nbytes)
    if not nblocks:
        raise ValueError("a compare-and-write needs at least one block")
    limit = compare_and_write_limit(ns)
    if nblocks > limit:
        raise ValueError(f"{nblocks} blocks: the controller compares and writes {limit} atomically")
    cdw10, cdw11, nlb = lba & 0xFFFFFFFF, lba >> 32, nblocks - 1
    queue = ns.controller.next_queue()
    cmp, wr = await queue.submit_fused(
        Submission(IoOpcode.COMPARE, ns.nsid, cdw10, cdw11, nlb, data=old_view),
        Submission(
            IoOpcode.WRITE, ns.nsid, cdw10, cdw11, nlb | (RW_FUA if fua else 0), data=new_view
        ),
    )
    cmp_error = await _outcome(queue, cmp)
    wr_error = await _outcome(queue, wr)
    if cmp_error is not None and cmp_error.status == Status.COMPARE_FAILED:
        if wr_error is not None and wr_error.status == Status.FUSED_FAIL:
            return False
        # A Write that ran after its Compare failed breaks the operation's promise.
        raise NvmeError(
            f"compare-and-write at LBA {lba}: the Compare failed but the Write "
            f"{'completed' if wr_error is None else f'failed with {wr_error.name}'}"
        )
    if cmp_error is not None:
        raise cmp_error
    if wr_error is not None:
        raise wr_error
    return True


async def _outcome(queue: AnyQueue, cmd: HostCommand) -> NvmeStatusError | None:
    """A command's failure status, or None; the queue's loss still raises."""
    try:
        await queue.wait(cmd)
    except NvmeStatusError as exc:
        return exc
    return None


def _info(ns: RemoteNamespace) -> I.IdentifyController:
    info = ns.controller.info
    assert info is not None  # known once the controller is up
    return info


def _require(ns: RemoteNamespace, supported: int, what: str) -> None:
    if not supported:
        raise NvmeUnsupportedError(f"{ns.controller.subnqn} does not support {what}")


def _byte_view(buf: Buffer) -> memoryview:
    view = buf if type(buf) is memoryview else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if not view.contiguous:
        raise ValueError("buffer is not contiguous")
    return view
