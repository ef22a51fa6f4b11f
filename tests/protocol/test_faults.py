"""Fault rules (target/faults.py) acting on the commands of pynvmf's own host library over
real TCP against the in-process target: a delay, a status (with CRD only for a host that
enabled ACRE), a dropped command that never completes and whose slot the connection's end
frees, and a connection closed after N commands; rules added and removed at runtime."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeConnectionError, NvmeStatusError, connect
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.rpc.jsonrpc import INVALID_PARAMS
from pynvmf.spec.command import HOST_BEHAVIOR_SIZE
from pynvmf.spec.opcodes import AdminOpcode, FeatureId
from pynvmf.spec.status import CRD_MASK, CRD_SHIFT, DNR, Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import FaultSpec
from pynvmf.target.port import Port
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget
from tests.support.scrape import samples_of, value

NQN = "nqn.2024-01.io.pynvmf.test:faults"
BLOCK = 512
BLOCKS = 2048


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(BLOCK * BLOCKS, BLOCK), "m"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    yield target
    await target.stop()


async def host(target: Target, **kwargs: object) -> Controller:
    port = target.ports[0]
    return await connect(port.address, port.port, NQN, **kwargs)  # type: ignore[arg-type]


def io_queue(target: Target) -> TargetQueue:
    (ctrl,) = target.subsystems[NQN].controllers.values()
    return ctrl.queues[1]


async def test_no_rule_no_fault_and_queues_follow_the_rules(target: Target) -> None:
    ctrl = await host(target)
    try:
        queue = io_queue(target)
        assert queue.faults is None  # the hot path's one test
        rule = target.add_fault(FaultSpec("status", sc=Status.INTERNAL_ERROR, opcode="read"))
        assert queue.faults is target.faults
        with pytest.raises(NvmeStatusError):
            await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        target.remove_fault(rule.id)
        assert queue.faults is None
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        assert rule.hits == 1
    finally:
        await ctrl.close()


async def test_delay(target: Target) -> None:
    ctrl = await host(target)
    try:
        ns = ctrl.namespace(1)
        target.add_fault(FaultSpec("delay", opcode="write", delay_ms=300))
        data = bytes(range(256)) * 2
        began = time.monotonic()
        await ns.write(8, data)
        took = time.monotonic() - began
        buf = bytearray(BLOCK)
        began = time.monotonic()
        await ns.read(8, memoryview(buf))
        assert time.monotonic() - began < 0.3  # Reads are not selected
        assert took >= 0.3
        assert bytes(buf) == data  # the delayed write ran
    finally:
        await ctrl.close()


async def test_status_with_dnr_and_the_hit_logged(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    ctrl = await host(target)
    try:
        target.add_fault(FaultSpec("status", sct=0, sc=Status.NS_NOT_READY, dnr=True, first=1))
        caplog.set_level(logging.INFO, "pynvmf.target.queue")
        with pytest.raises(NvmeStatusError) as err:
            await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        assert err.value.status == Status.NS_NOT_READY and err.value.dnr
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))  # first=1: once
        assert any(
            "fault rule 1: status qid 1" in r.getMessage() and "opcode read" in r.getMessage()
            for r in caplog.records
        )
        # The controller's error log holds it, as any failed command.
        (ctrl_t,) = target.subsystems[NQN].controllers.values()
        assert ctrl_t.error_count >= 1
    finally:
        await ctrl.close()


async def _crd_of_read(ctrl: Controller) -> int:
    with pytest.raises(NvmeStatusError) as err:
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
    assert err.value.status == Status.NS_NOT_READY and not err.value.dnr
    return (err.value.raw_status & CRD_MASK) >> CRD_SHIFT


async def test_crd_needs_crdt_and_is_sent_to_hosts_with_acre(target: Target) -> None:
    spec = FaultSpec("status", sc=Status.NS_NOT_READY, crd=2, opcode="read")
    with pytest.raises(ChangeError) as err:
        target.add_fault(spec)
    assert err.value.field == "crd"
    target.set_crdt((1, 5, 0))
    target.add_fault(spec)
    ctrl = await host(target)
    try:
        identify = await ctrl.identify_controller()
        assert (identify.crdt1, identify.crdt2, identify.crdt3) == (1, 5, 0)
        assert await _crd_of_read(ctrl) == 0  # ACRE is 0 until the host sets it
        behavior = bytearray(HOST_BEHAVIOR_SIZE)
        behavior[0] = 1  # ACRE
        await ctrl.set_features(FeatureId.HOST_BEHAVIOR, data=behavior)
        assert await _crd_of_read(ctrl) == 2
    finally:
        await ctrl.close()


async def test_drop_never_completes_and_the_connection_end_frees_it(target: Target) -> None:
    ctrl = await host(target)
    queue = io_queue(target)
    rule = target.add_fault(FaultSpec("drop", opcode="read", first=1))
    read = asyncio.ensure_future(ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK))))
    try:
        done, _ = await asyncio.wait([read], timeout=0.5)
        assert not done and rule.hits == 1
        assert queue.commands_in_flight == 1
        # The queue goes on with the next commands.
        await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        assert queue.commands_in_flight == 1
    finally:
        await ctrl.close()
    with pytest.raises(NvmeConnectionError):
        await read
    assert queue.commands_in_flight == 0
    assert not target.subsystems[NQN].controllers


async def test_a_delayed_command_on_a_closed_connection_is_forgotten(target: Target) -> None:
    ctrl = await host(target)
    queue = io_queue(target)
    target.add_fault(FaultSpec("delay", opcode="write", delay_ms=60_000))
    write = asyncio.ensure_future(ctrl.namespace(1).write(0, bytes(BLOCK)))
    while not queue.commands_delayed:  # the write's capsule is on its way
        await asyncio.sleep(0.01)
    await ctrl.close()
    with pytest.raises(NvmeConnectionError):
        await write
    assert queue.commands_delayed == 0  # its timer went with the connection


async def test_close_after_n_commands_then_reconnect(target: Target) -> None:
    target.add_fault(FaultSpec("close", queue="io", after=3))
    ctrl = await host(target)
    ns = ctrl.namespace(1)
    buf = memoryview(bytearray(BLOCK))
    for _ in range(3):
        await ns.read(0, buf)
    with pytest.raises(NvmeConnectionError):
        await ns.read(0, buf)
    await ctrl.close()
    target.remove_fault(1)
    again = await host(target)
    try:
        await again.namespace(1).read(0, buf)
    finally:
        await again.close()


async def test_rules_select_by_host_and_admin_commands(target: Target) -> None:
    hostnqn = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa"
    other = await host(target)
    selected = await host(target, hostnqn=hostnqn)
    try:
        target.add_fault(
            FaultSpec("status", sc=Status.INTERNAL_ERROR, host=hostnqn, opcode="identify")
        )
        await other.identify_controller()
        with pytest.raises(NvmeStatusError) as err:
            await selected.identify_controller()
        assert err.value.status == Status.INTERNAL_ERROR and err.value.admin
        assert not err.value.raw_status & DNR
    finally:
        await other.close()
        await selected.close()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (FaultSpec("drop", subsystem="nqn.2024-01.io.pynvmf.test:none"), "subsystem"),
        (FaultSpec("drop", subsystem=NQN, nsid=2), "nsid"),
        (FaultSpec("drop", nsid=9), "nsid"),
        (FaultSpec("status", sc=300), "sc"),
    ],
)
async def test_a_rule_selecting_nothing_is_refused(
    target: Target, spec: FaultSpec, field: str
) -> None:
    with pytest.raises(ChangeError) as err:
        target.add_fault(spec)
    assert err.value.field == field
    assert not target.faults.rules


async def test_the_rpc_adds_lists_and_removes_rules(raw_rpc_target: RawRpcTarget) -> None:
    rpc = raw_rpc_target
    rule_id = await rpc.ok(
        "pynvmf_fault_add",
        action="status",
        subsystem=RAW_SUBNQN,
        nsid=1,
        opcode="read",
        sct=0,
        sc=int(Status.NS_NOT_READY),
        probability=1.0,
        seed=42,
    )
    port = rpc.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_SUBNQN)
    try:
        with pytest.raises(NvmeStatusError):
            await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
        await ctrl.namespace(2).read(0, memoryview(bytearray(4096)))  # nsid 2: not selected
    finally:
        await ctrl.close()
    (listed,) = await rpc.ok("pynvmf_fault_list")
    assert listed["id"] == rule_id and listed["hits"] == 1 and listed["matches"] == 1
    assert listed["rule"]["opcode"] == "read" and listed["rule"]["seed"] == 42
    assert await rpc.ok("pynvmf_fault_remove", id=rule_id)
    assert await rpc.ok("pynvmf_fault_list") == []


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"action": "explode"}, "action:"),
        ({"action": "drop", "probability": 2}, "probability:"),
        ({"action": "status", "sct": 9, "sc": 1}, "sct:"),
        ({"action": "drop", "subsystem": "nqn.2024-01.io.pynvmf.test:none"}, "subsystem:"),
        ({"action": "drop", "subsystem": RAW_SUBNQN, "nsid": 7}, "nsid:"),
        ({"action": "drop", "colour": "red"}, "colour:"),
        ({"action": "status", "sc": 2, "crd": 1}, "crd:"),
    ],
)
async def test_the_rpc_names_the_field_and_applies_nothing(
    raw_rpc_target: RawRpcTarget, params: dict[str, object], named: str
) -> None:
    answer = await raw_rpc_target.call("pynvmf_fault_add", **params)
    assert answer["error"]["code"] == INVALID_PARAMS
    assert answer["error"]["message"].startswith(named), answer
    assert await raw_rpc_target.ok("pynvmf_fault_list") == []
    answer = await raw_rpc_target.call("pynvmf_fault_remove", id=1)
    assert answer["error"]["message"].startswith("id:")


async def test_nvmf_set_crdt_sets_what_crd_names(raw_rpc_target: RawRpcTarget) -> None:
    assert await raw_rpc_target.ok("nvmf_set_crdt", crdt1=2)
    assert raw_rpc_target.target.crdt == (2, 0, 0)
    await raw_rpc_target.ok("pynvmf_fault_add", action="status", sc=2, crd=1)


async def test_hits_are_a_metric(target: Target) -> None:
    first = target.add_fault(FaultSpec("status", sc=Status.INTERNAL_ERROR, opcode="read"))
    second = target.add_fault(FaultSpec("delay", opcode="write", delay_ms=1))
    ctrl = await host(target)
    try:
        for _ in range(3):
            with pytest.raises(NvmeStatusError):
                await ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK)))
        await ctrl.namespace(1).write(0, bytes(BLOCK))
    finally:
        await ctrl.close()
    samples = samples_of(MetricsEndpoint(target).exposition().decode())
    assert value(samples, "pynvmf_fault_hits_total", rule=str(first.id)) == 3
    assert value(samples, "pynvmf_fault_hits_total", rule=str(second.id)) == 1
    target.remove_fault(first.id)
    samples = samples_of(MetricsEndpoint(target).exposition().decode())
    assert value(samples, "pynvmf_fault_hits_total", rule=str(first.id)) is None
    assert value(samples, "pynvmf_fault_hits_total", rule="removed") == 3


@pytest.mark.parametrize("action", ["drop", "delay"])
async def test_an_abort_completes_a_held_command(target: Target, action: str) -> None:
    ctrl = await host(target)
    queue = io_queue(target)
    extra = {"delay_ms": 60_000} if action == "delay" else {}
    target.add_fault(FaultSpec(action, opcode="read", first=1, **extra))  # type: ignore[arg-type]
    read = asyncio.ensure_future(ctrl.namespace(1).read(0, memoryview(bytearray(BLOCK))))
    try:
        while not queue.held_cids:  # the Read's capsule is on its way
            await asyncio.sleep(0.01)
        (cid,) = queue.held_cids
        # Abort: SQID 1, the CID; DW0 bit 0 clear: aborted.
        result = await ctrl.admin_command(AdminOpcode.ABORT, 0, 1 | cid << 16)
        assert result & 1 == 0
        with pytest.raises(NvmeStatusError) as err:
            await read
        assert err.value.status == Status.ABORT_REQUESTED
        assert queue.held_cids == [] and queue.commands_in_flight == 0
        # Another Abort of it finds nothing: "not aborted".
        assert await ctrl.admin_command(AdminOpcode.ABORT, 0, 1 | cid << 16) & 1 == 1
    finally:
        await ctrl.close()
