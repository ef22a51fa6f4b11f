"""The gateway group's shared configuration (pynvmf.ha.shared) on the test cluster: two
gateways (two Targets in this process, each with its own RPC server) on one pool and
one group object. What the RPC changes on one appears on the other, whose host can do
I/O to it; removals follow; changes made on both at once are both kept; a gateway
started later gets everything; bad object content is named and left, and the gateway
goes on serving. A namespace's hosts and ANA group change in place on every gateway,
and keys written by earlier gateways still load."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import build_target
from pynvmf.ha.gateway import Gateway, GatewayConfig
from pynvmf.ha.lease import OBJECT_PREFIX as LEASE_PREFIX
from pynvmf.ha.shared import VERSION_KEY, SharedConfig
from pynvmf.host import connect
from pynvmf.host.controller import Controller
from pynvmf.rpc.client import RpcClient
from pynvmf.rpc.methods import ControlPlane
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.identify import Oaes
from pynvmf.spec.logpages import AnaState as S
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.target.target import Target
from tests.support.ceph_cluster import CephCluster

MiB = 1 << 20
NQN1 = "nqn.2024-11.dev.pynvmf:shared-one"
NQN2 = "nqn.2024-11.dev.pynvmf:shared-two"
HOST = "nqn.2014-08.org.nvmexpress:uuid:5e0f3a3c-0d6b-4c57-9d0f-0000000000a1"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:5e0f3a3c-0d6b-4c57-9d0f-0000000000b2"
GROUP = 23  # a lease object of its own in the shared pool
_objects = itertools.count()


@dataclass
class Gw:
    target: Target
    shared: SharedConfig
    cp: ControlPlane
    rpc: RpcServer
    socket: str

    async def call(self, method: str, **params: Any) -> Any:
        def call() -> Any:
            with RpcClient(self.socket) as client:
                return client.call(method, params)

        return await asyncio.to_thread(call)

    @property
    def port(self) -> int:
        return next(p.port for p in self.target.ports if not p.discovery_only)


def _rbd(cluster: CephCluster, image: str) -> dict[str, Any]:
    return {"pool": cluster.pool, "image": image, "conf": str(cluster.conf)}


def _file(subsystems: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": subsystems,
    }


@pytest.fixture
def group_object(ceph_cluster: CephCluster) -> str:
    name = f"pynvmf.gateway-group.test-{os.getpid()}-{next(_objects)}"
    yield name
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io, contextlib.suppress(Exception):
        io.remove_object(name)


@pytest.fixture
async def gateways(
    ceph_cluster: CephCluster, group_object: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """start(name, file_config) -> a started gateway on the group object."""
    made: list[Gw] = []

    async def start(name: str, config: dict[str, Any]) -> Gw:
        target = await build_target(config)
        shared = SharedConfig(
            target=target,
            spec=_cluster_spec(ceph_cluster),
            pool=ceph_cluster.pool,
            gateway_id=name,
            object_name=group_object,
            poll_interval=30.0,  # the watch must do it: a poll would hide a lost notify
        )
        await shared.start()
        await target.start()
        shared.local_changed()  # its listener's port number
        cp = control_plane(target)
        cp.settle = shared.flush
        rpc = RpcServer(cp)
        sock = str(tmp_path / f"{name}.sock")
        await rpc.listen_unix(sock)
        gw = Gw(target, shared, cp, rpc, sock)
        made.append(gw)
        return gw

    try:
        yield start
    finally:
        for gw in reversed(made):
            await gw.rpc.close()
            await gw.shared.stop()
            await gw.target.stop()


def _cluster_spec(cluster: CephCluster) -> Any:
    from pynvmf.block.rbd import ClusterSpec

    return ClusterSpec.of(str(cluster.conf))


def _object(cluster: CephCluster, name: str) -> dict[str, str]:
    import rados

    with cluster.admin().open_ioctx(cluster.pool) as io, rados.ReadOpCtx() as op:
        it, _ = io.get_omap_vals(op, "", "", 10000)
        io.operate_read_op(op, name)
        return {k: bytes(v).decode() for k, v in it}


async def test_rpc_changes_reach_the_other_gateway(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], gateways: Any, group_object: str
) -> None:
    one, two = rbd_image(4 * MiB), rbd_image(4 * MiB)
    a = await gateways(
        "gw-a", _file([{"nqn": NQN1, "namespaces": [{"rbd": _rbd(ceph_cluster, one)}]}])
    )
    # A gateway started later, its file without subsystems: it gets them from the object.
    b = await gateways("gw-b", _file([]))
    assert set(b.target.subsystems) - {"nqn.2014-08.org.nvmexpress.discovery"} == {NQN1}
    ns_a, ns_b = a.target.subsystems[NQN1].namespaces[1], b.target.subsystems[NQN1].namespaces[1]
    assert (ns_a.uuid, ns_a.nguid) == (ns_b.uuid, ns_b.nguid)  # one namespace, two paths
    assert a.target.subsystems[NQN1].serial == b.target.subsystems[NQN1].serial
    # Each lists the other's listener in its discovery log (a peer listener).
    await a.shared.wait_for(lambda: bool(a.target.subsystems[NQN1].peer_listeners))
    assert a.target.subsystems[NQN1].peer_listeners == [("127.0.0.1", b.port, b.port)]
    assert b.target.subsystems[NQN1].peer_listeners == [("127.0.0.1", a.port, a.port)]

    # A new subsystem, an RBD namespace, a host: over A's RPC.
    await a.call("nvmf_create_subsystem", nqn=NQN2, serial_number="SHARED0002")
    await a.call("bdev_rbd_register_cluster", name="c", config_file=str(ceph_cluster.conf))
    bdev = await a.call(
        "bdev_rbd_create",
        pool_name=ceph_cluster.pool,
        rbd_name=two,
        block_size=512,
        cluster_name="c",
    )
    await a.call("nvmf_subsystem_add_ns", nqn=NQN2, namespace={"bdev_name": bdev})
    await a.call("nvmf_subsystem_add_host", nqn=NQN2, host=HOST)

    def has_two() -> bool:
        s = b.target.subsystems.get(NQN2)
        return s is not None and 1 in s.namespaces and HOST in s.allowed_hosts

    await b.shared.wait_for(has_two)
    s2 = b.target.subsystems[NQN2]
    assert s2.serial == "SHARED0002" and not s2.allow_any_host
    # B's host library does I/O to it; what A's host wrote is there (one image).
    async with await connect("127.0.0.1", a.port, NQN2, hostnqn=HOST) as ctrl:
        await ctrl.namespace(1).write(0, b"A" * 4096, fua=True)
    async with await connect("127.0.0.1", b.port, NQN2, hostnqn=HOST) as ctrl:
        buf = bytearray(4096)
        await ctrl.namespace(1).read(0, memoryview(buf))
        assert buf == b"A" * 4096
        await ctrl.namespace(1).write(8, b"B" * 512)

    # Removal follows.
    await a.call("nvmf_subsystem_remove_host", nqn=NQN2, host=HOST)
    await b.shared.wait_for(lambda: HOST not in b.target.subsystems[NQN2].allowed_hosts)
    await a.call("nvmf_subsystem_remove_ns", nqn=NQN2, nsid=1)
    await b.shared.wait_for(lambda: not b.target.subsystems[NQN2].namespaces)
    await b.call("nvmf_delete_subsystem", nqn=NQN2)  # and from B to A
    await a.shared.wait_for(lambda: NQN2 not in a.target.subsystems)
    # A's own listener key goes with A's subsystem: one more write, then both agree.
    await a.shared.wait_for(lambda: not [k for k in a.shared._known if NQN2 in k])
    await b.shared.wait_for(lambda: b.shared.version == a.shared.version)
    keys = _object(ceph_cluster, group_object)
    assert not [k for k in keys if NQN2 in k]
    assert int(keys[VERSION_KEY]) == a.shared.version


async def test_changes_on_both_gateways_at_once_are_both_kept(
    ceph_cluster: CephCluster, gateways: Any, group_object: str
) -> None:
    a = await gateways("gw-a", _file([{"nqn": NQN1, "hosts": [], "namespaces": []}]))
    b = await gateways("gw-b", _file([]))
    await a.call("nvmf_subsystem_allow_any_host", nqn=NQN1, allow_any_host=False)
    await b.shared.wait_for(lambda: not b.target.subsystems[NQN1].allow_any_host)

    # B reads the object, then A writes before B does: B's guarded write must lose and
    # B must write again on top of A's change, never over it.
    read = b.shared._read
    lost = asyncio.Event()

    async def stale_read() -> dict[str, str]:
        remote = await read()
        if not lost.is_set():
            lost.set()
            a.target.add_host(NQN1, HOST)
            await a.shared.flush()
        return remote

    b.shared._read = stale_read  # type: ignore[method-assign]
    b.target.add_host(NQN1, HOST_B)  # A adds its host once B has read the object
    await b.shared.flush()
    b.shared._read = read  # type: ignore[method-assign]
    assert lost.is_set() and b.shared.races >= 1  # (A may also have written its listener)
    both = {HOST, HOST_B}
    await a.shared.wait_for(lambda: a.target.subsystems[NQN1].allowed_hosts == both)
    assert b.target.subsystems[NQN1].allowed_hosts == both
    keys = _object(ceph_cluster, group_object)
    assert {k for k in keys if k.startswith("host ")} == {f"host {NQN1} {h}" for h in both}

    # And two RPC calls racing for real, one on each gateway.
    await asyncio.gather(
        a.call("nvmf_subsystem_remove_host", nqn=NQN1, host=HOST),
        b.call("nvmf_subsystem_remove_host", nqn=NQN1, host=HOST_B),
    )
    await a.shared.wait_for(lambda: not a.target.subsystems[NQN1].allowed_hosts)
    await b.shared.wait_for(lambda: not b.target.subsystems[NQN1].allowed_hosts)
    assert not [k for k in _object(ceph_cluster, group_object) if k.startswith("host ")]


async def test_the_object_wins_over_a_later_gateways_file(
    ceph_cluster: CephCluster,
    rbd_image: Callable[[int], str],
    gateways: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    image = rbd_image(4 * MiB)
    ns = {"rbd": _rbd(ceph_cluster, image)}
    await gateways("gw-a", _file([{"nqn": NQN1, "serial": "FROMA", "namespaces": [ns]}]))
    caplog.set_level(logging.WARNING, "pynvmf.ha.shared")
    b = await gateways(
        "gw-b",
        _file(
            [
                {"nqn": NQN1, "serial": "FROMB", "namespaces": [{"memory": "1M"}]},
                {"nqn": NQN2, "namespaces": [{"memory": "1M"}]},
            ]
        ),
    )
    assert NQN2 not in b.target.subsystems
    assert b.target.subsystems[NQN1].serial == "FROMA"
    assert b.target.subsystems[NQN1].namespaces[1].device.__class__.__name__ == "RbdDevice"
    text = caplog.text
    assert f"subsystem {NQN1}" in text and "FROMB" in text and f"namespace {NQN1} 1" in text
    assert f"subsystem {NQN2}" in text


async def test_bad_object_content_is_named_and_left(
    ceph_cluster: CephCluster,
    rbd_image: Callable[[int], str],
    gateways: Any,
    group_object: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import rados

    image = rbd_image(4 * MiB)
    a = await gateways(
        "gw-a", _file([{"nqn": NQN1, "namespaces": [{"rbd": _rbd(ceph_cluster, image)}]}])
    )
    b = await gateways("gw-b", _file([]))
    caplog.set_level(logging.ERROR, "pynvmf.ha.shared")
    bad = {
        f"subsystem {NQN2}": b"{not json",
        "frobnicate 1": b"{}",
        f"namespace {NQN1} 7": json.dumps(
            {"nsid": 7, "rbd": _rbd(ceph_cluster, "no-such-image")}
        ).encode(),
        f"host {NQN1} {HOST}": json.dumps({"nqn": HOST, "dhchap_key": "no-such-key"}).encode(),
    }
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io:
        with rados.WriteOpCtx() as op:
            version = str(a.shared.version + 1)
            io.set_omap(op, (*bad, VERSION_KEY), (*bad.values(), version.encode()))
            io.operate_write_op(op, group_object)
        io.notify(group_object, version)
    for gw in (a, b):
        await gw.shared.wait_for(lambda gw=gw: len(gw.shared.errors) >= len(bad))
        named = "\n".join(gw.shared.errors)
        for key in bad:
            assert repr(key) in named, (key, named)
        assert "no-such-image" in named and "unknown key" in named and "not JSON" in named
    assert "frobnicate 1" in caplog.text
    # Both go on serving what they ran, and neither wrote the bad keys away.
    for gw in (a, b):
        assert set(gw.target.subsystems[NQN1].namespaces) == {1}
        assert NQN2 not in gw.target.subsystems
        async with await connect("127.0.0.1", gw.port, NQN1) as ctrl:
            await ctrl.namespace(1).write(0, b"x" * 512)
    keys = _object(ceph_cluster, group_object)
    assert set(bad) <= set(keys)
    # A good change after the bad ones still goes through.
    await b.call("nvmf_subsystem_allow_any_host", nqn=NQN1, allow_any_host=False)
    await a.shared.wait_for(lambda: not a.target.subsystems[NQN1].allow_any_host)


async def test_a_namespace_from_the_group_gets_this_gateways_ana_state(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], group_object: str
) -> None:
    """Two Gateways, A owning the ANA group: a namespace added in the group through A's
    control plane is optimized on A and inaccessible on B, at once."""
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io, contextlib.suppress(Exception):
        io.remove_object(LEASE_PREFIX + str(GROUP))
    first, second = rbd_image(4 * MiB), rbd_image(4 * MiB)

    def gateway_config(name: str, preferred: bool) -> GatewayConfig:
        return GatewayConfig.parse(
            {
                "id": name,
                "pool": ceph_cluster.pool,
                "ceph_conf": str(ceph_cluster.conf),
                "groups": [GROUP],
                "preferred": [GROUP] if preferred else [],
                "lease": 3,
                "index": 0 if preferred else 1,
                "shared_config": {"object": group_object},
            }
        )

    said: asyncio.Queue[tuple[str, S]] = asyncio.Queue()
    ns = {"rbd": _rbd(ceph_cluster, first), "anagrpid": GROUP}
    ta = await build_target(_file([{"nqn": NQN1, "namespaces": [ns]}]))
    tb = await build_target(_file([]))
    ga = Gateway(ta, gateway_config("gw-a", True), announce=lambda g, s: said.put_nowait(("a", s)))
    gb = Gateway(tb, gateway_config("gw-b", False), announce=lambda g, s: said.put_nowait(("b", s)))
    try:
        for gw in (ga, gb):
            assert await gw.share() is not None
            gw.setup()
            await gw.start()
            await gw.target.start()
        assert tb.subsystems[NQN1].cntlid_min == 1 + 2040  # B's own controller IDs
        while (await asyncio.wait_for(said.get(), 60)) != ("a", S.OPTIMIZED):
            pass
        assert ga.shared is not None and gb.shared is not None
        cp = control_plane(ta)
        cp.settle = ga.shared.flush
        await cp.call(
            "bdev_rbd_register_cluster", {"name": "c", "config_file": str(ceph_cluster.conf)}
        )
        bdev = await cp.call(
            "bdev_rbd_create",
            {
                "pool_name": ceph_cluster.pool,
                "rbd_name": second,
                "block_size": 512,
                "cluster_name": "c",
            },
        )
        await cp.call(
            "nvmf_subsystem_add_ns",
            {"nqn": NQN1, "namespace": {"bdev_name": bdev, "anagrpid": GROUP}},
        )
        await gb.shared.wait_for(lambda: 2 in tb.subsystems[NQN1].namespaces)
        assert tb.subsystems[NQN1].ana.groups[GROUP].state is S.INACCESSIBLE
        assert ta.subsystems[NQN1].ana.groups[GROUP].state is S.OPTIMIZED
        assert len(gb._devices[GROUP]) == 2  # B watches the new image's state too
    finally:
        for gw in (gb, ga):
            await gw.stop()
            await gw.target.stop()


async def test_an_object_removed_under_the_gateways_is_seeded_again(
    ceph_cluster: CephCluster, gateways: Any, group_object: str
) -> None:
    """Removing the object by hand is not "the group has no subsystems": the next change
    seeds it again from the gateway that made it, and the other keeps serving, and
    watches the new object (its watch ended with the old one)."""
    a = await gateways("gw-a", _file([{"nqn": NQN1, "namespaces": []}]))
    b = await gateways("gw-b", _file([]))
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io:
        io.remove_object(group_object)
    await a.call("nvmf_subsystem_add_host", nqn=NQN1, host=HOST)
    keys = _object(ceph_cluster, group_object)
    assert f"subsystem {NQN1}" in keys and f"host {NQN1} {HOST}" in keys
    await b.shared.wait_for(lambda: HOST in b.target.subsystems[NQN1].allowed_hosts, 60)
    assert b.shared._watch is not None
    await a.call("nvmf_subsystem_remove_host", nqn=NQN1, host=HOST)
    await b.shared.wait_for(lambda: not b.target.subsystems[NQN1].allowed_hosts, 20)
    assert NQN1 in a.target.subsystems


HOST_C = "nqn.2014-08.org.nvmexpress:uuid:5e0f3a3c-0d6b-4c57-9d0f-0000000000c3"


async def _host(gw: Gw, hostnqn: str) -> Controller:
    """pynvmf's host on `gw` as `hostnqn`, told of namespace changes."""
    ctrl = await connect("127.0.0.1", gw.port, NQN1, hostnqn=hostnqn, queues=1)
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    return ctrl


