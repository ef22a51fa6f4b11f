"""The target's state as Prometheus metric families, read when a scrape asks.

Nothing here runs per command: every figure is a count or a table the target keeps (the
SMART log's I/O counts, the connection budget, the TLS decisions, the ANA groups, the
commands counted per host, namespace and opcode: target/command_counts.py), read and
summed at scrape time. `collect()` reads mutable objects of the target
(dictionaries of controllers, ports), so it runs on the target's event loop, between
two callbacks: a scrape then sees one state, never half a change (MetricsEndpoint calls
it there).

Each family comes from one function in SOURCES, a table, so that a new kind of figure
(per-host per-opcode counters, latency histograms) is a new function beside these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pynvmf.metrics.labels import DEFAULT_HOST_LIMIT, OPCODE_LABELS, BoundedLabels, label_value
from pynvmf.spec.opcodes import NSID_ALL
from pynvmf.spec.status import Status
from pynvmf.target import ana
from pynvmf.target.command_counts import (
    BUCKETS,
    COPY_BYTES,
    HISTOGRAM_LENGTH,
    NO_NAMESPACE,
    OTHER_OPCODE,
    READ_BYTES,
    WRITE_BYTES,
)

if TYPE_CHECKING:
    from pynvmf.target.target import Target

# kTLS fallback reasons come from the kernel's answers: a handful, but not ours to bound.
FALLBACK_REASON_LIMIT = 32
_DIRECTIONS = (("read", READ_BYTES), ("write", WRITE_BYTES), ("copy", COPY_BYTES))


@dataclass
class Scrape:
    """What the sources of one scrape share: the target and the bounded labels."""

    target: Target
    hosts: BoundedLabels
    fallback_reasons: BoundedLabels
    # Hosts of the command counters: every host that ever sent a command (connected or
    # not), kept apart from `hosts` (those connected now) so that neither set moves the
    # other's places.
    command_hosts: BoundedLabels


def _connections(s: Scrape) -> Iterator[Metric]:
    target = s.target
    per_queue: Counter[tuple[str, str]] = Counter()
    for subsystem in [target.discovery, *target.subsystems.values()]:
        for ctrl in subsystem.controllers.values():
            host = label_value(ctrl.hostnqn)
            for queue in ctrl.queues.values():
                per_queue[str(queue.port), host] += 1
    labels = s.hosts.assign(host for _port, host in per_queue)
    folded: Counter[tuple[str, str]] = Counter()
    for (port, host), n in per_queue.items():
        folded[port, labels[host]] += n
    g = GaugeMetricFamily(
        "pynvmf_connections",
        "NVMe/TCP connections bound to a controller (one per queue), by port and host NQN",
        labels=["port", "host"],
    )
    for (port, host), n in sorted(folded.items()):
        g.add_metric([port, host], n)
    yield g
    yield GaugeMetricFamily(
        "pynvmf_metrics_hosts_folded",
        'Host NQNs beyond the label limit, counted in host="_other" series',
        value=s.hosts.folded,
    )
    budget = target.connection_budget
    yield GaugeMetricFamily(
        "pynvmf_tcp_connections",
        "TCP connections the target holds, bound to a controller or not yet",
        value=budget.total,
    )
    yield CounterMetricFamily(
        "pynvmf_connections_refused",
        "Connections refused by the connection limits (in all, per address)",
        value=budget.refused,
    )


def _controllers_and_queues(s: Scrape) -> Iterator[Metric]:
    target = s.target
    controllers = GaugeMetricFamily(
        "pynvmf_controllers", "Controllers, by subsystem", labels=["subsystem"]
    )
    queues = GaugeMetricFamily(
        "pynvmf_queues", "Queues of the controllers, by subsystem", labels=["subsystem", "type"]
    )
    for subsystem in [target.discovery, *target.subsystems.values()]:
        nqn = label_value(subsystem.nqn)
        controllers.add_metric([nqn], len(subsystem.controllers))
        admin, io = subsystem.queue_counts()
        queues.add_metric([nqn, "admin"], admin)
        queues.add_metric([nqn, "io"], io)
    yield controllers
    yield queues
    created = CounterMetricFamily(
        "pynvmf_queues_created",
        "Queues connected since the target started",
        labels=["type"],
    )
    created.add_metric(["admin"], target.counters.admin_queues)
    created.add_metric(["io"], target.counters.io_queues)
    yield created
    yield CounterMetricFamily(
        "pynvmf_keep_alive_expiries",
        "Controllers torn down because their host sent nothing within the keep-alive timeout",
        value=target.counters.keep_alive_expiries,
    )


def _io(s: Scrape) -> Iterator[Metric]:
    commands = CounterMetricFamily(
        "pynvmf_subsystem_commands",
        "I/O commands counted for the SMART / Health log, by subsystem (read includes "
        "Compare's reads, write Compare and Write's writes)",
        labels=["subsystem", "opcode"],
    )
    data = CounterMetricFamily(
        "pynvmf_subsystem_bytes",
        "Bytes of those commands, by subsystem (copy: bytes copied within the target)",
        labels=["subsystem", "direction"],
    )
    namespaces = GaugeMetricFamily(
        "pynvmf_namespaces", "Namespaces, by subsystem", labels=["subsystem"]
    )
    for subsystem in s.target.subsystems.values():
        nqn = label_value(subsystem.nqn)
        stats = subsystem.stats
        commands.add_metric([nqn, "read"], stats.read_cmds)
        commands.add_metric([nqn, "write"], stats.write_cmds)
        commands.add_metric([nqn, "copy"], stats.copy_cmds)
        data.add_metric([nqn, "read"], stats.read_bytes)
        data.add_metric([nqn, "write"], stats.write_bytes)
        data.add_metric([nqn, "copy"], stats.copy_bytes)
        namespaces.add_metric([nqn], len(subsystem.namespaces))
    yield commands
    yield data
    yield namespaces


def _nsid_label(nsid: int) -> str:
    if nsid == NO_NAMESPACE:
        return "none"
    if nsid == NSID_ALL:
        return "all"
    return str(nsid)


def _status_label(status: int) -> str:
    try:
        return Status(status).name.lower()
    except ValueError:
        return f"0x{status:03x}"


def _counter(
    name: str, documentation: str, labels: list[str], counts: Counter[tuple[str, ...]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key), n)
    return family


def _commands(s: Scrape) -> Iterator[Metric]:
    hosts = s.target.command_counts.hosts
    labels = s.command_hosts.assign(label_value(host) for _sub, host in hosts)
    commands: Counter[tuple[str, ...]] = Counter()
    data: Counter[tuple[str, ...]] = Counter()
    errors: Counter[tuple[str, ...]] = Counter()
    for (subnqn, hostnqn), counts in hosts.items():
        sub = label_value(subnqn)
        host = labels[label_value(hostnqn)]
        for nsid, per_ns in counts.namespaces.items():
            ns = _nsid_label(nsid)
            slots = per_ns.as_list()
            for slot in range(OTHER_OPCODE + 1):
                if slots[slot]:
                    commands[sub, ns, host, OPCODE_LABELS[slot]] += slots[slot]
            for direction, slot in _DIRECTIONS:
                if slots[slot]:
                    data[sub, ns, host, direction] += slots[slot]
        for (nsid, slot, status), n in counts.errors.items():
            key = (sub, _nsid_label(nsid), host, OPCODE_LABELS[slot], _status_label(status))
            errors[key] += n
    yield _counter(
        "pynvmf_commands",
        "Completed I/O commands (successful or not), by subsystem, namespace, host and opcode",
        ["subsystem", "nsid", "host", "opcode"],
        commands,
    )
    yield _counter(
        "pynvmf_command_bytes",
        "Data of successful commands: read (sent to the host by Read), write (received by "
        "Write), copy (copied within the target by Copy)",
        ["subsystem", "nsid", "host", "direction"],
        data,
    )
    yield _counter(
        "pynvmf_command_errors",
        "I/O commands completed with an error status, by opcode and status",
        ["subsystem", "nsid", "host", "opcode", "status"],
        errors,
    )
    yield GaugeMetricFamily(
        "pynvmf_metrics_command_hosts_folded",
        'Host NQNs of the command counters beyond the label limit, counted in host="_other"',
        value=s.command_hosts.folded,
    )


def _histogram(
    name: str, documentation: str, labels: list[str], histograms: dict[tuple[str, ...], list[int]]
) -> HistogramMetricFamily:
    """A family of histograms kept as command_counts's lists (per-bucket counts, then the
    sum in ns), given cumulative as Prometheus has them."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    bounds = [repr(b) for b in BUCKETS] + ["+Inf"]
    for key, histogram in sorted(histograms.items()):
        buckets = []
        total = 0
        for bound, n in zip(bounds, histogram[: HISTOGRAM_LENGTH - 1], strict=True):
            total += n
            buckets.append((bound, total))
        family.add_metric(list(key), buckets, histogram[HISTOGRAM_LENGTH - 1] / 1e9)
    return family


