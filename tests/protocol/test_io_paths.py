"""The I/O fast path's table (target/io.py FastNamespace, kept by
Subsystem.refresh_io_paths) follows every change the Target makes to a namespace a host
is already using: each test first has the connected host read and write through the
fast path, then changes the namespace, and checks that the next command gets what the
general path decides (a stale table would complete it at once, as before the change)."""

from __future__ import annotations

import os
import time

import pytest

from pynvmf.host import NvmeError
from pynvmf.host.controller import Controller
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget

pytestmark = pytest.mark.timeout(120)

HOST = "nqn.2014-08.org.nvmexpress:uuid:0000000c-0000-4000-8000-00000000000c"
BLOCK = 512
BLOCKS = 2048
NLB_4K = 8


async def _memory_namespace(raw_rpc_target: RawRpcTarget, name: str) -> int:
    await raw_rpc_target.ok("bdev_malloc_create", name=name, num_blocks=BLOCKS, block_size=BLOCK)
    nsid: int = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": name}
    )
    return nsid


async def _status(ctrl: Controller, opcode: int, nsid: int, lba: int) -> int:
    """The status of a one-block Read or Write at `lba`."""
    try:
        if opcode == IoOpcode.READ:
            await ctrl.io_command(opcode, nsid, lba, 0, 0, into=memoryview(bytearray(BLOCK)))
        else:
            await ctrl.io_command(opcode, nsid, lba, 0, 0, data=memoryview(bytes(BLOCK)))
    except NvmeError as exc:
        return exc.status & 0x7FF
    return Status.SUCCESS


async def _fast_path_used(ctrl: Controller, nsid: int, lba: int) -> None:
    """A Write and a Read the fast path completes (its table holds the namespace now)."""
    data = os.urandom(BLOCK)
    await ctrl.io_command(IoOpcode.WRITE, nsid, lba, 0, 0, data=memoryview(data))
    back = bytearray(BLOCK)
    await ctrl.io_command(IoOpcode.READ, nsid, lba, 0, 0, into=memoryview(back))
    assert back == data


async def test_rate_limits_set_after_connect_make_the_next_reads_wait_their_turn(
    raw_rpc_target: RawRpcTarget,
) -> None:
    nsid = await _memory_namespace(raw_rpc_target, "Fast0")
    ctrl = await raw_rpc_target.host(HOST)
    try:
        await _fast_path_used(ctrl, nsid, 0)
        assert await raw_rpc_target.ok("bdev_set_qos_limit", name="Fast0", r_mbytes_per_sec=1)
        # 400 KiB at 1 MiB/s, less the 50 ms burst the limit allows (qos.TOLERANCE_NS):
        # at least 0.34 s; unpaced (a stale table) the reads take a few milliseconds.
        into = memoryview(bytearray(NLB_4K * BLOCK))
        start = time.monotonic()
        for i in range(100):
            await ctrl.io_command(
                IoOpcode.READ, nsid, (i * NLB_4K) % BLOCKS, 0, NLB_4K - 1, into=into
            )
        assert time.monotonic() - start >= 0.3
        # Removed again: the namespace takes the fast path again, unpaced.
        assert await raw_rpc_target.ok("bdev_set_qos_limit", name="Fast0", r_mbytes_per_sec=0)
        await _fast_path_used(ctrl, nsid, 0)
    finally:
        await ctrl.close()


async def test_a_removed_namespace_is_an_invalid_namespace_at_once(
    raw_rpc_target: RawRpcTarget,
) -> None:
    nsid = await _memory_namespace(raw_rpc_target, "Fast1")
    ctrl = await raw_rpc_target.host(HOST)
    try:
        await _fast_path_used(ctrl, nsid, 0)
        await raw_rpc_target.ok("nvmf_subsystem_remove_ns", nqn=RAW_SUBNQN, nsid=nsid)
        for opcode in (IoOpcode.READ, IoOpcode.WRITE):
            assert await _status(ctrl, opcode, nsid, 0) == Status.INVALID_NS
    finally:
        await ctrl.close()


async def test_a_namespace_detached_from_the_host_is_an_invalid_namespace_to_it(
    raw_rpc_target: RawRpcTarget,
) -> None:
    await raw_rpc_target.ok("bdev_malloc_create", name="Fast2", num_blocks=BLOCKS, block_size=BLOCK)
    nsid = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns",
        nqn=RAW_SUBNQN,
        namespace={"bdev_name": "Fast2", "no_auto_visible": True},
    )
    await raw_rpc_target.ok("nvmf_ns_add_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST)
    ctrl = await raw_rpc_target.host(HOST)
    try:
        await _fast_path_used(ctrl, nsid, 0)
        await raw_rpc_target.ok("nvmf_ns_remove_host", nqn=RAW_SUBNQN, nsid=nsid, host=HOST)
        for opcode in (IoOpcode.READ, IoOpcode.WRITE):
            assert await _status(ctrl, opcode, nsid, 0) == Status.INVALID_NS
    finally:
        await ctrl.close()


async def test_a_cut_namespace_refuses_the_blocks_past_its_new_end_and_grows_back(
    raw_rpc_target: RawRpcTarget,
) -> None:
    nsid = await _memory_namespace(raw_rpc_target, "Fast3")
    ctrl = await raw_rpc_target.host(HOST)
    try:
        await _fast_path_used(ctrl, nsid, BLOCKS - 1)
        await raw_rpc_target.ok(
            "pynvmf_bdev_resize", name="Fast3", size_bytes=BLOCKS // 2 * BLOCK, force=True
        )
        for opcode in (IoOpcode.READ, IoOpcode.WRITE):
            assert await _status(ctrl, opcode, nsid, BLOCKS - 1) == Status.LBA_OUT_OF_RANGE
            assert await _status(ctrl, opcode, nsid, BLOCKS // 2) == Status.LBA_OUT_OF_RANGE
        await _fast_path_used(ctrl, nsid, BLOCKS // 2 - 1)
        # Grown again: the new blocks are served, zeroes until written.
        await raw_rpc_target.ok("pynvmf_bdev_resize", name="Fast3", size_bytes=BLOCKS * BLOCK)
        back = bytearray(BLOCK)
        await ctrl.io_command(IoOpcode.READ, nsid, BLOCKS - 1, 0, 0, into=memoryview(back))
        assert back == bytes(BLOCK)
        await _fast_path_used(ctrl, nsid, BLOCKS - 1)
    finally:
        await ctrl.close()
