"""The sans-I/O target end of an NVMe/TCP connection, driven with bytes (no sockets).

Each test feeds PDUs built byte by byte and asserts the exact PDUs that come
out: ICResp, C2HTermReq (FES, FEI, the offending header), CapsuleResp, R2T and
C2HData, and which commands reach `on_command`.
"""

from __future__ import annotations

import pytest

from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.command_counts import Histogram
from pynvmf.tcp.framing import MarkingWriter, PduWriter
from pynvmf.tcp.target import QueueParams, Request, TargetConnection, TransportConfig
from pynvmf.tcp.wire_faults import WireFault
from tests.support.raw import Pdu, capsule, data_pdu, h2c_data, icreq, parse_pdus, rw_sqe

FES = P.FatalError

# Target bugs these tests found (fixes reported with them); drop a mark once its fix is in.


class Harness:
    """A TargetConnection, with a recording NVMe layer (tcp/target.py's NvmeQueue) and glue
    above it."""

    def __init__(self, config: TransportConfig | None = None) -> None:
        self.requests: list[Request] = []
        self.refused: list[Request] = []
        self.given_back = 0
        self.output_requests = 0
        self.conn = TargetConnection(config or TransportConfig(), self._output_wanted)
        self.conn.attach(self)

    @property
    def budget(self) -> Harness:
        return self

    def give(self, n: int) -> None:
        self.given_back += n

    def close(self) -> None:
        pass

    def on_command(self, req: Request) -> None:
        self.requests.append(req)

    def on_refused(self, req: Request) -> None:
        self.refused.append(req)

    def log_context(self) -> dict[str, object]:
        return {}

    def _output_wanted(self) -> None:
        self.output_requests += 1

    def feed(self, data: bytes) -> list[Pdu]:
        """Feed bytes; return every PDU the connection wants to send."""
        self.conn.feed(data)
        return self.take()

    def take(self) -> list[Pdu]:
        out = b"".join(bytes(buf) for buf in self.conn.take_output())
        return parse_pdus(out, hdgst=self.conn.hdgst, ddgst=self.conn.ddgst)

    def capsule(self, sqe: bytes, data: bytes = b"", **kwargs: int | None) -> bytes:
        return capsule(sqe, data, hdgst=self.conn.hdgst, ddgst=self.conn.ddgst, **kwargs)


def established(
    config: TransportConfig | None = None,
    *,
    hdgst: bool = False,
    ddgst: bool = False,
    hpda: int = 0,
) -> Harness:
    h = Harness(config)
    dgst = (P.DIGEST_HEADER if hdgst else 0) | (P.DIGEST_DATA if ddgst else 0)
    [resp] = h.feed(icreq(dgst=dgst, hpda=hpda))
    assert resp.type == P.PduType.ICRESP
    assert h.conn.established
    return h


def io_connection(**kwargs: bool | int) -> Harness:
    """An established connection bound as the NVMe layer binds an I/O queue after Connect,
    on a port whose in-capsule limit is 4 KiB."""
    h = established(TransportConfig(inline_data_size=4096), **kwargs)  # type: ignore[arg-type]
    h.conn.bind_queue(QueueParams(1, 32))
    return h


