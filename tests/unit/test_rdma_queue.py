"""The controller's end of an NVMe/RDMA queue (pynvmf.rdma.queue), without a verbs device.

A fake of the adapter's narrow interface (`Verbs`) records the RDMA READs, WRITEs and
SENDs the queue asks for, and plays the host's registered memory. The first part drives
the queue alone, with a recording NVMe layer above it: capsule parsing, in-capsule data
against keyed SGLs, the statuses a bad descriptor earns (sgl.py's), a SEND larger than the
receive buffers, the completions' bytes. The second puts the real NVMe layer (TargetQueue,
a controller, a memory namespace) over it: the seam (target/transport.py) carries writes
in the capsule and by RDMA READ, and reads by RDMA WRITE then SEND with Invalidate.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.rdma import sgl
from pynvmf.rdma.counters import RdmaCounters, RdmaQueueTally, RdmaTransportCounters
from pynvmf.rdma.queue import (
    DEFAULT_IN_CAPSULE_SIZE,
    RdmaConnection,
    pack_completion,
    receive_size,
)
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.admin import identify_controller
from pynvmf.target.controller import Controller
from pynvmf.target.port import Port
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.target.transport import Buffer, QueueParams, QueueTransport, Request
from tests.support.raw import HOSTID, HOSTNQN

NQN = "nqn.2024-01.io.pynvmf.test:rdma"
BLOCK = 512
BLOCKS = 4096
HOST_KEY = 0x1234
HOST_BASE = 0x7F00_0000_0000


class FakeVerbs:
    """The adapter as the queue sees it; host memory is one region under HOST_KEY."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.host = bytearray(size)
        self.posted: list[int] = []
        self.reads: list[tuple[int, int, int, int]] = []
        self.writes: list[tuple[bytes, int, int]] = []
        self.sends: list[tuple[bytes, int | None]] = []
        self.disconnects = 0
        self.conn: RdmaConnection | None = None
        self.answer_reads = False
        self.sent = asyncio.Event()

    def post_receive(self, slot: int) -> None:
        self.posted.append(slot)

    def read(self, tag: int, length: int, address: int, key: int) -> None:
        self.reads.append((tag, length, address, key))
        if self.answer_reads:
            conn = self.conn
            assert conn is not None
            data = self._host(address, length, key)
            asyncio.get_running_loop().call_soon(conn.read_done, tag, data)

    def write(self, data: Buffer, address: int, key: int) -> None:
        payload = bytes(data)
        self.writes.append((payload, address, key))
        start = address - HOST_BASE
        assert key == HOST_KEY
        self.host[start : start + len(payload)] = payload

    def send(self, message: bytes, invalidate_key: int | None) -> None:
        self.sends.append((message, invalidate_key))
        self.sent.set()

    def disconnect(self) -> None:
        self.disconnects += 1
        self.sent.set()

    def _host(self, address: int, length: int, key: int) -> bytearray | None:
        if key != HOST_KEY:
            return None  # a remote access error: the key names nothing
        start = address - HOST_BASE
        return bytearray(self.host[start : start + length])


class Budget:
    def __init__(self) -> None:
        self.given = 0
        self.closed = False

    def give(self, n: int) -> None:
        self.given += n

    def close(self) -> None:
        self.closed = True


class RecordingQueue:
    """An NVMe layer that keeps what arrives (copying borrowed data, as the real one does)."""

    def __init__(self) -> None:
        self.budget = Budget()
        self.commands: list[tuple[Request, bytes | None]] = []
        self.refused: list[Request] = []

    def on_command(self, req: Request) -> None:
        self.commands.append((req, None if req.data is None else bytes(req.data)))

    def on_refused(self, req: Request) -> None:
        self.refused.append(req)

    def log_context(self) -> dict[str, object]:
        return {}


def queue_pair(
    qid: int = 1, in_capsule: int = DEFAULT_IN_CAPSULE_SIZE
) -> tuple[RdmaConnection, FakeVerbs, RecordingQueue]:
    verbs = FakeVerbs()
    conn = RdmaConnection(verbs, in_capsule_size=in_capsule, max_transfer=1 << 20)
    verbs.conn = conn
    upper = RecordingQueue()
    conn.attach(upper)
    conn.bind_queue(QueueParams(qid, 32, borrow_capsule_data=qid > 0))
    return conn, verbs, upper


