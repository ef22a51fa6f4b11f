"""Fault rules about the wire (target/faults.py's fields, tcp/wire_faults.py's vocabulary):
the field each malformed rule is refused for, what a rule asks of the transport, that a rule
the transport cannot act on selects nothing, and the PDUs sent at once."""

from __future__ import annotations

import pickle

import pytest

from pynvmf.spec import pdu as P
from pynvmf.spec.command import Sqe
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import ACTIONS, FaultTable, parse_fault
from pynvmf.tcp.digest import digest
from pynvmf.tcp.wire_faults import (
    DEFAULT_FES,
    UNDEFINED_PDU_TYPE,
    WIRE_ACTIONS,
    WireFault,
    capsule_header,
    malformed_resp,
)

SUB = "nqn.2024-01.io.pynvmf.test:faults"
HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"


def sqe(opcode: int = IoOpcode.READ, cid: int = 7) -> Sqe:
    return Sqe(int(opcode), 0x40, cid, 1, 0, 512, 0, 0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"action": "corrupt_digest"}, "digest"),
        ({"action": "corrupt_digest", "digest": "trailer"}, "digest"),
        # A data digest travels only with data sent to the host: not a Write's.
        ({"action": "corrupt_digest", "digest": "data", "opcode": "write"}, "opcode"),
        ({"action": "corrupt_digest", "digest": "data", "opcode": "flush"}, "opcode"),
        ({"action": "stall_c2h", "opcode": "write"}, "opcode"),
        ({"action": "drop_r2t", "opcode": "read"}, "opcode"),
        ({"action": "drop_r2t", "queue": "admin", "opcode": "identify"}, "opcode"),
        ({"action": "term_req", "fes": "bored"}, "fes"),
        ({"action": "term_req", "fes": 9}, "fes"),
        ({"action": "term_req", "fes": True}, "fes"),
        # The FEI means something with these FES only (invalid header field, unsupported).
        ({"action": "term_req", "fei": 4}, "fei"),
        ({"action": "term_req", "fes": "header_digest_error", "fei": 1}, "fei"),
        ({"action": "term_req", "fes": 1, "fei": -1}, "fei"),
        ({"action": "malformed_pdu"}, "pdu"),
        ({"action": "malformed_pdu", "pdu": "colour"}, "pdu"),
        # Each wire field belongs to one action.
        ({"action": "drop", "digest": "header"}, "digest"),
        ({"action": "stall_c2h", "pdu": "type"}, "pdu"),
        ({"action": "malformed_pdu", "pdu": "type", "fes": 1}, "fes"),
    ],
)
def test_a_wire_rule_is_refused_naming_the_field(rule: dict[str, object], field: str) -> None:
    with pytest.raises(ChangeError) as err:
        parse_fault(rule)
    assert err.value.field == field, err.value


def test_the_wire_actions_are_actions_and_a_rule_says_what_the_transport_does() -> None:
    assert set(WIRE_ACTIONS) <= set(ACTIONS)
    assert parse_fault({"action": "drop"}).wire_fault() is None
    assert parse_fault(
        {"action": "corrupt_digest", "digest": "data", "opcode": "read"}
    ).wire_fault() == WireFault("corrupt_digest", digest="data")
    assert parse_fault({"action": "term_req"}).wire_fault() == WireFault(
        "term_req", fes=DEFAULT_FES
    )
    assert DEFAULT_FES == P.FatalError.PDU_SEQUENCE_ERROR
    named = parse_fault({"action": "term_req", "fes": "invalid_header_field", "fei": 2})
    assert named.wire_fault() == WireFault("term_req", fes=1, fei=2)
    assert parse_fault({"action": "term_req", "fes": 3}).wire_fault() == WireFault(
        "term_req", fes=3
    )
    # A rule as the configuration and pynvmf_fault_list show it, and as workers get it.
    spec = parse_fault({"action": "malformed_pdu", "pdu": "hlen", "first": 1})
    assert spec.as_dict() == {"action": "malformed_pdu", "pdu": "hlen", "first": 1}
    assert pickle.loads(pickle.dumps(spec)) == spec
    for action in ("drop_r2t", "stall_c2h"):
        assert parse_fault({"action": action}).wire_fault() == WireFault(action)


def test_a_wire_rule_the_transport_cannot_act_on_selects_nothing() -> None:
    faults = FaultTable()
    wire_rule = faults.add(parse_fault({"action": "corrupt_digest", "digest": "header"}))
    fallback = faults.add(parse_fault({"action": "drop", "first": 1}))
    asked: list[WireFault] = []

    def cannot(fault: WireFault) -> bool:
        asked.append(fault)
        return False

    hit = faults.judge(SUB, HOST, 1, sqe(), cannot)
    assert hit is not None and hit.rule is fallback  # the next rule judges it
    assert asked == [WireFault("corrupt_digest", digest="header")]
    assert (wire_rule.matches, wire_rule.hits) == (0, 0)
    # No transport to ask: no wire rule can act.
    assert faults.judge(SUB, HOST, 1, sqe()) is None
    hit = faults.judge(SUB, HOST, 1, sqe(), lambda fault: True)
    assert hit is not None and hit.rule is wire_rule and hit.wire == asked[0]
    assert (wire_rule.matches, wire_rule.hits) == (1, 1)


@pytest.mark.parametrize("hdgst", [False, True])
def test_the_capsule_a_term_req_quotes(hdgst: bool) -> None:
    header = capsule_header(sqe(cid=0x1234), hdgst)
    assert len(header) == P.CAPSULE_CMD_HLEN
    pdu_type, flags, hlen, pdo, plen = P.COMMON_HEADER.unpack_from(header)
    assert (pdu_type, hlen, pdo) == (P.PduType.CAPSULE_CMD, P.CAPSULE_CMD_HLEN, 0)
    assert plen == P.CAPSULE_CMD_HLEN + (4 if hdgst else 0)
    assert flags == (P.FLAG_HDGST if hdgst else 0)
    assert Sqe.unpack(header, P.CH_LEN).cid == 0x1234


@pytest.mark.parametrize("hdgst", [False, True])
@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("type", (UNDEFINED_PDU_TYPE, P.CAPSULE_RESP_HLEN, None)),
        ("hlen", (P.PduType.CAPSULE_RESP, P.CH_LEN, None)),
        ("plen", (P.PduType.CAPSULE_RESP, P.CAPSULE_RESP_HLEN, P.CH_LEN)),
    ],
)
def test_a_malformed_pdu_is_a_capsule_resp_with_one_thing_wrong(
    kind: str, fields: tuple[int, int, int | None], hdgst: bool
) -> None:
    pdu = malformed_resp(kind, 1, 0x55, hdgst)
    assert len(pdu) == P.CAPSULE_RESP_HLEN + (4 if hdgst else 0)
    pdu_type, flags, hlen, _pdo, plen = P.COMMON_HEADER.unpack_from(pdu)
    want_type, want_hlen, want_plen = fields
    assert (pdu_type, hlen) == (want_type, want_hlen)
    assert plen == (len(pdu) if want_plen is None else want_plen)
    assert pdu_type not in iter(P.PduType) or kind != "type"
    assert P.CAPSULE_RESP.unpack_from(pdu)[9] == 0x55  # the command's CID
    if hdgst:
        assert flags == P.FLAG_HDGST and pdu[24:] == digest(pdu[:24])
