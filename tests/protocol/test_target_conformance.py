"""The live in-process target over real sockets, driven by the raw client.

Bad input on one connection must earn the right answer (a C2HTermReq and a
close, or an NVMe status) and never disturb anyone else; Fabrics, admin,
keep-alive, discovery and data path behave as a Linux host expects.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import DISCOVERY_NQN, AdminOpcode, FabricsType, FeatureId, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.controller import AERL, CAP
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.tcp.target import TransportConfig
from tests.protocol.conftest import (
    RAW_ALLOWED_HOSTNQN,
    RAW_NS1_BLOCK,
    RAW_NS1_BLOCKS,
    RAW_NS2_BLOCK,
    RAW_NS2_BLOCKS,
    RAW_RESTRICTED_NQN,
    RAW_SUBNQN,
    RawTarget,
    RawTargetFactory,
    raw_default_subsystems,
)
from tests.support.raw import (
    CC_ENABLE,
    HOSTID,
    HOSTNQN,
    RawHost,
    RawQueue,
    capsule,
    h2c_data,
    icreq,
    rw_sqe,
)

pytestmark = pytest.mark.timeout(60)

DSM_RANGE = struct.Struct("<IIQ")  # context attributes, length in LBAs, starting LBA

FES = P.FatalError
INLINE = 16384  # the default in-capsule data size of a port

# Target bugs these tests found (fixes reported with them); drop a mark once its fix is in.


GOOD_LBAS = range(5000, 6000)  # the good hosts' area of namespace 1; the scenarios stay out


async def assert_good(host: RawHost, seed: int) -> None:
    """The host's I/O queue writes and reads back correctly: in-capsule and via R2T."""
    rng = random.Random(seed)
    io = host.io[0]
    for nblocks in (8, 64):  # 4 KiB in the capsule, 32 KiB through R2T
        slba = rng.randrange(GOOD_LBAS.start, GOOD_LBAS.stop - nblocks)
        data = rng.randbytes(nblocks * RAW_NS1_BLOCK)
        done = await io.write(1, slba, data, RAW_NS1_BLOCK)
        assert done.status == 0, done
        back = await io.read(1, slba, nblocks, RAW_NS1_BLOCK)
        assert back.status == 0, back
        assert back.data == data
    keep_alive = await host.admin.cmd(AdminOpcode.KEEP_ALIVE)
    assert keep_alive.status == 0, keep_alive


# -- bad input isolation -----------------------------------------------------------------------


async def garbage_random_bytes(rt: RawTarget) -> None:
    for seed in range(4):
        q = await rt.open()
        q.send(random.Random(seed).randbytes(512))
        term = await q.expect_term()
        fes, _fei = term.term_fields()
        assert fes in (FES.INVALID_HEADER_FIELD, FES.PDU_SEQUENCE_ERROR, FES.UNSUPPORTED_PARAMETER)


async def garbage_truncated_header_then_close(rt: RawTarget) -> None:
    q = await rt.open()
    q.send(icreq()[:5])
    q.writer.write_eof()
    assert await q.expect_eof() == b""  # no ICResp, no TermReq: the target just closes
    # The same after a handshake, with half a capsule header.
    q = await rt.open()
    await q.handshake()
    q.send(capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1))[:40])
    q.writer.write_eof()
    assert await q.expect_eof() == b""


async def garbage_wrong_pdu_type(rt: RawTarget) -> None:
    q = await rt.open()
    await q.handshake()
    bad = P.COMMON_HEADER.pack(P.PduType.CAPSULE_RESP, 0, 24, 0, 24) + bytes(16)
    q.send(bad)
    term = await q.expect_term()
    assert term.term_fields() == (FES.INVALID_HEADER_FIELD, P.OFFSET_TYPE)
    assert term.data[:24] == bad


async def garbage_huge_plen(rt: RawTarget) -> None:
    q = await rt.open()
    await q.handshake()
    sqe = C.build_sqe(IoOpcode.WRITE, 1, 1)
    q.send(P.COMMON_HEADER.pack(P.PduType.CAPSULE_CMD, 0, 72, 72, 0xFFFFFFF0) + sqe)
    term = await q.expect_term()
    assert term.term_fields() == (FES.INVALID_HEADER_FIELD, P.OFFSET_PLEN)


async def garbage_h2c_data_unknown_ttag(rt: RawTarget) -> None:
    q = await rt.open()
    await q.handshake()
    q.send(h2c_data(1, 0x1234, 0, bytes(4096)))
    term = await q.expect_term()
    assert term.term_fields() == (FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG)


async def garbage_command_on_unconnected_queue(rt: RawTarget) -> None:
    q = await rt.open()
    await q.handshake()
    done = await q.identify(I.Cns.CTRL)
    assert (done.status, done.dnr, done.data) == (Status.CMD_SEQ_ERROR, True, bytes(4096))
    # The queue may still be connected after that.
    connected = await q.connect(RAW_SUBNQN)
    assert connected.status == 0, connected


async def garbage_unknown_admin_opcode(rt: RawTarget) -> None:
    admin = await rt.admin()
    for opcode in (0x03, 0x07, 0xC1):
        done = await admin.cmd(opcode)
        assert (done.status, done.dnr) == (Status.INVALID_OPCODE, True), (opcode, done)


async def garbage_unknown_io_opcode(rt: RawTarget) -> None:
    host = await rt.host()
    for opcode in (0x03, 0x7E, 0x83):
        done = await host.io[0].cmd(opcode, nsid=1)
        assert (done.status, done.dnr) == (Status.INVALID_OPCODE, True), (opcode, done)


