"""Completed I/O commands counted per subsystem, host, namespace and opcode: what the
metrics endpoint exposes as pynvmf_commands_total, pynvmf_command_bytes_total and
pynvmf_command_errors_total (docs/metrics.md).

This is counted on every command's path, so a namespace's counts for one host are one
object (NamespaceCounts): Read, Write and Copy, the hot path's commands, and their bytes
as int fields, which the compiled build (this module is among setup.py's) adds to natively,
with no allocation; any other opcode's commands in a flat list indexed by opcode. A
command costs a dictionary look-up by NSID and an add or two, no object and no tuple.
Errors are rare, and counted in a dictionary by (NSID, opcode slot, status).

The SMART / Health log's counts of a subsystem (IoStats) are here for the same reason:
the hot path adds to them, and an interpreted class's attributes cost the compiled
hot path a generic attribute look-up and a boxed add each (1,487 instructions a 4 KiB
Read, measured with benchmarks/instructions.py).

The counts of a host live in the process's CommandCounts, keyed by the subsystem's and
the host's NQNs, not in the controller or the Subsystem object: a controller that goes
away, or a subsystem deleted and created again with its NQN, leaves them where they
were, so a counter never goes backwards. A worker process of `--cores N` keeps its own
and reports them as differences (`take`), which the main process adds (`add`).

Bounded: NSID keys are namespaces that exist when the command arrives (anything else
is NO_NAMESPACE, or NSID_ALL), opcodes from 20h up share one slot, statuses are the
ones the target's code returns, and at most `max_hosts` (subsystem, host) pairs are
kept apart: the others are counted in (subsystem, OTHER_HOST).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pynvmf.spec.opcodes import IoOpcode

OPCODE_SLOTS: Final = 32  # the NVM command set's opcodes are all below 20h
OTHER_OPCODE: Final = 32  # the slot of every opcode from 20h up
READ_BYTES: Final = 33  # data sent to the host (Read)
WRITE_BYTES: Final = 34  # data received from the host (Write)
COPY_BYTES: Final = 35  # data copied within the target (Copy)
SLOTS: Final = 36
NO_NAMESPACE: Final = 0  # the key of a command whose NSID names no namespace
STATUS_MASK: Final = 0x7FF  # SCT and SC: without More and Do Not Retry
OTHER_HOST: Final = "_other"
MAX_HOSTS: Final = 1024

_READ: Final = int(IoOpcode.READ)
_WRITE: Final = int(IoOpcode.WRITE)
_COPY: Final = int(IoOpcode.COPY)

# Latency histograms' bucket upper bounds: 10 us to 10 s, 1-2.5-5 a decade (+Inf implied).
BUCKETS: Final[tuple[float, ...]] = (
    *(m * 10.0**e for e in range(-5, 1) for m in (1.0, 2.5, 5.0)),
    10.0,
)
BUCKETS_NS: Final[list[int]] = [round(b * 1e9) for b in BUCKETS]
# A histogram as a list: its per-bucket counts (len(BUCKETS) + 1, the last +Inf), then the
# sum of its samples in ns.
HISTOGRAM_LENGTH: Final = len(BUCKETS) + 2
# In a worker's report, a histogram's list goes on with its commands' device time: the
# sum, the most and the least (0: none) in ns (Histogram.device).
REPORT_LENGTH: Final = HISTOGRAM_LENGTH + 3
# Where a command's time goes (docs/metrics.md); a host's histograms of each.
STAGES: Final = ("receive", "data", "budget", "device", "send")

# Histograms of a worker's report: {nsid: {opcode slot: histogram}} and {stage: histogram}.
Latency = dict[int, dict[int, list[int]]]
Stages = dict[str, list[int]]
# A report of a worker: (subsystem NQN, host NQN, {nsid: counts}, {(nsid, slot, status): n},
# latency, stages)
Report = list[
    tuple[str, str, dict[int, list[int]], dict[tuple[int, int, int], int], Latency, Stages]
]


_HISTOGRAM_FIELDS: Final = (*(f"b{i}" for i in range(len(BUCKETS) + 1)), "total")


class Histogram:
    """A latency histogram: samples in ns counted by BUCKETS (b0 to b19, the last +Inf)
    and summed. Its fields are ints, not a list, and `observe` finds the bucket with a
    tree of comparisons against literals: compiled, a sample is a few native compares
    and two native adds, with no boxed int stored and no call (a list of counts boxes
    every count it stores, and `bisect` is a generic call). tests/unit/test_command_counts.py
    checks the tree against BUCKETS_NS. As a list (`as_list`): the 20 counts, then the sum."""

    __slots__ = (
        "b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9",
        "b10", "b11", "b12", "b13", "b14", "b15", "b16", "b17", "b18", "b19",
        "device_max", "device_min", "device_total", "total",
    )  # fmt: skip

    def __init__(self) -> None:
        self.b0 = self.b1 = self.b2 = self.b3 = self.b4 = self.b5 = self.b6 = 0
        self.b7 = self.b8 = self.b9 = self.b10 = self.b11 = self.b12 = self.b13 = 0
        self.b14 = self.b15 = self.b16 = self.b17 = self.b18 = self.b19 = 0
        self.total = 0  # the samples' sum, ns
        # A latency histogram's successful commands' device time (`device`), as SPDK's
        # bdev_get_iostat reports a bdev's: sum, most and least (0: none yet), ns.
        self.device_total = self.device_max = self.device_min = 0

    def device(self, ns: int, n: int = 1) -> None:
        """`n` successful commands of this histogram spent `ns` each on the device."""
        self.device_total += ns * n
        if ns > self.device_max:
            self.device_max = ns
        if ns < self.device_min or not self.device_min:
            self.device_min = ns

    def observe(self, ns: int, n: int = 1) -> None:
        """Count `n` samples of `ns` nanoseconds: in the first bucket whose bound is >= ns."""
        self.total += ns * n
        if ns <= 1_000_000:
            if ns <= 50_000:
                if ns <= 10_000:
                    self.b0 += n
                elif ns <= 25_000:
                    self.b1 += n
                else:
                    self.b2 += n
            elif ns <= 250_000:
                if ns <= 100_000:
                    self.b3 += n
                else:
                    self.b4 += n
            elif ns <= 500_000:
                self.b5 += n
            else:
                self.b6 += n
        elif ns <= 50_000_000:
            if ns <= 5_000_000:
                if ns <= 2_500_000:
                    self.b7 += n
                else:
                    self.b8 += n
            elif ns <= 10_000_000:
                self.b9 += n
            elif ns <= 25_000_000:
                self.b10 += n
            else:
                self.b11 += n
        elif ns <= 1_000_000_000:
            if ns <= 250_000_000:
                if ns <= 100_000_000:
                    self.b12 += n
                else:
                    self.b13 += n
            elif ns <= 500_000_000:
                self.b14 += n
            else:
                self.b15 += n
        elif ns <= 2_500_000_000:
            self.b16 += n
        elif ns <= 5_000_000_000:
            self.b17 += n
        elif ns <= 10_000_000_000:
            self.b18 += n
        else:
            self.b19 += n

    def as_list(self) -> list[int]:
        return [getattr(self, name) for name in _HISTOGRAM_FIELDS]

    def count(self) -> int:
        return sum(self.as_list()[: HISTOGRAM_LENGTH - 1])

    def take(self) -> list[int]:
        """`as_list` and the device time (REPORT_LENGTH ints, a worker's report), and
        zero from now on (in place: a request whose completion is on its way to the
        socket holds its histogram)."""
        taken = [*self.as_list(), self.device_total, self.device_max, self.device_min]
        for name in _HISTOGRAM_FIELDS:
            setattr(self, name, 0)
        self.device_total = self.device_max = self.device_min = 0
        return taken

    def add(self, histogram: list[int]) -> None:
        """Add `take`'s counts (a worker's report)."""
        for name, n in zip(_HISTOGRAM_FIELDS, histogram, strict=False):
            setattr(self, name, getattr(self, name) + n)
        self.device_total += histogram[HISTOGRAM_LENGTH]
        self.device_max = max(self.device_max, histogram[HISTOGRAM_LENGTH + 1])
        least = histogram[HISTOGRAM_LENGTH + 2]
        if least and (least < self.device_min or not self.device_min):
            self.device_min = least


def _is_histogram(histogram: object) -> bool:
    return (
        isinstance(histogram, list)
        and len(histogram) == REPORT_LENGTH
        and all(isinstance(n, int) and n >= 0 for n in histogram)
    )


def opcode_slot(opcode: int) -> int:
    return opcode if opcode < OPCODE_SLOTS else OTHER_OPCODE


class NamespaceCounts:
    """One host's commands to one namespace. As a list (`as_list`, a worker's report):
    commands by opcode slot, then read, write and copy bytes (SLOTS ints)."""

    __slots__ = (
        "copies",
        "copy_bytes",
        "latency",
        "opcodes",
        "read_bytes",
        "reads",
        "write_bytes",
        "writes",
    )

    def __init__(self) -> None:
        self.reads = 0
        self.read_bytes = 0  # data sent to the host by Read
        self.writes = 0
        self.write_bytes = 0  # data received from the host by Write
        self.copies = 0
        self.copy_bytes = 0  # data copied within the target by Copy
        # Commands of the other opcodes, by opcode slot.
        self.opcodes: list[int] = [0] * (OTHER_OPCODE + 1)
        # Latency histograms by opcode slot, while latency tracking is on (never
        # replaced: a command on its way to the socket holds its histogram).
        self.latency: dict[int, Histogram] = {}

    def latency_of(self, slot: int) -> Histogram:
        histogram = self.latency.get(slot)
        if histogram is None:
            histogram = self.latency[slot] = Histogram()
        return histogram

    def command(self, slot: int, status: int, length: int) -> None:
        """A command of opcode slot `slot` completed with `status`, `length` the bytes
        of its data (counted for a successful Read or Write)."""
        if slot == _READ:
            self.reads += 1
            if not status:
                self.read_bytes += length
        elif slot == _WRITE:
            self.writes += 1
            if not status:
                self.write_bytes += length
        elif slot == _COPY:
            self.copies += 1
        else:
            self.opcodes[slot] += 1

    def as_list(self) -> list[int]:
        counts = self.opcodes[:]
        counts[_READ] = self.reads
        counts[_WRITE] = self.writes
        counts[_COPY] = self.copies
        counts += [self.read_bytes, self.write_bytes, self.copy_bytes]
        return counts

    def take(self) -> list[int]:
        """`as_list`, and zero from now on."""
        counts = self.as_list()
        self.reads = self.read_bytes = self.writes = self.write_bytes = 0
        self.copies = self.copy_bytes = 0
        self.opcodes = [0] * (OTHER_OPCODE + 1)
        return counts

    def add(self, counts: list[int]) -> None:
        """Add `as_list`'s counts (a worker's)."""
        opcodes = self.opcodes
        for slot in range(OTHER_OPCODE + 1):
            if slot != _READ and slot != _WRITE and slot != _COPY:
                opcodes[slot] += counts[slot]
        self.reads += counts[_READ]
        self.writes += counts[_WRITE]
        self.copies += counts[_COPY]
        self.read_bytes += counts[READ_BYTES]
        self.write_bytes += counts[WRITE_BYTES]
        self.copy_bytes += counts[COPY_BYTES]


class HostCounts:
    """One host's counts in one subsystem, and its commands' stage histograms."""

    __slots__ = ("budget", "data", "device", "errors", "namespaces", "receive", "send")

    def __init__(self) -> None:
        # IoHandler adds to these in place (a namespace's object is never replaced).
        self.namespaces: dict[int, NamespaceCounts] = {}
        self.errors: dict[tuple[int, int, int], int] = {}
        # Where its timed commands' time went (STAGES): fields, not looked up by name.
        self.receive = Histogram()
        self.data = Histogram()
        self.budget = Histogram()
        self.device = Histogram()
        self.send = Histogram()

    @property
    def stages(self) -> dict[str, Histogram]:
        """The stage histograms by name, in STAGES's order."""
        return {
            "receive": self.receive,
            "data": self.data,
            "budget": self.budget,
            "device": self.device,
            "send": self.send,
        }

    def namespace(self, nsid: int) -> NamespaceCounts:
        counts = self.namespaces.get(nsid)
        if counts is None:
            counts = self.namespaces[nsid] = NamespaceCounts()
        return counts

    def error(self, nsid: int, slot: int, status: int) -> None:
        key = (nsid, slot, status & STATUS_MASK)
        self.errors[key] = self.errors.get(key, 0) + 1

    def take(
        self,
    ) -> tuple[dict[int, list[int]], dict[tuple[int, int, int], int], Latency, Stages]:
        """The counts and histograms so far (the namespaces and stages with any), and
        zero from now on, in place."""
        namespaces = {}
        latency: Latency = {}
        for nsid, counts in self.namespaces.items():
            taken = counts.take()
            if any(taken):
                namespaces[nsid] = taken
            histograms = {}
            for slot, histogram in counts.latency.items():
                taken_histogram = histogram.take()
                if any(taken_histogram):
                    histograms[slot] = taken_histogram
            if histograms:
                latency[nsid] = histograms
        errors = dict(self.errors)
        self.errors.clear()
        stages: Stages = {}
        for stage, histogram in self.stages.items():
            taken_histogram = histogram.take()
            if any(taken_histogram):
                stages[stage] = taken_histogram
        return namespaces, errors, latency, stages

    def add(
        self,
        namespaces: dict[int, list[int]],
        errors: dict[tuple[int, int, int], int],
        latency: Latency,
        stages: Stages,
    ) -> None:
        for nsid, counts in namespaces.items():
            self.namespace(nsid).add(counts)
        for key, n in errors.items():
            self.errors[key] = self.errors.get(key, 0) + n
        for nsid, histograms in latency.items():
            ns_counts = self.namespace(nsid)
            for slot, histogram in histograms.items():
                ns_counts.latency_of(slot).add(histogram)
        stage_histograms = self.stages
        for stage, histogram in stages.items():
            stage_histograms[stage].add(histogram)


