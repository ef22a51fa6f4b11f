"""Copy through the host library against the in-process pynvmf target: the copy planner
(pynvmf.block.copy) offloads to remote namespaces as NVMe Copy commands, splits requests
to fit the limits Identify reports, and emulates (read + write through the host) where
the controller cannot copy. Data is checked against a model behind the target's back,
and the bytes that crossed the connections are counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from pynvmf.block import copy as block_copy
from pynvmf.block.copy import CopyReport, SourceRange
from pynvmf.block.device import (
    BlockDevice,
    BlockRangeError,
    Buffer,
    Capabilities,
    CopyLimits,
    CopyOffload,
)
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeStatusError, RemoteNamespace, connect
from pynvmf.host.queue import watch_commands
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import CMD_SIZE_LIMIT_EXCEEDED, DNR, Status
from pynvmf.target import admin as target_admin
from pynvmf.target import io as target_io
from pynvmf.target import limits as target_limits
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

pytestmark = pytest.mark.timeout(120)

NQN = "nqn.2024-01.org.pynvmf:host-copy"
MiB = 1024 * 1024
BS = 512
NS_BYTES = 80 * MiB
NS_BLOCKS = NS_BYTES // BS


# -- the target, its backing devices and their models ------------------------------------------


# No generated repr: pytest shows fixture values, and the models are 80 MiB each.
@dataclasses.dataclass(repr=False)
class Rig:
    """A started target with namespaces 1 and 2 (memory), the devices behind them and a
    model of each (what the device must hold)."""

    target: Target
    port: int
    devices: dict[int, MemoryDevice]
    models: dict[int, bytearray]
    controllers: list[Controller] = dataclasses.field(default_factory=list)

    async def connect(self, **kwargs: Any) -> Controller:
        ctrl = await connect("127.0.0.1", self.port, NQN, **kwargs)
        self.controllers.append(ctrl)
        return ctrl

    async def contents(self, nsid: int) -> bytes:
        """The namespace's bytes, read from the device behind the target's back."""
        buf = bytearray(NS_BYTES)
        await self.devices[nsid].read(0, memoryview(buf))
        return bytes(buf)

    async def assert_matches_model(self) -> None:
        for nsid, model in self.models.items():
            data = await self.contents(nsid)
            if data != model:
                first = next(i for i, (a, b) in enumerate(zip(data, model, strict=True)) if a != b)
                raise AssertionError(f"namespace {nsid}: first difference at byte {first}")

    @property
    def copy_commands(self) -> int:
        """Copy commands the target has completed successfully."""
        return self.target.subsystems[NQN].stats.copy_cmds


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    subsystem = Subsystem(NQN)
    devices: dict[int, MemoryDevice] = {}
    models: dict[int, bytearray] = {}
    for nsid in (1, 2):
        device = MemoryDevice(NS_BYTES, BS)
        # Random content makes every block distinct, so a block copied from the wrong
        # place cannot match the model by accident.
        model = bytearray(os.urandom(NS_BYTES))
        await device.write(0, model)
        devices[nsid], models[nsid] = device, model
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    made = Rig(target, target.ports[0].port, devices, models)
    try:
        yield made
    finally:
        for ctrl in made.controllers:
            await ctrl.close()
        await target.stop()


def model_copy(
    models: dict[int, bytearray],
    sources: Sequence[tuple[int, int, int]],
    dst_nsid: int,
    dst_lba: int,
) -> None:
    """Snapshot semantics: every (nsid, lba, nblocks) source is read first, then their
    concatenation is written from dst_lba."""
    data = b"".join(bytes(models[n][lba * BS : (lba + k) * BS]) for n, lba, k in sources)
    models[dst_nsid][dst_lba * BS : dst_lba * BS + len(data)] = data


def sources_on(
    namespaces: dict[int, BlockDevice], ranges: Sequence[tuple[int, int, int]]
) -> list[SourceRange]:
    return [SourceRange(namespaces[nsid], lba, n) for nsid, lba, n in ranges]


def scattered(
    rng: random.Random, count: int, nblocks: int, *, below: int, nsid: int = 1
) -> list[tuple[int, int, int]]:
    """`count` non-overlapping ranges of `nblocks`, one in each slot of [0, below), shuffled."""
    slot = below // count
    assert slot >= nblocks
    ranges = [(nsid, i * slot + rng.randrange(slot - nblocks + 1), nblocks) for i in range(count)]
    rng.shuffle(ranges)
    return ranges


@dataclasses.dataclass(frozen=True)
class Sent:
    qid: int
    opcode: int
    nsid: int
    cdw10: int
    cdw11: int
    cdw12: int


@pytest.fixture
def sent() -> Iterator[list[Sent]]:
    """Every NVM command the host library sends (still sent)."""
    log: list[Sent] = []

    def record(qid: int, opcode: int, nsid: int, cdw10: int, cdw11: int, cdw12: int) -> None:
        # The NVM commands only: not the admin queue, nor an I/O queue's Connect.
        if qid and opcode != AdminOpcode.FABRICS:
            log.append(Sent(qid, opcode, nsid, cdw10, cdw11, cdw12))

    stop = watch_commands(record)
    yield log
    stop()


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[C.CopyRange]]]:
    """(descriptor format, ranges) of every Copy the target parses."""
    log: list[tuple[int, list[C.CopyRange]]] = []
    real = C.parse_copy_ranges  # what pynvmf.target.io calls

    def spy(data: Buffer, desfmt: int, nr: int) -> list[C.CopyRange]:
        ranges = real(data, desfmt, nr)
        log.append((desfmt, ranges))
        return ranges

    monkeypatch.setattr(target_io, "parse_copy_ranges", spy)
    return log


HOST_BEHAVIOR = 0x16  # Feature Identifier: Host Behavior Support (CDFE in bytes 5:4)


@pytest.fixture
def feature_16h(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The opcode (Get or Set Features) of every Host Behavior Support command the
    target receives, refused or not."""
    log: list[int] = []
    real = target_admin.execute

    async def execute(ctrl: Any, queue: Any, req: Any) -> Any:
        sqe = req.sqe
        if sqe.opcode in _FEATURES and sqe.cdw10 & 0xFF == HOST_BEHAVIOR:
            log.append(sqe.opcode)
        return await real(ctrl, queue, req)

    monkeypatch.setattr(target_admin, "execute", execute)
    return log


