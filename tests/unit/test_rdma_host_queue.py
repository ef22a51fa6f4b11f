"""The host's end of an NVMe/RDMA queue (pynvmf.rdma.host_queue), without a verbs device.

A fake of the adapter's narrow interface (`HostVerbs`) records the SENDs and plays the
registered memory regions. The first part drives RdmaHostConnection and RdmaHostQueue
alone: in-capsule data against keyed SGLs, reads into registered memory, the CQE matched
by CID, the CQEs that end a queue, the RDMA CM answer. The second runs the host library
(pynvmf.host.connect with trtype rdma) over a loopback of the two adapters' interfaces
against pynvmf's own NVMe/RDMA target queue (pynvmf.rdma.queue) and a memory namespace.
"""

from __future__ import annotations

import asyncio
import importlib.util
import struct

import pytest

from pynvmf import host
from pynvmf.block.memory import MemoryDevice
from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError
from pynvmf.rdma import cm, sgl
from pynvmf.rdma import host_verbs as host_verbs_module
from pynvmf.rdma.host_queue import (
    RdmaConnectRejected,
    RdmaHostConnection,
    RdmaHostQueue,
    read_connect_answer,
)
from pynvmf.rdma.queue import RdmaConnection
from pynvmf.spec import command as C
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.port import Port
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.target.transport import Buffer
from pynvmf.tcp.host import ABORTED, HostCommand

BASE = 0x7F00_0000_0000


class FakeVerbs:
    """The host adapter as the queue sees it: a region per registered command, keyed
    0x100 + the command's CID, at BASE + key << 24."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.regions: dict[int, bytearray] = {}
        self.registered: list[tuple[int, int, bytes | None]] = []
        self.released: list[int] = []
        self.disconnects = 0
        self.sending: asyncio.Event | None = None

    def send(self, capsule: bytes) -> None:
        self.sent.append(capsule)
        if self.sending is not None:
            self.sending.set()

    async def sends(self, count: int) -> None:
        """Until `count` capsules went out."""
        self.sending = asyncio.Event()
        async with asyncio.timeout(5):
            while len(self.sent) < count:
                self.sending.clear()
                await self.sending.wait()

    def register(self, cid: int, length: int, data: memoryview | None) -> tuple[int, int]:
        self.registered.append((cid, length, None if data is None else bytes(data)))
        self.regions[cid] = bytearray(data) if data is not None else bytearray(length)
        key = 0x100 + cid
        return BASE + (key << 24), key

    def registered_data(self, cid: int, length: int) -> bytes:
        return bytes(self.regions[cid][:length])

    def release(self, cid: int) -> None:
        self.released.append(cid)
        del self.regions[cid]

    def disconnect(self) -> None:
        self.disconnects += 1


def cqe(cid: int, status: int = 0, result: int = 0, sqhd: int = 0, qid: int = 1) -> bytes:
    return struct.pack("<IIHHHH", result & 0xFFFFFFFF, result >> 32, sqhd, qid, cid, status << 1)


def descriptor(capsule: bytes) -> bytes:
    return capsule[sgl.SQE_DPTR_OFFSET : sgl.SQE_DPTR_OFFSET + sgl.DESCRIPTOR_SIZE]


def connection(
    depth: int = 4, inline: int = 4096
) -> tuple[RdmaHostConnection, FakeVerbs, list[HostCommand]]:
    verbs = FakeVerbs()
    done: list[HostCommand] = []
    conn = RdmaHostConnection(depth, verbs, done.append)
    conn.set_inline_limit(inline)
    return conn, verbs, done


def parse(capsule: bytes, *, host_to_controller: bool, length: int) -> sgl.DataDescriptor:
    """The descriptor as pynvmf's controller reads it (sgl.py)."""
    command = sgl.CommandData(
        host_to_controller=host_to_controller,
        in_capsule_bytes=len(capsule) - C.SQE_SIZE,
        in_capsule_limit=16384,
        transfer_length=length,
        max_transfer=1 << 20,
    )
    return sgl.parse_sqe_descriptor(capsule, command)


