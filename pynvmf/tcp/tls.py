"""The NVMe/TCP secure channel: TLS 1.3 with external pre-shared keys (NVMe/TCP Transport
1.1 §3.6, from TP 8011), and the offload of its record layer to the kernel (kTLS).

Everything TLS is in this module:

- `TlsEngine`: a sans-I/O TLS 1.3 handshake and record layer for both roles, PSK only (RFC
  8446 §2.2 with external PSKs, no certificates, no resumption, no early data): cipher suites
  TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384, key exchange modes psk_dhe_ke (x25519,
  secp256r1, secp384r1) and psk_ke, nothing but TLS 1.3. Bytes in through
  `get_buffer`/`received`, records out through `take_output`; application data out
  through `protect`. Built on `cryptography` (AES-GCM, ECDH) and the standard library
  (HMAC/HKDF). Why not a TLS library: docs/tls.md.
- `ktls_offload`: moves one direction of an established engine into the kernel
  (``setsockopt(TCP_ULP, "tls")`` and ``SOL_TLS``/``TLS_TX``/``TLS_RX`` with the traffic key,
  IV and record sequence number), so that data goes out with the same sends as on a plain
  socket. Where the kernel cannot (no ``tls`` module, the cipher not built), the engine
  stays the record layer, in user space.
- `SecureChannel`: the asyncio glue both roles share: it sits between an
  ``asyncio.BufferedProtocol`` and its transport, runs the handshake, decides per
  connection and per direction whether the kernel or user space carries the records,
  logs and counts that decision.

Secrets (PSKs, traffic secrets, keys) are never logged, never in an exception's message.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, TlsPsk, hkdf_expand_label, hkdf_extract

log = logging.getLogger(__name__)

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
_HRR_RANDOM = hashlib.sha256(b"HelloRetryRequest").digest()


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


# -- record protection ---------------------------------------------------------------------


class RecordCipher:
    """AES-GCM record protection for one direction and one traffic secret."""

    __slots__ = ("_aead", "_iv", "iv", "key", "secret", "seq", "suite")

    def __init__(self, suite: CipherSuite, secret: bytes) -> None:
        self.suite = suite
        self.secret = secret
        self.key = hkdf_expand_label(suite.hash_id, secret, "key", b"", suite.key_len)
        self.iv = hkdf_expand_label(suite.hash_id, secret, "iv", b"", 12)
        self._iv = int.from_bytes(self.iv, "big")
        self._aead = AESGCM(self.key)
        self.seq = 0

    def __repr__(self) -> str:
        return f"RecordCipher({self.suite.name}, seq={self.seq})"

    def _nonce(self) -> bytes:
        nonce = (self._iv ^ self.seq).to_bytes(12, "big")
        self.seq += 1
        return nonce

    def seal(self, content_type: int, data: bytes | bytearray) -> bytes:
        inner = bytes(data) + bytes([content_type]) if data else bytes([content_type])
        header = struct.pack("!BHH", CT_APPLICATION_DATA, LEGACY_VERSION, len(inner) + 16)
        return header + self._aead.encrypt(self._nonce(), inner, header)

    def seal_many(self, pieces: list[Any]) -> list[bytes]:
        """Application data records for `pieces` (bytes-like), each ≤ 2^14 of plaintext,
        as header and body buffers in turn (for writelines: no copy to join them)."""
        out: list[bytes] = []
        pending: list[Any] = []
        size = 0
        for piece in pieces:
            view = memoryview(piece).cast("B")
            while len(view):
                take = min(len(view), MAX_PLAINTEXT - size)
                pending.append(view[:take])
                size += take
                view = view[take:]
                if size == MAX_PLAINTEXT:
                    out += self._seal_app(pending)
                    pending, size = [], 0
        if size:
            out += self._seal_app(pending)
        return out

    def _seal_app(self, pending: list[Any]) -> tuple[bytes, bytes]:
        pending.append(b"\x17")
        inner = b"".join(pending)
        header = struct.pack("!BHH", CT_APPLICATION_DATA, LEGACY_VERSION, len(inner) + 16)
        return header, self._aead.encrypt(self._nonce(), inner, header)

    def open(self, header: bytes, body: Any) -> tuple[int, Any]:
        try:
            inner = self._aead.decrypt(self._nonce(), body, header)
        except InvalidTag:
            raise TlsError(ALERT_BAD_RECORD_MAC, "a record failed authentication") from None
        end = len(inner)
        while end and inner[end - 1] == 0:
            end -= 1
        if not end:
            raise TlsError(ALERT_UNEXPECTED_MESSAGE, "a record without a content type")
        # A view, not a copy: the plaintext is copied once, into the NVMe/TCP reader.
        return inner[end - 1], memoryview(inner)[: end - 1]


# -- key exchange --------------------------------------------------------------------------


class _KeyShare:
    """One (EC)DHE private key and its public share."""

    def __init__(self, group: int) -> None:
        self.group = group
        if group == GROUP_X25519:
            self._x = x25519.X25519PrivateKey.generate()
            self.public = self._x.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        else:
            curve = ec.SECP256R1() if group == GROUP_SECP256R1 else ec.SECP384R1()
            self._ec = ec.generate_private_key(curve)
            self.public = self._ec.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )

    def shared(self, peer: bytes) -> bytes:
        try:
            if self.group == GROUP_X25519:
                if len(peer) != 32:
                    raise ValueError("x25519 share length")
                return self._x.exchange(x25519.X25519PublicKey.from_public_bytes(peer))
            curve = ec.SECP256R1() if self.group == GROUP_SECP256R1 else ec.SECP384R1()
            pub = ec.EllipticCurvePublicKey.from_encoded_point(curve, peer)
            return self._ec.exchange(ec.ECDH(), pub)
        except ValueError:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "the peer's key share is not valid") from None


GROUPS = (GROUP_X25519, GROUP_SECP256R1, GROUP_SECP384R1)


# -- parsing helpers -----------------------------------------------------------------------


class _Reader:
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


def _vec(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def _ext(code: int, body: bytes) -> bytes:
    return struct.pack("!HH", code, len(body)) + body


def _handshake(msg_type: int, body: bytes) -> bytes:
    return bytes([msg_type]) + len(body).to_bytes(3, "big") + body


def _parse_extensions(r: _Reader) -> tuple[dict[int, bytes], list[int]]:
    exts: dict[int, bytes] = {}
    order: list[int] = []
    block = _Reader(r.vec(2))
    while not block.done():
        code = block.u16()
        body = block.vec(2)
        if code in exts:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, f"extension {code} appears twice")
        exts[code] = body
        order.append(code)
    return exts, order


# -- the engine ----------------------------------------------------------------------------

# The PSKs an identity may stand for (more than one when derivations differ: the binder
# tells which the peer used); empty when the identity is unknown.
PskLookup = Callable[[bytes], "list[TlsPsk]"]


@dataclass
class TlsStats:
    records_in: int = 0
    records_out: int = 0
    post_handshake_messages: int = 0


class TlsEngine:
    """A TLS 1.3 PSK endpoint, sans-I/O. Use `TlsEngine.client(psk)` or
    `TlsEngine.server(lookup)`; `start()` (the client's ClientHello), then feed bytes with
    `get_buffer`/`received` and send what `take_output` returns."""

    def __init__(
        self,
        is_client: bool,
        *,
        psk: TlsPsk | None = None,
        lookup: PskLookup | None = None,
        modes: tuple[int, ...] = (PSK_DHE_KE, PSK_KE),
        groups: tuple[int, ...] = GROUPS,
        offer: tuple[int, ...] | None = None,
    ) -> None:
        self.is_client = is_client
        # The cipher suites a client offers (default: its PSK's alone; tests offer others).
        self.offer = offer
        self._psk = psk
        self._lookup = lookup
        self.modes = modes
        self.groups = groups
        self.suite: CipherSuite | None = None
        self.psk: TlsPsk | None = psk if is_client else None
        self.mode: int | None = None  # PSK_KE or PSK_DHE_KE, once negotiated
        self.group: int | None = None
        self.established = False
        self.closed = False
        self.error: TlsError | None = None
        self.peer_alert: int | None = None
        self.stats = TlsStats()
        self._in = bytearray(4 * MAX_CIPHERTEXT)
        self._view = memoryview(self._in)
        self._start = 0
        self._end = 0
        self._out: list[bytes] = []
        self._hs_buf = bytearray()
        self._app: list[bytes] = []
        self._rx: RecordCipher | None = None
        self._tx: RecordCipher | None = None
        self._transcript: Any = None
        self._shares: dict[int, _KeyShare] = {}
        self._state = "start" if is_client else "wait_ch"
        self._early = b""
        self._hs_secret = b""
        self._master = b""
        self._c_hs = b""
        self._s_hs = b""
        self._c_ap = b""
        self._s_ap = b""
        self._ch_bytes = b""

    @classmethod
    def client(cls, psk: TlsPsk, **kwargs: Any) -> TlsEngine:
        return cls(True, psk=psk, **kwargs)

    @classmethod
    def server(cls, lookup: PskLookup, **kwargs: Any) -> TlsEngine:
        return cls(False, lookup=lookup, **kwargs)

    def __repr__(self) -> str:
        suite = self.suite.name if self.suite else "-"
        return f"TlsEngine({'client' if self.is_client else 'server'}, {self._state}, {suite})"

    # -- bytes in and out ------------------------------------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._end == len(self._in):
            pending = self._end - self._start
            self._in[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        return self._view[self._end :]

    def received(self, nbytes: int) -> list[bytes]:
        """`nbytes` were written into `get_buffer()`: handle every whole record. Returns the
        application data that arrived, in order; on failure `error` is set (and the alert
        to send is in the output) and nothing more is accepted."""
        self._end += nbytes
        if self.error is None and not self.closed:
            try:
                self._records()
            except TlsError as exc:
                self._fail(exc)
        app, self._app = self._app, []
        return app

    def feed(self, data: bytes) -> list[bytes]:
        """Copy `data` in and handle it (tests, and the glue's first sniffed bytes)."""
        out: list[bytes] = []
        view = memoryview(data)
        while len(view) and self.error is None and not self.closed:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            out += self.received(n)
        return out

    @property
    def buffer_size(self) -> int:
        return len(self._in)

    def peek_input(self, nbytes: int) -> bytes:
        """The `nbytes` just written into `get_buffer()`, before `received` (the glue
        looks at a connection's first byte to tell TLS from plain NVMe/TCP)."""
        return bytes(self._view[self._end : self._end + nbytes])

    @property
    def at_record_boundary(self) -> bool:
        """No part of a record waits in user space: the kernel could take over reading."""
        return self._start == self._end

    def take_output(self) -> list[bytes]:
        out, self._out = self._out, []
        return out

    def protect(self, pieces: list[Any]) -> list[bytes]:
        """Application data records for `pieces` (after the handshake)."""
        if self._tx is None or not self.established or self.error is not None:
            raise TlsError(ALERT_INTERNAL_ERROR, "application data before the handshake")
        out = self._tx.seal_many(pieces)
        self.stats.records_out += len(out) // 2
        return out

    def close(self) -> None:
        """Queue a close_notify (when the record layer is still ours)."""
        if not self.closed and self.error is None:
            self._alert(ALERT_CLOSE_NOTIFY)
            self.closed = True

    def traffic(self) -> tuple[RecordCipher, RecordCipher]:
        """The application traffic ciphers (tx, rx) with their current sequence numbers."""
        assert self._tx is not None and self._rx is not None and self.established
        return self._tx, self._rx

    # -- internals -------------------------------------------------------------------------

    def _fail(self, exc: TlsError) -> None:
        self.error = exc
        if self.peer_alert is None:
            with contextlib.suppress(Exception):
                self._alert(exc.alert)
        self._hs_buf = bytearray()
        self._shares = {}

    def _alert(self, description: int) -> None:
        level = 1 if description == ALERT_CLOSE_NOTIFY else 2
        body = bytes([level, description])
        if self._tx is not None:
            self._out.append(self._tx.seal(CT_ALERT, body))
        else:
            self._out.append(struct.pack("!BHH", CT_ALERT, LEGACY_VERSION, 2) + body)

    def _records(self) -> None:
        view = self._view
        while self.error is None and not self.closed:
            avail = self._end - self._start
            if avail < 5:
                break
            start = self._start
            ctype = view[start]
            length = (view[start + 3] << 8) | view[start + 4]
            if ctype not in (CT_CHANGE_CIPHER_SPEC, CT_ALERT, CT_HANDSHAKE, CT_APPLICATION_DATA):
                raise TlsError(ALERT_UNEXPECTED_MESSAGE, f"not a TLS record (type {ctype})")
            if view[start + 1] != 3:
                raise TlsError(ALERT_PROTOCOL_VERSION, "not a TLS record (version)")
            if length > MAX_CIPHERTEXT or (self._rx is None and length > MAX_PLAINTEXT):
                raise TlsError(ALERT_RECORD_OVERFLOW, f"a record of {length} bytes")
            if avail < 5 + length:
                break
            header = bytes(view[start : start + 5])
            body = view[start + 5 : start + 5 + length]
            self._start += 5 + length
            self.stats.records_in += 1
            self._record(ctype, header, body)
        if self._start == self._end:
            self._start = self._end = 0

    def _record(self, ctype: int, header: bytes, body: memoryview) -> None:
        if ctype == CT_CHANGE_CIPHER_SPEC:
            # Middlebox compatibility (RFC 8446 §5): one 0x01 byte during the handshake.
            if self.established or bytes(body) != b"\x01":
                raise TlsError(ALERT_UNEXPECTED_MESSAGE, "a change_cipher_spec record")
            return
        if self._rx is not None:
            if ctype != CT_APPLICATION_DATA:
                raise TlsError(ALERT_UNEXPECTED_MESSAGE, "a plaintext record after keys")
            ctype, data = self._rx.open(header, body)
        else:
            data = bytes(body)
        if ctype == CT_ALERT:
            self._on_alert(data)
        elif ctype == CT_HANDSHAKE:
            self._hs_buf += data
            if len(self._hs_buf) > MAX_HANDSHAKE_MESSAGE + 4:
                raise TlsError(ALERT_HANDSHAKE_FAILURE, "a handshake message too large")
            self._handshake_messages()
        elif ctype == CT_APPLICATION_DATA:
            if not self.established:
                raise TlsError(ALERT_UNEXPECTED_MESSAGE, "application data before Finished")
            if data:
                self._app.append(data)
        else:
            raise TlsError(ALERT_UNEXPECTED_MESSAGE, f"an inner content type {ctype}")

    def _on_alert(self, data: bytes) -> None:
        if len(data) != 2:
            raise TlsError(ALERT_DECODE_ERROR, "a malformed alert")
        self.peer_alert = data[1]
        name = ALERT_NAMES.get(data[1], str(data[1]))
        if data[1] == ALERT_CLOSE_NOTIFY:
            self.closed = True
            return
        self.error = TlsError(data[1], f"the peer sent alert {name}")

    def _handshake_messages(self) -> None:
        buf = self._hs_buf
        while len(buf) >= 4 and self.error is None:
            length = int.from_bytes(buf[1:4], "big")
            if length > MAX_HANDSHAKE_MESSAGE:
                raise TlsError(ALERT_HANDSHAKE_FAILURE, "a handshake message too large")
            if len(buf) < 4 + length:
                break
            msg = bytes(buf[: 4 + length])
            del buf[: 4 + length]
            self._handshake_message(msg[0], msg)

    def _hash_add(self, msg: bytes) -> None:
        self._transcript.update(msg)

    def _transcript_hash(self) -> bytes:
        return self._transcript.copy().digest()

    def _derive(self, secret: bytes, label: str, context_hash: bytes) -> bytes:
        assert self.suite is not None
        return hkdf_expand_label(
            self.suite.hash_id, secret, label, context_hash, self.suite.hash_len
        )

    def _finished(self, base_secret: bytes, transcript_hash: bytes) -> bytes:
        assert self.suite is not None
        key = hkdf_expand_label(
            self.suite.hash_id, base_secret, "finished", b"", self.suite.hash_len
        )
        return hmac.new(key, transcript_hash, self.suite.hash).digest()

    def _binder(self, psk: TlsPsk, suite: CipherSuite, truncated_hello: bytes) -> bytes:
        early = hkdf_extract(suite.hash_id, b"", psk.key)
        empty = suite.hash(b"").digest()
        binder_key = hkdf_expand_label(suite.hash_id, early, "ext binder", empty, suite.hash_len)
        finished_key = hkdf_expand_label(suite.hash_id, binder_key, "finished", b"", suite.hash_len)
        return hmac.new(finished_key, suite.hash(truncated_hello).digest(), suite.hash).digest()

    def _key_schedule_handshake(self, psk_key: bytes, dhe: bytes | None) -> None:
        assert self.suite is not None
        h = self.suite
        self._early = hkdf_extract(h.hash_id, b"", psk_key)
        derived = self._derive(self._early, "derived", h.hash(b"").digest())
        self._hs_secret = hkdf_extract(h.hash_id, derived, dhe or bytes(h.hash_len))
        th = self._transcript_hash()
        self._c_hs = self._derive(self._hs_secret, "c hs traffic", th)
        self._s_hs = self._derive(self._hs_secret, "s hs traffic", th)
        derived = self._derive(self._hs_secret, "derived", h.hash(b"").digest())
        self._master = hkdf_extract(h.hash_id, derived, bytes(h.hash_len))

    def _key_schedule_application(self) -> None:
        th = self._transcript_hash()
        self._c_ap = self._derive(self._master, "c ap traffic", th)
        self._s_ap = self._derive(self._master, "s ap traffic", th)

    def _send_handshake(self, msg: bytes) -> None:
        self._hash_add(msg)
        if self._tx is None:
            self._out.append(struct.pack("!BHH", CT_HANDSHAKE, LEGACY_VERSION, len(msg)) + msg)
        else:
            self._out.append(self._tx.seal(CT_HANDSHAKE, msg))

    def _handshake_message(self, msg_type: int, msg: bytes) -> None:
        state = self._state
        if self.established:
            self._post_handshake(msg_type, msg)
        elif state == "wait_ch" and msg_type == HT_CLIENT_HELLO:
            self._on_client_hello(msg)
        elif state == "wait_sh" and msg_type == HT_SERVER_HELLO:
            self._on_server_hello(msg)
        elif state == "wait_ee" and msg_type == HT_ENCRYPTED_EXTENSIONS:
            r = _Reader(msg[4:])
            _parse_extensions(r)
            r.end()
            self._hash_add(msg)
            self._state = "wait_fin"
        elif state == "wait_fin" and msg_type == HT_FINISHED:
            self._on_finished(msg)
        else:
            raise TlsError(
                ALERT_UNEXPECTED_MESSAGE, f"handshake message {msg_type} in state {state}"
            )

    def _post_handshake(self, msg_type: int, msg: bytes) -> None:
        self.stats.post_handshake_messages += 1
        if msg_type == HT_NEW_SESSION_TICKET and self.is_client:
            return  # no resumption: a ticket is of no use to us
        if msg_type == HT_KEY_UPDATE:
            raise TlsError(ALERT_UNEXPECTED_MESSAGE, "KeyUpdate is not supported")
        raise TlsError(ALERT_UNEXPECTED_MESSAGE, f"post-handshake message {msg_type}")

    # -- client ----------------------------------------------------------------------------

    def start(self) -> None:
        """The client's first flight: ClientHello with the PSK's identity and binder."""
        assert self.is_client and self._psk is not None and self._state == "start"
        psk = self._psk
        suite = SUITE_FOR_HASH[psk.hash_id]
        self.suite = suite
        self._transcript = suite.hash()
        exts = _ext(EXT_SUPPORTED_VERSIONS, _vec(1, struct.pack("!H", TLS13)))
        exts += _ext(
            EXT_SUPPORTED_GROUPS, _vec(2, b"".join(struct.pack("!H", g) for g in self.groups))
        )
        if PSK_DHE_KE in self.modes:
            share = _KeyShare(self.groups[0])
            self._shares[share.group] = share
            entry = struct.pack("!H", share.group) + _vec(2, share.public)
            exts += _ext(EXT_KEY_SHARE, _vec(2, entry))
        exts += _ext(EXT_PSK_KEY_EXCHANGE_MODES, _vec(1, bytes(self.modes)))
        identities = _vec(2, _vec(2, psk.identity) + struct.pack("!I", 0))
        binders_len = 2 + 1 + suite.hash_len
        psk_ext_len = len(identities) + binders_len
        exts += struct.pack("!HH", EXT_PRE_SHARED_KEY, psk_ext_len) + identities
        body = (
            struct.pack("!H", LEGACY_VERSION)
            + os.urandom(32)
            + _vec(1, b"")
            + _vec(2, b"".join(struct.pack("!H", c) for c in (self.offer or (suite.code,))))
            + _vec(1, b"\x00")
        )
        total_exts = len(exts) + binders_len
        body += struct.pack("!H", total_exts) + exts
        msg_len = len(body) + binders_len
        truncated = bytes([HT_CLIENT_HELLO]) + msg_len.to_bytes(3, "big") + body
        binder = self._binder(psk, suite, truncated)
        msg = truncated + _vec(2, _vec(1, binder))
        self._hash_add(msg)
        # The first ClientHello's record may say TLS 1.0 for old middleboxes; 1.2 is fine.
        self._out.append(struct.pack("!BHH", CT_HANDSHAKE, 0x0301, len(msg)) + msg)
        self._state = "wait_sh"

    def _on_server_hello(self, msg: bytes) -> None:
        assert self.suite is not None and self._psk is not None
        r = _Reader(msg[4:])
        if r.u16() != LEGACY_VERSION:
            raise TlsError(ALERT_PROTOCOL_VERSION, "the server does not speak TLS 1.3")
        random = r.take(32)
        if random == _HRR_RANDOM:
            raise TlsError(
                ALERT_HANDSHAKE_FAILURE,
                "the server asked for another key share (HelloRetryRequest): not supported",
            )
        r.vec(1)
        code = r.u16()
        if r.u8() != 0:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "a compression method")
        exts, _ = _parse_extensions(r)
        r.end()
        if exts.get(EXT_SUPPORTED_VERSIONS) != struct.pack("!H", TLS13):
            raise TlsError(ALERT_PROTOCOL_VERSION, "the server chose a version other than TLS 1.3")
        if code != self.suite.code:
            raise TlsError(
                ALERT_ILLEGAL_PARAMETER, "the server chose a cipher suite we did not offer"
            )
        if EXT_PRE_SHARED_KEY not in exts or exts[EXT_PRE_SHARED_KEY] != b"\x00\x00":
            raise TlsError(ALERT_HANDSHAKE_FAILURE, "the server did not accept our PSK")
        self._hash_add(msg)
        dhe = None
        if EXT_KEY_SHARE in exts:
            ks = _Reader(exts[EXT_KEY_SHARE])
            group = ks.u16()
            public = ks.vec(2)
            ks.end()
            share = self._shares.get(group)
            if share is None or PSK_DHE_KE not in self.modes:
                raise TlsError(ALERT_ILLEGAL_PARAMETER, "a key share for a group we did not offer")
            dhe = share.shared(public)
            self.mode, self.group = PSK_DHE_KE, group
        elif PSK_KE in self.modes:
            self.mode = PSK_KE
        else:
            raise TlsError(ALERT_MISSING_EXTENSION, "no key share (we asked for psk_dhe_ke)")
        self._shares = {}
        self._key_schedule_handshake(self._psk.key, dhe)
        self._rx = RecordCipher(self.suite, self._s_hs)
        self._state = "wait_ee"

    def _on_finished(self, msg: bytes) -> None:
        assert self.suite is not None
        r = _Reader(msg[4:])
        verify = r.take(self.suite.hash_len)
        r.end()
        peer_secret = self._s_hs if self.is_client else self._c_hs
        if not hmac.compare_digest(verify, self._finished(peer_secret, self._transcript_hash())):
            raise TlsError(ALERT_DECRYPT_ERROR, "the peer's Finished does not verify")
        self._hash_add(msg)
        if self.is_client:
            self._key_schedule_application()
            self._tx = RecordCipher(self.suite, self._c_hs)
            fin = self._finished(self._c_hs, self._transcript_hash())
            self._send_handshake(_handshake(HT_FINISHED, fin))
            self._tx = RecordCipher(self.suite, self._c_ap)
            self._rx = RecordCipher(self.suite, self._s_ap)
        else:
            self._rx = RecordCipher(self.suite, self._c_ap)
        self._done()

    def _done(self) -> None:
        self.established = True
        self._state = "established"
        # Nothing secret outlives the handshake but the two traffic ciphers.
        self._early = self._hs_secret = self._master = b""
        self._c_hs = self._s_hs = self._c_ap = self._s_ap = b""
        self._hs_buf = bytearray()

    # -- server ----------------------------------------------------------------------------

    def _on_client_hello(self, msg: bytes) -> None:
        assert self._lookup is not None
        r = _Reader(msg[4:])
        r.u16()
        r.take(32)
        session_id = r.vec(1)
        if len(session_id) > 32:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "a legacy session id of more than 32 bytes")
        suites_raw = r.vec(2)
        if len(suites_raw) % 2 or not suites_raw:
            raise TlsError(ALERT_DECODE_ERROR, "a malformed cipher suite list")
        offered = {
            int.from_bytes(suites_raw[i : i + 2], "big") for i in range(0, len(suites_raw), 2)
        }
        if r.vec(1) != b"\x00":
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "compression methods other than null")
        exts_start = r.pos
        exts, order = _parse_extensions(r)
        r.end()
        versions = _Reader(exts.get(EXT_SUPPORTED_VERSIONS, b"\x00"))
        vlist = versions.vec(1)
        if struct.pack("!H", TLS13) not in [vlist[i : i + 2] for i in range(0, len(vlist), 2)]:
            raise TlsError(ALERT_PROTOCOL_VERSION, "the client does not offer TLS 1.3")
        if EXT_PRE_SHARED_KEY not in exts:
            raise TlsError(ALERT_MISSING_EXTENSION, "the client offers no pre-shared key")
        if order[-1] != EXT_PRE_SHARED_KEY:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "pre_shared_key is not the last extension")
        if EXT_EARLY_DATA in exts:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "early data with an external PSK")
        mr = _Reader(exts.get(EXT_PSK_KEY_EXCHANGE_MODES, b""))
        client_modes = set(mr.vec(1)) if exts.get(EXT_PSK_KEY_EXCHANGE_MODES) else set()
        if not client_modes:
            raise TlsError(ALERT_MISSING_EXTENSION, "no psk_key_exchange_modes")
        # The offered PSKs, and where the binders start (the truncated ClientHello ends there).
        pr = _Reader(exts[EXT_PRE_SHARED_KEY])
        ids = _Reader(pr.vec(2))
        identities: list[bytes] = []
        while not ids.done():
            identities.append(ids.vec(2))
            ids.u32()
        binders_at = len(pr.data) - pr.pos
        br = _Reader(pr.vec(2))
        pr.end()
        binders: list[bytes] = []
        while not br.done():
            binders.append(br.vec(1))
        if not identities or len(identities) != len(binders):
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "identities and binders do not pair up")
        del exts_start
        # The truncated ClientHello: the message up to (not including) the binders list.
        truncated = msg[: len(msg) - binders_at]
        chosen = None
        known = False
        for index, identity in enumerate(identities[:MAX_IDENTITIES]):
            candidates = self._lookup(identity)
            if not candidates:
                continue
            known = True
            suite = SUITE_FOR_HASH[candidates[0].hash_id]
            if suite.code not in offered:
                raise TlsError(
                    ALERT_HANDSHAKE_FAILURE,
                    f"the client does not offer {suite.name}, the cipher suite of its PSK",
                )
            for psk in candidates:
                if hmac.compare_digest(binders[index], self._binder(psk, suite, truncated)):
                    chosen = (index, psk, suite)
                    break
            if chosen is not None:
                break
        if chosen is None and known:
            # Diagnose a peer that computes its binder with the other hash: Debian 13's
            # tlshd does so (SHA-256) for NVMe0R02 keys, whose identity names SHA-384.
            for index, identity in enumerate(identities[:MAX_IDENTITIES]):
                for psk in self._lookup(identity):
                    other = SUITE_FOR_HASH[
                        HASH_SHA256 if psk.hash_id == HASH_SHA384 else HASH_SHA384
                    ]
                    if hmac.compare_digest(binders[index], self._binder(psk, other, truncated)):
                        raise TlsError(
                            ALERT_HANDSHAKE_FAILURE,
                            f"the host computes its binder with {other.hash().name.upper()}, not"
                            f" the hash its identity {identity[:8].decode(errors='replace')}"
                            " names (a tlshd whose GnuTLS PSK credentials ignore the identity's"
                            " hash); NVMe/TCP allows no other cipher suite for that PSK",
                        )
            raise TlsError(ALERT_DECRYPT_ERROR, "the PSK binder does not verify (a wrong key?)")
        if chosen is None:
            raise TlsError(ALERT_UNKNOWN_PSK_IDENTITY, "no PSK for any identity offered")
        index, psk, suite = chosen
        self.suite, self.psk = suite, psk
        # Key exchange: (EC)DHE when the client allows it and sent a share we can use.
        share_entries: dict[int, bytes] = {}
        if EXT_KEY_SHARE in exts:
            kr = _Reader(exts[EXT_KEY_SHARE])
            block = _Reader(kr.vec(2))
            kr.end()
            while not block.done():
                group = block.u16()
                share_entries.setdefault(group, block.vec(2))
        dhe = None
        server_share = None
        usable = [g for g in self.groups if g in share_entries]
        if PSK_DHE_KE in client_modes and PSK_DHE_KE in self.modes and usable:
            server_share = _KeyShare(usable[0])
            dhe = server_share.shared(share_entries[usable[0]])
            self.mode, self.group = PSK_DHE_KE, usable[0]
        elif PSK_KE in client_modes and PSK_KE in self.modes:
            self.mode = PSK_KE
        else:
            raise TlsError(
                ALERT_HANDSHAKE_FAILURE,
                "no common key exchange (the client's key shares are for groups we lack)",
            )
        self._transcript = suite.hash()
        self._hash_add(msg)
        sh_exts = _ext(EXT_SUPPORTED_VERSIONS, struct.pack("!H", TLS13))
        if server_share is not None:
            sh_exts += _ext(
                EXT_KEY_SHARE, struct.pack("!H", server_share.group) + _vec(2, server_share.public)
            )
        sh_exts += _ext(EXT_PRE_SHARED_KEY, struct.pack("!H", index))
        body = (
            struct.pack("!H", LEGACY_VERSION)
            + os.urandom(32)
            + _vec(1, session_id)
            + struct.pack("!HB", suite.code, 0)
            + _vec(2, sh_exts)
        )
        self._send_handshake(_handshake(HT_SERVER_HELLO, body))
        self._key_schedule_handshake(psk.key, dhe)
        self._tx = RecordCipher(suite, self._s_hs)
        self._rx = RecordCipher(suite, self._c_hs)
        self._send_handshake(_handshake(HT_ENCRYPTED_EXTENSIONS, _vec(2, b"")))
        fin = self._finished(self._s_hs, self._transcript_hash())
        self._send_handshake(_handshake(HT_FINISHED, fin))
        self._key_schedule_application()
        self._tx = RecordCipher(suite, self._s_ap)
        self._state = "wait_fin"


