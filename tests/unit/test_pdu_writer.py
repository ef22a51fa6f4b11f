"""PduWriter's fixed-layout methods (c2h_data, capsule_resp) frame the same bytes as its
general data/control with the C2HData and CapsuleResp layouts, for every digest choice and
data alignment; MarkingWriter's marks still act on PDUs framed through them."""

from __future__ import annotations

import pytest

from pynvmf.spec import pdu as P
from pynvmf.tcp.framing import MARK_DATA_DIGEST, MARK_HEADER_DIGEST, MarkingWriter, PduWriter

Buffer = bytes | bytearray | memoryview

SETTINGS = [
    pytest.param(hdgst, ddgst, pda, id=f"hdgst={hdgst}-ddgst={ddgst}-pda={pda}")
    for hdgst in (False, True)
    for ddgst in (False, True)
    for pda in (0, 1, 7)
]


def writer(cls: type[PduWriter], hdgst: bool, ddgst: bool, pda: int) -> PduWriter:
    w = cls()
    w.configure(hdgst=hdgst, ddgst=ddgst, pda=pda)
    return w


def wire(out: list[Buffer]) -> bytes:
    return b"".join(bytes(b) for b in out)


@pytest.mark.parametrize(("hdgst", "ddgst", "pda"), SETTINGS)
def test_c2h_data_frames_as_data(hdgst: bool, ddgst: bool, pda: int) -> None:
    payload = bytes(range(256)) * 16
    flags = P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS
    general: list[Buffer] = []
    writer(PduWriter, hdgst, ddgst, pda).data(
        general, P.DATA_HEADER, P.PduType.C2H_DATA, flags, P.DATA_HLEN, payload, 7, 0, 512, 4096
    )
    fixed: list[Buffer] = []
    writer(PduWriter, hdgst, ddgst, pda).c2h_data(fixed, flags, 7, 512, memoryview(payload), 4096)
    assert wire(fixed) == wire(general)
    assert fixed[0][0] == P.PduType.C2H_DATA


@pytest.mark.parametrize(("hdgst", "ddgst", "pda"), SETTINGS)
def test_capsule_resp_frames_as_control(hdgst: bool, ddgst: bool, pda: int) -> None:
    fields = (0x12345678, 0x9ABCDEF0, 31, 2, 9, 0x4002)
    general: list[Buffer] = []
    writer(PduWriter, hdgst, ddgst, pda).control(
        general, P.CAPSULE_RESP, P.PduType.CAPSULE_RESP, P.CAPSULE_RESP_HLEN, *fields
    )
    fixed: list[Buffer] = []
    writer(PduWriter, hdgst, ddgst, pda).capsule_resp(fixed, *fields)
    assert wire(fixed) == wire(general)
    assert len(wire(fixed)) == P.CAPSULE_RESP_HLEN + (P.DIGEST_LEN if hdgst else 0)


def test_marks_act_on_the_fixed_layout_methods() -> None:
    payload = bytes(4096)
    right = writer(PduWriter, True, True, 0)
    marking = writer(MarkingWriter, True, True, 0)
    assert isinstance(marking, MarkingWriter)
    marking.marks[3] = MARK_DATA_DIGEST
    marking.marks[4] = MARK_HEADER_DIGEST
    good: list[Buffer] = []
    bad: list[Buffer] = []
    right.c2h_data(good, P.FLAG_DATA_LAST, 3, 0, payload, 4096)
    marking.c2h_data(bad, P.FLAG_DATA_LAST, 3, 0, payload, 4096)
    assert wire(bad)[:-4] == wire(good)[:-4] and wire(bad)[-4:] != wire(good)[-4:]
    good, bad = [], []
    right.capsule_resp(good, 0, 0, 1, 1, 4, 0)
    marking.capsule_resp(bad, 0, 0, 1, 1, 4, 0)
    assert wire(bad)[:-4] == wire(good)[:-4] and wire(bad)[-4:] != wire(good)[-4:]
    assert not marking.marks  # each mark acted once, on the command's first PDU