# -- the connection alone -------------------------------------------------------------------


def test_a_write_that_fits_goes_in_the_capsule_with_an_offset_descriptor() -> None:
    conn, verbs, _ = connection(inline=4096)
    data = bytes(range(256)) * 16
    cmd = conn.submit(IoOpcode.WRITE, 1, 0, 0, 7, data=data)
    [capsule] = verbs.sent
    assert capsule[C.SQE_SIZE :] == data and len(capsule) == C.SQE_SIZE + 4096
    assert parse(capsule, host_to_controller=True, length=4096) == sgl.InCapsule(0, 4096)
    assert capsule[0] == IoOpcode.WRITE and capsule[1] & 0xC0 == 0x40  # PSDT: SGL
    assert struct.unpack_from("<H", capsule, 2)[0] == cmd.cid
    assert verbs.registered == [] and conn.stats.in_capsule_bytes == 4096


def test_a_write_above_the_in_capsule_size_is_a_keyed_sgl_over_registered_memory() -> None:
    conn, verbs, done = connection(inline=4096)
    data = bytes(reversed(range(256))) * 256  # 64 KiB
    cmd = conn.submit(IoOpcode.WRITE, 1, 0, 0, 127, data=data)
    [capsule] = verbs.sent
    assert len(capsule) == C.SQE_SIZE  # nothing in the capsule
    key = 0x100 + cmd.cid
    assert parse(capsule, host_to_controller=True, length=len(data)) == sgl.KeyedSgl(
        BASE + (key << 24), len(data), key
    )
    assert verbs.registered == [(cmd.cid, len(data), data)]
    conn.received(cqe(cmd.cid))
    assert done == [cmd] and cmd.status == 0
    assert verbs.released == [cmd.cid] and conn.free_slots == 4


def test_the_admin_queue_sends_no_data_in_capsules_not_even_connects() -> None:
    # Linux's nvmet-rdma gives the admin queue's receive buffers no room for data.
    conn, verbs, _ = connection(inline=0)
    data = C.ConnectData(bytes(16), 0xFFFF, "nqn.sub", "nqn.host").pack()
    conn.submit(AdminOpcode.FABRICS, FabricsType.CONNECT, data=data)
    assert len(verbs.sent[0]) == C.SQE_SIZE
    assert isinstance(parse(verbs.sent[0], host_to_controller=True, length=1024), sgl.KeyedSgl)


def test_a_read_lands_in_the_callers_buffer_when_its_completion_comes() -> None:
    conn, verbs, done = connection()
    into = memoryview(bytearray(8192))
    cmd = conn.submit(IoOpcode.READ, 1, 0, 0, 15, into=into)
    key = 0x100 + cmd.cid
    assert parse(verbs.sent[0], host_to_controller=False, length=8192) == sgl.KeyedSgl(
        BASE + (key << 24), 8192, key
    )
    assert verbs.registered == [(cmd.cid, 8192, None)]
    verbs.regions[cmd.cid][:] = b"\xa5" * 8192  # the controller's RDMA WRITE
    conn.received(cqe(cmd.cid))
    assert done == [cmd] and bytes(into) == b"\xa5" * 8192 and cmd.received == 8192


def test_a_failed_read_leaves_the_buffer_alone_and_names_its_status() -> None:
    conn, verbs, _ = connection()
    into = memoryview(bytearray(512))
    cmd = conn.submit(IoOpcode.READ, 1, into=into)
    verbs.regions[cmd.cid][:] = b"x" * 512
    conn.received(cqe(cmd.cid, Status.LBA_OUT_OF_RANGE | DNR))
    assert cmd.status == Status.LBA_OUT_OF_RANGE | DNR and bytes(into) == bytes(512)
    assert verbs.released == [cmd.cid]


