"""SPDK's RPCs for NVMe/RDMA over the RPC socket of a running target: the RDMA transport
(nvmf_create_transport -t RDMA, nvmf_get_transports) and rdma listeners
(nvmf_subsystem_add_listener / remove_listener / get_listeners with trtype RDMA, IPv4 and
IPv6), seen in the discovery log as TRTYPE rdma.

These machines have no pyverbs and no RDMA device: a listener that cannot open is refused
naming listen_address.trtype, nothing applied. The tests of what follows a listener that
opens stand the RDMA CM listener in with a stub (`pynvmf.rdma.verbs.listen`); the real one
is the guest's (tests/interop/test_linux_rdma_host.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.host import connect, discover
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.rdma import host_verbs, verbs
from pynvmf.rpc.client import RpcClient, RpcClientError
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.spec import logpages as L
from pynvmf.target.port import Port
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_SUBNQN, RawTarget, RawTargetFactory
from tests.support.scrape import samples_of, value
from tests.unit.test_rdma_host_queue import LoopbackFabric

pytestmark = pytest.mark.timeout(60)


class Rig:
    def __init__(self, raw: RawTarget, socket: str) -> None:
        self.raw = raw
        self.socket = socket

    @property
    def target(self) -> Target:
        return self.raw.target

    async def call(self, method: str, **params: Any) -> Any:
        def call() -> Any:
            with RpcClient(self.socket) as client:
                return client.call(method, params)

        return await asyncio.to_thread(call)


@pytest.fixture
async def rig(raw_target_factory: RawTargetFactory, tmp_path: Path) -> AsyncIterator[Rig]:
    raw = await raw_target_factory()
    server = RpcServer(control_plane(raw.target))
    path = str(tmp_path / "rpc.sock")
    await server.listen_unix(path)
    yield Rig(raw, path)
    await server.close()


class StubListener:
    """What verbs.listen returns, without the RDMA CM."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass


@pytest.fixture
def rdma_opens(monkeypatch: pytest.MonkeyPatch) -> list[Port]:
    """rdma ports open (with a stub listener); the ports opened, in order."""
    opened: list[Port] = []

    async def listen(target: Target, port: Port) -> StubListener:
        opened.append(port)
        return StubListener()

    monkeypatch.setattr(verbs, "listen", listen)
    return opened


def rdma(address: str, port: int, adrfam: str = "IPv4") -> dict[str, str]:
    return {"trtype": "RDMA", "adrfam": adrfam, "traddr": address, "trsvcid": str(port)}


async def test_the_rdma_transport_is_created_once_and_listed(rig: Rig) -> None:
    transports = await rig.call("nvmf_get_transports")
    assert [t["trtype"] for t in transports] == ["TCP"]
    await rig.call(
        "nvmf_create_transport",
        trtype="RDMA",
        in_capsule_data_size=4096,
        max_queue_depth=128,
        max_io_size=transports[0]["max_io_size"],
        num_shared_buffers=4095,  # SPDK's buffers: pynvmf has none, nothing to apply
    )
    transports = await rig.call("nvmf_get_transports")
    assert [t["trtype"] for t in transports] == ["TCP", "RDMA"]
    tcp, rdma_transport = transports
    assert rdma_transport["in_capsule_data_size"] == 4096
    assert rdma_transport["max_queue_depth"] == 128
    assert tcp["in_capsule_data_size"] == rig.target.transport.inline_data_size != 4096
    assert await rig.call("nvmf_get_transports", trtype="rdma") == [rdma_transport]
    with pytest.raises(RpcClientError, match="trtype: transport type 'RDMA' already exists"):
        await rig.call("nvmf_create_transport", trtype="RDMA")