def write_sqe(cid: int, length: int, *, inline: bool) -> bytes:
    return rw_sqe(IoOpcode.WRITE, cid, 1, 0, length // 512, length, inline=inline)


def read_sqe(cid: int, length: int) -> bytes:
    return rw_sqe(IoOpcode.READ, cid, 1, 0, length // 512, length)


def only_term(pdus: list[Pdu]) -> Pdu:
    assert len(pdus) == 1, pdus
    [term] = pdus
    assert term.type == P.PduType.C2H_TERM_REQ, term
    assert term.hlen == P.TERM_REQ_HLEN
    assert term.plen == P.TERM_REQ_HLEN + len(term.data)
    assert term.flags == 0 and term.pdo == 0
    return term


def only_resp(pdus: list[Pdu]) -> C.Cqe:
    assert len(pdus) == 1, pdus
    return pdus[0].cqe()


def assert_terminated(h: Harness, pdus: list[Pdu], fes: int, fei: int = 0) -> Pdu:
    term = only_term(pdus)
    assert term.term_fields() == (fes, fei)
    assert h.conn.closing
    assert h.conn.stats.term_reqs_sent == 1
    return term


# -- ICReq / ICResp ---------------------------------------------------------------------------


def test_icresp_fields_default_config() -> None:
    h = Harness()
    [resp] = h.feed(icreq(maxr2t=3))
    assert resp.type == P.PduType.ICRESP
    assert (resp.flags, resp.hlen, resp.pdo, resp.plen) == (0, 128, 0, 128)
    assert resp.ic_fields() == (P.PFV_1_0, 0, 0, 128 * 1024)
    assert resp.raw[P.CH_LEN + P.IC_BODY.size :] == bytes(128 - P.CH_LEN - P.IC_BODY.size)
    assert h.conn.established and not h.conn.closing
    assert h.conn.maxr2t == 3


def test_icresp_reports_configured_cpda_and_maxh2cdata() -> None:
    h = Harness(TransportConfig(cpda=3, max_h2c_data=65536))
    [resp] = h.feed(icreq(hpda=2))
    assert resp.ic_fields() == (P.PFV_1_0, 3, 0, 65536)
    assert h.conn.hpda == 2


@pytest.mark.parametrize(
    ("requested", "allow_header", "allow_data", "granted"),
    [
        (P.DIGEST_HEADER | P.DIGEST_DATA, True, True, P.DIGEST_HEADER | P.DIGEST_DATA),
        (P.DIGEST_HEADER | P.DIGEST_DATA, False, True, P.DIGEST_DATA),
        (P.DIGEST_HEADER | P.DIGEST_DATA, True, False, P.DIGEST_HEADER),
        (P.DIGEST_HEADER | P.DIGEST_DATA, False, False, 0),
        (P.DIGEST_HEADER, True, True, P.DIGEST_HEADER),
        (P.DIGEST_DATA, True, True, P.DIGEST_DATA),
        (0, True, True, 0),
    ],
)
def test_digest_negotiation_honours_policy(
    requested: int, allow_header: bool, allow_data: bool, granted: int
) -> None:
    config = TransportConfig(allow_header_digest=allow_header, allow_data_digest=allow_data)
    h = Harness(config)
    [resp] = h.feed(icreq(dgst=requested))
    assert resp.ic_fields()[2] == granted
    assert h.conn.hdgst == bool(granted & P.DIGEST_HEADER)
    assert h.conn.ddgst == bool(granted & P.DIGEST_DATA)


def test_icreq_unsupported_pfv_is_terminated_with_offset_of_pfv() -> None:
    h = Harness()
    bad = icreq(pfv=1)
    term = assert_terminated(h, h.feed(bad), FES.UNSUPPORTED_PARAMETER, P.OFFSET_PFV)
    assert term.data == bad  # the offending header: the whole 128-byte ICReq
    assert not h.conn.established


def test_icreq_hpda_above_31_is_an_invalid_header_field() -> None:
    h = Harness()
    assert_terminated(h, h.feed(icreq(hpda=32)), FES.INVALID_HEADER_FIELD, P.OFFSET_HPDA)


def test_icreq_hpda_31_is_accepted() -> None:
    h = Harness()
    [resp] = h.feed(icreq(hpda=31))
    assert resp.type == P.PduType.ICRESP
    assert h.conn.hpda == 31


# -- PDU sequence and header checks -----------------------------------------------------------


def test_capsule_before_icreq_is_a_pdu_sequence_error() -> None:
    h = Harness()
    sqe = C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)
    bad = capsule(sqe)
    term = assert_terminated(h, h.feed(bad), FES.PDU_SEQUENCE_ERROR)
    assert term.data == bad
    assert h.requests == []


def test_second_icreq_is_a_pdu_sequence_error() -> None:
    h = established()
    again = icreq()
    term = assert_terminated(h, h.feed(again), FES.PDU_SEQUENCE_ERROR)
    assert term.data == again


@pytest.mark.parametrize(
    "pdu_type",
    [
        P.PduType.ICRESP,
        P.PduType.C2H_TERM_REQ,
        P.PduType.CAPSULE_RESP,
        P.PduType.C2H_DATA,
        P.PduType.R2T,
        0x08,
        0x0A,
        0x7F,
        0xFF,
    ],
)
def test_pdu_type_the_host_may_not_send_is_invalid_header_field_fei_0(pdu_type: int) -> None:
    h = established()
    bad = P.COMMON_HEADER.pack(pdu_type, 0, 24, 0, 24) + bytes(16)
    term = assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_TYPE)
    # The offending header: HLEN bytes of a type NVMe/TCP defines; of another type only the
    # common header, whose HLEN means nothing (so that the TermReq does not depend on
    # what else has arrived).
    defined = {int(t) for t in P.PduType}
    assert term.data == (bad if pdu_type in defined else bad[: P.CH_LEN])


def test_a_client_of_another_protocol_is_terminated_on_its_first_eight_bytes() -> None:
    # An HTTP request: 'G' is no PDU type, so its "HLEN" means nothing and no more
    # bytes need come for the TermReq (an HTTP client waits for an answer).
    h = Harness()
    term = assert_terminated(h, h.feed(b"GET / HT"), FES.INVALID_HEADER_FIELD, 0)
    assert term.data == b"GET / HT"


def test_wrong_hlen_for_the_type_is_invalid_header_field_fei_2() -> None:
    h = established()
    sqe = C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)
    bad = P.COMMON_HEADER.pack(P.PduType.CAPSULE_CMD, 0, 64, 0, 72) + sqe
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_HLEN)
    assert h.requests == []


@pytest.mark.parametrize("plen", [0, 8, 71])
def test_plen_smaller_than_the_header_is_invalid_header_field_fei_4(plen: int) -> None:
    h = established()
    sqe = C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)
    bad = P.COMMON_HEADER.pack(P.PduType.CAPSULE_CMD, 0, 72, 0, plen) + sqe
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_PLEN)


def test_huge_plen_is_refused_before_buffering() -> None:
    h = established()
    sqe = C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)
    bad = P.COMMON_HEADER.pack(P.PduType.CAPSULE_CMD, 0, 72, 72, 0xFFFFFFF0) + sqe
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_PLEN)


@pytest.mark.parametrize(
    "pdo",
    [
        0,  # data present but no offset
        64,  # inside the header
        74,  # past the header but not dword aligned
        72 + 64 + 4,  # past the end of the PDU
    ],
)
def test_pdo_outside_the_pdu_or_unaligned_is_invalid_header_field_fei_3(pdo: int) -> None:
    h = established()
    sqe = rw_sqe(IoOpcode.WRITE, 1, 1, 0, 1, 64, inline=True)
    bad = capsule(sqe, bytes(64), pdo=pdo)
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_PDO)
    assert h.requests == []


