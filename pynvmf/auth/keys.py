"""DH-HMAC-CHAP secrets in the representation `nvme gen-dhchap-key` writes.

``DHHC-1:<tt>:<base64(secret || CRC-32 of the secret, little endian)>:`` where ``tt`` is
the hash that transforms the secret with an NQN before use (00 none, 01 SHA-256, 02
SHA-384, 03 SHA-512) and the secret is 32, 48 or 64 bytes (with a transform, exactly the
hash's length, as Linux requires). The CRC catches a secret copied wrongly.

A `DhchapKey` never shows its secret: its repr and str are redacted, and every error
message names the problem, never the text it was given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import struct
import zlib
from dataclasses import dataclass, field

from pynvmf.spec.auth import HashId

PREFIX = "DHHC-1:"
SECRET_LENGTHS = (32, 48, 64)
_TRANSFORM_LABEL = b"NVMe-over-Fabrics"
_CRC = struct.Struct("<I")


class KeyFormatError(ValueError):
    """A secret that is not a valid DHHC-1 representation (the message never holds it)."""


@dataclass(frozen=True, slots=True)
class DhchapKey:
    secret: bytes = field(repr=False)
    # The hash that transforms the secret with an NQN (None: used as it is).
    transform: HashId | None = None

    def __post_init__(self) -> None:
        if len(self.secret) not in SECRET_LENGTHS:
            raise KeyFormatError(
                f"a DH-HMAC-CHAP secret is 32, 48 or 64 bytes, not {len(self.secret)}"
            )
        if self.transform is not None and len(self.secret) != self.transform.length:
            raise KeyFormatError(
                f"a secret transformed with {self.transform.hashlib_name} is "
                f"{self.transform.length} bytes, not {len(self.secret)}"
            )

    @classmethod
    def parse(cls, text: str) -> DhchapKey:
        """A key from its representation; KeyFormatError (naming the fault only) if bad."""
        text = text.strip()
        if not text.startswith(PREFIX):
            raise KeyFormatError("a DH-HMAC-CHAP secret starts with DHHC-1:")
        rest = text[len(PREFIX) :]
        parts = rest.split(":")
        # DHHC-1:tt:base64: (the trailing colon is optional, as Linux accepts it)
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2]) or len(parts[0]) != 2:
            raise KeyFormatError("a DH-HMAC-CHAP secret reads DHHC-1:<hash 00-03>:<base64>:")
        try:
            transform_id = int(parts[0], 10)
        except ValueError:
            raise KeyFormatError("the hash of a DHHC-1 secret is 00, 01, 02 or 03") from None
        if not 0 <= transform_id <= 3:
            raise KeyFormatError(f"the hash of a DHHC-1 secret is 00-03, not {transform_id:02d}")
        try:
            raw = base64.b64decode(parts[1], validate=True)
        except (binascii.Error, ValueError):
            raise KeyFormatError("the DHHC-1 secret is not valid base64") from None
        if len(raw) - 4 not in SECRET_LENGTHS:
            raise KeyFormatError(
                f"the DHHC-1 secret holds {max(0, len(raw) - 4)} bytes, not 32, 48 or 64"
            )
        secret, crc = raw[:-4], _CRC.unpack(raw[-4:])[0]
        if zlib.crc32(secret) != crc:
            raise KeyFormatError("the DHHC-1 secret's CRC does not match: it was copied wrongly")
        return cls(secret, HashId(transform_id) if transform_id else None)

    @classmethod
    def generate(cls, length: int = 32, transform: HashId | None = None) -> DhchapKey:
        """A new random secret (as `nvme gen-dhchap-key` without --secret)."""
        return cls(secrets.token_bytes(length), transform)

    def representation(self) -> str:
        """The DHHC-1 text: the secret itself. Only for writing a key file the user asked
        for; never for logs or configuration exports."""
        tt = int(self.transform) if self.transform is not None else 0
        body = base64.b64encode(self.secret + _CRC.pack(zlib.crc32(self.secret))).decode()
        return f"{PREFIX}{tt:02d}:{body}:"

    def transformed(self, nqn: str) -> bytes:
        """The key the responses are computed with: HMAC(secret, NQN || "NVMe-over-Fabrics")
        with the transform hash, or the secret itself (NVMe Base 2.0 §8.13.5.7)."""
        if self.transform is None:
            return self.secret
        mac = hmac.new(self.secret, nqn.encode(), self.transform.hashlib_name)
        mac.update(_TRANSFORM_LABEL)
        return mac.digest()

    def fingerprint(self) -> str:
        """A short non-secret identifier, for telling keys apart in logs and outputs."""
        return hashlib.sha256(b"pynvmf key id\0" + self.secret).hexdigest()[:12]

    def __str__(self) -> str:
        return f"DHHC-1:<redacted {self.fingerprint()}>"


def load_key_file(path: str) -> DhchapKey:
    """A key from a file holding its representation (SPDK's keyring_file_add_key): the
    file must not be readable by group or others, as SPDK requires."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise KeyFormatError(f"cannot read key file {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise KeyFormatError(
            f"key file {path} is accessible by group or others (mode {st.st_mode & 0o777:o}); "
            "it must be 0600"
        )
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFormatError(f"cannot read key file {path}: {e}") from None
    try:
        return DhchapKey.parse(text)
    except KeyFormatError as e:
        raise KeyFormatError(f"key file {path}: {e}") from None
