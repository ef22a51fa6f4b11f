"""Hostile and careless hosts against the live in-process target: what a host can make the
target hold, for how long, and what is given back when it goes."""

from __future__ import annotations

import asyncio
import gc
import random
import resource
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host.errors import NvmeStatusError
from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import CMD_SIZE_LIMIT_EXCEEDED
from pynvmf.target import budget
from pynvmf.target.budget import ConnectionLimits
from pynvmf.target.controller import Controller
from pynvmf.target.io import IoHandler
from pynvmf.target.protocol import TargetProtocol
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.tcp.framing import PduReader
from pynvmf.tcp.target import TargetConnection
from tests.protocol.conftest import (
    RAW_NS1_BLOCK,
    RAW_NS1_BLOCKS,
    RAW_SUBNQN,
    RawTarget,
    RawTargetFactory,
)
from tests.support.ports import free_tcp_port
from tests.support.raw import RawQueue, capsule, h2c_data, icreq, rw_sqe
from tests.support.target_process import TargetProcess

pytestmark = pytest.mark.timeout(120)

CONNECTION_OBJECTS = (TargetProtocol, TargetConnection, PduReader, TargetQueue, IoHandler)


def _live(kinds: tuple[type, ...]) -> dict[str, int]:
    counts = {kind.__name__: 0 for kind in kinds}
    for obj in gc.get_objects():
        for kind in kinds:
            if type(obj) is kind:
                counts[kind.__name__] += 1
    return {name: n for name, n in counts.items() if n}


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Poll `condition` (the target reacts to a close on its own schedule)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counting frees objects: what a cycle keeps alive stays visible."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_closed_connection_is_freed_without_the_cycle_collector(
    raw_target: RawTarget, no_cycle_collector: None
) -> None:
    assert _live((*CONNECTION_OBJECTS, Controller)) == {}
    host = await raw_target.host(io_queues=2)
    for io in host.io:
        assert (await io.write(1, 0, bytes(4096), RAW_NS1_BLOCK)).status == 0
        assert (await io.read(1, 0, 8, RAW_NS1_BLOCK)).status == 0
    # A write whose data never comes, and an AER, are in flight when the host goes.
    host.io[0].cmd_nowait(0x01, nsid=1, cdw12=63, data=bytes(32768), inline=False)
    host.admin.cmd_nowait(0x0C)
    assert _live((TargetProtocol,)) == {"TargetProtocol": 3}
    for queue in [*host.io, host.admin]:
        await queue.close()
    raw_target.queues.clear()
    await _until(lambda: not _live((*CONNECTION_OBJECTS, Controller)), "the objects to go")
    subsystem = raw_target.target.subsystems[RAW_SUBNQN]
    assert subsystem.controllers == {}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def test_rss_stays_flat_over_thousands_of_connect_and_close_cycles(
    raw_target: RawTarget,
) -> None:
    async def cycle() -> None:
        admin = await raw_target.admin()
        await admin.close()
        raw_target.queues.clear()

    for _ in range(300):  # warm up: allocator arenas, caches
        await cycle()
    await _until(lambda: not _live((TargetProtocol,)), "the warm-up connections to go")
    before = _rss()
    for _ in range(3000):
        await cycle()
    await _until(lambda: not _live((TargetProtocol,)), "the connections to go")
    grown = _rss() - before
    # Each leaked connection would hold its 256 KiB receive buffer: 3000 of them, 750 MiB.
    assert grown < 16 << 20, f"RSS grew by {grown / (1 << 20):.1f} MiB"


# -- connections: limits and deadlines ---------------------------------------------------------


