"""What hosts other than pynvmf's own found, replayed with their bytes against the live
in-process target: the Linux host's discard buffer, SPDK's reuse of an Asynchronous Event
Request's command identifier at detach, and NVMe 2.0 hosts that select every I/O command
set (CC.CSS = 110b) and then read the command set specific structures.
"""

from __future__ import annotations

import struct

import pytest

from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import IOCS_COMBINATION_REJECTED, Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.controller import CAP
from tests.protocol.conftest import (
    RAW_NS1_BLOCK,
    RAW_NS1_BLOCKS,
    RAW_NS2_BLOCK,
    RawTarget,
    RawTargetFactory,
    raw_memory_subsystem,
)
from tests.support.raw import CC_ENABLE

pytestmark = pytest.mark.timeout(60)

DSM_RANGE = struct.Struct("<IIQ")  # context attributes, length in LBAs, starting LBA
PAGE = 4096


def linux_discard_capsule_data(slba: int, nlb: int) -> bytes:
    """The data of the Dataset Management command the Linux 6.1 host sends for
    `blkdiscard -o ... -l ...` (captured from the guest): one range in a whole page."""
    return DSM_RANGE.pack(0, nlb, slba).ljust(PAGE, b"\0")


async def test_linux_discard_of_one_range_in_a_page_deallocates_exactly_it(
    raw_target: RawTarget,
) -> None:
    host = await raw_target.host()
    io = host.io[0]
    # 2048..2175 as the guest's `blkdiscard -o 1048576 -l 65536`: NR 0, AD, a 4 KiB SGL.
    before, inside, after = 2040, range(2048, 2176), 2176
    pattern = b"\x5a" * (144 * RAW_NS1_BLOCK)
    assert (await io.write(1, before, pattern[: 144 * RAW_NS1_BLOCK], RAW_NS1_BLOCK)).status == 0
    done = await io.cmd(
        IoOpcode.DATASET_MANAGEMENT,
        nsid=1,
        cdw10=0,
        cdw11=1 << 2,
        data=linux_discard_capsule_data(inside.start, len(inside)),
    )
    assert done.status == 0, done
    back = await io.read(1, before, 144, RAW_NS1_BLOCK)
    assert back.status == 0
    # DLFEAT says deallocated blocks read as zeroes; the blocks around them are intact.
    assert back.data[: 8 * RAW_NS1_BLOCK] == pattern[: 8 * RAW_NS1_BLOCK]
    assert back.data[8 * RAW_NS1_BLOCK : 136 * RAW_NS1_BLOCK] == bytes(128 * RAW_NS1_BLOCK)
    assert back.data[136 * RAW_NS1_BLOCK :] == pattern[: 8 * RAW_NS1_BLOCK]
    assert after == inside.stop


async def test_discard_buffer_too_short_or_over_mdts_is_refused_and_touches_nothing(
    raw_target: RawTarget,
) -> None:
    host = await raw_target.host()
    io = host.io[0]
    pattern = b"\xc3" * (16 * RAW_NS1_BLOCK)
    assert (await io.write(1, 100, pattern, RAW_NS1_BLOCK)).status == 0
    # NR 1 (two ranges) in 16 bytes: one range short.
    short = await io.cmd(
        IoOpcode.DATASET_MANAGEMENT,
        nsid=1,
        cdw10=1,
        cdw11=1 << 2,
        data=DSM_RANGE.pack(0, 8, 100),
    )
    assert (short.status, short.dnr) == (Status.SGL_INVALID_DATA, True)
    # A buffer larger than a command may carry (MDTS) is refused before it is fetched.
    r2t = io.counters.r2t
    huge = await io.cmd(
        IoOpcode.DATASET_MANAGEMENT,
        nsid=1,
        cdw10=0,
        cdw11=1 << 2,
        data=DSM_RANGE.pack(0, 8, 100).ljust((1 << 20) + PAGE, b"\0"),
        inline=False,
    )
    assert (huge.status, huge.dnr) == (Status.SGL_INVALID_DATA, True)
    assert io.counters.r2t == r2t
    assert (await io.read(1, 100, 16, RAW_NS1_BLOCK)).data == pattern