def test_a_command_without_data_carries_a_zero_keyed_descriptor() -> None:
    conn, verbs, _ = connection()
    conn.submit(IoOpcode.FLUSH, 1)
    assert descriptor(verbs.sent[0]) == sgl.KeyedSgl(0, 0, 0).encode()
    assert verbs.registered == []


def test_completions_match_by_cid_in_any_order_with_their_results() -> None:
    conn, _, done = connection()
    first = conn.submit(IoOpcode.FLUSH, 1)
    second = conn.submit(AdminOpcode.GET_FEATURES, 0, 7)
    conn.received(cqe(second.cid, result=0x0003_0003 | 1 << 40))
    conn.received(cqe(first.cid))
    assert done == [second, first] and second.result == 0x0003_0003 | 1 << 40


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (cqe(3), "command 3, which is not in flight"),
        (cqe(0x9999), "command 39321, which is not in flight"),
        (cqe(0) + bytes(48), "64 bytes where a 16-byte completion goes"),
        (cqe(0)[:12], "12 bytes where a 16-byte completion goes"),
    ],
)
def test_a_bad_completion_ends_the_queue_and_every_command_in_flight(
    message: bytes, words: str
) -> None:
    conn, verbs, done = connection()
    write = conn.submit(IoOpcode.WRITE, 1, data=bytes(8192))  # keyed: a region held
    read = conn.submit(IoOpcode.READ, 1, into=memoryview(bytearray(512)))
    conn.received(message)
    assert conn.closing and words in conn.close_reason
    assert {c.cid for c in done} == {write.cid, read.cid}
    assert all(c.status == ABORTED for c in done)
    assert verbs.regions == {} and verbs.disconnects == 1
    conn.received(cqe(write.cid))  # after the end, nothing more is taken
    assert len(done) == 2
    with pytest.raises(ConnectionError):
        conn.submit(IoOpcode.FLUSH, 1)


def test_a_transfer_above_the_keyed_limit_is_refused_before_anything_is_sent() -> None:
    conn, verbs, _ = connection()
    with pytest.raises(ValueError, match="largest transfer"):
        conn.submit(IoOpcode.WRITE, 1, data=bytes((1 << 20) + 512))
    assert verbs.sent == [] and conn.free_slots == 4


# -- the RDMA CM answer ---------------------------------------------------------------------


REQUEST = cm.ConnectRequest.for_queue(1, 33, cntlid=5)


def test_an_accept_gives_its_crqsize() -> None:
    padded = cm.ConnectAccept(crqsize=33).encode() + bytes(164)  # as the CM delivers it
    assert read_connect_answer(True, padded, REQUEST, "q1") == 33


def test_a_reject_names_its_status() -> None:
    data = cm.ConnectReject(cm.RejectStatus.INVALID_HSQSIZE).encode() + bytes(144)
    with pytest.raises(RdmaConnectRejected, match="invalid host send queue size") as info:
        read_connect_answer(False, data, REQUEST, "q1")
    assert info.value.status is cm.RejectStatus.INVALID_HSQSIZE
    assert isinstance(info.value, NvmeConnectionError)


def test_a_reject_without_a_binding_status_says_so() -> None:
    # What the CM delivers when no one listens: no NVMe/RDMA private data.
    with pytest.raises(RdmaConnectRejected, match="sts") as info:
        read_connect_answer(False, bytes(148), REQUEST, "q1")
    assert info.value.status is None


def test_an_accept_for_fewer_commands_than_the_queue_sends_is_refused() -> None:
    with pytest.raises(NvmeConnectionError, match="CRQSIZE"):
        read_connect_answer(True, cm.ConnectAccept(crqsize=8).encode(), REQUEST, "q1")


# -- the asyncio queue --------------------------------------------------------------------