def _add_into(into: dict[tuple[str, ...], list[int]], key: tuple[str, ...], h: list[int]) -> None:
    sums = into.setdefault(key, [0] * HISTOGRAM_LENGTH)
    for i, n in enumerate(h):
        sums[i] += n


def _latency(s: Scrape) -> Iterator[Metric]:
    """Latency and stage histograms: only while latency tracking is on (or some were
    kept from when it was); summed over hosts, to keep the label sets few."""
    latency: dict[tuple[str, ...], list[int]] = {}
    stages: dict[tuple[str, ...], list[int]] = {}
    for (subnqn, _hostnqn), counts in s.target.command_counts.hosts.items():
        sub = label_value(subnqn)
        for nsid, per_ns in counts.namespaces.items():
            for slot, histogram in per_ns.latency.items():
                _add_into(
                    latency, (sub, _nsid_label(nsid), OPCODE_LABELS[slot]), histogram.as_list()
                )
        for stage, histogram in counts.stages.items():
            as_list = histogram.as_list()
            if any(as_list):
                _add_into(stages, (stage,), as_list)
    if not latency and not stages:
        return
    yield _histogram(
        "pynvmf_command_latency_seconds",
        "I/O commands' time from capsule-in to completion sent, by subsystem, namespace and opcode",
        ["subsystem", "nsid", "opcode"],
        latency,
    )
    yield _histogram(
        "pynvmf_command_stage_seconds",
        "Where I/O commands' time goes, by stage (docs/metrics.md)",
        ["stage"],
        stages,
    )


