"""A block device's rate limits as one process applies them: the shared pacing state
(qos.py's rules) and the commands of this process that wait for their turn.

The state lives in a memfd that every process serving the device maps: the main process
creates it (`QosGate.create`) and hands a descriptor to each worker of `pynvmf target
--cores N` (`QosGate.open`), so that all of them pace against one set of numbers and the
limit holds for the device as a whole however its hosts' queues are spread. With
workers, a semaphore (block/range_locks.py, one stripe) makes each admission atomic
across processes; in one process the event loop already does.

A command that may not go yet waits in this process's first-in first-out queue, on one
event loop timer for the head: no sleep, no thread, and nothing allocated beyond the
future of a command the queue depth already bounds.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections import deque

from pynvmf.block.range_locks import RangeLocks
from pynvmf.target import qos
from pynvmf.target.qos import QosLimits

_NS_PER_S = 1_000_000_000


class QosGate:
    """One process's handle on one device's limits."""

    def __init__(self, fd: int, lock: RangeLocks | None) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, qos.STATE_BYTES)
        self._state = memoryview(self._map).cast("q")
        self.lock = lock
        self._waiting: deque[tuple[asyncio.Future[None], bool, int]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        # When the timer's head was to be admitted (qos.admit's `due_at`).
        self._due_at = 0
        self.closed = False

    @classmethod
    def create(cls, limits: QosLimits, lock: RangeLocks | None = None) -> QosGate:
        """New state for `limits` (the main process's; `lock` when workers share it)."""
        fd = os.memfd_create("pynvmf-qos", os.MFD_CLOEXEC)
        os.ftruncate(fd, qos.STATE_BYTES)
        gate = cls(fd, lock)
        gate.set_limits(limits)
        return gate

    @classmethod
    def open(cls, fd: int, lock_name: str) -> QosGate:
        """Another process's state: its memfd (now this gate's, closed if this fails)
        and its lock's name."""
        try:
            return cls(fd, RangeLocks.open(lock_name, 1) if lock_name else None)
        except BaseException:
            os.close(fd)
            raise

    @property
    def lock_name(self) -> str:
        return self.lock.name if self.lock is not None else ""

    @property
    def limits(self) -> QosLimits:
        ios, rw, r, w = (self._state[i] for i in range(qos.LIMITS))
        return QosLimits(ios, rw // qos.MIB, r // qos.MIB, w // qos.MIB)

    def set_limits(self, limits: QosLimits) -> None:
        self._hold()
        try:
            qos.set_rates(self._state, limits)
        finally:
            self._release()
        self._schedule(0)  # waiters judged by the new rates

    def try_admit(self, is_read: bool, nbytes: int) -> bool:
        """Admit a command now if its turn has come (nobody of this process waits before
        it); False: it must `wait`."""
        if self.closed:
            return True
        return not self._waiting and not self._admit(is_read, nbytes)

    def wait(self, is_read: bool, nbytes: int) -> asyncio.Future[None]:
        """A future that is done when the command has been admitted (or the limits were
        removed: it goes unlimited)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_result(None)
            return fut
        self._waiting.append((fut, is_read, nbytes))
        if self._timer is None:
            self._schedule(0)
        return fut

    def close(self) -> None:
        """The limits are gone: every waiting command goes now."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            fut = self._waiting.popleft()[0]
            if not fut.done():
                fut.set_result(None)
        self._state.release()
        self._map.close()
        os.close(self.fd)
        if self.lock is not None:
            self.lock.close()

    # -- the waiting queue -----------------------------------------------------------

    def _admit(self, is_read: bool, nbytes: int, due_at: int = 0) -> int:
        self._hold()
        try:
            return qos.admit(self._state, is_read, nbytes, time.monotonic_ns(), due_at)
        finally:
            self._release()

    def _run(self) -> None:
        """The head's time has come: admit all that may go, in order."""
        self._timer = None
        waiting = self._waiting
        while waiting:
            fut, is_read, nbytes = waiting[0]
            if fut.done():  # its command went away (the connection closed)
                waiting.popleft()
                continue
            wait_ns = self._admit(is_read, nbytes, self._due_at)
            if wait_ns:
                self._schedule(wait_ns)
                return
            waiting.popleft()
            fut.set_result(None)

    def _schedule(self, wait_ns: int) -> None:
        if self.closed or not self._waiting:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._due_at = time.monotonic_ns() + wait_ns
        self._timer = loop.call_at(loop.time() + wait_ns / _NS_PER_S, self._run)

    def _hold(self) -> None:
        if self.lock is not None:
            self.lock.hold(0, 1)

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release(0, 1)
