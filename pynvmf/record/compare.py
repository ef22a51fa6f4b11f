"""Comparing a target's answer with the recorded one, field by field, after the
normalisations that make two runs of the same target agree (docs/record-replay.md has
the table; NORMALISED is its source). Sans-I/O: bytes and the command answered in,
differences out.

What a PDU answers decides how its data is read: the Identify structures field by field
(spec/identify.py), some log pages and features with counters and clocks masked, any
other data byte for byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pynvmf.record import format as F
from pynvmf.spec import pdu as P
from pynvmf.spec.command import Sqe
from pynvmf.spec.identify import IDENTIFY_DATA_SIZE, IdentifyController, IdentifyNamespace
from pynvmf.spec.opcodes import AdminOpcode
from pynvmf.spec.status import status_name

_DIGEST_FLAGS = P.FLAG_HDGST | P.FLAG_DDGST

# Identify CNS values (cdw10 bits 7:0) whose data is decoded.
CNS_NAMESPACE = 0x00
CNS_CONTROLLER = 0x01
CNS_NS_DESCRIPTORS = 0x03
# Log page identifiers (Get Log Page cdw10 bits 7:0) with normalised bytes.
LID_ERROR = 0x01
LID_SMART = 0x02
LID_ANA = 0x0C
LID_DISCOVERY = 0x70
FID_TIMESTAMP = 0x0E

# What legitimately differs between two runs against targets configured alike, and is
# therefore not compared: (where, field, why). docs/record-replay.md shows this table.
NORMALISED: list[tuple[str, str, str]] = [
    ("Connect response", "DW0 (CNTLID)", "the target picks it; the replay maps it"),
    ("R2T", "TTAG", "the target picks it; the replay maps it for its H2CData"),
    ("any PDU", "HDGST/DDGST flags, PDO, PLEN", "follow the negotiated digests and alignment"),
    ("Identify Controller", "SN, FR, CNTLID", "per target instance and version"),
    ("Identify Namespace", "NGUID, EUI64", "per namespace instance"),
    ("Namespace ID descriptors", "descriptor values (types and lengths compared)", "as above"),
    ("Error Information log", "error count of each entry", "a counter of the target's life"),
    ("SMART / Health log", "temperature, data units, commands, busy time, power", "counters"),
    ("ANA log", "change count", "a generation counter"),
    ("Discovery log", "GENCTR", "a generation counter"),
    ("Get Features Timestamp", "timestamp (bytes 0-5)", "a clock"),
]

_IDENTIFY_IGNORED: dict[int, frozenset[str]] = {
    CNS_CONTROLLER: frozenset({"sn", "fr", "cntlid"}),
    CNS_NAMESPACE: frozenset({"nguid", "eui64"}),
}
# Byte ranges of log page data that are not compared: (start, end) in the log page.
_LOG_MASKS: dict[int, list[tuple[int, int]]] = {
    LID_SMART: [(1, 3), (32, 192)],
    LID_ANA: [(0, 8)],
    LID_DISCOVERY: [(0, 8)],
}


@dataclass(frozen=True, slots=True)
class Difference:
    field: str
    recorded: object
    live: object

    def __str__(self) -> str:
        return f"{self.field}: recorded {_show(self.recorded)}, live {_show(self.live)}"


def _show(value: object) -> str:
    if isinstance(value, bytes):
        return value.hex() if len(value) <= 32 else value[:32].hex() + "..."
    return repr(value)


def _common(raw: bytes) -> dict[str, object]:
    return {"type": F.TYPE_NAMES.get(raw[0], raw[0]), "flags": raw[1] & ~_DIGEST_FLAGS}


def _status(value: int, io: bool) -> str:
    status = value >> 1
    name = status_name(status & 0x7FF, io=io)
    extra = "".join(
        [
            f" CRD{(status >> 11) & 3}" if (status >> 11) & 3 else "",
            " MORE" if status & (1 << 13) else "",
            " DNR" if status & (1 << 14) else "",
        ]
    )
    return name + extra


def header_fields(raw: bytes, command: Sqe | None, qid: int) -> dict[str, object]:
    """The header's fields that are compared (normalised ones left out)."""
    fields = _common(raw)
    pdu_type = raw[0]
    if pdu_type == P.PduType.ICRESP:
        pfv, cpda, dgst, maxh2c = P.IC_BODY.unpack_from(raw, P.CH_LEN)
        fields |= {"pfv": pfv, "cpda": cpda, "dgst": dgst, "maxh2cdata": maxh2c}
    elif pdu_type == P.PduType.CAPSULE_RESP:
        _, _, _, _, _, dw0, dw1, sqhd, sqid, cid, status = P.CAPSULE_RESP.unpack_from(raw)
        if command is None or not _is_connect(command):
            fields["dw0"] = dw0
        fields |= {"dw1": dw1, "sqhd": sqhd, "sqid": sqid, "cid": cid}
        fields["status"] = _status(status, io=qid != 0)
    elif pdu_type in (P.PduType.C2H_DATA, P.PduType.R2T):
        cccid, _ttag, offset, length = P.DATA_BODY.unpack_from(raw, P.CH_LEN)
        fields |= {"cccid": cccid, "offset": offset, "length": length}
    elif pdu_type in (P.PduType.C2H_TERM_REQ, P.PduType.H2C_TERM_REQ):
        fes, fei = P.TERM_BODY.unpack_from(raw, P.CH_LEN)
        fields |= {"fes": fes, "fei": fei}
    return fields


