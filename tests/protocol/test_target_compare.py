"""Compare, Verify and fused Compare and Write against the live in-process target: raw
capsules over TCP for the wire rules and statuses, the host library for its API, and an
ATS-style race of two hosts on one lock block for atomicity."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from pynvmf.block.device import BlockDevice, BlockRangeError
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import (
    Controller,
    NvmeStatusError,
    NvmeUnsupportedError,
    RemoteNamespace,
    connect,
)
from pynvmf.host.queue import watch_commands
from pynvmf.spec import command as C
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status, status_name
from pynvmf.target.limits import VERIFY_MAX_BYTES
from pynvmf.target.port import Port
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_NS1_BLOCKS, RAW_SUBNQN, RawTarget
from tests.support.raw import Completion, RawQueue

B = RAW_NS1_BLOCK
OLD = b"\x11" * B
NEW = b"\x22" * B
OTHER = b"\x33" * B


def io_sqe(
    opcode: int,
    cid: int,
    slba: int,
    nlb: int,
    *,
    fuse: int = 0,
    inline: bool = True,
    nsid: int = 1,
    block: int = B,
) -> bytes:
    return C.build_sqe(
        opcode,
        cid,
        nsid,
        cdw10=slba & 0xFFFFFFFF,
        cdw11=slba >> 32,
        cdw12=nlb - 1,
        sgl_type=C.SGL_DATA_BLOCK_OFFSET if inline else C.SGL_TRANSPORT_DATA_BLOCK,
        sgl_length=nlb * block,
        flags=0x40 | fuse,
    )


def send(q: RawQueue, sqe: bytes, data: bytes, *, inline: bool) -> asyncio.Future[Completion]:
    return q.submit_nowait(sqe, data if inline else b"", data_out=data)


async def cmp_and_write(
    q: RawQueue, slba: int, expected: bytes, new: bytes, *, inline: bool = True
) -> tuple[Completion, Completion]:
    nlb = len(expected) // B
    first = send(q, io_sqe(IoOpcode.COMPARE, q.next_cid(), slba, nlb, fuse=1, inline=inline),
                 expected, inline=inline)  # fmt: skip
    second = send(q, io_sqe(IoOpcode.WRITE, q.next_cid(), slba, nlb, fuse=2, inline=inline),
                  new, inline=inline)  # fmt: skip
    return await asyncio.wait_for(first, 5), await asyncio.wait_for(second, 5)


async def read(q: RawQueue, slba: int, nlb: int = 1) -> bytes:
    done = await q.read(1, slba, nlb, B)
    assert done.status == 0, done
    return done.data


def status(done: Completion) -> tuple[int, bool]:
    return done.status, done.dnr


def target_queue(rt: RawTarget, io: RawQueue, qid: int) -> TargetQueue:
    ctrl = rt.target.subsystems[RAW_SUBNQN].controllers[io.cntlid]
    return ctrl.queues[qid]


async def held(queue: TargetQueue) -> None:
    """Yield to the loop (the target runs in it) until `queue` holds a first command."""
    async with asyncio.timeout(5):
        while queue.fused.first is None:
            await asyncio.sleep(0)


# -- Compare and Verify on the wire ---------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["in-capsule", "r2t"])
async def test_compare_match_and_mismatch(raw_target: RawTarget, inline: bool) -> None:
    host = await raw_target.host()
    io = host.io[0]
    data = bytes(range(256)) * (32 * B // 256)  # 32 blocks: 16 KiB, at the in-capsule limit
    assert (await io.write(1, 300, data, B)).status == 0
    r2t = io.counters.r2t
    done = await io.cmd(IoOpcode.COMPARE, nsid=1, cdw10=300, cdw12=31, data=data, inline=inline)
    assert status(done) == (0, False)
    wrong = data[:-1] + bytes([data[-1] ^ 1])
    done = await io.cmd(IoOpcode.COMPARE, nsid=1, cdw10=300, cdw12=31, data=wrong, inline=inline)
    assert status(done) == (Status.COMPARE_FAILED, True)
    assert status_name(done.status) == "COMPARE_FAILED" and done.cqe.status >> 8 & 7 == 2
    assert io.counters.r2t == r2t + (0 if inline else 2)
    assert await read(io, 300, 32) == data


async def test_compare_statuses(raw_target: RawTarget) -> None:
    io = (await raw_target.host()).io[0]
    beyond = await io.cmd(IoOpcode.COMPARE, nsid=1, cdw10=RAW_NS1_BLOCKS - 1, cdw12=1,
                          data=bytes(2 * B))  # fmt: skip
    assert status(beyond) == (Status.LBA_OUT_OF_RANGE, True)
    short = await io.cmd(IoOpcode.COMPARE, nsid=1, cdw12=1, data=bytes(B))
    assert status(short) == (Status.SGL_INVALID_DATA, True)
    missing = await io.cmd(IoOpcode.COMPARE, nsid=5, data=bytes(B))
    assert status(missing) == (Status.INVALID_NS, True)


async def test_verify(raw_target_factory: Callable[..., Awaitable[RawTarget]]) -> None:
    block = 4096
    nqn = "nqn.2024-01.io.pynvmf.test:verify"
    subsystem = Subsystem(nqn)
    blocks = 2 * VERIFY_MAX_BYTES // block  # a sparse 64 MiB: longer than VSL
    device = MemoryDevice(block * blocks, block)
    subsystem.add_namespace(Namespace.create(nqn, 1, device, "memory:1"))
    rt = await raw_target_factory([subsystem])
    host = await rt.host(subnqn=nqn)
    io = host.io[0]
    vsl = VERIFY_MAX_BYTES // block
    ok = await io.cmd(IoOpcode.VERIFY, nsid=1, cdw12=vsl - 1)
    assert status(ok) == (0, False) and ok.data == b""
    fua = await io.cmd(IoOpcode.VERIFY, nsid=1, cdw10=blocks - 8, cdw12=7 | C.RW_FUA)
    assert status(fua) == (0, False)
    too_long = await io.cmd(IoOpcode.VERIFY, nsid=1, cdw12=vsl)
    assert status(too_long) == (Status.INVALID_FIELD, True)
    beyond = await io.cmd(IoOpcode.VERIFY, nsid=1, cdw10=blocks - 1, cdw12=1)
    assert status(beyond) == (Status.LBA_OUT_OF_RANGE, True)
    assert io.counters.r2t == io.counters.c2h_data == 0


# -- fused Compare and Write on the wire ----------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["in-capsule", "r2t"])
async def test_fused_pair_success_and_failure(raw_target: RawTarget, inline: bool) -> None:
    io = (await raw_target.host()).io[0]
    n = 32 if inline else 40  # 16 KiB is the in-capsule limit
    assert (await io.write(1, 50, OLD * n, B)).status == 0
    r2t = io.counters.r2t
    cmp, wr = await cmp_and_write(io, 50, OLD * n, NEW * n, inline=inline)
    assert (status(cmp), status(wr)) == ((0, False), (0, False))
    assert await read(io, 50, n) == NEW * n
    cmp, wr = await cmp_and_write(io, 50, OLD * n, OTHER * n, inline=inline)
    assert status(cmp) == (Status.COMPARE_FAILED, True)
    assert status(wr) == (Status.FUSED_FAIL, True)
    assert status_name(wr.status) == "FUSED_FAIL" and wr.status == 0x009
    assert await read(io, 50, n) == NEW * n  # nothing written
    assert io.counters.r2t == r2t + (0 if inline else 4)


async def test_pair_in_one_tcp_segment_and_split_across_reads(raw_target: RawTarget) -> None:
    host = await raw_target.host()
    io = host.io[0]
    io.cntlid = host.admin.cntlid
    assert (await io.write(1, 60, OLD, B)).status == 0
    # Both capsules in one write(): the target sees them in one buffer.
    first = io_sqe(IoOpcode.COMPARE, 201, 60, 1, fuse=1)
    second = io_sqe(IoOpcode.WRITE, 202, 60, 1, fuse=2)
    wire = io.capsule(first, OLD) + io.capsule(second, NEW)
    f1 = io.submit_nowait(first, OLD, wire=wire)
    f2 = io.submit_nowait(second, NEW, wire=b"")
    assert (status(await f1), status(await f2)) == ((0, False), (0, False))
    # The first alone, then (after its absence of an answer is seen) the second.
    f3 = io.submit_nowait(io_sqe(IoOpcode.COMPARE, 203, 60, 1, fuse=1), NEW)
    await held(target_queue(raw_target, io, 1))
    assert not f3.done()  # held until its partner arrives
    f4 = io.submit_nowait(io_sqe(IoOpcode.WRITE, 204, 60, 1, fuse=2), OTHER)
    assert (status(await f3), status(await f4)) == ((0, False), (0, False))
    assert await read(io, 60) == OTHER


async def test_missing_partner_and_a_command_in_between(raw_target: RawTarget) -> None:
    io = (await raw_target.host()).io[0]
    assert (await io.write(1, 70, OLD, B)).status == 0
    # A first whose next entry is an ordinary read: the read runs, the first is aborted.
    first = io.submit_nowait(io_sqe(IoOpcode.COMPARE, 301, 70, 1, fuse=1), OLD)
    between = await read(io, 70)
    assert between == OLD
    missing = await first
    assert status(missing) == (Status.FUSED_MISSING, True)
    assert status_name(missing.status) == "FUSED_MISSING" and missing.status == 0x00A
    # ... and the second that then comes has no first.
    second = io.submit_nowait(io_sqe(IoOpcode.WRITE, 302, 70, 1, fuse=2), NEW)
    assert status(await second) == (Status.FUSED_MISSING, True)
    assert await read(io, 70) == OLD


async def test_partners_on_different_queues_do_not_pair(raw_target: RawTarget) -> None:
    host = await raw_target.host(io_queues=2)
    q1, q2 = host.io
    q1.cntlid = host.admin.cntlid
    assert (await q1.write(1, 80, OLD, B)).status == 0
    first = q1.submit_nowait(io_sqe(IoOpcode.COMPARE, 401, 80, 1, fuse=1), OLD)
    await held(target_queue(raw_target, q1, 1))
    second = q2.submit_nowait(io_sqe(IoOpcode.WRITE, 402, 80, 1, fuse=2), NEW)
    assert status(await second) == (Status.FUSED_MISSING, True)
    assert not first.done()  # still waiting for the next entry of its own queue
    assert (await q1.cmd(0x00, nsid=1)).status == 0  # a Flush: not its partner
    assert status(await first) == (Status.FUSED_MISSING, True)
    assert await read(q1, 80) == OLD


async def test_range_mismatch_is_invalid_field_for_both(raw_target: RawTarget) -> None:
    io = (await raw_target.host()).io[0]
    f1 = io.submit_nowait(io_sqe(IoOpcode.COMPARE, 501, 90, 1, fuse=1), bytes(B))
    f2 = io.submit_nowait(io_sqe(IoOpcode.WRITE, 502, 91, 1, fuse=2), NEW)
    assert (status(await f1), status(await f2)) == ((Status.INVALID_FIELD, True),) * 2
    assert await read(io, 90, 2) == bytes(2 * B)


async def test_queue_closed_between_the_two_runs_nothing(raw_target: RawTarget) -> None:
    host = await raw_target.host()
    io = host.io[0]
    assert (await io.write(1, 95, OLD, B)).status == 0
    io.send(io.capsule(io_sqe(IoOpcode.COMPARE, 601, 95, 1, fuse=1), OLD))
    io.writer.write_eof()
    assert await io.expect_eof() == b""  # dropped without an answer
    again = await raw_target.io_queue(host.admin, 1)
    assert await read(again, 95) == OLD
    # The new queue starts with no held first.
    lone = again.submit_nowait(io_sqe(IoOpcode.WRITE, 602, 95, 1, fuse=2), NEW)
    assert status(await lone) == (Status.FUSED_MISSING, True)


# -- the host library -------------------------------------------------------------------------

NQN = "nqn.2024-01.io.pynvmf.test:compare"
HOSTS = [
    ("nqn.2014-08.org.nvmexpress:uuid:" + str(u), u.bytes)
    for u in (uuid.UUID(int=0xA75_0001), uuid.UUID(int=0xA75_0002), uuid.UUID(int=0xA75_0003))
]
MiB = 1 << 20


Serve = Callable[..., Awaitable[tuple[Target, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """serve(device, nqn=NQN) starts a target with `device` as namespace 1 of `nqn`:
    (the target, its port). Every target is stopped after the test."""
    targets: list[Target] = []

    async def start(device: BlockDevice, nqn: str = NQN) -> tuple[Target, int]:
        subsystem = Subsystem(nqn)
        subsystem.add_namespace(Namespace.create(nqn, 1, device, f"test:{len(targets)}"))
        port = Port("127.0.0.1", 0)
        target = Target([subsystem], [port])
        await target.start()
        targets.append(target)
        return target, port.port

    yield start
    for target in reversed(targets):
        await target.stop()


async def test_the_command_watchers_see_both_halves_of_a_fused_compare_and_write(
    serve: Serve,
) -> None:
    _target, port = await serve(MemoryDevice(MiB, B))
    seen: list[tuple[int, int, int]] = []
    async with await connect("127.0.0.1", port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        await ns.write(3, OLD)
        stop = watch_commands(lambda qid, opcode, nsid, lba, *_: seen.append((opcode, nsid, lba)))
        try:
            assert await ns.compare_and_write(3, OLD, NEW)
        finally:
            stop()
        await ns.read(3, memoryview(bytearray(B)))  # not seen: stopped
    assert seen == [(IoOpcode.COMPARE, 1, 3), (IoOpcode.WRITE, 1, 3)]


async def test_host_compare_verify_and_compare_and_write(
    serve: Serve,
) -> None:
    _target, port = await serve(MemoryDevice(16 * MiB, B))
    async with await connect("127.0.0.1", port, NQN, queues=2) as ctrl:
        ns = ctrl.namespace(1)
        data = random.Random(1).randbytes(3 * MiB)  # split over several Compares
        await ns.write(0, data)
        assert await ns.compare(0, data)
        assert not await ns.compare(0, data[:-1] + bytes([data[-1] ^ 1]))
        await ns.verify(0, ns.capabilities.num_blocks, fua=True)
        assert await ns.compare_and_write(0, data[:B], NEW)
        assert not await ns.compare_and_write(0, data[:B], OTHER)
        assert await ns.compare(0, NEW)
        with pytest.raises(BlockRangeError):  # refused before anything is sent
            await ns.compare(ns.capabilities.num_blocks - 1, bytes(2 * B))
        # A status from the controller is raised: a Compare on a namespace it lacks.
        with pytest.raises(NvmeStatusError) as err:
            await ctrl.io_command(IoOpcode.COMPARE, 9, data=bytes(B))
        assert err.value.status == Status.INVALID_NS


async def test_host_refuses_what_the_controller_did_not_offer(
    serve: Serve,
) -> None:
    _target, port = await serve(MemoryDevice(MiB, B))
    async with await connect("127.0.0.1", port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        assert ctrl.info is not None
        sent = ctrl.io_queues[0].conn.stats.commands
        limit = ctrl.info.acwu + 1
        with pytest.raises(ValueError, match="atomically"):
            await ns.compare_and_write(0, bytes((limit + 1) * B), bytes((limit + 1) * B))
        ctrl.info = dataclasses.replace(ctrl.info, fuses=0, oncs=0)
        with pytest.raises(NvmeUnsupportedError):
            await ns.compare_and_write(0, OLD, NEW)
        with pytest.raises(NvmeUnsupportedError):
            await ns.compare(0, OLD)
        with pytest.raises(NvmeUnsupportedError):
            await ns.verify(0, 1)
        assert ctrl.io_queues[0].conn.stats.commands == sent


async def test_fused_pair_waits_for_two_free_command_ids(
    serve: Serve,
) -> None:
    _target, port = await serve(MemoryDevice(MiB, B))
    async with await connect("127.0.0.1", port, NQN, queue_depth=2) as ctrl:
        ns = ctrl.namespace(1)
        buf = memoryview(bytearray(B))
        # Reads keep one of the two ids busy; every pair still goes out whole.
        results = await asyncio.gather(
            *(ns.read(i, buf) for i in range(20)),
            *(ns.compare_and_write(7, bytes(B) if i == 0 else NEW, NEW) for i in range(5)),
        )
        assert results[20:] == [True] * 5


# -- atomicity: an ATS-style race on one lock block ------------------------------------------

_LOCK = struct.Struct("<QI4s")  # generation, owner, attempt tag
LOCK_LBA = 8
ROUNDS = 40
QUEUES = 3


def lock_block(generation: int, owner: int, tag: bytes) -> bytes:
    return _LOCK.pack(generation, owner, tag).ljust(B, b"\0")


async def race(ctrls: list[Controller], bystander: RemoteNamespace) -> None:
    """Each round every queue of every racer tries to move the lock block from the
    current value to its own next value: exactly one attempt may win, and the block's
    history is the winners' values in order. Meanwhile the bystander writes elsewhere."""
    namespaces = [c.namespace(1) for c in ctrls]
    current = lock_block(0, 0, b"none")
    await namespaces[0].write(LOCK_LBA, current)
    stop = asyncio.Event()
    rng = random.Random(7)
    written: dict[int, bytes] = {}

    async def bystand() -> int:
        n = 0
        while not stop.is_set():
            lba = 1024 + rng.randrange(4096)
            data = rng.randbytes(B * rng.choice((1, 8, 64)))
            await bystander.write(lba, data)
            for i in range(len(data) // B):
                written[lba + i] = data[i * B : (i + 1) * B]
            n += 1
        return n

    writer = asyncio.ensure_future(bystand())
    history = [current]
    try:
        for generation in range(1, ROUNDS + 1):
            attempts = [
                (owner, q, lock_block(generation, owner, f"{q:04d}".encode()))
                for owner in range(len(namespaces))
                for q in range(QUEUES)
            ]
            outcomes = await asyncio.gather(
                *(
                    namespaces[o].compare_and_write(LOCK_LBA, current, new)
                    for o, _q, new in attempts
                )
            )
            winners = [new for (_o, _q, new), won in zip(attempts, outcomes, strict=True) if won]
            assert len(winners) == 1, f"round {generation}: {len(winners)} winners"
            buf = bytearray(B)
            await namespaces[generation % len(namespaces)].read(LOCK_LBA, memoryview(buf))
            assert bytes(buf) == winners[0]
            current = winners[0]
            history.append(current)
    finally:
        stop.set()
        bystander_writes = await writer
    assert [_LOCK.unpack_from(h)[0] for h in history] == list(range(ROUNDS + 1))
    assert bystander_writes > 0
    # The bystander's writes all landed, untouched by the racers.
    for lba, data in written.items():
        buf = bytearray(B)
        await bystander.read(lba, memoryview(buf))
        assert bytes(buf) == data, lba


async def _connect_all(port: int) -> list[Controller]:
    return [
        await connect("127.0.0.1", port, NQN, hostnqn=nqn, hostid=hid, queues=QUEUES)
        for nqn, hid in HOSTS
    ]


@pytest.mark.parametrize("backing", ["memory", "file", "gateway"])
async def test_two_hosts_race_compare_and_write_on_one_lock_block(
    serve: Serve, tmp_path: Path, backing: str
) -> None:
    """`gateway`: the namespace is a remote namespace of a second target (its reads and
    writes suspend on the network, so without the namespace's exclusion two pairs
    would interleave and both win)."""
    backend: Controller | None = None
    if backing == "memory":
        device: BlockDevice = MemoryDevice(8 * MiB, B)
    elif backing == "file":
        device = FileDevice(tmp_path / "ns.img", B, size_bytes=8 * MiB, create=True)
    else:
        inner = FileDevice(tmp_path / "inner.img", B, size_bytes=8 * MiB, create=True)
        inner_nqn = NQN + "-inner"
        _inner_target, inner_port = await serve(inner, inner_nqn)
        backend = await connect("127.0.0.1", inner_port, inner_nqn, queues=2)
        device = backend.namespace(1)
    target, port = await serve(device)
    ctrls = await _connect_all(port)
    try:
        assert len({c.cntlid for c in ctrls}) == 3
        racers, bystander = ctrls[:2], ctrls[2].namespace(1)
        await race(racers, bystander)
    finally:
        for c in ctrls:
            await c.close()
        await target.stop()  # flushes and closes its device: the backend is still up
        if backend is not None:
            await backend.close()
