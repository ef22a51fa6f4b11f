"""Per-host namespace visibility (SPDK's no_auto_visible, nvmf_ns_add_host and
nvmf_ns_remove_host) as hosts see it: the active namespace list, Identify, I/O, the
Changed Namespace List and its event, each host by its own view; and what a detach does
to a write in flight."""

from __future__ import annotations

import asyncio

import pytest

from pynvmf.config.native import apply_config, config_of
from pynvmf.config.spdk import spdk_config
from pynvmf.host import NvmeError
from pynvmf.host.controller import Controller
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_SUBNQN, RawRpcTarget
from tests.protocol.test_rpc_live import RawRpc
from tests.support import raw as R

pytestmark = pytest.mark.timeout(120)

HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-4000-8000-00000000000b"


async def _hidden(raw_rpc_target: RawRpcTarget, name: str = "Hidden0") -> int:
    await raw_rpc_target.ok("bdev_malloc_create", name=name, num_blocks=1024, block_size=512)
    nsid: int = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns",
        nqn=RAW_SUBNQN,
        namespace={"bdev_name": name, "no_auto_visible": True},
    )
    return nsid


def _arm(ctrl: Controller) -> asyncio.Future[int]:
    return asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))


async def _identify(ctrl: Controller, cns: int, nsid: int) -> bytearray:
    buf = bytearray(I.IDENTIFY_DATA_SIZE)
    await ctrl.admin_command(AdminOpcode.IDENTIFY, nsid, cns, into=memoryview(buf))
    return buf


async def _active(ctrl: Controller) -> list[int]:
    return I.NsIdList.unpack(await _identify(ctrl, I.Cns.NS_ACTIVE_LIST, 0)).nsids


async def _read_status(ctrl: Controller, nsid: int) -> int:
    try:
        await ctrl.io_command(IoOpcode.READ, nsid, 0, 0, 0, into=memoryview(bytearray(512)))
    except NvmeError as exc:
        return exc.status & 0x7FF
    return Status.SUCCESS