def _is_connect(sqe: Sqe) -> bool:
    return sqe.opcode == AdminOpcode.FABRICS and sqe.nsid & 0xFF == 0x01


def compare(
    recorded: bytes, live: bytes, command: Sqe | None = None, *, qid: int = 0
) -> list[Difference]:
    """The differences between a recorded answer and the live one; `command` is the
    command it answers (None for ICResp, TermReq), `qid` its queue."""
    rec_fields = header_fields(recorded, command, qid)
    live_fields = header_fields(live, command, qid)
    out = [
        Difference(name, value, live_fields.get(name))
        for name, value in rec_fields.items()
        if live_fields.get(name) != value
    ]
    if rec_fields["type"] != live_fields["type"]:
        return out  # the rest would compare unlike things
    out += compare_data(recorded, live, command, qid)
    return out


def compare_data(recorded: bytes, live: bytes, command: Sqe | None, qid: int) -> list[Difference]:
    rec_data, live_data = F.pdu_data(recorded), F.pdu_data(live)
    offset = 0
    if recorded[0] == P.PduType.C2H_DATA:
        offset = P.DATA_BODY.unpack_from(recorded, P.CH_LEN)[2]
    reader = _data_reader(command, qid)
    if reader is not None:
        return reader(rec_data, live_data, offset)
    return _bytes_differ("data", rec_data, live_data, offset)


DataReader = Callable[[bytes, bytes, int], list["Difference"]]


def _data_reader(command: Sqe | None, qid: int) -> DataReader | None:
    if command is None or qid != 0:
        return None
    low = command.cdw10 & 0xFF
    if command.opcode == AdminOpcode.IDENTIFY:
        if low in (CNS_CONTROLLER, CNS_NAMESPACE):
            return lambda r, v, o: _identify(low, r, v, o)
        if low == CNS_NS_DESCRIPTORS:
            return _descriptors
    elif command.opcode == AdminOpcode.GET_LOG_PAGE:
        if low == LID_ERROR:
            return lambda r, v, o: _masked("log", r, v, o, _error_log_masks(o, len(r)))
        if low in _LOG_MASKS:
            # The page offset (cdw12/13) moves the masks.
            page_offset = command.cdw12 | command.cdw13 << 32
            masks = [(a - page_offset, b - page_offset) for a, b in _LOG_MASKS[low]]
            return lambda r, v, o: _masked("log", r, v, o, masks)
    elif command.opcode == AdminOpcode.GET_FEATURES and low == FID_TIMESTAMP:
        return lambda r, v, o: _masked("timestamp", r, v, o, [(0, 6)])
    return None


def _identify(cns: int, rec: bytes, live: bytes, offset: int) -> list[Difference]:
    if offset or len(rec) != IDENTIFY_DATA_SIZE or len(live) != IDENTIFY_DATA_SIZE:
        return _bytes_differ("identify", rec, live, offset)
    kind: Any = IdentifyController if cns == CNS_CONTROLLER else IdentifyNamespace
    prefix = "identify-controller" if cns == CNS_CONTROLLER else "identify-namespace"
    a, b = kind.unpack(rec), kind.unpack(live)
    ignored = _IDENTIFY_IGNORED[cns]
    return [
        Difference(f"{prefix}.{f.name}", getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)
        if f.name not in ignored and getattr(a, f.name) != getattr(b, f.name)
    ]


def _descriptor_types(data: bytes) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    at = 0
    while at + 4 <= len(data) and data[at]:
        nidt, nidl = data[at], data[at + 1]
        out.append((nidt, nidl))
        at += 4 + nidl
    return out


def _descriptors(rec: bytes, live: bytes, offset: int) -> list[Difference]:
    a, b = _descriptor_types(rec), _descriptor_types(live)
    return [] if a == b else [Difference("ns-descriptors.types", a, b)]


def _error_log_masks(offset: int, length: int) -> list[tuple[int, int]]:
    # Each 64-byte entry starts with its 8-byte error count.
    first = offset - offset % 64
    return [(at - offset, at - offset + 8) for at in range(first, offset + length, 64)]


def _masked(
    what: str, rec: bytes, live: bytes, offset: int, masks: list[tuple[int, int]]
) -> list[Difference]:
    a, b = bytearray(rec), bytearray(live)
    for start, end in masks:
        for buf in (a, b):
            lo, hi = max(start, 0), min(end, len(buf))
            if lo < hi:
                buf[lo:hi] = bytes(hi - lo)
    return _bytes_differ(what, bytes(a), bytes(b), offset)


def _bytes_differ(what: str, rec: bytes, live: bytes, offset: int) -> list[Difference]:
    if rec == live:
        return []
    if len(rec) != len(live):
        return [Difference(f"{what} length", len(rec), len(live))]
    first = next(i for i in range(len(rec)) if rec[i] != live[i])
    last = max(i for i in range(len(rec)) if rec[i] != live[i])
    count = sum(1 for x, y in zip(rec, live, strict=True) if x != y)
    name = f"{what}[{offset + first}:{offset + last + 1}] ({count} bytes differ)"
    return [Difference(name, rec[first : last + 1], live[first : last + 1])]