def _ana(s: Scrape) -> Iterator[Metric]:
    target = s.target
    state = GaugeMetricFamily(
        "pynvmf_ana_state",
        "1 for the ANA state each group of a subsystem is in on each listener, 0 for the others",
        labels=["subsystem", "group", "listener", "state"],
    )
    changes = CounterMetricFamily(
        "pynvmf_ana_changes",
        "Changes of a subsystem's ANA log (state transitions, groups gaining namespaces)",
        labels=["subsystem"],
    )
    for nqn, subsystem in target.subsystems.items():
        label = label_value(nqn)
        listeners = [p for p in target.ports if not p.discovery_only and p.exposes(nqn)]
        for grpid, group in sorted(subsystem.ana.groups.items()):
            for port in listeners:
                now = group.state_on(port)
                for anastate, name in ana.NAMES.items():
                    state.add_metric(
                        [label, str(grpid), str(port), name], 1 if anastate == now else 0
                    )
        changes.add_metric([label], subsystem.ana.chgcnt)
    yield state
    yield changes


def _tls(s: Scrape) -> Iterator[Metric]:
    tls = s.target.tls_counters
    yield CounterMetricFamily(
        "pynvmf_tls_handshakes", "TLS handshakes completed", value=tls.handshakes
    )
    yield CounterMetricFamily(
        "pynvmf_tls_handshake_failures",
        "TLS handshakes that failed, and plain connections refused on a port requiring TLS",
        value=tls.handshake_failures,
    )
    layer = CounterMetricFamily(
        "pynvmf_tls_record_layers",
        "Where a TLS connection's records were processed, per direction: kernel (kTLS) or "
        "user space",
        labels=["direction", "layer"],
    )
    layer.add_metric(["tx", "kernel"], tls.ktls_tx)
    layer.add_metric(["rx", "kernel"], tls.ktls_rx)
    layer.add_metric(["tx", "user"], tls.user_tx)
    layer.add_metric(["rx", "user"], tls.user_rx)
    yield layer
    reasons = {label_value(r): n for r, n in tls.fallback_reasons.items()}
    labels = s.fallback_reasons.assign(reasons)
    folded: Counter[str] = Counter()
    for reason, n in reasons.items():
        folded[labels[reason]] += n
    fallbacks = CounterMetricFamily(
        "pynvmf_tls_ktls_fallbacks",
        "Directions kept in user space instead of kTLS, by reason",
        labels=["reason"],
    )
    for reason, n in sorted(folded.items()):
        fallbacks.add_metric([reason], n)
    yield fallbacks