def sqe(
    opcode: int, cid: int, descriptor: bytes, *, nsid: int = 1, slba: int = 0, nlb: int = 1
) -> bytes:
    raw = bytearray(C.build_sqe(opcode, cid, nsid, cdw10=slba, cdw12=nlb - 1, flags=0x40))
    raw[sgl.SQE_DPTR_OFFSET : sgl.SQE_DPTR_OFFSET + sgl.DESCRIPTOR_SIZE] = descriptor
    return bytes(raw)


def keyed(length: int, *, offset: int = 0, invalidate: bool = False, key: int = HOST_KEY) -> bytes:
    return sgl.KeyedSgl(HOST_BASE + offset, length, key, invalidate).encode()


def in_capsule(length: int) -> bytes:
    return sgl.InCapsule(0, length).encode()


def cqe(cid: int, status: int, sqhd: int, qid: int = 1, result: int = 0) -> bytes:
    return struct.pack("<IIHHHH", result & 0xFFFFFFFF, result >> 32, sqhd, qid, cid, status << 1)


# -- the queue alone ---------------------------------------------------------------------


def test_a_write_with_in_capsule_data_reaches_the_nvme_layer_and_the_buffer_is_reposted() -> None:
    conn, verbs, upper = queue_pair()
    data = bytes(range(256)) * 16  # 4 KiB
    conn.received(3, memoryview(sqe(IoOpcode.WRITE, 7, in_capsule(len(data)), nlb=8) + data))
    [(req, got)] = upper.commands
    assert (req.sqe.cid, req.length, got) == (7, len(data), data)
    assert verbs.posted == [3]
    assert conn.commands_in_flight == 1
    assert conn.in_capsule_bytes == len(data)


def test_the_largest_in_capsule_write_fits_the_receive_buffer() -> None:
    conn, _verbs, upper = queue_pair()
    data = b"\x5a" * DEFAULT_IN_CAPSULE_SIZE
    message = sqe(IoOpcode.WRITE, 1, in_capsule(len(data)), nlb=32) + data
    assert len(message) == receive_size(DEFAULT_IN_CAPSULE_SIZE)
    conn.received(0, memoryview(message))
    assert [got for _, got in upper.commands] == [data]


def test_a_send_larger_than_the_receive_buffer_is_refused_and_ends_the_connection() -> None:
    conn, verbs, upper = queue_pair()
    data = b"\x5a" * (DEFAULT_IN_CAPSULE_SIZE + 1)
    conn.received(0, memoryview(sqe(IoOpcode.WRITE, 1, in_capsule(len(data))) + data))
    assert upper.commands == [] and verbs.sends == []
    assert conn.closing and verbs.disconnects == 1
    assert "receive buffers hold" in conn.close_reason
    assert verbs.posted == []  # nothing more is received on a closing queue


def test_a_receive_completed_in_error_ends_the_connection() -> None:
    conn, verbs, _ = queue_pair()
    conn.receive_failed("local length error")
    assert conn.closing and verbs.disconnects == 1


def test_a_send_shorter_than_a_command_ends_the_connection() -> None:
    conn, _verbs, upper = queue_pair()
    conn.received(0, memoryview(bytes(40)))
    assert upper.commands == [] and conn.closing


def test_a_keyed_command_carries_the_descriptors_length_and_nothing_in_the_capsule() -> None:
    conn, _, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 2, keyed(8192), nlb=16)))
    [(req, got)] = upper.commands
    assert (req.length, got) == (8192, None)


