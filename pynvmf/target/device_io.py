"""The I/O each block device did for the hosts (SPDK's bdev_get_iostat), from the
per-host command counters (command_counts.py): nothing is counted per command for it.

The command counters are kept by subsystem, host and NSID, past the namespace (a
counter never goes backwards), so a device's share is what the counters of its
namespaces grew by while it backed them: the counts of (subsystem, NSID) are taken as a
baseline when the namespace is added, and what they grew by is kept for the device when
the namespace goes (after its commands drained). With `--cores N`, a worker's commands
reach the counters with its next report (every half second at most): those of a
namespace removed before that report are not its device's.

As SPDK's bdev layer counts, only successful operations count (a command's errors are
taken off its count), and only reads, writes, deallocations (unmap) and copies: Write
Zeroes, Compare, Flush and the others are not in SPDK's iostat.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.command_counts import (
    COPY_BYTES,
    READ_BYTES,
    WRITE_BYTES,
    CommandCounts,
    HostCounts,
)

_READ = int(IoOpcode.READ)
_WRITE = int(IoOpcode.WRITE)
_DSM = int(IoOpcode.DATASET_MANAGEMENT)
_COPY = int(IoOpcode.COPY)


_LATENCY_OPS: Final = (("read", _READ), ("write", _WRITE), ("unmap", _DSM), ("copy", _COPY))


@dataclass
class DeviceIo:
    """Successful operations, their bytes and their device time (SPDK's
    spdk_bdev_io_stat's, in its order; the times in ns, while latency tracking is on:
    each operation's sum, most and least, 0 for none)."""

    bytes_read: int = 0
    num_read_ops: int = 0
    bytes_written: int = 0
    num_write_ops: int = 0
    bytes_unmapped: int = 0
    num_unmap_ops: int = 0
    bytes_copied: int = 0
    num_copy_ops: int = 0
    read_latency_ticks: int = 0
    max_read_latency_ticks: int = 0
    min_read_latency_ticks: int = 0
    write_latency_ticks: int = 0
    max_write_latency_ticks: int = 0
    min_write_latency_ticks: int = 0
    unmap_latency_ticks: int = 0
    max_unmap_latency_ticks: int = 0
    min_unmap_latency_ticks: int = 0
    copy_latency_ticks: int = 0
    max_copy_latency_ticks: int = 0
    min_copy_latency_ticks: int = 0

    def add_host(self, nsid: int, host: HostCounts) -> None:
        """Add the commands of one host to namespace `nsid`."""
        per_ns = host.namespaces.get(nsid)
        if per_ns is None:
            return
        counts = per_ns.as_list()
        failed = {_READ: 0, _WRITE: 0, _DSM: 0, _COPY: 0}
        for (error_nsid, slot, _status), n in host.errors.items():
            if error_nsid == nsid and slot in failed:
                failed[slot] += n
        self.bytes_read += counts[READ_BYTES]
        self.num_read_ops += counts[_READ] - failed[_READ]
        self.bytes_written += counts[WRITE_BYTES]
        self.num_write_ops += counts[_WRITE] - failed[_WRITE]
        # A Dataset Management command counts as one unmap; no bytes (the command
        # counters keep no range lengths).
        self.num_unmap_ops += counts[_DSM] - failed[_DSM]
        self.bytes_copied += counts[COPY_BYTES]
        self.num_copy_ops += counts[_COPY] - failed[_COPY]
        for op, slot in _LATENCY_OPS:
            histogram = per_ns.latency.get(slot)
            if histogram is not None:
                self._add_time(op, histogram.device_total, histogram.device_max,
                               histogram.device_min)  # fmt: skip

    def _add_time(self, op: str, total: int, most: int, least: int) -> None:
        setattr(self, f"{op}_latency_ticks", getattr(self, f"{op}_latency_ticks") + total)
        if most > getattr(self, f"max_{op}_latency_ticks"):
            setattr(self, f"max_{op}_latency_ticks", most)
        now_least = getattr(self, f"min_{op}_latency_ticks")
        if least and (not now_least or least < now_least):
            setattr(self, f"min_{op}_latency_ticks", least)

    def plus(self, other: DeviceIo, sign: int = 1) -> DeviceIo:
        """The sums and counts added (sign 1) or taken off (-1, a baseline); the maxima
        and minima merged (or, taking off, kept: a baseline's extremes cannot be undone)."""
        io = DeviceIo(
            *(
                getattr(self, f.name) + sign * getattr(other, f.name)
                if not f.name.startswith(("max_", "min_"))
                else getattr(self, f.name)
                for f in fields(self)
            )
        )
        if sign > 0:
            for op, _slot in _LATENCY_OPS:
                io._add_time(
                    op, 0, getattr(other, f"max_{op}_latency_ticks"),
                    getattr(other, f"min_{op}_latency_ticks"),
                )  # fmt: skip
        return io


def namespace_io(counts: CommandCounts, nqn: str, nsid: int) -> DeviceIo:
    """Every host's commands to namespace `nsid` of subsystem `nqn`, as counted so far."""
    io = DeviceIo()
    for (subnqn, _hostnqn), host in counts.hosts.items():
        if subnqn == nqn:
            io.add_host(nsid, host)
    return io


class DeviceIoLedger:
    """What each block device's namespaces counted: the baselines of the namespaces
    there are, and what those that are gone counted, by device name."""

    def __init__(self, counts: CommandCounts) -> None:
        self.counts = counts
        self.baselines: dict[tuple[str, int], DeviceIo] = {}
        self.past: dict[str, DeviceIo] = {}

    def namespace_added(self, nqn: str, nsid: int) -> None:
        self.baselines[nqn, nsid] = namespace_io(self.counts, nqn, nsid)

    def namespace_gone(self, nqn: str, nsid: int, device_name: str) -> None:
        """Namespace `nsid` of `nqn`, on `device_name`, is gone and its commands done."""
        baseline = self.baselines.pop((nqn, nsid), DeviceIo())
        grown = namespace_io(self.counts, nqn, nsid).plus(baseline, -1)
        self.past[device_name] = self.past.get(device_name, DeviceIo()).plus(grown)

    def device_gone(self, name: str) -> None:
        """A removed device's counts go with it (as SPDK's do with its bdev)."""
        self.past.pop(name, None)

    def reset_extremes(self, name: str, namespaces: list[tuple[str, int]]) -> None:
        """Device `name`'s maxima and minima of device time start again (SPDK's
        bdev_get_iostat reset_mode "maxmin"), `namespaces` the (subsystem, NSID) it backs."""
        past = self.past.get(name)
        if past is not None:
            for op, _slot in _LATENCY_OPS:
                setattr(past, f"max_{op}_latency_ticks", 0)
                setattr(past, f"min_{op}_latency_ticks", 0)
        backed = set(namespaces)
        for (subnqn, _hostnqn), host in self.counts.hosts.items():
            for nsid, per_ns in host.namespaces.items():
                if (subnqn, nsid) in backed:
                    for histogram in per_ns.latency.values():
                        histogram.device_max = histogram.device_min = 0

    def of(self, name: str, namespaces: list[tuple[str, int]]) -> DeviceIo:
        """Device `name`'s counts, `namespaces` the (subsystem, NSID) it backs now."""
        io = self.past.get(name, DeviceIo())
        for nqn, nsid in namespaces:
            now = namespace_io(self.counts, nqn, nsid)
            io = io.plus(now).plus(self.baselines.get((nqn, nsid), DeviceIo()), -1)
        return io