async def test_a_hidden_namespace_is_seen_by_the_host_it_is_added_to_only(
    raw_rpc_target: RawRpcTarget,
) -> None:
    a, b = await raw_rpc_target.host(HOST_A), await raw_rpc_target.host(HOST_B)
    try:
        event_a, event_b = _arm(a), _arm(b)
        await asyncio.sleep(0)
        nsid = await _hidden(raw_rpc_target)
        # Added for nobody: no host is told, none sees it, none may use it.
        for ctrl in (a, b):
            assert nsid not in await _active(ctrl)
            assert await _read_status(ctrl, nsid) == Status.INVALID_NS
        assert not event_a.done() and not event_b.done()

        assert await raw_rpc_target.ok("nvmf_ns_add_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST_A)
        await asyncio.wait_for(event_a, 10)
        changed = L.ChangedNsList.unpack(await a.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [nsid]
        assert nsid in await _active(a)
        assert await _read_status(a, nsid) == Status.SUCCESS
        assert (await a.identify_namespace(nsid)).nsze == 1024
        # The other host: no event (a round trip on its admin queue came after the
        # change, which told A at once), nothing in its list, zeroes from Identify.
        await b.admin_command(AdminOpcode.KEEP_ALIVE)
        assert not event_b.done()
        assert nsid not in await _active(b)
        assert not any(await _identify(b, I.Cns.NS, nsid))
        assert await _read_status(b, nsid) == Status.INVALID_NS
        assert (
            L.ChangedNsList.unpack(await b.get_log_page(L.LogPageId.CHANGED_NS, 4096)).nsids == []
        )

        event_a = _arm(a)
        assert await raw_rpc_target.ok(
            "nvmf_ns_remove_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST_A
        )
        await asyncio.wait_for(event_a, 10)
        assert L.ChangedNsList.unpack(await a.get_log_page(L.LogPageId.CHANGED_NS, 4096)).nsids == [
            nsid
        ]
        assert nsid not in await _active(a)
        assert await _read_status(a, nsid) == Status.INVALID_NS
        await b.admin_command(AdminOpcode.KEEP_ALIVE)
        assert not event_b.done()
    finally:
        for ctrl in (a, b):
            await ctrl.close()


async def test_a_host_connecting_later_gets_its_view(raw_rpc_target: RawRpcTarget) -> None:
    nsid = await _hidden(raw_rpc_target)
    assert await raw_rpc_target.ok("nvmf_ns_add_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST_B)
    a, b = await raw_rpc_target.host(HOST_A), await raw_rpc_target.host(HOST_B)
    try:
        assert nsid not in await _active(a)
        assert nsid in await _active(b)
        assert await _read_status(b, nsid) == Status.SUCCESS
    finally:
        for ctrl in (a, b):
            await ctrl.close()


async def test_bad_visibility_changes_name_the_parameter_and_change_nothing(
    raw_rpc_target: RawRpcTarget,
) -> None:
    nsid = await _hidden(raw_rpc_target)
    cases = [
        ({"nsid": 1, "host": HOST_A}, "nsid"),  # namespace 1 is visible to every host
        ({"nsid": nsid, "host": "not an nqn"}, "host"),
        ({"nsid": 77, "host": HOST_A}, "nsid"),
        ({"nsid": 0, "host": HOST_A}, "nsid"),
    ]
    for params, field in cases:
        for method in ("nvmf_ns_add_host", "nvmf_ns_remove_host"):
            answer = await raw_rpc_target.call(method, nqn=RAW_SUBNQN, **params)
            assert answer["error"]["code"] == -32602, answer
            assert answer["error"]["message"].startswith(f"{field}:"), answer
    answer = await raw_rpc_target.call(
        "nvmf_ns_add_host", nqn="nqn.2024-01.io.pynvmf:none", nsid=nsid, host=HOST_A
    )
    assert "error" in answer
    namespaces = raw_rpc_target.target.subsystems[RAW_SUBNQN].namespaces
    assert namespaces[nsid].hosts == set() and namespaces[1].auto_visible


async def test_the_views_are_saved_in_both_configurations(raw_rpc_target: RawRpcTarget) -> None:
    nsid = await _hidden(raw_rpc_target)
    await raw_rpc_target.ok("nvmf_ns_add_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST_B)
    spdk = spdk_config(raw_rpc_target.target)  # what SPDK's rpc.py save_config writes
    (nvmf,) = [s for s in spdk["subsystems"] if s["subsystem"] == "nvmf"]
    calls = [c for c in nvmf["config"] if c["params"].get("nqn") == RAW_SUBNQN]
    (add_ns,) = [
        c
        for c in calls
        if c["method"] == "nvmf_subsystem_add_ns" and c["params"]["namespace"]["nsid"] == nsid
    ]
    assert add_ns["params"]["namespace"]["no_auto_visible"] is True
    add_host = [c for c in calls if c["method"] == "nvmf_ns_add_host"]
    assert add_host == [
        {"method": "nvmf_ns_add_host", "params": {"nqn": RAW_SUBNQN, "nsid": nsid, "host": HOST_B}}
    ]
    (sub,) = [s for s in await raw_rpc_target.ok("nvmf_get_subsystems") if s["nqn"] == RAW_SUBNQN]
    (shown,) = [n for n in sub["namespaces"] if n["nsid"] == nsid]
    assert shown["no_auto_visible"] is True and shown["hosts"] == [{"nqn": HOST_B}]

    native = config_of(raw_rpc_target.target)
    (spec,) = [s for s in native["subsystems"] if s["nqn"] == RAW_SUBNQN]
    (ns_spec,) = [n for n in spec["namespaces"] if n["nsid"] == nsid]
    assert ns_spec["auto_visible"] is False and ns_spec["hosts"] == [HOST_B]
    again = Target()
    await apply_config(again, native)
    restored = again.subsystems[RAW_SUBNQN].namespaces[nsid]
    assert not restored.auto_visible and restored.hosts == {HOST_B}
    assert again.subsystems[RAW_SUBNQN].namespaces[1].auto_visible


async def test_a_write_in_flight_completes_before_the_detach_returns(
    raw_rpc_target: RawRpcTarget,
) -> None:
    nsid = await _hidden(raw_rpc_target, "Flight0")
    await raw_rpc_target.ok("nvmf_ns_add_host", nqn=RAW_SUBNQN, nsid=nsid, host=R.HOSTNQN)
    host = await raw_rpc_target.raw.host()
    io = host.io[0]
    await io.detach()
    nblocks = 64  # 32 KiB: above the in-capsule size, so the target asks for it with R2T
    io.send(io.capsule(R.rw_sqe(IoOpcode.WRITE, 9, nsid, 100, nblocks, nblocks * RAW_NS1_BLOCK)))
    r2t = await io.recv_pdu()
    assert r2t.type == R.P.PduType.R2T
    cccid, ttag, _offset, length = r2t.data_fields()
    rpc = await RawRpc.open(raw_rpc_target.socket)
    rpc.request("nvmf_ns_remove_host", nqn=RAW_SUBNQN, nsid=nsid, host=R.HOSTNQN)
    answer = asyncio.ensure_future(rpc.recv(timeout=30))
    ctrl = next(iter(raw_rpc_target.target.subsystems[RAW_SUBNQN].controllers.values()))
    async with asyncio.timeout(10):
        while nsid in ctrl.namespaces:  # detached: no new command reaches it
            await asyncio.sleep(0.01)
    assert not answer.done()
    payload = bytes(range(256)) * (length // 256)
    io.send(R.h2c_data(cccid, ttag, 0, payload))
    resp = await io.recv_pdu()
    assert resp.cqe().cid == 9 and resp.cqe().status == 0
    assert (await answer)["result"] is True
    back = bytearray(length)
    await raw_rpc_target.target.block_devices["Flight0"].device.read(100, memoryview(back))
    assert back == payload
    io.send(io.capsule(R.rw_sqe(IoOpcode.READ, 10, nsid, 100, 1, RAW_NS1_BLOCK)))
    resp = await io.recv_pdu()
    assert resp.cqe().status & 0x7FF == Status.INVALID_NS
    await rpc.close()
