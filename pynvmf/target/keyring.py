"""The target's keys: DH-HMAC-CHAP secrets and TLS PSKs read from key files or given
as text (the keyring holds them by name, as SPDK's does), and which PSK answers the
identity a host offers in a TLS handshake."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.auth.keys import DhchapKey, KeyFormatError, load_key_file
from pynvmf.target.changes import ChangeError
from pynvmf.tcp.psk import ConfiguredPsk, PskError, TlsPsk, tls_psks

if TYPE_CHECKING:
    from pynvmf.target.generated_psks import GeneratedPsks
    from pynvmf.target.port import Port
    from pynvmf.target.subsystem import Subsystem


@dataclass(frozen=True)
class KeyringEntry:
    """A named secret and the file it came from; outputs show the name and path only."""

    name: str
    path: str
    key: DhchapKey | ConfiguredPsk = field(repr=False)


def read_key_file(path: str) -> DhchapKey | ConfiguredPsk:
    """A DH-HMAC-CHAP secret or a TLS PSK (NVMeTLSkey-1) from a key file (mode 0600)."""
    if _holds_tls_psk(path):
        return read_psk_file(path)
    try:
        return load_key_file(path)
    except KeyFormatError as e:
        raise ChangeError("path", str(e)) from None


def parse_key(text: str) -> DhchapKey | ConfiguredPsk:
    """A DH-HMAC-CHAP secret (DHHC-1) or a TLS PSK (NVMeTLSkey-1) given as text."""
    if not isinstance(text, str):
        raise ChangeError("key", "a DHHC-1 secret or an NVMeTLSkey-1 PSK, as text")
    try:
        if text.lstrip().startswith("NVMeTLSkey-"):
            return ConfiguredPsk.parse(text)
        return DhchapKey.parse(text)
    except (PskError, KeyFormatError) as e:
        raise ChangeError("key", str(e)) from None


def _holds_tls_psk(path: str) -> bool:
    """Whether a key file holds a TLS PSK (else a DH-HMAC-CHAP secret, or an error)."""
    try:
        with open(path, "rb") as f:
            return f.read(16).lstrip().startswith(b"NVMeTLSkey-")
    except OSError:
        return False


def read_psk_file(path: str) -> ConfiguredPsk:
    """A TLS PSK from a file in the interchange format; the file must not be readable by
    group or others (SPDK's rule for key files). Errors never show the key."""
    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise ChangeError(
                "path", f"key file {path} is accessible by group or others (it must be 0600)"
            )
        with open(path, encoding="ascii") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError) as exc:
        raise ChangeError("path", f"cannot read key file {path}: {exc}") from None
    try:
        return ConfiguredPsk.parse(text)
    except PskError as exc:
        raise ChangeError("path", f"key file {path}: {exc}") from None


def psk_lookup(
    subsystems: Mapping[str, Subsystem], generated: GeneratedPsks, port: Port
) -> Callable[[bytes], list[TlsPsk]]:
    """The PSK for a TLS identity a host offers on `port`: the identity names the host
    and the subsystem (NVMe0R0x <hostnqn> <subnqn>, NVMe1R0x ... <digest>, and NVMe1G0x
    ... <digest> for a PSK secure channel concatenation generated)."""

    def lookup(identity: bytes) -> list[TlsPsk]:
        try:
            words = identity.decode("ascii").split(" ")
        except UnicodeDecodeError:
            return []
        if len(words) not in (3, 4) or not words[0].startswith("NVMe"):
            return []
        hostnqn, subnqn = words[1], words[2]
        subsystem = subsystems.get(subnqn)
        if subsystem is None or not port.exposes(subnqn):
            return []
        if words[0][5:6] == "G":
            if not subsystem.host_allowed(hostnqn) or hostnqn not in subsystem.host_auth:
                return []
            return generated.find(identity)
        configured = subsystem.host_psks.get(hostnqn)
        if configured is None or not subsystem.host_allowed(hostnqn):
            return []
        # The RFC 8446 derivation, and libnvme < 1.14's (nvme-cli 2.13 put keys so
        # derived in Debian 13's keyrings): the binder tells which the host used.
        return [
            psk
            for compat in (False, True)
            for psk in tls_psks(configured, hostnqn, subnqn, compat=compat)
            if psk.identity == identity
        ]

    return lookup
