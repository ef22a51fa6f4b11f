"""`--cores 2`: I/O queues on two worker processes, the target's state in the main one.

The target runs here (the main process, as `pynvmf target --cores 2` runs it) and
its two workers are real processes; hosts are pynvmf's host library and the raw
client over TCP. What is checked: queues land on both workers and see one
namespace's bytes (memory and file), namespaces added and removed reach I/O on
every worker, keep alive counts I/O on the workers and its expiry closes their
queues, I/O queues connected with another Host Identifier than the admin queue run
on the workers, the SMART log of a subsystem created again counts its own I/O only,
a reservation taken through one worker is enforced on another, a queue on a worker
keeps what its connection negotiated in the main process (digests, HPDA, SQ flow
control), and a killed worker's queues drop while the host reconnects.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.block.shared_memory import SharedMemoryDevice
from pynvmf.host import Controller, NvmeStatusError, connect
from pynvmf.host.queue import HostQueue
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.spec import command as C
from pynvmf.spec import logpages as L
from pynvmf.spec import pdu as P
from pynvmf.spec.command import RW_FUA
from pynvmf.spec.identify import Oaes
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, FeatureId, IoOpcode
from pynvmf.spec.reservations import ReservationType
from pynvmf.spec.status import Status
from pynvmf.target.cores.workers import MultiCoreTarget, RemoteQueue, make_target
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from pynvmf.target.target import Target
from tests.protocol.conftest import RawTarget
from tests.protocol.test_ns_shrink import run_io_across, run_reads_past
from tests.support.raw import HOSTID, HOSTNQN, RawQueue, rw_sqe
from tests.support.scrape import samples_of, value

NQN = "nqn.2024-01.io.pynvmf.test:cores"
BLOCK = 512
BLOCKS = 8192


def _identity(n: int) -> tuple[str, bytes]:
    ident = uuid.UUID(f"00000000-0000-4000-8000-0000000000{n:02x}")
    return f"nqn.2014-08.org.nvmexpress:uuid:{ident}", ident.bytes


HOST_A, HOST_B = _identity(0xA), _identity(0xB)

Start = Callable[..., Awaitable[MultiCoreTarget]]


def _add_memory(target: Target, nsid: int, blocks: int = BLOCKS) -> None:
    device = target.memory_device(blocks * BLOCK, BLOCK)
    entry = NamedDevice.wrap(f"{NQN}/{nsid}", device, owned=True)
    target.add_namespace(NQN, entry, nsid=nsid)


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    started: list[MultiCoreTarget] = []

    async def make(namespaces: int = 1, file: Path | None = None) -> MultiCoreTarget:
        target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0)])
        target.add_subsystem(NQN)
        if file is not None:
            device = FileDevice(file, BLOCK, size_bytes=BLOCKS * BLOCK, create=True)
            target.add_namespace(NQN, NamedDevice.wrap("file", device, owned=True), nsid=1)
        for nsid in range(1 if file is None else 2, namespaces + 1):
            _add_memory(target, nsid)
        await target.start()
        started.append(target)
        return target

    yield make
    for target in started:
        await target.stop()


@pytest.fixture
async def hosts() -> AsyncIterator[Callable[..., Awaitable[Controller]]]:
    made: list[Controller] = []

    async def make(target: Target, who: tuple[str, bytes] = HOST_A, **kw: Any) -> Controller:
        ctrl = await connect(
            "127.0.0.1", target.ports[0].port, NQN, hostnqn=who[0], hostid=who[1], **kw
        )
        made.append(ctrl)
        return ctrl

    yield make
    for ctrl in made:
        await ctrl.close()


Hosts = Callable[..., Awaitable[Controller]]


def _placement(target: MultiCoreTarget) -> list[int]:
    """How many I/O queues each worker serves."""
    assert target.workers is not None
    return [len(w.queues) for w in target.workers.workers]


async def _write(
    queue: HostQueue, lba: int, data: bytes, *, nsid: int = 1, fua: bool = False
) -> None:
    nlb = len(data) // BLOCK
    cdw12 = (nlb - 1) | (RW_FUA if fua else 0)
    await queue.execute(IoOpcode.WRITE, nsid, lba, 0, cdw12, data=memoryview(data))


async def _read(queue: HostQueue, lba: int, nlb: int, *, nsid: int = 1) -> bytearray:
    buf = bytearray(nlb * BLOCK)
    await queue.execute(IoOpcode.READ, nsid, lba, 0, nlb - 1, into=memoryview(buf))
    return buf


async def _status_of(aw: Awaitable[object]) -> int:
    try:
        await aw
    except NvmeStatusError as exc:
        return exc.status
    return Status.SUCCESS


def test_one_core_is_the_single_process_target() -> None:
    target = make_target(1)
    assert type(target) is Target
    assert isinstance(make_target(2), MultiCoreTarget)


@pytest.mark.parametrize("backend", ["memory", "file"])
async def test_queues_spread_over_both_workers_and_see_the_same_bytes(
    start: Start, hosts: Hosts, tmp_path: Path, backend: str
) -> None:
    target = await start(file=tmp_path / "ns.img" if backend == "file" else None)
    ctrl = await hosts(target, queues=4)
    assert _placement(target) == [2, 2]
    # Every queue is a RemoteQueue in the main process's controller table.
    owner = next(iter(target.subsystems[NQN].controllers.values()))
    assert sorted(owner.queues) == [0, 1, 2, 3, 4]
    assert all(isinstance(owner.queues[qid], RemoteQueue) for qid in (1, 2, 3, 4))
    workers = {owner.queues[qid].worker.index for qid in (1, 2, 3, 4)}  # type: ignore[union-attr]
    assert workers == {0, 1}
    queues = ctrl.io_queues
    # Each queue writes its own blocks (FUA on the file), every queue reads all of them.
    patterns = [bytes([0x40 + i]) * (8 * BLOCK) for i in range(len(queues))]
    for i, queue in enumerate(queues):
        await _write(queue, i * 8, patterns[i], fua=backend == "file")
    for queue in queues:
        for i, pattern in enumerate(patterns):
            assert await _read(queue, i * 8, 8) == pattern
    if backend == "file":
        # What the workers wrote is in the file itself.
        assert (tmp_path / "ns.img").read_bytes()[: 8 * BLOCK] == patterns[0]


async def test_a_namespace_added_and_removed_reaches_io_on_every_worker(
    start: Start, hosts: Hosts
) -> None:
    target = await start()
    ctrl = await hosts(target, queues=2)
    assert _placement(target) == [1, 1]
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    _add_memory(target, 2, blocks=1024)
    await asyncio.wait_for(aer, 10)  # what a host waits for before it uses the namespace
    changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
    assert changed.nsids == [2]
    data = b"\x5a" * BLOCK
    for queue in ctrl.io_queues:
        await _write(queue, 0, data, nsid=2)
        assert await _read(queue, 0, 1, nsid=2) == data
    # One event for the one change, however many workers serve the controller.
    again = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    await target.remove_namespace(NQN, 2)
    await asyncio.wait_for(again, 10)
    changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
    assert changed.nsids == [2]
    for queue in ctrl.io_queues:
        assert await _status_of(_read(queue, 0, 1, nsid=2)) == Status.INVALID_NS


async def test_io_on_the_workers_is_keep_alive_traffic_and_expiry_closes_their_queues(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    target = await start()
    raw = raw_target_port(target)
    admin = await raw.admin(NQN, kato=500)
    io = [await raw.io_queue(admin, qid, NQN) for qid in (1, 2)]
    assert _placement(target) == [1, 1]
    # 1.5 s of I/O on both workers and no Keep Alive: the controller lives (TBKAS).
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for queue in io:
            done = await queue.read(1, 0, 1, BLOCK)
            assert done.status == 0
    assert not admin.eof
    # Silence: the controller goes, and its queues on both workers with it.
    await admin.expect_eof(timeout=10)
    for queue in io:
        await queue.expect_eof(timeout=10)
    assert not target.subsystems[NQN].controllers


async def test_io_queues_with_another_host_id_than_the_admin_queue_run_on_the_workers(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    # The I/O queue Connect, validated here and replayed on a worker, is accepted there
    # too: the controller is found by subsystem NQN, host NQN and CNTLID.
    target = await start()
    raw = raw_target_port(target)
    admin = await raw.admin(NQN, hostid=HOST_A[1])
    io = [await raw.io_queue(admin, qid, NQN, hostid=HOST_B[1]) for qid in (1, 2)]
    assert _placement(target) == [1, 1]
    for i, queue in enumerate(io):
        data = bytes([0x60 + i]) * BLOCK
        assert (await queue.write(1, i, data, BLOCK)).status == 0
        done = await queue.read(1, i, 1, BLOCK)
        assert done.status == 0 and done.data == data


async def _smart_once(admin: RawQueue, writes: int, reads: int) -> L.SmartLog:
    """The SMART / Health log once it counts `writes` and `reads` (the workers report
    their counts to the main process a few times a second)."""
    deadline = time.monotonic() + 10
    while True:
        done = await admin.get_log_page(L.LogPageId.SMART, L.SmartLog.SIZE)
        assert done.status == 0, done
        smart = L.SmartLog.unpack(done.data)
        if smart.host_write_cmds >= writes and smart.host_read_cmds >= reads:
            return smart
        assert time.monotonic() < deadline, smart
        await asyncio.sleep(0.05)  # the next poll of the condition above


async def test_the_smart_log_of_a_subsystem_created_again_counts_its_own_io_only(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    target = await start()
    raw = raw_target_port(target)

    async def io(writes: int, reads: int) -> RawQueue:
        admin = await raw.admin(NQN)
        queues = [await raw.io_queue(admin, qid, NQN) for qid in (1, 2)]
        for queue in queues:
            for lba in range(writes):
                assert (await queue.write(1, lba, b"\x5c" * BLOCK, BLOCK)).status == 0
            for lba in range(reads):
                assert (await queue.read(1, lba, 1, BLOCK)).status == 0
        return admin

    admin = await io(writes=8, reads=6)
    assert _placement(target) == [1, 1]
    old = await _smart_once(admin, 16, 12)
    assert (old.host_write_cmds, old.host_read_cmds) == (16, 12)
    # The subsystem goes (its hosts' connections with it) and comes back with its NQN.
    await target.remove_subsystem(NQN)
    await admin.expect_eof()
    target.add_subsystem(NQN)
    _add_memory(target, 1)
    admin = await io(writes=2, reads=1)
    new = await _smart_once(admin, 4, 2)
    # Its own commands only, none of the old subsystem's, and the workers' counts of
    # the old one did not turn into negative ones.
    assert (new.host_write_cmds, new.host_read_cmds) == (4, 2)
    assert (new.data_units_written, new.data_units_read) == (1, 1)


async def test_a_reservation_taken_through_one_worker_is_enforced_on_the_other(
    start: Start, hosts: Hosts
) -> None:
    target = await start()
    a = await hosts(target, HOST_A)
    b = await hosts(target, HOST_B)
    assert _placement(target) == [1, 1]  # a's queue on one worker, b's on the other
    na, nb = a.namespace(1), b.namespace(1)
    await na.reservation_register(nrkey=0xA1)
    await nb.reservation_register(nrkey=0xB2)
    await na.reservation_acquire(ReservationType.WRITE_EXCLUSIVE, crkey=0xA1)
    assert await _status_of(nb.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT
    back = bytearray(BLOCK)
    await nb.read(0, memoryview(back))  # reads stay open
    await na.write(0, b"\xa1" * BLOCK)  # the holder writes
    report = await nb.reservation_report()
    assert {r.hostid for r in report.registrants} == {HOST_A[1], HOST_B[1]}
    await na.reservation_release(ReservationType.WRITE_EXCLUSIVE, crkey=0xA1)
    await nb.write(0, bytes(BLOCK))  # released: open again


async def test_a_killed_worker_drops_its_queues_and_the_host_reconnects(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    target = await start()
    assert target.workers is not None
    raw = raw_target_port(target)
    admin = await raw.admin(NQN)
    io = [await raw.io_queue(admin, qid, NQN) for qid in (1, 2)]
    done = await io[0].write(1, 0, b"\x77" * BLOCK, BLOCK)
    assert done.status == 0
    owner = next(iter(target.subsystems[NQN].controllers.values()))
    victim = owner.queues[1]
    assert isinstance(victim, RemoteQueue)
    survivor = io[1]
    os.kill(victim.worker.pid, signal.SIGKILL)
    await io[0].expect_eof(timeout=10)  # the host sees its connection drop
    # The other worker's queue is untouched.
    done = await survivor.read(1, 0, 1, BLOCK)
    assert done.status == 0 and done.data == b"\x77" * BLOCK
    # The host reconnects (a new association, as Linux resets a controller) and finds
    # its data; a replacement worker takes queues again.
    await admin.close()
    await target.workers.wait_ready()
    again = await raw.admin(NQN)
    queues = [await raw.io_queue(again, qid, NQN) for qid in (1, 2)]
    for queue in queues:
        done = await queue.read(1, 0, 1, BLOCK)
        assert done.status == 0 and done.data == b"\x77" * BLOCK
    assert sorted(_placement(target)) == [1, 1]


@pytest.fixture
def raw_target_port() -> Callable[[Target], RawTarget]:
    made: list[RawTarget] = []

    def make(target: Target) -> RawTarget:
        raw = RawTarget(target)
        raw.stopped = True  # the start fixture stops it
        made.append(raw)
        return raw

    return make


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_busy_poll_runs_in_the_workers(
    raw_target_port: Callable[[Target], RawTarget],
) -> None:
    # A window of 3 s after each input: the worker with the queue keeps its core busy
    # through the second measured below; the one without input sleeps.
    target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0)], busy_poll_us=3_000_000)
    target.add_subsystem(NQN)
    _add_memory(target, 1)
    await target.start()
    try:
        assert target.workers is not None
        raw = raw_target_port(target)
        admin = await raw.admin(NQN)
        io = await raw.io_queue(admin, 1, NQN)
        [polling] = [w for w in target.workers.workers if w.queues]
        [idle] = [w for w in target.workers.workers if not w.queues]
        done = await io.read(1, 0, 1, BLOCK)
        assert done.status == 0
        before = {w.pid: _cpu_seconds(w.pid) for w in (polling, idle)}
        await asyncio.sleep(1.0)  # the measured window, not a synchronisation
        used = {pid: _cpu_seconds(pid) - t for pid, t in before.items()}
        assert used[polling.pid] >= 0.1, used
        assert used[polling.pid] > 5 * used[idle.pid], used
        await io.close()
        await admin.close()
    finally:
        await target.stop()


async def test_a_queue_on_a_worker_keeps_what_its_connection_negotiated(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    # The ICReq and the Connect go to the main process; the Connect's completion and
    # everything after come from the worker, framed as the handshake settled: header
    # and data digests, data placed as the host's HPDA asks, SQHD as the queue counts
    # it (0xFFFF with SQ flow control disabled).
    target = await start()
    raw = raw_target_port(target)
    admin = await raw.admin(NQN)
    hpda = 3
    pattern = bytes(range(256)) * (4096 // 256)
    # SQHD past the Connect's entry (1), as nvmet and SPDK say it, then one per command.
    for qid, cattr, sqhds in ((1, 0, [1, 2, 3]), (2, C.CATTR_DISABLE_SQ_FLOW, [0xFFFF] * 3)):
        io = await raw.open()
        await io.handshake(hdgst=True, ddgst=True, hpda=hpda)
        assert io.hdgst and io.ddgst
        cdw10, cdw11, cdw12 = C.ConnectCommand(0, qid, 31, cattr, 0).cdws()
        connect = C.build_sqe(
            AdminOpcode.FABRICS,
            7,
            FabricsType.CONNECT,
            cdw10,
            cdw11,
            cdw12,
            sgl_type=C.SGL_DATA_BLOCK_OFFSET,
            sgl_length=C.CONNECT_DATA_SIZE,
        )
        io.send(io.capsule(connect, C.ConnectData(HOSTID, admin.cntlid, NQN, HOSTNQN).pack()))
        resp = await io.recv_pdu()
        assert resp.type == P.PduType.CAPSULE_RESP, resp
        cqe = resp.cqe()
        assert (cqe.status, cqe.result, cqe.cid, cqe.sq_head) == (0, admin.cntlid, 7, sqhds[0])
        assert sum(_placement(target)) == qid  # the completion came from a worker
        write = C.build_sqe(
            IoOpcode.WRITE,
            8,
            1,
            qid,
            0,
            4096 // BLOCK - 1,
            sgl_type=C.SGL_DATA_BLOCK_OFFSET,
            sgl_length=4096,
        )
        io.send(io.capsule(write, pattern))  # in the capsule, with its data digest
        resp = await io.recv_pdu()
        cqe = resp.cqe()
        assert (cqe.status, cqe.cid, cqe.sq_head) == (0, 8, sqhds[1])
        read = C.build_sqe(
            IoOpcode.READ,
            9,
            1,
            qid,
            0,
            4096 // BLOCK - 1,
            sgl_type=C.SGL_TRANSPORT_DATA_BLOCK,
            sgl_length=4096,
        )
        io.send(io.capsule(read))
        data = await io.recv_pdu()  # its digests checked as it is parsed
        assert data.type == P.PduType.C2H_DATA and data.data == pattern
        assert data.pdo == P.data_offset(P.DATA_HLEN, True, hpda)
        if cattr:
            assert data.flags & P.FLAG_DATA_SUCCESS  # no response capsule follows
        else:
            cqe = (await io.recv_pdu()).cqe()
            assert (cqe.status, cqe.cid, cqe.sq_head) == (0, 9, sqhds[2])


async def test_a_new_namespaces_event_waits_until_every_worker_has_it(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    target = await start()
    assert target.workers is not None
    raw = raw_target_port(target)
    admin = await raw.admin(NQN)
    io = [await raw.io_queue(admin, qid, NQN) for qid in (1, 2)]
    done = await admin.cmd(
        AdminOpcode.SET_FEATURES, cdw10=FeatureId.ASYNC_EVENT, cdw11=Oaes.NS_ATTR
    )
    assert done.status == 0
    aer = admin.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    # A worker that cannot run (a loaded machine, here SIGSTOP) has not read the new
    # namespace yet: the host is not told of it.
    stopped = target.workers.workers[1]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        _add_memory(target, 2, blocks=1024)
        assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
        assert not aer.done()  # an event would have completed before the Keep Alive
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    done = await asyncio.wait_for(aer, 10)
    assert done.status == 0
    # Told: every worker serves it.
    for queue in io:
        done = await queue.write(2, 0, b"\x33" * BLOCK, BLOCK)
        assert done.status == 0, done
        done = await queue.read(2, 0, 1, BLOCK)
        assert done.status == 0 and done.data == b"\x33" * BLOCK


async def test_a_data_digest_error_on_a_worker_reaches_the_metrics(
    start: Start, raw_target_port: Callable[[Target], RawTarget]
) -> None:
    target = await start()
    raw = raw_target_port(target)
    admin = await raw.admin(NQN)
    io = await raw.open()
    await io.handshake(hdgst=True, ddgst=True)
    assert (await io.connect(NQN, qid=1, cntlid=admin.cntlid)).status == 0
    assert sum(_placement(target)) == 1  # the queue is a worker's
    data = b"\x66" * BLOCK
    sqe = rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 10, 1, BLOCK, inline=True)
    bad = bytearray(io.capsule(sqe, data))
    bad[-1] ^= 0xFF
    failed = await io.submit_nowait(sqe, data, wire=bytes(bad))
    assert failed.status == Status.TRANSIENT_TRANSPORT_ERROR
    endpoint = MetricsEndpoint(target)
    # The worker reports it within half a second; asked until then, within a deadline.
    async with asyncio.timeout(10):
        while (
            value(samples_of(endpoint.exposition().decode()), "pynvmf_data_digest_errors_total")
            != 1
        ):
            await asyncio.sleep(0.05)
    await io.close()
    # Its connection closed in the worker: still counted once.
    async with asyncio.timeout(10):
        while sum(_placement(target)):
            await asyncio.sleep(0.05)
    m = samples_of(endpoint.exposition().decode())
    assert value(m, "pynvmf_data_digest_errors_total") == 1


async def test_a_hidden_namespace_reaches_the_workers_for_its_host_only(
    start: Start, hosts: Hosts
) -> None:
    target = await start()
    a = await hosts(target, HOST_A, queues=2)
    b = await hosts(target, HOST_B, queues=2)
    device = target.memory_device(BLOCKS * BLOCK, BLOCK)
    target.add_namespace(
        NQN, NamedDevice.wrap("hidden", device, owned=True), nsid=2, auto_visible=False
    )
    await a.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(a.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    await target.ns_add_host(NQN, 2, HOST_A[0])
    await asyncio.wait_for(aer, 10)  # sent once every worker has A's view
    data = b"\x3c" * BLOCK
    for queue in a.io_queues:
        await _write(queue, 0, data, nsid=2)
        assert await _read(queue, 0, 1, nsid=2) == data
    for queue in b.io_queues:
        assert await _status_of(_read(queue, 0, 1, nsid=2)) == Status.INVALID_NS
    await target.ns_remove_host(NQN, 2, HOST_A[0])
    for queue in a.io_queues:
        assert await _status_of(_read(queue, 0, 1, nsid=2)) == Status.INVALID_NS


async def test_a_grown_file_is_served_at_its_new_size_by_every_worker(
    start: Start, hosts: Hosts, tmp_path: Path
) -> None:
    path = tmp_path / "grow.img"
    target = await start(file=path)
    ctrl = await hosts(target, queues=2)
    assert _placement(target) == [1, 1]
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    os.truncate(path, 2 * BLOCKS * BLOCK)
    assert await target.resize_block_device("file") == 2 * BLOCKS
    await asyncio.wait_for(aer, 10)  # sent once every worker took the size
    data = b"\x7e" * BLOCK
    for i, queue in enumerate(ctrl.io_queues):
        await _write(queue, 2 * BLOCKS - 1 - i, data)
        assert await _read(queue, 2 * BLOCKS - 1 - i, 1) == data


async def test_a_grown_memory_namespace_is_served_at_its_new_size_by_every_worker(
    start: Start, hosts: Hosts
) -> None:
    target = await start(namespaces=1)
    ctrl = await hosts(target, queues=2)
    assert _placement(target) == [1, 1]
    kept = b"\x5a" * BLOCK
    await _write(ctrl.io_queues[0], BLOCKS - 1, kept)
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    assert await target.resize_block_device(f"{NQN}/1", 2 * BLOCKS * BLOCK) == 2 * BLOCKS
    await asyncio.wait_for(aer, 10)  # sent once every worker took the size
    data = b"\x7e" * BLOCK
    for i, queue in enumerate(ctrl.io_queues):
        assert await _read(queue, BLOCKS - 1, 1) == kept
        await _write(queue, 2 * BLOCKS - 1 - i, data)
    # Each worker reads what the other wrote past the old end: one memory.
    for i, queue in enumerate(reversed(ctrl.io_queues)):
        assert await _read(queue, 2 * BLOCKS - 2 + i, 1) == data


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_a_forced_shrink_while_io_runs_on_every_worker(
    start: Start, hosts: Hosts, tmp_path: Path, kind: str
) -> None:
    """Each worker quiesces the namespace and serves the new size before the memfd or
    file is cut: none maps or writes past its end (no SIGBUS, the file not extended
    again), every command gets a success or LBA Out of Range, and the event waits."""
    path = tmp_path / "cut.img"
    target = await start(file=path if kind == "file" else None)
    name = "file" if kind == "file" else f"{NQN}/1"
    ctrl = await hosts(target, queues=2)
    assert _placement(target) == [1, 1]
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    half = BLOCKS // 2

    async def cut() -> None:
        assert await target.resize_block_device(name, half * BLOCK, force=True) == half

    await run_io_across(ctrl, 1, BLOCKS, cut)
    await asyncio.wait_for(aer, 10)
    assert target.workers is not None
    assert all(w.alive for w in target.workers.workers)
    for queue in ctrl.io_queues:
        await _read(queue, half - 1, 1)
        assert await _status_of(_read(queue, half, 1)) == Status.LBA_OUT_OF_RANGE
        assert await _status_of(_write(queue, half, bytes(BLOCK))) == Status.LBA_OUT_OF_RANGE
    if kind == "file":
        assert path.stat().st_size == half * BLOCK
    else:
        device = target.block_devices[name].device
        assert isinstance(device, SharedMemoryDevice)
        assert os.fstat(device.fileno()).st_size == half * BLOCK


async def test_a_file_truncated_outside_under_io_on_every_worker_is_followed(
    start: Start, hosts: Hosts, tmp_path: Path
) -> None:
    """Another process truncates the file while both workers read past the new end: each
    answers Unrecovered Read Error there (no worker maps the file: none dies), and the
    rescan has every worker serve the new size (quiesced, as a forced shrink) before the
    event: LBA Out of Range past it on both."""
    path = tmp_path / "cut.img"
    target = await start(file=path)
    ctrl = await hosts(target, queues=2)
    assert _placement(target) == [1, 1]
    await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
    aer = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    half = BLOCKS // 2

    async def truncate() -> None:
        os.truncate(path, half * BLOCK)

    async def rescan() -> None:
        assert await target.resize_block_device("file") == half

    counts = await run_reads_past(ctrl, 1, half, [truncate, rescan])
    for c in counts:
        assert set(c) == {Status.SUCCESS, Status.UNRECOVERED_READ_ERROR, Status.LBA_OUT_OF_RANGE}
    await asyncio.wait_for(aer, 10)
    assert target.workers is not None
    assert all(w.alive for w in target.workers.workers)
    assert (await ctrl.identify_namespace(1)).nsze == half
    for queue in ctrl.io_queues:
        assert await _status_of(_write(queue, half, bytes(BLOCK))) == Status.LBA_OUT_OF_RANGE
    assert path.stat().st_size == half * BLOCK