async def garbage_lba_out_of_range(rt: RawTarget) -> None:
    host = await rt.host()
    io = host.io[0]
    last = RAW_NS1_BLOCKS - 1
    pattern = b"\xa5" * (8 * RAW_NS1_BLOCK)
    assert (await io.write(1, last - 7, pattern, RAW_NS1_BLOCK)).status == 0
    for slba, nblocks in ((last, 2), (RAW_NS1_BLOCKS, 1), (1 << 63, 1), (last - 7, 64)):
        read = await io.read(1, slba, nblocks, RAW_NS1_BLOCK)
        assert (read.status, read.dnr, read.data) == (
            Status.LBA_OUT_OF_RANGE,
            True,
            bytes(nblocks * RAW_NS1_BLOCK),
        )
        r2t_before = io.counters.r2t
        write = await io.write(1, slba, b"\xff" * nblocks * RAW_NS1_BLOCK, RAW_NS1_BLOCK)
        assert (write.status, write.dnr) == (Status.LBA_OUT_OF_RANGE, True)
        assert io.counters.r2t == r2t_before  # a write that fails never asks for its data
    zeroes = await io.cmd(IoOpcode.WRITE_ZEROES, nsid=1, cdw10=last, cdw12=1)
    assert (zeroes.status, zeroes.dnr) == (Status.LBA_OUT_OF_RANGE, True)
    # Deallocate two ranges, the second past the end: the first must stay untouched too.
    ranges = DSM_RANGE.pack(0, 8, last - 7) + DSM_RANGE.pack(0, 2, last)
    dsm = await io.cmd(IoOpcode.DATASET_MANAGEMENT, nsid=1, cdw10=1, cdw11=1 << 2, data=ranges)
    assert (dsm.status, dsm.dnr) == (Status.LBA_OUT_OF_RANGE, True)
    back = await io.read(1, last - 7, 8, RAW_NS1_BLOCK)
    assert back.data == pattern  # nothing was written


async def garbage_nlb_disagrees_with_sgl(rt: RawTarget) -> None:
    host = await rt.host()
    io = host.io[0]
    # In-capsule: 2 blocks announced, 1 block of data.
    sqe = rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 0, 2, RAW_NS1_BLOCK, inline=True)
    done = await io.submit_nowait(sqe, b"\x01" * RAW_NS1_BLOCK)
    assert (done.status, done.dnr) == (Status.SGL_INVALID_DATA, True)
    # Through R2T, 2 blocks announced and 32 KiB described: the target must not ask
    # for the data of a command that fails.
    done = await io.cmd(IoOpcode.WRITE, nsid=1, cdw12=1, data=bytes(32768), inline=False)
    assert (done.status, done.dnr) == (Status.SGL_INVALID_DATA, True)
    assert io.counters.r2t == 0
    # A read whose buffer does not match NLB.
    done = await io.cmd(IoOpcode.READ, nsid=1, cdw12=0, read_len=4096)
    assert (done.status, done.dnr) == (Status.SGL_INVALID_DATA, True)
    back = await io.read(1, 0, 2, RAW_NS1_BLOCK)
    assert back.data == bytes(2 * RAW_NS1_BLOCK)


async def garbage_inactive_nsid(rt: RawTarget) -> None:
    host = await rt.host()
    io = host.io[0]
    for nsid in (0, 3, 0xFFFFFFFE):
        read = await io.read(nsid, 0, 1, RAW_NS1_BLOCK)
        assert (read.status, read.dnr) == (Status.INVALID_NS, True), (nsid, read)
        write = await io.write(nsid, 0, bytes(RAW_NS1_BLOCK), RAW_NS1_BLOCK)
        assert (write.status, write.dnr) == (Status.INVALID_NS, True), (nsid, write)
        flush = await io.cmd(IoOpcode.FLUSH, nsid=nsid)
        assert (flush.status, flush.dnr) == (Status.INVALID_NS, True), (nsid, flush)