@pytest.mark.parametrize(
    ("descriptor", "data", "status"),
    [
        # Descriptor type 0x2 (Segment) is neither data block nor keyed data block.
        (bytes(15) + b"\x20", b"", Status.SGL_INVALID_TYPE),
        # A data block whose sub type is Address, not Offset.
        (bytes(15) + b"\x00", b"", Status.INVALID_FIELD),
        # In-capsule data described as more than the capsule carried.
        (sgl.InCapsule(0, 1024).encode(), b"x" * 512, Status.SGL_INVALID_DATA),
        # In-capsule data at an offset past the in-capsule limit.
        (sgl.InCapsule(DEFAULT_IN_CAPSULE_SIZE, 512).encode(), b"", Status.SGL_INVALID_OFFSET),
        # A keyed descriptor and data in the capsule both.
        (keyed(512), b"x" * 512, Status.SGL_INVALID_TYPE),
        # A keyed length above the transport's largest transfer.
        (keyed((1 << 20) + 512), b"", Status.SGL_INVALID_DATA),
        # A keyed descriptor of sub type 0x5, neither Address nor Invalidate Key.
        (keyed(512)[:15] + b"\x45", b"", Status.INVALID_FIELD),
    ],
)
def test_a_bad_descriptor_fails_the_command_with_the_status_sgl_names(
    descriptor: bytes, data: bytes, status: int
) -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.WRITE, 9, descriptor) + data))
    assert upper.commands == []
    assert [r.sqe.cid for r in upper.refused] == [9]
    assert verbs.sends == [(cqe(9, status | DNR, sqhd=2), None)]
    assert verbs.reads == [] and verbs.writes == []
    assert conn.commands_in_flight == 0 and not conn.closing


def test_in_capsule_data_on_a_read_is_an_invalid_field() -> None:
    conn, verbs, _upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 4, in_capsule(512)) + b"x" * 512))
    assert verbs.sends == [(cqe(4, Status.INVALID_FIELD | DNR, sqhd=2), None)]


def test_prps_are_refused() -> None:
    conn, verbs, _upper = queue_pair()
    raw = bytearray(sqe(IoOpcode.READ, 4, keyed(512)))
    raw[1] = 0x00  # PSDT 00b: PRPs
    conn.received(0, memoryview(bytes(raw)))
    assert verbs.sends == [(cqe(4, Status.INVALID_FIELD | DNR, sqhd=2), None)]


def test_a_cid_in_flight_again_is_a_conflict_and_the_first_command_stays() -> None:
    conn, verbs, _upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 5, keyed(512))))
    conn.received(1, memoryview(sqe(IoOpcode.READ, 5, keyed(512))))
    assert verbs.sends == [(cqe(5, Status.CMDID_CONFLICT | DNR, sqhd=3), None)]
    assert conn.commands_in_flight == 1


def test_a_read_completes_by_rdma_write_then_send_with_invalidate() -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 6, keyed(1024, offset=4096, invalidate=True))))
    [(req, _)] = upper.commands
    conn.complete(req, 0, 0, b"\xab" * 1024)
    assert verbs.writes == [(b"\xab" * 1024, HOST_BASE + 4096, HOST_KEY)]
    assert verbs.sends == [(cqe(6, 0, sqhd=2), HOST_KEY)]
    assert conn.commands_in_flight == 0


def test_a_read_sent_in_pieces_writes_each_at_its_offset() -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 6, keyed(2048))))
    [(req, _)] = upper.commands
    conn.send_data(req, b"\x01" * 1024)
    conn.complete(req, 0, 0, b"\x02" * 1024)
    assert [(a - HOST_BASE, len(d)) for d, a, _ in verbs.writes] == [(0, 1024), (1024, 1024)]
    assert verbs.sends == [(cqe(6, 0, sqhd=2), None)]  # sub type Address: no invalidate


def test_a_write_whose_data_is_keyed_is_fetched_by_rdma_read() -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.WRITE, 8, keyed(65536, offset=512), nlb=128)))
    [(req, _)] = upper.commands
    arrived: list[bytes | None] = []
    conn.fetch_data(req, lambda r: arrived.append(None if r.data is None else bytes(r.data)))
    assert verbs.reads == [(8, 65536, HOST_BASE + 512, HOST_KEY)]
    conn.read_done(8, bytearray(b"\x77" * 65536))
    assert arrived == [b"\x77" * 65536]