async def test_the_queue_waits_for_a_free_command_id_and_raises_a_failed_status() -> None:
    verbs = FakeVerbs()
    queue = RdmaHostQueue(1, 1, verbs)
    first = await queue.submit(IoOpcode.FLUSH, 1)
    second = asyncio.create_task(queue.execute(IoOpcode.FLUSH, 1))
    await asyncio.sleep(0)  # the task runs up to its wait for a command id
    assert len(verbs.sent) == 1  # one command id: the second waits for it
    queue.received(cqe(first.cid))
    assert await queue.wait(first) == 0
    await verbs.sends(2)
    queue.received(cqe(first.cid, Status.INVALID_FIELD | DNR))
    with pytest.raises(NvmeStatusError) as info:
        await second
    assert info.value.status == Status.INVALID_FIELD and "DNR" in str(info.value)


async def test_a_waiter_cancelled_after_its_wake_up_passes_it_on() -> None:
    verbs = FakeVerbs()
    queue = RdmaHostQueue(1, 1, verbs)
    first = await queue.submit(IoOpcode.FLUSH, 1)
    woken = asyncio.create_task(queue.submit(IoOpcode.FLUSH, 1))
    behind = asyncio.create_task(queue.submit(IoOpcode.FLUSH, 2))
    await asyncio.sleep(0)  # both tasks run up to their wait for a command id
    queue.received(cqe(first.cid))  # wakes the first waiter...
    woken.cancel()  # ...which gives up before it runs
    async with asyncio.timeout(5):  # without the wake-up passed on, it waits for ever
        cmd = await behind
    assert cmd.sqe[4] == 2 and len(verbs.sent) == 2
    assert woken.cancelled()


async def test_a_queue_that_ends_fails_its_commands_and_its_waiters() -> None:
    verbs = FakeVerbs()
    queue = RdmaHostQueue(2, 1, verbs)
    cmd = await queue.submit(IoOpcode.FLUSH, 1)
    waiter = asyncio.create_task(queue.submit(IoOpcode.FLUSH, 1))
    await asyncio.sleep(0)  # the task runs up to its wait for a command id
    queue.received(b"\0" * 20)
    with pytest.raises(NvmeConnectionError, match="20 bytes"):
        await queue.wait(cmd)
    with pytest.raises(NvmeConnectionError):
        await waiter
    queue.disconnected()
    await queue.wait_closed(timeout=1)
    assert queue.closed and verbs.disconnects == 1


# -- the host library over a loopback, against pynvmf's NVMe/RDMA target queue ------------


NQN = "nqn.2024-01.io.pynvmf.test:rdma-host"
BLOCK = 512


