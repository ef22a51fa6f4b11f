"""pynvmf_commands_in_flight and pynvmf_copy_bytes_total on an in-process target: a
command held by the target (the first of a fused pair, waiting for its second) is in
flight until it completes; Copy's bytes are counted by the path the planner chose."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from pynvmf.host import connect
from pynvmf.host.namespace import CopyingNamespace
from pynvmf.metrics.collector import TargetCollector
from pynvmf.spec import command as C
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_RESTRICTED_NQN, RAW_SUBNQN, RawTarget

B = 512


def samples(target: Target, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples named `name` of a scrape, by their labels."""
    registry = CollectorRegistry()
    registry.register(TargetCollector(target))
    text = generate_latest(registry).decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def in_flight(target: Target) -> dict[str, float]:
    return {
        dict(k)["subsystem"]: v for k, v in samples(target, "pynvmf_commands_in_flight").items()
    }


def fused(opcode: int, cid: int, fuse: int) -> bytes:
    return C.build_sqe(
        opcode,
        cid,
        1,
        cdw10=8,
        sgl_type=C.SGL_DATA_BLOCK_OFFSET,
        sgl_length=B,
        flags=0x40 | fuse,
    )


async def test_a_held_command_is_in_flight_until_it_completes(raw_target: RawTarget) -> None:
    target = raw_target.target
    assert in_flight(target) == {RAW_SUBNQN: 0, RAW_RESTRICTED_NQN: 0}
    io = (await raw_target.host()).io[0]
    queue = target.subsystems[RAW_SUBNQN].controllers[io.cntlid].queues[1]
    first = io.submit_nowait(fused(IoOpcode.COMPARE, 101, 1), bytes(B))
    async with asyncio.timeout(5):
        while queue.fused.first is None:  # the target has the first, and holds it
            await asyncio.sleep(0)
    assert in_flight(target) == {RAW_SUBNQN: 1, RAW_RESTRICTED_NQN: 0}
    second = io.submit_nowait(fused(IoOpcode.WRITE, 102, 2), bytes(B))
    assert (await first).status == 0 and (await second).status == 0
    assert in_flight(target) == {RAW_SUBNQN: 0, RAW_RESTRICTED_NQN: 0}


async def test_copy_bytes_by_path(raw_target: RawTarget) -> None:
    target = raw_target.target
    port = raw_target.port
    async with await connect("127.0.0.1", port.port, RAW_SUBNQN) as ctrl:
        ns = ctrl.namespace(1)
        assert isinstance(ns, CopyingNamespace)
        # One range inside a memory device: copied natively.
        assert await ns.copy_one(0, 100, 4)
        # Two ranges whose destination overlaps a source: staged in memory, then
        # written (emulated).
        await ns.copy_offload([(ns, 200, 4), (ns, 204, 4)], 202)
    copied = {dict(k)["mode"]: v for k, v in samples(target, "pynvmf_copy_bytes_total").items()}
    assert copied == {"native": 4 * B, "offloaded": 0, "emulated": 8 * B}