async def garbage_malformed_pdu_on_a_connected_io_queue(rt: RawTarget) -> None:
    host = await rt.host()
    io = host.io[0]
    assert (await io.write(1, 0, bytes(RAW_NS1_BLOCK), RAW_NS1_BLOCK)).status == 0
    io.send(P.COMMON_HEADER.pack(P.PduType.R2T, 0, 24, 0, 24) + bytes(16))
    await io.expect_eof()
    assert io.term is not None
    assert io.term.term_fields() == (FES.INVALID_HEADER_FIELD, P.OFFSET_TYPE)
    # Its controller lives on: the admin queue works and the I/O queue may reconnect.
    assert (await host.admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    again = await rt.io_queue(host.admin, 1)
    assert (await again.read(1, 0, 1, RAW_NS1_BLOCK)).status == 0


async def garbage_h2c_term_req(rt: RawTarget) -> None:
    q = await rt.open()
    await q.handshake()
    q.send(P.pack_term_req(P.PduType.H2C_TERM_REQ, FES.INVALID_HEADER_FIELD, 0))
    assert await q.expect_eof() == b""  # the target closes without a word


async def garbage_close_in_the_middle_of_a_write(rt: RawTarget) -> None:
    host = await rt.host()
    io = host.io[0]
    await io.detach()
    sqe = rw_sqe(IoOpcode.WRITE, 77, 1, 4000, 64, 64 * RAW_NS1_BLOCK)
    io.send(io.capsule(sqe))
    r2t = await io.recv_pdu()
    assert r2t.type == P.PduType.R2T
    cccid, ttag, offset, length = r2t.data_fields()
    assert (cccid, offset, length) == (77, 0, 64 * RAW_NS1_BLOCK)
    io.send(h2c_data(77, ttag, 0, b"\xee" * 4096, last=False))
    io.writer.write_eof()
    # The target closes its end once it has dropped the queue.
    assert await io.expect_eof() == b""
    # The association survives the loss of its I/O queue; the half write never lands.
    assert (await host.admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    again = await rt.io_queue(host.admin, 1)
    back = await again.read(1, 4000, 64, RAW_NS1_BLOCK)
    assert back.status == 0 and back.data == bytes(64 * RAW_NS1_BLOCK)


async def garbage_host_that_does_not_read(rt: RawTarget) -> None:
    """A host that submits many reads and never reads the answers: the target stops
    reading from it (flow control) without stalling anyone else."""
    host = await rt.host()
    io = host.io[0]
    await io.detach()
    count = 300  # 19 MiB of answers: more than the socket buffers hold
    for cid in range(count):
        io.send(io.capsule(rw_sqe(IoOpcode.READ, cid, 1, 0, 128, 128 * RAW_NS1_BLOCK)))
    # Meanwhile another host works normally.
    other = await rt.host()
    await assert_good(other, 4)
    # Now read everything: every read completes.
    done = set()
    while len(done) < count:
        pdu = await io.recv_pdu()
        if pdu.type == P.PduType.CAPSULE_RESP:
            cqe = pdu.cqe()
            assert cqe.status == 0
            done.add(cqe.cid)
        else:
            assert pdu.type == P.PduType.C2H_DATA and len(pdu.data) == 128 * RAW_NS1_BLOCK
    assert done == set(range(count))


async def garbage_prp_or_bad_fuse(rt: RawTarget) -> None:
    """Fabrics commands describe data with SGLs (PSDT 01b or 10b): a PRP or the reserved
    PSDT is Invalid Field. A Write cannot start a fused operation, nor end one that was not
    started (Missing Fused Command); FUSE 11b is reserved, and the admin queue has no fused
    operations (Invalid Field). Nothing runs."""
    host = await rt.host()
    io = host.io[0]
    data = b"\x99" * RAW_NS1_BLOCK
    cases = [
        (0x00, Status.INVALID_FIELD),  # PRP
        (0xC0, Status.INVALID_FIELD),  # reserved PSDT
        (0x40 | 0x01, Status.FUSED_MISSING),  # a Write as the first command
        (0x40 | 0x02, Status.FUSED_MISSING),  # a second command without a first
        (0x40 | 0x03, Status.INVALID_FIELD),  # reserved FUSE
    ]
    for flags, status in cases:
        sqe = bytearray(rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 2000, 1, len(data), inline=True))
        sqe[1] = flags
        done = await io.submit_nowait(bytes(sqe), data)
        assert (done.status, done.dnr) == (status, True), (hex(flags), done)
    back = await io.read(1, 2000, 1, RAW_NS1_BLOCK)
    assert back.data == bytes(RAW_NS1_BLOCK)
    for flags in (0x00, 0x41, 0x42):
        sqe = bytearray(C.build_sqe(AdminOpcode.KEEP_ALIVE, host.admin.next_cid()))
        sqe[1] = flags
        done = await host.admin.submit_nowait(bytes(sqe))
        assert (done.status, done.dnr) == (Status.INVALID_FIELD, True), hex(flags)


GARBAGE: dict[str, Callable[[RawTarget], Awaitable[None]]] = {
    "random_bytes": garbage_random_bytes,
    "truncated_header_then_close": garbage_truncated_header_then_close,
    "wrong_pdu_type": garbage_wrong_pdu_type,
    "huge_plen": garbage_huge_plen,
    "h2c_data_unknown_ttag": garbage_h2c_data_unknown_ttag,
    "command_on_unconnected_queue": garbage_command_on_unconnected_queue,
    "unknown_admin_opcode": garbage_unknown_admin_opcode,
    "unknown_io_opcode": garbage_unknown_io_opcode,
    "lba_out_of_range": garbage_lba_out_of_range,
    "nlb_disagrees_with_sgl": garbage_nlb_disagrees_with_sgl,
    "inactive_nsid": garbage_inactive_nsid,
    "malformed_pdu_on_connected_io_queue": garbage_malformed_pdu_on_a_connected_io_queue,
    "h2c_term_req": garbage_h2c_term_req,
    "close_in_the_middle_of_a_write": garbage_close_in_the_middle_of_a_write,
    "host_that_does_not_read": garbage_host_that_does_not_read,
    "prp_or_bad_fuse": garbage_prp_or_bad_fuse,
}


@pytest.mark.parametrize(
    "kind",
    list(GARBAGE),
)
async def test_bad_input_is_answered_and_isolated(raw_target: RawTarget, kind: str) -> None:
    good = await raw_target.host()
    await assert_good(good, 0)
    await GARBAGE[kind](raw_target)
    await assert_good(good, 1)
    # The target still accepts new hosts.
    fresh = await raw_target.host()
    await assert_good(fresh, 2)


# -- Fabrics -----------------------------------------------------------------------------------


async def test_connect_to_an_unknown_subsystem_points_at_subnqn(raw_target: RawTarget) -> None:
    q = await raw_target.open()
    done = await q.connect("nqn.2024-01.io.pynvmf.test:nope")
    assert (done.status, done.dnr) == (Status.CONNECT_INVALID_PARAM, True)
    assert done.result & 0xFFFFFFFF == 1 << 16 | C.CONNECT_DATA_OFFSET_SUBNQN


async def test_connect_from_a_host_not_allowed_is_invalid_host(raw_target: RawTarget) -> None:
    q = await raw_target.open()
    done = await q.connect(RAW_RESTRICTED_NQN, hostnqn=HOSTNQN)
    assert (done.status, done.dnr) == (Status.CONNECT_INVALID_HOST, True)
    allowed = await raw_target.open()
    done = await allowed.connect(RAW_RESTRICTED_NQN, hostnqn=RAW_ALLOWED_HOSTNQN)
    assert done.status == 0, done


async def test_io_connect_with_an_unknown_cntlid_points_at_cntlid(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    q = await raw_target.open()
    done = await q.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid + 100)
    assert (done.status, done.dnr) == (Status.CONNECT_INVALID_PARAM, True)
    assert done.result & 0xFFFFFFFF == 1 << 16 | C.CONNECT_DATA_OFFSET_CNTLID


async def test_io_connect_before_cc_en_is_a_command_sequence_error(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin(enable=False)
    q = await raw_target.open()
    done = await q.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)
    assert (done.status, done.dnr) == (Status.CMD_SEQ_ERROR, True)
    await admin.enable()
    q = await raw_target.open()
    done = await q.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)
    assert done.status == 0, done


