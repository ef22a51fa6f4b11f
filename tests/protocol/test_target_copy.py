"""The NVMe Copy command against the live in-process target, over real sockets.

Source range descriptors are built here byte by byte from the specification
(SNSID in bytes 3:0 for formats 2/3, SLBA in 15:8, NLB 0's based in 17:16;
32-byte descriptors for formats 0/2, 40-byte ones for formats 1/3), not with the
project's packer, and every result is checked against a model: one bytearray per
namespace, a copy being "read every source, then write their concatenation".
So is the Host Behavior Support feature (16h) that formats 2/3 must be enabled in:
512 bytes, CDFE (Copy Descriptor Formats Enable) in bytes 5:4.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block import copy as block_copy
from pynvmf.block.copy import CopyReport
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target import admin as target_admin
from pynvmf.target.limits import copy_limits
from pynvmf.target.subsystem import Namespace, Subsystem
from tests.protocol.conftest import RAW_SUBNQN, RawTarget, RawTargetFactory
from tests.support.raw import Completion, RawQueue

pytestmark = pytest.mark.timeout(60)

COPY = 0x19
SC_CMD_SIZE_LIMIT_EXCEEDED = 0x183  # SCT 1h (command specific), SC 83h
SC_INCOMPATIBLE_NS_OR_FORMAT = 0x185  # SCT 1h (command specific), SC 85h
SC_OVERLAPPING_IO_RANGE = 0x187  # SCT 1h (command specific), SC 87h
HOST_BEHAVIOR = 0x16  # Feature Identifier: Host Behavior Support
HOST_BEHAVIOR_SIZE = 512
CDFE_2_3 = 1 << 2 | 1 << 3  # CDFE bits enabling descriptor formats 2 and 3
MAX_IO = 1 << 20  # the target's MDTS: reads back go in pieces of this size
CAPSULE_HLEN = 72  # CapsuleCmd PDU header: 8-byte common header + 64-byte SQE
CAPSULE_RESP_LEN = 24  # CapsuleResp PDU: 8-byte common header + 16-byte CQE

# The default layout: two 512-byte namespaces and a 4096-byte one, all in memory.
LAYOUT = {1: (512, 8192), 2: (512, 2048), 3: (4096, 256)}
# A large, sparse layout for the limits (ranges as long as MSSRL and MCL allow).
BIG_LAYOUT = {1: (512, 270_000), 2: (4096, 33_000)}


# -- building commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rng:
    """A source range: `nlb` blocks (1's based) from `slba`; `snsid` for formats 2/3."""

    slba: int
    nlb: int
    snsid: int = 0


def descriptor_size(desfmt: int) -> int:
    return 40 if desfmt in (1, 3) else 32


def descriptors(ranges: Sequence[Rng], desfmt: int) -> bytes:
    size = descriptor_size(desfmt)
    buf = bytearray(size * len(ranges))
    for i, r in enumerate(ranges):
        off = i * size
        if desfmt in (2, 3):
            struct.pack_into("<I", buf, off, r.snsid)
        struct.pack_into("<QH", buf, off + 8, r.slba, (r.nlb - 1) & 0xFFFF)
    return bytes(buf)


def cdw12(nr: int, desfmt: int, *, fua: bool = False) -> int:
    """NR (0's based) in bits 7:0, DESFMT in bits 11:8, FUA in bit 30."""
    return (nr - 1) & 0xFF | desfmt << 8 | (1 << 30 if fua else 0)


def host_behavior(cdfe: int, *, acre: int = 0, filler: bytes = b"") -> bytes:
    """A Host Behavior Support structure: ACRE in byte 0, CDFE in bytes 5:4, `filler`
    in the reserved bytes from 6 on."""
    buf = bytearray(HOST_BEHAVIOR_SIZE)
    buf[0] = acre
    struct.pack_into("<H", buf, 4, cdfe)
    buf[6 : 6 + len(filler)] = filler
    return bytes(buf)


async def set_host_behavior(admin: RawQueue, data: bytes, *, inline: bool = True) -> Completion:
    return await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=HOST_BEHAVIOR, data=data, inline=inline)


async def get_host_behavior(admin: RawQueue, *, sel: int = 0) -> Completion:
    return await admin.cmd(
        AdminOpcode.GET_FEATURES, cdw10=HOST_BEHAVIOR | sel << 8, read_len=HOST_BEHAVIOR_SIZE
    )


async def copy(
    io: RawQueue,
    nsid: int,
    sdlba: int,
    ranges: Sequence[Rng],
    desfmt: int = 0,
    *,
    fua: bool = False,
    nr: int | None = None,
    data: bytes | None = None,
    inline: bool | None = None,
) -> Completion:
    """One Copy command; `nr` and `data` override what `ranges` would give."""
    return await io.cmd(
        COPY,
        nsid=nsid,
        cdw10=sdlba & 0xFFFFFFFF,
        cdw11=sdlba >> 32,
        cdw12=cdw12(len(ranges) if nr is None else nr, desfmt, fua=fua),
        data=descriptors(ranges, desfmt) if data is None else data,
        inline=inline,
    )


