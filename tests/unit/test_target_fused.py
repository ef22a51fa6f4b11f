"""Fused Compare and Write, Compare and Verify on a target queue, driven with bytes.

A real TargetConnection, TargetQueue and controller over a memory namespace, no socket:
each test feeds capsules (and H2CData) built byte by byte and asserts the exact
CapsuleResp PDUs that come out, in order, and what the namespace then holds. The
pairing rules are pynvmf.target.fused's; the statuses are the ones the NVMe base
specification names for each case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from pynvmf import aio
from pynvmf.block.memory import MemoryDevice
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import pdu as P
from pynvmf.spec.logpages import CmdEffects
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.admin import command_effects, identify_controller
from pynvmf.target.controller import Controller
from pynvmf.target.fused import WriteGate
from pynvmf.target.limits import ACWU, MAX_TRANSFER
from pynvmf.target.port import Port
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.target import TargetConnection, TransportConfig
from tests.support.raw import HOSTID, HOSTNQN, Pdu, capsule, h2c_data, icreq, parse_pdus

NQN = "nqn.2024-01.io.pynvmf.test:fused"
BLOCK = 512
BLOCKS = 4096
INLINE = 4096

FIRST, SECOND = C.FUSE_FIRST, C.FUSE_SECOND
COMPARE_FAILED = Status.COMPARE_FAILED | DNR
FUSED_FAIL = Status.FUSED_FAIL | DNR
FUSED_MISSING = Status.FUSED_MISSING | DNR
INVALID_FIELD = Status.INVALID_FIELD | DNR


class Rig:
    """One I/O queue (QID 1, 32 entries) of a controller of a subsystem with one
    memory namespace; `feed` returns the PDUs the target answers with."""

    def __init__(self, qid: int = 1, *, ddgst: bool = False) -> None:
        self.device = MemoryDevice(BLOCK * BLOCKS, BLOCK)
        subsystem = Subsystem(NQN)
        subsystem.add_namespace(Namespace.create(NQN, 1, self.device, "memory:1"))
        self.namespace = subsystem.namespaces[1]
        port = Port("127.0.0.1", 0, transport=TransportConfig(inline_data_size=INLINE))
        target = Target([subsystem], [port])
        self.ctrl = Controller(target, subsystem, 1, HOSTNQN, HOSTID, 0, port)
        subsystem.controllers[1] = self.ctrl
        self.output = asyncio.Event()
        self.conn = TargetConnection(port.transport, self.output.set)
        self.queue = TargetQueue(target, port, self.conn, "127.0.0.1")
        [icresp] = self.feed(icreq(dgst=P.DIGEST_DATA if ddgst else 0))
        assert icresp.type == P.PduType.ICRESP
        self.queue.bind(self.ctrl, qid, 32, False)
        self.sqhd = 1  # the Connect took the first entry (bind)
        self.qid = qid

    def feed(self, data: bytes) -> list[Pdu]:
        self.conn.feed(data)
        return self.take()

    def take(self) -> list[Pdu]:
        return parse_pdus(b"".join(bytes(b) for b in self.conn.take_output()))

    async def wait_for(self, count: int) -> list[Pdu]:
        """The next `count` PDUs, sent after input handling (once a command resumed)."""
        got = self.take()
        async with asyncio.timeout(5):
            while len(got) < count:
                await self.output.wait()
                self.output.clear()
                got += self.take()
        assert len(got) == count, got
        return got

    def send(self, sqe: bytes, data: bytes = b"") -> list[Pdu]:
        self.sqhd += 1
        return self.feed(capsule(sqe, data))

    def resp(self, cid: int, status: int, sqhd: int | None = None) -> bytes:
        """The exact CapsuleResp the target sends for `cid`."""
        return P.CAPSULE_RESP.pack(
            P.PduType.CAPSULE_RESP,
            0,
            P.CAPSULE_RESP_HLEN,
            0,
            P.CAPSULE_RESP_HLEN,
            0,
            0,
            self.sqhd if sqhd is None else sqhd,
            self.qid,
            cid,
            (status << 1) & 0xFFFF,
        )

    def blocks(self, lba: int, n: int = 1) -> bytes:
        buf = bytearray(n * BLOCK)
        _run(self.device.read(lba, memoryview(buf)))
        return bytes(buf)

    def put(self, lba: int, data: bytes) -> None:
        _run(self.device.write(lba, data))


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Drive a MemoryDevice call, which never suspends, to its end."""
    with pytest.raises(StopIteration):
        coro.send(None)


