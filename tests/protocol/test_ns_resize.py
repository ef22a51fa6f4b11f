"""A namespace that grows while hosts use it: SPDK's bdev_aio_rescan (the file grew
outside) and pynvmf_bdev_resize (grown here), what a connected host sees (the event,
the Changed Namespace List, Identify's new size, I/O past the old end), SPDK's
bdev_resize notification, and the sizes refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pynvmf.host import NvmeError
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import Status
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget
from tests.protocol.test_ns_visibility import HOST_A

pytestmark = pytest.mark.timeout(120)

BLOCK = 512
BLOCKS = 2048


async def _file_namespace(raw_rpc_target: RawRpcTarget, path: Path) -> int:
    path.write_bytes(b"")
    os.truncate(path, BLOCKS * BLOCK)
    await raw_rpc_target.ok("bdev_aio_create", name="Grow0", filename=str(path), block_size=BLOCK)
    nsid: int = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": "Grow0"}
    )
    return nsid


async def _read_status(ctrl: object, nsid: int, lba: int) -> int:
    try:
        await ctrl.io_command(  # type: ignore[attr-defined]
            IoOpcode.READ, nsid, lba, 0, 0, into=memoryview(bytearray(BLOCK))
        )
    except NvmeError as exc:
        return exc.status & 0x7FF
    return Status.SUCCESS


async def test_a_grown_file_is_seen_by_the_connected_host(
    raw_rpc_target: RawRpcTarget, tmp_path: Path
) -> None:
    path = tmp_path / "grow.img"
    nsid = await _file_namespace(raw_rpc_target, path)
    ctrl = await raw_rpc_target.host(HOST_A)
    try:
        assert (await ctrl.identify_namespace(nsid)).nsze == BLOCKS
        assert await _read_status(ctrl, nsid, BLOCKS) == Status.LBA_OUT_OF_RANGE
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        os.truncate(path, 2 * BLOCKS * BLOCK)  # grown outside, as `truncate -s` does
        assert await raw_rpc_target.ok("bdev_aio_rescan", name="Grow0") is True
        await asyncio.wait_for(aer, 10)
        changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [nsid]
        ident = await ctrl.identify_namespace(nsid)
        assert ident.nsze == ident.ncap == 2 * BLOCKS
        assert await _read_status(ctrl, nsid, 2 * BLOCKS - 1) == Status.SUCCESS
        (bdev,) = await raw_rpc_target.ok("bdev_get_bdevs", name="Grow0")
        assert bdev["num_blocks"] == 2 * BLOCKS

        # Grown by the target itself.
        assert await raw_rpc_target.ok(
            "pynvmf_bdev_resize", name="Grow0", size_bytes=3 * BLOCKS * BLOCK
        ) == (3 * BLOCKS)
        assert path.stat().st_size == 3 * BLOCKS * BLOCK
        assert (await ctrl.identify_namespace(nsid)).nsze == 3 * BLOCKS
        notes = await raw_rpc_target.ok("notify_get_notifications")
        assert [n["ctx"] for n in notes if n["type"] == "bdev_resize"] == ["Grow0", "Grow0"]
    finally:
        await ctrl.close()


async def test_sizes_that_cannot_be_taken_are_refused_and_the_size_kept(
    raw_rpc_target: RawRpcTarget, tmp_path: Path
) -> None:
    path = tmp_path / "shrink.img"
    nsid = await _file_namespace(raw_rpc_target, path)
    await raw_rpc_target.ok("bdev_malloc_create", name="Mem0", num_blocks=64, block_size=512)
    # Not whole blocks (a file cut outside to whole blocks is followed instead:
    # tests/protocol/test_ns_shrink.py).
    os.truncate(path, BLOCKS * BLOCK + 100)
    cases = [
        ("bdev_aio_rescan", {"name": "Grow0"}, "name: "),
        ("bdev_aio_rescan", {"name": "Mem0"}, "name: "),
        ("bdev_aio_rescan", {"name": "Nope"}, "name: "),
        ("pynvmf_bdev_resize", {"name": "Grow0", "size_bytes": BLOCKS * BLOCK + 1}, "size_bytes: "),
        # Smaller drops data: only when forced (tests/protocol/test_ns_shrink.py).
        ("pynvmf_bdev_resize", {"name": "Grow0", "size_bytes": BLOCK}, "force: "),
        ("pynvmf_bdev_resize", {"name": "Mem0", "size_bytes": 32 * 512}, "force: "),
        ("pynvmf_bdev_resize", {"name": "Mem0", "size_bytes": 64 * 512 + 100}, "size_bytes: "),
    ]
    for method, params, prefix in cases:
        answer = await raw_rpc_target.call(method, **params)
        assert answer["error"]["code"] == -32602, (method, params, answer)
        assert answer["error"]["message"].startswith(prefix), (method, params, answer)
    ns = raw_rpc_target.target.subsystems[RAW_SUBNQN].namespaces[nsid]
    assert ns.num_blocks == BLOCKS
    assert raw_rpc_target.target.block_devices["Mem0"].device.capabilities.num_blocks == 64
    notes = await raw_rpc_target.ok("notify_get_notifications")
    assert not [n for n in notes if n["type"] == "bdev_resize"]


async def test_a_grown_memory_namespace_keeps_its_data_and_is_seen_by_the_host(
    raw_rpc_target: RawRpcTarget,
) -> None:
    await raw_rpc_target.ok("bdev_malloc_create", name="Mem1", num_blocks=BLOCKS, block_size=BLOCK)
    nsid = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": "Mem1"}
    )
    ctrl = await raw_rpc_target.host(HOST_A)
    try:
        data = os.urandom(BLOCK)
        await ctrl.io_command(IoOpcode.WRITE, nsid, BLOCKS - 1, 0, 0, data=memoryview(data))
        assert await _read_status(ctrl, nsid, BLOCKS) == Status.LBA_OUT_OF_RANGE
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        assert await raw_rpc_target.ok(
            "pynvmf_bdev_resize", name="Mem1", size_bytes=4 * BLOCKS * BLOCK
        ) == (4 * BLOCKS)
        await asyncio.wait_for(aer, 10)
        changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [nsid]
        ident = await ctrl.identify_namespace(nsid)
        assert ident.nsze == ident.ncap == ident.nuse == 4 * BLOCKS
        back = bytearray(BLOCK)
        await ctrl.io_command(IoOpcode.READ, nsid, BLOCKS - 1, 0, 0, into=memoryview(back))
        assert back == data  # kept
        await ctrl.io_command(IoOpcode.READ, nsid, 4 * BLOCKS - 1, 0, 0, into=memoryview(back))
        assert back == bytes(BLOCK)  # new blocks read as zeroes
        await ctrl.io_command(IoOpcode.WRITE, nsid, 4 * BLOCKS - 1, 0, 0, data=memoryview(data))
        await ctrl.io_command(IoOpcode.READ, nsid, 4 * BLOCKS - 1, 0, 0, into=memoryview(back))
        assert back == data
        (bdev,) = await raw_rpc_target.ok("bdev_get_bdevs", name="Mem1")
        assert bdev["num_blocks"] == 4 * BLOCKS
    finally:
        await ctrl.close()