async def test_connection_limits_refuse_the_extra_connection_and_say_so(
    raw_target_factory: RawTargetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await raw_target_factory(
        limits=ConnectionLimits(max_connections=3, max_connections_per_address=2)
    )
    first, second = await rt.open(), await rt.open()
    await first.handshake()
    await second.handshake()
    third = await rt.open()  # the same address: over its limit of 2
    assert await third.expect_eof() == b""
    assert "refused: 127.0.0.1 has 2 connections, the per-address limit" in caplog.text
    await first.close()
    await _until(lambda: rt.target.connection_budget.total == 1, "the close to be counted")
    again = await rt.open()
    await again.handshake()  # room again
    assert rt.target.connection_budget.refused == 1


async def test_total_connection_limit(raw_target_factory: RawTargetFactory) -> None:
    rt = await raw_target_factory(limits=ConnectionLimits(max_connections=2))
    kept = [await rt.open(), await rt.open()]
    for queue in kept:
        await queue.handshake()
    over = await rt.open()
    assert await over.expect_eof() == b""
    assert rt.target.connection_budget.total == 2


async def test_a_connection_that_never_connects_is_closed(
    raw_target_factory: RawTargetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await raw_target_factory(limits=ConnectionLimits(connect_deadline_s=0.5))
    silent, handshaken = await rt.open(), await rt.open()
    await handshaken.handshake()
    # An ICReq one byte at a time (slowloris), never finished.
    drip = await rt.open()
    drip.send(icreq()[:3])
    start = time.monotonic()
    for queue in (silent, handshaken, drip):
        await queue.expect_eof(timeout=5)
    assert time.monotonic() - start < 3
    assert caplog.text.count("no Connect within 0.5 s") == 3
    # A host that does connect in time keeps its connection.
    assert (await (await rt.admin()).cmd(AdminOpcode.KEEP_ALIVE)).status == 0


async def test_a_pdu_started_and_never_finished_closes_its_connection(
    raw_target_factory: RawTargetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await raw_target_factory(limits=ConnectionLimits(pdu_deadline_s=0.5))
    host = await rt.host()
    io = host.io[0]
    sqe = rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 0, 8, 4096, inline=True)
    io.send(capsule(sqe, bytes(4096))[:100])  # header and a little data, then silence
    await io.expect_eof(timeout=5)
    assert "is still incomplete" in caplog.text
    # The controller's other queue lives on.
    assert (await host.admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0


async def test_an_idle_connection_holds_no_receive_buffer_before_icreq(
    raw_target: RawTarget,
) -> None:
    idle = await raw_target.open()
    await _until(lambda: len(raw_target.port.connections) == 1, "the connection")
    (protocol,) = raw_target.port.connections
    assert protocol.conn.reader.buffer_size <= 4096
    await idle.handshake()
    assert protocol.conn.reader.buffer_size >= 2 * protocol.conn.reader.max_pdu_len


# -- keep alive --------------------------------------------------------------------------------


async def test_keep_alive_expires_within_kato_and_its_slack(raw_target: RawTarget) -> None:
    kato = 1.0
    admin = await raw_target.admin(kato=int(kato * 1000))
    # Traffic for a while, so that the last command falls at an arbitrary point of the
    # controller's check period; then silence.
    end = time.monotonic() + 1.1
    while time.monotonic() < end:
        assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
        await asyncio.sleep(0.05)  # the host's own pace, not synchronisation
    last = time.monotonic()
    await admin.expect_eof(timeout=10)
    silent = time.monotonic() - last
    # Not before KATO; at most KATO + 2 check intervals (2 x 125 ms) and scheduling.
    assert kato * 0.95 <= silent <= kato + 0.25 + 0.15, silent


async def test_kato_zero_is_bounded(raw_target: RawTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    admin = await raw_target.admin(kato=0)
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.KATO)
    assert got.result & 0xFFFFFFFF == budget.KATO_DEFAULT_MS
    set_zero = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.KATO, cdw11=0)
    assert set_zero.status == 0
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.KATO)
    assert got.result & 0xFFFFFFFF == budget.KATO_DEFAULT_MS
    # And such a controller is reclaimed when its host goes silent.
    monkeypatch.setattr(budget, "KATO_DEFAULT_MS", 300)
    silent = await raw_target.admin(kato=0)
    start = time.monotonic()
    await silent.expect_eof(timeout=5)
    assert time.monotonic() - start < 2


def test_open_file_limit_is_raised_to_the_hard_limit() -> None:
    soft = budget.raise_open_file_limit()
    now_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == now_soft
    assert hard == resource.RLIM_INFINITY or now_soft == hard


def test_the_target_command_enforces_its_connection_limit(tmp_path: Path) -> None:
    port = free_tcp_port()
    proc = TargetProcess(
        None,
        tmp_path,
        ["--listen", f"127.0.0.1:{port}", "--discovery-port", "0", "--max-connections", "1"],
    )
    proc.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as first:
            first.sendall(icreq())
            assert len(first.recv(128)) == 128  # ICResp
            with socket.create_connection(("127.0.0.1", port), timeout=10) as second:
                assert second.recv(1) == b""  # closed at once
    finally:
        proc.stop()
    assert "refused: the target has 1 connections, its limit" in proc.stderr()


# -- memory: what commands may make the target hold ---------------------------------------------

MIB = 1 << 20


async def _io_queue(rt: RawTarget, sqsize: int = 127) -> tuple[RawQueue, RawQueue]:
    admin = await rt.admin()
    io = await rt.open()
    await io.handshake()
    done = await io.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid, sqsize=sqsize)
    assert done.status == 0, done
    await io.detach()  # from here on the test sends and reads PDUs itself
    return admin, io


