"""Controller-level fault rules (target/controller_faults.py, faults.py) against pynvmf's
own host library over real TCP: a namespace not ready for a while, keep-alive starvation
(a dropped Keep Alive), a failed controller (CSTS.CFS) that a new association replaces, an
ANA group flapping on one listener, and an AEN storm bounded by the host's AERs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeConnectionError, NvmeStatusError, connect, fabrics
from pynvmf.rpc.jsonrpc import INVALID_PARAMS
from pynvmf.spec import command as C
from pynvmf.spec.command import HOST_BEHAVIOR_SIZE
from pynvmf.spec.identify import Oaes
from pynvmf.spec.logpages import AnaLog, AnaState, LogPageId
from pynvmf.spec.opcodes import (
    NOTICE_ANA_CHANGE,
    NOTICE_NS_ATTR_CHANGED,
    AdminOpcode,
    FeatureId,
)
from pynvmf.spec.status import CRD_MASK, CRD_SHIFT, Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import FaultSpec, parse_scenario
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget

NQN = "nqn.2024-01.io.pynvmf.test:ctrl-faults"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b2"
BLOCK = 512
BLOCKS = 2048
ANA_LOG_MAX = 4096


def _event(notice: int, log_page: int) -> int:
    return 0x2 | notice << 8 | log_page << 16


ANA_EVENT = _event(NOTICE_ANA_CHANGE, LogPageId.ANA)
NS_ATTR_EVENT = _event(NOTICE_NS_ATTR_CHANGED, LogPageId.CHANGED_NS)


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    """NQN on two ports, namespaces 1 and 2 (ANA group 1)."""
    subsystem = Subsystem(NQN)
    for nsid in (1, 2):
        device = MemoryDevice(BLOCK * BLOCKS, BLOCK)
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"m{nsid}"))
    target = Target([subsystem], [Port("127.0.0.1", 0), Port("127.0.0.1", 0)])
    await target.start()
    yield target
    await target.stop()


async def host(target: Target, port: int = 0, **kwargs: object) -> Controller:
    p = target.ports[port]
    return await connect(p.address, p.port, NQN, **kwargs)  # type: ignore[arg-type]


async def read(ctrl: Controller, nsid: int = 1) -> None:
    await ctrl.namespace(nsid).read(0, memoryview(bytearray(BLOCK)))


async def status_of_read(ctrl: Controller, nsid: int = 1) -> NvmeStatusError:
    with pytest.raises(NvmeStatusError) as err:
        await read(ctrl, nsid)
    return err.value


async def rules_gone(target: Target) -> None:
    while target.faults.rules:  # a timer removes the rule
        await asyncio.sleep(0.02)


# -- not_ready ------------------------------------------------------------------------------


async def test_not_ready_for_a_while_then_normal(target: Target) -> None:
    ctrl = await host(target)
    try:
        rule = target.add_fault(FaultSpec("not_ready", nsid=1), for_ms=400)
        err = await status_of_read(ctrl)
        assert err.status == Status.NS_NOT_READY and not err.dnr
        await read(ctrl, 2)  # namespace 2 is ready
        await ctrl.identify_controller()  # admin commands are not selected
        assert rule.hits == 1
        await asyncio.wait_for(rules_gone(target), 5)
        await read(ctrl)
    finally:
        await ctrl.close()


async def test_not_ready_sends_crd_to_a_host_that_enabled_acre(target: Target) -> None:
    spec = FaultSpec("not_ready", nsid=1, crd=1)
    with pytest.raises(ChangeError) as refused:
        target.add_fault(spec)
    assert refused.value.field == "crd"  # CRDT1 is 0
    target.set_crdt((2, 0, 0))
    target.add_fault(spec)
    ctrl = await host(target)
    try:
        assert (await status_of_read(ctrl)).raw_status & CRD_MASK == 0  # no ACRE yet
        behavior = bytearray(HOST_BEHAVIOR_SIZE)
        behavior[0] = 1  # ACRE
        await ctrl.set_features(FeatureId.HOST_BEHAVIOR, data=behavior)
        err = await status_of_read(ctrl)
        assert err.status == Status.NS_NOT_READY and not err.dnr
        assert (err.raw_status & CRD_MASK) >> CRD_SHIFT == 1
    finally:
        await ctrl.close()


# -- keep-alive starvation -----------------------------------------------------------------


async def test_keep_alive_starvation_the_host_gives_up_and_reconnects(target: Target) -> None:
    rule = target.add_fault(FaultSpec("drop", subsystem=NQN, opcode="keep_alive"))
    ctrl = await host(target, kato_ms=600)
    try:

        async def read_until_dropped() -> None:
            while True:  # I/O goes on (traffic: the target's KATO timer is content)
                try:
                    await read(ctrl)
                except NvmeConnectionError:
                    return
                await asyncio.sleep(0.05)

        # The host's keep alive times out: it drops the association, I/O fails fast.
        await asyncio.wait_for(read_until_dropped(), 10)
        assert rule.hits >= 1
        assert target.counters.keep_alive_expiries == 0
        with pytest.raises(NvmeConnectionError):
            await read(ctrl)
    finally:
        await ctrl.close()
    target.remove_fault(rule.id)
    again = await host(target, kato_ms=600)
    try:
        await read(again)
    finally:
        await again.close()


async def test_a_starved_idle_controller_expires_at_the_target(target: Target) -> None:
    """A dropped Keep Alive is no traffic: with no I/O either, the target's own KATO timer
    tears the controller down."""
    target.add_fault(FaultSpec("drop", subsystem=NQN, opcode="keep_alive"))
    expiries = target.counters.keep_alive_expiries
    ctrl = await host(target, kato_ms=600)
    try:
        while target.counters.keep_alive_expiries == expiries:
            await asyncio.sleep(0.05)
    finally:
        await ctrl.close()
    assert not target.subsystems[NQN].controllers


# -- fail_controller ------------------------------------------------------------------------


async def test_a_failed_controller_shows_cfs_answers_nothing_and_a_new_one_is_healthy(
    target: Target,
) -> None:
    failed = await host(target, hostnqn=HOST_A, kato_ms=0)
    other = await host(target, hostnqn=HOST_B, kato_ms=0)
    try:
        rule = target.add_fault(FaultSpec("fail_controller", host=HOST_A))
        assert rule.hits == 1 and rule.matches == 1
        assert failed.admin is not None
        csts = await fabrics.property_get(failed.admin, C.PROP_CSTS)
        assert csts & C.CSTS_CFS
        pending = asyncio.ensure_future(read(failed))
        admin = asyncio.ensure_future(failed.identify_controller())
        done, _ = await asyncio.wait([pending, admin], timeout=0.5)
        assert not done  # nothing answered
        await read(other)  # the other host's controller is healthy
        assert other.admin is not None
        assert not await fabrics.property_get(other.admin, C.PROP_CSTS) & C.CSTS_CFS
    finally:
        await failed.close()
        await other.close()
    for fut in (pending, admin):
        with pytest.raises(NvmeConnectionError):
            await fut
    # The host resets: a new association, while the rule is still in force, is healthy.
    again = await host(target, hostnqn=HOST_A)
    try:
        await read(again)
        assert again.admin is not None
        assert not await fabrics.property_get(again.admin, C.PROP_CSTS) & C.CSTS_CFS
        assert rule.hits == 1
    finally:
        await again.close()


async def test_fail_controller_with_a_limit_fails_that_many(target: Target) -> None:
    hosts = [await host(target, hostnqn=nqn, kato_ms=0) for nqn in (HOST_A, HOST_B)]
    try:
        rule = target.add_fault(FaultSpec("fail_controller", subsystem=NQN, limit=1))
        assert rule.hits == 1
        failed = [c.failed for c in target.subsystems[NQN].controllers.values()]
        assert sorted(failed) == [False, True]
    finally:
        for ctrl in hosts:
            await ctrl.close()


async def test_fail_controller_selecting_no_controller_is_refused(target: Target) -> None:
    with pytest.raises(ChangeError) as err:
        target.add_fault(FaultSpec("fail_controller", subsystem=NQN))
    assert err.value.field == "subsystem"
    assert not target.faults.rules


# -- ana_flap -------------------------------------------------------------------------------


async def ana_log(ctrl: Controller) -> AnaLog:
    return AnaLog.unpack(await ctrl.get_log_page(LogPageId.ANA, ANA_LOG_MAX))


async def test_ana_flap_on_one_listener_sends_ana_change_and_restores(target: Target) -> None:
    flapping = await host(target, 1)
    steady = await host(target, 0)
    try:
        for ctrl in (flapping, steady):
            await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.ANA_CHANGE)
        port = target.ports[1]
        rule = target.add_fault(
            FaultSpec(
                "ana_flap",
                subsystem=NQN,
                anagrpid=1,
                ana_states=("inaccessible", "optimized"),
                traddr=port.address,
                trsvcid=port.port,
                period_ms=200,
            )
        )
        seen = []
        for _ in range(3):
            event = await asyncio.wait_for(
                flapping.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST), 5
            )
            assert event == ANA_EVENT
            seen.append((await ana_log(flapping)).groups[0].state)
        assert AnaState.INACCESSIBLE in seen and AnaState.OPTIMIZED in seen
        assert rule.hits >= 3
        # The other listener's path stays optimized; its host got no event.
        assert (await ana_log(steady)).groups[0].state == AnaState.OPTIMIZED
        steady_aer = asyncio.ensure_future(steady.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await read(steady)
        target.remove_fault(rule.id)
        await read(steady)  # an event would have completed the AER before this
        assert not steady_aer.done()
        await read(flapping)  # put back: optimized
        assert (await ana_log(flapping)).groups[0].state == AnaState.OPTIMIZED
    finally:
        await flapping.close()
        await steady.close()


async def test_an_inaccessible_path_fails_io_with_the_ana_status(target: Target) -> None:
    ctrl = await host(target)
    try:
        target.add_fault(
            FaultSpec(
                "ana_flap",
                subsystem=NQN,
                anagrpid=1,
                ana_states=("inaccessible", "optimized"),
                period_ms=60_000,
            )
        )
        err = await status_of_read(ctrl)
        assert err.status == Status.ANA_INACCESSIBLE and not err.dnr
    finally:
        await ctrl.close()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (FaultSpec("ana_flap", subsystem=NQN, anagrpid=5, period_ms=500), "anagrpid"),
        (
            FaultSpec(
                "ana_flap", subsystem=NQN, anagrpid=1, traddr="127.0.0.9", trsvcid=1, period_ms=500
            ),
            "traddr",
        ),
        (
            FaultSpec(
                "ana_flap", subsystem="nqn.2024-01.io.pynvmf.test:no", anagrpid=1, period_ms=500
            ),
            "subsystem",
        ),
    ],
)
async def test_an_ana_flap_naming_nothing_is_refused(
    target: Target, spec: FaultSpec, field: str
) -> None:
    with pytest.raises(ChangeError) as err:
        target.add_fault(spec)
    assert err.value.field == field
    assert not target.faults.rules


# -- aen_storm ------------------------------------------------------------------------------


async def test_an_aen_storm_is_bounded_by_the_hosts_aers(target: Target) -> None:
    ctrl = await host(target)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        rule = target.add_fault(FaultSpec("aen_storm", event="ns_attr", period_ms=100, limit=3))
        for _ in range(3):
            event = await asyncio.wait_for(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST), 5)
            assert event == NS_ATTR_EVENT
            changed = await ctrl.get_log_page(LogPageId.CHANGED_NS, 8)
            assert changed[:4] == (1).to_bytes(4, "little")  # namespace 1 first
        assert rule.hits == 3
        # The limit is spent: no further event, though an AER waits.
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        done, _ = await asyncio.wait([aer], timeout=0.4)
        assert not done and rule.hits == 3
    finally:
        await ctrl.close()


async def test_no_aer_no_event_queued(target: Target) -> None:
    ctrl = await host(target)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.ANA_CHANGE)
        rule = target.add_fault(FaultSpec("aen_storm", event="ana_change", period_ms=100))
        while rule.matches < 3:  # ticks with no AER outstanding
            await asyncio.sleep(0.05)
        assert rule.hits == 0
        (ctrl_t,) = target.subsystems[NQN].controllers.values()
        assert not ctrl_t.pending_events
        event = await asyncio.wait_for(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST), 5)
        assert event == ANA_EVENT and rule.hits == 1
        target.remove_fault(rule.id)
    finally:
        await ctrl.close()


# -- the RPC --------------------------------------------------------------------------------


async def test_the_rpc_adds_a_controller_level_rule_for_a_while(
    raw_rpc_target: RawRpcTarget,
) -> None:
    rule_id = await raw_rpc_target.ok(
        "pynvmf_fault_add", action="not_ready", subsystem=RAW_SUBNQN, nsid=1, for_ms=300
    )
    (listed,) = await raw_rpc_target.ok("pynvmf_fault_list")
    assert listed["id"] == rule_id and listed["rule"]["action"] == "not_ready"
    await asyncio.wait_for(rules_gone(raw_rpc_target.target), 5)
    flap = await raw_rpc_target.ok(
        "pynvmf_fault_add",
        action="ana_flap",
        subsystem=RAW_SUBNQN,
        anagrpid=1,
        ana_states=["non_optimized", "optimized"],
        period_ms=1000,
    )
    (listed,) = await raw_rpc_target.ok("pynvmf_fault_list")
    assert listed["rule"]["ana_states"] == ["non_optimized", "optimized"]
    assert listed["hits"] == 1  # the first state at once
    assert await raw_rpc_target.ok("pynvmf_fault_remove", id=flap)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        (
            {"action": "ana_flap", "subsystem": RAW_SUBNQN, "anagrpid": 1, "period_ms": 5},
            "period_ms:",
        ),
        (
            {
                "action": "ana_flap",
                "subsystem": RAW_SUBNQN,
                "anagrpid": 1,
                "period_ms": 500,
                "ana_states": ["optimized", "sleepy"],
            },
            "ana_states:",
        ),
        ({"action": "aen_storm", "event": "fire", "period_ms": 500}, "event:"),
        ({"action": "fail_controller", "subsystem": RAW_SUBNQN}, "subsystem:"),
        ({"action": "fail_controller", "opcode": "read"}, "opcode:"),
        ({"action": "not_ready"}, "nsid:"),
        ({"action": "not_ready", "nsid": 1, "queue": "admin"}, "queue:"),
        ({"action": "drop", "period_ms": 500}, "period_ms:"),
        ({"action": "not_ready", "subsystem": RAW_SUBNQN, "nsid": 1, "for_ms": -1}, "for_ms:"),
    ],
)
async def test_the_rpc_refuses_a_bad_controller_level_rule(
    raw_rpc_target: RawRpcTarget, params: dict[str, object], named: str
) -> None:
    answer = await raw_rpc_target.call("pynvmf_fault_add", **params)
    assert answer["error"]["code"] == INVALID_PARAMS
    assert answer["error"]["message"].startswith(named), answer
    assert await raw_rpc_target.ok("pynvmf_fault_list") == []


async def test_a_scenario_runs_a_not_ready_window_and_a_flap(target: Target) -> None:
    ctrl = await host(target)
    try:
        target.schedule_faults(
            parse_scenario(
                [
                    {"action": "not_ready", "nsid": 1, "for_ms": 1000},
                    {
                        "action": "ana_flap",
                        "subsystem": NQN,
                        "anagrpid": 1,
                        "ana_states": ["inaccessible", "optimized"],
                        "period_ms": 60_000,
                        "at_ms": 50,
                        "for_ms": 1000,
                    },
                ]
            )
        )
        assert (await status_of_read(ctrl)).status == Status.NS_NOT_READY
        while len(target.faults.rules) < 2:  # the flap's at_ms
            await asyncio.sleep(0.01)
        assert (await status_of_read(ctrl, 2)).status == Status.ANA_INACCESSIBLE
        await asyncio.wait_for(rules_gone(target), 5)
        await read(ctrl)  # both ended: ready, and optimized again
        await read(ctrl, 2)
    finally:
        await ctrl.close()
