"""The recording format (pynvmf/record/format.py), the tap that writes it
(pynvmf/record/tap.py) and the comparison of answers (pynvmf/record/compare.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pynvmf.record import format as F
from pynvmf.record.compare import compare
from pynvmf.record.tap import Recorder
from pynvmf.spec import pdu as P
from pynvmf.spec.command import Sqe
from pynvmf.spec.identify import IdentifyController
from pynvmf.spec.opcodes import AdminOpcode
from pynvmf.spec.status import Status
from pynvmf.tcp.digest import crc32c


def _resp(cid: int, status: int = 0, dw0: int = 0, sqhd: int = 1, hdgst: bool = False) -> bytes:
    flags = P.FLAG_HDGST if hdgst else 0
    plen = P.CAPSULE_RESP_HLEN + (4 if hdgst else 0)
    header = P.CAPSULE_RESP.pack(
        P.PduType.CAPSULE_RESP,
        flags,
        P.CAPSULE_RESP_HLEN,
        0,
        plen,
        dw0,
        0,
        sqhd,
        0,
        cid,
        status << 1,
    )
    return header + (crc32c(header).to_bytes(4, "little") if hdgst else b"")


def _c2h(cccid: int, data: bytes, offset: int = 0, ddgst: bool = False) -> bytes:
    pdo = P.DATA_HLEN
    plen = pdo + len(data) + (4 if ddgst else 0)
    flags = P.FLAG_DATA_LAST | (P.FLAG_DDGST if ddgst else 0)
    header = P.DATA_HEADER.pack(
        P.PduType.C2H_DATA, flags, P.DATA_HLEN, pdo, plen, cccid, 0, offset, len(data)
    )
    return header + data + (crc32c(data).to_bytes(4, "little") if ddgst else b"")


def _identify(cns: int) -> Sqe:
    return Sqe(AdminOpcode.IDENTIFY, 0, 1, 0, 0, 4096, 0, cns, 0, 0, 0, 0, 0)


# -- format -------------------------------------------------------------------------------


def test_a_recording_reads_back_what_was_written() -> None:
    header = F.header_line(
        role="target",
        connection=3,
        local="127.0.0.1:4420",
        peer="10.0.0.1:5",
        wall="w",
        monotonic_ns=7,
    )
    pdus = [P.pack_ic(P.PduType.ICREQ, 0, 0, 3, 0), _resp(5), _c2h(5, b"x" * 8, ddgst=True)]
    lines = [
        header,
        *(F.pdu_line(10 + n, raw) for n, raw in enumerate(pdus)),
        F.end_line(20, "cap"),
    ]
    rec = F.parse(lines)
    assert rec.header["connection"] == 3 and rec.end == "cap"
    assert [p.raw for p in rec.pdus] == pdus
    assert [p.direction for p in rec.pdus] == [F.H2C, F.C2H, F.C2H]
    # Data without its digest; the PDU as it travelled, with it.
    assert rec.pdus[2].data == b"x" * 8 and len(rec.pdus[2].raw) == P.DATA_HLEN + 12
    assert json.loads(lines[2])["type"] == "CapsuleResp"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty"),
        (['{"format": "other", "version": 1}'], "format field"),
        (['{"format": "pynvmf-recording", "version": 2}'], "version 2"),
        (['{"format": "pynvmf-recording", "version": 1}', '{"ns": 1}'], ":2: a PDU line"),
        (['{"format": "pynvmf-recording", "version": 1}', '{"ns": 1, "pdu": "00"}'], "shorter"),
        (["[1]"], "not a JSON object"),
    ],
)
def test_what_is_not_a_recording_is_refused_naming_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(F.FormatError, match=message):
        F.parse(lines)


def test_a_last_line_cut_short_ends_the_recording() -> None:
    header = F.header_line(role="host", connection=1, local="", peer="", wall="", monotonic_ns=0)
    line = F.pdu_line(1, _resp(1))
    rec = F.parse([header, line, line[:20]])
    assert len(rec.pdus) == 1 and rec.end == "truncated"


# -- the tap ------------------------------------------------------------------------------


def test_the_tap_cuts_streams_into_pdus_however_they_arrive(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path)
    tap = recorder.open("target", "a:1", "b:2")
    assert tap is not None
    icreq = P.pack_ic(P.PduType.ICREQ, 0, 0, 0, 0)
    for i in range(0, len(icreq), 5):  # in pieces
        tap.received(icreq[i : i + 5])
    tap.sent([_resp(1)[:3], _resp(1)[3:] + _c2h(1, b"abc")])
    tap.closed("connection closed")
    (path,) = tmp_path.iterdir()
    rec = F.load(path)
    assert [p.type for p in rec.pdus] == [
        P.PduType.ICREQ,
        P.PduType.CAPSULE_RESP,
        P.PduType.C2H_DATA,
    ]
    assert rec.end == ""


def test_a_stream_that_is_not_nvme_tcp_stops_its_recording(tmp_path: Path) -> None:
    tap = Recorder(tmp_path).open("target", "a:1", "b:2")
    assert tap is not None
    tap.received(b"GET / HTTP/1.1\r\n\r\n")
    assert not tap.recording
    (path,) = tmp_path.iterdir()
    assert "not NVMe/TCP" in F.load(path).end


def test_the_caps_stop_recording_with_an_end_line(tmp_path: Path) -> None:
    line = len(F.pdu_line(time.monotonic_ns(), _resp(1))) + 1
    recorder = Recorder(tmp_path, max_file_bytes=3 * line, max_total_bytes=5 * line)
    first = recorder.open("target", "a:1", "b:1")
    assert first is not None
    first.sent([_resp(1)] * 4)  # the fourth is past the file's cap
    assert not first.recording
    second = recorder.open("target", "a:1", "b:2")
    assert second is not None
    second.sent([_resp(1)] * 3)  # the third is past the directory's cap
    assert not second.recording and recorder.full
    assert recorder.open("target", "a:1", "b:3") is None  # nothing more is recorded
    first_rec, second_rec = (F.load(p) for p in sorted(tmp_path.iterdir()))
    assert len(first_rec.pdus) == 3 and "file's cap" in first_rec.end
    assert len(second_rec.pdus) == 2 and "directory's cap" in second_rec.end


# -- comparison ---------------------------------------------------------------------------


def test_digests_do_not_make_a_difference() -> None:
    assert compare(_resp(1, hdgst=True), _resp(1)) == []
    assert compare(_c2h(1, b"data", ddgst=True), _c2h(1, b"data")) == []


def test_a_status_and_a_header_field_are_named() -> None:
    diffs = compare(_resp(1, sqhd=1), _resp(1, Status.INTERNAL_ERROR, sqhd=2), qid=1)
    assert {(d.field, d.recorded, d.live) for d in diffs} == {
        ("sqhd", 1, 2),
        ("status", "SUCCESS", "INTERNAL_ERROR"),
    }


def test_data_differences_say_where() -> None:
    (diff,) = compare(
        _c2h(1, bytes(64), offset=4096), _c2h(1, bytes(10) + b"\1\2" + bytes(52), offset=4096)
    )
    assert diff.field == "data[4106:4108] (2 bytes differ)"
    assert diff.recorded == bytes(2) and diff.live == b"\1\2"


def test_identify_controller_is_compared_field_by_field_after_normalisation() -> None:
    a = IdentifyController(vid=1, sn="A", fr="1.0", mn="pynvmf", cntlid=1).pack()
    b = IdentifyController(vid=1, sn="B", fr="2.0", mn="Linux", cntlid=7).pack()
    diffs = compare(_c2h(1, a), _c2h(1, b), _identify(1))
    assert [(d.field, d.recorded, d.live) for d in diffs] == [
        ("identify-controller.mn", "pynvmf", "Linux")
    ]
    # Without the command it answers, the same data is compared byte for byte.
    assert compare(_c2h(1, a), _c2h(1, b))[0].field.startswith("data[")


def test_a_connect_response_cntlid_is_not_compared() -> None:
    connect = Sqe(AdminOpcode.FABRICS, 0, 1, 0x01, 0, 1024, 0, 0, 0, 0, 0, 0, 0)
    assert compare(_resp(1, dw0=1), _resp(1, dw0=2), connect) == []
    assert compare(_resp(1, dw0=1), _resp(1, dw0=2))[0].field == "dw0"


def test_a_log_pages_generation_counter_is_not_compared() -> None:
    ana_log = Sqe(AdminOpcode.GET_LOG_PAGE, 0, 1, 0, 0, 64, 0, 0x0C, 0, 0, 0, 0, 0)
    page = bytearray(64)
    other = bytearray(64)
    other[0] = 9  # the change count
    assert compare(_c2h(1, bytes(page)), _c2h(1, bytes(other)), ana_log) == []
    other[8] = 1  # the number of descriptors
    (diff,) = compare(_c2h(1, bytes(page)), _c2h(1, bytes(other)), ana_log)
    assert diff.field.startswith("log[8:9]")


def test_a_directory_that_takes_no_file_stops_recording_without_failing(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "rec")
    (tmp_path / "rec").rmdir()
    (tmp_path / "rec").write_text("now a file")
    assert recorder.open("target", "a:1", "b:1") is None
    assert recorder.full


def test_a_second_recording_in_the_same_directory_overwrites_nothing(tmp_path: Path) -> None:
    for _ in range(2):
        tap = Recorder(tmp_path).open("target", "a:1", "b:1")
        assert tap is not None
        tap.sent([_resp(1)])
        tap.closed("connection closed")
    names = sorted(p.name[:6] for p in tmp_path.iterdir())
    assert names == ["000001", "000002"]
    assert all(len(F.load(p).pdus) == 1 for p in tmp_path.iterdir())
