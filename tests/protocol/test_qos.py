"""A namespace held to SPDK's bdev_set_qos_limit limits, measured from two hosts at once
(pynvmf's host library, over TCP), with the target in one process (`--cores 1`) and with
two worker processes (`--cores 2`), whose queues pace against one shared state: the
rate measured is within 5% of the limit; without a limit the same load goes faster;
the wait shows in the latency's `budget` stage; removing the limit lets commands
waiting at that moment go; the limits survive save_config / load_config; bad input
changes nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.host import Controller, connect
from pynvmf.rpc.methods import ControlPlane
from pynvmf.rpc.server import control_plane
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.cores.workers import MultiCoreTarget
from pynvmf.target.port import Port
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget

pytestmark = pytest.mark.timeout(180)

NQN = "nqn.2024-01.io.pynvmf.test:qos"
BLOCK = 512
BLOCKS = 1 << 14  # 8 MiB
WARMUP_S = 0.5
MEASURE_S = 3.0


def _host(n: int) -> str:
    return f"nqn.2014-08.org.nvmexpress:uuid:{uuid.UUID(int=n)}"


@dataclass
class Setup:
    target: Target
    cp: ControlPlane

    async def call(self, method: str, **params: Any) -> Any:
        return await self.cp.call(method, params)


@pytest.fixture(params=[1, 2], ids=["cores1", "cores2"])
async def setup(request: pytest.FixtureRequest) -> AsyncIterator[Setup]:
    """A memory namespace on bdev Qos0, served by one process or by two workers."""
    ports = [Port("127.0.0.1", 0)]
    target = Target(ports=ports) if request.param == 1 else MultiCoreTarget(2, ports=ports)
    target.add_subsystem(NQN)
    await target.start()
    s = Setup(target, control_plane(target))
    await s.call("bdev_malloc_create", name="Qos0", num_blocks=BLOCKS, block_size=BLOCK)
    await s.call("nvmf_subsystem_add_ns", nqn=NQN, namespace={"bdev_name": "Qos0", "nsid": 1})
    yield s
    await target.stop()


async def _hosts(target: Target, n: int = 2) -> list[Controller]:
    port = target.ports[0]
    return [
        await connect(port.address, port.port, NQN, hostnqn=_host(i + 1), queues=2)
        for i in range(n)
    ]


async def _load(
    hosts: list[Controller], opcode: int, nlb: int, seconds: float, depth: int
) -> list[int]:
    """Each host keeps `depth` commands in flight on each of its queues; the commands
    each host completed within `seconds` after a warm-up (which takes the burst the
    limit allows at the start). The depth is what keeps commands waiting at the limit
    while others are on their way between target and host: on a loaded machine that
    way takes long, and a limit whose turn comes with no command waiting loses it."""
    start = time.monotonic()
    t0, t1 = start + WARMUP_S, start + WARMUP_S + seconds
    counts = [0] * len(hosts)
    data = memoryview(bytearray(nlb * BLOCK))

    async def worker(i: int, queue: Any, lba: int) -> None:
        into = memoryview(bytearray(nlb * BLOCK))
        while time.monotonic() < t1:
            if opcode == IoOpcode.READ:
                await queue.execute(opcode, 1, lba, 0, nlb - 1, into=into)
            else:
                await queue.execute(opcode, 1, lba, 0, nlb - 1, data=data)
            if t0 <= time.monotonic() < t1:
                counts[i] += 1

    tasks = [
        worker(i, queue, ((i * 8 + q * depth + d) * nlb) % (BLOCKS - nlb))
        for i, host in enumerate(hosts)
        for q, queue in enumerate(host.io_queues)
        for d in range(depth)
    ]
    await asyncio.gather(*tasks)
    return counts


async def _close(hosts: list[Controller]) -> None:
    for host in hosts:
        await host.close()


async def test_two_hosts_share_an_iops_limit(setup: Setup) -> None:
    hosts = await _hosts(setup.target)
    try:
        # The load goes faster than the limit without one: the measurement can fail.
        free = await _load(hosts, IoOpcode.READ, 8, 1.0, depth=32)
        assert sum(free) > 1.5 * 2000, free
        assert await setup.call("bdev_set_qos_limit", name="Qos0", rw_ios_per_sec=2000)
        counts = await _load(hosts, IoOpcode.READ, 8, MEASURE_S, depth=32)
    finally:
        await _close(hosts)
    rate = sum(counts) / MEASURE_S
    assert rate == pytest.approx(2000, rel=0.05), counts
    # Shared fairly: neither host starved.
    assert min(counts) >= 0.35 * sum(counts), counts


async def test_two_hosts_share_a_bandwidth_limit(setup: Setup) -> None:
    hosts = await _hosts(setup.target)
    try:
        assert await setup.call("bdev_set_qos_limit", name="Qos0", rw_mbytes_per_sec=4)
        counts = await _load(hosts, IoOpcode.WRITE, 64, MEASURE_S, depth=16)  # 32 KiB
    finally:
        await _close(hosts)
    rate = sum(counts) * 64 * BLOCK / MEASURE_S
    assert rate == pytest.approx(4 << 20, rel=0.05), counts
    assert min(counts) >= 0.35 * sum(counts), counts


async def test_a_limit_removed_lets_waiting_commands_go(setup: Setup) -> None:
    (host,) = await _hosts(setup.target, 1)
    try:
        await setup.call("bdev_set_qos_limit", name="Qos0", rw_mbytes_per_sec=1)
        queue = host.io_queues[0]
        data = memoryview(bytearray(BLOCK * 256))  # 128 KiB: 8 a second
        await asyncio.wait_for(queue.execute(IoOpcode.WRITE, 1, 0, 0, 255, data=data), 10)
        # 16 more would take about 2 s at the limit; with the limit removed at once,
        # they finish well before.
        pending = [
            asyncio.ensure_future(queue.execute(IoOpcode.WRITE, 1, 0, 0, 255, data=data))
            for _ in range(16)
        ]
        await asyncio.sleep(0)  # they are sent
        started = time.monotonic()
        assert await setup.call("bdev_set_qos_limit", name="Qos0", rw_mbytes_per_sec=0)
        await asyncio.wait_for(asyncio.gather(*pending), 10)
        assert time.monotonic() - started < 1.0
        (bdev,) = await setup.call("bdev_get_bdevs", name="Qos0")
        assert bdev["assigned_rate_limits"] == {
            "rw_ios_per_sec": 0,
            "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 0,
            "w_mbytes_per_sec": 0,
        }
    finally:
        await host.close()


async def _raw_namespace(rpc: RawRpcTarget) -> int:
    await rpc.ok("bdev_malloc_create", name="Qos0", num_blocks=BLOCKS, block_size=BLOCK)
    nsid: int = await rpc.ok(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": "Qos0"}
    )
    return nsid


async def test_the_wait_is_the_budget_stage(raw_rpc_target: RawRpcTarget) -> None:
    rpc = raw_rpc_target
    nsid = await _raw_namespace(rpc)
    rpc.target.set_latency_tracking(True)
    host = await rpc.host(_host(1))
    try:
        await rpc.ok("bdev_set_qos_limit", name="Qos0", rw_ios_per_sec=1000)
        queue = host.io_queues[0]
        into = memoryview(bytearray(BLOCK))
        # 80 at once: the tolerance's 50 go, the other 30 wait their turn.
        await asyncio.gather(
            *(queue.execute(IoOpcode.READ, nsid, 0, 0, 0, into=into) for _ in range(80))
        )
    finally:
        await host.close()
    stages = rpc.target.command_counts.of(RAW_SUBNQN, _host(1)).stages
    assert stages["budget"].count() >= 25


async def test_limits_survive_save_and_load_config(raw_rpc_target: RawRpcTarget) -> None:
    rpc = raw_rpc_target
    await _raw_namespace(rpc)
    await rpc.ok("bdev_set_qos_limit", name="Qos0", rw_ios_per_sec=1500, r_mbytes_per_sec=3)
    saved = spdk_config(rpc.target)
    bdev_calls = next(s["config"] for s in saved["subsystems"] if s["subsystem"] == "bdev")
    created = next(i for i, c in enumerate(bdev_calls) if c["params"].get("name") == "Qos0")
    # As SPDK writes it: right after the bdev, the limits in force (1500 rounded up).
    qos_call = bdev_calls[created + 1]
    assert qos_call["method"] == "bdev_set_qos_limit"
    assert [c["method"] for c in bdev_calls].count("bdev_set_qos_limit") == 1
    assert qos_call["params"] == {"name": "Qos0", "rw_ios_per_sec": 2000, "r_mbytes_per_sec": 3}
    fresh = Target()
    try:
        await load_spdk_config(control_plane(fresh), saved)
        entry = fresh.block_devices["Qos0"]
        assert entry.qos is not None
        assert entry.qos.limits.as_dict() == {
            "rw_ios_per_sec": 2000,
            "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 3,
            "w_mbytes_per_sec": 0,
        }
        (ns,) = [ns for ns in fresh.subsystems[RAW_SUBNQN].namespaces.values() if ns.qos]
        assert ns.qos is entry.qos and ns.device_name == "Qos0"
    finally:
        await fresh.stop()


async def test_bad_input_names_the_parameter_and_changes_nothing(
    raw_rpc_target: RawRpcTarget,
) -> None:
    rpc = raw_rpc_target
    await rpc.ok("bdev_malloc_create", name="Q1", num_blocks=64, block_size=512)
    assert await rpc.ok("bdev_set_qos_limit", name="Q1", rw_ios_per_sec=3000) is True
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "Nope", "rw_ios_per_sec": 1000}, "name: "),
        ({"name": "Q1"}, "rw_ios_per_sec, "),
        ({"name": "Q1", "rw_ios_per_sec": -1000}, "rw_ios_per_sec: "),
        ({"name": "Q1", "rw_mbytes_per_sec": "4"}, "rw_mbytes_per_sec: "),
        ({"name": "Q1", "w_mbytes_per_sec": 1.5}, "w_mbytes_per_sec: "),
        ({"name": "Q1", "rw_ios_per_sec": 1000, "iops": 5}, "iops: "),
    ]
    for params, prefix in cases:
        answer = await rpc.call("bdev_set_qos_limit", **params)
        assert answer["error"]["code"] == -32602, (params, answer)
        assert answer["error"]["message"].startswith(prefix), (params, answer)
    (bdev,) = await rpc.ok("bdev_get_bdevs", name="Q1")
    assert bdev["assigned_rate_limits"]["rw_ios_per_sec"] == 3000
    assert bdev["assigned_rate_limits"]["rw_mbytes_per_sec"] == 0