_armed: list[asyncio.Future[int]] = []


def _arm(ctrl: Controller) -> asyncio.Future[int]:
    """An Asynchronous Event Request outstanding on `ctrl` (it fails when `ctrl` closes)."""
    future = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    _armed.append(future)
    return future


async def _told(ctrl: Controller, event: asyncio.Future[int]) -> list[int]:
    """The namespaces the event that `ctrl` was sent names (reading the log, as a host
    does, lets the next event of its kind be sent)."""
    await asyncio.wait_for(event, 30)
    return L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096)).nsids


async def _read(ctrl: Controller) -> None:
    await ctrl.io_command(IoOpcode.READ, 1, 0, 0, 0, into=memoryview(bytearray(512)))


async def _active(ctrl: Controller) -> list[int]:
    buf = bytearray(I.IDENTIFY_DATA_SIZE)
    await ctrl.admin_command(AdminOpcode.IDENTIFY, 0, I.Cns.NS_ACTIVE_LIST, into=memoryview(buf))
    return I.NsIdList.unpack(buf).nsids


async def test_namespace_hosts_and_ana_group_reach_the_other_gateway_in_place(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], gateways: Any, group_object: str
) -> None:
    """nvmf_ns_add_host / _remove_host and nvmf_subsystem_set_ns_ana_group on A: B
    attaches, detaches and moves the same namespace (not removed and added again), and
    on B only the controllers of the host named are told; a referral stays A's."""
    image = rbd_image(4 * MiB)
    ns_spec = {"rbd": _rbd(ceph_cluster, image), "auto_visible": False}
    a = await gateways("gw-a", _file([{"nqn": NQN1, "namespaces": [ns_spec]}]))
    b = await gateways("gw-b", _file([]))
    ns_b = b.target.subsystems[NQN1].namespaces[1]
    assert not ns_b.auto_visible and not ns_b.hosts
    on_b, other_on_b = await _host(b, HOST), await _host(b, HOST_B)
    try:
        told, not_told = _arm(on_b), _arm(other_on_b)
        assert 1 not in await _active(on_b)
        assert await a.call("nvmf_ns_add_host", nqn=NQN1, nsid=1, host=HOST)
        assert await _told(on_b, told) == [1]  # B's controller of that host, told by B
        assert b.target.subsystems[NQN1].namespaces[1] is ns_b and ns_b.hosts == {HOST}
        assert await _active(on_b) == [1]
        await _read(on_b)
        await other_on_b.admin_command(AdminOpcode.KEEP_ALIVE)
        assert not not_told.done() and 1 not in await _active(other_on_b)
        keys = _object(ceph_cluster, group_object)
        assert keys[f"namespace_host {NQN1} 1 {HOST}"] == "{}"
        assert "hosts" not in json.loads(keys[f"namespace {NQN1} 1"])

        # Two hosts attached at once, one on each gateway: one key each, both kept.
        await asyncio.gather(
            a.call("nvmf_ns_add_host", nqn=NQN1, nsid=1, host=HOST_B),
            b.call("nvmf_ns_add_host", nqn=NQN1, nsid=1, host=HOST_C),
        )
        both = {HOST, HOST_B, HOST_C}
        await a.shared.wait_for(lambda: a.target.subsystems[NQN1].namespaces[1].hosts == both)
        await b.shared.wait_for(lambda: ns_b.hosts == both)
        assert await _told(other_on_b, not_told) == [1]
        assert await _active(other_on_b) == [1]

        # Detached on A: B's controller of that host is told and loses it; the other not.
        told, not_told = _arm(on_b), _arm(other_on_b)
        await a.call("nvmf_ns_remove_host", nqn=NQN1, nsid=1, host=HOST)
        assert await _told(on_b, told) == [1]
        assert 1 not in await _active(on_b) and ns_b.hosts == {HOST_B, HOST_C}
        await other_on_b.admin_command(AdminOpcode.KEEP_ALIVE)
        assert not not_told.done()
        assert f"namespace_host {NQN1} 1 {HOST}" not in _object(ceph_cluster, group_object)

        # Moved to ANA group 2 on A: the same namespace on B, in group 2, its host told.
        await a.call("nvmf_subsystem_set_ns_ana_group", nqn=NQN1, nsid=1, anagrpid=2)
        assert await _told(other_on_b, not_told) == [1]
        assert b.target.subsystems[NQN1].namespaces[1] is ns_b and ns_b.anagrpid == 2
        assert (await other_on_b.identify_namespace(1)).anagrpid == 2
        await _read(other_on_b)

        # A referral is A's own: not in the object, not on B.
        await a.call(
            "nvmf_discovery_add_referral",
            address={"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.9", "trsvcid": "8009"},
        )
        assert a.target.referrals and not b.target.referrals
        assert not [k for k in _object(ceph_cluster, group_object) if "127.0.0.9" in k]
    finally:
        for ctrl in (on_b, other_on_b):
            await ctrl.close()
        await asyncio.gather(*_armed, return_exceptions=True)
        _armed.clear()

    # A gateway started later gets the hosts and the group.
    c = await gateways("gw-c", _file([]))
    ns_c = c.target.subsystems[NQN1].namespaces[1]
    assert (ns_c.auto_visible, ns_c.hosts, ns_c.anagrpid) == (False, {HOST_B, HOST_C}, 2)
    # Removed with its hosts: the keys go together, and every gateway drops it.
    await c.call("nvmf_subsystem_remove_ns", nqn=NQN1, nsid=1)
    for gw in (a, b):
        await gw.shared.wait_for(lambda gw=gw: not gw.target.subsystems[NQN1].namespaces)
    assert not [k for k in _object(ceph_cluster, group_object) if k.startswith("namespace")]
    assert not (a.shared.errors or b.shared.errors or c.shared.errors)


