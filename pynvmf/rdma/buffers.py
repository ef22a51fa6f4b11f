"""Registered memory for one NVMe/RDMA queue: buffers carved by offset from regions
registered once. Sans-I/O: this module decides which buffer, where, and in what order the
work that needs one goes out; the adapter (verbs.py) registers the regions and posts.

Registering a memory region per RDMA READ, RDMA WRITE and completion SEND (and
deregistering it on completion) costs a system call and the kernel's page pinning each
time; a queue registers its regions when it is made and frees them once when it is
released. A work request names its buffer by the region's key and an address inside it
(an SGE's addr and length), so a buffer is just an offset.

- :class:`BufferPool`: fixed-size slots in size classes (smallest that fits first, then
  larger), bounded: ``take`` answers None when no slot of a fitting class is free.
- :class:`OrderedWork`: the send queue's work in the order the queue asked for it; work
  that needs a buffer when none is free waits, and so does everything asked for after it
  (a read's RDMA WRITE and its completion's SEND must go out in that order), and so does
  work past the send queue's depth. A slot and a send queue entry come back when the work
  request that used them completes, which lets the first waiter go.

Bounded either way: a queue of depth N has N commands in flight, each with at most one
data transfer outstanding in the common case, so 4-16 KiB transfers find a slot each
(:func:`data_classes`); what finds none waits rather than failing, and a completion
buffer is taken only by work that has a send queue entry, of which there are as many.

Stale bytes: a buffer is not cleared between uses; what goes out of it is exactly the
bytes the queue put in (an RDMA WRITE or SEND of ``n`` bytes), and what comes back from
an RDMA READ is read for the command's length only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

# Slots start at multiples of this: a cache line, so that two buffers never share one.
ALIGN = 64


@dataclass(frozen=True, slots=True)
class Slot:
    """One buffer: ``offset`` bytes into the pool's region, ``size`` bytes long."""

    index: int
    offset: int
    size: int


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class BufferPool:
    """Slots of a few sizes laid out in one region of :attr:`size` bytes.

    ``classes``: (slot size, slot count) pairs; every slot is aligned to :data:`ALIGN`.
    """

    def __init__(self, classes: list[tuple[int, int]]) -> None:
        if not classes:
            raise ValueError("a pool needs at least one size class")
        self.slots: list[Slot] = []
        # Per class, smallest first: (slot size, free slot indices).
        self._free: list[tuple[int, list[int]]] = []
        offset = 0
        for size, count in sorted(classes):
            if size <= 0 or count <= 0:
                raise ValueError(f"size class {size} x {count}: both must be positive")
            free = []
            for _ in range(count):
                free.append(len(self.slots))
                self.slots.append(Slot(len(self.slots), offset, size))
                offset += _aligned(size)
            # Taken from the end: the lowest index first.
            free.reverse()
            self._free.append((size, free))
        self.size = offset
        self.largest = self._free[-1][0]
        self._taken = [False] * len(self.slots)
        self.in_use = 0

    def fits(self, length: int) -> bool:
        """Whether any slot is large enough for ``length`` bytes."""
        return length <= self.largest

    def take(self, length: int) -> Slot | None:
        """A free slot of at least ``length`` bytes, the smallest class first; None when
        every fitting class is in use (or no class fits: see :meth:`fits`)."""
        for size, free in self._free:
            if size >= length and free:
                index = free.pop()
                self._taken[index] = True
                self.in_use += 1
                return self.slots[index]
        return None

    def give(self, slot: Slot) -> None:
        """Return ``slot``; giving back one not taken is a bug (ValueError)."""
        if not self._taken[slot.index]:
            raise ValueError(f"slot {slot.index} given back but not taken")
        self._taken[slot.index] = False
        self.in_use -= 1
        for size, free in self._free:
            if size == slot.size:
                free.append(slot.index)
                return