def rw(
    opcode: int,
    cid: int,
    slba: int,
    nlb: int,
    *,
    fuse: int = 0,
    nsid: int = 1,
    inline: bool = True,
    length: int | None = None,
    cdw12_flags: int = 0,
) -> bytes:
    """A Compare, Write or Read SQE: `nlb` blocks (not 0's based) with FUSE `fuse`."""
    return C.build_sqe(
        opcode,
        cid,
        nsid,
        cdw10=slba & 0xFFFFFFFF,
        cdw11=slba >> 32,
        cdw12=((nlb - 1) & 0xFFFF) | cdw12_flags,
        sgl_type=C.SGL_DATA_BLOCK_OFFSET if inline else C.SGL_TRANSPORT_DATA_BLOCK,
        sgl_length=nlb * BLOCK if length is None else length,
        flags=0x40 | fuse,
    )


def raws(pdus: list[Pdu]) -> list[bytes]:
    return [p.raw for p in pdus]


OLD = b"\x11" * BLOCK
NEW = b"\x22" * BLOCK
OTHER = b"\x33" * BLOCK


# -- a matched pair -------------------------------------------------------------------------


def test_compare_is_held_until_its_write_then_both_succeed_and_the_write_lands() -> None:
    rig = Rig()
    rig.put(10, OLD)
    assert rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD) == []
    assert rig.queue.fused.first is not None  # held: nothing answered, nothing compared yet
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(1, 0), rig.resp(2, 0)]
    assert rig.blocks(10) == NEW
    assert rig.queue.fused.first is None


def test_failed_compare_aborts_the_write_and_nothing_is_written() -> None:
    rig = Rig()
    rig.put(10, OTHER)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND), NEW)
    # Compare Failure (SCT 2h SC 85h) and Command Aborted due to Failed Fused Command (09h).
    assert raws(out) == [rig.resp(1, COMPARE_FAILED), rig.resp(2, FUSED_FAIL)]
    assert out[0].raw[-2:] == ((0x4285 << 1) & 0xFFFF).to_bytes(2, "little")
    assert rig.blocks(10) == OTHER
    # Both failures are in the error log, newest first.
    assert [e.cid for e in rig.ctrl.errors] == [2, 1]


def test_a_compare_of_several_blocks_compares_every_byte() -> None:
    rig = Rig()
    old = bytes(range(256)) * 8  # 4 blocks
    rig.put(100, old)
    wrong = bytearray(old)
    wrong[-1] ^= 1  # the very last byte differs
    rig.send(rw(IoOpcode.COMPARE, 1, 100, 4, fuse=FIRST), bytes(wrong))
    out = rig.send(rw(IoOpcode.WRITE, 2, 100, 4, fuse=SECOND), NEW * 4)
    assert raws(out) == [rig.resp(1, COMPARE_FAILED), rig.resp(2, FUSED_FAIL)]
    assert rig.blocks(100, 4) == old


async def test_pair_with_data_by_r2t_asks_for_both_at_once() -> None:
    rig = Rig()
    nlb = 16  # 8 KiB each: above the in-capsule limit
    old, new = bytes([7]) * nlb * BLOCK, bytes([8]) * nlb * BLOCK
    rig.put(200, old)
    assert rig.send(rw(IoOpcode.COMPARE, 5, 200, nlb, fuse=FIRST, inline=False)) == []
    rig.send(rw(IoOpcode.WRITE, 6, 200, nlb, fuse=SECOND, inline=False))
    r2ts = await rig.wait_for(2)
    assert [p.type for p in r2ts] == [P.PduType.R2T, P.PduType.R2T]
    (c1, t1, o1, l1), (c2, t2, o2, l2) = (p.data_fields() for p in r2ts)
    assert (c1, o1, l1, c2, o2, l2) == (5, 0, nlb * BLOCK, 6, 0, nlb * BLOCK)
    rig.conn.feed(h2c_data(6, t2, 0, new))
    rig.conn.feed(h2c_data(5, t1, 0, old))
    out = await rig.wait_for(2)
    assert raws(out) == [rig.resp(5, 0), rig.resp(6, 0)]
    assert rig.blocks(200, nlb) == new


def test_fua_on_the_write_is_honoured_and_does_not_break_the_match() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND, cdw12_flags=C.RW_FUA), NEW)
    assert raws(out) == [rig.resp(1, 0), rig.resp(2, 0)]
    assert rig.blocks(10) == NEW


# -- partners missing or wrong ------------------------------------------------------------


def test_first_followed_by_an_unfused_command_is_missing_its_partner() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    # The next entry is an ordinary Write: the Compare is aborted, the Write runs.
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1), NEW)
    assert raws(out) == [rig.resp(1, FUSED_MISSING), rig.resp(2, 0)]
    assert rig.blocks(10) == NEW