def _auth(s: Scrape) -> Iterator[Metric]:
    counters = s.target.counters
    yield CounterMetricFamily(
        "pynvmf_auth_successes",
        "DH-HMAC-CHAP transactions (authentications and re-authentications) that succeeded",
        value=counters.auth_successes,
    )
    failures = CounterMetricFamily(
        "pynvmf_auth_failures",
        "DH-HMAC-CHAP transactions that failed, by the failure reason explanation",
        labels=["reason"],
    )
    for reason, n in sorted(counters.auth_failures.items()):
        failures.add_metric([reason], n)
    yield failures


def _transport(s: Scrape) -> Iterator[Metric]:
    target = s.target
    counters = target.counters
    digest_errors = counters.data_digest_errors
    term_reqs = counters.term_reqs_sent
    for port in target.ports:
        for protocol in port.connections:
            stats = protocol.conn.stats
            digest_errors += stats.data_digest_errors
            term_reqs += stats.term_reqs_sent
    yield CounterMetricFamily(
        "pynvmf_data_digest_errors",
        "Data PDUs whose data digest (CRC32C) did not match",
        value=digest_errors,
    )
    yield CounterMetricFamily(
        "pynvmf_term_reqs_sent",
        "Connections ended by a C2HTermReq (a malformed PDU, a header digest error)",
        value=term_reqs,
    )


def _rdma(s: Scrape) -> Iterator[Metric]:
    # What each rdma listener's queues counted, those alive and those closed (the same
    # tallies nvmf_get_stats reads: pynvmf/rdma/counters.py).
    commands = CounterMetricFamily(
        "pynvmf_rdma_commands", "Command capsules received on NVMe/RDMA queues", labels=["listener"]
    )
    in_capsule = CounterMetricFamily(
        "pynvmf_rdma_in_capsule_bytes",
        "Data that came in NVMe/RDMA command capsules",
        labels=["listener"],
    )
    transfers = CounterMetricFamily(
        "pynvmf_rdma_transfers",
        "RDMA READs of host memory (a write's data) and RDMA WRITEs to it (a read's data)",
        labels=["listener", "op"],
    )
    queues = CounterMetricFamily(
        "pynvmf_rdma_queues", "NVMe/RDMA queues opened", labels=["listener"]
    )
    for name, tally in s.target.rdma_counters.ports():
        total = tally.total()
        commands.add_metric([name], total.commands)
        in_capsule.add_metric([name], total.in_capsule_bytes)
        transfers.add_metric([name, "read"], total.rdma_reads)
        transfers.add_metric([name, "write"], total.rdma_writes)
        queues.add_metric([name], tally.queues)
    yield commands
    yield in_capsule
    yield transfers
    yield queues