async def test_namespace_keys_of_earlier_gateways_still_load(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], gateways: Any, group_object: str
) -> None:
    """A namespace key without auto_visible (before per-host visibility) is visible to
    every host; one with a "hosts" list (before namespace_host keys) is attached to
    those, and the object is written back with namespace_host keys."""
    import rados

    first, second = rbd_image(4 * MiB), rbd_image(4 * MiB)
    old = {
        f"subsystem {NQN1}": {"serial": "OLDGW", "allow_any_host": True},
        f"namespace {NQN1} 1": {"nsid": 1, "rbd": _rbd(ceph_cluster, first)},
        f"namespace {NQN1} 2": {
            "nsid": 2,
            "rbd": _rbd(ceph_cluster, second),
            "auto_visible": False,
            "hosts": [HOST, HOST_B],
        },
    }
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io, rados.WriteOpCtx() as op:
        names = (*old, VERSION_KEY)
        io.set_omap(op, names, (*(json.dumps(v).encode() for v in old.values()), b"7"))
        io.operate_write_op(op, group_object)
    a = await gateways("gw-a", _file([]))
    assert not a.shared.errors
    one, two = (a.target.subsystems[NQN1].namespaces[n] for n in (1, 2))
    assert one.auto_visible and not one.hosts
    assert not two.auto_visible and two.hosts == {HOST, HOST_B}
    keys = _object(ceph_cluster, group_object)
    assert "hosts" not in json.loads(keys[f"namespace {NQN1} 2"])
    assert {k for k in keys if k.startswith("namespace_host ")} == {
        f"namespace_host {NQN1} 2 {HOST}",
        f"namespace_host {NQN1} 2 {HOST_B}",
    }
    assert int(keys[VERSION_KEY]) == 8
    # And the upgraded object is kept in step as any other.
    b = await gateways("gw-b", _file([]))
    await a.call("nvmf_ns_remove_host", nqn=NQN1, nsid=2, host=HOST)
    await b.shared.wait_for(lambda: b.target.subsystems[NQN1].namespaces[2].hosts == {HOST_B})