def test_first_followed_by_an_unfused_read_lets_the_read_run() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.READ, 2, 10, 1, inline=False))
    resp, data = P.PduType.CAPSULE_RESP, P.PduType.C2H_DATA
    assert [p.type for p in out] == [resp, data, resp]
    assert out[0].raw == rig.resp(1, FUSED_MISSING)
    assert out[1].data == OLD and out[2].raw == rig.resp(2, 0)


def test_second_without_a_first_is_missing_its_partner() -> None:
    rig = Rig()
    out = rig.send(rw(IoOpcode.WRITE, 3, 10, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(3, FUSED_MISSING)]
    assert rig.blocks(10) == bytes(BLOCK)


def test_a_first_after_a_first_aborts_the_older_and_pairs_the_newer() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OTHER)
    out = rig.send(rw(IoOpcode.COMPARE, 2, 10, 1, fuse=FIRST), OLD)
    assert raws(out) == [rig.resp(1, FUSED_MISSING, sqhd=3)]
    out = rig.send(rw(IoOpcode.WRITE, 3, 10, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(2, 0), rig.resp(3, 0)]
    assert rig.blocks(10) == NEW


@pytest.mark.parametrize(
    ("slba", "nlb", "nsid"),
    [(11, 1, 1), (10, 2, 1), (10, 1, 2), (10 + (1 << 32), 1, 1)],
    ids=["other-slba", "other-nlb", "other-nsid", "slba-upper-dword"],
)
def test_pair_whose_ranges_differ_is_invalid_field_for_both(slba: int, nlb: int, nsid: int) -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.WRITE, 2, slba, nlb, fuse=SECOND, nsid=nsid), NEW * nlb)
    assert raws(out) == [rig.resp(1, INVALID_FIELD), rig.resp(2, INVALID_FIELD)]
    assert rig.blocks(10, 2) == OLD + bytes(BLOCK)


def test_a_first_that_is_not_a_compare_starts_no_fused_operation() -> None:
    rig = Rig()
    out = rig.send(rw(IoOpcode.WRITE, 1, 10, 1, fuse=FIRST), NEW)
    assert raws(out) == [rig.resp(1, FUSED_MISSING)]
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(2, FUSED_MISSING)]
    assert rig.blocks(10) == bytes(BLOCK)


def test_a_second_that_is_not_a_write_is_no_partner() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.READ, 2, 10, 1, fuse=SECOND, inline=False))
    assert raws(out) == [rig.resp(1, FUSED_MISSING), rig.resp(2, FUSED_MISSING)]


def test_fuse_11b_is_reserved() -> None:
    rig = Rig()
    out = rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=3), OLD)
    assert raws(out) == [rig.resp(1, INVALID_FIELD)]


def test_the_admin_queue_has_no_fused_operations() -> None:
    rig = Rig(qid=0)
    for cid, fuse in ((1, FIRST), (2, SECOND)):
        out = rig.send(C.build_sqe(AdminOpcode.KEEP_ALIVE, cid, flags=0x40 | fuse))
        assert raws(out) == [rig.resp(cid, INVALID_FIELD)]


# -- entries the transport refuses, and connections that end --------------------------------


def test_second_refused_by_the_transport_fails_the_held_first() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    # The Write's SGL promises more in-capsule data than the capsule has.
    out = rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND, length=2 * BLOCK), NEW)
    sgl = Status.SGL_INVALID_DATA | DNR
    assert raws(out) == [rig.resp(2, sgl), rig.resp(1, FUSED_FAIL)]
    assert rig.blocks(10) == OLD
    assert rig.queue.fused.first is None


def test_second_reusing_the_firsts_cid_is_a_conflict_and_fails_the_first() -> None:
    rig = Rig()
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.WRITE, 1, 10, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(1, Status.CMDID_CONFLICT | DNR), rig.resp(1, FUSED_FAIL)]
    assert rig.blocks(10) == bytes(BLOCK)


def test_an_unfused_entry_refused_by_the_transport_is_not_the_partner() -> None:
    rig = Rig()
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    bad = bytearray(rw(IoOpcode.READ, 2, 10, 1, inline=False))
    bad[1] = 0x00  # PRP: Invalid Field from the transport
    out = rig.send(bytes(bad))
    assert raws(out) == [rig.resp(2, INVALID_FIELD), rig.resp(1, FUSED_MISSING)]


def test_a_connection_lost_between_the_two_drops_the_first_unanswered() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    rig.conn.close("connection lost")
    rig.queue.connection_lost()
    assert rig.queue.fused.first is None
    assert rig.take() == []
    assert rig.blocks(10) == OLD


