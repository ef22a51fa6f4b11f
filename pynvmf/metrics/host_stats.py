"""Per-host statistics of a target in one answer: what pynvmf_get_host_stats returns
(docs/metrics.md, "Per-host statistics"), built from the counts and histograms the
target keeps per subsystem and host (target/command_counts.py).

Counts are totals since the target started; a client computes rates from two answers
and their `ticks` (time.monotonic_ns() of the target when answered, in `tick_rate`
units a second).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pynvmf.metrics.labels import OPCODE_LABELS
from pynvmf.target.command_counts import (
    BUCKETS,
    COPY_BYTES,
    HISTOGRAM_LENGTH,
    OTHER_OPCODE,
    READ_BYTES,
    WRITE_BYTES,
    HostCounts,
)

if TYPE_CHECKING:
    from pynvmf.target.target import Target

TICK_RATE = 1_000_000_000


def histogram_json(histogram: list[int]) -> dict[str, Any]:
    """A histogram (command_counts's list) as {count, sum (seconds), buckets}: the
    per-bucket counts, not cumulative, the last one +Inf."""
    buckets = histogram[: HISTOGRAM_LENGTH - 1]
    return {
        "count": sum(buckets),
        "sum": histogram[HISTOGRAM_LENGTH - 1] / TICK_RATE,
        "buckets": buckets,
    }


def _namespaces(counts: HostCounts, tracking: bool) -> list[dict[str, Any]]:
    errors: dict[int, int] = {}
    for (nsid, _slot, _status), n in counts.errors.items():
        errors[nsid] = errors.get(nsid, 0) + n
    answer = []
    for nsid in sorted(counts.namespaces.keys() | errors.keys()):
        per_ns = counts.namespace(nsid)
        slots = per_ns.as_list()
        commands: dict[str, int] = {}
        for slot in range(OTHER_OPCODE + 1):
            if slots[slot]:
                label = OPCODE_LABELS[slot]
                commands[label] = commands.get(label, 0) + slots[slot]
        entry: dict[str, Any] = {
            "nsid": nsid,
            "commands": commands,
            "bytes": {
                "read": slots[READ_BYTES],
                "write": slots[WRITE_BYTES],
                "copy": slots[COPY_BYTES],
            },
            "errors": errors.get(nsid, 0),
        }
        if tracking:
            latency: dict[str, list[int]] = {}
            for slot, histogram in per_ns.latency.items():
                # Opcodes from 20h up share a slot, and some below share the label "other".
                into = latency.setdefault(OPCODE_LABELS[slot], [0] * HISTOGRAM_LENGTH)
                for i, n in enumerate(histogram.as_list()):
                    into[i] += n
            entry["latency"] = {label: histogram_json(h) for label, h in latency.items() if any(h)}
        answer.append(entry)
    return answer


def host_stats(target: Target, subnqn: str | None = None) -> dict[str, Any]:
    """pynvmf_get_host_stats's answer: every host's (or `subnqn`'s hosts') statistics."""
    tracking = target.command_counts.tracking
    connected = {
        (sub.nqn, ctrl.hostnqn)
        for sub in target.subsystems.values()
        for ctrl in sub.controllers.values()
    }
    hosts = []
    for (sub, host), counts in target.command_counts.hosts.items():
        if subnqn is not None and sub != subnqn:
            continue
        entry: dict[str, Any] = {
            "subsystem": sub,
            "host": host,
            "connected": (sub, host) in connected,
            "namespaces": _namespaces(counts, tracking),
        }
        if tracking:
            entry["stages"] = {
                stage: histogram_json(histogram.as_list())
                for stage, histogram in counts.stages.items()
            }
        hosts.append(entry)
    return {
        "tick_rate": TICK_RATE,
        "ticks": time.monotonic_ns(),
        "latency_tracking": tracking,
        "buckets": list(BUCKETS),
        "hosts": hosts,
    }
