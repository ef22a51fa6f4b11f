"""TLS 1.3 record protection (RFC 8446 §5.2): AES-GCM for one direction and one traffic
secret.
"""

from __future__ import annotations

import struct
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from pynvmf.tcp.psk import hkdf_expand_label
from pynvmf.tls.wire import (
    ALERT_BAD_RECORD_MAC,
    ALERT_UNEXPECTED_MESSAGE,
    CT_APPLICATION_DATA,
    LEGACY_VERSION,
    MAX_PLAINTEXT,
    CipherSuite,
    TlsError,
)


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