def _target_queue(rt: RawTarget, qid: int = 1) -> TargetQueue:
    (ctrl,) = rt.target.subsystems[RAW_SUBNQN].controllers.values()
    return ctrl.queues[qid]


class BufferedMemoryDevice(MemoryDevice):
    """A memory device whose reads fill a buffer, as a file's do: its own read() turns
    off the in-place path (read_now), so every Read goes through the general path."""

    async def read(self, lba: int, buf: memoryview) -> None:
        await super().read(lba, buf)


def _buffered_subsystem() -> list[Subsystem]:
    subsystem = Subsystem(RAW_SUBNQN)
    device = BufferedMemoryDevice(RAW_NS1_BLOCK * RAW_NS1_BLOCKS, RAW_NS1_BLOCK)
    subsystem.add_namespace(Namespace.create(RAW_SUBNQN, 1, device, "buffered:1"))
    return [subsystem]


def _read_capsule(io: RawQueue, cid: int, slba: int, nbytes: int) -> bytes:
    nlb = nbytes // RAW_NS1_BLOCK
    return io.capsule(rw_sqe(IoOpcode.READ, cid, 1, slba, nlb, nbytes))


def _r2t_write_capsule(io: RawQueue, cid: int, slba: int, nbytes: int) -> bytes:
    nlb = nbytes // RAW_NS1_BLOCK
    return io.capsule(rw_sqe(IoOpcode.WRITE, cid, 1, slba, nlb, nbytes))


async def test_more_commands_than_sqsize_is_a_fatal_pdu_sequence_error(
    raw_target: RawTarget,
) -> None:
    _admin, io = await _io_queue(raw_target, sqsize=3)  # 0's based: four entries
    # Four writes waiting for their data fill the queue; a fifth command may not be sent.
    io.send(b"".join(_r2t_write_capsule(io, cid, 0, 4096) for cid in range(4)))
    for _ in range(4):
        assert (await io.recv_pdu()).type == P.PduType.R2T
    io.send(_read_capsule(io, 4, 0, 512))
    term = await io.expect_term()
    assert term.term_fields()[0] == P.FatalError.PDU_SEQUENCE_ERROR


async def test_reads_a_host_never_collects_hold_no_more_than_the_connection_budget(
    raw_target_factory: RawTargetFactory,
) -> None:
    budget_bytes = 4 * MIB
    # Reads that need buffers (a memory namespace's are views of its memory and hold none).
    rt = await raw_target_factory(
        _buffered_subsystem(), limits=ConnectionLimits(connection_data=budget_bytes)
    )
    _admin, io = await _io_queue(rt)
    queue = _target_queue(rt)
    pool = rt.target.memory_pool
    baseline = pool.used  # the connections' receive buffers
    # 64 reads of 1 MiB, and the host does not read its socket.
    io.send(b"".join(_read_capsule(io, cid, 0, MIB) for cid in range(64)))
    await _until(lambda: queue.budget.used >= budget_bytes - MIB, "the budget to fill")
    assert queue.budget.used <= budget_bytes
    assert pool.peak - baseline <= budget_bytes
    # The host reads at last: every read completes, with its data, nothing lost.
    completions = 0
    while completions < 64:
        pdu = await io.recv_pdu(timeout=10)
        if pdu.type == P.PduType.CAPSULE_RESP:
            assert pdu.cqe().status == 0
            completions += 1
    await _until(lambda: queue.budget.used == 0, "the budget to be given back")


async def test_writes_whose_data_never_comes_hold_no_more_than_the_budget(
    raw_target_factory: RawTargetFactory,
) -> None:
    rt = await raw_target_factory(limits=ConnectionLimits(connection_data=4 * MIB))
    _admin, io = await _io_queue(rt)
    queue = _target_queue(rt)
    io.send(b"".join(_r2t_write_capsule(io, cid, 0, MIB) for cid in range(64)))
    r2ts = [await io.recv_pdu() for _ in range(4)]  # one per MiB the budget allows
    assert all(pdu.type == P.PduType.R2T for pdu in r2ts)
    await _until(lambda: queue.budget.used == 4 * MIB, "four R2T buffers")
    assert queue.conn.stats.r2t_sent == 4
    # When the host goes, everything it held is given back.
    await io.close()
    rt.queues.remove(io)
    await _until(lambda: queue.budget.used == 0, "the budget to be given back")