async def test_a_limit_pynvmf_cannot_honour_is_refused_and_no_transport_made(rig: Rig) -> None:
    with pytest.raises(RpcClientError, match="max_aq_depth: 128: pynvmf's RDMA transport has 32"):
        await rig.call("nvmf_create_transport", trtype="RDMA", max_aq_depth=128)
    assert [t["trtype"] for t in await rig.call("nvmf_get_transports")] == ["TCP"]


async def test_an_rdma_listener_that_cannot_open_is_refused_and_nothing_applied(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No pyverbs here (and none even where rdma-core is installed: the import fails).
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    monkeypatch.setitem(sys.modules, "pyverbs.cmid", None)
    await rig.call("nvmf_create_transport", trtype="RDMA")
    ports = list(rig.target.ports)
    genctr = rig.target.genctr
    with pytest.raises(RpcClientError) as info:
        await rig.call(
            "nvmf_subsystem_add_listener", nqn=RAW_SUBNQN, listen_address=rdma("127.0.0.1", 4420)
        )
    assert str(info.value).startswith(
        "listen_address.trtype: cannot listen on rdma:127.0.0.1:4420: "
    ), info.value
    assert "pyverbs" in str(info.value)
    assert rig.target.ports == ports
    assert rig.target.genctr == genctr
    listeners = await rig.call("nvmf_subsystem_get_listeners", nqn=RAW_SUBNQN)
    assert all(entry["address"]["trtype"] == "TCP" for entry in listeners)


async def test_rdma_listeners_added_listed_in_discovery_and_removed(
    rig: Rig, rdma_opens: list[Port]
) -> None:
    tcp = rig.target.ports[0]
    await rig.call("nvmf_create_transport", trtype="RDMA", in_capsule_data_size=8192)
    # The same address and number as the TCP port: another transport, another listener.
    await rig.call(
        "nvmf_subsystem_add_listener", nqn=RAW_SUBNQN, listen_address=rdma(tcp.address, tcp.port)
    )
    await rig.call(
        "nvmf_subsystem_add_listener", nqn=RAW_SUBNQN, listen_address=rdma("::1", 4420, "IPv6")
    )
    assert [(p.trtype, p.address, p.transport.inline_data_size) for p in rdma_opens] == [
        ("rdma", tcp.address, 8192),
        ("rdma", "::1", 8192),
    ]
    listeners = [
        e["address"] for e in await rig.call("nvmf_subsystem_get_listeners", nqn=RAW_SUBNQN)
    ]
    assert rdma(tcp.address, tcp.port) in listeners
    assert rdma("::1", 4420, "IPv6") in listeners
    assert {
        "trtype": "TCP",
        "adrfam": "IPv4",
        "traddr": tcp.address,
        "trsvcid": str(tcp.port),
    } in listeners

    # save_config writes the RDMA transport and its listeners.
    config = await rig.call("framework_get_config", name="nvmf")
    transports = [c["params"] for c in config if c["method"] == "nvmf_create_transport"]
    assert [(t["trtype"], t["in_capsule_data_size"]) for t in transports][1:] == [("RDMA", 8192)]
    listened = [
        c["params"]["listen_address"]
        for c in config
        if c["method"] == "nvmf_subsystem_add_listener" and c["params"]["nqn"] == RAW_SUBNQN
    ]
    assert rdma("::1", 4420, "IPv6") in listened

    entries = [e for e in await discover(tcp.address, tcp.port) if e.subnqn == RAW_SUBNQN]
    seen = {(e.trtype, e.adrfam, e.traddr, e.trsvcid) for e in entries}
    assert (L.TrType.RDMA, L.AdrFam.IPV4, tcp.address, str(tcp.port)) in seen
    assert (L.TrType.RDMA, L.AdrFam.IPV6, "::1", "4420") in seen
    assert (L.TrType.TCP, L.AdrFam.IPV4, tcp.address, str(tcp.port)) in seen

    await rig.call(
        "nvmf_subsystem_remove_listener",
        nqn=RAW_SUBNQN,
        listen_address=rdma(tcp.address, tcp.port),
    )
    listeners = [
        e["address"] for e in await rig.call("nvmf_subsystem_get_listeners", nqn=RAW_SUBNQN)
    ]
    assert rdma(tcp.address, tcp.port) not in listeners
    # The TCP listener on the same address and number stays.
    assert any(e["trtype"] == "TCP" and e["trsvcid"] == str(tcp.port) for e in listeners)
    assert any(p is tcp for p in rig.target.ports)
    with pytest.raises(RpcClientError, match=r"listen_address\.traddr: the target does not listen"):
        await rig.call(
            "nvmf_subsystem_remove_listener",
            nqn=RAW_SUBNQN,
            listen_address=rdma(tcp.address, tcp.port),
        )


# -- pynvmf_add_port with trtype rdma ---------------------------------------------------------


async def test_pynvmf_add_port_opens_an_rdma_port_beside_the_tcp_one_and_removes_it(
    rig: Rig, rdma_opens: list[Port]
) -> None:
    tcp = rig.target.ports[0]
    await rig.call("nvmf_create_transport", trtype="RDMA", in_capsule_data_size=8192)
    number = await rig.call("pynvmf_add_port", address=tcp.address, port=tcp.port, trtype="rdma")
    assert number == tcp.port
    # The RDMA transport's options, not the TCP port's.
    [port] = rdma_opens
    assert (port.trtype, port.address, port.transport.inline_data_size) == (
        "rdma",
        tcp.address,
        8192,
    )
    assert not port.transport.allow_header_digest and not port.transport.allow_data_digest
    entries = await discover(tcp.address, tcp.port)
    assert (L.TrType.RDMA, RAW_SUBNQN) in {(e.trtype, e.subnqn) for e in entries}
    # The same address and number: trtype says which one goes.
    await rig.call("pynvmf_remove_port", address=tcp.address, port=tcp.port, trtype="rdma")
    assert [p.trtype for p in rig.target.ports] == ["tcp"]
    assert rig.target.ports[0] is tcp
    with pytest.raises(RpcClientError, match=r"port: the target does not listen on .* \(rdma\)"):
        await rig.call("pynvmf_remove_port", address=tcp.address, port=tcp.port, trtype="rdma")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"trtype": "fc"}, "trtype: 'fc' is not one of tcp, rdma"),
        ({"trtype": "rdma", "header_digest": True}, "header_digest: digests are NVMe/TCP's"),
        ({"trtype": "rdma", "data_digest": True}, "data_digest: digests are NVMe/TCP's"),
        ({"trtype": "rdma", "discovery_only": True}, "discovery_only: an rdma port answers"),
        ({"trtype": "rdma", "secure_channel": "required"}, "secure_channel: TLS is NVMe/TCP's"),
    ],
)
async def test_pynvmf_add_port_refuses_what_an_rdma_port_cannot_have(
    rig: Rig, rdma_opens: list[Port], params: dict[str, Any], message: str
) -> None:
    ports = list(rig.target.ports)
    with pytest.raises(RpcClientError, match=message):
        await rig.call("pynvmf_add_port", address="127.0.0.1", port=4420, **params)
    assert rig.target.ports == ports and rdma_opens == []