# -- the target and its model --------------------------------------------------------------------


@dataclass
class CopyTarget:
    rt: RawTarget
    subsystem: Subsystem
    admin: RawQueue
    io: RawQueue
    models: dict[int, bytearray] = field(repr=False)  # large: keep reprs cheap
    reports: list[CopyReport] = field(default_factory=list)

    def block_size(self, nsid: int) -> int:
        return self.subsystem.namespaces[nsid].block_size

    def apply(self, nsid: int, sdlba: int, ranges: Sequence[Rng]) -> None:
        """The model of a successful copy: all sources read first, then written."""
        bs = self.block_size(nsid)
        data = b"".join(
            bytes(self.models[r.snsid or nsid][r.slba * bs : (r.slba + r.nlb) * bs]) for r in ranges
        )
        self.models[nsid][sdlba * bs : sdlba * bs + len(data)] = data

    async def device_bytes(self, nsid: int) -> bytes:
        device = self.subsystem.namespaces[nsid].device
        buf = bytearray(device.capabilities.size)
        await device.read(0, memoryview(buf))
        return bytes(buf)

    async def assert_models(self, *, wire: bool = True) -> None:
        """Every namespace holds its model: read back over the connection (or, for the
        big sparse namespaces, from the device)."""
        for nsid, model in self.models.items():
            if wire:
                bs = self.block_size(nsid)
                step = MAX_IO // bs
                for lba in range(0, len(model) // bs, step):
                    nlb = min(step, len(model) // bs - lba)
                    done = await self.io.read(nsid, lba, nlb, bs)
                    assert done.status == 0, done
                    assert done.data == model[lba * bs : (lba + nlb) * bs], (nsid, lba)
            else:
                assert await self.device_bytes(nsid) == model, nsid


def memory_subsystem(layout: dict[int, tuple[int, int]]) -> Subsystem:
    subsystem = Subsystem(RAW_SUBNQN)
    for nsid, (bs, nblocks) in layout.items():
        device = MemoryDevice(bs * nblocks, bs)
        subsystem.add_namespace(Namespace.create(RAW_SUBNQN, nsid, device, f"memory:{nsid}"))
    return subsystem


async def start(
    factory: RawTargetFactory,
    monkeypatch: pytest.MonkeyPatch,
    subsystem: Subsystem,
    *,
    fill: bool = True,
    wrap_io: Callable[[RawQueue], Any] | None = None,
    cdfe: int = CDFE_2_3,
) -> CopyTarget:
    """A target with `subsystem`, each namespace filled with random data (or left zero),
    an admin and an I/O queue, descriptor formats `cdfe` enabled (2 and 3 unless told
    otherwise), and every CopyReport of the planner recorded."""
    models: dict[int, bytearray] = {}
    for nsid, ns in subsystem.namespaces.items():
        size = ns.device.capabilities.size
        if fill:
            models[nsid] = bytearray(random.Random(nsid).randbytes(size))
            await ns.device.write(0, models[nsid])
        else:
            models[nsid] = bytearray(size)
    rt = await factory([subsystem])
    admin = await rt.admin()
    if cdfe:
        done = await set_host_behavior(admin, host_behavior(cdfe))
        assert done.status == 0, done
    io = await rt.open()
    if wrap_io is not None:
        wrap_io(io)
    await io.handshake()
    done = await io.connect(
        RAW_SUBNQN, qid=1, cntlid=admin.cntlid, inline_limit=rt.port.transport.inline_data_size
    )
    assert done.status == 0, done
    ct = CopyTarget(rt, subsystem, admin, io, models)
    # What the planner did for each Copy: the Copy handler either has one range done
    # without a plan (copy_one_range_now at once, or copy_one_range) or plans and runs
    # the copy.
    real_one = block_copy.copy_one_range
    real_run = block_copy.CopyPlan.run

    async def one(*args: Any, **kwargs: Any) -> CopyReport | None:
        report = await real_one(*args, **kwargs)
        if report is not None:
            ct.reports.append(report)
        return report

    async def run(plan: block_copy.CopyPlan, **kwargs: Any) -> CopyReport:
        report = await real_run(plan, **kwargs)
        ct.reports.append(report)
        return report

    monkeypatch.setattr(block_copy, "copy_one_range", one)
    monkeypatch.setattr(block_copy.CopyPlan, "run", run)
    _UNWATCH.append(
        block_copy.watch_copies_now(lambda n: ct.reports.append(CopyReport(native_blocks=n)))
    )
    return ct


# What stops each test's watch of the copies done at once (copy_one_range_now).
_UNWATCH: list[Callable[[], None]] = []


@pytest.fixture(autouse=True)
def _unwatch() -> Iterator[None]:
    yield
    while _UNWATCH:
        _UNWATCH.pop()()


@pytest.fixture
async def ct(raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch) -> CopyTarget:
    return await start(raw_target_factory, monkeypatch, memory_subsystem(LAYOUT))


@pytest.fixture
async def fresh(
    raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch
) -> CopyTarget:
    """The default layout on a controller whose host has enabled no descriptor format."""
    return await start(raw_target_factory, monkeypatch, memory_subsystem(LAYOUT), cdfe=0)


@pytest.fixture
async def big(raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch) -> CopyTarget:
    return await start(raw_target_factory, monkeypatch, memory_subsystem(BIG_LAYOUT), fill=False)


def assert_refused(done: Completion, status: int) -> None:
    assert (done.status, done.dnr) == (status, True), done


# -- what the controller advertises ---------------------------------------------------------------


async def test_identify_controller_advertises_copy(ct: CopyTarget) -> None:
    done = await ct.admin.identify(I.Cns.CTRL)
    assert done.status == 0, done
    (oncs,) = struct.unpack_from("<H", done.data, 520)
    (ocfs,) = struct.unpack_from("<H", done.data, 534)
    assert oncs & 1 << 8, f"ONCS {oncs:#x} lacks the Copy bit"
    assert ocfs == 0xF  # descriptor formats 0, 1, 2 and 3
    ctrl = I.IdentifyController.unpack(done.data)
    assert (ctrl.oncs, ctrl.ocfs) == (oncs, ocfs)


@pytest.mark.parametrize("block_size", [512, 4096])
async def test_identify_namespace_copy_limits(
    raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch, block_size: int
) -> None:
    ct = await start(
        raw_target_factory, monkeypatch, memory_subsystem({1: (block_size, 64)}), fill=False
    )
    done = await ct.admin.identify(I.Cns.NS, nsid=1)
    assert done.status == 0, done
    mssrl, mcl, msrc = struct.unpack_from("<HIB", done.data, 74)
    limits = copy_limits(block_size)
    assert (mssrl, mcl, msrc + 1) == (
        limits.max_range_blocks,
        limits.max_blocks,
        limits.max_ranges,
    )
    assert msrc == 127  # 128 source ranges per command
    assert 0 < mssrl <= mcl  # one range may not exceed the whole copy
    ns = I.IdentifyNamespace.unpack(done.data)
    assert (ns.mssrl, ns.mcl, ns.msrc) == (mssrl, mcl, msrc)
    assert ns.block_size == block_size


async def test_commands_supported_and_effects_lists_copy(ct: CopyTarget) -> None:
    done = await ct.admin.get_log_page(L.LogPageId.CMD_EFFECTS, L.CMD_EFFECTS_LOG_SIZE)
    assert done.status == 0, done
    entry = struct.unpack_from("<I", done.data, 1024 + 4 * COPY)[0]  # I/O Command Supported
    assert entry & L.CmdEffects.CSUPP
    assert entry & L.CmdEffects.LBCC  # it changes logical block content
    assert L.CmdEffectsLog.unpack(done.data).iocs[IoOpcode.COPY] == entry
    assert IoOpcode.COPY == COPY


def test_descriptor_layout_matches_the_project_packer() -> None:
    """The project's pack/parse agree with the descriptors built here from the spec."""
    ranges = [Rng(0x1122334455, 7, 3), Rng(9, 65536, 0xFFFFFFFE)]
    for desfmt in (0, 1, 2, 3):
        ours = descriptors(ranges, desfmt)
        assert len(ours) == 2 * C.COPY_DESCRIPTOR_SIZE[desfmt]
        cross = desfmt in (2, 3)
        theirs = [C.CopyRange(r.slba, r.nlb, r.snsid if cross else 0) for r in ranges]
        assert C.pack_copy_ranges(theirs, desfmt) == ours
        assert C.parse_copy_ranges(ours, desfmt, 2) == theirs
        assert C.copy_cdw12(2, desfmt, fua=True) == cdw12(2, desfmt, fua=True)


# -- data: formats 0 and 1 -----------------------------------------------------------------------


@pytest.mark.parametrize("inline", [True, False], ids=["in-capsule", "via-r2t"])
async def test_format0_single_range(ct: CopyTarget, inline: bool) -> None:
    ranges = [Rng(100, 37)]
    r2t = ct.io.counters.r2t
    done = await copy(ct.io, 1, 6000, ranges, inline=inline)
    assert done.status == 0, done
    assert ct.io.counters.r2t - r2t == (0 if inline else 1)
    ct.apply(1, 6000, ranges)
    await ct.assert_models()
    assert ct.reports == [CopyReport(native_blocks=37)]
    assert ct.subsystem.stats.copy_cmds == 1
    assert ct.subsystem.stats.copy_bytes == 37 * 512


async def test_format0_128_ranges_of_mixed_lengths(ct: CopyTarget) -> None:
    rng = random.Random(128)
    ranges = [Rng(rng.randrange(0, 4000), rng.choice((1, 2, 3, 8, 17, 31))) for _ in range(128)]
    total = sum(r.nlb for r in ranges)
    assert total < 8192 - 4096
    done = await copy(ct.io, 1, 4096, ranges)
    assert done.status == 0, done
    ct.apply(1, 4096, ranges)
    await ct.assert_models()
    assert ct.reports == [CopyReport(native_blocks=total)]


@pytest.mark.parametrize("nsid", [1, 3])
async def test_format1_ranges(ct: CopyTarget, nsid: int) -> None:
    nblocks = LAYOUT[nsid][1]
    ranges = [Rng(nblocks - 5, 5), Rng(0, 1), Rng(10, 20), Rng(10, 20)]
    done = await copy(ct.io, nsid, nblocks // 2, ranges, desfmt=1)
    assert done.status == 0, done
    ct.apply(nsid, nblocks // 2, ranges)
    await ct.assert_models()


@pytest.mark.parametrize("vwc", [True, False], ids=["fua-bit", "write-cache-off"])
async def test_copy_with_fua_on_a_file_namespace_reaches_the_file(
    raw_target_factory: RawTargetFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    vwc: bool,
) -> None:
    path = tmp_path / "ns1.img"
    device = FileDevice(path, 512, size_bytes=1 << 20, create=True)
    subsystem = Subsystem(RAW_SUBNQN)
    subsystem.add_namespace(Namespace.create(RAW_SUBNQN, 1, device, f"file:{path}"))
    ct = await start(raw_target_factory, monkeypatch, subsystem)
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    if not vwc:  # no volatile write cache: every copy is written through
        off = await ct.admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.VOLATILE_WC, cdw11=0)
        assert off.status == 0, off
    ranges = [Rng(1000, 24), Rng(3, 5), Rng(1900, 100)]
    done = await copy(ct.io, 1, 200, ranges, desfmt=1, fua=vwc)
    assert done.status == 0, done
    ct.apply(1, 200, ranges)
    assert device.fileno() in synced  # made durable before the completion was sent
    assert os.pread(device.fileno(), 1 << 20, 0) == ct.models[1]
    await ct.assert_models()
    await ct.rt.aclose()
    assert device.closed
    assert path.read_bytes() == ct.models[1]


# -- formats 2 and 3: a source namespace per range -------------------------------------------------


@pytest.mark.parametrize("desfmt", [2, 3])
async def test_cross_namespace_copy_is_emulated(ct: CopyTarget, desfmt: int) -> None:
    ranges = [Rng(2000, 48, snsid=2), Rng(0, 3, snsid=2), Rng(700, 64, snsid=2)]
    done = await copy(ct.io, 1, 5000, ranges, desfmt)
    assert done.status == 0, done
    ct.apply(1, 5000, ranges)
    await ct.assert_models()
    assert ct.reports == [CopyReport(emulated_blocks=115)]


@pytest.mark.parametrize("desfmt", [2, 3])
async def test_same_namespace_by_snsid_is_native(ct: CopyTarget, desfmt: int) -> None:
    ranges = [Rng(10, 16, snsid=2), Rng(40, 4, snsid=2)]
    done = await copy(ct.io, 2, 1000, ranges, desfmt)
    assert done.status == 0, done
    ct.apply(2, 1000, ranges)
    await ct.assert_models()
    assert ct.reports == [CopyReport(native_blocks=20)]


async def test_mixed_source_namespaces_in_one_copy(ct: CopyTarget) -> None:
    ranges = [Rng(5, 10, snsid=1), Rng(2040, 8, snsid=2), Rng(7000, 30, snsid=1)]
    done = await copy(ct.io, 1, 3000, ranges, desfmt=2)
    assert done.status == 0, done
    ct.apply(1, 3000, ranges)
    await ct.assert_models()
    assert ct.reports == [CopyReport(native_blocks=40, emulated_blocks=8)]


@pytest.mark.parametrize("desfmt", [2, 3])
@pytest.mark.parametrize(
    ("snsid", "status"),
    [
        (0, Status.INVALID_NS),
        (0xFFFFFFFF, Status.INVALID_NS),
        (1025, Status.INVALID_NS),  # beyond NN (1024): not a valid NSID
        (9, Status.INVALID_FIELD),  # valid, but no namespace behind it (inactive)
    ],
    ids=["zero", "broadcast", "beyond-nn", "inactive"],
)
async def test_source_namespace_that_names_none_is_refused(
    ct: CopyTarget, snsid: int, status: int, desfmt: int
) -> None:
    """NVM Command Set 1.2: an invalid SNSID, 0 or FFFFFFFFh is Invalid Namespace or
    Format; an inactive one is Invalid Field in Command."""
    ranges = [Rng(0, 8, snsid=1), Rng(0, 8, snsid=snsid)]
    done = await copy(ct.io, 1, 100, ranges, desfmt)
    assert_refused(done, status)
    await ct.assert_models()
    assert ct.reports == []


@pytest.mark.parametrize("desfmt", [2, 3])
@pytest.mark.parametrize(
    ("ranges", "sdlba"),
    [
        ([Rng(0, 8, snsid=1), Rng(96, 8, snsid=1)], 100),  # ends inside the destination
        ([Rng(0, 8, snsid=1), Rng(104, 2, snsid=1)], 100),  # inside it
        ([Rng(90, 40, snsid=1)], 100),  # covers its start and end
    ],
    ids=["tail", "inside", "covers"],
)
async def test_formats_2_3_refuse_a_source_overlapping_the_destination(
    ct: CopyTarget, ranges: list[Rng], sdlba: int, desfmt: int
) -> None:
    """With source NSIDs, overlap in the destination namespace is prohibited
    (Overlapping I/O Range); formats 0/1 accept it (the overlap tests below)."""
    done = await copy(ct.io, 1, sdlba, ranges, desfmt)
    assert_refused(done, SC_OVERLAPPING_IO_RANGE)
    await ct.assert_models()
    assert ct.reports == []


@pytest.mark.parametrize("desfmt", [2, 3])
async def test_formats_2_3_same_lbas_in_another_namespace_do_not_overlap(
    ct: CopyTarget, desfmt: int
) -> None:
    # Overlap means the same LBAs of the same namespace: LBAs 100.. of namespace 2 don't.
    ranges = [Rng(100, 16, snsid=2), Rng(0, 4, snsid=1)]
    done = await copy(ct.io, 1, 100, ranges, desfmt)
    assert done.status == 0, done
    ct.apply(1, 100, ranges)
    await ct.assert_models()


@pytest.mark.parametrize(
    ("dst", "src", "desfmt"),
    [(1, 3, 3), (1, 3, 2), (3, 2, 2)],
    ids=["512<-4096-f3", "512<-4096-f2", "4096<-512-f2"],
)
async def test_source_namespace_of_another_block_size_is_incompatible(
    ct: CopyTarget, dst: int, src: int, desfmt: int
) -> None:
    # A compatible range first: refusing the command must leave it uncopied too.
    ranges = [Rng(0, 4, snsid=dst), Rng(0, 1, snsid=src)]
    done = await copy(ct.io, dst, 100, ranges, desfmt)
    assert_refused(done, SC_INCOMPATIBLE_NS_OR_FORMAT)
    assert (done.status >> 8, done.status & 0xFF) == (1, 0x85)  # command specific
    await ct.assert_models()
    assert ct.reports == []
    assert ct.subsystem.stats.copy_cmds == 0


# -- Host Behavior Support: formats 2 and 3 only once enabled -------------------------------------


@pytest.mark.parametrize("desfmt", [2, 3])
@pytest.mark.parametrize("inline", [True, False], ids=["in-capsule", "via-r2t"])
async def test_format_2_or_3_before_the_host_enables_it_is_invalid_field(
    fresh: CopyTarget, desfmt: int, inline: bool
) -> None:
    ranges = [Rng(2000, 48, snsid=2), Rng(10, 8, snsid=1)]
    r2t = fresh.io.counters.r2t
    done = await copy(fresh.io, 1, 5000, ranges, desfmt, inline=inline)
    assert_refused(done, Status.INVALID_FIELD)
    assert fresh.io.counters.r2t == r2t  # refused before the descriptors were asked for
    await fresh.assert_models()
    assert fresh.reports == []
    # Formats 0 and 1 need no enabling.
    done = await copy(fresh.io, 1, 5000, [Rng(10, 8)], desfmt - 2)
    assert done.status == 0, done


async def test_enabling_a_format_in_cdfe_makes_copy_accept_it(fresh: CopyTarget) -> None:
    ranges = [Rng(2000, 48, snsid=2), Rng(10, 8, snsid=1)]
    done = await set_host_behavior(fresh.admin, host_behavior(1 << 2))
    assert done.status == 0, done
    done = await copy(fresh.io, 1, 5000, ranges, desfmt=2)
    assert done.status == 0, done
    fresh.apply(1, 5000, ranges)
    # Format 3 was not enabled along with it.
    done = await copy(fresh.io, 1, 6000, ranges, desfmt=3)
    assert_refused(done, Status.INVALID_FIELD)
    await fresh.assert_models()
    done = await set_host_behavior(fresh.admin, host_behavior(CDFE_2_3), inline=False)
    assert done.status == 0, done
    done = await copy(fresh.io, 1, 6000, ranges, desfmt=3)
    assert done.status == 0, done
    fresh.apply(1, 6000, ranges)
    # And disabling it again refuses it again.
    done = await set_host_behavior(fresh.admin, host_behavior(1 << 3))
    assert done.status == 0, done
    done = await copy(fresh.io, 1, 7000, ranges, desfmt=2)
    assert_refused(done, Status.INVALID_FIELD)
    await fresh.assert_models()
    assert fresh.subsystem.stats.copy_cmds == 2


async def test_cdfe_belongs_to_one_controller(ct: CopyTarget) -> None:
    """Another association of the same host starts with nothing enabled."""
    other = await ct.rt.admin()
    io = await ct.rt.io_queue(other, 1)
    done = await copy(io, 1, 100, [Rng(0, 8, snsid=2)], desfmt=2)
    assert_refused(done, Status.INVALID_FIELD)
    got = await get_host_behavior(other)
    assert got.status == 0 and got.data == bytes(HOST_BEHAVIOR_SIZE), got
    done = await copy(ct.io, 1, 100, [Rng(0, 8, snsid=2)], desfmt=2)  # still enabled here
    assert done.status == 0, done
    ct.apply(1, 100, [Rng(0, 8, snsid=2)])
    await ct.assert_models()


@pytest.mark.parametrize(
    ("ocfs", "cdfe"),
    [(0xF, 1 << 4), (0xF, CDFE_2_3 | 1 << 15), (0x7, 1 << 3), (0x3, 1 << 2)],
    ids=["bit4", "bit15", "format3-not-in-ocfs", "format2-not-in-ocfs"],
)
async def test_cdfe_for_a_format_the_controller_lacks_is_invalid_field(
    fresh: CopyTarget, monkeypatch: pytest.MonkeyPatch, ocfs: int, cdfe: int
) -> None:
    monkeypatch.setattr(target_admin, "OCFS", ocfs)
    done = await fresh.admin.identify(I.Cns.CTRL)
    assert I.IdentifyController.unpack(done.data).ocfs == ocfs  # what the host is told
    before = host_behavior(0, acre=1)
    done = await set_host_behavior(fresh.admin, before)
    assert done.status == 0, done
    done = await set_host_behavior(fresh.admin, host_behavior(cdfe))
    assert_refused(done, Status.INVALID_FIELD)
    got = await get_host_behavior(fresh.admin)
    assert got.status == 0 and got.data == before, got  # nothing of it was taken
    done = await copy(fresh.io, 1, 100, [Rng(0, 8, snsid=2)], desfmt=2)
    assert_refused(done, Status.INVALID_FIELD)
    await fresh.assert_models()


async def test_get_features_host_behavior_returns_what_was_set(fresh: CopyTarget) -> None:
    got = await get_host_behavior(fresh.admin)
    assert got.status == 0 and got.data == bytes(HOST_BEHAVIOR_SIZE), got  # zeros at first
    data = host_behavior(CDFE_2_3, acre=1, filler=random.Random(16).randbytes(506))
    done = await set_host_behavior(fresh.admin, data)
    assert done.status == 0, done
    got = await get_host_behavior(fresh.admin)
    assert got.status == 0 and got.data == data, got
    (cdfe,) = struct.unpack_from("<H", got.data, 4)
    assert cdfe == CDFE_2_3
    # Default and saved values (not saveable): zeros; the feature is changeable.
    for sel in (1, 2):
        got = await get_host_behavior(fresh.admin, sel=sel)
        assert got.status == 0 and got.data == bytes(HOST_BEHAVIOR_SIZE), (sel, got)
    caps = await fresh.admin.cmd(AdminOpcode.GET_FEATURES, cdw10=HOST_BEHAVIOR | 3 << 8)
    assert caps.status == 0 and caps.result == 0x4, caps


@pytest.mark.parametrize("length", [0, 256, 511, 513, 4096])
async def test_set_host_behavior_of_the_wrong_length_is_refused(
    fresh: CopyTarget, length: int
) -> None:
    data = host_behavior(CDFE_2_3).ljust(length, b"\0")[:length]
    done = await fresh.admin.cmd(
        AdminOpcode.SET_FEATURES, cdw10=HOST_BEHAVIOR, data=data if length else None
    )
    assert_refused(done, Status.SGL_INVALID_DATA)
    got = await get_host_behavior(fresh.admin)
    assert got.data == bytes(HOST_BEHAVIOR_SIZE), got
    short = await fresh.admin.cmd(AdminOpcode.GET_FEATURES, cdw10=HOST_BEHAVIOR, read_len=511)
    assert_refused(short, Status.SGL_INVALID_DATA)


async def test_saving_host_behavior_is_refused(fresh: CopyTarget) -> None:
    done = await fresh.admin.cmd(
        AdminOpcode.SET_FEATURES, cdw10=HOST_BEHAVIOR | 1 << 31, data=host_behavior(CDFE_2_3)
    )
    assert_refused(done, Status.FEATURE_NOT_SAVEABLE)
    done = await copy(fresh.io, 1, 100, [Rng(0, 8, snsid=2)], desfmt=2)
    assert_refused(done, Status.INVALID_FIELD)


# -- limits and invalid commands: refused before any data moves -----------------------------------


async def identify_limits(ct: CopyTarget, nsid: int) -> tuple[int, int, int]:
    """(MSSRL, MCL, MSRC + 1) as the host is told."""
    done = await ct.admin.identify(I.Cns.NS, nsid=nsid)
    assert done.status == 0, done
    mssrl, mcl, msrc = struct.unpack_from("<HIB", done.data, 74)
    return mssrl, mcl, msrc + 1


@pytest.mark.parametrize("nr", [129, 256])
async def test_more_ranges_than_msrc_allows_fetches_nothing(ct: CopyTarget, nr: int) -> None:
    _mssrl, _mcl, max_ranges = await identify_limits(ct, 1)
    assert nr > max_ranges
    r2t = ct.io.counters.r2t
    ranges = [Rng(i, 1) for i in range(nr)]
    done = await copy(ct.io, 1, 4000, ranges, inline=False)
    assert_refused(done, SC_CMD_SIZE_LIMIT_EXCEEDED)
    assert ct.io.counters.r2t == r2t  # the descriptors were never asked for
    # The maximum itself is fine, also through R2T.
    done = await copy(ct.io, 1, 4000, ranges[:max_ranges], inline=False)
    assert done.status == 0, done
    assert ct.io.counters.r2t == r2t + 1
    ct.apply(1, 4000, ranges[:max_ranges])
    await ct.assert_models()


@pytest.mark.parametrize("nsid", [1, 2])
async def test_range_longer_than_mssrl_is_refused(big: CopyTarget, nsid: int) -> None:
    mssrl, _mcl, _nr = await identify_limits(big, nsid)
    bs, nblocks = BIG_LAYOUT[nsid]
    # NLB cannot say more than 65536 blocks: an MSSRL of 65535 is exceeded by that.
    too_long = [Rng(0, min(mssrl + 1, 0x10000))]
    ranges = [Rng(5, 1), *too_long]
    total = sum(r.nlb for r in ranges)
    assert total <= nblocks - total  # sources and destination inside the namespace
    done = await copy(big.io, nsid, nblocks - total, ranges)
    assert_refused(done, SC_CMD_SIZE_LIMIT_EXCEEDED)
    assert big.reports == []
    # Exactly MSSRL is accepted.
    big.models[nsid][:bs] = b"\xa5" * bs
    await big.subsystem.namespaces[nsid].device.write(0, big.models[nsid][:bs])
    done = await copy(big.io, nsid, nblocks - mssrl, [Rng(0, mssrl)])
    assert done.status == 0, done
    big.apply(nsid, nblocks - mssrl, [Rng(0, mssrl)])
    await big.assert_models(wire=False)


@pytest.mark.parametrize("nsid", [1, 2])
async def test_total_longer_than_mcl_is_refused(big: CopyTarget, nsid: int) -> None:
    mssrl, mcl, _nr = await identify_limits(big, nsid)
    bs, nblocks = BIG_LAYOUT[nsid]
    per = min(mssrl, mcl // 2)
    ranges = [Rng(i * per, per) for i in range(mcl // per)]
    rest = mcl - per * len(ranges)
    if rest:
        ranges.append(Rng(len(ranges) * per, rest))
    assert sum(r.nlb for r in ranges) == mcl and 2 * mcl + 1 <= nblocks
    over = [*ranges, Rng(0, 1)]
    done = await copy(big.io, nsid, mcl, over)
    assert_refused(done, SC_CMD_SIZE_LIMIT_EXCEEDED)
    assert big.reports == []
    # Exactly MCL is accepted.
    marker = random.Random(nsid).randbytes(bs)
    big.models[nsid][(mcl - 1) * bs : mcl * bs] = marker
    await big.subsystem.namespaces[nsid].device.write(mcl - 1, marker)
    done = await copy(big.io, nsid, mcl, ranges)
    assert done.status == 0, done
    big.apply(nsid, mcl, ranges)
    await big.assert_models(wire=False)


@pytest.mark.parametrize("desfmt", [4, 5, 0xF])
async def test_unsupported_descriptor_format_is_invalid_field(ct: CopyTarget, desfmt: int) -> None:
    done = await copy(ct.io, 1, 100, [Rng(0, 8)], desfmt=desfmt)
    assert_refused(done, Status.INVALID_FIELD)
    await ct.assert_models()


@pytest.mark.parametrize(
    ("desfmt", "nr", "nbytes"),
    [(0, 2, 32), (0, 1, 64), (0, 1, 40), (1, 1, 32), (2, 3, 64), (3, 2, 64), (0, 1, 0)],
)
@pytest.mark.parametrize("inline", [True, False], ids=["in-capsule", "via-r2t"])
async def test_sgl_length_not_matching_the_ranges(
    ct: CopyTarget, desfmt: int, nr: int, nbytes: int, inline: bool
) -> None:
    data = descriptors([Rng(0, 1, snsid=1)] * 4, desfmt)[:nbytes].ljust(nbytes, b"\0")
    r2t = ct.io.counters.r2t
    done = await copy(ct.io, 1, 100, [], desfmt, nr=nr, data=data, inline=inline and bool(data))
    assert_refused(done, Status.SGL_INVALID_DATA)
    assert ct.io.counters.r2t == r2t
    await ct.assert_models()


@pytest.mark.parametrize("desfmt", [0, 2])
async def test_source_range_past_the_end_is_lba_out_of_range(ct: CopyTarget, desfmt: int) -> None:
    nsid = 1 if desfmt == 0 else 2
    end = LAYOUT[nsid][1]
    bad = [Rng(end - 2, 4, snsid=nsid), Rng(end, 1, snsid=nsid), Rng(2**64 - 1, 1, snsid=nsid)]
    for wrong in bad:
        ranges = [Rng(0, 8, snsid=nsid), wrong, Rng(8, 8, snsid=nsid)]
        done = await copy(ct.io, 1, 50, ranges, desfmt)
        assert_refused(done, Status.LBA_OUT_OF_RANGE)
    await ct.assert_models()  # the destination (and everything else) untouched
    assert ct.reports == []


@pytest.mark.parametrize("sdlba", [8192 - 15, 8192 - 1, 8192, 2**64 - 1])
async def test_destination_past_the_end_is_lba_out_of_range(ct: CopyTarget, sdlba: int) -> None:
    done = await copy(ct.io, 1, sdlba, [Rng(0, 8), Rng(100, 8)])
    assert_refused(done, Status.LBA_OUT_OF_RANGE)
    await ct.assert_models()
    assert ct.reports == []
    # The last possible destination is fine.
    done = await copy(ct.io, 1, 8192 - 16, [Rng(0, 8), Rng(100, 8)])
    assert done.status == 0, done


OVERLAP_CASES = {
    "forward-single": ([Rng(100, 64)], 110),
    "backward-single": ([Rng(110, 64)], 100),
    "later-source-overlaps-earlier-destination": ([Rng(400, 16), Rng(204, 16)], 200),
    "chain-forward": ([Rng(300, 8), Rng(308, 8), Rng(316, 8)], 304),
    "chain-backward": ([Rng(308, 8), Rng(316, 8)], 300),
    "same-source-twice-overwritten": ([Rng(500, 10), Rng(500, 10), Rng(505, 3)], 503),
}


@pytest.mark.parametrize("case", list(OVERLAP_CASES))
async def test_overlapping_source_and_destination_read_all_sources_first(
    ct: CopyTarget, case: str
) -> None:
    ranges, sdlba = OVERLAP_CASES[case]
    done = await copy(ct.io, 1, sdlba, ranges)
    assert done.status == 0, done
    ct.apply(1, sdlba, ranges)
    await ct.assert_models()


# -- what crosses the connection -------------------------------------------------------------------


@dataclass
class WireCount:
    sent: int = 0
    received: int = 0

    def attach(self, queue: RawQueue) -> None:
        """Count every byte the queue writes to and reads from its socket."""
        write = queue.writer.write
        readexactly = queue.reader.readexactly

        def counting_write(data: bytes | bytearray | memoryview) -> None:
            self.sent += len(data)
            write(data)

        async def counting_readexactly(n: int) -> bytes:
            data = await readexactly(n)
            self.received += len(data)
            return data

        queue.writer.write = counting_write  # type: ignore[method-assign]
        queue.reader.readexactly = counting_readexactly  # type: ignore[method-assign]


async def test_offloaded_copy_moves_only_the_command_over_the_wire(
    raw_target_factory: RawTargetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    wire = WireCount()
    ct = await start(
        raw_target_factory,
        monkeypatch,
        memory_subsystem({1: (512, 1 << 17)}),  # 64 MiB
        fill=False,
        wrap_io=wire.attach,
    )
    device = ct.subsystem.namespaces[1].device
    source = random.Random(16).randbytes(32 << 20)
    await device.write(0, source)
    ct.models[1][: len(source)] = source
    per = (2 << 20) // 512  # 2 MiB ranges
    order = list(range(16))
    random.Random(1).shuffle(order)
    ranges = [Rng(i * per, per) for i in order]
    sent, received = wire.sent, wire.received
    assert sent > 0 and received > 0  # the counters see the connection
    counters = (ct.io.counters.r2t, ct.io.counters.h2c_data, ct.io.counters.c2h_data)

    done = await copy(ct.io, 1, 1 << 16, ranges)

    assert done.status == 0, done
    copied = 16 * (2 << 20)
    moved = (wire.sent - sent) + (wire.received - received)
    assert moved < copied // 100
    # Precisely: one capsule carrying the 16 descriptors, one response.
    assert wire.sent - sent == CAPSULE_HLEN + 16 * 32
    assert wire.received - received == CAPSULE_RESP_LEN
    assert (ct.io.counters.r2t, ct.io.counters.h2c_data, ct.io.counters.c2h_data) == counters
    assert ct.reports == [CopyReport(native_blocks=copied // 512)]
    ct.apply(1, 1 << 16, ranges)
    await ct.assert_models(wire=False)
