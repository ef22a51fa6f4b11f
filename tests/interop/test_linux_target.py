"""The acceptance test of the host library: pynvmf.host against the Linux kernel's NVMe/TCP
target (nvmet-tcp, configured through configfs in a QEMU guest), and the same assertions
against pynvmf's own target started in-process.

The kernel target runs on the oldest and the newest kernel peer (tests/support/guest.py):
Linux 6.1 and 7, one guest boot each; ``target_kind`` (module-scoped, so pytest runs each
kind's tests together) is ``linux-6.1``, ``linux-7`` or ``pynvmf``. The kernel exports
three null_blk namespaces through two ports forwarded from the machine's 127.0.0.1:

- ``512``: 512-byte blocks, on port A, which keeps the kernel's default in-capsule size;
- ``4k``: 4096-byte blocks, on port A too (discovery there lists both subsystems);
- ``inline4k``: 512-byte blocks, on port B, whose in-capsule size is cut to 4 KiB.

The pynvmf target mirrors that layout (two ports on 127.0.0.1, memory namespaces), so every
test parametrized over ``target`` runs the exact same assertions against both. Where the two
targets legitimately differ (the address a discovery entry names, the status of a read past
the end) the difference is a documented field of the target under test. The Linux target's
tests also read the guest's kernel log, which must show no nvmet trouble.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import re
import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import pytest

from pynvmf.block.device import BlockRangeError
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeStatusError, RemoteNamespace, connect, discover
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.target import TransportConfig
from tests.support.guest import (
    OLDEST_AND_NEWEST,
    PEERS,
    Guest,
    KernelTarget,
    require_guest_prerequisites,
    setup_kernel_target,
)
from tests.support.ports import free_tcp_port

KIB = 1024
MIB = 1024 * KIB

NQN_PREFIX = "nqn.2014-08.org.pynvmf:host-acceptance"
SIZE = 64 * MIB  # of every namespace
# The kernel's default in-capsule data size (NVMET_TCP_DEF_INLINE_DATA_SIZE, 4 pages).
KERNEL_DEFAULT_INLINE = 16 * KIB
SMALL_INLINE = 4 * KIB

QUEUES = 2
DEPTH = 16
CONNECT_TIMEOUT = 30.0  # a TCG guest is slow to answer

# The round trip: this much data, in writes of one block up to MAX_WRITE, grouped into
# back-to-back runs of GROUP_MIN..GROUP_MAX bytes that are read back in one command each.
ROUND_TRIP_BYTES = 8 * MIB
MAX_WRITE = 256 * KIB
GROUP_MIN = 256 * KIB
GROUP_MAX = 1 * MIB

# Copy (NVMe 2.0, opcode 19h) Source Range Entry, descriptor format 0: 8 reserved bytes,
# SLBA, NLB (0's based), then reserved and end-to-end protection fields.
COPY_RANGE_FORMAT0 = struct.Struct("<8xQH14x")

# /proc/net/tcp states of a socket its owner has not released yet.
TCP_ESTABLISHED = "01"
TCP_CLOSE_WAIT = "08"
# nvmet-tcp (or the TCP stack under it) complaining; lines about creating controllers,
# enabling ports and adding namespaces are expected and do not match.
KERNEL_TROUBLE = re.compile(
    r"nvme.*(error|fail|expired|unexpected|invalid|fatal|timeout|unhandled|warn)"
    r"|BUG|WARNING|Call Trace",
    re.IGNORECASE,
)
STATS_COUNTED = (
    "commands",
    "in_capsule_bytes",
    "r2t_received",
    "h2c_data_pdus",
    "c2h_data_pdus",
    "data_digest_errors",
    "term_reqs_sent",
)
DMESG_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s?")


# --------------------------------------------------------------------------------------------
# The targets under test


@dataclass(frozen=True)
class Export:
    """One subsystem with namespace 1, as the test configured it."""

    name: str
    nqn: str
    port: int
    block_size: int
    num_blocks: int
    inline_data_size: int
    # What a read of deallocated blocks returns on this backend: zeroes, or the old data.
    deallocated_reads_zero: bool


class TargetUnderTest:
    """What a test needs from a target besides the NVMe/TCP port: its configuration, its
    view of the backing store and of the queues it holds."""

    kind: str
    exports: dict[str, Export]
    # The address discovery log entries name (the target's own view of itself).
    discovery_traddr: str
    # The status of a Read past the end of the namespace.
    out_of_range_status: int

    async def digests(self, export: Export, spans: Sequence[tuple[int, int]]) -> list[str]:
        """SHA-256 of the backing store's bytes at each (lba, nbytes), read behind the
        NVMe/TCP target's back."""
        raise NotImplementedError

    async def held_queues(self, export: Export) -> int:
        """How many queues (TCP connections) the target still holds for `export`."""
        raise NotImplementedError


