"""NVMe/TCP TLS PSKs (pynvmf.tcp.psk) against what nvme-cli 2.13 / libnvme 1.13 (Debian 13,
the Linux 6.12 guest's) wrote.

The vectors were recorded in that guest: ``nvme gen-tls-key --secret <hex> --hmac N
--hostnqn H --subsysnqn S [--identity 1] --insert`` printed the interchange form and put
the key in the ``.nvme`` keyring under the identity /proc/keys shows. The NVMe1R0x
identity's digest depends on the retained PSK, so matching it checks the retained-key
derivation; tests/interop/test_linux_tls.py checks the TLS PSKs themselves by handshakes
with the kernel's peers.
"""

from __future__ import annotations

import base64

import pytest

from pynvmf.tcp.psk import (
    HASH_NONE,
    HASH_SHA256,
    HASH_SHA384,
    ConfiguredPsk,
    PskError,
    redact,
    tls_psk,
    tls_psks,
)

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000005e1"
KEY32 = bytes(range(32))
KEY48 = bytes(range(48))
# nvme gen-tls-key --secret 000102...1f --hmac 1
TEXT32 = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
# nvme gen-tls-key --secret 000102...2f --hmac 2
TEXT48 = "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:"
# The identities /proc/keys showed after --identity 1 --insert (libnvme 1.13's derivation,
# which later libnvme versions call "compat").
IDENTITY_V1 = {
    ("nqn.2014-08.org.pynvmf:tls-vec", TEXT32): "aEQtRhMHf1KchWOlwS9xtjL89R5h9vr9FQDRpgvn3s0=",
    ("nqn.2014-08.org.pynvmf:tls-vec3", TEXT32): "dL8/HvOOOroit7ITgf8L6Ize13DdUlORrs0Zhd1Rm7s=",
    (
        "nqn.2014-08.org.pynvmf:tls-vec2",
        TEXT48,
    ): "FjJ4V5LMkTJQnqWiJC8GX7ubKdshgpya5NVEg/mIIXxsGXuHhy+JhYG/ymt6NY+z",
}


def test_interchange_format_matches_nvme_gen_tls_key() -> None:
    assert ConfiguredPsk(HASH_SHA256, KEY32).encode() == TEXT32
    assert ConfiguredPsk(HASH_SHA384, KEY48).encode() == TEXT48
    assert ConfiguredPsk.parse(TEXT32) == ConfiguredPsk(HASH_SHA256, KEY32)
    assert ConfiguredPsk.parse(TEXT48 + "\n") == ConfiguredPsk(HASH_SHA384, KEY48)
    # No transform: the configured key is the retained key; its length picks the hash.
    plain = ConfiguredPsk(HASH_NONE, KEY48)
    assert ConfiguredPsk.parse(plain.encode()) == plain
    assert plain.cipher_hash == HASH_SHA384
    assert plain.retained(HOSTNQN) == KEY48


@pytest.mark.parametrize(("subnqn", "text"), list(IDENTITY_V1))
def test_identities_match_nvme_cli_2_13(subnqn: str, text: str) -> None:
    configured = ConfiguredPsk.parse(text)
    h = configured.cipher_hash
    v1 = tls_psk(configured, HOSTNQN, subnqn, 1, compat=True)
    assert v1.identity.decode() == f"NVMe1R0{h} {HOSTNQN} {subnqn} {IDENTITY_V1[subnqn, text]}"
    v0 = tls_psk(configured, HOSTNQN, subnqn, 0, compat=True)
    assert v0.identity.decode() == f"NVMe0R0{h} {HOSTNQN} {subnqn}"
    assert len(v0.key) == len(v1.key) == len(configured.key)
    # The RFC 8446 label encoding gives other keys (libnvme >= 1.14's default).
    spec = tls_psk(configured, HOSTNQN, subnqn, 1)
    assert spec.identity != v1.identity and spec.key != v1.key


def test_the_two_identity_versions_and_hosts_give_different_keys() -> None:
    configured = ConfiguredPsk.parse(TEXT32)
    a = tls_psks(configured, HOSTNQN, "nqn.2014-08.org.pynvmf:a")
    b = tls_psks(configured, HOSTNQN, "nqn.2014-08.org.pynvmf:b")
    other_host = tls_psks(configured, HOSTNQN[:-1] + "2", "nqn.2014-08.org.pynvmf:a")
    keys = {p.key for p in a + b + other_host}
    assert len(keys) == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # nvme check-tls-key refuses this one with "CRC mismatch".
        ("NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8AAAAA:", "CRC-32"),
        ("NVMeTLSkey-2:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:", "look like"),
        ("NVMeTLSkey-1:03:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:", "hash"),
        ("NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR", "look like"),
        ("NVMeTLSkey-1:01:not base64!:", "base64"),
        ("NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:", "must be 48"),
        ("NVMeTLSkey-1:01:" + base64.b64encode(bytes(20)).decode() + ":", "32 or 48"),
    ],
)
def test_bad_keys_are_refused_without_showing_the_key(text: str, message: str) -> None:
    with pytest.raises(PskError) as info:
        ConfiguredPsk.parse(text)
    said = str(info.value)
    assert message in said
    body = text.split(":")[2] if text.count(":") >= 2 else text
    assert body not in said and KEY32.hex() not in said


def test_keys_stay_out_of_reprs() -> None:
    configured = ConfiguredPsk.parse(TEXT32)
    psk = tls_psk(configured, HOSTNQN, "nqn.2014-08.org.pynvmf:a")
    for text in (repr(configured), repr(psk), redact(TEXT32)):
        assert "AAECAwQF" not in text and KEY32.hex() not in text and psk.key.hex() not in text
    assert redact(TEXT32) == "NVMeTLSkey-1:01:<redacted>:"
