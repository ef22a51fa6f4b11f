"""TLS 1.3 on the wire (RFC 8446): the code points pynvmf uses, the cipher suites, the
error that carries an alert, and reading and writing the length-prefixed vectors and
extensions handshake messages are made of.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384

# -- wire constants (RFC 8446) -------------------------------------------------------------

CT_CHANGE_CIPHER_SPEC = 20
CT_ALERT = 21
CT_HANDSHAKE = 22
CT_APPLICATION_DATA = 23

HT_CLIENT_HELLO = 1
HT_SERVER_HELLO = 2
HT_NEW_SESSION_TICKET = 4
HT_END_OF_EARLY_DATA = 5
HT_ENCRYPTED_EXTENSIONS = 8
HT_FINISHED = 20
HT_KEY_UPDATE = 24

EXT_SUPPORTED_GROUPS = 10
EXT_SIGNATURE_ALGORITHMS = 13
EXT_PRE_SHARED_KEY = 41
EXT_EARLY_DATA = 42
EXT_SUPPORTED_VERSIONS = 43
EXT_PSK_KEY_EXCHANGE_MODES = 45
EXT_KEY_SHARE = 51

PSK_KE = 0
PSK_DHE_KE = 1

TLS13 = 0x0304
LEGACY_VERSION = 0x0303

GROUP_SECP256R1 = 0x0017
GROUP_SECP384R1 = 0x0018
GROUP_X25519 = 0x001D

# Alerts (RFC 8446 §6).
ALERT_CLOSE_NOTIFY = 0
ALERT_UNEXPECTED_MESSAGE = 10
ALERT_BAD_RECORD_MAC = 20
ALERT_RECORD_OVERFLOW = 22
ALERT_HANDSHAKE_FAILURE = 40
ALERT_ILLEGAL_PARAMETER = 47
ALERT_DECODE_ERROR = 50
ALERT_DECRYPT_ERROR = 51
ALERT_PROTOCOL_VERSION = 70
ALERT_INTERNAL_ERROR = 80
ALERT_MISSING_EXTENSION = 109
ALERT_UNKNOWN_PSK_IDENTITY = 115

ALERT_NAMES = {
    0: "close_notify",
    10: "unexpected_message",
    20: "bad_record_mac",
    22: "record_overflow",
    40: "handshake_failure",
    47: "illegal_parameter",
    50: "decode_error",
    51: "decrypt_error",
    70: "protocol_version",
    80: "internal_error",
    90: "user_canceled",
    109: "missing_extension",
    115: "unknown_psk_identity",
}

MAX_PLAINTEXT = 1 << 14
MAX_CIPHERTEXT = MAX_PLAINTEXT + 256
# A handshake message larger than this is refused: PSK-only messages are small (a
# ClientHello with a few identities and key shares is under 2 KiB), and the bound keeps
# what a stranger can make us buffer before it has proved anything.
MAX_HANDSHAKE_MESSAGE = 16384
# Identities of one ClientHello looked up (each costs a derivation and binder checks).
MAX_IDENTITIES = 8
# The HelloRetryRequest's ServerHello.random (RFC 8446 §4.1.3).
HRR_RANDOM = hashlib.sha256(b"HelloRetryRequest").digest()


@dataclass(frozen=True)
class CipherSuite:
    code: int
    name: str
    hash_id: int  # pynvmf.tcp.psk HASH_SHA256 / HASH_SHA384
    key_len: int
    kernel_cipher: int  # linux/tls.h TLS_CIPHER_AES_GCM_128 / _256

    @property
    def hash(self) -> Callable[..., Any]:
        return hashlib.sha256 if self.hash_id == HASH_SHA256 else hashlib.sha384

    @property
    def hash_len(self) -> int:
        return 32 if self.hash_id == HASH_SHA256 else 48


TLS_AES_128_GCM_SHA256 = CipherSuite(0x1301, "TLS_AES_128_GCM_SHA256", HASH_SHA256, 16, 51)
TLS_AES_256_GCM_SHA384 = CipherSuite(0x1302, "TLS_AES_256_GCM_SHA384", HASH_SHA384, 32, 52)
SUITES = {s.code: s for s in (TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384)}
SUITE_FOR_HASH = {s.hash_id: s for s in SUITES.values()}


class TlsError(Exception):
    """The handshake or a record failed. `alert` is what we send (or received)."""

    def __init__(self, alert: int, message: str) -> None:
        super().__init__(message)
        self.alert = alert


# -- parsing helpers -----------------------------------------------------------------------


class Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise TlsError(ALERT_DECODE_ERROR, "a handshake message is truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def vec(self, length_bytes: int) -> bytes:
        return self.take(int.from_bytes(self.take(length_bytes), "big"))

    def done(self) -> bool:
        return self.pos == len(self.data)

    def end(self) -> None:
        if not self.done():
            raise TlsError(ALERT_DECODE_ERROR, "a handshake message has trailing bytes")


def vector(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def extension(code: int, body: bytes) -> bytes:
    return struct.pack("!HH", code, len(body)) + body


def handshake_message(msg_type: int, body: bytes) -> bytes:
    return bytes([msg_type]) + len(body).to_bytes(3, "big") + body


def parse_extensions(r: Reader) -> tuple[dict[int, bytes], list[int]]:
    exts: dict[int, bytes] = {}
    order: list[int] = []
    block = Reader(r.vec(2))
    while not block.done():
        code = block.u16()
        body = block.vec(2)
        if code in exts:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, f"extension {code} appears twice")
        exts[code] = body
        order.append(code)
    return exts, order