async def test_no_set_of_hosts_pushes_the_target_past_its_memory_cap(
    raw_target_factory: RawTargetFactory,
) -> None:
    rx = 2 * 4 << 20  # room for a few receive buffers (256 KiB+ each)
    rt = await raw_target_factory(
        limits=ConnectionLimits(connection_data=4 * MIB, max_memory=rx + 6 * MIB)
    )
    pool = rt.target.memory_pool
    hosts = [await _io_queue(rt) for _ in range(3)]
    for _admin, io in hosts:
        io.send(b"".join(_r2t_write_capsule(io, cid, 0, MIB) for cid in range(16)))
    await _until(lambda: pool.used >= pool.capacity - MIB, "the pool to fill")
    assert pool.peak <= pool.capacity
    # One host sends its data: its writes complete, and the others get their R2Ts.
    _admin, first = hosts[0]
    done = 0
    while done < 16:
        pdu = await first.recv_pdu(timeout=10)
        if pdu.type == P.PduType.R2T:
            cccid, ttag, _offset, length = pdu.data_fields()
            step = first.maxh2cdata
            for pos in range(0, length, step):
                last = pos + step >= length
                first.send(h2c_data(cccid, ttag, pos, bytes(min(step, length - pos)), last=last))
        elif pdu.type == P.PduType.CAPSULE_RESP:
            assert pdu.cqe().status == 0
            done += 1
    assert pool.peak <= pool.capacity


async def test_a_burst_of_large_writes_is_given_back_once_it_is_over(
    raw_target_factory: RawTargetFactory,
) -> None:
    from pynvmf.host import connect
    from pynvmf.malloc import tune_for_io_buffers

    tune_for_io_buffers()  # as `pynvmf target` runs: freed buffers stay in the heap
    rt = await raw_target_factory(limits=ConnectionLimits(connection_data=256 * MIB))
    port = rt.port.port
    async with await connect("127.0.0.1", port, RAW_SUBNQN, queues=2) as ctrl:
        ns = ctrl.namespace(1)
        bufs = [bytearray(MIB) for _ in range(48)]
        await ns.write(0, memoryview(bufs[0]))
        before = _rss()
        # 48 writes of 1 MiB at once: 48 MiB of target buffers for their R2T data. (Reads
        # hold at most a piece each: budget.READ_CHUNK, test_read_pieces.py.)
        for _ in range(3):
            await asyncio.gather(*(ns.write(0, memoryview(b)) for b in bufs))
        peak = rt.target.memory_pool.peak
        assert peak >= 40 * MIB, peak
        # Below glibc's trim threshold as tuned (64 MiB), the heap would keep all of it.
        await _until(lambda: _rss() - before < 16 * MIB, "the burst's memory to be given back")


# -- Copy: the memory of emulated and staged copies ---------------------------------------------

COPY_BS = 4096
COPY_NS_BLOCKS = (64 * MIB) // COPY_BS


def _copy_subsystem() -> tuple[Subsystem, dict[int, bytearray]]:
    """Two 64 MiB memory namespaces of 4 KiB blocks, filled with random data, and models."""
    subsystem = Subsystem(RAW_SUBNQN)
    models = {}
    for nsid in (1, 2):
        data = bytearray(random.Random(nsid).randbytes(COPY_NS_BLOCKS * COPY_BS))
        device = MemoryDevice(len(data), COPY_BS)
        subsystem.add_namespace(Namespace.create(RAW_SUBNQN, nsid, device, f"memory:{nsid}"))
        models[nsid] = data
    return subsystem, models


def _blocks(model: bytearray, lba: int, n: int) -> bytes:
    return bytes(model[lba * COPY_BS : (lba + n) * COPY_BS])


