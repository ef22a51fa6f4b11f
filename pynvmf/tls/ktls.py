"""The kernel's TLS record layer (kTLS): moves one direction of an established engine into
the kernel (``setsockopt(TCP_ULP, "tls")`` and ``SOL_TLS``/``TLS_TX``/``TLS_RX`` with the
traffic key, IV and record sequence number), so that data goes out with the same sends as
on a plain socket. Where the kernel cannot (no ``tls`` module, the cipher not built), the
caller keeps the engine as the record layer, in user space.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from pynvmf.tls.records import RecordCipher
from pynvmf.tls.wire import TLS13

SOL_TLS = 282
TCP_ULP = 31
TLS_TX = 1
TLS_RX = 2
TLS_GET_RECORD_TYPE = 2
_KTLS_MISSING: str | None = None  # why the kernel cannot, once known for the whole process


def crypto_info(cipher: RecordCipher) -> bytes:
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
        sock.setsockopt(SOL_TLS, direction, crypto_info(cipher))
    except OSError as exc:
        return f"the kernel refused the {cipher.suite.name} key ({os.strerror(exc.errno or 0)})"
    return ""