async def test_discard_range_list_through_r2t_in_a_larger_buffer(raw_target: RawTarget) -> None:
    host = await raw_target.host()
    io = host.io[0]
    assert (await io.write(1, 300, b"\x11" * (8 * RAW_NS1_BLOCK), RAW_NS1_BLOCK)).status == 0
    ranges = DSM_RANGE.pack(0, 4, 300) + DSM_RANGE.pack(0, 2, 306)
    done = await io.cmd(
        IoOpcode.DATASET_MANAGEMENT,
        nsid=1,
        cdw10=1,
        cdw11=1 << 2,
        data=ranges.ljust(2 * PAGE, b"\0"),
        inline=False,
    )
    assert done.status == 0, done
    assert io.counters.r2t == 1
    back = (await io.read(1, 300, 8, RAW_NS1_BLOCK)).data
    keep = b"\x11" * (2 * RAW_NS1_BLOCK)
    assert back == bytes(4 * RAW_NS1_BLOCK) + keep + bytes(2 * RAW_NS1_BLOCK)


# -- SPDK's host at detach -------------------------------------------------------------------


# Admin SQEs of spdk_nvme_identify (v25.09) against pynvmf, captured at the target: the four
# AERs it arms (CIDs 0-3, AER_CID0 with the CID patched), and the three commands it sends
# at detach after completing those AERs itself, each with CID 3: Property Get CC, Property
# Set CC.SHN = 01b (CC 0x464061: CSS 110b, EN), Property Get CSTS.
AER_CID0 = bytes.fromhex(
    "0c40000000000000000000000000000000000000000000000000000000000000"
    "000000000000005a000000000000000000000000000000000000000000000000"
)
SPDK_DETACH = [
    bytes.fromhex(
        "7f40030004000000000000000000000000000000000000000000000000000000"
        "000000000000005a000000001400000000000000000000000000000000000000"
    ),
    bytes.fromhex(
        "7f40030000000000000000000000000000000000000000000000000000000000"
        "000000000000005a000000001400000061404600000000000000000000000000"
    ),
    bytes.fromhex(
        "7f40030004000000000000000000000000000000000000000000000000000000"
        "000000000000005a000000001c00000000000000000000000000000000000000"
    ),
]


def _with_cid(sqe: bytes, cid: int) -> bytes:
    return sqe[:2] + struct.pack("<H", cid) + sqe[4:]


async def test_spdk_detach_reuses_the_cid_of_an_outstanding_aer(raw_target: RawTarget) -> None:
    """SPDK completes its Asynchronous Event Requests itself when it detaches and sends its
    shutdown Property Get/Set/Get with one of their CIDs: the target must answer them (it
    answered Command ID Conflict, and SPDK logged "Failed to read the CC register")."""
    admin = await raw_target.admin(enable=False)
    await admin.enable(0x460061)  # as SPDK enables a controller that offers CC.CSS 110b
    aers = [admin.submit_nowait(_with_cid(AER_CID0, cid)) for cid in range(4)]
    # A round trip, so that the AERs are parked before their CIDs come back.
    assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    for cid in range(4):
        admin.abandon(cid)
    assert all(fut.cancelled() for fut in aers)
    get_cc, set_shn, get_csts = SPDK_DETACH
    cc = await admin.submit_nowait(get_cc)
    assert (cc.status, cc.result & 0xFFFFFFFF) == (0, 0x460061)
    assert (await admin.submit_nowait(set_shn)).status == 0
    csts = await admin.submit_nowait(get_csts)
    assert csts.status == 0
    assert csts.result & C.CSTS_SHST_MASK == C.CSTS_SHST_COMPLETE
    # A fresh AER may reuse a retired one's CID too, and stays outstanding (AERL counts
    # only the live ones).
    again = [admin.submit_nowait(_with_cid(AER_CID0, cid)) for cid in range(4)]
    assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    assert not any(fut.done() for fut in again)


# -- NVMe 2.0 I/O command set selection --------------------------------------------------------

CC_ALL_IOCS = CC_ENABLE | C.CC_CSS_IOCS << C.CC_CSS_SHIFT