def _check(namespaces: object, errors: object, latency: object, stages: object) -> None:
    """A worker's report refused (ValueError) unless it is counts that only grow."""
    if (
        not isinstance(namespaces, dict)
        or not isinstance(errors, dict)
        or not isinstance(latency, dict)
        or not isinstance(stages, dict)
    ):
        raise ValueError("not counts of commands")
    for nsid, histograms in latency.items():
        if (
            not isinstance(nsid, int)
            or not isinstance(histograms, dict)
            or not all(
                isinstance(slot, int) and 0 <= slot <= OTHER_OPCODE and _is_histogram(h)
                for slot, h in histograms.items()
            )
        ):
            raise ValueError(f"not latency histograms of namespace {nsid!r}")
    for stage, histogram in stages.items():
        if stage not in STAGES or not _is_histogram(histogram):
            raise ValueError(f"not a histogram of stage {stage!r}")
    for nsid, counts in namespaces.items():
        if (
            not isinstance(nsid, int)
            or not isinstance(counts, list)
            or len(counts) != SLOTS
            or not all(isinstance(n, int) and n >= 0 for n in counts)
        ):
            raise ValueError(f"not counts of commands of namespace {nsid!r}")
    for key, n in errors.items():
        if (
            not isinstance(key, tuple)
            or len(key) != 3
            or not all(isinstance(k, int) for k in key)
            or not 0 <= key[1] <= OTHER_OPCODE
            or not isinstance(n, int)
            or n < 0
        ):
            raise ValueError(f"not a count of errors: {key!r}: {n!r}")