class LoopbackFabric:
    """Both adapters' interfaces joined in memory: a host queue's SENDs arrive in its
    target queue's receives, the target's RDMA READ and WRITE reach the host's regions by
    key, the target's SENDs are the host's receives. Each delivery is a later loop step."""

    def __init__(self, target: Target, port: Port) -> None:
        self.target = target
        self.port = port
        self.regions: dict[int, bytearray] = {}
        self.queues: list[tuple[RdmaHostQueue, RdmaConnection]] = []
        self.keys = 0x1000
        self.reads = 0
        self.writes = 0

    async def open_queue(
        self,
        address: str,
        port: int,
        qid: int,
        depth: int,
        *,
        cntlid: int = 0,
        max_transfer: int = 1 << 20,
        timeout: float = 10.0,
    ) -> RdmaHostQueue:
        # The CM's part: the target's decision on the request, as verbs.py takes it.
        request = cm.ConnectRequest.for_queue(qid, depth + 1, cntlid)
        controllers = {c for s in self.target.subsystems.values() for c in s.controllers}
        answer = cm.answer_connect(
            request.encode(), cm.QueueLimits(max_qid=8, io_queue_size=128), controllers
        )
        if isinstance(answer, cm.ConnectReject):
            read_connect_answer(False, answer.encode(), request, f"qid {qid}")
        else:
            read_connect_answer(True, answer[1].encode(), request, f"qid {qid}")
        loop = asyncio.get_running_loop()
        fabric = self

        class HostSide:
            def __init__(self) -> None:
                self.keys: dict[int, int] = {}

            def send(self, capsule: bytes) -> None:
                loop.call_soon(target_conn.received, 0, memoryview(capsule))

            def register(self, cid: int, length: int, data: memoryview | None) -> tuple[int, int]:
                fabric.keys += 1
                key = fabric.keys
                fabric.regions[key] = bytearray(data) if data is not None else bytearray(length)
                self.keys[cid] = key
                return BASE + (key << 24), key

            def registered_data(self, cid: int, length: int) -> bytes:
                return bytes(fabric.regions[self.keys[cid]][:length])

            def release(self, cid: int) -> None:
                fabric.regions.pop(self.keys.pop(cid))

            def disconnect(self) -> None:
                loop.call_soon(queue.disconnected)
                target_conn.disconnected()

        class TargetSide:
            def post_receive(self, slot: int) -> None:
                pass

            def read(self, tag: int, length: int, address: int, key: int) -> None:
                fabric.reads += 1
                start = address - BASE - (key << 24)
                data = fabric.regions[key][start : start + length]
                loop.call_soon(target_conn.read_done, tag, bytearray(data))

            def write(self, data: Buffer, address: int, key: int) -> None:
                fabric.writes += 1
                start = address - BASE - (key << 24)
                payload = bytes(data)
                fabric.regions[key][start : start + len(payload)] = payload

            def send(self, message: bytes, invalidate_key: int | None) -> None:
                loop.call_soon(queue.received, message)

            def disconnect(self) -> None:
                loop.call_soon(queue.disconnected)

        # Counted into the port's tally, as verbs.py's queues are (nvmf_get_stats).
        tally = self.target.rdma_counters.port(str(self.port))
        target_conn = RdmaConnection(TargetSide(), max_transfer=1 << 20, tally=tally)
        TargetQueue(self.target, self.port, target_conn, "127.0.0.1")
        queue = RdmaHostQueue(qid, depth, HostSide(), max_transfer=max_transfer)
        self.queues.append((queue, target_conn))
        return queue


def loopback_target(monkeypatch: pytest.MonkeyPatch) -> LoopbackFabric:
    """A target with a memory namespace on an rdma port at 127.0.0.1:4420, which the host
    library's rdma queues reach over the loopback (for the test's duration)."""
    device = MemoryDevice(BLOCK * 4096, BLOCK)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "memory:1"))
    port = Port("127.0.0.1", 4420, trtype="rdma")
    loopback = LoopbackFabric(Target([subsystem], [port]), port)
    # The controller opens its rdma queues through host_verbs.open_queue.
    monkeypatch.setattr(host_verbs_module, "open_queue", loopback.open_queue)
    return loopback


@pytest.fixture
def fabric(monkeypatch: pytest.MonkeyPatch) -> LoopbackFabric:
    return loopback_target(monkeypatch)


async def test_the_host_library_over_rdma_identifies_writes_and_reads_back(
    fabric: LoopbackFabric,
) -> None:
    ctrl = await host.connect(
        "127.0.0.1", 4420, NQN, trtype="rdma", queues=2, queue_depth=8, kato_ms=0
    )
    try:
        assert ctrl.info is not None and ctrl.info.ioccsz * 16 == 64 + 16384
        assert ctrl.io_inline_limit == 16384 and len(ctrl.io_queues) == 2
        ns = ctrl.namespaces[1]
        small = bytes(range(256)) * 16  # 4 KiB: in the capsule
        big = bytes(reversed(range(256))) * 256  # 64 KiB: keyed, the target RDMA READs it
        await ns.write(0, small)
        await ns.write(8, big)
        back = bytearray(len(small) + len(big))
        await ns.read(0, memoryview(back))  # keyed, the target RDMA WRITEs it
        assert bytes(back) == small + big
        assert fabric.writes >= 1 and fabric.reads >= 2  # the admin Connect's data too
        in_capsule = sum(q.conn.stats.in_capsule_bytes for q in ctrl.io_queues)
        assert in_capsule >= 4096
        assert ctrl.admin is not None and ctrl.admin.conn.stats.in_capsule_bytes == 0
    finally:
        await ctrl.close()
    assert all(q.closed for q, _ in fabric.queues)
    assert fabric.regions == {}