async def test_a_connection_lost_while_the_write_data_is_awaited_writes_nothing() -> None:
    rig = Rig()
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST), OLD)
    rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND, inline=False))
    [r2t] = await rig.wait_for(1)
    assert r2t.type == P.PduType.R2T and r2t.data_fields()[0] == 2
    rig.conn.close("connection lost")
    rig.queue.connection_lost()
    # The pair's task sees the loss and ends without completing anything.
    tasks = list(aio._background)
    assert tasks
    await asyncio.wait(tasks, timeout=5)
    assert all(t.done() for t in tasks)
    assert rig.take() == []
    assert rig.blocks(10) == OLD
    assert not rig.namespace.gate.closed


async def test_a_data_digest_error_on_the_writes_data_fails_the_compare_with_it() -> None:
    rig = Rig(ddgst=True)
    rig.put(10, OLD)
    rig.send(rw(IoOpcode.COMPARE, 1, 10, 1, fuse=FIRST, inline=False))
    rig.send(rw(IoOpcode.WRITE, 2, 10, 1, fuse=SECOND, inline=False))
    r2ts = await rig.wait_for(2)
    ttags = {p.data_fields()[0]: p.data_fields()[1] for p in r2ts}
    rig.conn.feed(h2c_data(1, ttags[1], 0, OLD, ddgst=True))
    broken = bytearray(h2c_data(2, ttags[2], 0, NEW, ddgst=True))
    broken[-1] ^= 0xFF
    rig.conn.feed(bytes(broken))
    out = await rig.wait_for(2)
    transient = Status.TRANSIENT_TRANSPORT_ERROR
    assert raws(out) == [rig.resp(2, transient), rig.resp(1, FUSED_FAIL)]
    assert rig.blocks(10) == OLD


# -- Compare and Verify on their own --------------------------------------------------------


def test_compare_alone_match_and_mismatch() -> None:
    rig = Rig()
    rig.put(10, OLD)
    assert raws(rig.send(rw(IoOpcode.COMPARE, 1, 10, 1), OLD)) == [rig.resp(1, 0)]
    assert raws(rig.send(rw(IoOpcode.COMPARE, 2, 10, 1), NEW)) == [rig.resp(2, COMPARE_FAILED)]
    assert rig.blocks(10) == OLD
    assert rig.ctrl.subsystem.stats.read_cmds == 2  # Compares count as reads (SMART)


