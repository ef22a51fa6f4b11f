"""Properties of the sans-I/O transport under hostile input, for both roles.

Run with a bounded budget in `make test` (the "ci" profile of tests/fuzz/conftest.py);
`make fuzz` runs the coverage-guided fuzzer over the same entry points.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.tcp.framing import PduReader
from pynvmf.tcp.host import HostCommand, HostConnection
from tests.fuzz.streams import Shape, chunked, cut_lists, drive_target, host_streams
from tests.support.raw import data_pdu, parse_pdus

TARGET_TO_HOST = frozenset(
    (P.PduType.ICRESP, P.PduType.CAPSULE_RESP, P.PduType.C2H_DATA, P.PduType.R2T)
)


@given(host_streams(), cut_lists)
def test_target_connection_answers_any_stream_with_well_formed_pdus(
    stream: tuple[Shape, bytes], cuts: list[int]
) -> None:
    _shape, data = stream
    out, model = drive_target(chunked(data, cuts))
    conn = model.conn
    assert conn is not None
    pdus = parse_pdus(out, hdgst=conn.hdgst, ddgst=conn.ddgst)
    terms = [i for i, pdu in enumerate(pdus) if pdu.type == P.PduType.C2H_TERM_REQ]
    # At most one TermReq, the last thing sent, and the connection is closing after it.
    assert len(terms) <= 1
    if terms:
        assert terms[0] == len(pdus) - 1 and conn.closing
        # It carries the offending PDU's header at most, never more than the spec allows.
        assert len(pdus[-1].raw) <= P.TERM_REQ_MAX_DATA + P.TERM_REQ_HLEN
    for pdu in pdus:
        assert pdu.type in TARGET_TO_HOST | {P.PduType.C2H_TERM_REQ}, pdu
        if pdu.type in (P.PduType.C2H_DATA, P.PduType.R2T):
            _cid, _ttag, offset, length = pdu.data_fields()
            assert offset + length <= 65536 or pdu.type == P.PduType.C2H_DATA
    # The receive buffer never outgrows two maximal PDUs (or its initial size).
    reader = conn.reader
    assert reader.buffer_size <= max(2 * reader.max_pdu_len, 256 * 1024)


@given(host_streams(), cut_lists, cut_lists)
def test_target_connection_output_does_not_depend_on_how_the_stream_is_cut(
    stream: tuple[Shape, bytes], cuts_a: list[int], cuts_b: list[int]
) -> None:
    _shape, data = stream
    out_a, model_a = drive_target(chunked(data, cuts_a))
    out_b, model_b = drive_target(chunked(data, cuts_b))
    assert model_a.seen == model_b.seen
    assert out_a == out_b


@given(st.binary(max_size=2048), cut_lists)
def test_pdu_reader_reports_in_bounds_pdus_or_one_fatal_error(data: bytes, cuts: list[int]) -> None:
    seen: list[tuple[int, int, int]] = []
    fatal: list[tuple[int, int]] = []

    def on_pdu(t: int, f: int, hlen: int, pdo: int, end: int, pdu: memoryview) -> None:
        assert 0 <= pdo <= end <= len(pdu)
        seen.append((t, pdo, end))

    reader = PduReader(
        on_pdu,
        lambda fes, fei, _off: fatal.append((fes, fei)),
        accepted_types=frozenset(P.PduType),
        max_pdu_len=4096,
    )
    for piece in chunked(data, cuts):
        if reader.dead:
            break
        reader.feed(piece)
    assert len(fatal) <= 1
    assert reader.dead == bool(fatal)


def _target_pdus(draw: st.DrawFn, hdgst: bool, ddgst: bool) -> bytes:
    kind = draw(st.sampled_from(["resp", "c2h", "r2t", "term", "garbage"]))
    cid = draw(st.integers(0, 9))
    dg = {"hdgst": hdgst, "ddgst": ddgst}
    if kind == "resp":
        body = C.Cqe(
            draw(st.integers(0, 2**32 - 1)), 0, 1, cid, draw(st.integers(0, 0xFFFF))
        ).pack()
        return data_pdu(P.PduType.CAPSULE_RESP, body, **dg)
    if kind in ("c2h", "r2t"):
        offset = draw(st.sampled_from([0, 512]) | st.integers(0, 2**32 - 1))
        length = draw(st.sampled_from([0, 512, 4096]) | st.integers(0, 2**32 - 1))
        body = P.DATA_BODY.pack(cid, draw(st.integers(0, 0xFFFF)), offset, length) + bytes(4)
        if kind == "r2t":
            return data_pdu(P.PduType.R2T, body, **dg)
        payload = bytes(min(length, 4096))
        flags = draw(st.sampled_from([0, P.FLAG_DATA_LAST, P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS]))
        return data_pdu(P.PduType.C2H_DATA, body, payload, flags=flags, **dg)
    if kind == "term":
        return P.pack_term_req(P.PduType.C2H_TERM_REQ, draw(st.integers(0, 0xFFFF)), 0)
    return draw(st.binary(max_size=64))


@st.composite
def target_streams(draw: st.DrawFn) -> tuple[bool, bool, bytes]:
    hdgst, ddgst = draw(st.booleans()), draw(st.booleans())
    dgst = (P.DIGEST_HEADER if hdgst else 0) | (P.DIGEST_DATA if ddgst else 0)
    icresp = P.pack_ic(P.PduType.ICRESP, 0, draw(st.sampled_from([0, 0, 3])), dgst, 65536)
    body = b"".join(_target_pdus(draw, hdgst, ddgst) for _ in range(draw(st.integers(0, 10))))
    return hdgst, ddgst, icresp + body


@given(target_streams(), cut_lists)
def test_host_connection_survives_any_target(
    stream: tuple[bool, bool, bytes], cuts: list[int]
) -> None:
    hdgst, ddgst, data = stream
    done: list[HostCommand] = []
    conn = HostConnection(
        16, done.append, lambda: None, header_digest=hdgst, data_digest=ddgst, max_transfer=65536
    )
    conn.start()
    pieces = chunked(data, cuts)
    submitted = False
    for piece in pieces:
        if conn.closing:
            break
        conn.feed(piece)
        if conn.established and not submitted and not conn.closing:
            submitted = True
            conn.submit(IoOpcode.READ, 1, cdw12=7, into=memoryview(bytearray(4096)))
            conn.submit(IoOpcode.WRITE, 1, cdw12=0, data=bytes(512))
            conn.submit(IoOpcode.WRITE, 1, cdw12=31, data=bytes(16384))
    out = b"".join(bytes(b) for b in conn.take_output())
    pdus = parse_pdus(out, hdgst=conn.hdgst, ddgst=conn.ddgst)
    # Everything the host sent is a PDU a host may send, at most one TermReq, last.
    host_types = {P.PduType.ICREQ, P.PduType.CAPSULE_CMD, P.PduType.H2C_DATA}
    terms = [i for i, pdu in enumerate(pdus) if pdu.type == P.PduType.H2C_TERM_REQ]
    assert len(terms) <= 1 and (not terms or terms[0] == len(pdus) - 1)
    assert all(pdu.type in host_types | {P.PduType.H2C_TERM_REQ} for pdu in pdus)
    # A command completes at most once.
    assert len({id(cmd) for cmd in done}) == len(done)