async def test_concurrent_emulated_and_staged_copies_stay_within_the_memory_budgets(
    raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three hosts each send many Copies at once that the target must emulate (from
    another namespace) or stage (ranges over their destination): what the target
    allocates stays within --max-memory, each connection's charge within
    --max-connection-data, and every copy is right."""
    from pynvmf.host import connect

    connection_data, max_memory = 4 * MIB, 10 * MIB
    subsystem, models = _copy_subsystem()
    for nsid, model in models.items():
        await subsystem.namespaces[nsid].device.write(0, model)
    # Each connection's budget, as high as it went (DataBudget keeps only the pool's peak).
    peaks: dict[int, int] = {}
    real_try_take, real_serve = budget.DataBudget.try_take, budget.DataBudget.serve

    def try_take(self: budget.DataBudget, n: int) -> bool:
        taken = real_try_take(self, n)
        peaks[id(self)] = max(peaks.get(id(self), 0), self.used)
        return taken

    def serve(self: budget.DataBudget) -> bool:
        served = real_serve(self)
        peaks[id(self)] = max(peaks.get(id(self), 0), self.used)
        return served

    monkeypatch.setattr(budget.DataBudget, "try_take", try_take)
    monkeypatch.setattr(budget.DataBudget, "serve", serve)
    rt = await raw_target_factory(
        [subsystem],
        limits=ConnectionLimits(connection_data=connection_data, max_memory=max_memory),
    )
    pool = rt.target.memory_pool
    port = rt.port.port
    hosts = [await connect("127.0.0.1", port, RAW_SUBNQN, queues=1) for _ in range(3)]
    expected = bytearray(models[1])
    commands = []
    for h, ctrl in enumerate(hosts):
        assert await ctrl.enable_copy_formats() & 1 << 2
        # From namespace 2 (format 2h): emulated on the target, 2 of 6 MiB per host (as
        # planned without a limit, 8 MiB of buffers each).
        for i in range(2):
            src = dst = (h * 2 + i) * 1536
            data = C.pack_copy_ranges([C.CopyRange(src, 1536, 2)], 2)
            commands.append((ctrl, 1, dst, C.copy_cdw12(1, 2), data))
            expected[dst * COPY_BS : (dst + 1536) * COPY_BS] = _blocks(models[2], src, 1536)
    # Within namespace 1 (format 0h), two ranges over their destination: 3 MiB staged each,
    # in slots of 4 MiB after the emulated copies' destinations.
    for h, ctrl in enumerate(hosts):
        for i in range(2):
            base = 6 * 1536 + (h * 2 + i) * 1024
            ranges = [C.CopyRange(base, 384), C.CopyRange(base + 384, 384)]
            commands.append(
                (ctrl, 1, base + 128, C.copy_cdw12(2, 0), C.pack_copy_ranges(ranges, 0))
            )
            data = _blocks(models[1], base, 768)
            expected[(base + 128) * COPY_BS : (base + 896) * COPY_BS] = data
    baseline = pool.used  # the connections' receive buffers
    tracemalloc.start()
    try:
        start, _peak = tracemalloc.get_traced_memory()
        results = await asyncio.gather(
            *(
                ctrl.io_command(IoOpcode.COPY, nsid, dst & 0xFFFFFFFF, dst >> 32, cdw12, data=data)
                for ctrl, nsid, dst, cdw12, data in commands
            )
        )
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(results) == len(commands)  # every one succeeded (a failure raises)
    # Without the budget: 6 emulations of 8 MiB buffers and 6 stagings of 3 MiB at once.
    assert peak - start <= max_memory - baseline + MIB, f"{(peak - start) / MIB:.1f} MiB"
    assert pool.peak <= pool.capacity
    charged = max(peaks.values())
    assert 3 * MIB <= charged <= connection_data, charged
    got = bytearray(len(expected))
    await subsystem.namespaces[1].device.read(0, memoryview(got))
    assert got == expected
    # A staging larger than a connection may ever hold is a size limit: nothing written.
    ctrl = hosts[0]
    ranges = [C.CopyRange(0, 640), C.CopyRange(640, 640)]  # 5 MiB over its destination
    with pytest.raises(NvmeStatusError) as err:
        await ctrl.io_command(
            IoOpcode.COPY, 1, 100, 0, C.copy_cdw12(2, 0), data=C.pack_copy_ranges(ranges, 0)
        )
    assert err.value.status == CMD_SIZE_LIMIT_EXCEEDED
    await subsystem.namespaces[1].device.read(0, memoryview(got))
    assert got == expected
    for ctrl in hosts:
        await ctrl.close()
    await _until(lambda: pool.used <= baseline, "the copies' memory to be given back")
