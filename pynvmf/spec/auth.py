"""NVMe in-band authentication (NVMe Base 2.0 §8.13, the messages of §5.25 / §5.26's
Authentication Send and Receive): the AUTH_Negotiate and DH-HMAC-CHAP messages as pure
data, their identifiers, and the failure reason codes.

Every message starts with AUTH_TYPE (00h common messages, 01h DH-HMAC-CHAP), AUTH_ID (the
message) and, after two reserved bytes, the transaction identifier T_ID (little endian).
`parse_message` turns a payload into one of the message classes or raises
`MalformedMessage` with the failure reason explanation the specification names for it;
nothing here keeps state or touches a socket.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

# Authentication Send / Receive: SECP (CDW10 bits 31:24) and SPSP0/SPSP1 (bits 15:8 and
# 23:16) that select DH-HMAC-CHAP.
SECP_DHCHAP = 0xE9
SPSP_DHCHAP = 0x01

# Connect response DW0 (AUTHREQ): authentication transaction required, and secure channel
# concatenation required (which pynvmf's target never sets: as nvmet, it lets the host choose).
AUTHREQ_ATR = 1 << 17
AUTHREQ_ASCR = 1 << 18


def auth_cdw10() -> int:
    """CDW10 of Authentication Send / Receive for DH-HMAC-CHAP."""
    return SECP_DHCHAP << 24 | SPSP_DHCHAP << 16 | SPSP_DHCHAP << 8


def auth_cdw10_fields(cdw10: int) -> tuple[int, int, int]:
    """(SECP, SPSP1, SPSP0) of a CDW10."""
    return cdw10 >> 24 & 0xFF, cdw10 >> 16 & 0xFF, cdw10 >> 8 & 0xFF


class AuthType(IntEnum):
    COMMON = 0x00
    DHCHAP = 0x01


class MessageId(IntEnum):
    NEGOTIATE = 0x00
    CHALLENGE = 0x01
    REPLY = 0x02
    SUCCESS1 = 0x03
    SUCCESS2 = 0x04
    FAILURE2 = 0xF0
    FAILURE1 = 0xF1


AUTH_ID_DHCHAP = 0x01  # the protocol descriptor's AUTHID for DH-HMAC-CHAP


class HashId(IntEnum):
    SHA256 = 0x01
    SHA384 = 0x02
    SHA512 = 0x03

    @property
    def length(self) -> int:
        return _HASH_LENGTHS[self]

    @property
    def hashlib_name(self) -> str:
        return self.name.lower()

    @property
    def hmac_name(self) -> str:
        """The kernel's name (nvmet's dhchap_hash attribute): hmac(sha256)."""
        return f"hmac({self.name.lower()})"


_HASH_LENGTHS = {HashId.SHA256: 32, HashId.SHA384: 48, HashId.SHA512: 64}


class DhGroupId(IntEnum):
    NULL = 0x00
    FFDHE2048 = 0x01
    FFDHE3072 = 0x02
    FFDHE4096 = 0x03
    FFDHE6144 = 0x04
    FFDHE8192 = 0x05

    @property
    def prime_bits(self) -> int:
        return _GROUP_BITS[self]

    @property
    def value_length(self) -> int:
        """Bytes of a DH value (DHVLEN) of this group: the prime's length; 0 for null."""
        return self.prime_bits // 8

    @property
    def text(self) -> str:
        return self.name.lower()


_GROUP_BITS = {
    DhGroupId.NULL: 0,
    DhGroupId.FFDHE2048: 2048,
    DhGroupId.FFDHE3072: 3072,
    DhGroupId.FFDHE4096: 4096,
    DhGroupId.FFDHE6144: 6144,
    DhGroupId.FFDHE8192: 8192,
}


def hash_from_name(name: str) -> HashId:
    """A hash by any of its usual names: sha256, SHA-256, hmac(sha256), 1."""
    text = name.strip().lower().replace("-", "")
    if text.startswith("hmac(") and text.endswith(")"):
        text = text[5:-1]
    for h in HashId:
        if text in (h.hashlib_name, str(int(h))):
            return h
    raise ValueError(f"unknown DH-HMAC-CHAP hash {name!r} (sha256, sha384, sha512)")


