"""Fused operations: which submission queue entries form a Compare and Write, and the
namespace-wide exclusion that makes the pair atomic.

`FusedPairing` is the one place that decides pairing. It belongs to the NVMe layer, not
to the transport: fusing is a property of adjacent submission queue entries and of the
NVM command set (which opcodes fuse, what must match), while the transport only frames
them. The transport reports every entry of the queue in order: the ones it accepts
through `on_command`, the ones it fails itself (a CID conflict, a bad SGL, a data digest
error) through `on_refused`, so adjacency here is exactly the queue's.

The rules (NVMe Base 2.0 section 3.4.2, NVM Command Set 1.0 Compare and Write):

- a Compare with FUSE 01b is held until the next entry of the same queue arrives;
- if that entry is a Write with FUSE 10b for the same NSID and LBA range, the two run as
  one atomic operation (`compare.compare_and_write`); the same NSID with another range is
  Invalid Field in Command for both, as the base specification asks of fused commands
  whose LBA ranges differ (a range in another namespace is another range);
- otherwise the held Compare is aborted with Command Aborted due to Missing Fused Command,
  and the entry is taken on its own: an unfused command runs as usual, a FUSE 10b without
  a first (or whose first is not its partner) and a FUSE 01b that no supported fused
  operation starts with (anything but Compare) are aborted with that status too, as the
  status's definition says (the adjacent entry is not the other command of a supported
  fused operation);
- FUSE 11b is reserved, and Fabrics commands have no FUSE field: Invalid Field;
- an entry the transport failed ends a held Compare: Command Aborted due to Failed Fused
  Command if it was the second command, Missing Fused Command otherwise;
- a connection that ends with a Compare held just drops it (nothing ran; no completion
  can be sent).

Admin queues never get here: the admin command set has no fused operations (Invalid
Field, as the Linux and SPDK targets answer).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from pynvmf.spec.command import FUSE_FIRST, FUSE_MASK, FUSE_SECOND, Sqe
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import DNR, Status

if TYPE_CHECKING:
    from pynvmf.target.transport import Request

# Retrying one command of a failed fused operation alone cannot succeed: DNR.
FUSED_MISSING = Status.FUSED_MISSING | DNR
FUSED_FAIL = Status.FUSED_FAIL | DNR
_INVALID_FIELD = Status.INVALID_FIELD | DNR
_FABRICS = 0x7F


def _same_range(first: Sqe, second: Sqe) -> bool:
    """The Compare and the Write name the same blocks: NSID, SLBA (CDW10-11) and NLB
    (CDW12 bits 15:0; the flag bits above, FUA among them, may differ)."""
    return (
        first.nsid == second.nsid
        and first.cdw10 == second.cdw10
        and first.cdw11 == second.cdw11
        and (first.cdw12 ^ second.cdw12) & 0xFFFF == 0
    )


class FusedPairing:
    """The fused-operation state of one I/O submission queue.

    `finish(req, status)` completes a command; `start_pair(compare, write)` runs a
    matched Compare and Write. Both are the caller's (the queue's); nothing here does I/O.
    """

    __slots__ = ("_finish", "_start_pair", "first")

    def __init__(
        self,
        finish: Callable[[Request, int], None],
        start_pair: Callable[[Request, Request], None],
    ) -> None:
        self._finish = finish
        self._start_pair = start_pair
        # The Compare (FUSE 01b) waiting for the next entry of the queue.
        self.first: Request | None = None

    def arrive(self, req: Request) -> bool:
        """`req` is the next entry of the queue, with FUSE bits or after a held first.
        True if it was dealt with here (held, paired, or completed); False if it is an
        ordinary command the caller runs as usual."""
        sqe = req.sqe
        fuse = sqe.flags & FUSE_MASK
        first = self.first
        if first is not None:
            self.first = None
            if fuse == FUSE_SECOND and sqe.opcode == IoOpcode.WRITE:
                if _same_range(first.sqe, sqe):
                    self._start_pair(first, req)
                else:
                    self._finish(first, _INVALID_FIELD)
                    self._finish(req, _INVALID_FIELD)
                return True
            self._finish(first, FUSED_MISSING)
        if not fuse:
            return False
        if fuse == FUSE_MASK or sqe.opcode == _FABRICS:
            self._finish(req, _INVALID_FIELD)
        elif fuse == FUSE_FIRST and sqe.opcode == IoOpcode.COMPARE:
            self.first = req
        else:
            self._finish(req, FUSED_MISSING)
        return True

    def refused(self, req: Request) -> None:
        """The transport failed `req`, the next entry of the queue, by itself."""
        first = self.first
        if first is None:
            return
        self.first = None
        second = req.sqe.flags & FUSE_MASK == FUSE_SECOND
        self._finish(first, FUSED_FAIL if second else FUSED_MISSING)

    def release(self) -> None:
        """The queue's connection is gone: a held first command is dropped unanswered
        (nothing ran), and the callbacks into the queue (a reference cycle) go."""
        self.first = None
        self._finish = _ignore_finish
        self._start_pair = _ignore_pair


def _ignore_finish(req: Request, status: int) -> None:
    pass


def _ignore_pair(first: Request, second: Request) -> None:
    pass


class WriteGate:
    """One namespace's exclusion between fused operations and every other write.

    Ordinary writes (Write, Write Zeroes, Dataset Management, a Copy into the namespace),
    from any queue of any controller, test `closed` (one attribute) and count themselves
    in `writers` around the device call, and only the device call: a write still waiting
    for its data from the network holds nothing, so a host that never sends data cannot
    stall anybody else's fused operation. Reads and Compares are never held up: they
    cannot break a fused operation's atomicity, which is about writes.

    A fused operation closes the gate, waits for the writes already inside the device
    (a namespace whose device suspends, a thread or a remote namespace behind it, has
    some), runs alone, and opens it again. Fused operations take turns in arrival order;
    the writes that queued up behind one are let in before the next fused operation
    closes the gate, so neither kind starves the other.
    """

    __slots__ = ("_drained", "_turns", "_waiting", "closed", "writers")

    def __init__(self) -> None:
        self.closed = False
        self.writers = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._drained: asyncio.Future[None] | None = None
        self._turns = asyncio.Lock()

    # -- ordinary writes ---------------------------------------------------------------

    async def enter(self) -> None:
        """Count a write in, waiting while a fused operation holds the namespace. Every
        enter() is followed by one leave(), once the device call is over."""
        if self.closed:
            await self.wait_open()
        else:
            self.writers += 1

    async def wait_open(self) -> None:
        """enter() for a caller that found the gate closed; it returns counted in."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.leave()  # let in just as it was cancelled: give the place back
            else:
                fut.cancel()  # opening skips it
            raise

    def leave(self) -> None:
        self.writers -= 1
        if self.closed:
            self.left()

    def left(self) -> None:
        """A write has left (`writers` already counted down) while the gate is closed:
        the fused operation waiting for the device to drain may go once none is left.
        (The hot path inlines leave() as the decrement and this call.)"""
        if not self.writers:
            drained = self._drained
            if drained is not None and not drained.done():
                drained.set_result(None)

    # -- fused operations -------------------------------------------------------------

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the namespace alone: no other write runs until the block ends."""
        async with self._turns:
            self.closed = True
            try:
                if self.writers:
                    self._drained = asyncio.get_running_loop().create_future()
                    await self._drained
                yield
            finally:
                self._drained = None
                self.closed = False
                self._let_in()

    def _let_in(self) -> None:
        waiting = self._waiting
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                self.writers += 1
                fut.set_result(None)