class CommandCounts:
    """The counts of one process, by (subsystem NQN, host NQN)."""

    def __init__(self, max_hosts: int = MAX_HOSTS) -> None:
        self.max_hosts = max_hosts
        self.hosts: dict[tuple[str, str], HostCounts] = {}
        # Whether the connections time their commands (target/protocol.py reads it at
        # each batch of input): latency and stage histograms.
        self.tracking = False

    def set_tracking(self, enable: bool) -> None:
        """Time every host's commands (latency histograms) from now on, or stop."""
        self.tracking = enable

    def of(self, subnqn: str, hostnqn: str) -> HostCounts:
        """Where the commands of `hostnqn` to `subnqn` are counted (kept for ever)."""
        hosts = self.hosts
        counts = hosts.get((subnqn, hostnqn))
        if counts is None:
            if len(hosts) >= self.max_hosts:
                hostnqn = OTHER_HOST
                counts = hosts.get((subnqn, hostnqn))
            if counts is None:
                counts = hosts[subnqn, hostnqn] = HostCounts()
        return counts

    def take(self) -> Report:
        """Every host's counts since the last take, for a worker's report."""
        report: Report = []
        for (subnqn, hostnqn), counts in self.hosts.items():
            namespaces, errors, latency, stages = counts.take()
            if namespaces or errors or latency or stages:
                report.append((subnqn, hostnqn, namespaces, errors, latency, stages))
        return report

    def add(self, report: Report) -> None:
        """Add a worker's report (`take`'s). ValueError, having added nothing, if it is
        not counts that only grow."""
        for entry in report:
            if (
                not isinstance(entry, tuple)
                or len(entry) != 6
                or not isinstance(entry[0], str)
                or not isinstance(entry[1], str)
            ):
                raise ValueError(f"not counts of commands: {entry!r}")
            _check(entry[2], entry[3], entry[4], entry[5])
        for subnqn, hostnqn, namespaces, errors, latency, stages in report:
            self.of(subnqn, hostnqn).add(namespaces, errors, latency, stages)


