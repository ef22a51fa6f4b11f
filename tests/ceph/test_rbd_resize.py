"""An RBD namespace that grows while a host uses it: SPDK's bdev_rbd_resize (the image
resized through librbd), and a resize made by another Ceph client (the `rbd` command),
heard through the watch on the image's header. Either way the connected host gets the
Namespace Attribute Changed event, Identify's new size and the blocks past the old end;
sizes that cannot be taken are refused with the parameter named. A forced shrink
(pynvmf_bdev_resize with force) cuts the image while the host's I/O runs; a cut made by
another client (`rbd resize --allow-shrink`) is followed the same way."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Callable

import pytest

from pynvmf.config.native import build_target
from pynvmf.host import NvmeStatusError, connect
from pynvmf.host.controller import Controller
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.spec import logpages as L
from pynvmf.spec.identify import Oaes
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.target import Target
from tests.ceph.test_rbd_target import NQN, MiB, _config, _port
from tests.protocol.test_ns_shrink import run_io_across, run_reads_past
from tests.support.ceph_cluster import CephCluster

BLOCK = 512


@pytest.fixture
async def served(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> AsyncIterator[tuple[Target, str]]:
    image = rbd_image(8 * MiB)
    target = await build_target(_config(ceph_cluster, image))
    await target.start()
    yield target, image
    await target.stop()


async def _host(target: Target) -> Controller:
    ctrl = await connect("127.0.0.1", _port(target), NQN, queues=1)
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    return ctrl


async def _grown(ctrl: Controller, aer: asyncio.Future[object], blocks: int) -> None:
    """The event came, the log names namespace 1, Identify has the size, and the last
    block is written and read back."""
    await asyncio.wait_for(aer, 30)
    changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
    assert changed.nsids == [1]
    ident = await ctrl.identify_namespace(1)
    assert ident.nsze == ident.ncap == blocks
    data = os.urandom(BLOCK)
    await ctrl.io_command(IoOpcode.WRITE, 1, blocks - 1, 0, 0, data=memoryview(data))
    back = bytearray(BLOCK)
    await ctrl.io_command(IoOpcode.READ, 1, blocks - 1, 0, 0, into=memoryview(back))
    assert back == data


def _rbd_info(ceph_cluster: CephCluster, image: str) -> str:
    """What `rbd info` says of the image."""
    return subprocess.run(
        ["rbd", "-c", str(ceph_cluster.conf), "info", f"rbd/{image}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


async def test_bdev_rbd_resize_grows_the_image_and_the_host_sees_it(
    ceph_cluster: CephCluster, served: tuple[Target, str]
) -> None:
    target, image = served
    cp = control_plane(target)
    (name,) = [n for n, e in target.block_devices.items() if e.kind == "rbd"]
    ctrl = await _host(target)
    try:
        kept = os.urandom(BLOCK)
        last = 8 * MiB // BLOCK - 1
        await ctrl.io_command(IoOpcode.WRITE, 1, last, 0, 0, data=memoryview(kept))
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        assert await cp.call("bdev_rbd_resize", {"name": name, "new_size": 12}) is True
        await _grown(ctrl, aer, 12 * MiB // BLOCK)
        back = bytearray(BLOCK)
        await ctrl.io_command(IoOpcode.READ, 1, last, 0, 0, into=memoryview(back))
        assert back == kept
        assert "size 12 MiB" in _rbd_info(ceph_cluster, image)
        (bdev,) = await cp.call("bdev_get_bdevs", {"name": name})
        assert bdev["num_blocks"] == 12 * MiB // BLOCK
        notes = await cp.call("notify_get_notifications", {})
        assert [n["ctx"] for n in notes if n["type"] == "bdev_resize"] == [name]
        for params, prefix in [
            ({"name": name, "new_size": 4}, "new_size: "),  # smaller: never
            ({"name": "Malloc9", "new_size": 16}, "name: "),
            ({"name": name, "new_size": 0}, "new_size: "),
        ]:
            with pytest.raises(RpcError) as err:
                await cp.call("bdev_rbd_resize", params)
            assert err.value.message.startswith(prefix), (params, err.value.message)
        assert (await ctrl.identify_namespace(1)).nsze == 12 * MiB // BLOCK
    finally:
        await ctrl.close()


async def test_a_resize_by_another_ceph_client_reaches_the_host(
    ceph_cluster: CephCluster, served: tuple[Target, str]
) -> None:
    target, image = served
    ctrl = await _host(target)
    try:
        # The target writes first, so that it holds the image's exclusive lock: the
        # other client's resize is then carried out by the target's librbd for it.
        await ctrl.io_command(IoOpcode.WRITE, 1, 0, 0, 0, data=memoryview(bytes(BLOCK)))
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        proc = await asyncio.create_subprocess_exec(
            "rbd", "-c", str(ceph_cluster.conf), "resize", "--size", "20M", f"rbd/{image}"
        )
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        await _grown(ctrl, aer, 20 * MiB // BLOCK)
        # A shrink by another client is followed: its data past the end is gone.
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        proc = await asyncio.create_subprocess_exec(
            "rbd",
            "-c",
            str(ceph_cluster.conf),
            "resize",
            "--allow-shrink",
            "--size",
            "16M",
            f"rbd/{image}",
        )
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        await asyncio.wait_for(aer, 30)
        assert (await ctrl.identify_namespace(1)).nsze == 16 * MiB // BLOCK
        back = memoryview(bytearray(BLOCK))
        with pytest.raises(NvmeStatusError) as err:
            await ctrl.io_command(IoOpcode.READ, 1, 16 * MiB // BLOCK, 0, 0, into=back)
        assert err.value.status == Status.LBA_OUT_OF_RANGE
    finally:
        await ctrl.close()


async def test_a_resize_on_one_gateway_reaches_the_hosts_of_another(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    """Two targets serve one image (two gateways, two paths): bdev_rbd_resize on the first
    reaches the host connected to the second through the second's watch."""
    image = rbd_image(8 * MiB)
    first = await build_target(_config(ceph_cluster, image))
    second = await build_target(_config(ceph_cluster, image))
    try:
        await first.start()
        await second.start()
        ctrl = await _host(second)
        try:
            aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
            await asyncio.sleep(0)
            (name,) = [n for n, e in first.block_devices.items() if e.kind == "rbd"]
            assert await control_plane(first).call(
                "bdev_rbd_resize", {"name": name, "new_size": 24}
            )
            await _grown(ctrl, aer, 24 * MiB // BLOCK)
        finally:
            await ctrl.close()
    finally:
        await second.stop()
        await first.stop()


async def test_a_forced_shrink_cuts_the_image_while_io_runs(
    ceph_cluster: CephCluster, served: tuple[Target, str]
) -> None:
    """pynvmf_bdev_resize with force: the namespace's I/O quiesced (librbd requests in
    flight finish), the image resized with allow_shrink, the host told; every command
    gets a success or LBA Out of Range. Without force, refused naming it (and
    bdev_rbd_resize, SPDK's shape, naming new_size)."""
    target, image = served
    cp = control_plane(target)
    (name,) = [n for n, e in target.block_devices.items() if e.kind == "rbd"]
    ctrl = await connect("127.0.0.1", _port(target), NQN, queues=2)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        kept = os.urandom(BLOCK)
        await ctrl.io_command(IoOpcode.WRITE, 1, 4 * MiB // BLOCK - 1, 0, 0, data=memoryview(kept))
        for method, params, prefix in [
            ("pynvmf_bdev_resize", {"name": name, "size_bytes": 4 * MiB}, "force: "),
            ("bdev_rbd_resize", {"name": name, "new_size": 4}, "new_size: "),
        ]:
            with pytest.raises(RpcError) as err:
                await cp.call(method, params)
            assert err.value.message.startswith(prefix), (params, err.value.message)
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))

        async def cut() -> None:
            assert await cp.call(
                "pynvmf_bdev_resize", {"name": name, "size_bytes": 4 * MiB, "force": True}
            ) == (4 * MiB // BLOCK)

        # Blocks of 512 bytes, as io_loop writes them.
        await run_io_across(ctrl, 1, 8 * MiB // BLOCK, cut)
        await asyncio.wait_for(aer, 30)
        assert (await ctrl.identify_namespace(1)).nsze == 4 * MiB // BLOCK
        assert "size 4 MiB" in _rbd_info(ceph_cluster, image)
        (bdev,) = await cp.call("bdev_get_bdevs", {"name": name})
        assert bdev["num_blocks"] == 4 * MiB // BLOCK
    finally:
        await ctrl.close()


async def test_a_cut_by_another_ceph_client_under_io_is_followed(
    ceph_cluster: CephCluster, served: tuple[Target, str]
) -> None:
    """`rbd resize --allow-shrink` from another client while two queues read past the new
    end: the watch hears it and the target follows (quiesced, nothing more cut): the
    event, NSZE, `bdev_resize`; a read past the end fails with a status (librbd's
    error until followed, LBA Out of Range after), the blocks below it kept."""
    target, image = served
    cp = control_plane(target)
    (name,) = [n for n, e in target.block_devices.items() if e.kind == "rbd"]
    ctrl = await connect("127.0.0.1", _port(target), NQN, queues=2)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        half = 4 * MiB // BLOCK

        async def cut() -> None:
            proc = await asyncio.create_subprocess_exec(
                "rbd", "-c", str(ceph_cluster.conf), "resize", "--allow-shrink",
                "--size", "4M", f"rbd/{image}",
            )  # fmt: skip
            assert await asyncio.wait_for(proc.wait(), 60) == 0
            await asyncio.wait_for(aer, 30)

        counts = await run_reads_past(ctrl, 1, half, [cut])
        for c in counts:
            assert set(c) <= {
                Status.SUCCESS,
                Status.UNRECOVERED_READ_ERROR,
                Status.LBA_OUT_OF_RANGE,
            }, c
            assert c.get(Status.LBA_OUT_OF_RANGE), c
        assert (await ctrl.identify_namespace(1)).nsze == half
        (bdev,) = await cp.call("bdev_get_bdevs", {"name": name})
        assert bdev["num_blocks"] == half
        notes = await cp.call("notify_get_notifications", {})
        assert [n["ctx"] for n in notes if n["type"] == "bdev_resize"] == [name]
        assert "size 4 MiB" in _rbd_info(ceph_cluster, image)
    finally:
        await ctrl.close()