def test_a_failed_rdma_read_ends_that_queue_and_the_command_gets_no_data() -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.WRITE, 8, keyed(4096), nlb=8)))
    [(req, _)] = upper.commands
    arrived: list[object] = []
    conn.fetch_data(req, lambda r: arrived.append(r.data))
    conn.read_done(8, None)
    # The queue pair is in error after a failed READ: nothing is sent, the queue ends.
    assert arrived == [None]
    assert verbs.sends == [] and conn.closing and verbs.disconnects == 1


def test_completions_carry_the_result_sqhd_qid_and_status() -> None:
    assert pack_completion(0x1_0000_0002, 5, 3, 0x1234, Status.INVALID_FIELD | DNR) == (
        bytes.fromhex("02000000 01000000 0500 0300 3412")
        + ((0x4002 << 1) & 0xFFFF).to_bytes(2, "little")
    )
    conn, verbs, upper = queue_pair(qid=0)
    conn.bind_queue(QueueParams(0, 32, sqhd_disabled=True))
    conn.received(0, memoryview(sqe(IoOpcode.FLUSH, 1, keyed(0))))
    [(req, _)] = upper.commands
    conn.complete(req, 0, 0xDEAD)
    assert verbs.sends == [(cqe(1, 0, sqhd=0xFFFF, qid=0, result=0xDEAD), None)]


def test_a_disconnected_queue_gives_back_what_commands_held_and_sends_nothing() -> None:
    conn, verbs, upper = queue_pair()
    conn.received(0, memoryview(sqe(IoOpcode.READ, 6, keyed(1024))))
    [(req, _)] = upper.commands
    req.charge = 1024
    conn.disconnected()
    assert upper.budget.given == 1024 and upper.budget.closed
    conn.complete(req, 0, 0, b"x" * 1024)
    assert verbs.sends == [] and verbs.writes == []


def test_a_queue_counts_into_its_ports_tally_while_alive_and_once_when_it_ends() -> None:
    tally = RdmaQueueTally()
    verbs = FakeVerbs()
    conn = RdmaConnection(verbs, max_transfer=1 << 20, tally=tally)
    verbs.conn = conn
    upper = RecordingQueue()
    conn.attach(upper)
    conn.bind_queue(QueueParams(1, 32, borrow_capsule_data=True))
    assert (tally.queues, tally.alive, tally.total()) == (1, 1, RdmaCounters())
    conn.received(0, memoryview(sqe(IoOpcode.WRITE, 1, in_capsule(512)) + b"\x01" * 512))
    conn.received(1, memoryview(sqe(IoOpcode.WRITE, 2, keyed(4096), nlb=8)))
    conn.received(2, memoryview(sqe(IoOpcode.READ, 3, keyed(1024), nlb=2)))
    (small, _), (big, _), (read, _) = upper.commands
    conn.complete(small, 0)
    conn.fetch_data(big, lambda r: None)
    conn.read_done(2, bytearray(4096))
    conn.complete(big, 0)
    conn.complete(read, 0, 0, b"\x02" * 1024)
    expected = RdmaCounters(
        commands=3, in_capsule_bytes=512, rdma_reads=1, rdma_writes=1, completions=3
    )
    # The named interface: a copy of the queue's counts, read by the tally while it lives.
    assert conn.counters() == expected and tally.total() == expected
    conn.disconnected()
    conn.disconnected()  # the adapter may report the end twice: counted once
    assert (tally.queues, tally.alive, tally.total()) == (1, 0, expected)


def test_a_transports_counters_keep_a_tally_per_port() -> None:
    counters = RdmaTransportCounters()
    first = counters.port("rdma:10.0.0.1:4420")
    assert counters.port("rdma:10.0.0.1:4420") is first
    second = counters.port("rdma:10.0.0.1:4421")
    assert counters.ports() == [("rdma:10.0.0.1:4420", first), ("rdma:10.0.0.1:4421", second)]


def test_the_rdma_connection_is_a_queue_transport() -> None:
    conn, _, _ = queue_pair()
    assert isinstance(conn, QueueTransport)