_FEATURES = (AdminOpcode.GET_FEATURES, AdminOpcode.SET_FEATURES)


def refuse_host_behavior(monkeypatch: pytest.MonkeyPatch, refused: tuple[int, ...]) -> None:
    """The target's Get/Set Features handlers (the `refused` ones) fail Host Behavior
    Support with Invalid Field, as a controller without the feature does."""
    refusal = (Status.INVALID_FIELD | DNR, 0, None)
    real_get, real_set = target_admin.get_features, target_admin.set_features

    def get_features(ctrl: Any, req: Any) -> Any:
        if AdminOpcode.GET_FEATURES in refused and req.sqe.cdw10 & 0xFF == HOST_BEHAVIOR:
            return refusal
        return real_get(ctrl, req)

    async def set_features(ctrl: Any, queue: Any, req: Any) -> Any:
        if AdminOpcode.SET_FEATURES in refused and req.sqe.cdw10 & 0xFF == HOST_BEHAVIOR:
            return refusal
        return await real_set(ctrl, queue, req)

    monkeypatch.setattr(target_admin, "get_features", get_features)
    monkeypatch.setattr(target_admin, "set_features", set_features)


def target_cdfe(rig: Rig, ctrl: Controller) -> int:
    """CDFE as the target's controller for `ctrl` holds it."""
    behavior = rig.target.subsystems[NQN].controllers[ctrl.cntlid].host_behavior
    return int(struct.unpack_from("<H", behavior, 4)[0])


def small_copy_limits(monkeypatch: pytest.MonkeyPatch, limits: CopyLimits) -> None:
    """The target reports (Identify Namespace) and enforces (Copy) `limits`."""

    def fixed(_block_size: int) -> CopyLimits:
        return limits

    monkeypatch.setattr(target_io, "copy_limits", fixed)
    monkeypatch.setattr(target_io, "_copy_limits", fixed)  # the Copy handler's cached one
    monkeypatch.setattr(target_admin, "copy_limits", fixed)


