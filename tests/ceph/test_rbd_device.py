"""RbdDevice (pynvmf.block.rbd) against a real Ceph cluster (tests/support/ceph_cluster.py)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable

import pytest

from pynvmf.block import copy as block_copy
from pynvmf.block.device import BlockDevice, BlockRangeError, StorageUnavailable
from pynvmf.block.rbd import ClusterSpec, DeviceState, RadosConnection, RbdDevice
from tests.support.ceph_cluster import CephCluster

MiB = 1 << 20


async def _open(cluster: CephCluster, image: str, **kwargs: object) -> RbdDevice:
    return await RbdDevice.open_async("rbd", image, conf=str(cluster.conf), **kwargs)


async def test_read_write_flush_zeroes_deallocate(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    name = rbd_image(16 * MiB)
    dev = await _open(ceph_cluster, name)
    try:
        assert isinstance(dev, BlockDevice)
        caps = dev.capabilities
        assert caps.block_size == 512 and caps.num_blocks == 16 * MiB // 512
        assert caps.deallocated_reads_zero and not caps.native_copy
        assert caps.volatile_write_cache  # librbd's cache is on by default
        data = os.urandom(MiB)
        await dev.write(100, data, fua=True)
        await dev.write(100 + 2048, memoryview(data)[: 64 * 1024])  # a memoryview too
        await dev.flush()
        buf = bytearray(MiB)
        await dev.read(100, memoryview(buf))
        assert buf == data
        # Unaligned to RBD's discard granularity and object size: still reads zeroes.
        await dev.deallocate(101, 3)
        await dev.write_zeroes(1000, 7, fua=True)
        await dev.read(100, memoryview(buf))
        expect = bytearray(data)
        expect[512 : 4 * 512] = bytes(3 * 512)
        expect[900 * 512 : 907 * 512] = bytes(7 * 512)
        assert buf == expect
        # A second client (other options: another connection), without librbd's cache:
        # it sees it all, and reports no volatile write cache.
        other = RbdDevice.open(
            "rbd", name, conf=str(ceph_cluster.conf), options={"rbd_cache": "false"}
        )
        try:
            assert other.connection is not dev.connection
            assert not other.capabilities.volatile_write_cache
            again = bytearray(MiB)
            await other.read(100, memoryview(again))
            assert again == expect
            assert other.medium == dev.medium  # one storage, for the copy planner
        finally:
            await other.close()
        with pytest.raises(BlockRangeError):
            await dev.read(caps.num_blocks - 1, memoryview(bytearray(1024)))
        with pytest.raises(BlockRangeError):
            await dev.write_zeroes(caps.num_blocks, 1)
        with pytest.raises(ValueError):
            await dev.write(0, b"x" * 100)
    finally:
        await dev.close()
    assert dev.state is DeviceState.CLOSED
    with pytest.raises(OSError):
        await dev.read(0, memoryview(bytearray(512)))


async def test_many_requests_in_flight(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    """librbd's aio completions come back on librbd's threads: the bridge lets 64
    commands wait at once, and each gets its own data."""
    dev = await _open(ceph_cluster, rbd_image(16 * MiB), block_size=4096)
    try:
        blocks = [os.urandom(4096) for _ in range(64)]
        peak = 0

        async def write(i: int) -> None:
            nonlocal peak
            task = asyncio.ensure_future(dev.write(i * 3, blocks[i]))
            await asyncio.sleep(0)
            peak = max(peak, dev._inflight)
            await task

        await asyncio.gather(*(write(i) for i in range(64)))
        assert peak > 1
        bufs = [bytearray(4096) for _ in range(64)]
        await asyncio.gather(*(dev.read(i * 3, memoryview(bufs[i])) for i in range(64)))
        assert [bytes(b) for b in bufs] == blocks
    finally:
        await dev.close()


async def test_copy_is_emulated_through_the_planner(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    dev = await _open(ceph_cluster, rbd_image(16 * MiB))
    try:
        data = os.urandom(3 * MiB)
        await dev.write(0, data)
        # Overlapping source and destination: staged, then written (read-all-first).
        report = await block_copy.copy_blocks(dev, 0, dev, 2048, 6144, fua=True)
        assert report.emulated_blocks == 6144 and report.offloaded_blocks == 0
        assert report.native_blocks == 0
        buf = bytearray(4 * MiB)
        await dev.read(0, memoryview(buf))
        assert buf[:MiB] == data[:MiB] and buf[MiB:] == data
    finally:
        await dev.close()


async def test_open_errors_name_what_is_missing(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    with pytest.raises(OSError) as info:
        await _open(ceph_cluster, "no-such-image")
    assert info.value.errno == errno.ENOENT and "no-such-image" in str(info.value)
    with pytest.raises(OSError) as info:
        await RbdDevice.open_async("no-such-pool", "x", conf=str(ceph_cluster.conf))
    assert info.value.errno == errno.ENOENT and "no-such-pool" in str(info.value)
    with pytest.raises(ValueError):
        await _open(ceph_cluster, rbd_image(MiB), block_size=1000)
    # Nothing leaked: every failed open let go of the shared connection.
    spec = ClusterSpec.of(str(ceph_cluster.conf))
    assert spec not in RadosConnection._shared


async def test_an_open_image_cannot_be_removed(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    """ "Image removed" under a gateway cannot happen: Ceph refuses to remove an image
    that a client has open (its watch), so the gateway's data is never pulled away."""
    import rbd

    name = rbd_image(MiB)
    dev = await _open(ceph_cluster, name)
    try:
        with ceph_cluster.admin().open_ioctx("rbd") as io, pytest.raises(rbd.ImageBusy):
            rbd.RBD().remove(io, name)
        await dev.write(0, b"k" * 512)
    finally:
        await dev.close()


