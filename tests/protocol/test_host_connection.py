"""The sans-I/O host end of a connection (pynvmf.tcp.host), fed controller PDUs by hand.

Covers what the pynvmf target never sends on its own: C2HData split over several
PDUs, malformed or out-of-sequence PDUs, digest errors, TermReqs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pynvmf.spec import pdu as P
from pynvmf.spec.command import SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, Sqe
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.tcp import digest as D
from pynvmf.tcp.framing import PduReader
from pynvmf.tcp.host import ABORTED, HostCommand, HostConnection


@dataclass
class SentPdu:
    type: int
    flags: int
    pdo: int
    header: bytes
    data: bytes


class Harness:
    def __init__(self, depth: int = 8, **kwargs: bool | int) -> None:
        self.completed: list[HostCommand] = []
        self.closed: list[str] = []
        self.established = 0
        self.conn = HostConnection(
            depth,
            self.completed.append,
            lambda: None,
            on_established=self._established,
            on_closed=self.closed.append,
            **kwargs,  # type: ignore[arg-type]
        )
        # What a controller would parse out of our output.
        self.sent: list[SentPdu] = []
        self.parser = PduReader(
            self._parsed,
            self._parse_error,
            accepted_types=frozenset(
                (P.PduType.ICREQ, P.PduType.CAPSULE_CMD, P.PduType.H2C_DATA, P.PduType.H2C_TERM_REQ)
            ),
            max_pdu_len=1 << 20,
        )

    def _established(self) -> None:
        self.established += 1

    def _parsed(
        self, pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
    ) -> None:
        data = bytes(pdu[pdo:data_end]) if pdo else b""
        self.sent.append(SentPdu(pdu_type, flags, pdo, bytes(pdu[:hlen]), data))

    def _parse_error(self, fes: int, fei: int, offending: bytes) -> None:
        raise AssertionError(f"host sent a malformed PDU: FES {fes:#x} FEI {fei}")

    def drain(self) -> list[SentPdu]:
        """Parse everything the connection queued since the last drain."""
        for buf in self.conn.take_output():
            self.parser.feed(buf)
        sent, self.sent = self.sent, []
        return sent

    def start(self, *, cpda: int = 0, dgst: int = 0, maxh2c: int = 8192) -> None:
        self.conn.start()
        (icreq,) = self.drain()
        assert icreq.type == P.PduType.ICREQ
        self.conn.feed(P.pack_ic(P.PduType.ICRESP, P.PFV_1_0, cpda, dgst, maxh2c))
        # Once digests are on, the controller side checks them on every later PDU.
        self.parser.hdgst = bool(dgst & P.DIGEST_HEADER)
        self.parser.ddgst = bool(dgst & P.DIGEST_DATA)

    # -- controller PDUs --------------------------------------------------------------------

    def c2h_data(
        self, cid: int, offset: int, data: bytes, flags: int = 0, *, bad_ddgst: bool = False
    ) -> bytes:
        hdgst, ddgst = self.conn.hdgst, self.conn.ddgst
        if hdgst:
            flags |= P.FLAG_HDGST
        if ddgst:
            flags |= P.FLAG_DDGST
        pdo = P.data_offset(P.DATA_HLEN, hdgst, 0)
        plen = pdo + len(data) + (P.DIGEST_LEN if ddgst else 0)
        header = P.DATA_HEADER.pack(
            P.PduType.C2H_DATA, flags, P.DATA_HLEN, pdo, plen, cid, 0, offset, len(data)
        )
        out = bytearray(header)
        if hdgst:
            out += D.digest(header)
        out += bytes(pdo - len(out)) + data
        if ddgst:
            out += b"\0\0\0\0" if bad_ddgst else D.digest(data)
        return bytes(out)

    def r2t(self, cid: int, ttag: int, offset: int, length: int) -> bytes:
        hdgst = self.conn.hdgst
        header = P.DATA_HEADER.pack(
            P.PduType.R2T,
            P.FLAG_HDGST if hdgst else 0,
            P.R2T_HLEN,
            0,
            P.R2T_HLEN + (P.DIGEST_LEN if hdgst else 0),
            cid,
            ttag,
            offset,
            length,
        )
        return header + D.digest(header) if hdgst else header

    def resp(self, cid: int, status: int = 0, result: int = 0) -> bytes:
        hdgst = self.conn.hdgst
        header = P.CAPSULE_RESP.pack(
            P.PduType.CAPSULE_RESP,
            P.FLAG_HDGST if hdgst else 0,
            P.CAPSULE_RESP_HLEN,
            0,
            P.CAPSULE_RESP_HLEN + (P.DIGEST_LEN if hdgst else 0),
            result & 0xFFFFFFFF,
            result >> 32,
            0,
            1,
            cid,
            status << 1,
        )
        return header + D.digest(header) if hdgst else header


def read(h: Harness, nbytes: int) -> tuple[HostCommand, bytearray]:
    buf = bytearray(nbytes)
    cmd = h.conn.submit(IoOpcode.READ, 1, 0, 0, nbytes // 512 - 1, into=memoryview(buf))
    return cmd, buf


def assert_terminated(h: Harness, fes: int) -> None:
    (term,) = h.drain()
    assert term.type == P.PduType.H2C_TERM_REQ
    assert P.TERM_BODY.unpack_from(term.header, P.CH_LEN)[0] == fes
    assert h.conn.closing
    assert len(h.closed) == 1


# -- connection establishment --------------------------------------------------------------


@pytest.mark.parametrize(("hdgst", "ddgst", "bits"), [(False, False, 0), (True, True, 3)])
def test_icreq_asks_for_the_digests_wanted(hdgst: bool, ddgst: bool, bits: int) -> None:
    h = Harness(header_digest=hdgst, data_digest=ddgst)
    h.conn.start()
    (icreq,) = h.drain()
    assert len(icreq.header) == P.ICREQ_LEN
    pfv, hpda, dgst, maxr2t = P.IC_BODY.unpack_from(icreq.header, P.CH_LEN)
    assert (pfv, hpda, dgst, maxr2t) == (0, 0, bits, 0)
    with pytest.raises(RuntimeError):
        h.conn.start()


def test_icresp_establishes_the_connection() -> None:
    h = Harness(header_digest=True)
    h.start(cpda=1, dgst=P.DIGEST_HEADER, maxh2c=65536)
    assert h.established == 1
    assert h.conn.established and h.conn.hdgst and not h.conn.ddgst
    assert (h.conn.cpda, h.conn.maxh2cdata) == (1, 65536)
    assert h.drain() == []


@pytest.mark.parametrize(
    ("pfv", "cpda", "dgst", "maxh2c", "fes"),
    [
        (1, 0, 0, 8192, P.FatalError.UNSUPPORTED_PARAMETER),
        (0, 32, 0, 8192, P.FatalError.INVALID_HEADER_FIELD),
        (0, 0, P.DIGEST_DATA, 8192, P.FatalError.UNSUPPORTED_PARAMETER),  # unasked digest
        (0, 0, 0, 2048, P.FatalError.INVALID_HEADER_FIELD),  # below the 4 KiB minimum
        (0, 0, 0, 8190, P.FatalError.INVALID_HEADER_FIELD),  # not a dword multiple
    ],
)
def test_bad_icresp_is_refused(pfv: int, cpda: int, dgst: int, maxh2c: int, fes: int) -> None:
    h = Harness()
    h.conn.start()
    h.drain()
    h.conn.feed(P.pack_ic(P.PduType.ICRESP, pfv, cpda, dgst, maxh2c))
    assert_terminated(h, fes)
    assert not h.established


def test_a_digest_the_controller_declines_is_refused() -> None:
    h = Harness(data_digest=True)
    h.conn.start()
    h.drain()
    h.conn.feed(P.pack_ic(P.PduType.ICRESP, 0, 0, 0, 8192))
    assert_terminated(h, P.FatalError.UNSUPPORTED_PARAMETER)


def test_data_before_icresp_is_a_sequence_error() -> None:
    h = Harness()
    h.conn.start()
    h.drain()
    h.conn.feed(P.CAPSULE_RESP.pack(P.PduType.CAPSULE_RESP, 0, 24, 0, 24, 0, 0, 0, 0, 0, 0))
    assert_terminated(h, P.FatalError.PDU_SEQUENCE_ERROR)


def test_term_req_instead_of_icresp_closes() -> None:
    h = Harness()
    h.conn.start()
    h.drain()
    h.conn.feed(P.pack_term_req(P.PduType.C2H_TERM_REQ, P.FatalError.UNSUPPORTED_PARAMETER, 8))
    assert h.conn.closing
    assert "C2HTermReq" in h.closed[0]
    assert h.drain() == []  # a TermReq is not answered with one


# -- capsules ---------------------------------------------------------------------------------


def test_small_write_goes_in_the_capsule_large_one_waits_for_r2t() -> None:
    h = Harness()
    h.start()
    h.conn.set_inline_limit(4096)
    small = h.conn.submit(IoOpcode.WRITE, 1, 0, 0, 7, data=bytes(range(256)) * 16)
    large = h.conn.submit(IoOpcode.WRITE, 1, 8, 0, 15, data=b"\x01" * 8192)
    first, second = h.drain()
    sqe = Sqe.unpack(first.header, P.CH_LEN)
    assert (sqe.cid, sqe.sgl_type, sqe.sgl_length, sqe.sgl_addr) == (
        small.cid,
        SGL_DATA_BLOCK_OFFSET,
        4096,
        0,
    )
    assert first.data == bytes(range(256)) * 16
    sqe = Sqe.unpack(second.header, P.CH_LEN)
    assert (sqe.cid, sqe.sgl_type, sqe.sgl_length) == (large.cid, SGL_TRANSPORT_DATA_BLOCK, 8192)
    assert second.data == b""
    assert small.cid != large.cid


def test_r2t_is_answered_with_h2c_data_no_larger_than_maxh2cdata() -> None:
    h = Harness(header_digest=True, data_digest=True)
    h.start(dgst=P.DIGEST_HEADER | P.DIGEST_DATA, maxh2c=4096, cpda=1)
    h.conn.set_inline_limit(0)
    data = bytes(i % 251 for i in range(10000))
    cmd = h.conn.submit(IoOpcode.WRITE, 1, 0, 0, 0, data=data)
    h.drain()
    # Two R2Ts, as a controller with a small buffer might send them.
    h.conn.feed(h.r2t(cmd.cid, 0x42, 0, 6000))
    pdus = h.drain()
    h.conn.feed(h.r2t(cmd.cid, 0x43, 6000, 4000))
    pdus += h.drain()
    assert [len(p.data) for p in pdus] == [4096, 1904, 4000]
    assert all(p.type == P.PduType.H2C_DATA for p in pdus)
    assert all(p.pdo % 8 == 0 for p in pdus)  # CPDA 1: 8-byte aligned data
    fields = [P.DATA_BODY.unpack_from(p.header, P.CH_LEN) for p in pdus]
    assert fields == [
        (cmd.cid, 0x42, 0, 4096),
        (cmd.cid, 0x42, 4096, 1904),
        (cmd.cid, 0x43, 6000, 4000),
    ]
    assert [bool(p.flags & P.FLAG_DATA_LAST) for p in pdus] == [False, True, True]
    assert b"".join(p.data for p in pdus) == data
    h.conn.feed(h.resp(cmd.cid))
    assert h.completed == [cmd] and cmd.status == 0


def test_r2t_for_unknown_command_or_beyond_the_data_terminates() -> None:
    h = Harness()
    h.start()
    h.conn.set_inline_limit(0)
    cmd = h.conn.submit(IoOpcode.WRITE, 1, 0, 0, 0, data=bytes(512))
    h.drain()
    h.conn.feed(h.r2t(cmd.cid, 1, 0, 1024))
    assert_terminated(h, P.FatalError.DATA_OUT_OF_RANGE)
    assert h.completed == [cmd] and cmd.status == ABORTED

    h = Harness()
    h.start()
    h.conn.feed(h.r2t(5, 1, 0, 512))
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)


def test_in_capsule_data_with_digests_and_alignment() -> None:
    h = Harness(header_digest=True, data_digest=True)
    h.start(dgst=P.DIGEST_HEADER | P.DIGEST_DATA, cpda=3)
    h.conn.submit(IoOpcode.WRITE, 1, 0, 0, 0, data=b"\x77" * 512)
    (capsule,) = h.drain()  # the parser has verified both digests
    assert capsule.pdo == 80  # 72 + 4 header digest, aligned to 16
    assert capsule.flags & P.FLAG_HDGST and capsule.flags & P.FLAG_DDGST
    assert capsule.data == b"\x77" * 512


# -- C2HData and completions -------------------------------------------------------------------


def test_read_data_over_several_c2h_pdus_then_capsule_resp() -> None:
    h = Harness()
    h.start()
    cmd, buf = read(h, 12288)
    h.drain()
    for i in range(3):
        last = P.FLAG_DATA_LAST if i == 2 else 0
        h.conn.feed(h.c2h_data(cmd.cid, i * 4096, bytes([i + 1]) * 4096, last))
        assert not h.completed
    h.conn.feed(h.resp(cmd.cid, result=0x1234))
    assert h.completed == [cmd]
    assert (cmd.status, cmd.result) == (0, 0x1234)
    assert buf == b"\x01" * 4096 + b"\x02" * 4096 + b"\x03" * 4096
    assert h.conn.free_slots == h.conn.depth


def test_c2h_success_completes_without_capsule_resp() -> None:
    h = Harness(header_digest=True, data_digest=True)
    h.start(dgst=P.DIGEST_HEADER | P.DIGEST_DATA)
    cmd, buf = read(h, 1024)
    h.conn.feed(h.c2h_data(cmd.cid, 0, b"\x10" * 512))
    h.conn.feed(h.c2h_data(cmd.cid, 512, b"\x20" * 512, P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS))
    assert h.completed == [cmd] and cmd.status == 0
    assert buf == b"\x10" * 512 + b"\x20" * 512
    assert h.conn.stats.c2h_success_completions == 1
    # The command id is free again: a response for it now is an error.
    h.drain()
    h.conn.feed(h.resp(cmd.cid))
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)


def test_success_without_last_terminates() -> None:
    h = Harness()
    h.start()
    cmd, _buf = read(h, 1024)
    h.drain()
    h.conn.feed(h.c2h_data(cmd.cid, 0, bytes(512), P.FLAG_DATA_SUCCESS))
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)
    assert cmd.status == ABORTED


@pytest.mark.parametrize(("offset", "length"), [(512, 512), (0, 2048), (1024, 512)])
def test_c2h_data_out_of_order_or_range_terminates(offset: int, length: int) -> None:
    h = Harness()
    h.start()
    cmd, _buf = read(h, 1024)
    other, _ = read(h, 512)
    h.drain()
    h.conn.feed(h.c2h_data(cmd.cid, offset, bytes(length)))
    assert_terminated(h, P.FatalError.DATA_OUT_OF_RANGE)
    # Every outstanding command fails, not just the one concerned.
    assert {c.cid for c in h.completed} == {cmd.cid, other.cid}
    assert all(c.status == ABORTED for c in h.completed)


def test_term_req_carries_only_the_offending_header() -> None:
    h = Harness()
    h.start()
    cmd, _buf = read(h, 1024)
    h.drain()
    bad = h.c2h_data(cmd.cid, 512, b"\xab" * 512)  # skips the first 512 bytes
    h.conn.feed(bad)
    (term,) = h.drain()
    assert term.type == P.PduType.H2C_TERM_REQ
    assert term.data == bad[: P.DATA_HLEN]  # the C2HData header, none of its data


def test_c2h_data_for_a_write_terminates() -> None:
    h = Harness()
    h.start()
    cmd = h.conn.submit(IoOpcode.WRITE, 1, 0, 0, 0, data=bytes(512))
    h.drain()
    h.conn.feed(h.c2h_data(cmd.cid, 0, bytes(512)))
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)


def test_capsule_resp_for_unknown_command_terminates() -> None:
    h = Harness(depth=4)
    h.start()
    h.conn.feed(h.resp(3))
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)
    h = Harness(depth=4)
    h.start()
    h.conn.feed(h.resp(4000))  # beyond the queue depth
    assert_terminated(h, P.FatalError.INVALID_HEADER_FIELD)


def test_short_read_with_success_status_is_a_transfer_error() -> None:
    h = Harness()
    h.start()
    cmd, _buf = read(h, 1024)
    h.conn.feed(h.c2h_data(cmd.cid, 0, bytes(512), P.FLAG_DATA_LAST))
    h.conn.feed(h.resp(cmd.cid))
    assert cmd.status == Status.DATA_TRANSFER_ERROR
    assert not h.conn.closing


def test_data_digest_error_fails_the_command_not_the_connection() -> None:
    h = Harness(data_digest=True)
    h.start(dgst=P.DIGEST_DATA)
    cmd, buf = read(h, 512)
    h.conn.feed(h.c2h_data(cmd.cid, 0, b"\xff" * 512, P.FLAG_DATA_LAST, bad_ddgst=True))
    h.conn.feed(h.resp(cmd.cid))
    assert cmd.status == Status.TRANSIENT_TRANSPORT_ERROR
    assert buf == bytes(512)  # corrupt data is not delivered
    assert h.conn.stats.data_digest_errors == 1
    assert not h.conn.closing
    again, buf = read(h, 512)
    h.conn.feed(h.c2h_data(again.cid, 0, b"\xee" * 512, P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS))
    assert again.status == 0 and buf == b"\xee" * 512


def test_error_status_and_result_are_reported() -> None:
    h = Harness()
    h.start()
    cmd = h.conn.submit(IoOpcode.FLUSH, 1)
    h.conn.feed(h.resp(cmd.cid, Status.INVALID_NS | 0x4000, result=7))
    assert (cmd.status, cmd.result) == (Status.INVALID_NS | 0x4000, 7)


def test_discarded_command_data_is_dropped() -> None:
    h = Harness()
    h.start()
    cmd, buf = read(h, 512)
    cmd.discard = True  # its caller was cancelled and may reuse the buffer
    h.conn.feed(h.c2h_data(cmd.cid, 0, b"\x01" * 512, P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS))
    assert buf == bytes(512)
    assert h.completed == [cmd]


def test_term_req_from_controller_fails_every_command() -> None:
    h = Harness()
    h.start()
    cmds = [read(h, 512)[0] for _ in range(3)]
    h.drain()
    h.conn.feed(
        P.pack_term_req(P.PduType.C2H_TERM_REQ, P.FatalError.HEADER_DIGEST_ERROR, 0, bytes(24))
    )
    assert h.conn.closing
    assert "FES 0x3" in h.conn.close_reason
    assert sorted(c.cid for c in h.completed) == sorted(c.cid for c in cmds)
    assert all(c.status == ABORTED for c in cmds)
    assert h.drain() == []
    with pytest.raises(ConnectionError):
        h.conn.submit(IoOpcode.FLUSH, 1)


def test_command_ids_come_from_a_free_list() -> None:
    h = Harness(depth=3)
    h.start()
    cmds = [h.conn.submit(IoOpcode.FLUSH, 1) for _ in range(3)]
    assert sorted(c.cid for c in cmds) == [0, 1, 2]
    assert h.conn.free_slots == 0
    h.conn.feed(h.resp(cmds[1].cid))
    assert h.conn.free_slots == 1
    assert h.conn.submit(IoOpcode.FLUSH, 1).cid == cmds[1].cid
    assert h.conn.stats.max_inflight == 3


def test_header_digest_error_terminates() -> None:
    h = Harness(header_digest=True)
    h.start(dgst=P.DIGEST_HEADER)
    cmd = h.conn.submit(IoOpcode.FLUSH, 1)
    h.drain()
    good = h.resp(cmd.cid)
    h.conn.feed(good[:-4] + b"\0\0\0\0")
    assert_terminated(h, P.FatalError.HEADER_DIGEST_ERROR)
    assert cmd.status == ABORTED
