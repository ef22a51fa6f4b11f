"""The recording file format (docs/record-replay.md), version 1. Pure data and parsing.

One file per connection, JSON lines: a header object first, then one object per PDU in
the order the recording end saw them, then, where the recording ended on purpose, an
end object. JSON lines rather than a binary format: a file is read with `jq` or an
editor, a file cut short (a crash, a size cap) is readable up to its last whole line,
and every field is named, so that a later version adds fields without breaking
readers. The cost, hex for the PDU bytes, doubles the size of data PDUs: a recording is
a debugging artefact, bounded by its caps.

Header: {"format": "pynvmf-recording", "version": 1, "role": "target"|"host",
"connection": N, "local": "addr:port", "peer": "addr:port", "wall": ISO 8601 UTC,
"monotonic_ns": N}.
PDU: {"ns": monotonic ns when the PDU was complete, "dir": "h2c"|"c2h",
"type": the PDU type's name, "pdu": the PDU as it travelled, in hex}.
End: {"end": why the recording of this connection ended, "ns": ...}.

A PDU is recorded whole, as it travelled after TLS: header digest and data digest
included where the connection negotiated them (the ICReq and ICResp in the same file
say whether it did). Readers that compare PDUs strip the digests (`Pdu.data`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pynvmf.spec import pdu as P

FORMAT = "pynvmf-recording"
VERSION = 1

H2C = "h2c"
C2H = "c2h"

# Which way each PDU type travels: the type alone says it.
_H2C_TYPES = frozenset(
    {P.PduType.ICREQ, P.PduType.H2C_TERM_REQ, P.PduType.CAPSULE_CMD, P.PduType.H2C_DATA}
)
TYPE_NAMES: dict[int, str] = {
    P.PduType.ICREQ: "ICReq",
    P.PduType.ICRESP: "ICResp",
    P.PduType.H2C_TERM_REQ: "H2CTermReq",
    P.PduType.C2H_TERM_REQ: "C2HTermReq",
    P.PduType.CAPSULE_CMD: "CapsuleCmd",
    P.PduType.CAPSULE_RESP: "CapsuleResp",
    P.PduType.H2C_DATA: "H2CData",
    P.PduType.C2H_DATA: "C2HData",
    P.PduType.R2T: "R2T",
}
# PDU types that never carry digests (NVMe/TCP 3.3.6).
NO_DIGEST_TYPES = frozenset(
    {P.PduType.ICREQ, P.PduType.ICRESP, P.PduType.H2C_TERM_REQ, P.PduType.C2H_TERM_REQ}
)


class FormatError(ValueError):
    """A file that is not a recording this version reads: the message names the line."""


def direction(pdu_type: int) -> str:
    return H2C if pdu_type in _H2C_TYPES else C2H


@dataclass(frozen=True, slots=True)
class Pdu:
    """One recorded PDU: `raw` as it travelled (digests included)."""

    ns: int
    raw: bytes

    @property
    def type(self) -> int:
        return self.raw[0]

    @property
    def flags(self) -> int:
        return self.raw[1]

    @property
    def hlen(self) -> int:
        return self.raw[2]

    @property
    def direction(self) -> str:
        return direction(self.raw[0])

    @property
    def header(self) -> bytes:
        """The header (HLEN bytes), without its digest."""
        return self.raw[: self.hlen]

    @property
    def data(self) -> bytes:
        """The PDU's data, without padding or data digest (b"" for none)."""
        return pdu_data(self.raw)

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type:#x}")


def pdu_data(raw: bytes) -> bytes:
    """The data of a whole PDU, digests and padding left out."""
    pdu_type, flags, hlen, pdo, plen = P.COMMON_HEADER.unpack_from(raw)
    if pdu_type in NO_DIGEST_TYPES:
        return bytes(raw[hlen:plen])
    if not pdo or pdo >= plen:
        return b""
    end = plen - (P.DIGEST_LEN if flags & P.FLAG_DDGST else 0)
    return bytes(raw[pdo:end])


@dataclass(slots=True)
class Recording:
    """One file: one connection's PDUs, both ways."""

    path: str
    header: dict[str, Any]
    pdus: list[Pdu] = field(default_factory=list)
    end: str = ""  # why recording stopped early ("" : the file just ends)


def header_line(
    *, role: str, connection: int, local: str, peer: str, wall: str, monotonic_ns: int
) -> str:
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "role": role,
            "connection": connection,
            "local": local,
            "peer": peer,
            "wall": wall,
            "monotonic_ns": monotonic_ns,
        }
    )


def pdu_line(ns: int, raw: bytes) -> str:
    pdu_type = raw[0]
    return json.dumps(
        {
            "ns": ns,
            "dir": direction(pdu_type),
            "type": TYPE_NAMES.get(pdu_type, str(pdu_type)),
            "pdu": raw.hex(),
        }
    )


def end_line(ns: int, reason: str) -> str:
    return json.dumps({"end": reason, "ns": ns})


def parse(lines: Iterable[str], path: str = "<recording>") -> Recording:
    """A recording from its lines; FormatError names the line that is not one."""
    it: Iterator[tuple[int, str]] = enumerate(lines, 1)
    recording: Recording | None = None
    for number, line in it:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            # A last line cut short (the writer died mid-line) ends the file.
            if recording is not None:
                recording.end = recording.end or "truncated"
                break
            raise FormatError(f"{path}:{number}: not JSON") from None
        if not isinstance(obj, dict):
            raise FormatError(f"{path}:{number}: not a JSON object")
        if recording is None:
            if obj.get("format") != FORMAT:
                raise FormatError(f"{path}:{number}: not a {FORMAT} file (format field)")
            if obj.get("version") != VERSION:
                raise FormatError(
                    f"{path}:{number}: version {obj.get('version')!r}, this reader reads {VERSION}"
                )
            recording = Recording(path, obj)
            continue
        if "end" in obj:
            recording.end = str(obj["end"])
            continue
        try:
            raw = bytes.fromhex(obj["pdu"])
            ns = int(obj["ns"])
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}:{number}: a PDU line needs ns and pdu (hex)") from None
        if len(raw) < P.CH_LEN:
            raise FormatError(f"{path}:{number}: a PDU shorter than its common header")
        recording.pdus.append(Pdu(ns, raw))
    if recording is None:
        raise FormatError(f"{path}: empty, no header")
    return recording


def load(path: str | Path) -> Recording:
    with open(path, encoding="utf-8") as f:
        return parse(f, str(path))