def dhgroup_from_name(name: str) -> DhGroupId:
    """A DH group by name: null, ffdhe2048 ... ffdhe8192 (or its number)."""
    text = name.strip().lower()
    for g in DhGroupId:
        if text in (g.text, str(int(g))):
            return g
    raise ValueError(f"unknown DH-HMAC-CHAP DH group {name!r} (null, ffdhe2048 ... ffdhe8192)")


class SecureConcat(IntEnum):
    """SC_C of AUTH_Negotiate: secure channel concatenation (NVMe Base 2.1; Linux's
    NVME_AUTH_SECP_*). 01h is obsolete (Base 2.0's), and refused like any other value."""

    NONE = 0x00
    # Generate a PSK on an admin queue without TLS, for TLS on the queues that follow.
    NEW_TLS_PSK = 0x02
    # Generate a PSK on an admin queue over TLS, replacing the PSK of that channel.
    REPLACE_TLS_PSK = 0x03


class FailureReason(IntEnum):
    """Reason code (RC) of AUTH_Failure1/2."""

    FAILED = 0x01


class FailureExplanation(IntEnum):
    """Reason code explanation (RCE) of AUTH_Failure1/2 (NVMe Base 2.0 Figure 449)."""

    FAILED = 0x01  # authentication failed
    NOT_USABLE = 0x02  # authentication protocol not usable
    CONCAT_MISMATCH = 0x03  # secure channel concatenation mismatch
    HASH_UNUSABLE = 0x04  # hash function not usable
    DHGROUP_UNUSABLE = 0x05  # DH group not usable
    INCORRECT_PAYLOAD = 0x06  # incorrect payload
    INCORRECT_MESSAGE = 0x07  # incorrect protocol message


def explanation_name(code: int) -> str:
    try:
        return FailureExplanation(code).name
    except ValueError:
        return f"RCE {code:#04x}"


class MalformedMessage(ValueError):
    """A payload that is not a well formed message; `explanation` is the failure reason
    explanation to answer it with."""

    def __init__(self, explanation: FailureExplanation, text: str) -> None:
        super().__init__(text)
        self.explanation = explanation


_HEADER = struct.Struct("<BBxxH")  # AUTH_TYPE, AUTH_ID, reserved, T_ID
HEADER_SIZE = _HEADER.size
_NEGOTIATE = struct.Struct("<BBxxHBB")  # ..., SC_C, NAPD
DESCRIPTOR_SIZE = 64  # AUTHID, reserved, HALEN, DHLEN, 30 hash IDs, 30 DH group IDs
ID_LIST_SIZE = 30
NEGOTIATE_SIZE = _NEGOTIATE.size  # 8, then NAPD descriptors
# Challenge: header, HL, reserved, HASHID, DHGID, DHVLEN, SEQNUM; then C1 and the DH value.
_CHALLENGE = struct.Struct("<BBxxHBxBBHI")
# Reply: header, HL, reserved, CVALID, reserved, DHVLEN, SEQNUM; then R1, C2, DH value.
_REPLY = struct.Struct("<BBxxHBxBxHI")
# Success1: header, HL, reserved, RVALID, 7 reserved; then R2 (HL bytes, valid or not).
_SUCCESS1 = struct.Struct("<BBxxHBxB7x")
_SUCCESS2 = struct.Struct("<BBxxH10x")
_FAILURE = struct.Struct("<BBxxHBB")  # header, RC, RCE
FAILURE_SIZE = _FAILURE.size
MAX_MESSAGE_SIZE = _REPLY.size + 2 * 64 + 1024  # a Reply with SHA-512 and ffdhe8192


@dataclass(frozen=True, slots=True)
class Negotiate:
    t_id: int
    hashes: tuple[int, ...]
    dhgroups: tuple[int, ...]
    sc_c: int = SecureConcat.NONE
    # Every protocol descriptor's AUTHID (only 01h, DH-HMAC-CHAP, is defined).
    auth_ids: tuple[int, ...] = (AUTH_ID_DHCHAP,)

    def pack(self) -> bytes:
        if len(self.hashes) > ID_LIST_SIZE or len(self.dhgroups) > ID_LIST_SIZE:
            raise ValueError("at most 30 hash and 30 DH group identifiers")
        desc = bytearray(DESCRIPTOR_SIZE)
        desc[0] = AUTH_ID_DHCHAP
        desc[2] = len(self.hashes)
        desc[3] = len(self.dhgroups)
        desc[4 : 4 + len(self.hashes)] = bytes(self.hashes)
        desc[34 : 34 + len(self.dhgroups)] = bytes(self.dhgroups)
        head = _NEGOTIATE.pack(AuthType.COMMON, MessageId.NEGOTIATE, self.t_id, self.sc_c, 1)
        return head + bytes(desc)