async def test_admin_commands_before_cc_en_are_a_command_sequence_error(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin(enable=False)
    early = await admin.identify(I.Cns.CTRL)
    assert (early.status, early.dnr) == (Status.CMD_SEQ_ERROR, True)
    await admin.enable()
    done = await admin.identify(I.Cns.CTRL)
    assert done.status == 0 and len(done.data) == 4096


async def test_io_connect_must_match_the_admin_hostnqn(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    q = await raw_target.open()
    done = await q.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid, hostnqn=RAW_ALLOWED_HOSTNQN)
    assert (done.status, done.dnr) == (Status.CONNECT_INVALID_PARAM, True)
    assert done.result & 0xFFFFFFFF == 1 << 16 | C.CONNECT_DATA_OFFSET_HOSTNQN


async def test_io_connect_with_another_host_id_than_the_admin_queue_is_accepted(
    raw_target: RawTarget,
) -> None:
    # As nvmet and SPDK: the controller is found by subsystem NQN, host NQN and CNTLID.
    admin = await raw_target.admin(hostid=HOSTID)
    other = bytes(range(16))
    io = await raw_target.io_queue(admin, 1, hostid=other)
    data = bytes(range(256)) * 2
    assert (await io.write(1, 3, data, RAW_NS1_BLOCK)).status == 0
    done = await io.read(1, 3, 1, RAW_NS1_BLOCK)
    assert done.status == 0 and done.data == data
    # The controller's Host Identifier is still the admin queue's.
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.HOST_ID, cdw11=1, read_len=16)
    assert got.status == 0 and got.data == HOSTID


async def test_connect_with_invalid_parameters(raw_target: RawTarget) -> None:
    q = await raw_target.open()
    await q.handshake()
    data = C.ConnectData(HOSTID, C.CNTLID_DYNAMIC, RAW_SUBNQN, HOSTNQN).pack()
    # RECFMT 1 is not a format this target knows.
    done = await q.fabrics(FabricsType.CONNECT, cdw10=1, cdw11=31, data=data)
    assert (done.status, done.dnr) == (Status.CONNECT_INCOMPATIBLE_FORMAT, True)
    # SQSIZE 0 (a one-entry queue) is invalid: IATTR 0 (the SQE), IPO the SQSIZE field.
    for sqsize in (0, 0xFFFF):
        done = await q.connect(RAW_SUBNQN, sqsize=sqsize)
        assert (done.status, done.dnr) == (Status.CONNECT_INVALID_PARAM, True)
        assert done.result & 0xFFFFFFFF == C.CONNECT_SQE_OFFSET_SQSIZE
    # An admin Connect must ask for a dynamic controller.
    done = await q.connect(RAW_SUBNQN, cntlid=1)
    assert done.status == Status.CONNECT_INVALID_PARAM
    assert done.result & 0xFFFFFFFF == 1 << 16 | C.CONNECT_DATA_OFFSET_CNTLID
    # Connect data that is not 1024 bytes long.
    cdw10, cdw11, _ = C.ConnectCommand(0, 0, 31, 0, 0).cdws()
    done = await q.fabrics(FabricsType.CONNECT, cdw10=cdw10, cdw11=cdw11, data=data[:512])
    assert (done.status, done.dnr) == (Status.SGL_INVALID_DATA, True)
    # None of that used the queue up: a proper Connect works, a second one does not.
    assert (await q.connect(RAW_SUBNQN)).status == 0
    again = await q.connect(RAW_SUBNQN)
    assert (again.status, again.dnr) == (Status.CMD_SEQ_ERROR, True)