async def test_cap_advertises_the_nvm_command_set_and_io_command_sets(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin(enable=False)
    cap = (await admin.prop_get(C.PROP_CAP, size=8)).result
    assert cap == CAP
    assert cap & C.CAP_CSS_NVM and cap & C.CAP_CSS_IOCS
    assert not cap & C.CAP_CSS_ADMIN_ONLY


@pytest.mark.parametrize(
    ("css", "ready"),
    [
        (C.CC_CSS_NVM, True),
        (C.CC_CSS_IOCS, True),
        (C.CC_CSS_ADMIN_ONLY, False),  # CAP.CSS bit 44 is not set
        (0b001, False),
        (0b101, False),
    ],
)
async def test_cc_css_selection(raw_target: RawTarget, css: int, ready: bool) -> None:
    admin = await raw_target.admin(enable=False)
    cc = CC_ENABLE & ~(0x7 << C.CC_CSS_SHIFT) | css << C.CC_CSS_SHIFT
    assert (await admin.prop_set(C.PROP_CC, cc)).status == 0
    csts = (await admin.prop_get(C.PROP_CSTS)).result
    assert csts & (C.CSTS_RDY | C.CSTS_CFS) == (C.CSTS_RDY if ready else C.CSTS_CFS)
    keep_alive = await admin.cmd(AdminOpcode.KEEP_ALIVE)
    if ready:
        assert keep_alive.status == 0
    else:
        assert (keep_alive.status, keep_alive.dnr) == (Status.CMD_SEQ_ERROR, True)


async def test_all_io_command_sets_host_reads_the_structures_and_does_io(
    raw_target: RawTarget,
) -> None:
    """The sequence of an NVMe 2.0 host (SPDK's, the Linux host's with CAP.CSS bit 6):
    CC.CSS = 110b, CNS 1Ch, the I/O Command Set Profile, CNS 06h/05h/08h/03h, then I/O."""
    admin = await raw_target.admin(enable=False)
    await admin.enable(CC_ALL_IOCS)
    iocs = await admin.identify(I.Cns.IOCS, cntid=admin.cntlid)
    assert iocs.status == 0
    assert I.IoCommandSetList.unpack(iocs.data).vectors == [I.IocsVector.NVM]
    profile = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.IOCS_PROFILE, cdw11=0)
    assert profile.status == 0
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.IOCS_PROFILE)
    assert (got.status, got.result & 0x1FF) == (0, 0)

    nvm_ctrl = await admin.cmd(
        AdminOpcode.IDENTIFY, cdw10=I.Cns.CS_CTRL, cdw11=I.Csi.NVM << 24, read_len=4096
    )
    assert nvm_ctrl.status == 0
    limits = I.IdentifyControllerNvm.unpack(nvm_ctrl.data)
    # Write Zeroes carries 65536 blocks at most: 32 MiB of 512-byte blocks = 2^13 pages.
    assert limits.wzsl == 13 and limits.vsl == 13
    assert limits.dmrl == 0 and limits.dmrsl == 0 and limits.dmsl == 0

    nvm_ns = await admin.cmd(
        AdminOpcode.IDENTIFY, nsid=1, cdw10=I.Cns.CS_NS, cdw11=I.Csi.NVM << 24, read_len=4096
    )
    assert nvm_ns.status == 0
    ns_nvm = I.IdentifyNamespaceNvm.unpack(nvm_ns.data, formats=1)
    assert (ns_nvm.lbstm, ns_nvm.pic, ns_nvm.elbaf) == (0, 0, [0])

    indep = await admin.identify(I.Cns.CS_INDEP_NS, nsid=1)
    assert indep.status == 0
    info = I.IdentifyNamespaceIndependent.unpack(indep.data)
    assert info.nstat & I.Nstat.READY and info.nmic & I.NMIC_SHARED
    ns = I.IdentifyNamespace.unpack((await admin.identify(I.Cns.NS, nsid=1)).data)
    assert info.nsfeat == ns.nsfeat

    descs = I.NsIdDescriptorList.unpack((await admin.identify(I.Cns.NS_DESC_LIST, nsid=1)).data)
    assert descs.get(I.Nidt.CSI) == bytes([I.Csi.NVM])
    active = await admin.cmd(
        AdminOpcode.IDENTIFY, cdw10=I.Cns.CS_NS_ACTIVE_LIST, cdw11=I.Csi.NVM << 24, read_len=4096
    )
    assert I.NsIdList.unpack(active.data).nsids == [1, 2]

    effects = await admin.get_log_page(L.LogPageId.CMD_EFFECTS, L.CMD_EFFECTS_LOG_SIZE)
    assert effects.status == 0
    log = L.CmdEffectsLog.unpack(effects.data)
    assert log.iocs[IoOpcode.READ] & L.CmdEffects.CSUPP
    assert log.acs[AdminOpcode.IDENTIFY] & L.CmdEffects.CSUPP

    io = await raw_target.io_queue(admin, 1)
    data = bytes(range(256)) * 2
    assert (await io.write(1, 7, data, RAW_NS1_BLOCK)).status == 0
    assert (await io.read(1, 7, 1, RAW_NS1_BLOCK)).data == data


