"""What a target's NVMe/RDMA queues counted, for its statistics (nvmf_get_stats).

Each queue (pynvmf.rdma.queue.RdmaConnection) counts its own work as it goes and tells the
tally of its port when it opens and when it ends (`RdmaQueueTally.opened` / `ended`); a
tally answers for the queues alive (their counters read when asked) and for those that
ended (added up as they end). Nothing here runs per command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class RdmaCounters:
    """What NVMe/RDMA queues counted: one queue's, or the sum of several."""

    commands: int = 0  # command capsules received (a receive completed each)
    in_capsule_bytes: int = 0  # data that came in the command capsules
    rdma_reads: int = 0  # RDMA READs of host memory (a write's data, keyed)
    rdma_writes: int = 0  # RDMA WRITEs to host memory (a read's data)
    completions: int = 0  # completions SENT (one per command answered)

    def add(self, other: RdmaCounters) -> None:
        self.commands += other.commands
        self.in_capsule_bytes += other.in_capsule_bytes
        self.rdma_reads += other.rdma_reads
        self.rdma_writes += other.rdma_writes
        self.completions += other.completions


class CountingQueue(Protocol):
    """A queue that counts (RdmaConnection): what a tally asks of it."""

    def counters(self) -> RdmaCounters:
        """A copy of what the queue has counted so far."""
        ...


class RdmaQueueTally:
    """What the queues of one rdma port counted: those alive and those that ended."""

    def __init__(self) -> None:
        self.queues = 0  # queues opened on the port
        self._ended = RdmaCounters()
        self._alive: dict[int, CountingQueue] = {}

    def opened(self, queue: CountingQueue) -> None:
        self.queues += 1
        self._alive[id(queue)] = queue

    def ended(self, queue: CountingQueue) -> None:
        """`queue` counts no more: its figures join those of the queues that ended (once)."""
        if self._alive.pop(id(queue), None) is not None:
            self._ended.add(queue.counters())

    @property
    def alive(self) -> int:
        return len(self._alive)

    def total(self) -> RdmaCounters:
        total = RdmaCounters()
        total.add(self._ended)
        for queue in self._alive.values():
            total.add(queue.counters())
        return total


class RdmaTransportCounters:
    """A target's NVMe/RDMA transport: a tally per rdma port, by the port's name, kept
    for the life of the target (a port removed and opened again counts on)."""

    def __init__(self) -> None:
        self._ports: dict[str, RdmaQueueTally] = {}

    def port(self, name: str) -> RdmaQueueTally:
        """The tally of the rdma port `name` (made the first time it is asked for)."""
        tally = self._ports.get(name)
        if tally is None:
            tally = self._ports[name] = RdmaQueueTally()
        return tally

    def ports(self) -> list[tuple[str, RdmaQueueTally]]:
        """Every port's tally, by name."""
        return sorted(self._ports.items())
