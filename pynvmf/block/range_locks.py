"""RangeLocks: byte ranges of storage that several processes map, touched by one of them at
a time.

`pynvmf target --cores N` serves a memory namespace from N processes that all map the
same shared memory (block/shared_memory.py). Within one process the event loop already
makes every copy into or out of that memory atomic; between processes nothing did, so a
Read copying blocks while another worker's Write copied into them could send a block
that is half old and half new, and two Writes to the same block could interleave. The
namespace reports (Identify AWUN/AWUPF 0: one logical block) that neither happens.

The storage is cut into stripes of STRIPE_BYTES; stripe i is guarded by semaphore
i mod `count`, a named POSIX semaphore (posix_ipc) each process opens. Every copy holds
the semaphores of the stripes it touches, taken in ascending order (so two copies
spanning the same stripes cannot deadlock), for the copy alone: nothing awaits while
holding one. Named semaphores, because an uncontended acquire and release are one
atomic instruction each in user space (glibc's futex-based semaphores): 130 ns a pair
from Python, where fcntl record locks on the memfd cost 1.9 us (two system calls).

A process that dies holding a semaphore (a worker killed in the middle of a copy) would
leave it taken for good: a copy that waits HOLD_TIMEOUT_S for one (a thousand times the
longest copy) takes it over, and says so in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from types import ModuleType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import posix_ipc

log = logging.getLogger(__name__)

STRIPE_SHIFT: Final = 16  # 64 KiB stripes: a 4 KiB copy rarely spans two
STRIPE_BYTES: Final = 1 << STRIPE_SHIFT
MAX_STRIPES: Final = 64
HOLD_TIMEOUT_S: Final = 2.0
# Names are "/pynvmf.PID.TOKEN.INDEX": the creating process's PID lets a later target
# remove what a killed one left in /dev/shm (remove_stale).
_PREFIX: Final = "/pynvmf."
_SHM_DIR: Final = "/dev/shm"


def _ipc() -> ModuleType:
    """posix_ipc, imported where semaphores are made or met: the host library imports the
    block package in places that have Debian's Python alone (a guest), and needs none."""
    import posix_ipc

    return posix_ipc


def stripes_for(size: int) -> int:
    """How many semaphores guard `size` bytes: one per stripe up to MAX_STRIPES, a power
    of two (stripe indices wrap around with a mask)."""
    need = max(1, -(-size // STRIPE_BYTES))
    count = 1
    while count < need and count < MAX_STRIPES:
        count <<= 1
    return count


class RangeLocks:
    """The semaphores of one shared storage, as one process holds them. `create` makes
    them (the process that owns the storage, which removes them on close); `open` finds
    them by `name` in another process."""

    __slots__ = ("_mask", "_owner", "_sems", "count", "name")

    def __init__(self, name: str, count: int, *, create: bool) -> None:
        if count < 1 or count & (count - 1):
            raise ValueError(f"stripe count {count} is not a power of two")
        self.name = name
        self.count = count
        self._mask = count - 1
        self._owner = create
        ipc = _ipc()
        flags = ipc.O_CREX if create else 0
        sems: list[posix_ipc.Semaphore] = []
        try:
            for i in range(count):
                sems.append(ipc.Semaphore(f"{name}.{i}", flags, initial_value=1))
        except BaseException:
            for sem in sems:
                _close(sem, unlink=create)
            raise
        self._sems = sems

    @classmethod
    def create(cls, size: int) -> RangeLocks:
        """New semaphores for `size` bytes of storage."""
        name = f"{_PREFIX}{os.getpid()}.{secrets.token_hex(6)}"
        return cls(name, stripes_for(size), create=True)

    @classmethod
    def open(cls, name: str, count: int) -> RangeLocks:
        """The semaphores another process created (its `name` and `count`)."""
        return cls(name, count, create=False)

    def hold(self, off: int, end: int) -> None:
        """Wait for the bytes [off, end) to be free, then hold them until release."""
        first = off >> STRIPE_SHIFT
        last = (end - 1) >> STRIPE_SHIFT
        if first == last:
            self._take(first & self._mask)
        elif last > first:
            for i in self._stripes(first, last):
                self._take(i)

    def release(self, off: int, end: int) -> None:
        """Give back what hold(off, end) took."""
        first = off >> STRIPE_SHIFT
        last = (end - 1) >> STRIPE_SHIFT
        if first == last:
            self._sems[first & self._mask].release()
        elif last > first:
            for i in self._stripes(first, last):
                self._sems[i].release()

    def hold_two(self, a_off: int, a_end: int, b_off: int, b_end: int) -> list[int]:
        """Hold two ranges at once (a copy's source and destination): the stripes of both,
        each once, in ascending order. Returns what release_stripes gives back."""
        indices = set()
        for off, end in ((a_off, a_end), (b_off, b_end)):
            if end > off:
                indices.update(self._stripes(off >> STRIPE_SHIFT, (end - 1) >> STRIPE_SHIFT))
        held = sorted(indices)
        for i in held:
            self._take(i)
        return held

    def release_stripes(self, held: list[int]) -> None:
        for i in held:
            self._sems[i].release()

    def try_hold(self, off: int, end: int) -> bool:
        """Hold [off, end) if no other holder has any of it now, else hold nothing."""
        taken: list[int] = []
        for i in self._stripes(off >> STRIPE_SHIFT, (end - 1) >> STRIPE_SHIFT):
            try:
                self._sems[i].acquire(0)
            except _ipc().BusyError:
                for j in reversed(taken):
                    self._sems[j].release()
                return False
            taken.append(i)
        return True

    def close(self) -> None:
        """Close this process's handles (and remove the semaphores, where it made them)."""
        sems, self._sems = self._sems, []
        for sem in sems:
            _close(sem, unlink=self._owner)

    def _stripes(self, first: int, last: int) -> list[int]:
        if last - first >= self._mask:
            return list(range(self.count))
        return sorted({i & self._mask for i in range(first, last + 1)})

    def _take(self, i: int) -> None:
        try:
            self._sems[i].acquire(HOLD_TIMEOUT_S)
        except _ipc().BusyError:
            log.error(
                "stripe %d of %s was held for over %g s (a worker that died inside a copy): "
                "taken over",
                i,
                self.name,
                HOLD_TIMEOUT_S,
            )


def _close(sem: posix_ipc.Semaphore, *, unlink: bool) -> None:
    if unlink:
        with contextlib.suppress(_ipc().ExistentialError):
            sem.unlink()
    sem.close()


def remove_stale() -> int:
    """Remove the semaphores that targets which no longer run left behind (a target killed
    before it could remove its own). Returns how many were removed."""
    try:
        entries = os.listdir(_SHM_DIR)
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        # glibc keeps the semaphore named "/NAME" as /dev/shm/sem.NAME
        if not entry.startswith("sem." + _PREFIX[1:]):
            continue
        parts = entry[4:].split(".")
        if len(parts) != 4 or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        try:
            _ipc().unlink_semaphore("/" + entry[4:])
            removed += 1
        except _ipc().ExistentialError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
