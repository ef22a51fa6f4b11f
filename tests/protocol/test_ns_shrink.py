"""A namespace cut while hosts use it (pynvmf_bdev_resize with force): refused without
force, naming it; with force the I/O in flight finishes and the new commands wait, the
file or memory is cut, the connected host hears of it (the event, the Changed Namespace
List, Identify's new size) and gets LBA Out of Range past the new end, the blocks below
it kept; reservations and rate limits on the namespace stay; save_config has the new
size. The same with `--cores 2` workers: tests/protocol/test_multicore.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from pynvmf.config.native import device_spec_of
from pynvmf.config.spdk import spdk_config
from pynvmf.host import NvmeError, NvmeStatusError, connect
from pynvmf.host.controller import Controller
from pynvmf.spec import logpages as L
from pynvmf.spec.identify import Oaes
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.reservations import ReservationType
from pynvmf.spec.status import Status
from tests.protocol.conftest import RAW_SUBNQN, RawRpcTarget
from tests.protocol.test_ns_visibility import HOST_A
from tests.support import raw as R

pytestmark = pytest.mark.timeout(120)

BLOCK = 512
BLOCKS = 2048
HALF = BLOCKS // 2


async def _add(raw_rpc_target: RawRpcTarget, kind: str, tmp_path: Path) -> tuple[str, int]:
    """A bdev of `kind` (memory or file) of BLOCKS blocks and its NSID."""
    if kind == "memory":
        await raw_rpc_target.ok(
            "bdev_malloc_create", name="Cut0", num_blocks=BLOCKS, block_size=BLOCK
        )
    else:
        path = tmp_path / "cut.img"
        path.write_bytes(b"")
        os.truncate(path, BLOCKS * BLOCK)
        await raw_rpc_target.ok(
            "bdev_aio_create", name="Cut0", filename=str(path), block_size=BLOCK
        )
    nsid: int = await raw_rpc_target.ok(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": "Cut0"}
    )
    return "Cut0", nsid


async def _status(ctrl: Controller, opcode: int, nsid: int, lba: int, nlb: int = 1) -> int:
    buf = memoryview(bytearray(nlb * BLOCK))
    try:
        if opcode == IoOpcode.READ:
            await ctrl.io_command(opcode, nsid, lba, 0, nlb - 1, into=buf)
        else:
            await ctrl.io_command(opcode, nsid, lba, 0, nlb - 1, data=buf)
    except NvmeError as exc:
        return exc.status & 0x7FF  # type: ignore[attr-defined]
    return Status.SUCCESS


async def _read(ctrl: Controller, nsid: int, lba: int, nlb: int = 1) -> bytes:
    buf = bytearray(nlb * BLOCK)
    await ctrl.io_command(IoOpcode.READ, nsid, lba, 0, nlb - 1, into=memoryview(buf))
    return bytes(buf)


async def test_a_shrink_without_force_is_refused_naming_force(
    raw_rpc_target: RawRpcTarget, tmp_path: Path
) -> None:
    name, nsid = await _add(raw_rpc_target, "file", tmp_path)
    answer = await raw_rpc_target.call("pynvmf_bdev_resize", name=name, size_bytes=HALF * BLOCK)
    assert answer["error"]["code"] == -32602
    assert answer["error"]["message"].startswith("force: "), answer
    assert "drops the data" in answer["error"]["message"]
    for params, prefix in [
        ({"force": "yes"}, "force"),  # not a boolean
        ({"force": True, "size_bytes": HALF * BLOCK + 100}, "size_bytes: "),
    ]:
        answer = await raw_rpc_target.call(
            "pynvmf_bdev_resize", name=name, **{"size_bytes": HALF * BLOCK, **params}
        )
        assert answer["error"]["code"] == -32602, (params, answer)
        assert answer["error"]["message"].startswith(prefix), (params, answer)
    assert raw_rpc_target.target.subsystems[RAW_SUBNQN].namespaces[nsid].num_blocks == BLOCKS
    assert (tmp_path / "cut.img").stat().st_size == BLOCKS * BLOCK
    notes = await raw_rpc_target.ok("notify_get_notifications")
    assert not [n for n in notes if n["type"] == "bdev_resize"]


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_a_forced_shrink_is_seen_by_the_connected_host(
    raw_rpc_target: RawRpcTarget, tmp_path: Path, kind: str
) -> None:
    name, nsid = await _add(raw_rpc_target, kind, tmp_path)
    ctrl = await raw_rpc_target.host(HOST_A)
    try:
        kept = os.urandom(BLOCK)
        await ctrl.io_command(IoOpcode.WRITE, nsid, HALF - 1, 0, 0, data=memoryview(kept))
        await ctrl.io_command(IoOpcode.WRITE, nsid, BLOCKS - 1, 0, 0, data=memoryview(kept))
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
        await asyncio.sleep(0)
        assert (
            await raw_rpc_target.ok(
                "pynvmf_bdev_resize", name=name, size_bytes=HALF * BLOCK, force=True
            )
            == HALF
        )
        await asyncio.wait_for(aer, 10)
        changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [nsid]
        ident = await ctrl.identify_namespace(nsid)
        assert ident.nsze == ident.ncap == HALF
        assert ident.nuse <= HALF
        assert await _read(ctrl, nsid, HALF - 1) == kept
        for opcode in (IoOpcode.READ, IoOpcode.WRITE):
            assert await _status(ctrl, opcode, nsid, HALF) == Status.LBA_OUT_OF_RANGE
            assert await _status(ctrl, opcode, nsid, HALF - 1, 2) == Status.LBA_OUT_OF_RANGE
            assert await _status(ctrl, opcode, nsid, BLOCKS - 1) == Status.LBA_OUT_OF_RANGE
        (bdev,) = await raw_rpc_target.ok("bdev_get_bdevs", name=name)
        assert bdev["num_blocks"] == HALF
        if kind == "file":
            assert (tmp_path / "cut.img").stat().st_size == HALF * BLOCK
        notes = await raw_rpc_target.ok("notify_get_notifications")
        assert [n["ctx"] for n in notes if n["type"] == "bdev_resize"] == [name]
        # Grown again, the blocks that were cut read as zeroes: the data past the end went.
        assert await raw_rpc_target.ok(
            "pynvmf_bdev_resize", name=name, size_bytes=BLOCKS * BLOCK
        ) == (BLOCKS)
        assert await _read(ctrl, nsid, BLOCKS - 1) == bytes(BLOCK)
        assert await _read(ctrl, nsid, HALF - 1) == kept
    finally:
        await ctrl.close()


async def io_loop(
    ctrl: Controller,
    queue: int,
    nsid: int,
    blocks: int,
    counts: dict[int, int],
    going: asyncio.Event,
) -> None:
    """On I/O queue `queue` (0 or 1), write then read back blocks of this queue's own
    (block b is queue (b // 32) % 2's) across the whole first size (`blocks`), in writes
    of 1 and 32 blocks, until `going` is cleared. Every command completes with a success
    or LBA Out of Range; what a read returns is what this loop wrote there."""
    q = ctrl.io_queues[queue]
    lba, n = 0, 0
    while going.is_set():
        nlb = 32 if n % 3 == 0 else 1
        start = lba - lba % 64 + queue * 32 + (0 if nlb == 32 else lba % 32)
        data = bytes([queue + 1, n % 251]) * (nlb * BLOCK // 2)
        status = Status.SUCCESS
        try:
            await q.execute(IoOpcode.WRITE, nsid, start, 0, nlb - 1, data=memoryview(data))
            back = bytearray(nlb * BLOCK)
            await q.execute(IoOpcode.READ, nsid, start, 0, nlb - 1, into=memoryview(back))
            assert back == data
        except NvmeStatusError as exc:
            status = exc.status
        counts[status] = counts.get(status, 0) + 1
        n += 1
        lba = (lba + blocks // 2 + 97) % blocks  # each other one past the half


async def run_io_across(
    ctrl: Controller, nsid: int, blocks: int, cut: Callable[[], Awaitable[object]]
) -> list[dict[int, int]]:
    """Run `io_loop` on I/O queues 0 and 1 while `cut()` runs, each queue's commands
    completed before and after it counted; the statuses they got, by queue."""
    going = asyncio.Event()
    going.set()
    counts: list[dict[int, int]] = [{}, {}]
    loops = [
        asyncio.ensure_future(io_loop(ctrl, q, nsid, blocks, counts[q], going)) for q in (0, 1)
    ]

    async def until(total: int) -> None:
        while min(sum(c.values()) for c in counts) < total:
            await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION, timeout=0.05)
            if any(loop.done() for loop in loops):
                await asyncio.gather(*loops)  # its failure, or a loop that ended early
                raise AssertionError("an I/O loop ended")

    try:
        await until(25)
        await cut()
        await until(min(sum(c.values()) for c in counts) + 25)
    finally:
        going.clear()
        await asyncio.gather(*loops)  # a read that returned other data fails here
    for c in counts:
        assert set(c) <= {Status.SUCCESS, Status.LBA_OUT_OF_RANGE}, c
        assert c.get(Status.LBA_OUT_OF_RANGE), c  # past the new end, after the cut
    return counts


@pytest.mark.parametrize(
    ("kind", "limited"), [("memory", False), ("file", False), ("memory", True)]
)
async def test_a_forced_shrink_while_io_runs(
    raw_rpc_target: RawRpcTarget, tmp_path: Path, kind: str, limited: bool
) -> None:
    name, nsid = await _add(raw_rpc_target, kind, tmp_path)
    if limited:  # commands wait for their turn: some are in flight when the cut starts
        await raw_rpc_target.ok("bdev_set_qos_limit", name=name, rw_ios_per_sec=2000)
    port = raw_rpc_target.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_SUBNQN, hostnqn=HOST_A, queues=2)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))

        async def cut() -> None:
            assert (
                await raw_rpc_target.ok(
                    "pynvmf_bdev_resize", name=name, size_bytes=HALF * BLOCK, force=True
                )
                == HALF
            )

        await run_io_across(ctrl, nsid, BLOCKS, cut)
        await asyncio.wait_for(aer, 10)
        assert (await ctrl.identify_namespace(nsid)).nsze == HALF
        if kind == "file":
            # Nothing wrote past the end once it was cut: the file was not extended again.
            assert (tmp_path / "cut.img").stat().st_size == HALF * BLOCK
    finally:
        await ctrl.close()


async def test_a_shrink_keeps_reservations_and_rate_limits(
    raw_rpc_target: RawRpcTarget, tmp_path: Path
) -> None:
    name, nsid = await _add(raw_rpc_target, "memory", tmp_path)
    await raw_rpc_target.ok("bdev_set_qos_limit", name=name, rw_ios_per_sec=100000)
    ctrl = await raw_rpc_target.host(HOST_A)
    try:
        ns = ctrl.namespace(nsid)
        await ns.reservation_register(nrkey=0xA1)
        await ns.reservation_acquire(ReservationType.WRITE_EXCLUSIVE, crkey=0xA1)
        assert (
            await raw_rpc_target.ok(
                "pynvmf_bdev_resize", name=name, size_bytes=HALF * BLOCK, force=True
            )
            == HALF
        )
        report = await ns.reservation_report()
        assert report.rtype == ReservationType.WRITE_EXCLUSIVE
        assert [r.rkey for r in report.registrants] == [0xA1]
        assert await _status(ctrl, IoOpcode.WRITE, nsid, HALF - 1) == Status.SUCCESS
        assert await _status(ctrl, IoOpcode.WRITE, nsid, HALF) == Status.LBA_OUT_OF_RANGE
        (bdev,) = await raw_rpc_target.ok("bdev_get_bdevs", name=name)
        assert bdev["assigned_rate_limits"]["rw_ios_per_sec"] == 100000
        assert bdev["num_blocks"] == HALF
        spdk = spdk_config(raw_rpc_target.target)  # what SPDK's rpc.py save_config writes
        (bdevs,) = [s for s in spdk["subsystems"] if s["subsystem"] == "bdev"]
        (create,) = [
            c
            for c in bdevs["config"]
            if c["method"] == "bdev_malloc_create" and c["params"]["name"] == name
        ]
        assert create["params"]["num_blocks"] == HALF
        qos = [c for c in bdevs["config"] if c["method"] == "bdev_set_qos_limit"]
        assert [c["params"]["rw_ios_per_sec"] for c in qos] == [100000]
        # pynvmf's own format (pynvmf_save_config) too.
        entry = raw_rpc_target.target.block_devices[name]
        assert device_spec_of(entry, with_name=True)["memory"] == HALF * BLOCK
    finally:
        await ctrl.close()


async def test_a_shrink_waits_for_the_commands_in_flight_and_holds_the_new_ones(
    raw_rpc_target: RawRpcTarget, tmp_path: Path
) -> None:
    """A Write past the new end whose data has not come yet is in flight: the shrink
    waits for it (it completes, written), a Read sent meanwhile waits for the shrink
    (and is then past the end)."""
    name, nsid = await _add(raw_rpc_target, "memory", tmp_path)
    target = raw_rpc_target.target
    host = await raw_rpc_target.raw.host(io_queues=2)
    writer, reader = host.io
    await writer.detach()
    await reader.detach()
    nblocks = 64  # 32 KiB: above the in-capsule size, so the target asks for it with R2T
    writer.send(
        writer.capsule(R.rw_sqe(IoOpcode.WRITE, 9, nsid, BLOCKS - 64, nblocks, nblocks * BLOCK))
    )
    r2t = await writer.recv_pdu()
    assert r2t.type == R.P.PduType.R2T
    cccid, ttag, _offset, length = r2t.data_fields()
    subsystem = target.subsystems[RAW_SUBNQN]
    shrink = asyncio.ensure_future(target.resize_block_device(name, HALF * BLOCK, force=True))
    async with asyncio.timeout(10):
        while nsid not in subsystem.quiesced:
            await asyncio.sleep(0.01)
    (ctrl,) = subsystem.controllers.values()
    reader.send(reader.capsule(R.rw_sqe(IoOpcode.READ, 10, nsid, BLOCKS - 1, 1, BLOCK)))
    async with asyncio.timeout(10):
        while sum(len(q.commands_waiting) for q in ctrl.queues.values()) < 2:
            await asyncio.sleep(0.01)  # the Read arrived, and waits
    assert not shrink.done()
    writer.send(R.h2c_data(cccid, ttag, 0, b"w" * length))
    resp = await writer.recv_pdu()
    assert resp.cqe().cid == 9 and resp.cqe().status == 0  # started before: it finishes
    assert await asyncio.wait_for(shrink, 10) == HALF
    resp = await reader.recv_pdu()
    assert resp.cqe().cid == 10
    assert resp.cqe().status & 0x7FF == Status.LBA_OUT_OF_RANGE  # judged by the new size
    assert not subsystem.quiesced


async def reads_past_loop(
    ctrl: Controller,
    queue: int,
    nsid: int,
    half: int,
    counts: dict[int, int],
    going: asyncio.Event,
) -> None:
    """On I/O queue `queue` (0 or 1), write then read back a block of this queue's own
    below `half` (block b is queue b % 2's), and read one past it (never written: zeroes
    while it is there), until `going` is cleared. Nothing writes past `half`, so a file
    cut there outside is not extended again. The statuses, counted in `counts`."""
    q = ctrl.io_queues[queue]
    n = 0
    while going.is_set():
        lba = (n * 37 % (half // 2)) * 2 + queue
        data = bytes([queue + 1, n % 251]) * (BLOCK // 2)
        await q.execute(IoOpcode.WRITE, nsid, lba, 0, 0, data=memoryview(data))
        back = bytearray(BLOCK)
        await q.execute(IoOpcode.READ, nsid, lba, 0, 0, into=memoryview(back))
        assert back == data
        status = Status.SUCCESS
        try:
            await q.execute(IoOpcode.READ, nsid, half + n % half, 0, 0, into=memoryview(back))
            assert back == bytes(BLOCK)
        except NvmeStatusError as exc:
            status = exc.status
        counts[status] = counts.get(status, 0) + 1
        n += 1


async def run_reads_past(
    ctrl: Controller, nsid: int, half: int, steps: list[Callable[[], Awaitable[object]]]
) -> list[dict[int, int]]:
    """Run `reads_past_loop` on I/O queues 0 and 1, each step run once both queues
    completed 20 more reads past `half` since the one before; the statuses, by queue."""
    going = asyncio.Event()
    going.set()
    counts: list[dict[int, int]] = [{}, {}]
    loops = [
        asyncio.ensure_future(reads_past_loop(ctrl, q, nsid, half, counts[q], going))
        for q in (0, 1)
    ]

    async def until(total: int) -> None:
        while min(sum(c.values()) for c in counts) < total:
            await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION, timeout=0.05)
            if any(loop.done() for loop in loops):
                await asyncio.gather(*loops)  # its failure, or a loop that ended early
                raise AssertionError("an I/O loop ended")

    try:
        for step in [*steps, None]:
            await until(min(sum(c.values()) for c in counts) + 20)
            if step is not None:
                await step()
    finally:
        going.clear()
        await asyncio.gather(*loops)  # a read that returned other data fails here
    return counts


@pytest.mark.parametrize("method", ["bdev_aio_rescan", "pynvmf_bdev_resize"])
async def test_a_file_truncated_outside_while_io_runs_is_followed_on_rescan(
    raw_rpc_target: RawRpcTarget, tmp_path: Path, method: str
) -> None:
    """Another process truncates the file under I/O: reads past the new end get
    Unrecovered Read Error (nothing maps the file, so nothing faults), the blocks below
    are kept; the rescan follows the cut (quiesced, as a forced shrink, nothing more
    cut): the event, NSZE, `bdev_resize`, and LBA Out of Range past the end."""
    name, nsid = await _add(raw_rpc_target, "file", tmp_path)
    path = tmp_path / "cut.img"
    port = raw_rpc_target.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_SUBNQN, hostnqn=HOST_A, queues=2)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))

        async def truncate() -> None:
            os.truncate(path, HALF * BLOCK)

        async def rescan() -> None:
            assert not aer.done()
            await raw_rpc_target.ok(method, name=name)

        counts = await run_reads_past(ctrl, nsid, HALF, [truncate, rescan])
        for c in counts:
            assert set(c) == {
                Status.SUCCESS,
                Status.UNRECOVERED_READ_ERROR,
                Status.LBA_OUT_OF_RANGE,
            }, c
        await asyncio.wait_for(aer, 10)
        changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [nsid]
        assert (await ctrl.identify_namespace(nsid)).nsze == HALF
        (bdev,) = await raw_rpc_target.ok("bdev_get_bdevs", name=name)
        assert bdev["num_blocks"] == HALF
        notes = await raw_rpc_target.ok("notify_get_notifications")
        assert [n["ctx"] for n in notes if n["type"] == "bdev_resize"] == [name]
        assert await _status(ctrl, IoOpcode.WRITE, nsid, HALF) == Status.LBA_OUT_OF_RANGE
        assert path.stat().st_size == HALF * BLOCK
        # Nothing changed since: a second rescan sends nothing.
        await raw_rpc_target.ok(method, name=name)
        notes = await raw_rpc_target.ok("notify_get_notifications")
        assert len([n for n in notes if n["type"] == "bdev_resize"]) == 1
    finally:
        await ctrl.close()