def test_term_req_carries_only_the_offending_pdu_header() -> None:
    """The TermReq's data is the header of the PDU in error (HLEN bytes), not its data."""
    h = established()
    sqe = write_sqe(1, 512, inline=True)
    bad = capsule(sqe, bytes(range(256)) * 2, pdo=74)
    term = assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_PDO)
    assert term.data == bad[: P.CAPSULE_CMD_HLEN]


def test_term_req_for_h2c_data_carries_only_its_header() -> None:
    h = io_connection()
    h.feed(h.capsule(write_sqe(5, 8192, inline=False)))
    [req] = h.requests
    h.conn.fetch_data(req, lambda r: None)
    [r2t] = h.take()
    bad = h2c_data(5, r2t.data_fields()[1] + 1, 0, b"\xab" * 4096)
    term = assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG)
    assert term.data == bad[: P.DATA_HLEN]


def test_nothing_is_processed_after_a_term_req() -> None:
    h = established()
    bad = P.COMMON_HEADER.pack(0x0A, 0, 24, 0, 24) + bytes(16)
    good = capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 7))
    # The bad PDU and a good capsule behind it in the same segment, then more later.
    assert_terminated(h, h.feed(bad + good), FES.INVALID_HEADER_FIELD)
    assert h.feed(good) == []
    assert h.requests == []
    assert h.conn.closing
    assert "C2HTermReq" in h.conn.close_reason


def test_h2c_term_req_closes_without_answer() -> None:
    h = established()
    term = P.pack_term_req(P.PduType.H2C_TERM_REQ, FES.INVALID_HEADER_FIELD, 0)
    assert h.feed(term) == []
    assert h.conn.closing
    assert h.feed(capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1))) == []
    assert h.requests == []


def test_pdus_split_at_every_byte_are_reassembled() -> None:
    h = Harness()
    stream = icreq() + capsule(write_sqe(9, 512, inline=True), b"\x5a" * 512)
    out: list[Pdu] = []
    for i in range(len(stream)):
        out += h.feed(stream[i : i + 1])
    assert [p.type for p in out] == [P.PduType.ICRESP]
    [req] = h.requests
    assert req.data == b"\x5a" * 512


# -- in-capsule data --------------------------------------------------------------------------


def test_in_capsule_data_reaches_on_command() -> None:
    h = io_connection()
    data = bytes(range(256)) * 16
    assert h.feed(h.capsule(write_sqe(3, 4096, inline=True), data)) == []
    [req] = h.requests
    assert req.sqe.cid == 3
    assert req.data == data
    assert req.length == 4096
    assert h.conn.stats.in_capsule_bytes == 4096


def test_in_capsule_data_above_the_limit_is_sgl_invalid_offset() -> None:
    h = io_connection()  # in-capsule limit 4096
    cqe = only_resp(h.feed(h.capsule(write_sqe(4, 8192, inline=True), bytes(8192))))
    assert (cqe.cid, cqe.status) == (4, Status.SGL_INVALID_OFFSET | DNR)
    assert h.requests == []
    assert not h.conn.closing


def test_connect_may_carry_1k_in_capsule_on_any_queue() -> None:
    h = established(TransportConfig(inline_data_size=0))
    h.conn.bind_queue(QueueParams(1, 32))
    cdw10, cdw11, cdw12 = C.ConnectCommand(0, 1, 31, 0, 0).cdws()
    sqe = C.build_sqe(
        AdminOpcode.FABRICS,
        1,
        FabricsType.CONNECT,
        cdw10,
        cdw11,
        cdw12,
        sgl_type=C.SGL_DATA_BLOCK_OFFSET,
        sgl_length=1024,
    )
    data = C.ConnectData(bytes(16), 1, "nqn.a", "nqn.b").pack()
    assert h.feed(h.capsule(sqe, data)) == []
    [req] = h.requests
    assert req.data == data


def test_sgl_length_different_from_in_capsule_data_is_data_sgl_length_invalid() -> None:
    h = io_connection()
    sqe = rw_sqe(IoOpcode.WRITE, 5, 1, 0, 2, 1024, inline=True)
    cqe = only_resp(h.feed(h.capsule(sqe, bytes(512))))
    assert (cqe.cid, cqe.status) == (5, Status.SGL_INVALID_DATA | DNR)
    assert h.requests == []


def test_sgl_promising_in_capsule_data_without_data_is_data_sgl_length_invalid() -> None:
    h = io_connection()
    cqe = only_resp(h.feed(h.capsule(write_sqe(6, 512, inline=True))))
    assert cqe.status == Status.SGL_INVALID_DATA | DNR
    assert h.requests == []


def test_in_capsule_data_at_a_non_zero_offset_is_sgl_invalid_offset() -> None:
    h = io_connection()  # ICDOFF is 0: in-capsule data starts right after the SQE
    sqe = C.build_sqe(
        IoOpcode.WRITE, 9, 1, sgl_type=C.SGL_DATA_BLOCK_OFFSET, sgl_addr=16, sgl_length=512
    )
    cqe = only_resp(h.feed(h.capsule(sqe, bytes(512))))
    assert (cqe.cid, cqe.status) == (9, Status.SGL_INVALID_OFFSET | DNR)
    assert h.requests == []


@pytest.mark.parametrize("with_data", [False, True])
def test_unsupported_sgl_descriptor_type_is_sgl_invalid_type(with_data: bool) -> None:
    h = io_connection()
    keyed = 0x40  # Keyed SGL Data Block: RDMA only
    sqe = C.build_sqe(IoOpcode.WRITE, 10, 1, sgl_type=keyed, sgl_length=512)
    cqe = only_resp(h.feed(h.capsule(sqe, bytes(512) if with_data else b"")))
    assert (cqe.cid, cqe.status) == (10, Status.SGL_INVALID_TYPE | DNR)
    assert h.requests == []