def data_classes(depth: int, max_transfer: int) -> list[tuple[int, int]]:
    """A queue's data buffers for ``depth`` commands: a 16 KiB slot per command (the
    seed's sizes: 4-16 KiB transfers never wait), a few of 128 KiB, and two of
    ``max_transfer`` (larger transfers are fewer at a time; they wait for one). Depth 128
    with 1 MiB transfers: 6 MiB registered, against 128 MiB for a largest slot each."""
    small = min(16384, max_transfer)
    classes = [(small, depth)]
    if max_transfer > 131072:
        classes.append((131072, max(2, depth // 8)))
    if max_transfer > small:
        classes.append((max_transfer, 2))
    return classes


@dataclass(slots=True)
class _Waiting(Generic[T]):
    need: int  # bytes of data buffer, 0: none
    work: T


class OrderedWork(Generic[T]):
    """Work for one send queue, handed out in the order it was asked for, each with the
    data buffer it needs, and no more at a time than the send queue holds (``credits``:
    its work requests; one comes back with each completion, :meth:`done`).

    ``push``, ``done`` and ``give`` return what may be posted now, in order: (work, slot)
    pairs, slot None for work that needs no buffer."""

    def __init__(self, pool: BufferPool, credits: int) -> None:
        self.pool = pool
        self.credits = credits
        self._waiting: deque[_Waiting[T]] = deque()
        self.waits = 0  # work that could not go at once, over the queue's life

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def push(self, work: T, need: int = 0) -> list[tuple[T, Slot | None]]:
        """Ask for ``work`` (needing ``need`` bytes of data buffer); ValueError where no
        slot could ever hold ``need`` bytes."""
        if need and not self.pool.fits(need):
            raise ValueError(f"{need} bytes: the largest buffer holds {self.pool.largest}")
        self._waiting.append(_Waiting(need, work))
        ready = self._drain()
        if self._waiting and self._waiting[-1].work is work:
            self.waits += 1
        return ready

    def done(self, slot: Slot | None = None) -> list[tuple[T, Slot | None]]:
        """A work request completed (its credit comes back), with ``slot`` if it used
        one: what waited may go."""
        self.credits += 1
        if slot is not None:
            self.pool.give(slot)
        return self._drain()

    def _drain(self) -> list[tuple[T, Slot | None]]:
        ready: list[tuple[T, Slot | None]] = []
        waiting = self._waiting
        while waiting and self.credits:
            head = waiting[0]
            slot = None
            if head.need:
                slot = self.pool.take(head.need)
                if slot is None:
                    break
            waiting.popleft()
            self.credits -= 1
            ready.append((head.work, slot))
        return ready

    def clear(self) -> list[T]:
        """The queue is gone: drop what waits (returned)."""
        dropped = [w.work for w in self._waiting]
        self._waiting.clear()
        return dropped


class Region(Protocol):
    """A registered memory region, as the pool needs it (pyverbs' MR)."""

    def close(self) -> None: ...


R = TypeVar("R", bound=Region)


class RegionPool(Generic[R]):
    """A region per slot of ``pool``, registered (``register(size)``) the first time its
    slot is taken and kept until :meth:`close`: where a work request must name a whole
    region from its start (pyverbs' CM ID posts), a buffer is a region, not an offset. A
    request that no free slot fits gets a region of its own (slot None), closed when given
    back; the regions kept are bounded by the pool's slots."""

    def __init__(self, pool: BufferPool, register: Callable[[int], R]) -> None:
        self.pool = pool
        self._register = register
        self._regions: dict[int, R] = {}

    def take(self, length: int) -> tuple[R, Slot | None]:
        slot = self.pool.take(length)
        if slot is None:
            return self._register(max(length, 1)), None
        mr = self._regions.get(slot.index)
        if mr is None:
            mr = self._regions[slot.index] = self._register(slot.size)
        return mr, slot

    def give(self, mr: R, slot: Slot | None) -> None:
        if slot is None:
            mr.close()
        else:
            self.pool.give(slot)

    @property
    def registered(self) -> int:
        return len(self._regions)

    def close(self) -> None:
        regions, self._regions = self._regions, {}
        for mr in regions.values():
            mr.close()
