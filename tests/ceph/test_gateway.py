"""A gateway on the test cluster (pynvmf.ha.gateway over pynvmf.ha.lease): the lease
makes its ANA group optimized; its RBD client blocklisted, it withdraws and the host's
I/O gets ANA Inaccessible (a path status: retry elsewhere), touching nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pynvmf.config.native import ConfigError, apply_config, build_target
from pynvmf.ha.gateway import Gateway, GatewayConfig
from pynvmf.ha.lease import OBJECT_PREFIX
from pynvmf.host import NvmeStatusError, connect
from pynvmf.spec.logpages import AnaState as S
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.cores.workers import MultiCoreTarget
from tests.support.ceph_cluster import CephCluster

NQN = "nqn.2024-11.dev.pynvmf:gateway"
MiB = 1 << 20
GROUP = 17  # a lease object of its own in the shared pool


def _config(cluster: CephCluster, image: str, options: dict[str, str]) -> dict[str, Any]:
    rbd = {"pool": cluster.pool, "image": image, "conf": str(cluster.conf), "options": options}
    return {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [{"nqn": NQN, "namespaces": [{"rbd": rbd, "anagrpid": GROUP}]}],
    }


def _gateway(cluster: CephCluster, options: dict[str, str]) -> GatewayConfig:
    return GatewayConfig.parse(
        {
            "id": "gw-test",
            "pool": cluster.pool,
            "ceph_conf": str(cluster.conf),
            "options": options,
            "groups": [GROUP],
            "preferred": [GROUP],
            "lease": 3,
        }
    )


async def test_lease_then_fencing_drive_the_ana_state(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io, contextlib.suppress(Exception):
        io.remove_object(OBJECT_PREFIX + str(GROUP))
    image = rbd_image(4 * MiB)
    options = {"rbd_cache": "false", "client_mount_timeout": "29"}  # a client of its own
    target = await build_target(_config(ceph_cluster, image, options))
    said: asyncio.Queue[S] = asyncio.Queue()
    gw = Gateway(target, _gateway(ceph_cluster, options), announce=lambda g, s: said.put_nowait(s))
    group = target.subsystems[NQN].ana.groups[GROUP]
    try:
        gw.setup()
        assert group.state is S.INACCESSIBLE and await said.get() is S.INACCESSIBLE
        await gw.start()
        await target.start()
        # A fresh cluster's first lock may be slow on a loaded machine.
        assert await asyncio.wait_for(said.get(), 60) is S.OPTIMIZED
        port = next(p.port for p in target.ports if not p.discovery_only)
        async with await connect("127.0.0.1", port, NQN) as ctrl:
            ns = ctrl.namespace(1)
            await ns.write(0, b"g" * 512)
            device = target.subsystems[NQN].namespaces[1].device
            ceph_cluster.blocklist(device.connection.address)
            # Requests meet the blocklist once the OSD map with it reaches the client;
            # the gateway withdraws at the first refused one.
            deadline = asyncio.get_running_loop().time() + 60
            while said.empty() and asyncio.get_running_loop().time() < deadline:
                with contextlib.suppress(NvmeStatusError):
                    await ns.write(0, b"h" * 512)
            assert await asyncio.wait_for(said.get(), 10) is S.INACCESSIBLE
            assert group.state is S.INACCESSIBLE
            with pytest.raises(NvmeStatusError) as info:
                await ns.write(0, b"i" * 512)
            assert info.value.status == Status.ANA_INACCESSIBLE and not info.value.dnr
            # Withdrawn for good: the lease manager stopped; nothing makes it optimized.
            gw._lease_changed(GROUP, True)
            assert group.state is S.INACCESSIBLE and said.empty()
    finally:
        await gw.stop()
        await target.stop()


async def test_rbd_namespaces_must_share_the_gateways_client(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    image = rbd_image(4 * MiB)
    target = await build_target(_config(ceph_cluster, image, {"rbd_cache": "false"}))
    try:
        with pytest.raises(ConfigError, match="fencing would miss it"):
            Gateway(target, _gateway(ceph_cluster, {})).setup()
    finally:
        await target.stop()


async def test_a_gateway_under_two_cores_serves_its_group_from_the_workers(
    ceph_cluster: CephCluster,
) -> None:
    # `pynvmf target --cores 2` with a gateway: the lease's states reach the I/O queues
    # on the workers (a memory namespace here: RBD images are served by the main
    # process, docs/cores.md), and giving the lease up refuses their I/O at once.
    group = GROUP + 1  # a lease of its own
    with ceph_cluster.admin().open_ioctx(ceph_cluster.pool) as io, contextlib.suppress(Exception):
        io.remove_object(OBJECT_PREFIX + str(group))
    target = MultiCoreTarget(2)
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [{"nqn": NQN, "namespaces": [{"memory": 4 * MiB, "anagrpid": group}]}],
    }
    await apply_config(target, config)
    said: asyncio.Queue[S] = asyncio.Queue()
    cfg = dataclasses.replace(_gateway(ceph_cluster, {}), groups=[group], preferred=[group])
    gw = Gateway(target, cfg, announce=lambda g, s: said.put_nowait(s))
    try:
        gw.setup()
        assert await said.get() is S.INACCESSIBLE
        await target.start()
        await gw.start()
        assert await asyncio.wait_for(said.get(), 60) is S.OPTIMIZED
        port = next(p.port for p in target.ports if not p.discovery_only)
        async with await connect("127.0.0.1", port, NQN, queues=2) as ctrl:
            assert target.workers is not None
            assert [len(w.queues) for w in target.workers.workers] == [1, 1]
            for queue in ctrl.io_queues:
                await queue.execute(IoOpcode.WRITE, 1, 0, 0, 0, data=memoryview(b"g" * 512))
            await gw.stop()  # the lease given up: inaccessible before stop returns
            assert await said.get() is S.INACCESSIBLE
            for queue in ctrl.io_queues:  # one on each worker
                with pytest.raises(NvmeStatusError) as info:
                    await queue.execute(IoOpcode.WRITE, 1, 0, 0, 0, data=memoryview(b"i" * 512))
                assert info.value.status == Status.ANA_INACCESSIBLE and not info.value.dnr
    finally:
        await gw.stop()
        await target.stop()