@dataclass
class IoStats:
    """Counters for the SMART / Health log, of one Subsystem object (a subsystem removed
    and created again with its NQN starts from zero)."""

    read_cmds: int = 0
    write_cmds: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    copy_cmds: int = 0
    copy_bytes: int = 0

    def take(self) -> tuple[int, int, int, int, int, int]:
        """The counts so far, in field order, and zero from now on: what a worker
        process reports of its replica of a subsystem, so that it keeps no baseline."""
        counts = (
            self.read_cmds,
            self.write_cmds,
            self.read_bytes,
            self.write_bytes,
            self.copy_cmds,
            self.copy_bytes,
        )
        self.read_cmds = self.write_cmds = self.read_bytes = self.write_bytes = 0
        self.copy_cmds = self.copy_bytes = 0
        return counts

    def add(self, counts: tuple[int, ...]) -> None:
        """Add counts in `take`'s order (a worker's report). Counts that would make a
        counter negative are refused (ValueError): the counters only grow."""
        if len(counts) != 6 or min(counts) < 0:
            raise ValueError(f"not counts of I/O: {counts!r}")
        rc, wc, rb, wb, cc, cb = counts
        self.read_cmds += rc
        self.write_cmds += wc
        self.read_bytes += rb
        self.write_bytes += wb
        self.copy_cmds += cc
        self.copy_bytes += cb