class LinuxTarget(TargetUnderTest):
    kind = "linux"

    def __init__(
        self, guest: Guest, kernel: dict[str, KernelTarget], exports: dict[str, Export]
    ) -> None:
        self.guest = guest
        self.kind = guest.peer.name
        self.kernel = kernel
        self.exports = exports
        self.out_of_range_status = OUT_OF_RANGE_STATUS[guest.peer.name]
        # Every kernel log line read so far (each read clears the guest's ring buffer).
        self.kernel_log: list[str] = []
        # nvmet replaces the wildcard address it listens on with the connection's local
        # address, which is the guest's own, not the 127.0.0.1 the host connected to.
        self.discovery_traddr = guest.guest_address

    async def run(self, cmd: str) -> str:
        """A guest command, off the event loop (keep-alives keep flowing meanwhile)."""
        result = await asyncio.to_thread(self.guest.run, cmd)
        return result.output

    async def digests(self, export: Export, spans: Sequence[tuple[int, int]]) -> list[str]:
        dev = self.kernel[export.name].device
        bs = export.block_size
        # O_DIRECT: nvmet writes bios straight to the device, bypassing its page cache.
        script = "\n".join(
            f"dd if={dev} bs=64k iflag=direct,skip_bytes,count_bytes skip={lba * bs}"
            f" count={nbytes} status=none | sha256sum"
            for lba, nbytes in spans
        )
        return [line.split()[0] for line in (await self.run(script)).splitlines()]

    async def held_queues(self, export: Export) -> int:
        # 6.1 lists no controllers in configfs. nvmet-tcp releases a queue's socket only
        # after destroying its submission queue (dropping its controller reference), so a
        # socket still established or in CLOSE_WAIT on the port is a queue still held.
        out = await self.run("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        held = 0
        for line in out.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or ":" not in fields[1]:
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port == export.port and fields[3] in (TCP_ESTABLISHED, TCP_CLOSE_WAIT):
                held += 1
        return held

    async def read_kernel_log(self) -> list[str]:
        """The kernel log lines logged since the previous call, also kept in kernel_log.
        Clearing the ring buffer keeps what crosses the guest's command channel small."""
        out = await self.run("dmesg -c")
        lines = [DMESG_PREFIX.sub("", line) for line in out.splitlines() if line.strip()]
        self.kernel_log.extend(lines)
        return lines


class PynvmfTarget(TargetUnderTest):
    kind = "pynvmf"
    discovery_traddr = "127.0.0.1"
    out_of_range_status = Status.LBA_OUT_OF_RANGE

    def __init__(
        self, target: Target, devices: dict[str, MemoryDevice], exports: dict[str, Export]
    ) -> None:
        self.target = target
        self.devices = devices
        self.exports = exports

    async def digests(self, export: Export, spans: Sequence[tuple[int, int]]) -> list[str]:
        device = self.devices[export.name]
        result = []
        for lba, nbytes in spans:
            buf = bytearray(nbytes)
            await device.read(lba, memoryview(buf))
            result.append(hashlib.sha256(buf).hexdigest())
        return result

    async def held_queues(self, export: Export) -> int:
        subsystem = self.target.subsystems[export.nqn]
        return sum(len(ctrl.queues) for ctrl in subsystem.controllers.values())


def _nqn(name: str) -> str:
    return f"{NQN_PREFIX}-{name}"


# The status of a Read past the end of a null_blk namespace, by kernel (see test_out_of_range).
OUT_OF_RANGE_STATUS = {
    "linux-6.1": Status.INTERNAL_ERROR,
    "linux-6.12": Status.INTERNAL_ERROR,
    "linux-7": Status.INTERNAL_ERROR,
}
# 6.12's nvmet answers this module as 7's does (tests/support/guest.py: which peers run what).
TARGET_KINDS = [p.name for p in OLDEST_AND_NEWEST.peers()] + ["pynvmf"]


@pytest.fixture(scope="module", params=TARGET_KINDS)
def target_kind(request: pytest.FixtureRequest) -> str:
    """Which target the module's tests run against; module-scoped so that pytest runs each
    kind's tests together and boots each kernel peer once."""
    kind: str = request.param
    return kind


@pytest.fixture(scope="module")
def kernel_target(target_kind: str) -> Iterator[LinuxTarget]:
    """The guest of this kind, booted once, with the three exports set up through configfs."""
    peer = PEERS[target_kind]
    require_guest_prerequisites(peer)
    port_a = free_tcp_port()
    port_b = free_tcp_port()
    while port_b == port_a:
        port_b = free_tcp_port()
    guest = Guest(hostfwd=[port_a, port_b], peer=peer)
    guest.start()
    try:
        layout = {
            "512": (port_a, 512, None),
            "4k": (port_a, 4096, None),
            "inline4k": (port_b, 512, SMALL_INLINE),
        }
        kernel: dict[str, KernelTarget] = {}
        exports: dict[str, Export] = {}
        for name, (port, block_size, inline) in layout.items():
            kt = setup_kernel_target(
                guest,
                port=port,
                nqn=_nqn(name),
                size_mb=SIZE // MIB,
                block_size=block_size,
                inline_data_size=inline,
            )
            cfg = f"/sys/kernel/config/nvmet/ports/{kt.port_id}/param_inline_data_size"
            dev = kt.device.rsplit("/", 1)[1]
            discard = f"/sys/block/{dev}/queue/discard_max_bytes"
            values = guest.run(f"cat {cfg} {discard}").output.split()
            kernel[name] = kt
            exports[name] = Export(
                name=name,
                nqn=kt.nqn,
                port=port,
                block_size=block_size,
                num_blocks=SIZE // block_size,
                inline_data_size=int(values[0]),
                # A memory-backed null_blk frees discarded sectors; freed sectors read as
                # zeroes. Without discard support nvmet completes Deallocate successfully
                # without doing anything (it ignores EOPNOTSUPP).
                deallocated_reads_zero=int(values[1]) > 0,
            )
        # What the in-capsule tests below rely on.
        assert exports["512"].inline_data_size == KERNEL_DEFAULT_INLINE
        assert exports["inline4k"].inline_data_size == SMALL_INLINE
        yield LinuxTarget(guest, kernel, exports)
    finally:
        guest.stop()


@pytest.fixture
async def linux(kernel_target: LinuxTarget) -> AsyncIterator[LinuxTarget]:
    """The kernel target, checked afterwards for complaints in the kernel log."""
    await kernel_target.read_kernel_log()
    start = len(kernel_target.kernel_log)
    yield kernel_target
    await kernel_target.read_kernel_log()
    trouble = [line for line in kernel_target.kernel_log[start:] if KERNEL_TROUBLE.search(line)]
    assert not trouble, "the kernel logged trouble:\n" + "\n".join(trouble)


@pytest.fixture
async def pynvmf_target() -> AsyncIterator[PynvmfTarget]:
    """pynvmf's target, in this test's event loop, laid out like the kernel target."""
    layout = {"512": (0, 512), "4k": (0, 4096), "inline4k": (1, 512)}
    ports = [
        Port("127.0.0.1", 0, subsystems=[_nqn("512"), _nqn("4k")]),
        Port(
            "127.0.0.1",
            0,
            subsystems=[_nqn("inline4k")],
            transport=TransportConfig(inline_data_size=SMALL_INLINE),
        ),
    ]
    subsystems = []
    devices: dict[str, MemoryDevice] = {}
    for name, (_port, block_size) in layout.items():
        subsystem = Subsystem(_nqn(name))
        devices[name] = MemoryDevice(SIZE, block_size)
        subsystem.add_namespace(Namespace.create(_nqn(name), 1, devices[name], f"memory:{name}"))
        subsystems.append(subsystem)
    target = Target(subsystems, ports)
    await target.start()
    try:
        exports = {
            name: Export(
                name=name,
                nqn=_nqn(name),
                port=ports[port].port,
                block_size=block_size,
                num_blocks=SIZE // block_size,
                inline_data_size=ports[port].transport.inline_data_size,
                deallocated_reads_zero=devices[name].capabilities.deallocated_reads_zero,
            )
            for name, (port, block_size) in layout.items()
        }
        assert exports["512"].inline_data_size == KERNEL_DEFAULT_INLINE
        yield PynvmfTarget(target, devices, exports)
    finally:
        await target.stop()


@pytest.fixture
def target(request: pytest.FixtureRequest, target_kind: str) -> TargetUnderTest:
    """The target of this kind (a kernel peer's guest boots on first use). Not a coroutine:
    the async fixture it picks must be set up outside the running event loop."""
    fixture = "pynvmf_target" if target_kind == "pynvmf" else "linux"
    under_test: TargetUnderTest = request.getfixturevalue(fixture)
    return under_test


# --------------------------------------------------------------------------------------------
# Helpers


async def open_controller(export: Export, *, digests: bool = False) -> Controller:
    return await connect(
        "127.0.0.1",
        export.port,
        export.nqn,
        queues=QUEUES,
        queue_depth=DEPTH,
        header_digest=digests,
        data_digest=digests,
        timeout=CONNECT_TIMEOUT,
    )


def sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_same(actual: bytes | bytearray, expected: bytes, what: str) -> None:
    """Byte-for-byte equality, reporting where the first difference is."""
    if actual == expected:
        return
    assert len(actual) == len(expected), f"{what}: {len(actual)} bytes, expected {len(expected)}"
    first = next(i for i, (a, b) in enumerate(zip(actual, expected, strict=True)) if a != b)
    raise AssertionError(f"{what}: first difference at byte {first} of {len(expected)}")


def commands_sent(ctrl: Controller) -> int:
    return sum(q.conn.stats.commands for q in ctrl.io_queues)


async def wait_for_held_queues(
    target: TargetUnderTest, export: Export, count: int, timeout: float = 30.0
) -> None:
    """Until the target holds `count` queues for `export` (it lets them go on its own time
    after the host disconnects); each check is a round trip to the target's side."""
    held = -1
    try:
        async with asyncio.timeout(timeout):
            while (held := await target.held_queues(export)) != count:
                await asyncio.sleep(0)
    except TimeoutError:
        raise AssertionError(
            f"{target.kind} still holds {held} queues for {export.nqn}, expected {count}"
        ) from None


@dataclass(frozen=True)
class Extent:
    lba: int
    data: bytes


@dataclass(frozen=True)
class Group:
    """Extents back to back, read back either as one command or one command per extent."""

    lba: int
    extents: tuple[Extent, ...]

    @property
    def data(self) -> bytes:
        return b"".join(e.data for e in self.extents)


def _extent_blocks(rng: random.Random, block_size: int, limit: int) -> int:
    """One block, a write the default in-capsule size takes, or a larger one."""
    small = KERNEL_DEFAULT_INLINE // block_size
    kind = rng.choices(("one", "small", "large"), weights=(2, 3, 5))[0]
    if kind == "one":
        n = 1
    elif kind == "small":
        n = rng.randint(2, small)
    else:
        n = rng.randint(small + 1, MAX_WRITE // block_size)
    return min(n, limit)


def make_layout(rng: random.Random, block_size: int, num_blocks: int) -> list[Group]:
    """At least ROUND_TRIP_BYTES of random data in groups at random, non-overlapping LBAs."""
    plans: list[list[int]] = []
    planned = 0
    while planned < ROUND_TRIP_BYTES // block_size:
        left = rng.randint(GROUP_MIN // block_size, GROUP_MAX // block_size)
        planned += left
        blocks = []
        while left:
            n = _extent_blocks(rng, block_size, left)
            blocks.append(n)
            left -= n
        plans.append(blocks)
    # Sorted random gaps in [0, free], each group after the previous ones plus its gap.
    gaps = sorted(rng.randint(0, num_blocks - planned) for _ in plans)
    groups = []
    used = 0
    for gap, blocks in zip(gaps, plans, strict=True):
        lba = start = gap + used
        extents = []
        for n in blocks:
            extents.append(Extent(lba, rng.randbytes(n * block_size)))
            lba += n
        groups.append(Group(start, tuple(extents)))
        used += sum(blocks)
    return groups


async def round_trip(target: TargetUnderTest, export: Export, ctrl: Controller, seed: str) -> None:
    """Write the layout with every command in flight that the queues allow, read it back
    just as concurrently, compare byte for byte, and check the target's backing store."""
    ns = ctrl.namespace(1)
    bs = export.block_size
    rng = random.Random(seed)
    groups = make_layout(rng, bs, export.num_blocks)
    extents = [e for g in groups for e in g.extents]
    limit = ctrl.io_inline_limit
    inline = [e for e in extents if len(e.data) <= limit]
    via_r2t = [e for e in extents if len(e.data) > limit]
    whole = groups[::2]  # read in one command each (256 KiB - 1 MiB)
    piecewise = [e for g in groups[1::2] for e in g.extents]
    # The layout does what the test claims.
    assert sum(len(e.data) for e in extents) >= ROUND_TRIP_BYTES
    assert len(inline) >= DEPTH and len(via_r2t) >= DEPTH
    assert max(len(e.data) for e in extents) > KERNEL_DEFAULT_INLINE
    assert len(whole) >= 4
    assert all(GROUP_MIN <= len(g.data) <= GROUP_MAX for g in whole)
    ends = sorted((e.lba, e.lba + len(e.data) // bs) for e in extents)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends))
    assert ends[-1][1] <= export.num_blocks

    # Connect sent its data in the capsule: count from here on.
    stats = [q.conn.stats for q in ctrl.io_queues]
    before = {field: sum(getattr(s, field) for s in stats) for field in STATS_COUNTED}
    order = list(extents)
    rng.shuffle(order)
    await asyncio.gather(*(ns.write(e.lba, e.data) for e in order))
    assert [s.max_inflight for s in stats] == [DEPTH] * QUEUES
    for s in stats:
        s.max_inflight = 0  # measure the reads on their own

    buffers = {g.lba: bytearray(len(g.data)) for g in groups}
    reads = [ns.read(g.lba, memoryview(buffers[g.lba])) for g in whole]
    for g in groups[1::2]:
        view = memoryview(buffers[g.lba])
        for e in g.extents:
            offset = (e.lba - g.lba) * bs
            reads.append(ns.read(e.lba, view[offset : offset + len(e.data)]))
    rng.shuffle(reads)
    await asyncio.gather(*reads)
    for g in groups:
        assert_same(buffers[g.lba], g.data, f"{export.name} group at LBA {g.lba}")

    done = {field: sum(getattr(s, field) for s in stats) - before[field] for field in STATS_COUNTED}
    # Every queue was kept full; small writes went in the capsule, the others on R2T.
    assert [s.max_inflight for s in stats] == [DEPTH] * QUEUES  # by the reads
    assert done["in_capsule_bytes"] == sum(len(e.data) for e in inline)
    assert done["r2t_received"] >= len(via_r2t)
    assert done["h2c_data_pdus"] >= len(via_r2t)
    assert done["c2h_data_pdus"] >= len(whole) + len(piecewise)
    assert done["commands"] >= len(extents) + len(whole) + len(piecewise)
    assert done["data_digest_errors"] == done["term_reqs_sent"] == 0

    # The data is where the host said: the target's backing store agrees.
    spans = [(g.lba, len(g.data)) for g in groups]
    assert await target.digests(export, spans) == [sha256(g.data) for g in groups]


# --------------------------------------------------------------------------------------------
# Tests


async def test_discover(target: TargetUnderTest) -> None:
    a = target.exports["512"]
    entries = await discover("127.0.0.1", a.port, timeout=CONNECT_TIMEOUT)
    on_port = {e.subnqn: e for e in entries if e.trsvcid == str(a.port)}
    assert set(on_port) == {_nqn("512"), _nqn("4k"), DISCOVERY_NQN}
    for name in ("512", "4k"):
        entry = on_port[_nqn(name)]
        assert entry.subtype == L.SubType.NVME
        assert entry.trtype == L.TrType.TCP
        assert entry.adrfam == L.AdrFam.IPV4
        assert entry.traddr == target.discovery_traddr
    assert on_port[DISCOVERY_NQN].subtype == L.SubType.CURRENT_DISCOVERY
    # What discovery named is usable, reached through 127.0.0.1.
    entry = on_port[_nqn("4k")]
    async with await connect(
        "127.0.0.1", int(entry.trsvcid), entry.subnqn, timeout=CONNECT_TIMEOUT
    ) as ctrl:
        assert ctrl.namespace(1).capabilities.block_size == 4096


@pytest.mark.parametrize("name", ["512", "4k", "inline4k"])
async def test_identify(target: TargetUnderTest, name: str) -> None:
    export = target.exports[name]
    async with await open_controller(export) as ctrl:
        assert [q.qid for q in ctrl.io_queues] == list(range(1, QUEUES + 1))
        assert ctrl.queue_depth == DEPTH
        info = await ctrl.identify_controller()
        assert info.subnqn == export.nqn
        assert info.cntrltype == I.CtrlType.IO == 1
        assert info.cntlid == ctrl.cntlid
        assert info.ioccsz == (64 + export.inline_data_size) // 16
        assert ctrl.io_inline_limit == export.inline_data_size
        assert await ctrl.active_namespaces() == [1]
        assert sorted(ctrl.namespaces) == [1]
        ident = await ctrl.identify_namespace(1)
        assert ident.nsze == ident.ncap == export.num_blocks
        assert ident.block_size == export.block_size
        caps = ctrl.namespace(1).capabilities
        assert (caps.block_size, caps.num_blocks) == (export.block_size, export.num_blocks)
        assert caps.size == SIZE


@pytest.mark.parametrize("digests", [False, True], ids=["plain", "digests"])
@pytest.mark.parametrize("name", ["512", "4k", "inline4k"])
async def test_round_trip(target: TargetUnderTest, name: str, digests: bool) -> None:
    export = target.exports[name]
    async with await open_controller(export, digests=digests) as ctrl:
        queues = [ctrl.admin, *ctrl.io_queues]
        assert all(q is not None and (q.conn.hdgst, q.conn.ddgst) == (digests,) * 2 for q in queues)
        await round_trip(target, export, ctrl, f"{name}-{digests}")


@pytest.mark.parametrize("name", ["512", "4k"])
async def test_fua_flush_write_zeroes_deallocate(target: TargetUnderTest, name: str) -> None:
    export = target.exports[name]
    bs = export.block_size
    rng = random.Random(f"fua-{name}")
    data = rng.randbytes(MAX_WRITE)
    nblocks = len(data) // bs
    quarter = nblocks // 4
    lba = export.num_blocks // 2 + 3
    async with await open_controller(export) as ctrl:
        ns = ctrl.namespace(1)
        caps = ns.capabilities
        assert caps.volatile_write_cache and caps.write_zeroes and caps.deallocate

        await ns.write(lba, data, fua=True)
        assert await target.digests(export, [(lba, len(data))]) == [sha256(data)]
        await ns.flush()

        await ns.write_zeroes(lba + quarter, quarter)
        await ns.deallocate(lba + 2 * quarter, quarter)
        q = quarter * bs
        third = bytes(q) if export.deallocated_reads_zero else data[2 * q : 3 * q]
        expected = data[:q] + bytes(q) + third + data[3 * q :]
        back = bytearray(len(data))
        await ns.read(lba, memoryview(back))
        assert_same(back, expected, "after Write Zeroes and Deallocate")
        assert await target.digests(export, [(lba, len(data))]) == [sha256(expected)]


async def test_out_of_range(target: TargetUnderTest) -> None:
    export = target.exports["512"]
    bs = export.block_size
    n = export.num_blocks
    async with await open_controller(export) as ctrl:
        ns: RemoteNamespace = ctrl.namespace(1)
        sent = commands_sent(ctrl)
        with pytest.raises(BlockRangeError):
            await ns.read(n, memoryview(bytearray(bs)))
        with pytest.raises(BlockRangeError):
            await ns.read(n - 1, memoryview(bytearray(2 * bs)))
        with pytest.raises(BlockRangeError):
            await ns.write(n - 1, bytes(2 * bs))
        with pytest.raises(BlockRangeError):
            await ns.write(-1, bytes(bs))
        with pytest.raises(BlockRangeError):
            await ns.write_zeroes(n, 1)
        with pytest.raises(BlockRangeError):
            await ns.deallocate(n - 1, 2)
        assert commands_sent(ctrl) == sent, "an out-of-range request reached the target"

        if isinstance(target, LinuxTarget):
            await target.read_kernel_log()
        for lba, nblocks in ((n, 1), (n - 1, 2)):
            with pytest.raises(NvmeStatusError) as info:
                await ctrl.io_command(
                    IoOpcode.READ,
                    1,
                    lba & 0xFFFFFFFF,
                    lba >> 32,
                    nblocks - 1,
                    into=memoryview(bytearray(nblocks * bs)),
                )
            assert info.value.status == target.out_of_range_status, info.value
            assert info.value.dnr
            assert info.value.opcode == IoOpcode.READ
        # The queue carries on: the last block reads fine.
        await ns.read(n - 1, memoryview(bytearray(bs)))

    if isinstance(target, LinuxTarget):
        # The bdev backend of 6.1 and 6.12 does no range check: the block layer refuses the bio
        # (bio_check_eod, BLK_STS_IOERR), which nvmet reports as Internal Error. The
        # kernel log shows both requests arrived with the LBAs sent.
        dev = target.kernel[export.name].device.rsplit("/", 1)[1]
        log = "\n".join(await target.read_kernel_log())
        sectors = [int(s) for s in re.findall(rf"{dev}: rw=\d+, sector=(\d+)", log)]
        assert sectors == [n * bs // 512, (n - 1) * bs // 512], log


async def test_io_queues_with_another_host_id_than_the_admin_queue(
    target: TargetUnderTest,
) -> None:
    """Some hosts send another Host Identifier on their I/O queue Connects than on the
    admin queue's: nvmet finds the controller by subsystem NQN, host NQN and CNTLID
    alone, and so does pynvmf."""
    export = target.exports["512"]
    bs = export.block_size
    data = random.Random("io hostid").randbytes(2 * QUEUES * bs)
    async with await connect(
        "127.0.0.1",
        export.port,
        export.nqn,
        queues=QUEUES,
        queue_depth=DEPTH,
        timeout=CONNECT_TIMEOUT,
        io_hostid=bytes(range(16)),
    ) as ctrl:
        assert len(ctrl.io_queues) == QUEUES
        assert ctrl.io_identity.hostid != ctrl.identity.hostid
        ns = ctrl.namespace(1)
        # One block per command: the commands go round robin over every I/O queue.
        for i in range(2 * QUEUES):
            await ns.write(300 + i, data[i * bs : (i + 1) * bs])
        back = bytearray(len(data))
        for i in range(2 * QUEUES):
            await ns.read(300 + i, memoryview(back)[i * bs : (i + 1) * bs])
        assert_same(back, data, "written and read over I/O queues of another host ID")


async def test_disconnect_is_clean(
    target: TargetUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    # inline4k is alone on its port, so the kernel's sockets there are this test's.
    export = target.exports["inline4k"]
    await wait_for_held_queues(target, export, 0)
    data = random.Random("disconnect").randbytes(64 * KIB)
    with caplog.at_level(logging.WARNING, logger="pynvmf"):
        async with await open_controller(export) as ctrl:
            assert await target.held_queues(export) == 1 + QUEUES
            await ctrl.namespace(1).write(7, data)
        assert ctrl.closed
        # The host asked for a normal shutdown (CC.SHN 01b); had CSTS.SHST not reported it
        # complete, close() would have logged a warning.
        assert ctrl.cc & C.CC_SHN_MASK == 1 << C.CC_SHN_SHIFT
        assert all(q.transport is None for q in [ctrl.admin, *ctrl.io_queues] if q is not None)
    # Normal shutdown completed (CSTS.SHST), nothing logged about it.
    assert not [r for r in caplog.records if r.name.startswith("pynvmf")], caplog.text
    await wait_for_held_queues(target, export, 0)

    async with await open_controller(export) as again:
        back = bytearray(len(data))
        await again.namespace(1).read(7, memoryview(back))
        assert_same(back, data, "read by a second controller")
        assert await target.held_queues(export) == 1 + QUEUES
    await wait_for_held_queues(target, export, 0)


async def test_only_pynvmf_does_copy(target: TargetUnderTest) -> None:
    """The copy offload work relies on this: no kernel target (6.1, 6.12, 7.2) does Copy,
    pynvmf's does, and the same command shows both."""
    export = target.exports["512"]
    bs = export.block_size
    src, dst, nblocks = 1000, 2000, 8
    data = random.Random("copy").randbytes(nblocks * bs)
    linux = target if isinstance(target, LinuxTarget) else None
    if linux is not None:
        await linux.read_kernel_log()
    async with await open_controller(export) as ctrl:
        info = await ctrl.identify_controller()
        assert I.Oncs.COPY == 1 << 8
        assert bool(info.oncs & I.Oncs.COPY) == (linux is None)
        assert info.oncs & I.Oncs.DSM and info.oncs & I.Oncs.WRITE_ZEROES
        ns = ctrl.namespace(1)
        await ns.write(src, data)
        await ns.write_zeroes(dst, nblocks)
        # One source range: src to dst.
        copy = ctrl.io_command(
            IoOpcode.COPY, 1, dst, 0, 0, data=COPY_RANGE_FORMAT0.pack(src, nblocks - 1)
        )
        back = bytearray(len(data))
        if linux is None:
            await copy
            await ns.read(dst, memoryview(back))
            assert_same(back, data, "Copy destination")
            return
        with pytest.raises(NvmeStatusError) as err:
            await copy
        assert err.value.status == Status.INVALID_OPCODE, err.value
        assert err.value.dnr
        await ns.read(dst, memoryview(back))
        assert_same(back, bytes(len(data)), "Copy destination")
    # nvmet refused the command when parsing it (and says so); nothing else went wrong.
    trouble = [line for line in await linux.read_kernel_log() if KERNEL_TROUBLE.search(line)]
    assert len(trouble) == 1 and re.search(r"failed cmd .* opcode 25, data_len: 32", trouble[0]), (
        trouble
    )
    # Accounted for: the `linux` fixture checks the rest of the log.
    linux.kernel_log.remove(trouble[0])
