"""Latency histograms (pynvmf_command_latency_seconds, pynvmf_command_stage_seconds) and
pynvmf_get_host_stats on an in-process target: a histogram counts exactly the commands
the counters count, its sum is plausible, and with latency tracking off there are none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.target.budget import ConnectionLimits
from pynvmf.target.command_counts import BUCKETS, CommandCounts, Histogram
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.scrape import scrape, series

NQN = "nqn.2024-01.org.pynvmf:latency"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b1"


def _target() -> tuple[Target, Port]:
    subsystem = Subsystem(NQN)
    for nsid in (1, 2):
        device = MemoryDevice(8 << 20, 512)
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
    port = Port("127.0.0.1", 0)
    return Target([subsystem], [port]), port


@pytest.fixture
async def served() -> AsyncIterator[tuple[Target, Port, MetricsEndpoint]]:
    target, port = _target()
    endpoint = MetricsEndpoint(target)
    await endpoint.listen("127.0.0.1", 0)
    target.set_latency_tracking(True)  # `pynvmf target --latency-tracking`
    await target.start()
    yield target, port, endpoint
    await endpoint.close()
    await target.stop()


async def _workload(port: Port) -> None:
    """Host A: 4 in-capsule writes, 1 R2T write, 3 reads to namespace 1, a flush and a
    write-zeroes to namespace 2; host B: 2 reads of namespace 2."""
    a = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A, queues=2)
    b = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_B, queues=1)
    try:
        a1, a2, b2 = a.namespace(1), a.namespace(2), b.namespace(2)
        for lba in range(4):
            await a1.write(lba * 8, bytes(4096))
        await a1.write(64, bytes(65536))
        for _ in range(3):
            await a1.read(0, memoryview(bytearray(4096)))
        await a2.flush()
        await a2.write_zeroes(0, 16)
        for _ in range(2):
            await b2.read(8, memoryview(bytearray(512)))
    finally:
        await a.close()
        await b.close()


def _by(samples: dict[frozenset[tuple[str, str]], float], *names: str) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for labels, n in samples.items():
        d = dict(labels)
        key = tuple(d[name] for name in names)
        out[key] = out.get(key, 0) + n
    return out


async def test_histogram_counts_equal_command_counts_and_sums_are_plausible(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    target, port, endpoint = served
    assert endpoint.address is not None
    began = time.monotonic()
    await _workload(port)
    wall = time.monotonic() - began
    m = await scrape(*endpoint.address)
    commands = _by(series(m, "pynvmf_commands_total"), "nsid", "opcode")
    assert commands == {("1", "write"): 5, ("1", "read"): 3, ("2", "flush"): 1,
                        ("2", "write_zeroes"): 1, ("2", "read"): 2}  # fmt: skip
    counts = _by(series(m, "pynvmf_command_latency_seconds_count"), "nsid", "opcode")
    assert counts == commands
    sums = _by(series(m, "pynvmf_command_latency_seconds_sum"), "nsid", "opcode")
    assert sums.keys() == commands.keys()
    assert all(0 < s < wall for s in sums.values()), (sums, wall)
    inf = _by(
        {k: v for k, v in series(m, "pynvmf_command_latency_seconds_bucket").items()
         if ("le", "+Inf") in k},
        "nsid", "opcode",
    )  # fmt: skip
    assert inf == commands
    stages = _by(series(m, "pynvmf_command_stage_seconds_count"), "stage")
    # Every command has a receive, device and send sample; one waited for host data
    # (the R2T write); none for a buffer.
    assert stages == {("receive",): 12, ("device",): 12, ("send",): 12, ("data",): 1}

    cp = control_plane(target)
    stats = await cp.call("pynvmf_get_host_stats", {})
    assert stats["latency_tracking"] is True
    assert stats["tick_rate"] == 1_000_000_000
    assert stats["buckets"] == list(BUCKETS)
    hosts = {h["host"]: h for h in stats["hosts"]}
    assert set(hosts) == {HOST_A, HOST_B}
    assert all(h["subsystem"] == NQN and h["connected"] is False for h in hosts.values())
    a = {ns["nsid"]: ns for ns in hosts[HOST_A]["namespaces"]}
    assert a[1]["commands"] == {"write": 5, "read": 3}
    assert a[1]["bytes"] == {"read": 3 * 4096, "write": 4 * 4096 + 65536, "copy": 0}
    assert a[2]["commands"] == {"flush": 1, "write_zeroes": 1}
    for nsid, ns in a.items():
        assert ns["errors"] == 0
        assert {op: h["count"] for op, h in ns["latency"].items()} == ns["commands"], nsid
        for h in ns["latency"].values():
            assert len(h["buckets"]) == len(BUCKETS) + 1
            assert sum(h["buckets"]) == h["count"] and 0 < h["sum"] < wall
    for host, n in ((HOST_A, 10), (HOST_B, 2)):
        host_stages = hosts[host]["stages"]
        for stage in ("receive", "device", "send"):
            assert host_stages[stage]["count"] == n, (host, stage)
        assert host_stages["device"]["sum"] > 0
        # The stages split each command's latency, capsule-in to completion sent, whole.
        latency_sum = sum(h["sum"] for ns in hosts[host]["namespaces"]
                          for h in ns["latency"].values())  # fmt: skip
        stage_sum = sum(h["sum"] for h in host_stages.values())
        assert stage_sum == pytest.approx(latency_sum, rel=1e-9, abs=1e-9), host
    assert hosts[HOST_A]["stages"]["data"]["count"] == 1
    # Its flush, write-zeroes and R2T write completed off the fast path, between flushes.
    assert hosts[HOST_A]["stages"]["send"]["sum"] > 0
    assert 0 < hosts[HOST_A]["stages"]["data"]["sum"] < a[1]["latency"]["write"]["sum"]
    assert hosts[HOST_B]["stages"]["device"]["count"] == 2
    assert hosts[HOST_B]["stages"]["data"]["count"] == 0  # reads of a memory namespace
    assert set(hosts[HOST_B]["stages"]) == {"receive", "data", "budget", "device", "send"}
    only = await cp.call("pynvmf_get_host_stats", {"subsystem": NQN})
    assert len(only["hosts"]) == 2


async def test_commands_of_one_batch_are_timed_each(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    """48 reads sent at once, to namespaces 1, 1, 2, 1, 1, 2, ... (they arrive in few
    batches, and the fast path counts the alike commands of a batch together, in runs
    that a command of the other namespace ends): 32 and 16 samples in the histograms,
    48 in every stage, and the stages add up to the latency."""
    target, port, _endpoint = served
    async with await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A, queues=1) as host:
        reads = [
            host.namespace(2 if i % 3 == 2 else 1).read(i * 8, memoryview(bytearray(4096)))
            for i in range(48)
        ]
        await asyncio.gather(*reads)
    stats = await control_plane(target).call("pynvmf_get_host_stats", {})
    (only,) = stats["hosts"]
    ns1, ns2 = sorted(only["namespaces"], key=lambda ns: ns["nsid"])
    assert (ns1["commands"], ns2["commands"]) == ({"read": 32}, {"read": 16})
    assert ns1["latency"]["read"]["count"] == 32
    assert ns2["latency"]["read"]["count"] == 16
    assert {stage: h["count"] for stage, h in only["stages"].items()} == {
        "receive": 48, "data": 0, "budget": 0, "device": 48, "send": 48,
    }  # fmt: skip
    stage_sum = sum(h["sum"] for h in only["stages"].values())
    latency_sum = ns1["latency"]["read"]["sum"] + ns2["latency"]["read"]["sum"]
    assert stage_sum == pytest.approx(latency_sum, rel=1e-9, abs=1e-9)


async def test_with_tracking_off_there_are_no_histograms() -> None:
    target, port = _target()
    endpoint = MetricsEndpoint(target)
    await target.start()
    try:
        await endpoint.listen("127.0.0.1", 0)  # the endpoint alone times nothing
        cp = control_plane(target)
        assert await cp.call("pynvmf_set_latency_tracking", {"enable": True}) is True
        assert await cp.call("pynvmf_set_latency_tracking", {"enable": False}) is True
        await _workload(port)
        assert endpoint.address is not None
        m = await scrape(*endpoint.address)
        stats = await cp.call("pynvmf_get_host_stats", {})
    finally:
        await endpoint.close()
        await target.stop()
    assert sum(series(m, "pynvmf_commands_total").values()) == 12
    assert not series(m, "pynvmf_command_latency_seconds_count")
    assert not series(m, "pynvmf_command_stage_seconds_count")
    assert stats["latency_tracking"] is False
    for host in stats["hosts"]:
        assert "stages" not in host
        assert all("latency" not in ns for ns in host["namespaces"])


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("pynvmf_set_latency_tracking", {}),
        ("pynvmf_set_latency_tracking", {"enable": 1}),
        ("pynvmf_set_latency_tracking", {"enable": True, "more": 1}),
        ("pynvmf_get_host_stats", {"subsystem": 5}),
        ("pynvmf_get_host_stats", {"subsystem": "nqn.2024-01.org.pynvmf:none"}),
        ("pynvmf_get_host_stats", {"host": "x"}),
    ],
)
async def test_bad_params_are_refused(method: str, params: dict[str, Any]) -> None:
    target, _port = _target()
    with pytest.raises(RpcError):
        await control_plane(target).call(method, params)
    assert target.command_counts.tracking is False


def test_a_report_carries_histograms_once_and_a_bad_one_adds_nothing() -> None:
    worker, main = CommandCounts(), CommandCounts()
    worker.set_tracking(True)
    host = worker.of(NQN, HOST_A)
    held = host.namespace(1).latency_of(2)
    held.observe(50_000)  # a 50 us Read
    host.device.observe(50_000)
    report = worker.take()
    assert worker.take() == []
    held.observe(50_000)  # a histogram taken stays where commands in flight hold it
    assert worker.take()[0][4] == {1: {2: report[0][4][1][2]}}
    main.add(report)
    main.add(report)
    got = main.of(NQN, HOST_A)
    twice = Histogram()
    twice.observe(50_000)
    twice.observe(50_000)
    want = twice.as_list()
    assert {slot: h.as_list() for slot, h in got.namespaces[1].latency.items()} == {2: want}
    assert got.stages["device"].as_list() == want
    reported = report[0][4][1][2]
    assert len(reported) == len(want) + 3  # and its device time: sum, most, least
    for bad in (
        {1: {2: [-1, *reported[1:]]}},
        {1: {2: reported[:-1]}},
        {1: {99: reported}},
        {1: [reported]},
    ):
        with pytest.raises(ValueError):
            main.add([(NQN, HOST_B, {}, {}, bad, {})])
    with pytest.raises(ValueError):
        main.add([(NQN, HOST_B, {}, {}, {}, {"elsewhere": reported})])
    assert (NQN, HOST_B) not in main.hosts
    assert got.namespaces[1].latency[2].as_list() == want


async def test_a_command_that_waits_for_a_buffer_has_a_budget_sample() -> None:
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(8 << 20, 512), "memory:1"))
    port = Port("127.0.0.1", 0)
    # One 128 KiB write's buffer at a time: the others wait for it.
    target = Target([subsystem], [port], limits=ConnectionLimits(connection_data=128 << 10))
    target.set_latency_tracking(True)
    await target.start()
    try:
        host = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A)
        try:
            ns = host.namespace(1)
            await asyncio.gather(*(ns.write(i * 256, bytes(128 << 10)) for i in range(4)))
        finally:
            await host.close()
        stats = await control_plane(target).call("pynvmf_get_host_stats", {})
    finally:
        await target.stop()
    (only,) = stats["hosts"]
    stages = only["stages"]
    assert stages["data"]["count"] == 4
    assert stages["device"]["count"] == 4
    assert 1 <= stages["budget"]["count"] <= 3
    assert stages["budget"]["sum"] > 0