def test_in_capsule_data_on_a_read_is_invalid_field() -> None:
    h = io_connection()
    sqe = rw_sqe(IoOpcode.READ, 7, 1, 0, 1, 512, inline=True)
    cqe = only_resp(h.feed(h.capsule(sqe, bytes(512))))
    assert (cqe.cid, cqe.status) == (7, Status.INVALID_FIELD | DNR)
    assert h.requests == []


def test_duplicate_command_id_in_flight_is_a_conflict() -> None:
    h = io_connection()
    assert h.feed(h.capsule(read_sqe(8, 512))) == []
    cqe = only_resp(h.feed(h.capsule(read_sqe(8, 512))))
    assert (cqe.cid, cqe.status) == (8, Status.CMDID_CONFLICT | DNR)
    [first] = h.requests
    # The first command is still in flight and completes normally.
    h.conn.complete(first, Status.SUCCESS)
    cqe = only_resp(h.take())
    assert (cqe.cid, cqe.status) == (8, Status.SUCCESS)
    # Once it completed, the CID may be used again.
    assert h.feed(h.capsule(read_sqe(8, 512))) == []
    assert len(h.requests) == 2


def test_cid_of_a_reusable_command_may_be_taken_back_by_the_host() -> None:
    """SPDK's host at detach: its AERs (CIDs 0..3 here) are outstanding when it sends a
    Property Get with one of their CIDs; the new command runs and the old never completes."""
    h = established()
    h.conn.bind_queue(QueueParams(0, 32))
    aers = []
    for cid in range(4):
        assert h.feed(h.capsule(C.build_sqe(AdminOpcode.ASYNC_EVENT_REQUEST, cid))) == []
        aers.append(h.requests[-1])
        aers[-1].reusable = True  # as the controller marks a parked AER
    prop_get = C.build_sqe(AdminOpcode.FABRICS, 2, FabricsType.PROPERTY_GET, 0, C.PROP_CSTS)
    assert h.feed(h.capsule(prop_get)) == []
    new = h.requests[-1]
    assert new.sqe.opcode == AdminOpcode.FABRICS and aers[2].retired
    # The retired AER completing (an event arriving) sends nothing, and does not take
    # the CID from the command now using it.
    h.conn.complete(aers[2], Status.SUCCESS, 0x020002)
    assert h.take() == []
    h.conn.complete(new, Status.SUCCESS, C.CSTS_RDY)
    cqe = only_resp(h.take())
    assert (cqe.cid, cqe.status, cqe.result & 0xFFFFFFFF) == (2, Status.SUCCESS, C.CSTS_RDY)
    # The other AERs are untouched.
    assert not any(aer.retired for i, aer in enumerate(aers) if i != 2)


# -- R2T and H2CData --------------------------------------------------------------------------


def r2t_for(h: Harness, cid: int, length: int) -> tuple[Request, list[Request], int]:
    """Submit a write that needs R2T; fetch its data; return (req, arrivals, ttag)."""
    assert h.feed(h.capsule(write_sqe(cid, length, inline=False))) == []
    req = h.requests[-1]
    arrived: list[Request] = []
    h.conn.fetch_data(req, arrived.append)
    [r2t] = h.take()
    assert r2t.type == P.PduType.R2T
    cccid, ttag, offset, r2tl = r2t.data_fields()
    assert (cccid, offset, r2tl) == (cid, 0, length)
    return req, arrived, ttag


def test_fetch_data_emits_an_r2t() -> None:
    h = io_connection()
    assert h.feed(h.capsule(write_sqe(11, 16384, inline=False))) == []
    [req] = h.requests
    assert req.data is None
    h.conn.fetch_data(req, lambda r: None)
    [r2t] = h.take()
    assert r2t.type == P.PduType.R2T
    assert (r2t.flags, r2t.hlen, r2t.pdo, r2t.plen) == (0, P.R2T_HLEN, 0, P.R2T_HLEN)
    cccid, ttag, offset, length = r2t.data_fields()
    assert (cccid, offset, length) == (11, 0, 16384)
    assert 0 <= ttag < 0xFFFF
    assert h.conn.stats.r2t_sent == 1
    assert h.output_requests >= 1  # fetch_data runs outside feed(): the glue is told


def test_a_dropped_r2t_counts_apart_and_the_writer_goes_plain_once_no_mark_is_left() -> None:
    h = io_connection()
    assert h.feed(h.capsule(write_sqe(13, 16384, inline=False))) == []
    [req] = h.requests
    assert h.conn.inject(req, WireFault("drop_r2t"))
    assert isinstance(h.conn.writer, MarkingWriter)
    # The rules went, but the Write's R2T is still to be framed (and kept back).
    h.conn.faults_gone()
    assert isinstance(h.conn.writer, MarkingWriter)
    h.conn.fetch_data(req, lambda r: None)
    assert h.take() == []
    assert (h.conn.stats.r2t_sent, h.conn.stats.r2t_dropped) == (0, 1)
    h.conn.faults_gone()
    assert type(h.conn.writer) is PduWriter
    # Framed as before any rule: the next Write's R2T goes out, counted as sent.
    r2t_for(h, 14, 4096)
    assert (h.conn.stats.r2t_sent, h.conn.stats.r2t_dropped) == (1, 1)


