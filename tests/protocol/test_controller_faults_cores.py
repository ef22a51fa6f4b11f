"""Controller-level fault rules with `--cores 2`: the I/O queues on the worker processes
answer Namespace Not Ready while a not_ready rule is in force, hold the commands of a
failed controller (CSTS.CFS reaches them with the controller's state), and see an ANA
group's flapped state (the workers' ANA table)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pynvmf.host import Controller, NvmeConnectionError, NvmeStatusError, connect
from pynvmf.spec import command as C
from pynvmf.spec.status import Status
from pynvmf.target.cores.workers import MultiCoreTarget
from pynvmf.target.devices import NamedDevice
from pynvmf.target.faults import FaultSpec
from pynvmf.target.port import Port

NQN = "nqn.2024-01.io.pynvmf.test:ctrl-faults-cores"
BLOCK = 512
BLOCKS = 2048


@pytest.fixture
async def target() -> AsyncIterator[MultiCoreTarget]:
    target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0)])
    target.add_subsystem(NQN)
    device = target.memory_device(BLOCKS * BLOCK, BLOCK)
    target.add_namespace(NQN, NamedDevice.wrap("m1", device, owned=True), nsid=1)
    await target.start()
    yield target
    await target.stop()


async def host(target: MultiCoreTarget) -> Controller:
    return await connect("127.0.0.1", target.ports[0].port, NQN, queues=2)


async def read_status(ctrl: Controller) -> int:
    try:
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
    except NvmeStatusError as exc:
        return exc.status
    return Status.SUCCESS


async def test_not_ready_on_the_workers(target: MultiCoreTarget) -> None:
    ctrl = await host(target)
    try:
        assert target.workers is not None
        rule = target.add_fault(FaultSpec("not_ready", nsid=1))
        await target.faults_applied()
        for _ in range(4):  # round robin over both I/O queues, on both workers
            assert await read_status(ctrl) == Status.NS_NOT_READY
        target.remove_fault(rule.id)
        await target.faults_applied()
        for _ in range(2):
            assert await read_status(ctrl) == Status.SUCCESS
    finally:
        await ctrl.close()


async def test_a_failed_controllers_io_queues_on_the_workers_answer_nothing(
    target: MultiCoreTarget,
) -> None:
    ctrl = await host(target)
    try:
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        rule = target.add_fault(FaultSpec("fail_controller", subsystem=NQN))
        await target.faults_applied()
        assert rule.hits == 1
        (ctrl_t,) = target.subsystems[NQN].controllers.values()
        # The workers take the new CSTS with the controller's state (what the RPC awaits).
        await target.scheduled_faults.settled()
        # Removing the rule does not heal the controller: only a reset does.
        target.remove_fault(rule.id)
        await target.faults_applied()
        reads = [
            asyncio.ensure_future(ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK))))
            for _ in range(4)
        ]
        done, _ = await asyncio.wait(reads, timeout=1.0)
        assert not done
        assert ctrl_t.csts & C.CSTS_CFS
    finally:
        await ctrl.close()
    for fut in reads:
        with pytest.raises(NvmeConnectionError):
            await fut
    again = await host(target)
    try:
        for _ in range(2):
            assert await read_status(again) == Status.SUCCESS
    finally:
        await again.close()


async def test_an_ana_flap_reaches_the_workers(target: MultiCoreTarget) -> None:
    ctrl = await host(target)
    try:
        rule = target.add_fault(
            FaultSpec(
                "ana_flap",
                subsystem=NQN,
                anagrpid=1,
                ana_states=("inaccessible", "optimized"),
                period_ms=60_000,
            )
        )
        await target.faults_applied()
        for _ in range(2):
            assert await read_status(ctrl) == Status.ANA_INACCESSIBLE
        target.remove_fault(rule.id)
        await target.faults_applied()
        for _ in range(2):
            assert await read_status(ctrl) == Status.SUCCESS
    finally:
        await ctrl.close()


async def test_a_target_stops_with_a_flap_running(target: MultiCoreTarget) -> None:
    ctrl = await host(target)
    try:
        rule = target.add_fault(
            FaultSpec("ana_flap", subsystem=NQN, anagrpid=1, period_ms=100, limit=1000)
        )
        await target.faults_applied()
        while rule.hits < 3:
            await asyncio.sleep(0.05)
    finally:
        await ctrl.close()
    await target.stop()  # the fixture's stop after this one does nothing
    hits = rule.hits
    await asyncio.sleep(0.3)  # three periods: a timer left running would flap again
    assert rule.hits == hits
