"""Fault rules that act on the wire: what the transport sends (or does not send) for a
command a rule selected (target/faults.py judges whether a rule hits; docs/faults.md).

- ``corrupt_digest``: the header digest of the first PDU about the command (its R2T,
  C2HData or CapsuleResp), or the data digest of its first C2HData, goes out wrong;
- ``term_req``: a C2HTermReq (a chosen FES) in answer to the command's capsule, and
  the connection closes;
- ``malformed_pdu``: in place of the command's CapsuleResp, a PDU no host may accept
  (an undefined type, a wrong HLEN, a PLEN below HLEN); the command runs no further;
- ``drop_r2t``: the R2T that asks for a command's data is never sent;
- ``stall_c2h``: half of the first C2HData's data is sent, then nothing more of the
  command (neither the rest of its data nor its completion).

Here: the vocabulary (what rules may name, checked by target/faults.py), the plain
description a rule gives the transport (`WireFault`) and the PDUs sent at once. The
marks that change a command's PDUs later are framing.py's MarkingWriter;
TargetConnection.inject decides which applies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from pynvmf.spec import pdu as P
from pynvmf.spec.command import Sqe
from pynvmf.tcp import digest as D

WIRE_ACTIONS: Final = ("corrupt_digest", "term_req", "malformed_pdu", "drop_r2t", "stall_c2h")
DIGESTS: Final = ("header", "data")
# What a malformed_pdu rule sends in place of the command's CapsuleResp.
MALFORMED_PDUS: Final = ("type", "hlen", "plen")
# FES by name (a rule may name one or give its number); the FEI means something only for
# these two (the offset of the field in error), and is reserved (0) for the others.
FES_NAMES: Final = {fes.name.lower(): int(fes) for fes in P.FatalError}
FES_WITH_FEI: Final = frozenset(
    (P.FatalError.INVALID_HEADER_FIELD, P.FatalError.UNSUPPORTED_PARAMETER)
)
# A TermReq that answers a command which broke no rule: the spec's FES for a PDU that came
# when it may not.
DEFAULT_FES: Final = int(P.FatalError.PDU_SEQUENCE_ERROR)
# No PDU type of NVMe/TCP has this number (08h lies between C2HData and R2T).
UNDEFINED_PDU_TYPE: Final = 0x08
_MALFORMED_HLEN: Final = P.CH_LEN  # a CapsuleResp's HLEN is 24: 8 is the common header's
_MALFORMED_PLEN: Final = P.CH_LEN  # below the HLEN of 24
_U32: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class WireFault:
    """What a rule asks of the transport for one command: `action` is one of
    WIRE_ACTIONS, with its `digest`, `fes` and `fei`, or `pdu`."""

    action: str
    digest: str = ""
    fes: int = DEFAULT_FES
    fei: int = 0
    pdu: str = ""


def capsule_header(sqe: Sqe, hdgst: bool) -> bytes:
    """The command's CapsuleCmd header as a TermReq quotes it (the PDU in error): its
    common header and SQE (PDO and PLEN as for a capsule without in-capsule data)."""
    plen = P.CAPSULE_CMD_HLEN + (P.DIGEST_LEN if hdgst else 0)
    flags = P.FLAG_HDGST if hdgst else 0
    return P.CAPSULE_CMD.pack(
        int(P.PduType.CAPSULE_CMD), flags, P.CAPSULE_CMD_HLEN, 0, plen, sqe.pack()
    )


def malformed_resp(kind: str, sqid: int, cid: int, hdgst: bool) -> bytes:
    """A CapsuleResp for `cid` (status success) with one thing wrong, as `kind` says: its
    type undefined, its HLEN not 24, or its PLEN below its HLEN. The bytes are as many as a
    CapsuleResp's (with its header digest where negotiated, computed over what is sent),
    so that a host that reads a fixed header reads exactly this PDU."""
    pdu_type = UNDEFINED_PDU_TYPE if kind == "type" else int(P.PduType.CAPSULE_RESP)
    hlen = _MALFORMED_HLEN if kind == "hlen" else P.CAPSULE_RESP_HLEN
    plen = P.CAPSULE_RESP_HLEN + (P.DIGEST_LEN if hdgst else 0)
    if kind == "plen":
        plen = _MALFORMED_PLEN
    flags = P.FLAG_HDGST if hdgst else 0
    header = P.CAPSULE_RESP.pack(pdu_type, flags, hlen, 0, plen, 0, 0, 0, sqid, cid, 0)
    return header + _U32.pack(D.crc32c(header)) if hdgst else header