def test_h2c_data_in_order_assembles_the_data_and_calls_back_once() -> None:
    h = io_connection()
    req, arrived, ttag = r2t_for(h, 12, 12288)
    data = bytes(i % 251 for i in range(12288))
    for i, offset in enumerate((0, 4096, 8192)):
        pdu = h2c_data(12, ttag, offset, data[offset : offset + 4096], last=i == 2)
        assert h.feed(pdu) == []
        assert len(arrived) == (1 if i == 2 else 0)
    assert arrived == [req]
    assert req.data == data
    assert h.conn.stats.h2c_data_pdus == 3
    # The transfer tag is released: more data for it is a protocol error.
    assert_terminated(
        h,
        h.feed(h2c_data(12, ttag, 0, data[:4096])),
        FES.INVALID_HEADER_FIELD,
        P.OFFSET_DATA_TTAG,
    )


def test_h2c_data_for_an_unknown_ttag_is_invalid_header_field_fei_10() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 13, 4096)
    bad = h2c_data(13, ttag + 1, 0, bytes(4096))
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG)
    assert arrived == []


def test_h2c_data_without_any_r2t_is_invalid_header_field_fei_10() -> None:
    h = io_connection()
    bad = h2c_data(1, 0, 0, bytes(512))
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG)


def test_h2c_data_with_the_wrong_cccid_is_invalid_header_field_fei_8() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 14, 4096)
    bad = h2c_data(15, ttag, 0, bytes(4096))
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_CCCID)
    assert arrived == []


def test_h2c_datal_different_from_the_pdu_data_is_invalid_header_field_fei_16() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 16, 8192)
    bad = h2c_data(16, ttag, 0, bytes(4096), datal=8192)
    assert_terminated(h, h.feed(bad), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_DATAL)
    assert arrived == []


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (None, 4096),  # skips the start
        (0, 8192),  # leaves a hole
        (0, 2048),  # overlaps what came before
        (0, 0),  # resends what came before
    ],
)
def test_h2c_data_offset_that_skips_or_overlaps_is_data_transfer_out_of_range(
    first: int | None, second: int
) -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 17, 12288)
    if first is not None:
        assert h.feed(h2c_data(17, ttag, first, bytes(4096), last=False)) == []
    assert_terminated(h, h.feed(h2c_data(17, ttag, second, bytes(4096))), FES.DATA_OUT_OF_RANGE)
    assert arrived == []


def test_h2c_data_beyond_the_requested_length_is_data_transfer_out_of_range() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 18, 4096)
    assert_terminated(h, h.feed(h2c_data(18, ttag, 0, bytes(8192))), FES.DATA_OUT_OF_RANGE)
    assert arrived == []


def test_h2c_data_above_maxh2cdata_is_data_transfer_limit_exceeded() -> None:
    h = established(TransportConfig(max_h2c_data=4096))
    h.conn.bind_queue(QueueParams(1, 32))
    _req, arrived, ttag = r2t_for(h, 19, 16384)
    bad = h2c_data(19, ttag, 0, bytes(8192))
    assert_terminated(h, h.feed(bad), FES.DATA_LIMIT_EXCEEDED)
    assert arrived == []


def test_h2c_data_at_maxh2cdata_is_accepted() -> None:
    h = established(TransportConfig(max_h2c_data=4096))
    h.conn.bind_queue(QueueParams(1, 32))
    req, arrived, ttag = r2t_for(h, 20, 8192)
    h.feed(h2c_data(20, ttag, 0, b"\x01" * 4096, last=False))
    h.feed(h2c_data(20, ttag, 4096, b"\x02" * 4096))
    assert arrived == [req]
    assert req.data == b"\x01" * 4096 + b"\x02" * 4096


def test_empty_h2c_data_is_invalid_header_field_fei_16() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 21, 4096)
    # Header only: DATAL 0, no data (PDO 0).
    empty = data_pdu(P.PduType.H2C_DATA, P.DATA_BODY.pack(21, ttag, 0, 0) + bytes(4))
    assert_terminated(h, h.feed(empty), FES.INVALID_HEADER_FIELD, P.OFFSET_DATA_DATAL)
    assert arrived == []


def test_last_pdu_flag_must_mark_exactly_the_pdu_that_ends_the_transfer() -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 22, 8192)
    early = h2c_data(22, ttag, 0, bytes(4096), last=True)  # 4 KiB of 8 are still to come
    assert_terminated(h, h.feed(early), FES.INVALID_HEADER_FIELD, P.OFFSET_FLAGS)
    assert arrived == []
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 23, 8192)
    assert h.feed(h2c_data(23, ttag, 0, bytes(4096), last=False)) == []
    unmarked = h2c_data(23, ttag, 4096, bytes(4096), last=False)  # ends it, says it does not
    assert_terminated(h, h.feed(unmarked), FES.INVALID_HEADER_FIELD, P.OFFSET_FLAGS)
    assert arrived == []


@pytest.mark.parametrize("flag", [P.FLAG_HDGST, P.FLAG_DDGST])
def test_digest_flag_without_that_digest_negotiated_is_invalid_header_field_fei_1(
    flag: int,
) -> None:
    h = io_connection()
    _req, arrived, ttag = r2t_for(h, 24, 4096)
    pdu = bytearray(h2c_data(24, ttag, 0, bytes(4096)))
    pdu[1] |= flag
    assert_terminated(h, h.feed(bytes(pdu)), FES.INVALID_HEADER_FIELD, P.OFFSET_FLAGS)
    assert arrived == []


# -- digests ----------------------------------------------------------------------------------