async def test_a_namespace_moved_to_another_ana_group_takes_that_groups_state_on_each_gateway(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], group_object: str
) -> None:
    """Two Gateways, A owning GROUP and B owning GROUP + 1: a namespace moved from GROUP
    to GROUP + 1 through A's control plane (nvmf_subsystem_set_ns_ana_group, as Ceph's
    namespace_change_load_balancing_group calls it) is the same namespace on B, now in
    the group B owns: optimized on B, inaccessible on A, and each gateway watches its
    image in its new group."""
    other = GROUP + 1
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io:
        for grpid in (GROUP, other):
            with contextlib.suppress(Exception):
                io.remove_object(LEASE_PREFIX + str(grpid))
    first, second = rbd_image(4 * MiB), rbd_image(4 * MiB)

    def gateway_config(name: str, index: int, preferred: int) -> GatewayConfig:
        return GatewayConfig.parse(
            {
                "id": name,
                "pool": ceph_cluster.pool,
                "ceph_conf": str(ceph_cluster.conf),
                "groups": [GROUP, other],
                "preferred": [preferred],
                "lease": 3,
                "index": index,
                "shared_config": {"object": group_object},
            }
        )

    owned: dict[tuple[str, int], S] = {}
    settled = asyncio.Event()

    def announce(name: str) -> Callable[[int, S], None]:
        def said(grpid: int, state: S) -> None:
            owned[name, grpid] = state
            if owned.get(("a", GROUP)) is S.OPTIMIZED and owned.get(("b", other)) is S.OPTIMIZED:
                settled.set()

        return said

    namespaces = [
        {"rbd": _rbd(ceph_cluster, first), "anagrpid": GROUP},
        {"rbd": _rbd(ceph_cluster, second), "anagrpid": other},
    ]
    ta = await build_target(_file([{"nqn": NQN1, "namespaces": namespaces}]))
    tb = await build_target(_file([]))
    ga = Gateway(ta, gateway_config("gw-a", 0, GROUP), announce=announce("a"))
    gb = Gateway(tb, gateway_config("gw-b", 1, other), announce=announce("b"))
    try:
        for gw in (ga, gb):
            assert await gw.share() is not None
            gw.setup()
            await gw.start()
            await gw.target.start()
        await asyncio.wait_for(settled.wait(), 60)
        assert ga.shared is not None and gb.shared is not None
        ns_b = tb.subsystems[NQN1].namespaces[1]
        cp = control_plane(ta)
        cp.settle = ga.shared.flush
        await cp.call(
            "nvmf_subsystem_set_ns_ana_group", {"nqn": NQN1, "nsid": 1, "anagrpid": other}
        )
        await gb.shared.wait_for(lambda: ns_b.anagrpid == other)
        assert tb.subsystems[NQN1].namespaces[1] is ns_b  # moved, not added again
        for target, optimized in ((ta, GROUP), (tb, other)):
            subsystem = target.subsystems[NQN1]
            assert subsystem.ana_members() == {other: [1, 2]}
            assert subsystem.ana.groups[other].state is (
                S.OPTIMIZED if optimized == other else S.INACCESSIBLE
            )
        assert [d.image_name for d in gb._devices[other]] == [first, second]
        assert GROUP not in gb._devices
    finally:
        for gw in (gb, ga):
            await gw.stop()
            await gw.target.stop()
