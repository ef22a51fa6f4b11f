"""The host library (pynvmf.host) against the in-process pynvmf target over real TCP."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from pynvmf.block.device import BlockDevice, BlockRangeError, Buffer, Capabilities
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import (
    Controller,
    NvmeConnectionError,
    NvmeConnectRejected,
    NvmeStatusError,
    NvmeTimeoutError,
    RemoteNamespace,
    connect,
    discover,
)
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.command import CSTS_SHST_COMPLETE, CSTS_SHST_MASK
from pynvmf.spec.opcodes import DISCOVERY_NQN, FeatureId, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.target import TransportConfig

NQN = "nqn.2024-01.org.pynvmf:host-library"
MiB = 1024 * 1024

StartTarget = Callable[..., Awaitable[tuple[Target, Port]]]


@pytest.fixture
async def start_target() -> AsyncIterator[StartTarget]:
    """start(subsystems, address=..., transport=...) -> (target, port); port 0 picks
    a free port. Every target is stopped after the test."""
    started: list[Target] = []

    async def start(
        subsystems: list[Subsystem],
        address: str = "127.0.0.1",
        transport: TransportConfig | None = None,
    ) -> tuple[Target, Port]:
        port = Port(address, 0, transport=transport or TransportConfig())
        target = Target(subsystems, [port])
        await target.start()
        started.append(target)
        return target, port

    yield start
    for target in started:
        await target.stop()


def memory_subsystem(
    nqn: str = NQN,
    *,
    size: int = 32 * MiB,
    block_size: int = 512,
    nsids: tuple[int, ...] = (1,),
    **kwargs: object,
) -> Subsystem:
    subsystem = Subsystem(nqn, **kwargs)  # type: ignore[arg-type]
    for nsid in nsids:
        device = MemoryDevice(size, block_size)
        subsystem.add_namespace(Namespace.create(nqn, nsid, device, f"memory:{nsid}"))
    return subsystem


def random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def commands_sent(ctrl: Controller) -> int:
    return sum(q.conn.stats.commands for q in ctrl.io_queues)


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until `predicate()` holds (for effects of another peer's
    event handling, which no future of ours signals)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)


# -- discovery ---------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
async def test_discover(start_target: StartTarget, address: str) -> None:
    _target, port = await start_target([memory_subsystem()], address)
    entries = await discover(address, port.port)
    by_nqn = {entry.subnqn: entry for entry in entries}
    assert set(by_nqn) == {NQN, DISCOVERY_NQN}
    entry = by_nqn[NQN]
    assert entry.subtype == L.SubType.NVME
    assert entry.trtype == L.TrType.TCP
    assert entry.adrfam == (L.AdrFam.IPV6 if ":" in address else L.AdrFam.IPV4)
    assert entry.traddr == address
    assert entry.trsvcid == str(port.port)
    assert by_nqn[DISCOVERY_NQN].subtype == L.SubType.CURRENT_DISCOVERY


async def test_discover_hides_subsystems_the_host_may_not_use(
    start_target: StartTarget,
) -> None:
    allowed = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
    private = memory_subsystem(NQN + "-private", allow_any_host=False, allowed_hosts={allowed})
    _target, port = await start_target([memory_subsystem(), private])
    other = await discover("127.0.0.1", port.port)
    assert {e.subnqn for e in other} == {NQN, DISCOVERY_NQN}
    mine = await discover("127.0.0.1", port.port, hostnqn=allowed)
    assert {e.subnqn for e in mine} == {NQN, NQN + "-private", DISCOVERY_NQN}


async def test_discover_many_entries_reads_past_one_page(start_target: StartTarget) -> None:
    # 40 records make a 41 KiB log page: header first, then the whole page.
    subsystems = [memory_subsystem(f"{NQN}-{i}", size=MiB) for i in range(40)]
    _target, port = await start_target(subsystems)
    entries = await discover("127.0.0.1", port.port)
    assert len(entries) == 41
    assert {e.subnqn for e in entries} == {s.nqn for s in subsystems} | {DISCOVERY_NQN}


# -- connect, identify, admin -------------------------------------------------------------


async def test_connect_identify_and_admin_commands(start_target: StartTarget) -> None:
    target, port = await start_target([memory_subsystem(nsids=(1, 2))])
    async with await connect("127.0.0.1", port.port, NQN, queues=2, queue_depth=32) as ctrl:
        assert len(ctrl.io_queues) == 2
        assert [q.qid for q in ctrl.io_queues] == [1, 2]
        info = await ctrl.identify_controller()
        assert info.subnqn == NQN
        assert info.cntlid == ctrl.cntlid
        assert info.cntrltype == I.CtrlType.IO
        assert ctrl.vs >> 16 >= 1
        # The target's controller has the admin queue and both I/O queues bound.
        (target_ctrl,) = target.subsystems[NQN].controllers.values()
        assert sorted(target_ctrl.queues) == [0, 1, 2]
        assert target_ctrl.kato_ms == 5000

        assert await ctrl.active_namespaces() == [1, 2]
        assert sorted(ctrl.namespaces) == [1, 2]
        ident = await ctrl.identify_namespace(2)
        assert ident.nsze == 32 * MiB // 512
        ns = ctrl.namespace(2)
        assert isinstance(ns, RemoteNamespace)
        assert isinstance(ns, BlockDevice)
        assert ns.capabilities == Capabilities(
            block_size=512,
            num_blocks=32 * MiB // 512,
            volatile_write_cache=True,
            write_zeroes=True,
            deallocate=True,
            deallocated_reads_zero=True,
        )
        with pytest.raises(KeyError):
            ctrl.namespace(3)

        queues = await ctrl.get_features(FeatureId.NUM_QUEUES)
        assert (queues & 0xFFFF) + 1 == 2
        await ctrl.set_features(FeatureId.VOLATILE_WC, 0)
        assert await ctrl.get_features(FeatureId.VOLATILE_WC) == 0
        assert ctrl.namespace(1).capabilities.volatile_write_cache  # Identify, not feature

        smart = L.SmartLog.unpack(await ctrl.get_log_page(L.LogPageId.SMART, 512))
        assert smart.avail_spare == 100
        # A window of the page at an offset matches the same bytes of the whole page.
        whole = await ctrl.get_log_page(L.LogPageId.CMD_EFFECTS, 4096)
        window = await ctrl.get_log_page(L.LogPageId.CMD_EFFECTS, 64, offset=1024)
        assert window == whole[1024:1088]
        with pytest.raises(NvmeStatusError) as info_err:
            await ctrl.get_log_page(0x7E, 512)
        assert info_err.value.status == Status.INVALID_FIELD
        assert info_err.value.admin


async def test_host_identity_defaults(start_target: StartTarget) -> None:
    target, port = await start_target([memory_subsystem()])
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        (target_ctrl,) = target.subsystems[NQN].controllers.values()
        prefix = "nqn.2014-08.org.nvmexpress:uuid:"
        assert target_ctrl.hostnqn.startswith(prefix)
        assert target_ctrl.hostnqn == ctrl.identity.hostnqn
        # The Host ID is the same UUID as the NQN's, in bytes.
        assert target_ctrl.hostid == uuid.UUID(target_ctrl.hostnqn[len(prefix) :]).bytes
    # A second controller of this process presents the same host.
    async with await connect("127.0.0.1", port.port, NQN) as again:
        assert again.identity == ctrl.identity


async def test_host_not_allowed_gets_connect_invalid_host(start_target: StartTarget) -> None:
    allowed = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    subsystem = memory_subsystem(allow_any_host=False, allowed_hosts={allowed})
    _target, port = await start_target([subsystem])
    with pytest.raises(NvmeStatusError) as err:
        await connect("127.0.0.1", port.port, NQN)
    assert err.value.status == Status.CONNECT_INVALID_HOST
    assert err.value.name == "CONNECT_INVALID_HOST"
    assert err.value.dnr
    assert "Fabrics CONNECT" in str(err.value)
    async with await connect("127.0.0.1", port.port, NQN, hostnqn=allowed) as ctrl:
        assert ctrl.namespaces


async def test_unknown_subsystem_is_refused(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem()])
    with pytest.raises(NvmeStatusError) as err:
        await connect("127.0.0.1", port.port, NQN + "-nope")
    assert err.value.status == Status.CONNECT_INVALID_PARAM
    # The completion's IATTR/IPO point at the subsystem NQN in the Connect data.
    assert isinstance(err.value, NvmeConnectRejected) and err.value.parameter == "subnqn"
    assert f"subsystem '{NQN}-nope' is not served on this port" in str(err.value)


async def test_a_port_of_another_protocol_fails_at_once() -> None:
    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")  # speaks first and waits, as sshd does
        await reader.read()
        writer.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # A minute to wait: only the banner can end it in time.
        with pytest.raises(NvmeConnectionError, match="not an NVMe/TCP port: it answered"):
            await asyncio.wait_for(connect("127.0.0.1", port, NQN, timeout=60), 30)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_port_that_never_answers_says_so() -> None:
    held: list[asyncio.StreamWriter] = []  # open and silent, as an HTTP server waiting

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(NvmeTimeoutError, match="no answer to the ICReq"):
            await connect("127.0.0.1", port, NQN, timeout=0.5)
    finally:
        server.close()
        await server.wait_closed()


async def test_connect_refused_is_a_connection_error() -> None:
    # Bind and close a socket to get a port nothing listens on.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    free_port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(NvmeConnectionError):
        await connect("127.0.0.1", free_port, NQN)


# -- I/O ----------------------------------------------------------------------------------


async def test_random_io_many_in_flight_reads_back_identical(start_target: StartTarget) -> None:
    size = 32 * MiB
    _target, port = await start_target([memory_subsystem(size=size)])
    rng = random.Random(1234)
    async with await connect("127.0.0.1", port.port, NQN, queues=2, queue_depth=32) as ctrl:
        ns = ctrl.namespace(1)
        # One extent at a random place in each 512 KiB slot: random offsets and
        # lengths (some in-capsule, most through R2T), never overlapping.
        slot = 512 * 1024
        extents = []
        for base in range(0, size, slot):
            length = rng.randrange(1, slot // 512 // 2 + 1) * 512
            offset = base + rng.randrange(0, (slot - length) // 512 + 1) * 512
            extents.append((offset // 512, random_bytes(rng, length)))
        rng.shuffle(extents)
        total = sum(len(data) for _lba, data in extents)
        assert total > 4 * MiB

        await asyncio.gather(*(ns.write(lba, data) for lba, data in extents))
        assert all(q.conn.stats.max_inflight >= 16 for q in ctrl.io_queues)

        buffers = [bytearray(len(data)) for _lba, data in extents]
        pairs = zip(extents, buffers, strict=True)
        await asyncio.gather(*(ns.read(lba, memoryview(buf)) for (lba, _d), buf in pairs))
        for (_lba, data), buf in zip(extents, buffers, strict=True):
            assert buf == data

        # And the whole device, in one call split by MDTS, matches a local model.
        model = bytearray(size)
        for lba, data in extents:
            model[lba * 512 : lba * 512 + len(data)] = data
        whole = bytearray(size)
        await ns.read(0, memoryview(whole))
        assert whole == model


async def test_write_larger_than_in_capsule_size_uses_r2t_and_h2c_pdus(
    start_target: StartTarget,
) -> None:
    transport = TransportConfig(inline_data_size=4096, max_h2c_data=8192)
    _target, port = await start_target([memory_subsystem()], transport=transport)
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        assert ctrl.io_inline_limit == 4096
        (queue,) = ctrl.io_queues
        stats = queue.conn.stats
        assert queue.conn.maxh2cdata == 8192
        ns = ctrl.namespace(1)
        connect_data = stats.in_capsule_bytes
        assert connect_data == 1024  # Connect data always travels in the capsule
        small = bytes(range(256)) * 16  # exactly the in-capsule size
        await ns.write(8, small)
        assert stats.in_capsule_bytes == connect_data + 4096
        assert stats.r2t_received == 0

        big = random_bytes(random.Random(7), 64 * 1024 + 512)
        await ns.write(100, big)
        assert stats.r2t_received == 1
        assert stats.h2c_data_pdus == 9  # 8 full PDUs of 8 KiB and one of 512 bytes
        assert stats.in_capsule_bytes == connect_data + 4096

        back = bytearray(len(big))
        await ns.read(100, memoryview(back))
        assert back == big
        back = bytearray(4096)
        await ns.read(8, memoryview(back))
        assert back == small


async def test_reads_and_writes_larger_than_mdts_are_split(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem(size=16 * MiB)])
    async with await connect(
        "127.0.0.1", port.port, NQN, queues=2, max_transfer=128 * 1024
    ) as ctrl:
        assert ctrl.max_transfer == 128 * 1024
        ns = ctrl.namespace(1)
        data = random_bytes(random.Random(3), 3 * MiB + 4096)
        before = commands_sent(ctrl)
        await ns.write(2048, data)
        pieces = -(-len(data) // (128 * 1024))
        assert commands_sent(ctrl) - before == pieces
        # Both queues carried pieces, concurrently.
        assert all(q.conn.stats.max_inflight > 1 for q in ctrl.io_queues)

        back = bytearray(len(data))
        before = commands_sent(ctrl)
        await ns.read(2048, memoryview(back))
        assert commands_sent(ctrl) - before == pieces
        assert back == data

    # Without a host limit, the controller's MDTS (1 MiB) splits a 3 MiB read.
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        assert ctrl.max_transfer == 1 * MiB
        ns = ctrl.namespace(1)
        back = bytearray(3 * MiB)
        before = commands_sent(ctrl)
        await ns.read(2048, memoryview(back))
        assert commands_sent(ctrl) - before == 3
        assert back == data[: 3 * MiB]


async def test_read_lands_in_the_callers_buffer_slices(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem()])
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        await ns.write(0, b"\xab" * 4096)
        buf = bytearray(b"\x00" * 1024 + b"\x11" * 8192)
        await ns.read(0, memoryview(buf)[1024 : 1024 + 4096])
        assert buf[:1024] == b"\x00" * 1024
        assert buf[1024:5120] == b"\xab" * 4096
        assert buf[5120:] == b"\x11" * 4096
        # A non-byte view is read as bytes.
        words = memoryview(bytearray(4096)).cast("I")
        await ns.read(0, words)
        assert words.tobytes() == b"\xab" * 4096


async def test_4096_byte_block_namespace(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem(size=16 * MiB, block_size=4096)])
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        caps = ns.capabilities
        assert caps.block_size == 4096
        assert caps.num_blocks == 16 * MiB // 4096
        data = random_bytes(random.Random(5), 3 * 4096)
        await ns.write(caps.num_blocks - 3, data, fua=True)
        back = bytearray(len(data))
        await ns.read(caps.num_blocks - 3, memoryview(back))
        assert back == data
        with pytest.raises(ValueError, match="whole number of blocks"):
            await ns.write(0, bytes(512))
        with pytest.raises(BlockRangeError):
            await ns.read(caps.num_blocks - 2, memoryview(bytearray(3 * 4096)))
        await ns.write_zeroes(caps.num_blocks - 2, 1)
        await ns.read(caps.num_blocks - 3, memoryview(back))
        assert back == data[:4096] + bytes(4096) + data[8192:]


async def test_out_of_range_is_caught_locally_and_remotely(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem(size=MiB)])
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        last = ns.capabilities.num_blocks - 1
        before = commands_sent(ctrl)
        with pytest.raises(BlockRangeError):
            await ns.read(last, memoryview(bytearray(1024)))
        with pytest.raises(BlockRangeError):
            await ns.write(-1, bytes(512))
        with pytest.raises(BlockRangeError):
            await ns.write_zeroes(last, 2)
        with pytest.raises(BlockRangeError):
            await ns.deallocate(last + 1, 1)
        assert commands_sent(ctrl) == before  # nothing reached the wire

        # The same read as a raw command: the controller refuses it.
        with pytest.raises(NvmeStatusError) as err:
            await ctrl.io_command(IoOpcode.READ, 1, last, 0, 1, into=memoryview(bytearray(1024)))
        exc = err.value
        assert exc.status == Status.LBA_OUT_OF_RANGE
        assert exc.name == "LBA_OUT_OF_RANGE"
        assert (exc.sct, exc.sc) == (0, 0x80)
        assert exc.opcode == IoOpcode.READ
        assert exc.command.cdw10 == last
        assert exc.dnr
        assert "READ failed: LBA_OUT_OF_RANGE" in str(exc)
        with pytest.raises(NvmeStatusError) as err:
            await ctrl.io_command(IoOpcode.READ, 7, 0, 0, 0, into=memoryview(bytearray(512)))
        assert err.value.status == Status.INVALID_NS
        # The queue is still fine afterwards.
        await ns.write(last, bytes(512))


async def test_header_and_data_digests(start_target: StartTarget) -> None:
    transport = TransportConfig(inline_data_size=8192, max_h2c_data=16384)
    _target, port = await start_target([memory_subsystem()], transport=transport)
    async with await connect(
        "127.0.0.1", port.port, NQN, queues=2, header_digest=True, data_digest=True
    ) as ctrl:
        for queue in [ctrl.admin, *ctrl.io_queues]:
            assert queue is not None
            assert queue.conn.hdgst and queue.conn.ddgst
        ns = ctrl.namespace(1)
        rng = random.Random(11)
        blobs = [
            (i * 1024, random_bytes(rng, rng.choice((512, 8192, 100 * 1024)))) for i in range(24)
        ]
        await asyncio.gather(*(ns.write(lba, data) for lba, data in blobs))
        stats = [q.conn.stats for q in ctrl.io_queues]
        assert sum(s.in_capsule_bytes for s in stats) > 0
        assert sum(s.h2c_data_pdus for s in stats) > sum(s.r2t_received for s in stats) > 0
        for lba, data in blobs:
            back = bytearray(len(data))
            await ns.read(lba, memoryview(back))
            assert back == data
        assert sum(s.data_digest_errors for s in stats) == 0


async def test_digest_refused_by_the_target_fails_connect(start_target: StartTarget) -> None:
    transport = TransportConfig(allow_data_digest=False)
    _target, port = await start_target([memory_subsystem()], transport=transport)
    with pytest.raises(NvmeConnectionError, match="H2CTermReq"):
        await connect("127.0.0.1", port.port, NQN, data_digest=True)


async def test_sq_flow_control_disabled_reads_complete_on_c2h_success(
    start_target: StartTarget,
) -> None:
    _target, port = await start_target([memory_subsystem()])
    async with await connect("127.0.0.1", port.port, NQN, disable_sqflow=True) as ctrl:
        ns = ctrl.namespace(1)
        data = random_bytes(random.Random(2), 64 * 1024)
        await ns.write(0, data)
        back = bytearray(len(data))
        await asyncio.gather(
            *(ns.read(i * 16, memoryview(back)[i * 8192 : (i + 1) * 8192]) for i in range(8))
        )
        assert back == data
        assert ctrl.io_queues[0].conn.stats.c2h_success_completions == 8
        # Admin reads (Identify) complete the same way.
        assert (await ctrl.identify_controller()).subnqn == NQN


async def test_flush_write_zeroes_deallocate(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem(size=4 * MiB)])
    async with await connect("127.0.0.1", port.port, NQN) as ctrl:
        ns = ctrl.namespace(1)
        data = b"\x5a" * (256 * 1024)
        await ns.write(0, data)
        await ns.flush()
        await ns.write_zeroes(8, 16, fua=True)
        await ns.deallocate(100, 50)
        back = bytearray(len(data))
        await ns.read(0, memoryview(back))
        expected = bytearray(data)
        expected[8 * 512 : 24 * 512] = bytes(16 * 512)
        expected[100 * 512 : 150 * 512] = bytes(50 * 512)
        assert back == expected
        # Ranges beyond one command's 64 Ki blocks are split.
        await ns.write_zeroes(0, ns.capabilities.num_blocks)
        await ns.read(0, memoryview(back))
        assert back == bytes(len(back))


async def test_queue_depth_bounds_commands_in_flight(start_target: StartTarget) -> None:
    _target, port = await start_target([memory_subsystem()])
    async with await connect("127.0.0.1", port.port, NQN, queue_depth=4) as ctrl:
        (queue,) = ctrl.io_queues
        assert queue.conn.depth == 4
        ns = ctrl.namespace(1)
        await ns.write(0, bytes(range(256)) * 2 * 64)
        buffers = [bytearray(512) for _ in range(64)]
        await asyncio.gather(*(ns.read(i, memoryview(b)) for i, b in enumerate(buffers)))
        assert queue.conn.stats.max_inflight == 4
        assert all(b == bytes(range(256)) * 2 for b in buffers)


async def test_keep_alive_keeps_an_idle_controller(start_target: StartTarget) -> None:
    target, port = await start_target([memory_subsystem()])
    async with await connect("127.0.0.1", port.port, NQN, kato_ms=200) as ctrl:
        (target_ctrl,) = target.subsystems[NQN].controllers.values()
        # Idle for several KATO periods: only keep-alives keep the controller.
        await eventually(lambda: ctrl.keep_alives >= 4)
        assert not target_ctrl.destroyed
        assert (await ctrl.identify_controller()).cntlid == ctrl.cntlid


async def test_clean_disconnect(start_target: StartTarget) -> None:
    target, port = await start_target([memory_subsystem()])
    ctrl = await connect("127.0.0.1", port.port, NQN, queues=2)
    (target_ctrl,) = target.subsystems[NQN].controllers.values()
    ns = ctrl.namespace(1)
    await ns.write(0, bytes(4096))
    await ctrl.close()
    # Normal shutdown completed before the queues went away.
    assert target_ctrl.csts & CSTS_SHST_MASK == CSTS_SHST_COMPLETE
    assert all(q.closed and q.transport is None for q in [ctrl.admin, *ctrl.io_queues] if q)
    await eventually(lambda: target_ctrl.destroyed)
    assert not target.subsystems[NQN].controllers
    with pytest.raises(NvmeConnectionError):
        await ns.read(0, memoryview(bytearray(512)))
    with pytest.raises(NvmeConnectionError):
        await ctrl.identify_controller()
    await ctrl.close()  # idempotent


class GatedDevice:
    """A MemoryDevice whose reads wait for `gate`: commands stay in flight on demand."""

    def __init__(self, size: int, expected_waiting: int) -> None:
        self._inner = MemoryDevice(size)
        self.gate = asyncio.Event()
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self._expected = expected_waiting

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    async def read(self, lba: int, buf: memoryview) -> None:
        self.waiting += 1
        if self.waiting >= self._expected:
            self.all_waiting.set()
        await self.gate.wait()
        await self._inner.read(lba, buf)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self._inner.write(lba, data, fua=fua)

    async def flush(self) -> None:
        await self._inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._inner.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._inner.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self._inner.close()


async def test_connection_loss_fails_outstanding_commands() -> None:
    device = GatedDevice(4 * MiB, expected_waiting=16)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "gated"))
    port = Port("127.0.0.1", 0)
    target = Target([subsystem], [port])
    await target.start()
    ctrl = await connect("127.0.0.1", port.port, NQN, queues=2)
    try:
        ns = ctrl.namespace(1)
        reads = [
            asyncio.create_task(ns.read(i * 8, memoryview(bytearray(4096)))) for i in range(16)
        ]
        await device.all_waiting.wait()  # all 16 reads are now inside the target
        assert all(not t.done() for t in reads)
        await target.stop()  # the server goes away mid-I/O
        async with asyncio.timeout(5):
            results = await asyncio.gather(*reads, return_exceptions=True)
        assert all(isinstance(r, NvmeConnectionError) for r in results), results
        assert all(isinstance(r, ConnectionError) for r in results)
        # New commands fail at once, they do not wait.
        with pytest.raises(NvmeConnectionError):
            await ns.write(0, bytes(512))
        with pytest.raises(NvmeConnectionError):
            await ctrl.identify_controller()
        async with asyncio.timeout(5):
            await ctrl.close()
    finally:
        device.gate.set()  # let the target's stranded handlers finish
        await asyncio.sleep(0)


async def test_connection_loss_fails_waiters_for_a_free_command_id() -> None:
    device = GatedDevice(MiB, expected_waiting=2)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "gated"))
    port = Port("127.0.0.1", 0)
    target = Target([subsystem], [port])
    await target.start()
    ctrl = await connect("127.0.0.1", port.port, NQN, queue_depth=2)
    try:
        ns = ctrl.namespace(1)
        # Two reads fill the queue; six more wait for a command id.
        reads = [asyncio.create_task(ns.read(i, memoryview(bytearray(512)))) for i in range(8)]
        await device.all_waiting.wait()
        await target.stop()
        async with asyncio.timeout(5):
            results = await asyncio.gather(*reads, return_exceptions=True)
        assert all(isinstance(r, NvmeConnectionError) for r in results), results
        await ctrl.close()
    finally:
        device.gate.set()
        await asyncio.sleep(0)


async def test_cancelled_read_leaves_the_buffer_and_the_queue_alone() -> None:
    device = GatedDevice(MiB, expected_waiting=1)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "gated"))
    port = Port("127.0.0.1", 0)
    target = Target([subsystem], [port])
    await target.start()
    try:
        async with await connect("127.0.0.1", port.port, NQN) as ctrl:
            ns = ctrl.namespace(1)
            await ns.write(0, b"\x42" * 512)
            buf = bytearray(512)
            task = asyncio.create_task(ns.read(0, memoryview(buf)))
            await device.all_waiting.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (queue,) = ctrl.io_queues
            assert queue.conn.inflight == 1  # NVMe/TCP cannot take a command back
            device.gate.set()
            # The late completion arrives, frees the command id, and drops the data.
            await eventually(lambda: queue.conn.inflight == 0)
            assert buf == bytes(512)
            other = bytearray(512)
            await ns.read(0, memoryview(other))
            assert other == b"\x42" * 512
    finally:
        device.gate.set()
        await target.stop()