def test_corrupted_header_digest_is_a_header_digest_error() -> None:
    h = io_connection(hdgst=True)
    good = h.capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1))
    bad = bytearray(good)
    bad[P.CAPSULE_CMD_HLEN] ^= 0x01  # first byte of the header digest
    term = assert_terminated(h, h.feed(bytes(bad)), FES.HEADER_DIGEST_ERROR)
    assert term.data[: P.CAPSULE_CMD_HLEN] == good[: P.CAPSULE_CMD_HLEN]
    assert h.requests == []


@pytest.mark.parametrize("undefined_type", [False, True])
def test_termreq_holds_the_offending_header_only_whatever_follows_it(
    undefined_type: bool,
) -> None:
    # What the peer is told must not depend on how its stream was cut: the bytes after
    # the offending header (the next PDU, data) are not in the TermReq (a fuzzed stream
    # with an undefined type 08h and HLEN 9 once got 8 or 9 bytes back by the cut).
    def term_data(cut: bool) -> bytes:
        h = io_connection(hdgst=True)
        if undefined_type:
            bad = P.COMMON_HEADER.pack(0x08, 0, 9, 0, 0x80008000) + bytes(64)
            header = P.CH_LEN
        else:
            good = h.capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1))
            bad = bytes([*good[: P.CAPSULE_CMD_HLEN], good[P.CAPSULE_CMD_HLEN] ^ 1])
            bad += good[P.CAPSULE_CMD_HLEN + 1 :] + good  # a digest error, then more
            header = P.CAPSULE_CMD_HLEN
        pdus = h.feed(bad[:header]) + h.feed(bad[header:]) if cut else h.feed(bad)
        fes = FES.INVALID_HEADER_FIELD if undefined_type else FES.HEADER_DIGEST_ERROR
        term = assert_terminated(h, pdus, fes)
        assert term.data == bad[:header]
        return term.data

    assert term_data(cut=True) == term_data(cut=False)


def test_header_digest_is_checked_on_the_header_not_just_its_digest() -> None:
    h = io_connection(hdgst=True)
    bad = bytearray(h.capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)))
    bad[P.CH_LEN + 2] ^= 0xFF  # the CID, covered by the digest
    assert_terminated(h, h.feed(bytes(bad)), FES.HEADER_DIGEST_ERROR)


def test_header_digest_on_but_flag_missing_is_invalid_header_field() -> None:
    h = io_connection(hdgst=True)
    bad = bytearray(h.capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, 1)))
    bad[1] &= ~P.FLAG_HDGST
    assert_terminated(h, h.feed(bytes(bad)), FES.INVALID_HEADER_FIELD, P.OFFSET_FLAGS)


def test_corrupted_data_digest_fails_the_capsule_and_the_connection_keeps_working() -> None:
    h = io_connection(hdgst=True, ddgst=True)
    good = h.capsule(write_sqe(21, 512, inline=True), b"\x11" * 512)
    bad = bytearray(good)
    bad[-1] ^= 0x80  # last byte of the data digest
    cqe = only_resp(h.feed(bytes(bad)))
    assert cqe.cid == 21
    assert cqe.status == Status.TRANSIENT_TRANSPORT_ERROR  # retryable: no DNR
    assert h.requests == []
    assert not h.conn.closing
    assert h.conn.stats.data_digest_errors == 1
    # The host retries with the same CID: it is free again, and the command runs.
    assert h.feed(good) == []
    [req] = h.requests
    assert req.data == b"\x11" * 512
    h.conn.complete(req, Status.SUCCESS)
    assert only_resp(h.take()).status == Status.SUCCESS


def test_corrupted_data_digest_on_h2c_data_fails_that_command_only() -> None:
    h = io_connection(ddgst=True)
    req, arrived, ttag = r2t_for(h, 22, 4096)
    bad = bytearray(h2c_data(22, ttag, 0, b"\x22" * 4096, ddgst=True))
    bad[-4] ^= 0x01
    cqe = only_resp(h.feed(bytes(bad)))
    assert (cqe.cid, cqe.status) == (22, Status.TRANSIENT_TRANSPORT_ERROR)
    assert arrived == [req] and req.data is None  # the waiter learns no data is coming
    assert not h.conn.closing
    h.feed(h.capsule(read_sqe(23, 512)))
    assert [r.sqe.cid for r in h.requests] == [22, 23]


def test_sq_head_advances_for_a_capsule_failed_by_its_data_digest() -> None:
    """Every capsule consumes a submission queue entry, including one whose data digest is
    wrong: the SQHD of later completions must count it."""
    h = io_connection(ddgst=True)
    h.feed(h.capsule(read_sqe(1, 512)))
    bad = bytearray(h.capsule(write_sqe(2, 512, inline=True), bytes(512)))
    bad[-1] ^= 0x01
    failed = only_resp(h.feed(bytes(bad)))
    h.feed(h.capsule(read_sqe(3, 512)))
    first, third = h.requests
    h.conn.complete(first, Status.SUCCESS)
    h.conn.complete(third, Status.SUCCESS)
    heads = [failed.sq_head] + [p.cqe().sq_head for p in h.take()]
    assert heads == [3, 4, 4]  # past the Connect's entry, then 1, 2 and 3


# -- completions ------------------------------------------------------------------------------


