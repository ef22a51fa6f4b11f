"""NVMe/TCP pre-shared keys: the interchange format, the retained PSK, the TLS PSK and its
identity (NVMe/TCP Transport 1.1 §3.6.1, from TP 8011). Pure computation, no I/O.

- The PSK interchange format ``NVMeTLSkey-1:HH:<base64(key || crc32(key))>:`` is what
  ``nvme gen-tls-key`` writes: HH is the hash that turns the configured PSK into the
  retained PSK (00 none, 01 SHA-256, 02 SHA-384); the key is 32 or 48 bytes; the CRC-32
  (the IEEE polynomial, zlib's) is appended little-endian.
- Retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", hostnqn, L).
- The TLS PSK for an identity is HKDF-Expand-Label(HKDF-Extract(0, retained),
  "nvme-tls-psk", context, L) where the context is the whole identity for the
  ``NVMe0R0x <hostnqn> <subnqn>`` form and ``"0x <digest>"`` for the ``NVMe1R0x ... <digest>``
  form, the digest being base64(HMAC(retained, "<hostnqn> <subnqn> NVMe-over-Fabrics")).

These follow libnvme (``src/nvme/linux.c``), which ``nvme gen-tls-key --insert`` uses to
fill the kernel's ``.nvme`` keyring: the kernel and tlshd take the keyring's payload as the
TLS PSK and its description as the identity, so this module must give the same bytes.

libnvme before 1.14 (nvme-cli 2.13, Debian 13's) encoded the HKDF label differently from
RFC 8446 (the length little-endian, the label and context without their length bytes);
later versions call that the "compat" derivation and still offer it. Keys that tool put in
a keyring were derived that way, so both are here (``compat=True``): a target tries both
(the binder tells which the host used), a host library is told which.

Secure channel concatenation (NVMe Base 2.1 §8.3.4.3) has DH-HMAC-CHAP generate the input
PSK: the TLS PSK is derived from it exactly as the ``NVMe1R0x`` form's is from the retained
PSK (the digest, then HKDF-Expand-Label with ``"<hh> <digest>"``), under the identity
``NVMe1G<hh> <hostnqn> <subnqn> <digest>``, hh the transaction's hash (``generated_tls_psks``;
Linux's nvme_auth_generate_digest, nvme_auth_derive_tls_psk and nvme_tls_psk_refresh). Linux
6.15 to 6.17 built that label without the vectors' length bytes (fixed by "nvme-auth: use
hkdf_expand_label()", September 2025): a target offers that derivation too.

A key's bytes never appear in an exception's message, a repr or a log line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import zlib
from dataclasses import dataclass, field

PREFIX = "NVMeTLSkey-1"
# Hash identifiers, as in the interchange format and the identity (NVMe0R<hh>).
HASH_NONE = 0
HASH_SHA256 = 1
HASH_SHA384 = 2
_HASHES = {HASH_SHA256: hashlib.sha256, HASH_SHA384: hashlib.sha384}
_KEY_LENGTHS = {32: HASH_SHA256, 48: HASH_SHA384}
_DIGEST_SEED = b"NVMe-over-Fabrics"


class PskError(ValueError):
    """A PSK that cannot be used. The message names what is wrong, never the key."""


def hkdf_extract(hash_id: int, salt: bytes, ikm: bytes) -> bytes:
    h = _HASHES[hash_id]
    return hmac.new(salt or bytes(h().digest_size), ikm, h).digest()


def hkdf_expand_label(
    hash_id: int,
    secret: bytes,
    label: str,
    context: bytes,
    length: int,
    *,
    compat: bool = False,
    unprefixed: bool = False,
) -> bytes:
    """RFC 8446 §7.1 HKDF-Expand-Label (the label gets the "tls13 " prefix); `compat`: the
    label as libnvme < 1.14 built it, `unprefixed`: as Linux 6.15-6.17 did (the length big
    endian, label and context without their length bytes; see the module's docstring)."""
    full = b"tls13 " + label.encode()
    if compat:
        info = struct.pack("<H", length) + full + context
    elif unprefixed:
        info = struct.pack("!H", length) + full + context
    else:
        info = struct.pack("!H", length) + bytes([len(full)]) + full + bytes([len(context)])
        info += context
    h = _HASHES[hash_id]
    out = b""
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.new(secret, block + info + bytes([counter]), h).digest()
        out += block
        counter += 1
    return out[:length]


@dataclass(frozen=True)
class ConfiguredPsk:
    """A PSK as configured: its transform hash and key. repr() hides the key."""

    hash_id: int
    key: bytes = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> ConfiguredPsk:
        """Decode the interchange format; a wrong prefix, hash, length or CRC is refused."""
        if not isinstance(text, str):
            raise PskError("a TLS PSK must be a string in the NVMeTLSkey-1 interchange format")
        parts = text.strip().split(":")
        if len(parts) != 4 or parts[0] != PREFIX or parts[3] != "":
            raise PskError("a TLS PSK must look like NVMeTLSkey-1:01:<base64>:")
        if parts[1] not in ("00", "01", "02"):
            raise PskError(f"TLS PSK hash {parts[1]!r} is not 00, 01 or 02")
        hash_id = int(parts[1])
        try:
            raw = base64.b64decode(parts[2], validate=True)
        except (binascii.Error, ValueError):
            raise PskError("the TLS PSK's key is not valid base64") from None
        key, crc = raw[:-4], raw[-4:]
        if len(key) not in _KEY_LENGTHS:
            raise PskError(f"a TLS PSK is 32 or 48 bytes, this one {max(len(key), 0)}")
        if hash_id != HASH_NONE and len(key) != _HASHES[hash_id]().digest_size:
            raise PskError(
                f"a TLS PSK with hash {parts[1]} must be {_HASHES[hash_id]().digest_size} bytes"
            )
        if struct.unpack("<I", crc)[0] != zlib.crc32(key):
            raise PskError("the TLS PSK's CRC-32 does not match its key (mistyped or truncated?)")
        return cls(hash_id, key)

    def encode(self) -> str:
        body = self.key + struct.pack("<I", zlib.crc32(self.key))
        return f"{PREFIX}:{self.hash_id:02d}:{base64.b64encode(body).decode()}:"

    @property
    def cipher_hash(self) -> int:
        """The hash of the cipher suite the PSK goes with (01: TLS_AES_128_GCM_SHA256,
        02: TLS_AES_256_GCM_SHA384): the transform's, or by length without one."""
        return self.hash_id if self.hash_id != HASH_NONE else _KEY_LENGTHS[len(self.key)]

    def retained(self, hostnqn: str, *, compat: bool = False) -> bytes:
        if self.hash_id == HASH_NONE:
            return self.key
        prk = hkdf_extract(self.hash_id, b"", self.key)
        return hkdf_expand_label(
            self.hash_id, prk, "HostNQN", hostnqn.encode(), len(self.key), compat=compat
        )


@dataclass(frozen=True)
class TlsPsk:
    """A TLS PSK with its identity, ready for the handshake. repr() hides the key."""

    identity: bytes
    hash_id: int  # the cipher suite's hash: HASH_SHA256 or HASH_SHA384
    key: bytes = field(repr=False)
    hostnqn: str = ""
    subnqn: str = ""
    # Who derived it otherwise than RFC 8446 says (what logs name), or "".
    derivation: str = ""
    # Generated by secure channel concatenation (identity NVMe1G...), not configured.
    generated: bool = False


def psk_digest(hash_id: int, retained: bytes, hostnqn: str, subnqn: str) -> str:
    mac = hmac.new(retained, f"{hostnqn} {subnqn} ".encode() + _DIGEST_SEED, _HASHES[hash_id])
    return base64.b64encode(mac.digest()).decode()


def tls_psks(
    configured: ConfiguredPsk, hostnqn: str, subnqn: str, *, compat: bool = False
) -> list[TlsPsk]:
    """The TLS PSKs a configured PSK gives for this host and subsystem, in the order of
    preference a host uses (the digest form first, as Linux 6.14+ prefers it; Linux 6.12
    offers only ``NVMe0R0x``)."""
    retained = configured.retained(hostnqn, compat=compat)
    cipher = configured.cipher_hash
    length = len(configured.key)
    digest = psk_digest(cipher, retained, hostnqn, subnqn)
    v1 = f"NVMe1R{cipher:02d} {hostnqn} {subnqn} {digest}"
    v0 = f"NVMe0R{cipher:02d} {hostnqn} {subnqn}"
    prk = hkdf_extract(cipher, b"", retained)
    key1 = _digest_form_key(cipher, prk, digest, length, compat=compat)
    key0 = hkdf_expand_label(cipher, prk, "nvme-tls-psk", v0.encode(), length, compat=compat)
    derivation = "libnvme < 1.14's" if compat else ""
    return [
        TlsPsk(v1.encode(), cipher, key1, hostnqn, subnqn, derivation),
        TlsPsk(v0.encode(), cipher, key0, hostnqn, subnqn, derivation),
    ]


def _digest_form_key(
    cipher: int,
    prk: bytes,
    digest: str,
    length: int,
    *,
    compat: bool = False,
    unprefixed: bool = False,
) -> bytes:
    """The TLS PSK of an identity with a digest (NVMe1R, NVMe1G): its context is "<hh> <digest>"."""
    context = f"{cipher:02d} {digest}".encode()
    return hkdf_expand_label(
        cipher, prk, "nvme-tls-psk", context, length, compat=compat, unprefixed=unprefixed
    )


def generated_tls_psks(hash_id: int, generated: bytes, hostnqn: str, subnqn: str) -> list[TlsPsk]:
    """The TLS PSK a secure channel concatenation generated (`generated`, HMAC(KS, C1 || C2)
    with the transaction's hash `hash_id`: SHA-256 or SHA-384) gives for this host and
    subsystem: as RFC 8446 labels it (Linux 6.18+), then as Linux 6.15-6.17 did. Both have the
    identity ``NVMe1G<hh> <hostnqn> <subnqn> <digest>``; a host uses the first."""
    if hash_id not in _HASHES or len(generated) != _HASHES[hash_id]().digest_size:
        raise PskError(f"a generated PSK is for SHA-256 or SHA-384, not hash {hash_id}")
    digest = psk_digest(hash_id, generated, hostnqn, subnqn)
    identity = f"NVMe1G{hash_id:02d} {hostnqn} {subnqn} {digest}".encode()
    prk = hkdf_extract(hash_id, b"", generated)
    length = len(generated)
    return [
        TlsPsk(
            identity,
            hash_id,
            _digest_form_key(hash_id, prk, digest, length, unprefixed=unprefixed),
            hostnqn,
            subnqn,
            "Linux 6.15-6.17's" if unprefixed else "",
            generated=True,
        )
        for unprefixed in (False, True)
    ]


def tls_psk(
    configured: ConfiguredPsk,
    hostnqn: str,
    subnqn: str,
    version: int = 0,
    *,
    compat: bool = False,
) -> TlsPsk:
    """The TLS PSK with identity version `version` (0: NVMe0R0x, 1: NVMe1R0x ... digest)."""
    v1, v0 = tls_psks(configured, hostnqn, subnqn, compat=compat)
    return v0 if version == 0 else v1


def redact(text: object) -> str:
    """What a log line or an RPC answer shows for a key: its kind, never its bytes."""
    if isinstance(text, str) and text.startswith(PREFIX + ":"):
        return f"{PREFIX}:{text.split(':')[1]}:<redacted>:"
    return "<redacted>"