# -- the kernel's record layer (kTLS) -------------------------------------------------------

SOL_TLS = 282
TCP_ULP = 31
TLS_TX = 1
TLS_RX = 2
TLS_GET_RECORD_TYPE = 2
_KTLS_MISSING: str | None = None  # why the kernel cannot, once known for the whole process


def _crypto_info(cipher: RecordCipher) -> bytes:
    # struct tls12_crypto_info_aes_gcm_{128,256}: version, cipher_type, iv[8], key, salt[4],
    # rec_seq[8]. For TLS 1.3 the 12-byte IV is salt || iv.
    return (
        struct.pack("=HH", TLS13, cipher.suite.kernel_cipher)
        + cipher.iv[4:]
        + cipher.key
        + cipher.iv[:4]
        + cipher.seq.to_bytes(8, "big")
    )


def ktls_attach(sock: Any) -> str:
    """Put the "tls" upper-layer protocol on `sock`. Returns "" or why it cannot."""
    global _KTLS_MISSING
    if _KTLS_MISSING is not None:
        return _KTLS_MISSING
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
    except OSError as exc:
        reason = f"the kernel has no TLS ULP ({os.strerror(exc.errno or 0)})"
        if exc.errno in (2, 92, 95):  # ENOENT (no module), ENOPROTOOPT, EOPNOTSUPP
            _KTLS_MISSING = reason
        return reason
    return ""