def test_capsule_resp_layout() -> None:
    h = established()
    h.conn.bind_queue(QueueParams(3, 8))
    for cid in (0x101, 0x102, 0x103):
        h.feed(h.capsule(C.build_sqe(AdminOpcode.KEEP_ALIVE, cid)))
    first, second, third = h.requests
    h.conn.complete(second, Status.LBA_OUT_OF_RANGE | DNR, result=0x1122334455667788)
    [resp] = h.take()
    assert resp.type == P.PduType.CAPSULE_RESP
    assert (resp.flags, resp.hlen, resp.pdo, resp.plen) == (0, 24, 0, 24)
    dw0, dw1, sqhd, sqid, cid, sf = P.CAPSULE_RESP.unpack(resp.raw)[5:]
    assert (dw0, dw1) == (0x55667788, 0x11223344)
    assert (sqhd, sqid, cid) == (4, 3, 0x102)  # past the Connect's entry and three more
    assert sf == (Status.LBA_OUT_OF_RANGE | DNR) << 1
    assert sf & 1 == 0  # the phase tag is not used on fabrics
    h.conn.complete(first, Status.SUCCESS)
    h.conn.complete(third, Status.SUCCESS)
    assert [(c.cid, c.status) for c in (p.cqe() for p in h.take())] == [
        (0x101, 0),
        (0x103, 0),
    ]


def test_sq_head_wraps_at_the_queue_size() -> None:
    h = established()
    h.conn.bind_queue(QueueParams(1, 4))
    heads = []
    for cid in range(6):
        h.feed(h.capsule(read_sqe(cid, 512)))
        h.conn.complete(h.requests[-1], Status.SUCCESS)
        heads.append(only_resp(h.take()).sq_head)
    assert heads == [2, 3, 0, 1, 2, 3]


def test_read_data_is_sent_as_c2h_data_then_capsule_resp() -> None:
    h = io_connection()
    h.feed(h.capsule(read_sqe(30, 2048)))
    [req] = h.requests
    data = bytes(range(256)) * 8
    h.conn.complete(req, Status.SUCCESS, data=data)
    c2h, resp = h.take()
    assert c2h.type == P.PduType.C2H_DATA
    assert c2h.flags == P.FLAG_DATA_LAST
    assert (c2h.hlen, c2h.pdo, c2h.plen) == (24, 24, 24 + 2048)
    assert c2h.data_fields() == (30, 0, 0, 2048)
    assert c2h.data == data
    cqe = resp.cqe()
    assert (cqe.cid, cqe.status, cqe.sq_id) == (30, 0, 1)
    assert h.conn.stats.c2h_data_pdus == 1


def test_failed_read_sends_no_data() -> None:
    h = io_connection()
    h.feed(h.capsule(read_sqe(31, 512)))
    h.conn.complete(h.requests[0], Status.UNRECOVERED_READ_ERROR, data=bytes(512))
    [resp] = h.take()
    assert resp.cqe().status == Status.UNRECOVERED_READ_ERROR


def test_sqhd_disabled_read_completes_with_c2h_data_success_only() -> None:
    h = established()
    h.conn.bind_queue(QueueParams(1, 32, sqhd_disabled=True))
    h.feed(h.capsule(read_sqe(32, 512)))
    h.conn.complete(h.requests[0], Status.SUCCESS, data=b"\x33" * 512)
    [c2h] = h.take()
    assert c2h.type == P.PduType.C2H_DATA
    assert c2h.flags == P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS
    assert c2h.data_fields() == (32, 0, 0, 512)
    assert c2h.data == b"\x33" * 512
    # A command without data still gets a CapsuleResp, with SQHD reserved (0xFFFF).
    h.feed(h.capsule(C.build_sqe(IoOpcode.FLUSH, 33, 1)))
    h.conn.complete(h.requests[1], Status.SUCCESS)
    cqe = only_resp(h.take())
    assert (cqe.cid, cqe.sq_head) == (33, 0xFFFF)


def test_digests_and_hpda_shape_c2h_data() -> None:
    h = io_connection(hdgst=True, ddgst=True, hpda=1)
    h.feed(h.capsule(read_sqe(34, 512)))
    h.conn.complete(h.requests[0], Status.SUCCESS, data=b"\x44" * 512)
    c2h, resp = h.take()  # parse_pdus checks both digests of each
    assert c2h.flags == P.FLAG_DATA_LAST | P.FLAG_HDGST | P.FLAG_DDGST
    assert c2h.pdo == 32  # header + digest = 28, aligned up to (HPDA + 1) * 4 = 8
    assert c2h.plen == 32 + 512 + 4
    assert c2h.data == b"\x44" * 512
    assert resp.flags == P.FLAG_HDGST and resp.plen == 28


def test_completion_after_close_is_dropped() -> None:
    h = io_connection()
    h.feed(h.capsule(read_sqe(35, 512)))
    h.conn.close("test")
    h.conn.complete(h.requests[0], Status.SUCCESS, data=bytes(512))
    assert h.take() == []


# -- robustness beyond single PDUs ------------------------------------------------------------


@pytest.mark.parametrize("max_h2c_data", [32 * 1024, 128 * 1024])
def test_capsule_in_the_same_segment_as_the_icreq_is_processed(max_h2c_data: int) -> None:
    """The ICReq enlarges the receive buffer; a capsule that arrived with it (already
    in the old buffer) must still be parsed, whatever the configured sizes."""
    h = Harness(TransportConfig(max_h2c_data=max_h2c_data))
    data = b"\x5a" * 512
    out = h.feed(icreq() + capsule(write_sqe(1, 512, inline=True), data))
    assert [p.type for p in out] == [P.PduType.ICRESP]
    assert not h.conn.closing
    [req] = h.requests
    assert req.data == data