@dataclass(frozen=True, slots=True)
class Challenge:
    t_id: int
    hash_id: int
    dhgroup: int
    seqnum: int
    c1: bytes
    dh_value: bytes = b""

    def pack(self) -> bytes:
        head = _CHALLENGE.pack(
            AuthType.DHCHAP,
            MessageId.CHALLENGE,
            self.t_id,
            len(self.c1),
            self.hash_id,
            self.dhgroup,
            len(self.dh_value),
            self.seqnum,
        )
        return head + self.c1 + self.dh_value


@dataclass(frozen=True, slots=True)
class Reply:
    t_id: int
    response: bytes
    seqnum: int = 0  # S2: 0 when the host does not authenticate the controller
    c2: bytes | None = None  # the host's challenge to the controller (CVALID)
    dh_value: bytes = b""

    def pack(self) -> bytes:
        hl = len(self.response)
        c2 = self.c2 if self.c2 is not None else bytes(hl)
        head = _REPLY.pack(
            AuthType.DHCHAP,
            MessageId.REPLY,
            self.t_id,
            hl,
            1 if self.c2 is not None else 0,
            len(self.dh_value),
            self.seqnum,
        )
        return head + self.response + c2 + self.dh_value


@dataclass(frozen=True, slots=True)
class Success1:
    t_id: int
    hash_length: int
    response: bytes | None = None  # R2 when the host asked to authenticate the controller

    def pack(self) -> bytes:
        head = _SUCCESS1.pack(
            AuthType.DHCHAP,
            MessageId.SUCCESS1,
            self.t_id,
            self.hash_length,
            1 if self.response is not None else 0,
        )
        rval = self.response if self.response is not None else b""
        return head + rval


@dataclass(frozen=True, slots=True)
class Success2:
    t_id: int

    def pack(self) -> bytes:
        return _SUCCESS2.pack(AuthType.DHCHAP, MessageId.SUCCESS2, self.t_id)


@dataclass(frozen=True, slots=True)
class Failure:
    """AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller)."""

    message: MessageId  # FAILURE1 or FAILURE2
    t_id: int
    explanation: int
    reason: int = FailureReason.FAILED

    def pack(self) -> bytes:
        head = (AuthType.COMMON, self.message, self.t_id)
        return _FAILURE.pack(*head, self.reason, self.explanation)


Message = Negotiate | Challenge | Reply | Success1 | Success2 | Failure


def message_header(data: bytes) -> tuple[int, int, int]:
    """(AUTH_TYPE, AUTH_ID, T_ID) of a payload."""
    if len(data) < HEADER_SIZE:
        raise MalformedMessage(
            FailureExplanation.INCORRECT_PAYLOAD, f"message of {len(data)} bytes is truncated"
        )
    return _HEADER.unpack_from(data)


def _payload(why: str) -> MalformedMessage:
    return MalformedMessage(FailureExplanation.INCORRECT_PAYLOAD, why)


def _parse_negotiate(data: bytes, t_id: int) -> Negotiate:
    if len(data) < NEGOTIATE_SIZE + DESCRIPTOR_SIZE:
        raise _payload(f"AUTH_Negotiate of {len(data)} bytes has no protocol descriptor")
    _, _, _, sc_c, napd = _NEGOTIATE.unpack_from(data)
    if napd == 0 or NEGOTIATE_SIZE + napd * DESCRIPTOR_SIZE > len(data):
        raise _payload(f"AUTH_Negotiate: NAPD {napd} does not fit {len(data)} bytes")
    auth_ids = []
    hashes: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()
    found = False
    for i in range(napd):
        off = NEGOTIATE_SIZE + i * DESCRIPTOR_SIZE
        authid, halen, dhlen = data[off], data[off + 2], data[off + 3]
        auth_ids.append(authid)
        if authid != AUTH_ID_DHCHAP or found:
            continue
        if halen > ID_LIST_SIZE or dhlen > ID_LIST_SIZE:
            raise _payload(f"AUTH_Negotiate: HALEN {halen} or DHLEN {dhlen} past 30")
        found = True
        hashes = tuple(data[off + 4 : off + 4 + halen])
        groups = tuple(data[off + 34 : off + 34 + dhlen])
    return Negotiate(t_id, hashes, groups, sc_c, tuple(auth_ids))