def _budgets(s: Scrape) -> Iterator[Metric]:
    pool = s.target.memory_pool
    yield GaugeMetricFamily(
        "pynvmf_data_buffers_bytes",
        "Data buffers held for hosts' commands now, in this process",
        value=pool.used,
    )
    yield GaugeMetricFamily(
        "pynvmf_data_buffers_limit_bytes",
        "The data buffers this process may hold in all (--max-memory)",
        value=pool.capacity,
    )
    yield CounterMetricFamily(
        "pynvmf_budget_waits",
        "Requests for data buffers that waited for others to be given back",
        value=pool.waits + s.target.counters.worker_budget_waits,
    )


def _in_flight(s: Scrape) -> Iterator[Metric]:
    g = GaugeMetricFamily(
        "pynvmf_commands_in_flight",
        "I/O commands received and not completed yet, by subsystem (a worker's as of its "
        "last report: every half second at most)",
        labels=["subsystem"],
    )
    for nqn, n in sorted(s.target.commands_in_flight().items()):
        g.add_metric([label_value(nqn)], n)
    yield g


def _copies(s: Scrape) -> Iterator[Metric]:
    counters = s.target.counters
    copied = sum(
        per_ns.copy_bytes
        for host in s.target.command_counts.hosts.values()
        for per_ns in host.namespaces.values()
    )
    offloaded, emulated = counters.copy_offloaded_bytes, counters.copy_emulated_bytes
    copies = CounterMetricFamily(
        "pynvmf_copy_bytes",
        "Bytes of successful Copy commands by the path the copy planner chose: native "
        "(inside the device), offloaded (copy requests to a remote namespace), emulated "
        "(read and written again by the target)",
        labels=["mode"],
    )
    # A copy's blocks each take one path: what was not offloaded or emulated was native.
    copies.add_metric(["native"], max(0, copied - offloaded - emulated))
    copies.add_metric(["offloaded"], offloaded)
    copies.add_metric(["emulated"], emulated)
    yield copies


def _faults(s: Scrape) -> Iterator[Metric]:
    faults = s.target.faults
    hits = CounterMetricFamily(
        "pynvmf_fault_hits",
        "Commands each fault rule in force acted on (docs/faults.md), by rule id; "
        'rule="removed": those of rules since removed',
        labels=["rule"],
    )
    for rule_id, n in sorted(faults.hits().items()):
        hits.add_metric([str(rule_id)], n)
    if faults.removed_hits:
        hits.add_metric(["removed"], faults.removed_hits)
    yield hits


Source = Callable[[Scrape], Iterable[Metric]]

SOURCES: tuple[Source, ...] = (
    _connections,
    _controllers_and_queues,
    _io,
    _commands,
    _in_flight,
    _copies,
    _latency,
    _ana,
    _tls,
    _auth,
    _transport,
    _rdma,
    _budgets,
    _faults,
)


class TargetCollector(Collector):
    """The metric families of one Target. Call `collect` on the target's event loop."""

    def __init__(self, target: Target, *, host_limit: int = DEFAULT_HOST_LIMIT) -> None:
        self.target = target
        self.hosts = BoundedLabels(host_limit)
        self.fallback_reasons = BoundedLabels(FALLBACK_REASON_LIMIT)
        self.command_hosts = BoundedLabels(host_limit)

    def collect(self) -> Iterable[Metric]:
        scrape = Scrape(self.target, self.hosts, self.fallback_reasons, self.command_hosts)
        for source in SOURCES:
            yield from source(scrape)