def test_transfer_tag_reused_after_wraparound_stays_with_its_new_command() -> None:
    """A command whose data arrived long ago completes after its transfer tag has been
    handed to another command: completing it must not cancel the other's transfer."""
    h = io_connection()
    slow, _arrived, slow_ttag = r2t_for(h, 1, 512)
    assert h.feed(h2c_data(1, slow_ttag, 0, bytes(512))) == []
    # Every other tag is used once (each transfer completes), so the next R2T
    # gets the slow command's tag again.
    ttag = slow_ttag
    for _ in range(0xFFFE):
        req, _done, ttag = r2t_for(h, 2, 512)
        h.feed(h2c_data(2, ttag, 0, bytes(512)))
        h.conn.complete(req, Status.SUCCESS)
        h.take()
    reused, arrived, ttag = r2t_for(h, 3, 1024)
    assert ttag == slow_ttag
    h.conn.complete(slow, Status.SUCCESS)  # the slow command finally completes
    assert only_resp(h.take()).cid == 1
    assert h.feed(h2c_data(3, ttag, 0, b"\x01" * 1024)) == []
    assert arrived == [reused]
    assert not h.conn.closing


# -- hand-over: an established connection continued by another TargetConnection ----------


def test_input_pending_says_whether_received_bytes_wait_to_be_handled() -> None:
    h = io_connection()
    whole = h.capsule(read_sqe(1, 4096))
    assert not h.conn.input_pending()
    h.conn.feed(whole[:10])
    assert h.conn.input_pending()
    h.conn.feed(whole[10:])
    assert not h.conn.input_pending()
    assert len(h.requests) == 1


@pytest.mark.parametrize(("hdgst", "ddgst", "hpda"), [(False, False, 0), (True, True, 3)])
def test_an_adopting_connection_answers_as_the_one_it_continues(
    hdgst: bool, ddgst: bool, hpda: int
) -> None:
    first = io_connection(hdgst=hdgst, ddgst=ddgst, hpda=hpda)
    first.feed(first.capsule(read_sqe(1, 4096)))
    [pending] = first.requests
    state = first.conn.export_state()
    assert (state.hpda, state.hdgst, state.ddgst, state.sqhd) == (hpda, hdgst, ddgst, 2)
    second = Harness()
    second.conn.adopt(state)
    second.conn.qid, second.conn.sq_size, second.conn.inline_limit = 1, 32, 4096  # bound
    assert second.conn.established
    # The same completion, byte for byte (digests, PDU data offset, SQHD).
    data = bytes(range(256)) * 16
    outputs = []
    for h, req in ((first, pending), (second, Request(pending.sqe))):
        h.conn.complete(req, Status.SUCCESS, 0, data)
        outputs.append(b"".join(bytes(b) for b in h.conn.take_output()))
    assert outputs[0] == outputs[1]
    [c2h, resp] = parse_pdus(outputs[1], hdgst=hdgst, ddgst=ddgst)
    assert c2h.data == data and c2h.pdo == P.data_offset(P.DATA_HLEN, hdgst, hpda)
    assert resp.cqe().sq_head == 2
    # And it parses what the host sends next as the handshake settled.
    written = b"\x5a" * 4096
    assert second.feed(second.capsule(write_sqe(2, 4096, inline=True), written)) == []
    [req] = second.requests
    assert bytes(req.data or b"") == written and second.conn.export_state().sqhd == 3


def test_only_an_established_connection_exports_and_only_a_fresh_one_adopts() -> None:
    with pytest.raises(RuntimeError):
        Harness().conn.export_state()
    state = io_connection().conn.export_state()
    with pytest.raises(RuntimeError):
        io_connection().conn.adopt(state)


def test_a_capsule_carries_the_clock_reads_of_the_batches_that_brought_it() -> None:
    """Latency tracking: a capsule whole in one batch began at that batch's clock read
    (and was dispatched in it: `dispatched` 0); one cut across two batches began when the
    reader saw its first part and was dispatched at the second's; the capsule after it in
    the second batch began with that batch; with tracking off (0), a command carries none."""
    h = io_connection()
    first = h.capsule(write_sqe(1, 512, inline=True), bytes(512))
    second = h.capsule(write_sqe(2, 512, inline=True), bytes(512))
    third = h.capsule(write_sqe(3, 512, inline=True), bytes(512))
    h.conn.batch_arrived(1_000)
    h.feed(first + second[:30])
    assert h.conn.reader.partial_since > 0  # when it saw the second capsule incomplete
    begun = int(h.conn.reader.partial_since * 1e9)
    h.conn.batch_arrived(begun + 5_000_000)
    h.feed(second[30:] + third)
    h.conn.batch_arrived(0)
    h.feed(h.capsule(write_sqe(4, 512, inline=True), bytes(512)))
    *timed, untimed = h.requests
    assert [(r.started, r.dispatched) for r in timed] == [
        (1_000, 0),
        (begun, begun + 5_000_000),
        (begun + 5_000_000, 0),
    ]
    assert untimed.started == 0


def test_a_completion_is_timed_only_where_the_nvme_layer_counted_it() -> None:
    h = io_connection()
    h.conn.batch_arrived(1_000)
    h.feed(h.capsule(read_sqe(1, 512)) + h.capsule(read_sqe(2, 512)))
    counted, refused = h.requests
    counted.latency = Histogram()  # IoHandler sets it where it counts the command
    h.conn.complete(counted, 0)
    h.conn.complete(refused, Status.INVALID_FIELD | DNR)
    assert h.conn.timed == [counted]