async def test_command_set_specific_requests_for_other_command_sets(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin(enable=False)
    await admin.enable(CC_ALL_IOCS)
    for cns, nsid in ((I.Cns.CS_CTRL, 0), (I.Cns.CS_NS, 1), (I.Cns.CS_NS_ACTIVE_LIST, 0)):
        done = await admin.cmd(
            AdminOpcode.IDENTIFY, nsid=nsid, cdw10=cns, cdw11=I.Csi.ZNS << 24, read_len=4096
        )
        assert (done.status, done.dnr) == (Status.INVALID_FIELD, True), cns
    # The effects log of another command set (CSI in CDW14): the admin commands and no I/O
    # command, as QEMU answers; nvme-cli's `effects-log` (blktests nvme/025) asks for it.
    numd = L.CMD_EFFECTS_LOG_SIZE // 4 - 1
    zns = await admin.cmd(
        AdminOpcode.GET_LOG_PAGE,
        cdw10=L.LogPageId.CMD_EFFECTS | numd << 16,
        cdw14=I.Csi.ZNS << 24,
        read_len=L.CMD_EFFECTS_LOG_SIZE,
    )
    assert zns.status == 0
    zns_log = L.CmdEffectsLog.unpack(zns.data)
    assert zns_log.acs[AdminOpcode.IDENTIFY] & L.CmdEffects.CSUPP
    assert not any(zns_log.iocs)
    # Another controller's combinations: only this one's (or FFFFh) are known.
    other = await admin.identify(I.Cns.IOCS, cntid=admin.cntlid + 1)
    assert (other.status, other.dnr) == (Status.INVALID_FIELD, True)
    assert (await admin.identify(I.Cns.IOCS, cntid=0xFFFF)).status == 0


async def test_identify_of_inactive_and_invalid_nsids(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    for cns in (I.Cns.NS, I.Cns.CS_INDEP_NS):
        inactive = await admin.identify(cns, nsid=3)
        assert (inactive.status, inactive.data) == (0, bytes(4096)), cns
        for nsid in (0, 0xFFFFFFFF, 1 << 20):
            invalid = await admin.identify(cns, nsid=nsid)
            assert (invalid.status, invalid.dnr) == (Status.INVALID_NS, True), (cns, nsid)


async def test_iocs_profile_rejects_unknown_combinations_and_changes_after_io_queues(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin(enable=False)
    await admin.enable(CC_ALL_IOCS)
    bad = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.IOCS_PROFILE, cdw11=1)
    assert (bad.status, bad.dnr) == (IOCS_COMBINATION_REJECTED, True)
    await raw_target.io_queue(admin, 1)
    late = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.IOCS_PROFILE, cdw11=0)
    assert (late.status, late.dnr) == (Status.CMD_SEQ_ERROR, True)
    # Number of Queues is fixed once an I/O queue exists, too.
    queues = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.NUM_QUEUES, cdw11=0)
    assert (queues.status, queues.dnr) == (Status.CMD_SEQ_ERROR, True)


def test_namespace_blocks_fit_the_discard_tests() -> None:
    assert RAW_NS1_BLOCKS > 2200


# -- Copy formats 2h/3h enabled by the target's configuration ----------------------------------


async def test_configured_copy_formats_are_enabled_on_every_new_controller(
    raw_target_factory: RawTargetFactory,
) -> None:
    subsystem = raw_memory_subsystem(copy_formats=C.COPY_CDFE_FORMATS)
    rt = await raw_target_factory(subsystems=[subsystem])
    host = await rt.host()
    admin, io = host.admin, host.io[0]
    for sel in (0, 1):  # current and default values both carry the configured formats
        got = await admin.cmd(
            AdminOpcode.GET_FEATURES, cdw10=FeatureId.HOST_BEHAVIOR | sel << 8, read_len=512
        )
        assert got.status == 0 and C.host_behavior_cdfe(got.data) == C.COPY_CDFE_FORMATS
    data = bytes(range(256)) * 2
    assert (await io.write(2, 0, data * 8, RAW_NS2_BLOCK)).status == 0
    ranges = C.pack_copy_ranges([C.CopyRange(0, 1, snsid=2)], 2)
    done = await io.cmd(IoOpcode.COPY, nsid=2, cdw10=100, cdw12=C.copy_cdw12(1, 2), data=ranges)
    assert done.status == 0, done
    assert (await io.read(2, 100, 1, RAW_NS2_BLOCK)).data == (data * 8)[:RAW_NS2_BLOCK]


async def test_copy_formats_outside_2_and_3_are_refused(raw_target: RawTarget) -> None:
    with pytest.raises(ChangeError, match="copy_formats"):
        raw_target.target.add_subsystem("nqn.2024-01.io.pynvmf.test:bad", copy_formats=1 << 1)
