"""What `pynvmf top` shows, computed from two answers of `pynvmf_get_host_stats`: the
rows (one per subsystem, host and namespace) with their rates over the time between the
answers, latency percentiles from the histograms' differences, the order they are sorted
in, and the cells as text. No I/O and no terminal here (pynvmf/cli/top.py is the glue).

The answer's counts are totals since the target started and never go backwards, so a
rate is a difference over the difference of the target's own clock (`ticks`), not over
the time the client slept (`ticks` is the target's monotonic clock, which does not start
at the target's start: one answer alone gives no rate). A row missing from the earlier
answer (a host that sent its first command since) starts from zero; a count that went
down (a target started again, its clock not) counts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pynvmf.metrics.labels import label_value

# The NSIDs the answer uses for commands that name no namespace, or all of them; shown
# as the metrics endpoint labels them (docs/metrics.md).
NSID_NONE = 0
NSID_ALL = 0xFFFFFFFF
# What a cell holds where there is nothing to say (latency not tracked, no command).
NOTHING = "-"

HEADERS = ("SUBSYSTEM", "HOST", "NSID", "IOPS", "READ MB/s", "WRITE MB/s", "P50", "P99", "ERR/s")
# Sorting: the numeric columns largest first, the names in order.
SORT_KEYS = ("iops", "read", "write", "p50", "p99", "errors", "host", "subsystem", "nsid")
DEFAULT_SORT = "iops"
# The column (an index of HEADERS) each sort key sorts by.
SORT_COLUMN: Mapping[str, int] = {
    "subsystem": 0,
    "host": 1,
    "nsid": 2,
    "iops": 3,
    "read": 4,
    "write": 5,
    "p50": 6,
    "p99": 7,
    "errors": 8,
}
# The live view's keys: each chooses a sort key; q quits.
SORT_LETTERS: Mapping[str, str] = {
    "i": "iops",
    "r": "read",
    "w": "write",
    "5": "p50",
    "9": "p99",
    "e": "errors",
    "h": "host",
    "s": "subsystem",
    "n": "nsid",
}
QUIT_LETTERS = frozenset("qQ")
# The live view's key that switches between the namespaces' rows and the hosts' stages.
STAGES_LETTER = "t"


class StatsError(ValueError):
    """An answer that does not have the shape of pynvmf_get_host_stats."""


@dataclass(frozen=True)
class Histogram:
    """Per-bucket counts (not cumulative) over `bounds` (upper bounds in seconds), one
    more count than bounds: the last is +Inf's."""

    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The commands counted since `earlier` (a count that went down: none)."""
        if earlier is None or len(earlier.counts) != len(self.counts):
            return self
        return Histogram(
            tuple(max(0, a - b) for a, b in zip(self.counts, earlier.counts, strict=True))
        )

    def plus(self, other: Histogram) -> Histogram:
        if not self.counts:
            return other
        return Histogram(tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)))


def quantile(q: float, bounds: Sequence[float], histogram: Histogram) -> float | None:
    """The `q` quantile (0 < q < 1) in seconds, interpolated linearly within its bucket (as
    Prometheus's histogram_quantile does): the first bucket starts at 0; in the +Inf
    bucket, the largest finite bound. None: no commands."""
    total = histogram.total
    if total == 0 or not bounds:
        return None
    rank = q * total
    below = 0
    for i, count in enumerate(histogram.counts):
        if count and below + count >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    return bounds[-1]


@dataclass(frozen=True)
class NamespaceTotals:
    """One namespace of one host, as an answer gives it: totals since the target started."""

    subsystem: str
    host: str
    nsid: int
    connected: bool
    commands: int
    read_bytes: int
    write_bytes: int
    errors: int
    latency: Histogram | None  # every opcode's together; None: latency not tracked

    @property
    def key(self) -> tuple[str, str, int]:
        return self.subsystem, self.host, self.nsid


@dataclass(frozen=True)
class Snapshot:
    """One answer of pynvmf_get_host_stats."""

    seconds: float  # the target's clock (ticks / tick_rate)
    latency_tracking: bool
    bounds: tuple[float, ...]
    namespaces: Mapping[tuple[str, str, int], NamespaceTotals]
    # Each host's stage histograms by stage name, by (subsystem, host); none when latency
    # is not tracked.
    stages: Mapping[tuple[str, str], Mapping[str, Histogram]]
    connected: Mapping[tuple[str, str], bool]


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StatsError(f"{where}: {value!r} is not an integer")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StatsError(f"{where}: not an object")
    return value


def _histogram(value: Any, width: int, where: str) -> Histogram:
    buckets = _object(value, where).get("buckets")
    if not isinstance(buckets, list):
        raise StatsError(f"{where}: not a histogram")
    counts = tuple(_int(n, f"{where}.buckets") for n in buckets)
    if len(counts) != width:
        raise StatsError(f"{where}: {len(counts)} buckets, not {width}")
    return Histogram(counts)


def _namespace(
    ns: Any, subsystem: str, host: str, connected: bool, width: int | None, where: str
) -> NamespaceTotals:
    """A namespace's entry; `width`: the histograms' bucket count, None without latency."""
    ns = _object(ns, where)
    commands = _object(ns.get("commands", {}), f"{where}.commands")
    data = _object(ns.get("bytes", {}), f"{where}.bytes")
    latency: Histogram | None = None
    if width is not None:
        latency = Histogram((0,) * width)
        for opcode, histogram in _object(ns.get("latency", {}), f"{where}.latency").items():
            latency = latency.plus(_histogram(histogram, width, f"{where}.latency.{opcode}"))
    return NamespaceTotals(
        subsystem=subsystem,
        host=host,
        nsid=_int(ns.get("nsid"), f"{where}.nsid"),
        connected=connected,
        commands=sum(_int(v, f"{where}.commands") for v in commands.values()),
        read_bytes=_int(data.get("read", 0), f"{where}.bytes.read"),
        write_bytes=_int(data.get("write", 0), f"{where}.bytes.write"),
        errors=_int(ns.get("errors", 0), f"{where}.errors"),
        latency=latency,
    )


def snapshot(answer: Any) -> Snapshot:
    """An answer of pynvmf_get_host_stats, read (StatsError for one of another shape)."""
    answer = _object(answer, "the answer")
    tick_rate = _int(answer.get("tick_rate"), "tick_rate")
    if tick_rate <= 0:
        raise StatsError(f"tick_rate: {tick_rate}")
    tracking = answer.get("latency_tracking") is True
    bounds = answer.get("buckets", []) if tracking else []
    if not isinstance(bounds, list) or not all(
        isinstance(b, int | float) and not isinstance(b, bool) for b in bounds
    ):
        raise StatsError("buckets: not a list of numbers")
    width = len(bounds) + 1 if tracking else None
    hosts = answer.get("hosts")
    if not isinstance(hosts, list):
        raise StatsError("hosts: not a list")
    namespaces: dict[tuple[str, str, int], NamespaceTotals] = {}
    stages: dict[tuple[str, str], dict[str, Histogram]] = {}
    connected: dict[tuple[str, str], bool] = {}
    for h, entry in enumerate(hosts):
        entry = _object(entry, f"hosts[{h}]")
        subsystem, host = str(entry.get("subsystem", "")), str(entry.get("host", ""))
        connected[subsystem, host] = entry.get("connected") is True
        entries = entry.get("namespaces", [])
        if not isinstance(entries, list):
            raise StatsError(f"hosts[{h}].namespaces: not a list")
        for n, ns in enumerate(entries):
            where = f"hosts[{h}].namespaces[{n}]"
            totals = _namespace(ns, subsystem, host, connected[subsystem, host], width, where)
            namespaces[totals.key] = totals
        stages[subsystem, host] = {}  # without latency tracking: a row of "-"
        if width is not None:
            by_stage = _object(entry.get("stages", {}), f"hosts[{h}].stages")
            stages[subsystem, host] = {
                str(stage): _histogram(histogram, width, f"hosts[{h}].stages.{stage}")
                for stage, histogram in by_stage.items()
            }
    return Snapshot(
        seconds=_int(answer.get("ticks"), "ticks") / tick_rate,
        latency_tracking=tracking,
        bounds=tuple(float(b) for b in bounds),
        namespaces=namespaces,
        stages=stages,
        connected=connected,
    )


@dataclass(frozen=True)
class Row:
    """One line of the view: a namespace of a host, its rates over the interval."""

    subsystem: str
    host: str
    nsid: int
    connected: bool
    iops: float
    read_mbs: float  # MB/s: 10**6 bytes a second, as spdk_top and nvme top count
    write_mbs: float
    errors: float  # a second
    p50: float | None  # seconds; None: not tracked, or no command in the interval
    p99: float | None


def _since(now: int, then: int) -> int:
    return max(0, now - then)


def _nothing_yet(now: NamespaceTotals) -> NamespaceTotals:
    return NamespaceTotals(now.subsystem, now.host, now.nsid, False, 0, 0, 0, 0, None)


def rows(earlier: Snapshot, later: Snapshot) -> list[Row]:
    """The rows of `later`, with their rates since `earlier` (none if no time passed)."""
    elapsed = later.seconds - earlier.seconds
    per_second = 1 / elapsed if elapsed > 0 else 0.0
    result = []
    for key, now in later.namespaces.items():
        then = earlier.namespaces.get(key) or _nothing_yet(now)
        p50 = p99 = None
        if now.latency is not None:
            interval = now.latency.minus(then.latency)
            p50 = quantile(0.5, later.bounds, interval)
            p99 = quantile(0.99, later.bounds, interval)
        result.append(
            Row(
                subsystem=now.subsystem,
                host=now.host,
                nsid=now.nsid,
                connected=now.connected,
                iops=_since(now.commands, then.commands) * per_second,
                read_mbs=_since(now.read_bytes, then.read_bytes) * per_second / 1e6,
                write_mbs=_since(now.write_bytes, then.write_bytes) * per_second / 1e6,
                errors=_since(now.errors, then.errors) * per_second,
                p50=p50,
                p99=p99,
            )
        )
    return result


def _numeric(value: float | None) -> tuple[int, float]:
    # Largest first, rows without a value last.
    return (1, 0.0) if value is None else (0, -value)


_SORTS = {
    "iops": lambda r: _numeric(r.iops),
    "read": lambda r: _numeric(r.read_mbs),
    "write": lambda r: _numeric(r.write_mbs),
    "p50": lambda r: _numeric(r.p50),
    "p99": lambda r: _numeric(r.p99),
    "errors": lambda r: _numeric(r.errors),
    "host": lambda r: r.host,
    "subsystem": lambda r: r.subsystem,
    "nsid": lambda r: r.nsid,
}
assert set(_SORTS) == set(SORT_KEYS) == set(SORT_COLUMN)


def sort_rows(items: Iterable[Row], key: str) -> list[Row]:
    """`items` in the order of sort key `key` (one of SORT_KEYS); ties by subsystem, host
    and namespace, so the order holds still between refreshes."""
    if key not in _SORTS:
        raise ValueError(f"sort key {key!r} is not one of {', '.join(SORT_KEYS)}")
    ordered = sorted(items, key=lambda r: (r.subsystem, r.host, r.nsid))
    return sorted(ordered, key=_SORTS[key])


def nsid_text(nsid: int) -> str:
    if nsid == NSID_NONE:
        return "none"
    if nsid == NSID_ALL:
        return "all"
    return str(nsid)


_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6))


def latency_text(seconds: float | None) -> str:
    """A latency with its unit, three significant figures: 85.0us, 1.25ms, 2.00s."""
    if seconds is None or math.isnan(seconds):
        return NOTHING
    unit, scale = next(((u, s) for u, s in _UNITS if seconds >= s), _UNITS[-1])
    value = seconds / scale
    return f"{value:.3g}{unit}" if value >= 100 else f"{value:#.3g}{unit}"


def rate_text(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def cells(row: Row) -> tuple[str, ...]:
    """The row as the view shows it, in the order of HEADERS. A host chooses its NQN: the
    names are made printable and bounded (label_value, as for the metrics' labels), so no
    escape sequence reaches the terminal."""
    return (
        label_value(row.subsystem),
        label_value(row.host),
        nsid_text(row.nsid),
        rate_text(row.iops, 0),
        rate_text(row.read_mbs, 2),
        rate_text(row.write_mbs, 2),
        latency_text(row.p50),
        latency_text(row.p99),
        rate_text(row.errors, 1),
    )


# The columns whose cells are numbers, right-aligned.
NUMERIC_COLUMNS = frozenset(range(3, len(HEADERS)))


@dataclass(frozen=True)
class Table:
    """What a view shows, as text: the live view (rich) and the plain tables draw it."""

    headers: tuple[str, ...]
    lines: tuple[tuple[str, ...], ...]
    connected: tuple[bool, ...]  # per line: False dims it (a host gone)
    numeric: frozenset[int]  # right-aligned columns
    sorted_column: int | None  # the column the lines are sorted by, if one
    sorted_by: str  # the order, in words


def namespace_table(items: Iterable[Row], sort: str) -> Table:
    """The rows of hosts and namespaces, sorted by `sort` (one of SORT_KEYS)."""
    ordered = sort_rows(items, sort)
    return Table(
        headers=HEADERS,
        lines=tuple(cells(r) for r in ordered),
        connected=tuple(r.connected for r in ordered),
        numeric=NUMERIC_COLUMNS,
        sorted_column=SORT_COLUMN[sort],
        sorted_by=sort,
    )


# The stages of a command as pynvmf_get_host_stats names them, in the order a command
# passes them: received and parsed, waiting for its data (R2T), for a budget or QoS, on
# the device, sent.
STAGES = ("receive", "data", "budget", "device", "send")


def _slowest(values: Iterable[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def stage_table(earlier: Snapshot, later: Snapshot, sort: str) -> Table:
    """Where each host's time went in the interval: the 99th percentile of each stage
    (STAGES, then any other the answer names). Sorted by host or subsystem if `sort` says
    so, else by the slowest stage, slowest first."""
    names = [*STAGES, *sorted({n for h in later.stages.values() for n in h} - set(STAGES))]
    found = []
    for key, by_stage in later.stages.items():
        before = earlier.stages.get(key, {})
        p99 = tuple(
            quantile(0.99, later.bounds, by_stage[n].minus(before.get(n)))
            if n in by_stage
            else None
            for n in names
        )
        found.append((key, p99))
    found.sort(key=lambda item: item[0])
    if sort in ("host", "subsystem"):
        found.sort(key=lambda item: item[0][1] if sort == "host" else item[0][0])
    else:
        found.sort(key=lambda item: _numeric(_slowest(item[1])))
    by_name = sort in ("host", "subsystem")
    return Table(
        headers=_stage_headers(names),
        lines=tuple(
            (label_value(sub), label_value(host), *(latency_text(v) for v in p99))
            for (sub, host), p99 in found
        ),
        connected=tuple(later.connected.get(key, False) for key, _ in found),
        numeric=frozenset(range(2, 2 + len(names))),
        sorted_column=SORT_COLUMN[sort] if by_name else None,
        sorted_by=sort if by_name else "the slowest stage",
    )


def _stage_headers(names: Sequence[str]) -> tuple[str, ...]:
    return ("SUBSYSTEM", "HOST", *(f"{n.upper()} P99" for n in names))


def empty_view(stages: bool) -> Table:
    """The view's columns before a second answer gives rates."""
    headers = _stage_headers(STAGES) if stages else HEADERS
    numeric = frozenset(range(2, len(headers))) if stages else NUMERIC_COLUMNS
    return Table(headers, (), (), numeric, None, "")


def view(earlier: Snapshot, later: Snapshot, sort: str, stages: bool) -> Table:
    """What the view shows between two answers: the hosts' stages (`stages`), or their
    namespaces' rows."""
    if stages:
        return stage_table(earlier, later, sort)
    return namespace_table(rows(earlier, later), sort)


def plain_text(table: Table) -> str:
    """A table as plain text (--once, --iterations): columns two spaces apart, numbers
    right-aligned, a header line."""
    lines = [table.headers, *table.lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(table.headers))]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if i in table.numeric else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(line(values) for values in lines)


def plain_table(items: Sequence[Row]) -> str:
    """The rows, in their order, as plain text."""
    return plain_text(
        Table(
            headers=HEADERS,
            lines=tuple(cells(r) for r in items),
            connected=tuple(r.connected for r in items),
            numeric=NUMERIC_COLUMNS,
            sorted_column=None,
            sorted_by="",
        )
    )