def _parse_challenge(data: bytes, t_id: int) -> Challenge:
    if len(data) < _CHALLENGE.size:
        raise _payload(f"DH-HMAC-CHAP_Challenge of {len(data)} bytes is truncated")
    _, _, _, hl, hash_id, dhgid, dhvlen, seqnum = _CHALLENGE.unpack_from(data)
    start = _CHALLENGE.size
    if start + hl + dhvlen > len(data):
        raise _payload(f"DH-HMAC-CHAP_Challenge: HL {hl} + DHVLEN {dhvlen} past the payload")
    c1 = bytes(data[start : start + hl])
    dh = bytes(data[start + hl : start + hl + dhvlen])
    return Challenge(t_id, hash_id, dhgid, seqnum, c1, dh)


def _parse_reply(data: bytes, t_id: int) -> Reply:
    if len(data) < _REPLY.size:
        raise _payload(f"DH-HMAC-CHAP_Reply of {len(data)} bytes is truncated")
    _, _, _, hl, cvalid, dhvlen, seqnum = _REPLY.unpack_from(data)
    start = _REPLY.size
    if start + 2 * hl + dhvlen > len(data):
        raise _payload(f"DH-HMAC-CHAP_Reply: HL {hl} + DHVLEN {dhvlen} past the payload")
    if cvalid not in (0, 1):
        raise _payload(f"DH-HMAC-CHAP_Reply: CVALID {cvalid}")
    r1 = bytes(data[start : start + hl])
    c2 = bytes(data[start + hl : start + 2 * hl]) if cvalid else None
    dh = bytes(data[start + 2 * hl : start + 2 * hl + dhvlen])
    return Reply(t_id, r1, seqnum, c2, dh)


def _parse_success1(data: bytes, t_id: int) -> Success1:
    if len(data) < _SUCCESS1.size:
        raise _payload(f"DH-HMAC-CHAP_Success1 of {len(data)} bytes is truncated")
    _, _, _, hl, rvalid = _SUCCESS1.unpack_from(data)
    if rvalid and _SUCCESS1.size + hl > len(data):
        raise _payload(f"DH-HMAC-CHAP_Success1: HL {hl} past the payload")
    start = _SUCCESS1.size
    rval = bytes(data[start : start + hl]) if rvalid & 1 else None
    return Success1(t_id, hl, rval)


def _parse_failure(data: bytes, t_id: int, auth_id: int) -> Failure:
    if len(data) < FAILURE_SIZE:
        raise _payload(f"AUTH_Failure of {len(data)} bytes is truncated")
    _, _, _, rc, rce = _FAILURE.unpack_from(data)
    return Failure(MessageId(auth_id), t_id, rce, rc)


def parse_message(data: bytes) -> Message:
    """One message from a payload (Authentication Send's data or Receive's)."""
    auth_type, auth_id, t_id = message_header(data)
    if auth_id in (MessageId.FAILURE1, MessageId.FAILURE2) and auth_type in (
        AuthType.COMMON,
        AuthType.DHCHAP,  # Linux 6.1's host sends Failure2 as a DH-HMAC-CHAP message
    ):
        return _parse_failure(data, t_id, auth_id)
    if auth_type == AuthType.COMMON and auth_id == MessageId.NEGOTIATE:
        return _parse_negotiate(data, t_id)
    if auth_type == AuthType.DHCHAP:
        if auth_id == MessageId.CHALLENGE:
            return _parse_challenge(data, t_id)
        if auth_id == MessageId.REPLY:
            return _parse_reply(data, t_id)
        if auth_id == MessageId.SUCCESS1:
            return _parse_success1(data, t_id)
        if auth_id == MessageId.SUCCESS2:
            if len(data) < _SUCCESS2.size:
                raise _payload(f"DH-HMAC-CHAP_Success2 of {len(data)} bytes is truncated")
            return Success2(t_id)
    raise MalformedMessage(
        FailureExplanation.INCORRECT_MESSAGE,
        f"unknown message: AUTH_TYPE {auth_type:#04x} AUTH_ID {auth_id:#04x}",
    )