# -- under the real NVMe layer ------------------------------------------------------------


class Rig:
    """QID 1 of a controller over one memory namespace, on an RdmaConnection."""

    def __init__(self) -> None:
        self.device = MemoryDevice(BLOCK * BLOCKS, BLOCK)
        subsystem = Subsystem(NQN)
        subsystem.add_namespace(Namespace.create(NQN, 1, self.device, "memory:1"))
        port = Port("127.0.0.1", 0, trtype="rdma")
        target = Target([subsystem], [port])
        self.ctrl = Controller(target, subsystem, 1, HOSTNQN, HOSTID, 0, port)
        subsystem.controllers[1] = self.ctrl
        self.verbs = FakeVerbs()
        self.verbs.answer_reads = True
        self.conn = RdmaConnection(self.verbs, max_transfer=1 << 20)
        self.verbs.conn = self.conn
        self.queue = TargetQueue(target, port, self.conn, "127.0.0.1")
        self.queue.bind(self.ctrl, 1, 32, False)

    async def completion(self, count: int) -> list[tuple[bytes, int | None]]:
        """The SENDs once there are `count` (or the connection ends)."""
        verbs = self.verbs
        async with asyncio.timeout(5):
            while len(verbs.sends) < count and not self.conn.closing:
                verbs.sent.clear()
                await verbs.sent.wait()
        return verbs.sends


async def test_writes_in_capsule_and_by_rdma_read_then_a_read_by_rdma_write() -> None:
    rig = Rig()
    small = bytes(range(256)) * 16  # 4 KiB: in the capsule
    rig.conn.received(
        0, memoryview(sqe(IoOpcode.WRITE, 1, in_capsule(len(small)), slba=0, nlb=8) + small)
    )
    big = bytes(reversed(range(256))) * 256  # 64 KiB: by RDMA READ
    rig.verbs.host[: len(big)] = big
    rig.conn.received(1, memoryview(sqe(IoOpcode.WRITE, 2, keyed(len(big)), slba=8, nlb=128)))
    sends = await rig.completion(2)
    assert sorted(m for m, _ in sends) == sorted([cqe(1, 0, sqhd=2), cqe(2, 0, sqhd=3)])
    assert rig.verbs.reads == [(2, len(big), HOST_BASE, HOST_KEY)]
    # Read both back into host memory at 128 KiB, asking for the key's invalidation.
    rig.verbs.host[:] = bytes(len(rig.verbs.host))
    total = len(small) + len(big)
    rig.conn.received(
        2,
        memoryview(
            sqe(IoOpcode.READ, 3, keyed(total, offset=131072, invalidate=True), slba=0, nlb=136)
        ),
    )
    sends = await rig.completion(3)
    assert sends[2] == (cqe(3, 0, sqhd=4), HOST_KEY)
    assert bytes(rig.verbs.host[131072 : 131072 + total]) == small + big
    assert rig.verbs.posted == [0, 1, 2]
    assert rig.conn.commands_in_flight == 0


async def test_a_write_naming_a_key_the_host_never_registered_ends_the_queue_unwritten() -> None:
    rig = Rig()
    rig.conn.received(0, memoryview(sqe(IoOpcode.WRITE, 1, keyed(4096, key=0x999), slba=0, nlb=8)))
    sends = await rig.completion(1)
    assert sends == [] and rig.conn.closing and rig.verbs.disconnects == 1
    buf = bytearray(4096)
    with pytest.raises(StopIteration):
        rig.device.read(0, memoryview(buf)).send(None)
    assert buf == bytes(4096)


def test_an_rdma_port_says_keyed_sgls_and_its_in_capsule_size() -> None:
    rig = Rig()
    ident = identify_controller(rig.ctrl, rig.queue)
    # Keyed SGL data blocks (the Linux RDMA host requires them), offsets for in-capsule data,
    # and a capsule of an SQE and 16 KiB.
    assert ident.sgls & I.Sgls.KEYED and ident.sgls & I.Sgls.OFFSET
    assert ident.ioccsz * 16 == 64 + DEFAULT_IN_CAPSULE_SIZE
