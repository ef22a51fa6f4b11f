"""An RBD namespace in the target: configuration, control plane, and I/O from pynvmf's
host library over TCP, including what the host sees when the storage goes away."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pynvmf.block import copy as block_copy
from pynvmf.config.native import ConfigError, apply_config, build_target, config_of
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.host import NvmeStatusError, connect
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.spec.status import Status
from pynvmf.target.devices import RBD
from pynvmf.target.target import Target
from tests.support.ceph_cluster import CephCluster

NQN = "nqn.2024-01.io.pynvmf.test:rbd"
MiB = 1 << 20


def _config(cluster: CephCluster, image: str, **rbd: Any) -> dict[str, Any]:
    return {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": NQN,
                "namespaces": [
                    {"rbd": {"pool": "rbd", "image": image, "conf": str(cluster.conf), **rbd}},
                    {"memory": "4M"},
                ],
            }
        ],
    }


@pytest.fixture
async def started() -> AsyncIterator[list[Target]]:
    targets: list[Target] = []
    yield targets
    for t in targets:
        await t.stop()


async def test_config_file_round_trip(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    image = rbd_image(8 * MiB)
    target = await build_target(_config(ceph_cluster, image, io_timeout=5))
    try:
        ns = target.subsystems[NQN].namespaces[1]
        assert ns.num_blocks == 8 * MiB // 512
        written = config_of(target)
        spec = written["subsystems"][0]["namespaces"][0]
        assert spec["rbd"] == {
            "pool": "rbd",
            "image": image,
            "conf": str(ceph_cluster.conf),
            "io_timeout": 5.0,
        }
        again = await build_target(written)
        try:
            # The identities derive from the cluster, pool and image: the same on every
            # gateway that serves the image (what a multipath host groups paths by).
            ns2 = again.subsystems[NQN].namespaces[1]
            assert (ns2.uuid, ns2.nguid) == (ns.uuid, ns.nguid)
        finally:
            await again.stop()
    finally:
        await target.stop()


@pytest.mark.parametrize(
    ("rbd", "message"),
    [
        ({"pool": "rbd"}, "namespaces[0].rbd.image: an RBD namespace needs an image name"),
        ({"image": "x", "io_timeout": 0}, "namespaces[0].rbd.io_timeout: 0 is not positive"),
        ({"image": "x", "colour": "red"}, "namespaces[0].rbd.colour: unknown key"),
        ({"image": "x", "options": {"a": [1]}}, "namespaces[0].rbd.options.a: [1] is not"),
        ({"image": "no-such-image"}, "no RBD image 'no-such-image' in pool 'rbd'"),
        ({"pool": "no-such-pool", "image": "x"}, "pool 'no-such-pool'"),
    ],
)
async def test_config_errors_name_the_key(
    ceph_cluster: CephCluster, rbd: dict[str, Any], message: str
) -> None:
    config = _config(ceph_cluster, "unused")
    config["subsystems"][0]["namespaces"][0]["rbd"] = {"conf": str(ceph_cluster.conf), **rbd}
    target = Target()
    try:
        with pytest.raises(ConfigError) as info:
            await apply_config(target, config)
        assert message in str(info.value)
    finally:
        await target.stop()


async def test_spdk_rpc_methods(ceph_cluster: CephCluster, rbd_image: Callable[[int], str]) -> None:
    image = rbd_image(4 * MiB)
    cp = control_plane(Target())
    try:
        conf = str(ceph_cluster.conf)
        assert await cp.call("bdev_rbd_register_cluster", {"name": "c1", "config_file": conf})
        info = await cp.call("bdev_rbd_get_clusters_info", {})
        assert info == [{"cluster_name": "c1", "config_file": conf}]
        one = await cp.call("bdev_rbd_get_clusters_info", {"name": "c1"})
        assert one == {"cluster_name": "c1", "config_file": conf}
        name = await cp.call(
            "bdev_rbd_create",
            {"pool_name": "rbd", "rbd_name": image, "block_size": 4096, "cluster_name": "c1"},
        )
        assert name == "Ceph0"
        (bdev,) = await cp.call("bdev_get_bdevs", {"name": "Ceph0"})
        assert bdev["product_name"] == "Ceph Rbd Disk"
        assert bdev["block_size"] == 4096 and bdev["num_blocks"] == 1024
        assert bdev["driver_specific"]["rbd"]["rbd_name"] == image
        assert bdev["driver_specific"]["rbd"]["state"] == "ok"
        assert cp.target.block_devices["Ceph0"].kind == RBD
        # save_config's bdev calls create it again (the cluster first).
        saved = spdk_config(cp.target)
        (bdev_config,) = [s["config"] for s in saved["subsystems"] if s["subsystem"] == "bdev"]
        bdev_calls = [c["method"] for c in bdev_config]
        assert bdev_calls == ["bdev_rbd_register_cluster", "bdev_rbd_create"]
        for call, params, error in [
            (
                "bdev_rbd_create",
                {"pool_name": "rbd", "rbd_name": "nope", "block_size": 512, "cluster_name": "c1"},
                "rbd_name: no RBD image 'nope'",
            ),
            (
                "bdev_rbd_create",
                {"pool_name": "rbd", "rbd_name": image, "block_size": 512},
                "rbd_name: no ceph.conf found",
            ),
            (
                "bdev_rbd_create",
                {"pool_name": "rbd", "rbd_name": image, "block_size": 1000, "cluster_name": "c1"},
                "block_size: 1000 is not a power",
            ),
            (
                "bdev_rbd_create",
                {"pool_name": "rbd", "rbd_name": image, "block_size": 512, "cluster_name": "c9"},
                "cluster_name: no cluster named 'c9'",
            ),
            (
                "bdev_rbd_create",
                {
                    "pool_name": "rbd",
                    "rbd_name": image,
                    "block_size": 512,
                    "name": "Ceph0",
                    "cluster_name": "c1",
                },
                "name: a bdev named",
            ),
            ("bdev_rbd_register_cluster", {"name": "c1"}, "name: a cluster named 'c1'"),
            ("bdev_rbd_register_cluster", {"name": "c2", "core_mask": "0x1"}, "core_mask"),
            ("bdev_rbd_delete", {"name": "Malloc0"}, "name: no rbd bdev named 'Malloc0'"),
        ]:
            with pytest.raises(RpcError) as err:
                await cp.call(call, params)
            assert error in err.value.message, (call, err.value.message)
        # SPDK's other way: no configuration file, everything in `config`.
        keyring = str(ceph_cluster.dir / "keyring")
        assert (
            await cp.call(
                "bdev_rbd_create",
                {
                    "name": "Ceph1",
                    "pool_name": "rbd",
                    "rbd_name": image,
                    "block_size": 512,
                    "user_id": "admin",
                    "config": {"mon_host": ceph_cluster.mon_host, "keyring": keyring},
                    "read_only": True,
                },
            )
            == "Ceph1"
        )
        entry = cp.target.block_devices["Ceph1"]
        assert entry.read_only and entry.device.cluster_spec.conf == ""
        assert await cp.call("bdev_rbd_delete", {"name": "Ceph1"})
        with pytest.raises(RpcError) as used:
            await cp.call("bdev_rbd_unregister_cluster", {"name": "c1"})
        assert "name: cluster 'c1' is used by Ceph0" in used.value.message
        assert await cp.call("bdev_rbd_delete", {"name": "Ceph0"})
        assert "Ceph0" not in cp.target.block_devices
        assert await cp.call("bdev_rbd_unregister_cluster", {"name": "c1"})
        # A config with the register call loads into a fresh target.
        cp2 = control_plane(Target())
        try:
            await load_spdk_config(cp2, saved)
            assert cp2.target.block_devices["Ceph0"].kind == RBD
        finally:
            await cp2.target.stop()
            for _spec, conn in cp2.rbd_clusters.values():
                conn.release()
    finally:
        await cp.target.stop()


def _port(target: Target) -> int:
    for port in target.ports:
        if not port.discovery_only:
            return port.port
    raise AssertionError("no I/O port")


async def test_host_library_io(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], started: list[Target]
) -> None:
    """Read, write (FUA), flush, Write Zeroes, deallocate, Compare and Copy through the
    host library on an RBD namespace: the same results as on a memory namespace."""
    image = rbd_image(16 * MiB)
    target = await build_target(_config(ceph_cluster, image))
    await target.start()
    started.append(target)
    async with await connect("127.0.0.1", _port(target), NQN, queues=2) as ctrl:
        ns = ctrl.namespace(1)
        assert ns.capabilities.num_blocks == 16 * MiB // 512
        data = os.urandom(2 * MiB)
        await ns.write(0, data, fua=True)
        await ns.flush()
        buf = bytearray(2 * MiB)
        await ns.read(0, memoryview(buf))
        assert buf == data
        await ns.write_zeroes(8, 8)
        await ns.deallocate(100, 50)
        await ns.read(0, memoryview(buf))
        expect = bytearray(data)
        expect[8 * 512 : 16 * 512] = bytes(8 * 512)
        expect[100 * 512 : 150 * 512] = bytes(50 * 512)
        assert buf == expect
        assert await ns.compare(0, bytes(expect[:4096]))
        assert not await ns.compare(0, bytes(4096))
        # NVMe Copy, executed in the target by the planner (emulated on RBD).
        report = await block_copy.copy_blocks(ns, 0, ns, 8192, 4096)
        assert report.offloaded_blocks == 4096  # one Copy command from the host...
        copied = bytearray(2 * MiB)
        await ns.read(8192, memoryview(copied))
        assert copied == expect
        # ...which many concurrent commands do not disturb.
        blocks = [os.urandom(4096) for _ in range(64)]
        await asyncio.gather(*(ns.write(20000 + 8 * i, b) for i, b in enumerate(blocks)))
        back = [bytearray(4096) for _ in blocks]
        await asyncio.gather(*(ns.read(20000 + 8 * i, memoryview(b)) for i, b in enumerate(back)))
        assert [bytes(b) for b in back] == blocks
    stats = target.subsystems[NQN].stats
    assert stats.copy_cmds == 1


async def test_blocklisted_gateway_answers_path_errors_and_stays_up(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], started: list[Target]
) -> None:
    """The target's RADOS client is blocklisted mid-I/O: the host's commands on the RBD
    namespace complete with Internal Path Error (SCT 3h, no DNR: retry on another path),
    the namespace next to it and the controller go on, and the device says FENCED."""
    image = rbd_image(4 * MiB)
    # Options of its own: a client that no other test shares.
    target = await build_target(_config(ceph_cluster, image, options={"rbd_cache": "false"}))
    await target.start()
    started.append(target)
    device = target.subsystems[NQN].namespaces[1].device
    states: list[str] = []
    device.add_state_listener(lambda d, s: states.append(s.value))
    async with await connect("127.0.0.1", _port(target), NQN, queue_depth=64) as ctrl:
        ns, other = ctrl.namespace(1), ctrl.namespace(2)
        await ns.write(0, b"a" * 4096)
        writes = [asyncio.ensure_future(ns.write(8 * i, b"b" * 4096)) for i in range(32)]
        ceph_cluster.blocklist(device.connection.address)
        results = await asyncio.gather(*writes, return_exceptions=True)
        errors = [r for r in results if r is not None]
        assert all(isinstance(e, NvmeStatusError) for e in errors), errors
        # Once the target's client has the OSD map with the blocklist, every command fails.
        await asyncio.to_thread(device.connection.cluster.wait_for_latest_osdmap)
        with pytest.raises(NvmeStatusError) as info:
            await ns.write(0, b"c" * 4096)
        status = info.value
        assert status.status == Status.INTERNAL_PATH_ERROR and not status.dnr
        for e in errors:
            assert e.status == Status.INTERNAL_PATH_ERROR
        with pytest.raises(NvmeStatusError) as info:
            await ns.read(0, memoryview(bytearray(512)))
        assert info.value.status == Status.INTERNAL_PATH_ERROR
        with pytest.raises(NvmeStatusError):
            await ns.flush()
        await other.write(0, b"m" * 512)  # the target is alive
        buf = bytearray(512)
        await other.read(0, memoryview(buf))
        assert buf == b"m" * 512
        assert states == ["fenced"]


async def test_osd_stopped_mid_io_gives_path_errors_then_recovers(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str], started: list[Target]
) -> None:
    image = rbd_image(4 * MiB)
    target = await build_target(_config(ceph_cluster, image, io_timeout=1.5))
    await target.start()
    started.append(target)
    async with await connect("127.0.0.1", _port(target), NQN, timeout=30) as ctrl:
        ns = ctrl.namespace(1)
        await ns.write(0, b"q" * 4096)
        ceph_cluster.freeze(ceph_cluster.osd_name)
        try:
            pending = [asyncio.ensure_future(ns.write(8 * i, b"r" * 4096)) for i in range(8)]
            results = await asyncio.gather(*pending, return_exceptions=True)
            assert all(
                isinstance(r, NvmeStatusError) and r.status == Status.INTERNAL_PATH_ERROR
                for r in results
            ), results
            # The controller itself answers meanwhile (the target is alive).
            await ctrl.namespace(2).write(0, b"x" * 512)
        finally:
            ceph_cluster.thaw(ceph_cluster.osd_name)
        buf = bytearray(4096)
        for _ in range(20):
            try:
                await ns.read(0, memoryview(buf))
                break
            except NvmeStatusError:
                continue
        # A write that failed on its timeout was still queued for the OSD, and may land
        # once it runs again (NVMe leaves a failed write's blocks indeterminate; across
        # gateways, fencing is what stops such a write: docs/rbd.md).
        assert buf in (b"q" * 4096, b"r" * 4096)
        assert target.subsystems[NQN].namespaces[1].device.healthy


@pytest.mark.parametrize(
    ("rbd", "message"),
    [
        ("pool/", "--rbd: 'pool/' is not POOL/IMAGE"),
        ("a/b/c", "--rbd: 'a/b/c' is not POOL/IMAGE"),
        ("rbd/no-such-image", "no RBD image 'no-such-image' in pool 'rbd'"),
    ],
)
def test_cli_refuses_bad_rbd_options(ceph_cluster: CephCluster, rbd: str, message: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pynvmf",
            "target",
            "--rbd",
            rbd,
            "--ceph-conf",
            str(ceph_cluster.conf),
            "--listen",
            "127.0.0.1:0",
            "--discovery-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert message in proc.stderr, proc.stderr