async def test_property_get_cap_and_vs(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(enable=False)
    cap = await admin.prop_get(C.PROP_CAP, size=8)
    assert cap.status == 0 and cap.result == CAP
    assert cap.result & 0xFFFF >= 31  # MQES, 0's based
    assert (cap.result >> 24) & 0xFF > 0  # TO
    assert cap.result >> 37 & 1  # CSS: NVM command set
    vs = await admin.prop_get(C.PROP_VS)
    assert vs.status == 0 and vs.result >= C.nvme_version(1, 3)
    csts = await admin.prop_get(C.PROP_CSTS)
    assert csts.result & C.CSTS_RDY == 0


async def test_set_cc_en_makes_csts_rdy(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(enable=False)
    assert (await admin.prop_set(C.PROP_CC, CC_ENABLE)).status == 0
    cc = await admin.prop_get(C.PROP_CC)
    assert cc.result == CC_ENABLE
    csts = await admin.prop_get(C.PROP_CSTS)
    assert csts.result & (C.CSTS_RDY | C.CSTS_CFS) == C.CSTS_RDY
    # CC.EN back to 0 resets RDY.
    assert (await admin.prop_set(C.PROP_CC, 0)).status == 0
    assert (await admin.prop_get(C.PROP_CSTS)).result & C.CSTS_RDY == 0


async def test_shutdown_notification_reports_shutdown_complete(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    done = await admin.prop_set(C.PROP_CC, CC_ENABLE | 0b01 << C.CC_SHN_SHIFT)
    assert done.status == 0
    csts = await admin.prop_get(C.PROP_CSTS)
    assert csts.result & C.CSTS_SHST_MASK == C.CSTS_SHST_COMPLETE  # SHST = 10b


async def test_identify_controller_fields_a_linux_host_relies_on(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    done = await admin.identify(I.Cns.CTRL)
    assert done.status == 0
    ctrl = I.IdentifyController.unpack(done.data)
    assert ctrl.cntrltype == I.CtrlType.IO
    assert ctrl.maxcmd > 0
    assert ctrl.icdoff == 0
    assert ctrl.ioccsz == (64 + INLINE) // 16
    assert ctrl.iorcsz == 1
    assert ctrl.sgls & 0b11 == I.Sgls.SUPPORTED
    assert ctrl.sgls & I.Sgls.OFFSET  # in-capsule data
    assert ctrl.subnqn == RAW_SUBNQN
    assert ctrl.cntlid == admin.cntlid
    assert ctrl.nn >= 2
    assert ctrl.sqes == I.SQES_NVM and ctrl.cqes == I.CQES_NVM
    assert ctrl.kas > 0
    assert ctrl.mdts > 0


async def test_identify_namespace_reports_size_and_lba_format(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    formats = ((1, RAW_NS1_BLOCK, RAW_NS1_BLOCKS), (2, RAW_NS2_BLOCK, RAW_NS2_BLOCKS))
    for nsid, block, blocks in formats:
        done = await admin.identify(I.Cns.NS, nsid=nsid)
        assert done.status == 0
        ns = I.IdentifyNamespace.unpack(done.data)
        assert (ns.nsze, ns.ncap) == (blocks, blocks)
        assert ns.block_size == block
        assert ns.current_format.lbads == block.bit_length() - 1
        assert ns.metadata_size == 0
    inactive = await admin.identify(I.Cns.NS, nsid=7)
    assert inactive.status == 0 and inactive.data == bytes(4096)
    active = await admin.identify(I.Cns.NS_ACTIVE_LIST)
    assert I.NsIdList.unpack(active.data).nsids == [1, 2]


async def test_commands_supported_and_effects_log_windows(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    full = await admin.get_log_page(L.LogPageId.CMD_EFFECTS, L.CMD_EFFECTS_LOG_SIZE)
    assert full.status == 0
    effects = L.CmdEffectsLog.unpack(full.data)
    csupp = L.CmdEffects.CSUPP
    assert effects.iocs[IoOpcode.READ] & csupp
    assert effects.iocs[IoOpcode.WRITE] & csupp
    assert effects.iocs[IoOpcode.WRITE] & L.CmdEffects.LBCC
    assert effects.acs[AdminOpcode.IDENTIFY] & csupp
    assert effects.acs[0x03] == 0 and effects.iocs[0x03] == 0
    # A window: the I/O entries of Write and Read (IOCS starts at byte 1024).
    window = await admin.get_log_page(L.LogPageId.CMD_EFFECTS, 8, offset=1024 + 4 * 1)
    assert window.status == 0
    assert window.data == full.data[1028:1036]
    # An offset that is not a multiple of 4 is invalid.
    odd = await admin.get_log_page(L.LogPageId.CMD_EFFECTS, 8, offset=1026)
    assert (odd.status, odd.dnr) == (Status.INVALID_FIELD, True)


async def test_error_log_records_a_failed_command(raw_target: RawTarget) -> None:
    host = await raw_target.host()
    failed = await host.admin.cmd(0xC3)
    assert failed.status == Status.INVALID_OPCODE
    out_of_range = await host.io[0].read(1, RAW_NS1_BLOCKS, 1, RAW_NS1_BLOCK)
    assert out_of_range.status == Status.LBA_OUT_OF_RANGE
    page = await host.admin.get_log_page(L.LogPageId.ERROR, 4096)
    assert page.status == 0
    entries = L.ErrorLog.unpack(page.data).entries
    assert len(entries) >= 2
    newest, older = entries[0], entries[1]
    assert newest.error_count > older.error_count
    assert (newest.sqid, newest.cid, newest.opcode, newest.nsid) == (
        1,
        out_of_range.cqe.cid,
        IoOpcode.READ,
        1,
    )
    assert newest.status >> 1 & 0x7FF == Status.LBA_OUT_OF_RANGE
    assert (older.sqid, older.cid, older.opcode) == (0, failed.cqe.cid, 0xC3)
    assert older.status >> 1 & 0x7FF == Status.INVALID_OPCODE
    # The second entry alone, as a window.
    window = await host.admin.get_log_page(L.LogPageId.ERROR, 64, offset=64)
    assert window.data == page.data[64:128]


async def test_number_of_queues_feature(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    done = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.NUM_QUEUES, cdw11=1 | 1 << 16)
    assert done.status == 0
    nsqa, ncqa = done.result & 0xFFFF, done.result >> 16 & 0xFFFF
    assert (nsqa, ncqa) == (1, 1)  # two of each asked for (0's based), and there are more
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.NUM_QUEUES)
    assert got.status == 0 and got.result & 0xFFFFFFFF == done.result & 0xFFFFFFFF
    # Queues up to the allocated number connect; one more does not (IPO: QID in the SQE).
    for qid in range(1, nsqa + 2):
        await raw_target.io_queue(admin, qid)
    q = await raw_target.open()
    beyond = await q.connect(RAW_SUBNQN, qid=nsqa + 2, cntlid=admin.cntlid)
    assert (beyond.status, beyond.dnr) == (Status.CONNECT_INVALID_PARAM, True)
    assert beyond.result & 0xFFFFFFFF == C.CONNECT_SQE_OFFSET_QID
    # 0xFFFF (65536 queues) is invalid.
    bad = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.NUM_QUEUES, cdw11=0xFFFF)
    assert (bad.status, bad.dnr) == (Status.INVALID_FIELD, True)


async def test_get_log_page_beyond_mdts_is_refused(raw_target: RawTarget) -> None:
    """A transfer above MDTS is Invalid Field in Command, for admin commands as well:
    the target must not build (or send) an arbitrarily large log page."""
    admin = await raw_target.admin()
    ident = I.IdentifyController.unpack((await admin.identify(I.Cns.CTRL)).data)
    mdts_bytes = (1 << ident.mdts) * 4096
    c2h_before = admin.counters.c2h_data
    done = await admin.get_log_page(L.LogPageId.ERROR, 2 * mdts_bytes)
    assert (done.status, done.dnr) == (Status.INVALID_FIELD, True)
    assert admin.counters.c2h_data == c2h_before  # no data was sent
    # The largest allowed transfer works.
    done = await admin.get_log_page(L.LogPageId.ERROR, mdts_bytes)
    assert done.status == 0 and len(done.data) == mdts_bytes


async def test_get_features_host_identifier(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    done = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.HOST_ID, cdw11=1, read_len=16)
    assert done.status == 0 and done.data == HOSTID
    # Without a buffer for the 16 bytes, the command fails instead of sending them anyway.
    done = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.HOST_ID, cdw11=1)
    assert (done.status, done.dnr) == (Status.SGL_INVALID_DATA, True)
    assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0


async def test_oncs_says_the_save_and_select_fields_are_supported(raw_target: RawTarget) -> None:
    """The controller answers Get Features' Select field and Set Features' Save field, so
    ONCS bit 4 says so: a host (nvmet does not answer SEL, and says so there) asks for a
    feature's capabilities only where it is set."""
    admin = await raw_target.admin()
    ctrl = I.IdentifyController.unpack((await admin.identify(I.Cns.CTRL)).data)
    assert ctrl.oncs & I.Oncs.SAVE_FEATURES
    caps = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.KATO | 3 << 8)
    assert caps.status == 0 and caps.result & 0x7 == 0x4  # changeable, not saveable
    saved = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.KATO | 1 << 31, cdw11=1)
    assert (saved.status, saved.dnr) == (Status.FEATURE_NOT_SAVEABLE, True)


async def test_keep_alive_timer_feature(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(kato=30000)
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.KATO)
    assert got.status == 0 and got.result & 0xFFFFFFFF == 30000
    done = await admin.cmd(AdminOpcode.SET_FEATURES, cdw10=FeatureId.KATO, cdw11=15000)
    assert done.status == 0
    got = await admin.cmd(AdminOpcode.GET_FEATURES, cdw10=FeatureId.KATO)
    assert got.result & 0xFFFFFFFF == 15000


async def test_async_event_requests_beyond_the_limit_are_refused(raw_target: RawTarget) -> None:
    admin = await raw_target.admin()
    outstanding = [admin.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST) for _ in range(AERL + 1)]
    over = await admin.cmd(AdminOpcode.ASYNC_EVENT_REQUEST)
    assert (over.status, over.dnr) == (Status.ASYNC_EVENT_LIMIT, True)
    # The AERL + 1 allowed ones stay outstanding, and the queue keeps working.
    assert (await admin.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    assert not any(fut.done() for fut in outstanding)
    ident = I.IdentifyController.unpack((await admin.identify(I.Cns.CTRL)).data)
    assert ident.aerl == AERL


# -- keep alive --------------------------------------------------------------------------------


async def test_silent_host_is_disconnected_after_kato(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(kato=500)
    io = await raw_target.io_queue(admin, 1)
    start = time.monotonic()
    await admin.expect_eof(timeout=10)
    elapsed = time.monotonic() - start
    assert elapsed >= 0.4  # not before the timeout (less the setup time already spent)
    await io.expect_eof(timeout=10)  # the whole association goes
    q = await raw_target.open()
    done = await q.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)
    assert done.status == Status.CONNECT_INVALID_PARAM


async def test_keep_alive_every_200ms_keeps_the_connection(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(kato=500)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        done = await admin.cmd(AdminOpcode.KEEP_ALIVE)
        assert done.status == 0
        await asyncio.sleep(0.2)  # keep alive is timed by nature: this is the host's period
    assert not admin.eof
    assert (await admin.identify(I.Cns.CTRL)).status == 0


# -- discovery ---------------------------------------------------------------------------------


async def discovery_log(q: RawQueue) -> L.DiscoveryLogPage:
    head = await q.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
    assert head.status == 0
    header = L.DiscoveryLogHeader.unpack(head.data)
    length = L.DISC_HEADER_SIZE + header.numrec * L.DISC_ENTRY_SIZE
    full = await q.get_log_page(L.LogPageId.DISCOVERY, length)
    assert full.status == 0
    page = L.DiscoveryLogPage.unpack(full.data)
    assert page.genctr == header.genctr
    return page


def entry_keys(page: L.DiscoveryLogPage) -> set[tuple[int, int, str, str, str]]:
    return {(e.subtype, e.adrfam, e.traddr, e.trsvcid, e.subnqn) for e in page.entries}


async def test_discovery_lists_each_port_and_subsystem_the_host_may_use(
    raw_target_factory: RawTargetFactory,
) -> None:
    io_a, io_b = Port("127.0.0.1", 0), Port("127.0.0.1", 0, subsystems=[RAW_SUBNQN])
    disc = Port("127.0.0.1", 0, discovery_only=True)
    rt = await raw_target_factory(raw_default_subsystems(), [io_a, io_b, disc])
    q = await rt.admin(DISCOVERY_NQN, port=disc)
    ident = I.IdentifyController.unpack((await q.identify(I.Cns.CTRL)).data)
    assert ident.cntrltype == I.CtrlType.DISCOVERY
    assert ident.subnqn == DISCOVERY_NQN
    v4 = L.AdrFam.IPV4
    page = await discovery_log(q)
    assert len(page.entries) == 3
    assert entry_keys(page) == {
        (L.SubType.NVME, v4, "127.0.0.1", str(io_a.port), RAW_SUBNQN),
        (L.SubType.NVME, v4, "127.0.0.1", str(io_b.port), RAW_SUBNQN),
        (L.SubType.CURRENT_DISCOVERY, v4, "127.0.0.1", str(disc.port), DISCOVERY_NQN),
    }
    assert all(e.trtype == L.TrType.TCP for e in page.entries)
    # The host allowed on the restricted subsystem also sees it, where it is exposed.
    allowed = await rt.admin(DISCOVERY_NQN, hostnqn=RAW_ALLOWED_HOSTNQN, port=io_a)
    page = await discovery_log(allowed)
    assert entry_keys(page) == {
        (L.SubType.NVME, v4, "127.0.0.1", str(io_a.port), RAW_SUBNQN),
        (L.SubType.NVME, v4, "127.0.0.1", str(io_a.port), RAW_RESTRICTED_NQN),
        (L.SubType.NVME, v4, "127.0.0.1", str(io_b.port), RAW_SUBNQN),
        (L.SubType.CURRENT_DISCOVERY, v4, "127.0.0.1", str(io_a.port), DISCOVERY_NQN),
    }
    # A discovery controller does not serve I/O admin commands.
    assert (await q.identify(I.Cns.NS, nsid=1)).status == Status.INVALID_FIELD
    # And a discovery-only port does not serve I/O subsystems.
    refused = await rt.open(disc)
    done = await refused.connect(RAW_SUBNQN)
    assert done.status == Status.CONNECT_INVALID_PARAM


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
async def test_discovery_and_io_over_ipv6(raw_target_factory: RawTargetFactory) -> None:
    v6 = Port("::1", 0)
    rt = await raw_target_factory(raw_default_subsystems(), [v6])
    q = await rt.admin(DISCOVERY_NQN)
    page = await discovery_log(q)
    v6fam = L.AdrFam.IPV6
    assert entry_keys(page) == {
        (L.SubType.NVME, v6fam, "::1", str(v6.port), RAW_SUBNQN),
        (L.SubType.CURRENT_DISCOVERY, v6fam, "::1", str(v6.port), DISCOVERY_NQN),
    }
    host = await rt.host()
    await assert_good(host, 3)


# -- data integrity ----------------------------------------------------------------------------


async def test_queue_depth_32_on_two_queues_with_random_data(raw_target: RawTarget) -> None:
    host = await raw_target.host(io_queues=2)
    slots_per_queue = 32
    region = RAW_NS1_BLOCKS // (2 * slots_per_queue)  # 128 blocks (64 KiB) per slot

    async def slot(io: RawQueue, index: int) -> int:
        rng = random.Random(index)
        base = index * region
        verified = 0
        for _ in range(3):
            nblocks = rng.choice((1, 8, 32, 33, 64, region))
            slba = base + rng.randrange(0, region - nblocks + 1)
            data = rng.randbytes(nblocks * RAW_NS1_BLOCK)
            done = await io.write(1, slba, data, RAW_NS1_BLOCK)
            assert done.status == 0, done
            back = await io.read(1, slba, nblocks, RAW_NS1_BLOCK)
            assert back.status == 0, back
            assert back.data == data, f"slot {index}: data mismatch at LBA {slba}"
            # Namespace 2 as well, 4 KiB blocks, one block per slot.
            block = rng.randbytes(RAW_NS2_BLOCK)
            assert (await io.write(2, index, block, RAW_NS2_BLOCK)).status == 0
            assert (await io.read(2, index, 1, RAW_NS2_BLOCK)).data == block
            verified += 1
        return verified

    jobs = [
        slot(io, q * slots_per_queue + i)
        for q, io in enumerate(host.io)
        for i in range(slots_per_queue)
    ]
    assert sum(await asyncio.gather(*jobs)) == 3 * len(jobs)
    assert all(io.counters.max_in_flight == slots_per_queue for io in host.io)
    # Writes above the in-capsule size went through R2T; smaller ones in the capsule.
    for io in host.io:
        assert io.counters.r2t > 0
        assert io.counters.in_capsule > 0
    ctrl = raw_target.target.subsystems[RAW_SUBNQN].controllers[host.admin.cntlid]
    assert sum(ctrl.queues[qid].conn.stats.r2t_sent for qid in (1, 2)) == sum(
        io.counters.r2t for io in host.io
    )


async def test_sq_flow_control_disabled(raw_target: RawTarget) -> None:
    admin = await raw_target.admin(DISCOVERY_NQN)
    page = await discovery_log(admin)
    assert all(e.treq & L.Treq.DISABLE_SQFLOW for e in page.entries)
    admin = await raw_target.admin()
    io = await raw_target.open()
    await io.handshake()
    done = await io.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid, cattr=C.CATTR_DISABLE_SQ_FLOW)
    assert done.status == 0
    data = random.Random(3).randbytes(4096)
    write = await io.write(1, 64, data, RAW_NS1_BLOCK)
    assert write.status == 0 and write.cqe.sq_head == 0xFFFF  # SQHD reserved
    resps = io.counters.capsule_resp
    read = await io.read(1, 64, 8, RAW_NS1_BLOCK)
    assert read.status == 0 and read.data == data
    assert io.counters.capsule_resp == resps  # the read ended with C2HData SUCCESS


async def test_large_write_with_small_maxh2cdata_is_split(
    raw_target_factory: RawTargetFactory,
) -> None:
    port = Port("127.0.0.1", 0, transport=TransportConfig(max_h2c_data=8192))
    rt = await raw_target_factory(raw_default_subsystems(), [port])
    host = await rt.host()
    io = host.io[0]
    assert io.maxh2cdata == 8192
    data = random.Random(7).randbytes(64 * 1024)
    assert (await io.write(1, 256, data, RAW_NS1_BLOCK)).status == 0
    assert io.counters.r2t == 1 and io.counters.h2c_data == 8
    assert (await io.read(1, 256, 128, RAW_NS1_BLOCK)).data == data


async def test_digests_end_to_end(raw_target: RawTarget) -> None:
    admin = await raw_target.open()
    await admin.handshake(hdgst=True, ddgst=True)
    assert admin.hdgst and admin.ddgst
    assert (await admin.connect(RAW_SUBNQN)).status == 0
    await admin.enable()
    io = await raw_target.open()
    await io.handshake(hdgst=True, ddgst=True)
    assert (await io.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)).status == 0
    rng = random.Random(11)
    for nblocks in (4, 96):
        data = rng.randbytes(nblocks * RAW_NS1_BLOCK)
        assert (await io.write(1, 512, data, RAW_NS1_BLOCK)).status == 0
        assert (await io.read(1, 512, nblocks, RAW_NS1_BLOCK)).data == data
    # A corrupted data digest fails only that command, with a retryable status.
    cid = io.next_cid()
    data = b"\x77" * RAW_NS1_BLOCK
    sqe = rw_sqe(IoOpcode.WRITE, cid, 1, 1000, 1, RAW_NS1_BLOCK, inline=True)
    bad = bytearray(io.capsule(sqe, data))
    bad[-1] ^= 0xFF
    failed = await io.submit_nowait(sqe, data, wire=bytes(bad))
    assert (failed.status, failed.dnr) == (Status.TRANSIENT_TRANSPORT_ERROR, False)
    assert (await io.read(1, 1000, 1, RAW_NS1_BLOCK)).data == bytes(RAW_NS1_BLOCK)
    # The retry succeeds on the same connection.
    assert (await io.write(1, 1000, data, RAW_NS1_BLOCK)).status == 0
    assert (await io.read(1, 1000, 1, RAW_NS1_BLOCK)).data == data