async def test_blocklisted_client_is_fenced(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    """Blocklisting the device's client mid-I/O: every request fails with
    StorageUnavailable (ESHUTDOWN), the state says FENCED once, and a new device on the
    same cluster gets a new client that works."""
    name = rbd_image(4 * MiB)
    # A client of its own, so that fencing it does not fence the other tests' devices.
    dev = await _open(ceph_cluster, name, options={"client_mount_timeout": "30"})
    # Another image on the same client: fenced with it, without a request of its own.
    sibling = await _open(ceph_cluster, rbd_image(MiB), options={"client_mount_timeout": "30"})
    assert sibling.connection is dev.connection
    sibling_seen: list[DeviceState] = []
    sibling.add_state_listener(lambda d, s: sibling_seen.append(s))
    seen: list[DeviceState] = []
    dev.add_state_listener(lambda d, s: seen.append(s))
    try:
        await dev.write(0, b"a" * 4096)
        writes = [asyncio.ensure_future(dev.write(8 * i, b"b" * 4096)) for i in range(32)]
        ceph_cluster.blocklist(dev.connection.address)
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        # Requests librbd had sent before the OSD map reached the client may complete;
        # once the client has the map (as a new owner makes sure), every request fails.
        await asyncio.to_thread(dev.connection.cluster.wait_for_latest_osdmap)
        with pytest.raises(StorageUnavailable) as info:
            await dev.write(0, b"c" * 4096)
        assert info.value.errno == errno.ESHUTDOWN
        assert all(o is None or isinstance(o, StorageUnavailable) for o in outcomes)
        assert dev.state is DeviceState.FENCED and seen == [DeviceState.FENCED]
        assert sibling.state is DeviceState.FENCED and sibling_seen == [DeviceState.FENCED]
        with pytest.raises(StorageUnavailable):
            await dev.read(0, memoryview(bytearray(512)))
        with pytest.raises(StorageUnavailable):
            await dev.flush()
        assert seen == [DeviceState.FENCED]
    finally:
        await dev.close()
        await sibling.close()
    # The same spec now gets a fresh client (a new address, not on the blocklist).
    fresh = await _open(ceph_cluster, name, options={"client_mount_timeout": "30"})
    try:
        buf = bytearray(4096)
        await fresh.read(0, memoryview(buf))
        # The write that failed ("c") never landed; one of the batch may have, before.
        assert buf in (b"a" * 4096, b"b" * 4096)
    finally:
        await fresh.close()


async def test_osd_stopped_times_out_then_recovers(
    ceph_cluster: CephCluster, rbd_image: Callable[[int], str]
) -> None:
    """With the OSD frozen (SIGSTOP), requests fail after io_timeout with
    StorageUnavailable(ETIMEDOUT) and the state is UNREACHABLE; once the OSD runs again,
    the next request succeeds and the state is OK."""
    dev = await _open(ceph_cluster, rbd_image(4 * MiB), io_timeout=1.5)
    seen: list[DeviceState] = []
    dev.add_state_listener(lambda d, s: seen.append(s))
    try:
        await dev.write(0, b"z" * 4096)
        ceph_cluster.freeze(ceph_cluster.osd_name)
        try:
            with pytest.raises(StorageUnavailable) as info:
                await dev.write(8, b"y" * 4096)
            assert info.value.errno == errno.ETIMEDOUT
            assert dev.state is DeviceState.UNREACHABLE
        finally:
            ceph_cluster.thaw(ceph_cluster.osd_name)
        buf = bytearray(4096)
        for _ in range(20):  # the OSD needs a moment to answer the resent requests
            try:
                await dev.read(0, memoryview(buf))
                break
            except StorageUnavailable:
                continue
        assert buf == b"z" * 4096
        assert dev.state is DeviceState.OK
        assert seen == [DeviceState.UNREACHABLE, DeviceState.OK]
    finally:
        await dev.close()