async def test_connect_refuses_what_rdma_does_not_carry() -> None:
    with pytest.raises(ValueError, match="trtype"):
        await host.connect("127.0.0.1", 4420, NQN, trtype="fc")
    with pytest.raises(ValueError, match="digests are TCP's"):
        await host.connect("127.0.0.1", 4420, NQN, trtype="rdma", header_digest=True)


# -- discovery over RDMA, and following what the log lists ---------------------------------


async def test_discovery_over_rdma_lists_trtype_rdma_and_its_entry_connects(
    fabric: LoopbackFabric,
) -> None:
    # The rdma port answers the discovery NQN itself (no TCP discovery port).
    listed = await host.discover("127.0.0.1", 4420, trtype="rdma")
    # Every entry, the current discovery subsystem's included, says TRTYPE rdma.
    assert {e.trtype for e in listed} == {L.TrType.RDMA}
    entries = [e for e in listed if e.subtype == L.SubType.NVME]
    assert [(e.subnqn, e.traddr, e.trsvcid) for e in entries] == [(NQN, "127.0.0.1", "4420")]
    assert host.entry_trtype(entries[0]) == "rdma"
    # The discovery controller's queue was an rdma queue, and it is closed.
    discovery_queue, _ = fabric.queues[0]
    assert discovery_queue.qid == 0 and discovery_queue.closed
    opened = len(fabric.queues)
    ctrl = await host.connect_entry(entries[0], queues=1, queue_depth=4, kato_ms=0)
    try:
        assert ctrl.trtype == "rdma" and ctrl.subnqn == NQN
        assert len(fabric.queues) == opened + 2  # its admin and I/O queues, over rdma
        await ctrl.namespaces[1].write(0, bytes(BLOCK))
    finally:
        await ctrl.close()


async def test_an_entry_of_a_transport_the_host_library_does_not_speak_is_refused() -> None:
    fc = L.DiscoveryLogEntry(trtype=L.TrType.FC, trsvcid="none", subnqn=NQN, traddr="x")
    with pytest.raises(ValueError, match="TRTYPE 2"):
        host.entry_trtype(fc)
    with pytest.raises(ValueError, match="TRTYPE 2"):
        await host.connect_entry(fc)
    tcp = L.DiscoveryLogEntry(trtype=L.TrType.TCP, trsvcid="4420", subnqn=NQN, traddr="x")
    assert host.entry_trtype(tcp) == "tcp"
    odd = L.DiscoveryLogEntry(trtype=L.TrType.RDMA, trsvcid="port", subnqn=NQN, traddr="x")
    with pytest.raises(ValueError, match="trsvcid"):
        await host.connect_entry(odd)


@pytest.mark.skipif(
    importlib.util.find_spec("pyverbs") is not None, reason="pyverbs is installed here"
)
async def test_rdma_without_pyverbs_says_what_is_missing_before_anything_is_sent() -> None:
    # This Python has no pyverbs: the real adapter's import fails, and the host library
    # names the package rather than a ModuleNotFoundError from inside the adapter.
    with pytest.raises(host.NvmeTransportUnavailableError, match="python3-pyverbs"):
        await host.connect("127.0.0.1", 4420, NQN, trtype="rdma", timeout=2)
    with pytest.raises(host.NvmeTransportUnavailableError, match="pyverbs"):
        await host.discover("127.0.0.1", 4420, trtype="rdma", timeout=2)


async def test_an_rdma_queue_is_never_deeper_than_128_entries(fabric: LoopbackFabric) -> None:
    # CAP.MQES allows 1024 entries; the RDMA CM would reject 129 (INVALID_HSQSIZE).
    ctrl = await host.connect("127.0.0.1", 4420, NQN, trtype="rdma", queue_depth=1000, kato_ms=0)
    try:
        assert ctrl.queue_depth == cm.IO_QUEUE_SIZE - 1
    finally:
        await ctrl.close()