async def test_pynvmf_add_port_rdma_without_pyverbs_names_trtype_and_applies_nothing(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    monkeypatch.setitem(sys.modules, "pyverbs.cmid", None)
    ports = list(rig.target.ports)
    with pytest.raises(RpcClientError) as info:
        await rig.call("pynvmf_add_port", address="127.0.0.1", port=4420, trtype="rdma")
    assert str(info.value).startswith("trtype: cannot listen on rdma:127.0.0.1:4420: ")
    assert "pyverbs" in str(info.value)
    assert rig.target.ports == ports


# -- nvmf_get_stats: the RDMA transport's counters --------------------------------------------


def rdma_stats(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Each poll group's RDMA transport entry."""
    return [t for g in stats["poll_groups"] for t in g["transports"] if t["trtype"] == "RDMA"]


async def test_nvmf_get_stats_shows_the_rdma_queues_counters_as_spdk_shapes_them(
    rig: Rig, rdma_opens: list[Port], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No RDMA transport yet: only TCP's entry, as SPDK without nvmf_create_transport -t RDMA.
    assert rdma_stats(await rig.call("nvmf_get_stats")) == []
    await rig.call("nvmf_create_transport", trtype="RDMA")
    [group] = rdma_stats(await rig.call("nvmf_get_stats"))
    assert group == {"trtype": "RDMA", "pending_data_buffer": 0, "devices": []}

    tcp = rig.target.ports[0]
    await rig.call(
        "nvmf_subsystem_add_listener", nqn=RAW_SUBNQN, listen_address=rdma(tcp.address, tcp.port)
    )
    [port] = rdma_opens
    # The host library's rdma queues, joined in memory to the target's RDMA queues (the
    # loopback of tests/unit/test_rdma_host_queue.py), which count into the port's tally.
    fabric = LoopbackFabric(rig.target, port)
    monkeypatch.setattr(host_verbs, "open_queue", fabric.open_queue)
    ctrl = await connect(tcp.address, tcp.port, RAW_SUBNQN, trtype="rdma", queues=1, kato_ms=0)
    try:
        ns = ctrl.namespaces[1]
        await ns.write(0, b"\x01" * 4096)  # in the capsule
        await ns.write(64, b"\x02" * 65536)  # above the 16 KiB in-capsule size: RDMA READ
        await ns.read(0, memoryview(bytearray(8192)))  # RDMA WRITE
        [group] = rdma_stats(await rig.call("nvmf_get_stats"))
    finally:
        await ctrl.close()
    [device] = group["devices"]
    spdk_fields = {
        "name", "polls", "idle_polls", "completions", "requests", "request_latency",
        "pending_free_request", "pending_rdma_read", "pending_rdma_write", "pending_rdma_send",
        "total_send_wrs", "send_doorbell_updates", "total_recv_wrs", "recv_doorbell_updates",
    }  # fmt: skip
    assert spdk_fields <= device.keys()
    assert device["name"] == f"rdma:{tcp.address}:{tcp.port}"
    assert device["queues_opened"] == device["queues_alive"] == 2
    # The I/O queue's Connect (1 KiB) and the 4 KiB write came in capsules.
    assert device["in_capsule_bytes"] >= 1024 + 4096
    assert device["rdma_reads"] >= 2  # the 64 KiB write, and the admin Connect's data
    assert device["rdma_writes"] >= 2  # the read, and the Identify data
    assert device["requests"] >= 5 and device["completions"] > device["requests"]
    assert device["total_send_wrs"] >= device["requests"] + 4
    # The queues ended: what they counted stays.
    [group] = rdma_stats(await rig.call("nvmf_get_stats"))
    [after] = group["devices"]
    assert after["queues_alive"] == 0
    # The Prometheus endpoint reads the same tallies.
    m = samples_of(MetricsEndpoint(rig.target).exposition().decode())
    listener = after["name"]
    assert value(m, "pynvmf_rdma_commands_total", listener=listener) == after["requests"]
    assert (
        value(m, "pynvmf_rdma_in_capsule_bytes_total", listener=listener)
        == (after["in_capsule_bytes"])
    )
    assert (
        value(m, "pynvmf_rdma_transfers_total", listener=listener, op="read")
        == (after["rdma_reads"])
    )
    assert (
        value(m, "pynvmf_rdma_transfers_total", listener=listener, op="write")
        == (after["rdma_writes"])
    )
    assert value(m, "pynvmf_rdma_queues_total", listener=listener) == 2
    assert after["requests"] >= device["requests"] and after["rdma_reads"] >= device["rdma_reads"]