def ktls_set(sock: Any, direction: int, cipher: RecordCipher) -> str:
    """Hand one direction's key to the kernel. Returns "" or why it cannot."""
    try:
        sock.setsockopt(SOL_TLS, direction, _crypto_info(cipher))
    except OSError as exc:
        return f"the kernel refused the {cipher.suite.name} key ({os.strerror(exc.errno or 0)})"
    return ""


# -- the glue ------------------------------------------------------------------------------


@dataclass
class TlsCounters:
    """Per-process counts of secure-channel decisions (the target's stats show them)."""

    handshakes: int = 0
    handshake_failures: int = 0
    ktls_tx: int = 0
    ktls_rx: int = 0
    user_tx: int = 0
    user_rx: int = 0
    fallback_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "handshakes": self.handshakes,
            "handshake_failures": self.handshake_failures,
            "ktls_tx": self.ktls_tx,
            "ktls_rx": self.ktls_rx,
            "user_space_tx": self.user_tx,
            "user_space_rx": self.user_rx,
            "fallback_reasons": dict(self.fallback_reasons),
        }


COUNTERS = TlsCounters()
KTLS_POLICIES = ("auto", "off")


class SecureChannel:
    """TLS between an asyncio BufferedProtocol and its transport.

    The protocol forwards `get_buffer`/`buffer_updated` here while `rx_user` is true and
    sends through `write`. Plaintext goes to `on_plaintext`; `on_established` runs once the
    handshake is done (before any plaintext), `on_failed(reason)` once it fails.

    The record layer moves into the kernel per direction when it can: transmit right after
    the handshake (our last handshake record has left user space: the transport's buffer is
    empty), receive at the first moment no partial record waits in user space, with the
    sequence number of the records user space has already opened (a NewSessionTicket the
    server sent after its Finished counts among them).
    """

    def __init__(
        self,
        engine: TlsEngine,
        transport: Any,
        on_plaintext: Callable[[bytes], None],
        on_established: Callable[[], None],
        on_failed: Callable[[str], None],
        *,
        ktls: str = "auto",
        label: str = "",
        counters: TlsCounters = COUNTERS,
    ) -> None:
        self.engine = engine
        self.transport = transport
        self.on_plaintext = on_plaintext
        self.on_established = on_established
        self.on_failed = on_failed
        self.ktls = ktls
        self.label = label
        self.counters = counters
        self.rx_user = True
        self.tx_user = True
        self.tx_kernel = False
        self.rx_kernel = False
        self.reason = ""
        # The peer ended the session with close_notify (not a failure).
        self.clean_close = False
        self._announced = False
        self._pending_tx: list[Any] = []
        self._ulp = False
        self._ulp_tried = False
        self._rx_decided = False
        self._app_seen = False

    def start(self) -> None:
        if self.engine.is_client:
            self.engine.start()
        self._send_engine_output()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.engine.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._after_input(self.engine.received(nbytes))

    def feed(self, data: bytes) -> None:
        self._after_input(self.engine.feed(data))

    def _after_input(self, app: list[bytes]) -> None:
        engine = self.engine
        was = self._announced
        self._send_engine_output()
        if engine.established and not was and engine.error is None:
            self._announced = True
            self.counters.handshakes += 1
            self._offload_tx()
            self.on_established()
        for data in app:
            self._app_seen = True
            self.on_plaintext(data)
        if engine.error is not None:
            self._fail(str(engine.error))
            return
        if engine.closed:
            self.clean_close = True
            self._fail("the peer closed the TLS session (close_notify)")
            return
        # A client waits for the server's first application data (ICResp): a server may
        # send post-handshake messages (NewSessionTicket) first, and those are easier read
        # here than as control messages from the kernel.
        if self._announced and not self._rx_decided and (self._app_seen or not engine.is_client):
            self._offload_rx()

    def _fail(self, reason: str) -> None:
        transport = self.transport
        if not self._announced:
            self.counters.handshake_failures += 1
        self._announced = True
        self.rx_user = False
        self._rx_decided = True
        self.on_failed(reason)
        if transport is not None and not transport.is_closing():
            transport.close()
        self.transport = None

    def _send_engine_output(self) -> None:
        out = self.engine.take_output()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def write(self, buffers: list[Any]) -> None:
        """Application data out: straight to the socket when the kernel encrypts."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.tx_kernel:
            transport.writelines(buffers)
            return
        if not self._announced:
            self._pending_tx.extend(buffers)
            return
        try:
            transport.writelines(self.engine.protect(buffers))
        except TlsError as exc:
            self._fail(str(exc))

    def close(self) -> None:
        """A close_notify where the record layer is ours, then the socket closes."""
        transport = self.transport
        if transport is not None and self.tx_user and not self.tx_kernel and self._announced:
            self.engine.close()
            self._send_engine_output()

    def _sock(self) -> Any:
        return self.transport.get_extra_info("socket") if self.transport is not None else None

    def _attach(self) -> str:
        if self.ktls != "auto":
            return "kTLS disabled by configuration"
        if self._ulp_tried:
            return "" if self._ulp else self.reason
        self._ulp_tried = True
        sock = self._sock()
        if sock is None:
            return "no socket"
        reason = ktls_attach(sock)
        self._ulp = not reason
        return reason

    def _note_fallback(self, direction: str, reason: str) -> None:
        self.counters.fallback_reasons[reason] = self.counters.fallback_reasons.get(reason, 0) + 1
        if not self.reason:
            self.reason = reason
        log.debug("%s: TLS %s in user space: %s", self.label, direction, reason)

    def _offload_tx(self) -> None:
        engine = self.engine
        tx, _ = engine.traffic()
        reason = self._attach()
        if not reason and self.transport.get_write_buffer_size():
            reason = "handshake records still queued in user space"
        if not reason:
            reason = ktls_set(self._sock(), TLS_TX, tx)
        if reason:
            self.counters.user_tx += 1
            self._note_fallback("transmit", reason)
        else:
            self.tx_kernel = True
            self.tx_user = False
            self.counters.ktls_tx += 1
        assert engine.suite is not None
        log.info(
            "%s: TLS 1.3 established: %s, %s%s, identity %s, records sent by %s",
            self.label,
            engine.suite.name,
            "psk_dhe_ke" if engine.mode == PSK_DHE_KE else "psk_ke",
            f" ({_GROUP_NAMES.get(engine.group or 0, '')})" if engine.group else "",
            (engine.psk.identity.decode(errors="replace").split(" ")[0] if engine.psk else "-")
            + (
                f" ({engine.psk.derivation} derivation)"
                if engine.psk and engine.psk.derivation
                else ""
            ),
            "the kernel (kTLS)" if self.tx_kernel else f"user space ({self.reason})",
        )
        pending, self._pending_tx = self._pending_tx, []
        if pending:
            self.write(pending)

    def _offload_rx(self) -> None:
        if not self.engine.at_record_boundary:
            return  # a record is half read: the kernel must start at a record's first byte
        reason = self._attach()
        if not reason:
            _, rx = self.engine.traffic()
            reason = ktls_set(self._sock(), TLS_RX, rx)
        if reason:
            self.counters.user_rx += 1
            self._note_fallback("receive", reason)
            self.rx_kernel = False
            # Decided: the engine stays the receive record layer for this connection.
            self._rx_decided = True
        else:
            self._rx_decided = True
            self.rx_kernel = True
            self.rx_user = False
            self.counters.ktls_rx += 1
            log.info("%s: TLS receive by the kernel", self.label)

    @property
    def offload(self) -> str:
        """What carries the records: "ktls", "user" or "ktls-tx" (one direction)."""
        if self.tx_kernel and self.rx_kernel:
            return "ktls"
        if self.tx_kernel or self.rx_kernel:
            return "ktls-tx" if self.tx_kernel else "ktls-rx"
        return "user"


_GROUP_NAMES = {GROUP_X25519: "x25519", GROUP_SECP256R1: "secp256r1", GROUP_SECP384R1: "secp384r1"}


def kernel_record_error(exc: BaseException | None) -> bool:
    """A kTLS receive that failed because a record other than application data arrived
    (an alert, a post-handshake message): recv() without room for the record type's
    control message fails with EIO."""
    return isinstance(exc, OSError) and exc.errno == 5