class PlainDevice:
    """A BlockDevice that forwards to another and declares nothing more: whatever the
    device behind it can do, the planner sees no CopyOffload and no native copy."""

    def __init__(self, inner: BlockDevice) -> None:
        self.inner = inner

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    async def read(self, lba: int, buf: memoryview) -> None:
        await self.inner.read(lba, buf)

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self.inner.write(lba, data, fua=fua)

    async def flush(self) -> None:
        await self.inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self.inner.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self.inner.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self.inner.close()


def wire_bytes(ctrl: Controller) -> int:
    return ctrl.bytes_sent + ctrl.bytes_received


def copies(log: Sequence[Sent]) -> list[Sent]:
    return [s for s in log if s.opcode == IoOpcode.COPY]


# -- offload --------------------------------------------------------------------------------


async def test_namespaces_of_a_copy_controller_offload_with_identify_limits(rig: Rig) -> None:
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    assert ctrl.info is not None and ctrl.info.oncs & I.Oncs.COPY
    assert isinstance(ns, RemoteNamespace) and isinstance(ns, CopyOffload)
    # The target's limits (pynvmf.target.limits), as Identify Namespace reported them.
    expected = target_limits.copy_limits(BS)
    assert ns.copy_limits == expected
    assert (ns.identify.mssrl, ns.identify.mcl, ns.identify.msrc + 1) == (
        expected.max_range_blocks,
        expected.max_blocks,
        expected.max_ranges,
    )
    assert ns.can_copy_from(ns)
    assert ns.can_copy_from(ctrl.namespace(2))  # OCFS has format 2
    assert not ns.can_copy_from(MemoryDevice(MiB, BS))


