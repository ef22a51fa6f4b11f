"""Fault rules about the wire with `--cores 2`: the rules travel to the worker processes
(pickled with the rest of the fault table), act on the connections the workers serve, and
their hits reach the main process's table, the one pynvmf_fault_list reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pynvmf.host import Controller, NvmeConnectionError, NvmeError, connect
from pynvmf.target.cores.workers import MultiCoreTarget, RemoteQueue
from pynvmf.target.devices import NamedDevice
from pynvmf.target.faults import FaultRule, parse_fault
from pynvmf.target.port import Port

NQN = "nqn.2024-01.io.pynvmf.test:wire-faults-cores"
BLOCK = 512
BLOCKS = 2048
TIMEOUT = 10.0


@pytest.fixture
async def target() -> AsyncIterator[MultiCoreTarget]:
    target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0)])
    target.add_subsystem(NQN)
    device = target.memory_device(BLOCKS * BLOCK, BLOCK)
    target.add_namespace(NQN, NamedDevice.wrap("m1", device, owned=True), nsid=1)
    await target.start()
    yield target
    await target.stop()


async def host(target: MultiCoreTarget, *, data_digest: bool = False) -> Controller:
    # One I/O queue: the only one, and a worker's (the admin queue stays in the main process).
    return await connect("127.0.0.1", target.ports[0].port, NQN, queues=1, data_digest=data_digest)


def on_a_worker(target: MultiCoreTarget) -> None:
    """The controller's I/O queue is a worker's, not the main process's."""
    (ctrl,) = target.subsystems[NQN].controllers.values()
    assert isinstance(ctrl.queues[1], RemoteQueue)


async def reported_hits(target: MultiCoreTarget, rule: FaultRule, hits: int) -> None:
    """Until the main process's listing of `rule` shows `hits` (a worker reports what its
    rules did twice a second at most)."""
    async with asyncio.timeout(TIMEOUT):
        while target.faults.rules[rule.id].listing()["hits"] < hits:
            await asyncio.sleep(0.02)
    assert target.faults.rules[rule.id].listing()["hits"] == hits


async def read(ctrl: Controller, slba: int = 0) -> bytes:
    buf = bytearray(BLOCK)
    await asyncio.wait_for(ctrl.namespace(1).read(slba, memoryview(buf)), TIMEOUT)
    return bytes(buf)


async def test_a_wrong_data_digest_from_a_worker(target: MultiCoreTarget) -> None:
    ctrl = await host(target, data_digest=True)
    try:
        data = bytes(range(256)) * 2
        await ctrl.namespace(1).write(3, data)
        on_a_worker(target)
        rule = target.add_fault(
            parse_fault(
                {"action": "corrupt_digest", "digest": "data", "opcode": "read", "limit": 1}
            )
        )
        await target.faults_applied()
        # The host finds the digest wrong and fails the Read; the connection lives.
        with pytest.raises(NvmeError) as failed:
            await read(ctrl, 3)
        assert not isinstance(failed.value, NvmeConnectionError)
        await reported_hits(target, rule, 1)
        assert await read(ctrl, 3) == data  # the limit is spent: the next Read is whole
        await reported_hits(target, rule, 1)
    finally:
        await ctrl.close()


async def test_a_term_req_from_a_worker(target: MultiCoreTarget) -> None:
    ctrl = await host(target)
    try:
        on_a_worker(target)
        rule = target.add_fault(parse_fault({"action": "term_req", "opcode": "read"}))
        await target.faults_applied()
        with pytest.raises(NvmeConnectionError):
            await read(ctrl)
        await reported_hits(target, rule, 1)
    finally:
        await ctrl.close()
    target.remove_fault(rule.id)
    await target.faults_applied()
    again = await host(target)
    try:
        assert await read(again) == bytes(BLOCK)
    finally:
        await again.close()