async def test_header_digest_error_ends_only_that_connection(raw_target: RawTarget) -> None:
    good = await raw_target.host()
    await assert_good(good, 21)
    victim = await raw_target.open()
    await victim.handshake(hdgst=True, ddgst=True)
    sqe = rw_sqe(IoOpcode.READ, 1, 1, 0, 1, RAW_NS1_BLOCK)
    wire = bytearray(victim.capsule(sqe))
    wire[P.CAPSULE_CMD_HLEN] ^= 0x01  # the first byte of the header digest
    victim.send(bytes(wire))
    term = await victim.expect_term()
    assert term.term_fields() == (P.FatalError.HEADER_DIGEST_ERROR, 0)
    assert bytes(term.data) == bytes(wire[: P.CAPSULE_CMD_HLEN])
    await assert_good(good, 22)


# -- file backend ------------------------------------------------------------------------------


async def test_file_backend_fua_and_flush_reach_the_file(
    raw_target_factory: RawTargetFactory, tmp_path: os.PathLike[str]
) -> None:
    path = os.path.join(tmp_path, "ns1.img")
    device = FileDevice(path, 512, size_bytes=1 << 20, create=True)
    subsystem = Subsystem(RAW_SUBNQN)
    subsystem.add_namespace(Namespace.create(RAW_SUBNQN, 1, device, f"file:{path}"))
    rt = await raw_target_factory([subsystem])
    host = await rt.host()
    io = host.io[0]
    rng = random.Random(5)
    fua_data = rng.randbytes(4096)
    assert (await io.write(1, 10, fua_data, 512, fua=True)).status == 0
    plain = rng.randbytes(48 * 1024)  # through R2T
    assert (await io.write(1, 100, plain, 512)).status == 0
    flush = await io.cmd(IoOpcode.FLUSH, nsid=1)
    assert flush.status == 0
    await rt.aclose()
    assert device.closed
    with open(path, "rb") as f:
        content = f.read()
    assert len(content) == 1 << 20
    assert content[10 * 512 : 10 * 512 + 4096] == fua_data
    assert content[100 * 512 : 100 * 512 + len(plain)] == plain
    assert content[: 10 * 512] == bytes(10 * 512)