async def test_same_namespace_copy_is_one_copy_command(rig: Rig, sent: list[Sent]) -> None:
    ctrl = await rig.connect(queues=2)
    ns = ctrl.namespace(1)
    rng = random.Random(1)
    ranges = scattered(rng, 16, 200, below=NS_BLOCKS // 2)
    dst_lba = NS_BLOCKS // 2 + 77
    total = sum(n for _ns, _lba, n in ranges)

    report = await block_copy.copy(sources_on({1: ns}, ranges), ns, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    assert report == CopyReport(offloaded_blocks=total, commands=1)
    # One command crossed the connection, with every range in one format 0 descriptor list.
    (cmd,) = sent
    assert (cmd.opcode, cmd.nsid) == (IoOpcode.COPY, 1)
    assert cmd.cdw10 | cmd.cdw11 << 32 == dst_lba
    assert (cmd.cdw12 & 0xFF) + 1 == 16 and (cmd.cdw12 >> 8) & 0xF == 0
    assert not cmd.cdw12 & C.RW_FUA
    assert rig.copy_commands == 1
    # And the host reads back what the model says.
    buf = bytearray(total * BS)
    await ns.read(dst_lba, memoryview(buf))
    assert buf == rig.models[1][dst_lba * BS : (dst_lba + total) * BS]


async def test_copy_blocks_single_range_with_fua(rig: Rig, sent: list[Sent]) -> None:
    ctrl = await rig.connect()
    ns = ctrl.namespace(2)
    report = await block_copy.copy_blocks(ns, 1000, ns, 90000, 3000, fua=True)
    model_copy(rig.models, [(2, 1000, 3000)], 2, 90000)
    await rig.assert_matches_model()
    assert report == CopyReport(offloaded_blocks=3000, commands=1)
    # FUA travels in the Copy command: no Flush after it.
    assert [(s.opcode, bool(s.cdw12 & C.RW_FUA)) for s in sent] == [(IoOpcode.COPY, True)]


async def test_more_ranges_than_msrc_split_into_several_commands(
    rig: Rig, sent: list[Sent], parsed: list[tuple[int, list[C.CopyRange]]]
) -> None:
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    assert isinstance(ns, CopyOffload)
    max_ranges = ns.copy_limits.max_ranges
    assert max_ranges == 128
    count = 2 * max_ranges + 44
    rng = random.Random(2)
    ranges = scattered(rng, count, 3, below=NS_BLOCKS // 2)
    dst_lba = NS_BLOCKS - count * 3

    report = await block_copy.copy(sources_on({1: ns}, ranges), ns, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    assert report == CopyReport(offloaded_blocks=count * 3, commands=3)
    assert [(s.cdw12 & 0xFF) + 1 for s in copies(sent)] == [128, 128, 44]
    assert len(sent) == 3  # nothing but the three Copy commands
    # Each command's destination follows the previous one's.
    assert [s.cdw10 for s in sent] == [dst_lba, dst_lba + 128 * 3, dst_lba + 256 * 3]
    assert [len(r) for _f, r in parsed] == [128, 128, 44]
    assert rig.copy_commands == 3


async def test_split_by_mssrl_mcl_and_msrc(
    rig: Rig,
    sent: list[Sent],
    parsed: list[tuple[int, list[C.CopyRange]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = CopyLimits(max_range_blocks=100, max_blocks=250, max_ranges=4)
    small_copy_limits(monkeypatch, limits)
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    assert isinstance(ns, CopyOffload)
    assert ns.copy_limits == limits
    # The target enforces what it reported: one range over MSSRL is refused.
    too_long = C.pack_copy_ranges([C.CopyRange(0, 101)], 0)
    with pytest.raises(NvmeStatusError) as err:
        await ctrl.io_command(IoOpcode.COPY, 1, 5000, 0, C.copy_cdw12(1, 0), data=too_long)
    assert err.value.status == CMD_SIZE_LIMIT_EXCEEDED
    sent.clear()
    parsed.clear()

    # 300 blocks (over MSSRL: three pieces), then 50 and four of 10.
    ranges = [(1, 10000, 300), (1, 20000, 50), *[(1, 30000 + 100 * i, 10) for i in range(4)]]
    dst_lba = 60000
    report = await block_copy.copy(sources_on({1: ns}, ranges), ns, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    # Pieces of at most 100 blocks, batches of at most 250 blocks and 4 ranges:
    # [100, 100, 50] (cut at MCL, the third piece split), [50, 50, 10, 10] (cut at
    # MSRC), [10, 10].
    assert [[r.nlb for r in rs] for _f, rs in parsed] == [
        [100, 100, 50],
        [50, 50, 10, 10],
        [10, 10],
    ]
    assert [[r.slba for r in rs] for _f, rs in parsed] == [
        [10000, 10100, 10200],
        [10250, 20000, 30000, 30100],
        [30200, 30300],
    ]
    assert [s.cdw10 for s in copies(sent)] == [60000, 60250, 60370]
    assert report == CopyReport(offloaded_blocks=390, commands=3)
    assert rig.copy_commands == 3  # the refused one does not count


async def test_cross_namespace_copy_uses_format_2(
    rig: Rig, sent: list[Sent], parsed: list[tuple[int, list[C.CopyRange]]]
) -> None:
    ctrl = await rig.connect()
    ns1, ns2 = ctrl.namespace(1), ctrl.namespace(2)
    assert isinstance(ns1, CopyOffload)
    assert ns1.can_copy_from(ns2)
    rng = random.Random(3)
    # Sources in both namespaces, interleaved: one command, the NSID in each descriptor.
    ranges = scattered(rng, 6, 64, below=NS_BLOCKS // 2, nsid=2) + scattered(
        rng, 3, 64, below=NS_BLOCKS // 2, nsid=1
    )
    rng.shuffle(ranges)
    dst_lba = NS_BLOCKS // 2

    report = await block_copy.copy(sources_on({1: ns1, 2: ns2}, ranges), ns1, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    assert report == CopyReport(offloaded_blocks=9 * 64, commands=1)
    (cmd,) = sent
    assert (cmd.opcode, cmd.nsid, (cmd.cdw12 >> 8) & 0xF) == (IoOpcode.COPY, 1, 2)
    ((desfmt, descriptors),) = parsed
    assert desfmt == 2
    assert [(r.snsid, r.slba, r.nlb) for r in descriptors] == ranges


async def test_cross_namespace_copies_enable_cdfe_once_per_controller(
    rig: Rig, sent: list[Sent], feature_16h: list[int]
) -> None:
    ctrl = await rig.connect()
    ns1, ns2 = ctrl.namespace(1), ctrl.namespace(2)
    target_ctrl = rig.target.subsystems[NQN].controllers[ctrl.cntlid]
    # What the host set before (ACRE, reserved bytes) must survive CDFE being enabled.
    before = bytearray(os.urandom(512))
    struct.pack_into("<H", before, 4, 0)
    target_ctrl.host_behavior = bytes(before)
    # Within one namespace, format 0: nothing to enable.
    await block_copy.copy([SourceRange(ns1, 0, 64)], ns1, NS_BLOCKS - 64)
    model_copy(rig.models, [(1, 0, 64)], 1, NS_BLOCKS - 64)
    assert feature_16h == [] and ctrl.copy_formats_enabled is None
    assert target_cdfe(rig, ctrl) == 0

    # Two cross-namespace copies at once: one of them asks, the other waits for it.
    jobs = [
        ([(2, 1000 * i, 300), (1, 5000 + 1000 * i, 20), (2, 90000 + 10 * i, 7)], 40000 * (i + 1))
        for i in range(2)
    ]
    reports = await asyncio.gather(
        *(block_copy.copy(sources_on({1: ns1, 2: ns2}, r), ns1, dst) for r, dst in jobs)
    )
    for ranges, dst in jobs:
        model_copy(rig.models, ranges, 1, dst)
    assert reports == [CopyReport(offloaded_blocks=327, commands=1)] * 2
    assert feature_16h == [AdminOpcode.GET_FEATURES, AdminOpcode.SET_FEATURES]
    assert ctrl.copy_formats_enabled == 1 << 2 | 1 << 3  # OCFS has both
    assert target_cdfe(rig, ctrl) == 1 << 2 | 1 << 3
    struct.pack_into("<H", before, 4, 1 << 2 | 1 << 3)
    assert target_ctrl.host_behavior == before
    assert [(c.cdw12 >> 8) & 0xF for c in copies(sent)] == [0, 2, 2]

    # Later copies, on any namespace of the controller, do not ask again.
    await block_copy.copy([SourceRange(ns1, 7, 9)], ns2, 123)
    model_copy(rig.models, [(1, 7, 9)], 2, 123)
    assert feature_16h == [AdminOpcode.GET_FEATURES, AdminOpcode.SET_FEATURES]
    assert rig.copy_commands == 4
    await rig.assert_matches_model()


@pytest.mark.parametrize(
    "refused",
    [_FEATURES, (AdminOpcode.SET_FEATURES,)],
    ids=["get-and-set", "set-only"],
)
async def test_cross_namespace_sources_are_emulated_if_host_behavior_is_refused(
    rig: Rig,
    sent: list[Sent],
    feature_16h: list[int],
    monkeypatch: pytest.MonkeyPatch,
    refused: tuple[int, ...],
) -> None:
    refuse_host_behavior(monkeypatch, refused)
    ctrl = await rig.connect()
    ns1, ns2 = ctrl.namespace(1), ctrl.namespace(2)
    assert isinstance(ns1, CopyOffload)
    assert ns1.can_copy_from(ns2)  # as far as OCFS says, before the controller is asked
    ranges = [(2, 3000, 200), (1, 100, 50), (2, 10, 30)]
    dst_lba = NS_BLOCKS // 2

    report = await block_copy.copy(sources_on({1: ns1, 2: ns2}, ranges), ns1, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    # The source in the destination's namespace is still offloaded (format 0), the
    # others are read and written by the host.
    assert report == CopyReport(offloaded_blocks=50, emulated_blocks=230, commands=1)
    assert [(c.nsid, (c.cdw12 >> 8) & 0xF) for c in copies(sent)] == [(1, 0)]
    assert ctrl.copy_formats_enabled == 0
    assert not ns1.can_copy_from(ns2) and ns1.can_copy_from(ns1)
    assert ns1.cross_namespace_format is None
    # Asked once: Get Features, then Set Features only if Get was answered.
    asked = [AdminOpcode.GET_FEATURES]
    if AdminOpcode.GET_FEATURES not in refused:
        asked.append(AdminOpcode.SET_FEATURES)
    assert feature_16h == asked
    # A direct request is refused by the namespace, not sent; nor is the feature re-asked.
    with pytest.raises(ValueError, match="cannot copy"):
        await ns1.copy_offload([(ns2, 0, 8)], 0)
    report = await block_copy.copy([SourceRange(ns2, 0, 8)], ns1, 0)
    model_copy(rig.models, [(2, 0, 8)], 1, 0)
    assert report == CopyReport(emulated_blocks=8)
    assert feature_16h == asked
    assert len(copies(sent)) == 1 and rig.copy_commands == 1
    await rig.assert_matches_model()


async def test_namespaces_of_two_controllers_are_emulated(rig: Rig, sent: list[Sent]) -> None:
    a = await rig.connect()
    b = await rig.connect()
    src, dst = a.namespace(2), b.namespace(1)
    assert isinstance(dst, CopyOffload)
    assert not dst.can_copy_from(src)  # another association: no Copy can name it
    rng = random.Random(4)
    ranges = scattered(rng, 5, 300, below=NS_BLOCKS // 2, nsid=2)
    dst_lba = NS_BLOCKS // 2 + 5

    report = await block_copy.copy(sources_on({2: src}, ranges), dst, dst_lba)

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    assert report == CopyReport(emulated_blocks=1500)
    assert copies(sent) == [] and rig.copy_commands == 0
    reads = [s for s in sent if s.opcode == IoOpcode.READ]
    writes = [s for s in sent if s.opcode == IoOpcode.WRITE]
    assert sum((s.cdw12 & 0xFFFF) + 1 for s in reads) == 1500
    assert sum((s.cdw12 & 0xFFFF) + 1 for s in writes) == 1500


async def test_controller_without_copy_gets_its_copies_emulated(
    rig: Rig, sent: list[Sent], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = target_admin.identify_controller

    def without_copy(*args: Any) -> I.IdentifyController:
        info = real(*args)
        return dataclasses.replace(info, oncs=info.oncs & ~I.Oncs.COPY, ocfs=0)

    monkeypatch.setattr(target_admin, "identify_controller", without_copy)
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    assert isinstance(ns, RemoteNamespace) and not isinstance(ns, CopyOffload)
    ranges = [(1, 4000, 100), (1, 100, 7), (1, 30000, 2000)]

    report = await block_copy.copy(sources_on({1: ns}, ranges), ns, 50000, chunk_bytes=64 * BS)

    model_copy(rig.models, ranges, 1, 50000)
    await rig.assert_matches_model()
    assert report == CopyReport(emulated_blocks=2107)
    assert copies(sent) == []


# -- overlap --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranges", "dst_lba", "staged", "commands"),
    [
        # The two middle sources overlap the destination 20..140: staged; the others
        # are offloaded in two commands (the staged ones sit between them).
        ([(1000, 64), (0, 32), (40, 16), (5000, 8)], 20, 48, 2),
        # One range overlapping itself, forwards and backwards.
        ([(100, 50)], 120, 50, 0),
        ([(120, 50)], 100, 50, 0),
        # A chain where processing ranges in order would read already-copied data.
        ([(0, 8), (8, 8), (16, 8)], 4, 24, 0),
        # Sources before and after the destination, touching it but not overlapping.
        ([(0, 10), (40, 10)], 10, 0, 1),
    ],
)
async def test_overlapping_sources_are_staged_and_match_the_model(
    rig: Rig, ranges: list[tuple[int, int]], dst_lba: int, staged: int, commands: int
) -> None:
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    full = [(1, lba, n) for lba, n in ranges]
    total = sum(n for _lba, n in ranges)

    report = await block_copy.copy(sources_on({1: ns}, full), ns, dst_lba, chunk_bytes=8 * BS)

    model_copy(rig.models, full, 1, dst_lba)
    await rig.assert_matches_model()
    assert report.staged_blocks == staged
    assert report.emulated_blocks == staged
    assert report.offloaded_blocks == total - staged
    assert report.commands == commands == rig.copy_commands


@pytest.mark.parametrize("depth", [1, block_copy.EMULATION_DEPTH])
@pytest.mark.parametrize(
    ("ranges", "dst_lba", "staged"),
    [
        # One range moved forward by more than the emulation reads ahead: in chunks,
        # later ones would read what earlier ones wrote.
        ([(1, 0, 256)], 32, 256),
        # Only the source overlapping the destination 120..280 is staged: not the one
        # elsewhere in the namespace, nor the one in namespace 2 at overlapping LBAs.
        ([(1, 5000, 64), (1, 100, 64), (2, 150, 32)], 120, 64),
        # Apart in the namespace: nothing to stage.
        ([(1, 1000, 64)], 0, 0),
    ],
    ids=["forward-shift", "mixed", "apart"],
)
async def test_one_namespace_through_two_controllers_is_one_storage(
    rig: Rig,
    sent: list[Sent],
    ranges: list[tuple[int, int, int]],
    dst_lba: int,
    staged: int,
    depth: int,
) -> None:
    a = await rig.connect()
    b = await rig.connect()
    # Namespace 1 as two objects, of two controllers (two associations) of one subsystem.
    src_ns, dst = a.namespace(1), b.namespace(1)
    assert src_ns is not dst and set(src_ns.medium.keys) & set(dst.medium.keys)
    assert not set(a.namespace(2).medium.keys) & set(dst.medium.keys)
    total = sum(n for _nsid, _lba, n in ranges)

    report = await block_copy.copy(
        sources_on({1: src_ns, 2: a.namespace(2)}, ranges),
        dst,
        dst_lba,
        chunk_bytes=8 * BS,
        depth=depth,
    )

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    # Another association: no Copy command can name the source, everything is emulated.
    assert report == CopyReport(emulated_blocks=total, staged_blocks=staged)
    assert copies(sent) == [] and rig.copy_commands == 0


# -- errors ---------------------------------------------------------------------------------


async def test_a_failed_copy_command_is_an_nvme_status_error(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctrl = await rig.connect()
    ns = ctrl.namespace(1)
    # The target now enforces less than it reported when the host connected.
    monkeypatch.setattr(target_io, "_copy_limits", lambda _bs: CopyLimits(8, 8, 1))
    with pytest.raises(NvmeStatusError) as err:
        await block_copy.copy([SourceRange(ns, 0, 16)], ns, 1000)
    assert err.value.status == CMD_SIZE_LIMIT_EXCEEDED
    assert err.value.opcode == IoOpcode.COPY
    await rig.assert_matches_model()  # nothing written


async def test_copy_offload_checks_before_sending(rig: Rig, sent: list[Sent]) -> None:
    a = await rig.connect()
    b = await rig.connect()
    ns = a.namespace(1)
    assert isinstance(ns, CopyOffload)
    limits = ns.copy_limits
    with pytest.raises(BlockRangeError):
        await ns.copy_offload([(ns, NS_BLOCKS - 1, 2)], 0)
    with pytest.raises(BlockRangeError):
        await ns.copy_offload([(ns, 0, 2)], NS_BLOCKS - 1)
    with pytest.raises(ValueError, match="cannot copy"):
        await ns.copy_offload([(b.namespace(2), 0, 2)], 0)
    with pytest.raises(ValueError, match="MSSRL"):
        await ns.copy_offload([(ns, 0, limits.max_range_blocks + 1)], 0)
    with pytest.raises(ValueError, match="limits"):
        await ns.copy_offload([(ns, i, 1) for i in range(limits.max_ranges + 1)], 0)
    with pytest.raises(BlockRangeError):
        await block_copy.copy([SourceRange(ns, 0, 8)], ns, NS_BLOCKS - 7)
    assert sent == []
    await rig.assert_matches_model()


# -- bytes on the wire ----------------------------------------------------------------------

RANGES_16 = 16
RANGE_BYTES = 2 * MiB


@pytest.mark.parametrize("path", ["offloaded", "emulated"])
async def test_bytes_over_the_connection(rig: Rig, path: str) -> None:
    ctrl = await rig.connect(queues=2)
    ns = ctrl.namespace(1)
    # Emulation is forced by hiding the namespace's CopyOffload; the planner then finds
    # neither an offload nor a native copy and emulates on its own.
    device: BlockDevice = ns if path == "offloaded" else PlainDevice(ns)
    rng = random.Random(5)
    nblocks = RANGE_BYTES // BS
    ranges = scattered(rng, RANGES_16, nblocks, below=NS_BLOCKS // 2)
    copied = RANGES_16 * RANGE_BYTES
    dst_lba = NS_BLOCKS // 2

    before = wire_bytes(ctrl)
    report = await block_copy.copy(sources_on({1: device}, ranges), device, dst_lba)
    moved = wire_bytes(ctrl) - before

    model_copy(rig.models, ranges, 1, dst_lba)
    await rig.assert_matches_model()
    ratio = moved / copied
    print(f"{path}: {moved} bytes over the connection for {copied} copied ({ratio:.5f}x)")
    if path == "offloaded":
        assert report == CopyReport(offloaded_blocks=copied // BS, commands=1)
        assert moved < copied / 100
    else:
        assert report == CopyReport(emulated_blocks=copied // BS)
        assert 1.9 <= ratio <= 2.2