@pytest.mark.parametrize(
    ("slba", "nlb", "length", "nsid", "status"),
    [
        (BLOCKS - 1, 2, 2 * BLOCK, 1, Status.LBA_OUT_OF_RANGE | DNR),
        (0, 2, BLOCK, 1, Status.SGL_INVALID_DATA | DNR),
        (0, 1, BLOCK, 9, Status.INVALID_NS | DNR),
        (0, MAX_TRANSFER // BLOCK + 1, BLOCK, 1, INVALID_FIELD),
    ],
    ids=["lba-out-of-range", "length-disagrees-with-sgl", "inactive-nsid", "over-mdts"],
)
def test_compare_validated_like_a_read(
    slba: int, nlb: int, length: int, nsid: int, status: int
) -> None:
    rig = Rig()
    sqe = rw(IoOpcode.COMPARE, 1, slba, nlb, nsid=nsid, length=length)
    assert raws(rig.send(sqe, bytes(length))) == [rig.resp(1, status)]


async def test_compare_with_data_by_r2t() -> None:
    rig = Rig()
    data = bytes([5]) * 16 * BLOCK
    rig.put(0, data)
    [r2t] = rig.send(rw(IoOpcode.COMPARE, 4, 0, 16, inline=False))
    assert r2t.type == P.PduType.R2T and r2t.data_fields()[0] == 4
    rig.conn.feed(h2c_data(4, r2t.data_fields()[1], 0, data))
    assert raws(await rig.wait_for(1)) == [rig.resp(4, 0)]


def test_a_refused_compare_asks_for_no_data() -> None:
    rig = Rig()
    out = rig.send(rw(IoOpcode.COMPARE, 4, BLOCKS - 1, 16, inline=False))
    assert raws(out) == [rig.resp(4, Status.LBA_OUT_OF_RANGE | DNR)]
    assert rig.conn.stats.r2t_sent == 0


def verify_sqe(cid: int, slba: int, nlb: int, *, fua: bool = False) -> bytes:
    return C.build_sqe(
        IoOpcode.VERIFY,
        cid,
        1,
        cdw10=slba & 0xFFFFFFFF,
        cdw11=slba >> 32,
        cdw12=(nlb - 1) | (C.RW_FUA if fua else 0),
    )


def test_verify_moves_no_data() -> None:
    rig = Rig()
    out = rig.send(verify_sqe(1, 0, BLOCKS, fua=True))
    assert raws(out) == [rig.resp(1, 0)]
    assert rig.conn.stats.r2t_sent == rig.conn.stats.c2h_data_pdus == 0


def test_verify_out_of_range() -> None:
    rig = Rig()
    out = rig.send(verify_sqe(1, BLOCKS - 8, 9))
    assert raws(out) == [rig.resp(1, Status.LBA_OUT_OF_RANGE | DNR)]


class FailingReads(MemoryDevice):
    async def read(self, lba: int, buf: memoryview) -> None:
        raise OSError(5, "Input/output error")


def test_unreadable_blocks_are_an_unrecovered_read_error() -> None:
    rig = Rig()
    rig.namespace.device = FailingReads(BLOCK * BLOCKS, BLOCK)
    out = rig.send(verify_sqe(1, 0, 8))
    assert raws(out) == [rig.resp(1, Status.UNRECOVERED_READ_ERROR)]
    out = rig.send(rw(IoOpcode.COMPARE, 2, 0, 1), OLD)
    assert raws(out) == [rig.resp(2, Status.UNRECOVERED_READ_ERROR)]
    rig.send(rw(IoOpcode.COMPARE, 3, 0, 1, fuse=FIRST), OLD)
    out = rig.send(rw(IoOpcode.WRITE, 4, 0, 1, fuse=SECOND), NEW)
    assert raws(out) == [rig.resp(3, Status.UNRECOVERED_READ_ERROR), rig.resp(4, FUSED_FAIL)]


# -- what the controller reports -------------------------------------------------------------


def test_identify_and_effects_report_the_new_commands() -> None:
    rig = Rig()
    ident = identify_controller(rig.ctrl, rig.queue)
    assert ident.oncs & I.Oncs.COMPARE and ident.oncs & I.Oncs.VERIFY
    assert ident.fuses == I.Fuses.COMPARE_AND_WRITE
    assert ident.acwu == ACWU == 255  # 1 MiB (MDTS) of 4 KiB blocks, 0's based
    effects = command_effects()
    assert effects.iocs[IoOpcode.COMPARE] == CmdEffects.CSUPP
    assert effects.iocs[IoOpcode.VERIFY] == CmdEffects.CSUPP


# -- the write gate --------------------------------------------------------------------------


async def test_gate_keeps_writes_out_while_a_fused_operation_holds_it() -> None:
    gate = WriteGate()
    order: list[str] = []
    await gate.enter()  # a write inside the device when the fused operation arrives
    held = asyncio.Event()

    async def fused() -> None:
        async with gate.exclusive():
            order.append("fused")
            held.set()
            await release.wait()

    async def write(name: str) -> None:
        await gate.enter()
        order.append(name)
        gate.leave()

    release = asyncio.Event()
    task = asyncio.ensure_future(fused())
    await asyncio.sleep(0)
    assert gate.closed and not held.is_set()  # waiting for the write in the device
    late = asyncio.ensure_future(write("late write"))
    await asyncio.sleep(0)
    gate.leave()  # the write in the device is done
    await held.wait()
    assert order == ["fused"] and not late.done()
    release.set()
    await task
    await late
    assert order == ["fused", "late write"]
    assert gate.writers == 0 and not gate.closed


async def test_gate_lets_queued_writes_in_before_the_next_fused_operation() -> None:
    gate = WriteGate()
    order: list[str] = []
    release = asyncio.Event()

    async def fused(name: str, wait: bool) -> None:
        async with gate.exclusive():
            order.append(name)
            if wait:
                await release.wait()

    async def write(name: str) -> None:
        await gate.enter()
        await asyncio.sleep(0)  # inside the device for a while
        order.append(name)
        gate.leave()

    first = asyncio.ensure_future(fused("fused 1", True))
    await asyncio.sleep(0)
    w = asyncio.ensure_future(write("write"))
    second = asyncio.ensure_future(fused("fused 2", False))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, w, second)
    assert order == ["fused 1", "write", "fused 2"]


async def test_a_write_cancelled_while_waiting_gives_its_place_back() -> None:
    gate = WriteGate()
    release = asyncio.Event()

    async def fused() -> None:
        async with gate.exclusive():
            await release.wait()

    task = asyncio.ensure_future(fused())
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0)
    waiter.cancel()
    release.set()
    await task
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.writers == 0
    async with asyncio.timeout(1), gate.exclusive():  # nothing left to drain
        pass
