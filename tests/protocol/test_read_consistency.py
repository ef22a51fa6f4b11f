"""A Read's data is what its data digest covers, and each of its blocks is wholly from
before or wholly from after a Write to the same blocks (Identify AWUN/AWUPF: one block),
however the Write overlaps it: later in the same batch of commands, on another
connection, or on another worker process (`--cores`).

SPDK's perf tool found the first (data digest errors under randrw with digests): a
memory namespace's Read was sent as a view of the namespace's memory, so a Write landing
between the digest and the socket changed the bytes sent. block/inplace.py says what
replaced it.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
from collections.abc import AsyncIterator

import pytest

from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.cores.workers import MultiCoreTarget
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_SUBNQN, RawTarget
from tests.support.raw import RawQueue, rw_sqe

BLOCK = RAW_NS1_BLOCK
STAMP = struct.Struct("<QQ")  # (writer, sequence): a block is this, repeated


def _stamped(writer: int, seq: int, nblocks: int) -> bytes:
    return STAMP.pack(writer, seq) * (nblocks * BLOCK // STAMP.size)


def _torn_blocks(data: bytes) -> list[int]:
    """Indices of the blocks that are not one stamp throughout."""
    torn = []
    for i in range(len(data) // BLOCK):
        block = data[i * BLOCK : (i + 1) * BLOCK]
        if block != block[: STAMP.size] * (BLOCK // STAMP.size):
            torn.append(i)
    return torn


async def _digest_queue(raw: RawTarget, admin: RawQueue, qid: int, subnqn: str) -> RawQueue:
    """I/O queue `qid` with header and data digests (the raw client checks both on every
    PDU the target sends, and fails the test on a mismatch)."""
    io = await raw.open()
    await io.handshake(hdgst=True, ddgst=True)
    assert io.hdgst and io.ddgst
    done = await io.connect(subnqn, qid=qid, cntlid=admin.cntlid)
    assert done.status == 0, done
    return io


async def test_a_write_behind_a_read_of_the_same_blocks_does_not_change_what_is_sent(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin()
    io = await _digest_queue(raw_target, admin, 1, RAW_SUBNQN)
    old, new = _stamped(1, 1, 8), _stamped(2, 2, 8)
    assert (await io.write(1, 0, old, BLOCK)).status == 0
    # The Read and a Write of the same blocks in one segment: the target takes both from
    # one receive, and sends the Read's data after it has run the Write.
    read_sqe = rw_sqe(IoOpcode.READ, io.next_cid(), 1, 0, 8, len(old))
    read = io.submit_nowait(read_sqe, read_len=len(old), wire=b"")
    write_sqe = rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 0, 8, len(new), inline=True)
    write = io.submit_nowait(write_sqe, new, wire=b"")
    io.send(io.capsule(read_sqe) + io.capsule(write_sqe, new))
    done_read, done_write = await asyncio.wait_for(asyncio.gather(read, write), 10)
    assert done_read.status == 0 and done_write.status == 0
    # The Read ran first: its data is the blocks as they were then, and the digest the
    # raw client checked covers exactly those bytes.
    assert done_read.data == old
    assert (await io.read(1, 0, 8, BLOCK)).data == new


# Reads above 16 KiB are lent as views of the namespace's memory (block/inplace.py)
# where the transport hands its output to the socket at once: the namespace of 4 KiB
# blocks, 16 blocks read (64 KiB), one block in its middle changed in the same batch.
LARGE_NSID = 2
LARGE_BLOCK = 4096
LARGE_READ = 16
CHANGED_LBA = 7


def _changing_command(how: str, io: RawQueue) -> tuple[bytes, bytes]:
    """An SQE (and its in-capsule data) that changes block CHANGED_LBA of LARGE_NSID."""
    if how == "write":
        data = _stamped(2, 2, LARGE_BLOCK // BLOCK)
        sqe = rw_sqe(
            IoOpcode.WRITE, io.next_cid(), LARGE_NSID, CHANGED_LBA, 1, len(data), inline=True
        )
        return sqe, data
    if how == "zeroes":
        return rw_sqe(IoOpcode.WRITE_ZEROES, io.next_cid(), LARGE_NSID, CHANGED_LBA, 1, 0), b""
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["write", "zeroes"])
async def test_a_large_read_lent_as_a_view_is_copied_before_its_blocks_change(
    raw_target: RawTarget, how: str
) -> None:
    admin = await raw_target.admin()
    io = await _digest_queue(raw_target, admin, 1, RAW_SUBNQN)
    old = _stamped(1, 1, LARGE_READ * LARGE_BLOCK // BLOCK)
    assert (await io.write(LARGE_NSID, 0, old, LARGE_BLOCK)).status == 0
    read_sqe = rw_sqe(IoOpcode.READ, io.next_cid(), LARGE_NSID, 0, LARGE_READ, len(old))
    read = io.submit_nowait(read_sqe, read_len=len(old), wire=b"")
    change_sqe, change_data = _changing_command(how, io)
    change = io.submit_nowait(change_sqe, change_data, wire=b"")
    io.send(io.capsule(read_sqe) + io.capsule(change_sqe, change_data))
    done_read, done_change = await asyncio.wait_for(asyncio.gather(read, change), 10)
    assert done_read.status == 0 and done_change.status == 0
    assert done_read.data == old
    after = (await io.read(LARGE_NSID, 0, LARGE_READ, LARGE_BLOCK)).data
    changed = slice(CHANGED_LBA * LARGE_BLOCK, (CHANGED_LBA + 1) * LARGE_BLOCK)
    assert after[changed] != old[changed]
    assert after[: changed.start] == old[: changed.start]


async def test_a_large_read_is_lent_and_recalled_once(raw_target: RawTarget) -> None:
    """The tests above prove something only if the Read was lent: the connection's loans
    count it, and the recall the Write made."""
    admin = await raw_target.admin()
    io = await _digest_queue(raw_target, admin, 1, RAW_SUBNQN)
    (protocol,) = [p for p in raw_target.port.connections if p.queue and p.queue.qid == 1]
    loans = protocol.conn.loans
    assert loans is not None
    size = LARGE_READ * LARGE_BLOCK
    assert (await io.read(LARGE_NSID, 0, LARGE_READ, LARGE_BLOCK)).status == 0
    assert (loans.lent, loans.recalled) == (1, 0)
    read_sqe = rw_sqe(IoOpcode.READ, io.next_cid(), LARGE_NSID, 0, LARGE_READ, size)
    read = io.submit_nowait(read_sqe, read_len=size, wire=b"")
    change_sqe, change_data = _changing_command("write", io)
    change = io.submit_nowait(change_sqe, change_data, wire=b"")
    io.send(io.capsule(read_sqe) + io.capsule(change_sqe, change_data))
    await asyncio.wait_for(asyncio.gather(read, change), 10)
    assert (loans.lent, loans.recalled, loans.lenders) == (2, 1, [])


@pytest.fixture
async def two_workers() -> AsyncIterator[RawTarget]:
    target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0)])
    target.add_subsystem(RAW_SUBNQN)
    device = target.memory_device(8192 * BLOCK, BLOCK)
    target.add_namespace(RAW_SUBNQN, NamedDevice.wrap("overlap", device, owned=True), nsid=1)
    await target.start()
    raw = RawTarget(target)
    try:
        yield raw
    finally:
        await raw.aclose()


async def test_reads_and_writes_of_the_same_blocks_on_two_workers_never_tear_a_block(
    two_workers: RawTarget,
) -> None:
    raw = two_workers
    admin = await raw.admin()
    writer = await _digest_queue(raw, admin, 1, RAW_SUBNQN)
    reader = await _digest_queue(raw, admin, 2, RAW_SUBNQN)
    workers = raw.target.workers
    assert workers is not None and [len(w.queues) for w in workers.workers] == [1, 1]
    # 64 KiB that both workers hit at once, 16 commands in flight on each queue: Writes
    # of 4 KiB stamped blocks, Reads of 4 KiB, all at block offsets that overlap.
    region = 128
    assert (await writer.write(1, 0, _stamped(0, 0, region), BLOCK)).status == 0
    rng = random.Random(7)
    seq = itertools.count(1)
    stop = asyncio.Event()
    reads = 0
    torn: list[tuple[int, list[int]]] = []

    async def write_loop() -> None:
        while not stop.is_set():
            lba = rng.randrange(region - 8)
            done = await writer.write(1, lba, _stamped(1, next(seq), 8), BLOCK)
            assert done.status == 0, done

    async def read_loop() -> None:
        nonlocal reads
        while reads < 3000:
            lba = rng.randrange(region - 8)
            done = await reader.read(1, lba, 8, BLOCK)
            assert done.status == 0, done
            if bad := _torn_blocks(done.data):
                torn.append((lba, bad))
            reads += 1

    writers = [asyncio.ensure_future(write_loop()) for _ in range(16)]
    try:
        await asyncio.wait_for(asyncio.gather(*(read_loop() for _ in range(16))), 120)
    finally:
        stop.set()
        await asyncio.gather(*writers)
    assert torn == []
