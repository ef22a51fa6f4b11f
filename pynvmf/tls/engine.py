"""A sans-I/O TLS 1.3 handshake and record layer for both roles, PSK only (RFC 8446 §2.2
with external PSKs, no certificates, no resumption, no early data): cipher suites
TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384, key exchange modes psk_dhe_ke (x25519,
secp256r1, secp384r1) and psk_ke, nothing but TLS 1.3. Bytes in through
`get_buffer`/`received`, records out through `take_output`; application data out
through `protect`. Built on `cryptography` (AES-GCM, ECDH) and the standard library
(HMAC/HKDF). Why not a TLS library: docs/tls.md.

Secrets (PSKs, traffic secrets, keys) are never logged, never in an exception's message.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519

from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, TlsPsk, hkdf_expand_label, hkdf_extract
from pynvmf.tls.records import RecordCipher
from pynvmf.tls.wire import (
    ALERT_CLOSE_NOTIFY,
    ALERT_DECODE_ERROR,
    ALERT_DECRYPT_ERROR,
    ALERT_HANDSHAKE_FAILURE,
    ALERT_ILLEGAL_PARAMETER,
    ALERT_INTERNAL_ERROR,
    ALERT_MISSING_EXTENSION,
    ALERT_NAMES,
    ALERT_PROTOCOL_VERSION,
    ALERT_RECORD_OVERFLOW,
    ALERT_UNEXPECTED_MESSAGE,
    ALERT_UNKNOWN_PSK_IDENTITY,
    CT_ALERT,
    CT_APPLICATION_DATA,
    CT_CHANGE_CIPHER_SPEC,
    CT_HANDSHAKE,
    EXT_EARLY_DATA,
    EXT_KEY_SHARE,
    EXT_PRE_SHARED_KEY,
    EXT_PSK_KEY_EXCHANGE_MODES,
    EXT_SUPPORTED_GROUPS,
    EXT_SUPPORTED_VERSIONS,
    GROUP_SECP256R1,
    GROUP_SECP384R1,
    GROUP_X25519,
    HRR_RANDOM,
    HT_CLIENT_HELLO,
    HT_ENCRYPTED_EXTENSIONS,
    HT_FINISHED,
    HT_KEY_UPDATE,
    HT_NEW_SESSION_TICKET,
    HT_SERVER_HELLO,
    LEGACY_VERSION,
    MAX_CIPHERTEXT,
    MAX_HANDSHAKE_MESSAGE,
    MAX_IDENTITIES,
    MAX_PLAINTEXT,
    PSK_DHE_KE,
    PSK_KE,
    SUITE_FOR_HASH,
    TLS13,
    CipherSuite,
    Reader,
    TlsError,
    extension,
    handshake_message,
    parse_extensions,
    vector,
)


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


# The PSKs an identity may stand for (more than one when derivations differ: the binder
# tells which the peer used); empty when the identity is unknown.
PskLookup = Callable[[bytes], "list[TlsPsk]"]


@dataclass
class TlsStats:
    records_in: int = 0
    records_out: int = 0
    post_handshake_messages: int = 0


class HandshakeState(Enum):
    """Where an engine's handshake is: the message it waits for (RFC 8446 §A.1, §A.2)."""

    START = "start"  # a client that has not sent its ClientHello
    WAIT_CH = "wait_ch"  # a server, for the ClientHello
    WAIT_SH = "wait_sh"
    WAIT_EE = "wait_ee"
    WAIT_FIN = "wait_fin"
    ESTABLISHED = "established"


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
        self._state = HandshakeState.START if is_client else HandshakeState.WAIT_CH
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

    @property
    def established(self) -> bool:
        """The handshake is done: application data may flow."""
        return self._state is HandshakeState.ESTABLISHED

    def __repr__(self) -> str:
        suite = self.suite.name if self.suite else "-"
        return (
            f"TlsEngine({'client' if self.is_client else 'server'}, {self._state.value}, {suite})"
        )

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
        elif state is HandshakeState.WAIT_CH and msg_type == HT_CLIENT_HELLO:
            self._on_client_hello(msg)
        elif state is HandshakeState.WAIT_SH and msg_type == HT_SERVER_HELLO:
            self._on_server_hello(msg)
        elif state is HandshakeState.WAIT_EE and msg_type == HT_ENCRYPTED_EXTENSIONS:
            r = Reader(msg[4:])
            parse_extensions(r)
            r.end()
            self._hash_add(msg)
            self._state = HandshakeState.WAIT_FIN
        elif state is HandshakeState.WAIT_FIN and msg_type == HT_FINISHED:
            self._on_finished(msg)
        else:
            raise TlsError(
                ALERT_UNEXPECTED_MESSAGE, f"handshake message {msg_type} in state {state.value}"
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
        assert self.is_client and self._psk is not None and self._state is HandshakeState.START
        psk = self._psk
        suite = SUITE_FOR_HASH[psk.hash_id]
        self.suite = suite
        self._transcript = suite.hash()
        exts = extension(EXT_SUPPORTED_VERSIONS, vector(1, struct.pack("!H", TLS13)))
        exts += extension(
            EXT_SUPPORTED_GROUPS, vector(2, b"".join(struct.pack("!H", g) for g in self.groups))
        )
        if PSK_DHE_KE in self.modes:
            share = _KeyShare(self.groups[0])
            self._shares[share.group] = share
            entry = struct.pack("!H", share.group) + vector(2, share.public)
            exts += extension(EXT_KEY_SHARE, vector(2, entry))
        exts += extension(EXT_PSK_KEY_EXCHANGE_MODES, vector(1, bytes(self.modes)))
        identities = vector(2, vector(2, psk.identity) + struct.pack("!I", 0))
        binders_len = 2 + 1 + suite.hash_len
        psk_ext_len = len(identities) + binders_len
        exts += struct.pack("!HH", EXT_PRE_SHARED_KEY, psk_ext_len) + identities
        body = (
            struct.pack("!H", LEGACY_VERSION)
            + os.urandom(32)
            + vector(1, b"")
            + vector(2, b"".join(struct.pack("!H", c) for c in (self.offer or (suite.code,))))
            + vector(1, b"\x00")
        )
        total_exts = len(exts) + binders_len
        body += struct.pack("!H", total_exts) + exts
        msg_len = len(body) + binders_len
        truncated = bytes([HT_CLIENT_HELLO]) + msg_len.to_bytes(3, "big") + body
        binder = self._binder(psk, suite, truncated)
        msg = truncated + vector(2, vector(1, binder))
        self._hash_add(msg)
        # The first ClientHello's record may say TLS 1.0 for old middleboxes; 1.2 is fine.
        self._out.append(struct.pack("!BHH", CT_HANDSHAKE, 0x0301, len(msg)) + msg)
        self._state = HandshakeState.WAIT_SH

    def _on_server_hello(self, msg: bytes) -> None:
        assert self.suite is not None and self._psk is not None
        r = Reader(msg[4:])
        if r.u16() != LEGACY_VERSION:
            raise TlsError(ALERT_PROTOCOL_VERSION, "the server does not speak TLS 1.3")
        random = r.take(32)
        if random == HRR_RANDOM:
            raise TlsError(
                ALERT_HANDSHAKE_FAILURE,
                "the server asked for another key share (HelloRetryRequest): not supported",
            )
        r.vec(1)
        code = r.u16()
        if r.u8() != 0:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "a compression method")
        exts, _ = parse_extensions(r)
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
            ks = Reader(exts[EXT_KEY_SHARE])
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
        self._state = HandshakeState.WAIT_EE

    def _on_finished(self, msg: bytes) -> None:
        assert self.suite is not None
        r = Reader(msg[4:])
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
            self._send_handshake(handshake_message(HT_FINISHED, fin))
            self._tx = RecordCipher(self.suite, self._c_ap)
            self._rx = RecordCipher(self.suite, self._s_ap)
        else:
            self._rx = RecordCipher(self.suite, self._c_ap)
        self._done()

    def _done(self) -> None:
        self._state = HandshakeState.ESTABLISHED
        # Nothing secret outlives the handshake but the two traffic ciphers.
        self._early = self._hs_secret = self._master = b""
        self._c_hs = self._s_hs = self._c_ap = self._s_ap = b""
        self._hs_buf = bytearray()

    # -- server ----------------------------------------------------------------------------

    def _on_client_hello(self, msg: bytes) -> None:
        assert self._lookup is not None
        r = Reader(msg[4:])
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
        exts, order = parse_extensions(r)
        r.end()
        versions = Reader(exts.get(EXT_SUPPORTED_VERSIONS, b"\x00"))
        vlist = versions.vec(1)
        if struct.pack("!H", TLS13) not in [vlist[i : i + 2] for i in range(0, len(vlist), 2)]:
            raise TlsError(ALERT_PROTOCOL_VERSION, "the client does not offer TLS 1.3")
        if EXT_PRE_SHARED_KEY not in exts:
            raise TlsError(ALERT_MISSING_EXTENSION, "the client offers no pre-shared key")
        if order[-1] != EXT_PRE_SHARED_KEY:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "pre_shared_key is not the last extension")
        if EXT_EARLY_DATA in exts:
            raise TlsError(ALERT_ILLEGAL_PARAMETER, "early data with an external PSK")
        mr = Reader(exts.get(EXT_PSK_KEY_EXCHANGE_MODES, b""))
        client_modes = set(mr.vec(1)) if exts.get(EXT_PSK_KEY_EXCHANGE_MODES) else set()
        if not client_modes:
            raise TlsError(ALERT_MISSING_EXTENSION, "no psk_key_exchange_modes")
        # The offered PSKs, and where the binders start (the truncated ClientHello ends there).
        pr = Reader(exts[EXT_PRE_SHARED_KEY])
        ids = Reader(pr.vec(2))
        identities: list[bytes] = []
        while not ids.done():
            identities.append(ids.vec(2))
            ids.u32()
        binders_at = len(pr.data) - pr.pos
        br = Reader(pr.vec(2))
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
            kr = Reader(exts[EXT_KEY_SHARE])
            block = Reader(kr.vec(2))
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
        sh_exts = extension(EXT_SUPPORTED_VERSIONS, struct.pack("!H", TLS13))
        if server_share is not None:
            sh_exts += extension(
                EXT_KEY_SHARE,
                struct.pack("!H", server_share.group) + vector(2, server_share.public),
            )
        sh_exts += extension(EXT_PRE_SHARED_KEY, struct.pack("!H", index))
        body = (
            struct.pack("!H", LEGACY_VERSION)
            + os.urandom(32)
            + vector(1, session_id)
            + struct.pack("!HB", suite.code, 0)
            + vector(2, sh_exts)
        )
        self._send_handshake(handshake_message(HT_SERVER_HELLO, body))
        self._key_schedule_handshake(psk.key, dhe)
        self._tx = RecordCipher(suite, self._s_hs)
        self._rx = RecordCipher(suite, self._c_hs)
        self._send_handshake(handshake_message(HT_ENCRYPTED_EXTENSIONS, vector(2, b"")))
        fin = self._finished(self._s_hs, self._transcript_hash())
        self._send_handshake(handshake_message(HT_FINISHED, fin))
        self._key_schedule_application()
        self._tx = RecordCipher(suite, self._s_ap)
        self._state = HandshakeState.WAIT_FIN
