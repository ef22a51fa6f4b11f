"""NVMe/TCP PDU layouts (NVMe/TCP Transport Specification). Pure data."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final


class PduType(IntEnum):
    ICREQ = 0x00
    ICRESP = 0x01
    H2C_TERM_REQ = 0x02
    C2H_TERM_REQ = 0x03
    CAPSULE_CMD = 0x04
    CAPSULE_RESP = 0x05
    H2C_DATA = 0x06
    C2H_DATA = 0x07
    R2T = 0x09


FLAG_HDGST: Final = 0x01
FLAG_DDGST: Final = 0x02
FLAG_DATA_LAST: Final = 0x04
FLAG_DATA_SUCCESS: Final = 0x08

DIGEST_HEADER: Final = 0x01  # ICReq/ICResp DGST field
DIGEST_DATA: Final = 0x02
DIGEST_LEN: Final = 4

PFV_1_0: Final = 0


class FatalError(IntEnum):
    """Fatal Error Status (FES) of a TermReq."""

    INVALID_HEADER_FIELD = 0x01
    PDU_SEQUENCE_ERROR = 0x02
    HEADER_DIGEST_ERROR = 0x03
    DATA_OUT_OF_RANGE = 0x04
    DATA_LIMIT_EXCEEDED = 0x05
    UNSUPPORTED_PARAMETER = 0x06


COMMON_HEADER = struct.Struct("<BBBBI")  # type, flags, hlen, pdo, plen
# A literal (compiled modules inline it: docs/performance.md), checked against the layout.
CH_LEN: Final = 8
assert COMMON_HEADER.size == CH_LEN

ICREQ_LEN: Final = 128
ICRESP_LEN: Final = 128
TERM_REQ_HLEN: Final = 24
CAPSULE_CMD_HLEN: Final = 72
CAPSULE_RESP_HLEN: Final = 24
DATA_HLEN: Final = 24  # H2CData and C2HData
R2T_HLEN: Final = 24
# A TermReq carries the offending PDU header, up to this many bytes of it.
TERM_REQ_MAX_DATA: Final = 152

# The header length each PDU type must carry.
EXPECTED_HLEN: dict[int, int] = {
    PduType.ICREQ: ICREQ_LEN,
    PduType.ICRESP: ICRESP_LEN,
    PduType.H2C_TERM_REQ: TERM_REQ_HLEN,
    PduType.C2H_TERM_REQ: TERM_REQ_HLEN,
    PduType.CAPSULE_CMD: CAPSULE_CMD_HLEN,
    PduType.CAPSULE_RESP: CAPSULE_RESP_HLEN,
    PduType.H2C_DATA: DATA_HLEN,
    PduType.C2H_DATA: DATA_HLEN,
    PduType.R2T: R2T_HLEN,
}

# Byte offsets of header fields, for the FEI of an Invalid PDU Header Field TermReq.
OFFSET_TYPE: Final = 0
OFFSET_FLAGS: Final = 1
OFFSET_HLEN: Final = 2
OFFSET_PDO: Final = 3
OFFSET_PLEN: Final = 4
OFFSET_PFV: Final = 8
OFFSET_HPDA: Final = 10
OFFSET_DGST: Final = 11
OFFSET_MAXR2T: Final = 12
OFFSET_DATA_CCCID: Final = 8
OFFSET_DATA_TTAG: Final = 10
OFFSET_DATA_DATAO: Final = 12
OFFSET_DATA_DATAL: Final = 16

# ICReq: pfv, hpda, dgst, maxr2t ; ICResp: pfv, cpda, dgst, maxh2cdata
IC_BODY = struct.Struct("<HBBI")
# H2CData / C2HData / R2T: cccid, ttag, offset, length
DATA_BODY = struct.Struct("<HHII")
# TermReq: fes, fei
TERM_BODY = struct.Struct("<HI")

# Whole fixed-size headers, for one pack call per PDU on the hot path.
DATA_HEADER = struct.Struct("<BBBBIHHII4x")
CAPSULE_RESP = struct.Struct("<BBBBIIIHHHH")
CAPSULE_CMD = struct.Struct("<BBBBI64s")


def pack_ic(pdu_type: int, pfv: int, pda: int, dgst: int, value: int) -> bytes:
    """ICReq (value = MAXR2T) or ICResp (value = MAXH2CDATA)."""
    out = bytearray(ICREQ_LEN)
    COMMON_HEADER.pack_into(out, 0, pdu_type, 0, ICREQ_LEN, 0, ICREQ_LEN)
    IC_BODY.pack_into(out, CH_LEN, pfv, pda, dgst, value)
    return bytes(out)


def pack_term_req(pdu_type: int, fes: int, fei: int, offending: bytes = b"") -> bytes:
    """A TermReq carrying the header (HLEN bytes, not the data) of the PDU in error."""
    hlen = offending[2] if len(offending) > 2 else 0
    data = bytes(offending[: min(max(hlen, CH_LEN), TERM_REQ_MAX_DATA)])
    plen = TERM_REQ_HLEN + len(data)
    out = bytearray(TERM_REQ_HLEN)
    COMMON_HEADER.pack_into(out, 0, pdu_type, 0, TERM_REQ_HLEN, 0, plen)
    TERM_BODY.pack_into(out, CH_LEN, fes, fei)
    return bytes(out) + data


def data_offset(hlen: int, hdgst: bool, pda: int) -> int:
    """PDO for a PDU whose data must start on a (pda + 1) * 4 byte boundary."""
    start = hlen + (DIGEST_LEN if hdgst else 0)
    align = (pda + 1) * 4
    return -(-start // align) * align
