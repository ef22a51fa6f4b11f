"""DH-HMAC-CHAP pieces against outside references: secrets as `nvme gen-dhchap-key`
(nvme-cli 2.13 / libnvme 1.13, run in the Linux 6.12 guest) wrote them, RFC 7919's groups
as OpenSSL names them, and the message layouts of NVMe Base 2.0 §8.13 (sizes as
Linux's include/linux/nvme.h has them). Then the two state machines against each other,
for every hash and group, and their answers to bad messages."""

from __future__ import annotations

import subprocess
import warnings

import pytest

from pynvmf.auth import ControllerAuth, DhchapKey, HostAuth, HostAuthConfig, KeyFormatError
from pynvmf.auth.controller import State
from pynvmf.auth.crypto import DhExchange, augmented_challenge, ffdhe_prime
from pynvmf.auth.host import AuthenticationFailed
from pynvmf.spec import auth as A
from pynvmf.spec.auth import DhGroupId, FailureExplanation, HashId

NQN = "nqn.2014-08.org.nvmexpress:uuid:d8e3f2a0-1b2c-4d5e-8f90-a1b2c3d4e5f6"
SUBNQN = "nqn.2024-11.dev.pynvmf:auth-unit"
SECRETS = {
    32: bytes.fromhex("00112233445566778899aabbccddeeff" * 2),
    48: bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0" * 3),
    64: bytes.fromhex("ffeeddccbbaa99887766554433221100" * 4),
}
# `nvme gen-dhchap-key --secret=HEX --key-length=L --hmac=H --nqn=NQN` in the 6.12 guest.
GEN_DHCHAP_KEY = {
    (0, 32): "DHHC-1:00:ABEiM0RVZneImaq7zN3u/wARIjNEVWZ3iJmqu8zd7v8qDMNU:",
    (0, 48): "DHHC-1:00:Dx4tPEtaaXiHlqW0w9Lh8A8eLTxLWml4h5altMPS4fAPHi08S1ppeIeWpbTD0uHwlFca/g==:",
    (0, 64): "DHHC-1:00:/+7dzLuqmYh3ZlVEMyIRAP/u3cy7qpmId2ZVRDMiEQD/7t3Mu6qZiHdmVUQzIhEA/+7dzLuqmY"
    "h3ZlVEMyIRADkHGEk=:",
    (1, 32): "DHHC-1:01:UFGfFS7vhSnygaQ1On6J46OS1fGTO66Tk3enll1bNW5uJoT8:",
    (2, 48): "DHHC-1:02:9/hAbRSeVqG1K4iSJYl4dgpNVrFm6G3BmA6+7oAhiPwOQFwh13DumWRGZbrD3YcKAuInCg==:",
    (3, 64): "DHHC-1:03:sfETOJqPEOjrLB6l8dFj3Pr7RQ8tHiU8YfcCw3/6jgDqGzNV7PryibBy41zpwrE+wnUAoHtQCBx"
    "prcs0jkViJBuzdao=:",
}
# A random key from the same nvme gen-dhchap-key (no --secret).
GENERATED = "DHHC-1:00:jyVC8j7TDwSN8ibNhGK6ayppOwg1+dsw26w75bzBuWU64f5B:"


@pytest.mark.parametrize(("hmac_id", "length"), sorted(GEN_DHCHAP_KEY))
def test_gen_dhchap_key_output_parses_and_round_trips(hmac_id: int, length: int) -> None:
    text = GEN_DHCHAP_KEY[hmac_id, length]
    key = DhchapKey.parse(text)
    assert key.representation() == text
    transform = HashId(hmac_id) if hmac_id else None
    assert key.transform == transform
    if transform is None:
        assert key.secret == SECRETS[length]
    else:
        # nvme-cli writes the secret transformed with the NQN (libnvme's
        # nvme_gen_dhchap_key): that is our transformation of the raw secret.
        assert key.secret == DhchapKey(SECRETS[length], transform).transformed(NQN)


def test_random_gen_dhchap_key_parses() -> None:
    key = DhchapKey.parse(GENERATED)
    assert len(key.secret) == 32 and key.transform is None
    assert DhchapKey.parse(GENERATED.rstrip(":")) == key  # Linux accepts no trailing colon


def test_bad_crc_is_refused_without_showing_the_key() -> None:
    body = GENERATED.split(":")[2]
    # Flip one base64 character of the secret: the CRC no longer matches.
    bad = f"DHHC-1:00:{'A' if body[0] != 'A' else 'B'}{body[1:]}:"
    with pytest.raises(KeyFormatError, match="CRC") as info:
        DhchapKey.parse(bad)
    assert body[1:20] not in str(info.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("DHHC-2:00:AAAA:", "starts with"),
        ("DHHC-1:04:" + GENERATED.split(":")[2] + ":", "00-03"),
        ("DHHC-1:00:not base64!:", "base64"),
        ("DHHC-1:00:AAAAAAAA:", "not 32, 48 or 64"),
        ("DHHC-1:02:" + GENERATED.split(":")[2] + ":", "sha384 is 48 bytes"),
    ],
)
def test_malformed_secrets_are_refused(text: str, match: str) -> None:
    with pytest.raises(KeyFormatError, match=match) as info:
        DhchapKey.parse(text)
    assert GENERATED.split(":")[2][:16] not in str(info.value)


def test_key_repr_and_str_never_show_the_secret() -> None:
    key = DhchapKey.parse(GENERATED)
    body = GENERATED.split(":")[2]
    for shown in (repr(key), str(key), f"{key}", repr([key])):
        assert body[:12] not in shown and key.secret.hex()[:12] not in shown


def test_ffdhe_primes_are_rfc_7919s_as_openssl_names_them() -> None:
    from cryptography.hazmat.primitives import serialization

    for group in list(DhGroupId)[1:]:
        bits = group.prime_bits
        pem = subprocess.run(
            [
                "openssl",
                "genpkey",
                "-genparam",
                "-algorithm",
                "DH",
                "-pkeyopt",
                f"group:ffdhe{bits}",
            ],
            capture_output=True,
            check=True,
        ).stdout
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            numbers = serialization.load_pem_parameters(pem).parameter_numbers()
        assert numbers.p == ffdhe_prime(bits) and numbers.g == 2
        assert ffdhe_prime(bits).bit_length() == bits
    # RFC 7919 §A.1 prints ffdhe2048 from FFFFFFFF FFFFFFFF ADF85458 A2BB4A9A to
    # ... 886B4238 61285C97 FFFFFFFF FFFFFFFF.
    p = ffdhe_prime(2048).to_bytes(256, "big")
    assert p[:16].hex() == "ffffffffffffffffadf85458a2bb4a9a"
    assert p[-16:].hex() == "886b423861285c97ffffffffffffffff"


def test_dh_exchange_agrees_and_refuses_degenerate_values() -> None:
    a, b = DhExchange(DhGroupId.FFDHE2048), DhExchange(DhGroupId.FFDHE2048)
    assert len(a.public) == 256
    assert a.shared(b.public) == b.shared(a.public)
    p = ffdhe_prime(2048)
    for bad in (b"\x01", (p - 1).to_bytes(256, "big"), bytes(257)):
        with pytest.raises(ValueError):
            a.shared(bad)


def test_augmented_challenge_is_hmac_of_the_hashed_session_key() -> None:
    import hashlib
    import hmac

    key, c = b"\x05" * 256, b"\x07" * 32
    expected = hmac.new(hashlib.sha256(key).digest(), c, "sha256").digest()
    assert augmented_challenge(HashId.SHA256, key, c) == expected


def test_message_sizes_match_the_specification() -> None:
    neg = A.Negotiate(5, (1, 2, 3), (0, 1, 2, 3, 4, 5)).pack()
    assert len(neg) == 8 + 64  # header and one protocol descriptor (Linux: tl 72)
    assert neg[:8] == bytes([0, 0, 0, 0, 5, 0, 0, 1])
    assert neg[8:12] == bytes([1, 0, 3, 6]) and neg[42:48] == bytes(range(6))
    challenge = A.Challenge(5, 1, 1, 0x01020304, b"c" * 32, b"d" * 256).pack()
    # HL, reserved, HASHID, DHGID at bytes 6..9, DHVLEN at 10, SEQNUM at 12, C1 at 16.
    assert len(challenge) == 16 + 32 + 256
    assert challenge[6:10] == bytes([32, 0, 1, 1])
    assert challenge[10:12] == (256).to_bytes(2, "little")
    assert challenge[12:16] == (0x01020304).to_bytes(4, "little")
    assert challenge[16:48] == b"c" * 32
    reply = A.Reply(5, b"r" * 48, 9, b"c" * 48).pack()
    assert len(reply) == 16 + 96 and reply[8] == 1  # CVALID
    assert len(A.Success1(5, 32, b"x" * 32).pack()) == 16 + 32
    assert len(A.Success2(5).pack()) == 16
    failure = A.Failure(A.MessageId.FAILURE1, 5, FailureExplanation.HASH_UNUSABLE).pack()
    assert failure == bytes([0, 0xF1, 0, 0, 5, 0, 1, 4])
    for msg in (neg, challenge, reply, failure):
        assert A.parse_message(msg).pack() == msg


# -- the state machines ------------------------------------------------------------------


def _pair(
    config: HostAuthConfig, host_key: DhchapKey, ctrl_key: DhchapKey | None = None, **kw: object
) -> tuple[ControllerAuth, HostAuth]:
    ctrl = ControllerAuth(lambda: config, NQN, SUBNQN, 0)
    host = HostAuth(host_key, NQN, SUBNQN, ctrl_key=ctrl_key, **kw)  # type: ignore[arg-type]
    return ctrl, host


def _run(ctrl: ControllerAuth, host: HostAuth) -> None:
    ctrl.send(host.negotiate())
    ctrl.send(host.reply(ctrl.receive()))
    success2 = host.success1(ctrl.receive())
    if success2 is not None:
        ctrl.send(success2)


HOST_KEY = DhchapKey.parse(GEN_DHCHAP_KEY[1, 32])
CTRL_KEY = DhchapKey.parse(GEN_DHCHAP_KEY[3, 64])


@pytest.mark.parametrize("hash_id", list(HashId))
@pytest.mark.parametrize("group", list(DhGroupId))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_every_hash_and_group_authenticates(
    hash_id: HashId, group: DhGroupId, bidirectional: bool
) -> None:
    config = HostAuthConfig(HOST_KEY, CTRL_KEY, (hash_id,), (group,))
    ctrl, host = _pair(config, HOST_KEY, CTRL_KEY if bidirectional else None)
    _run(ctrl, host)
    assert ctrl.authenticated and ctrl.state == State.IDLE and not ctrl.closing
    assert (host.hash_id, host.dhgroup) == (hash_id, group)


def _failure1(ctrl: ControllerAuth) -> int:
    msg = A.parse_message(ctrl.receive())
    assert isinstance(msg, A.Failure) and msg.message == A.MessageId.FAILURE1
    assert ctrl.closing and not ctrl.authenticated
    return msg.explanation


CONFIG = HostAuthConfig(HOST_KEY, CTRL_KEY)


def test_wrong_host_key_fails_with_failed() -> None:
    ctrl, host = _pair(CONFIG, DhchapKey.parse(GENERATED))
    ctrl.send(host.negotiate())
    ctrl.send(host.reply(ctrl.receive()))
    assert _failure1(ctrl) == FailureExplanation.FAILED


def test_wrong_controller_key_makes_the_host_send_failure2() -> None:
    ctrl, host = _pair(CONFIG, HOST_KEY, DhchapKey.parse(GENERATED))
    ctrl.send(host.negotiate())
    ctrl.send(host.reply(ctrl.receive()))
    with pytest.raises(AuthenticationFailed) as info:
        host.success1(ctrl.receive())
    assert info.value.explanation == FailureExplanation.FAILED and info.value.failure2
    ctrl.send(info.value.failure2)
    assert ctrl.closing and not ctrl.authenticated


@pytest.mark.parametrize(
    ("config", "host_kw", "explanation"),
    [
        (
            HostAuthConfig(HOST_KEY, hashes=(HashId.SHA512,)),
            {"hashes": (HashId.SHA256,)},
            FailureExplanation.HASH_UNUSABLE,
        ),
        (
            HostAuthConfig(HOST_KEY, dhgroups=(DhGroupId.FFDHE4096,)),
            {"dhgroups": (DhGroupId.NULL, DhGroupId.FFDHE2048)},
            FailureExplanation.DHGROUP_UNUSABLE,
        ),
    ],
    ids=["hash", "dhgroup"],
)
def test_nothing_usable_offered(config: HostAuthConfig, host_kw: dict, explanation: int) -> None:
    ctrl, host = _pair(config, HOST_KEY, **host_kw)
    ctrl.send(host.negotiate())
    assert _failure1(ctrl) == explanation


def test_bad_messages_get_the_failure_the_specification_names() -> None:
    cases = {
        "truncated negotiate": (
            lambda h: [h.negotiate()[:20]],
            FailureExplanation.INCORRECT_PAYLOAD,
        ),
        "reply first": (
            lambda h: [A.Reply(h.t_id, bytes(32)).pack()],
            FailureExplanation.INCORRECT_MESSAGE,
        ),
        "secure channel": (
            lambda h: [A.Negotiate(h.t_id, (1,), (0,), sc_c=1).pack()],
            FailureExplanation.CONCAT_MISMATCH,
        ),
        "other protocol": (
            lambda h: [A.Negotiate(h.t_id, (1,), (0,)).pack()[:8] + bytes([2]) + bytes(63)],
            FailureExplanation.NOT_USABLE,
        ),
        "unknown message": (
            lambda h: [bytes([1, 0x77, 0, 0, 0, 0])],
            FailureExplanation.INCORRECT_MESSAGE,
        ),
    }
    for name, (messages, explanation) in cases.items():
        ctrl, host = _pair(CONFIG, HOST_KEY)
        for m in messages(host):
            ctrl.send(m)
        assert _failure1(ctrl) == explanation, name


def _reply_after_challenge(dhgroups: tuple[DhGroupId, ...] = (DhGroupId.NULL,)) -> tuple:
    ctrl, host = _pair(HostAuthConfig(HOST_KEY, dhgroups=dhgroups), HOST_KEY)
    ctrl.send(host.negotiate())
    reply = host.reply(ctrl.receive())
    return ctrl, host, reply


def test_wrong_transaction_id_in_the_reply() -> None:
    ctrl, _host, reply = _reply_after_challenge()
    msg = A.parse_message(reply)
    ctrl.send(A.Reply(msg.t_id ^ 1, msg.response).pack())
    assert _failure1(ctrl) == FailureExplanation.INCORRECT_PAYLOAD


def test_truncated_reply() -> None:
    ctrl, _host, reply = _reply_after_challenge((DhGroupId.FFDHE2048,))
    ctrl.send(reply[:-1])
    assert _failure1(ctrl) == FailureExplanation.INCORRECT_PAYLOAD


def test_replayed_reply_in_the_next_transaction_fails() -> None:
    ctrl, host, reply = _reply_after_challenge()
    ctrl.send(reply)
    host.success1(ctrl.receive())
    assert ctrl.authenticated
    # The same Reply again, to a fresh challenge (re-authentication with the same T_ID).
    ctrl.send(host.negotiate())
    ctrl.receive()
    ctrl.send(reply)
    assert _failure1(ctrl) == FailureExplanation.FAILED


def test_replayed_reply_in_the_same_transaction_is_out_of_order() -> None:
    ctrl, _host, reply = _reply_after_challenge()
    ctrl.send(reply)
    ctrl.send(reply)
    assert _failure1(ctrl) == FailureExplanation.INCORRECT_MESSAGE


def test_bad_dh_value_in_the_reply() -> None:
    ctrl, _host, reply = _reply_after_challenge((DhGroupId.FFDHE2048,))
    msg = A.parse_message(reply)
    ctrl.send(A.Reply(msg.t_id, msg.response, dh_value=(1).to_bytes(256, "big")).pack())
    assert _failure1(ctrl) == FailureExplanation.DHGROUP_UNUSABLE


def test_receive_out_of_turn() -> None:
    ctrl, _host = _pair(CONFIG, HOST_KEY)
    assert _failure1(ctrl) == FailureExplanation.INCORRECT_MESSAGE


def test_host_refuses_a_challenge_it_did_not_offer_and_a_wrong_transaction() -> None:
    host = HostAuth(HOST_KEY, NQN, SUBNQN, hashes=(HashId.SHA256,), dhgroups=(DhGroupId.NULL,))
    bad = {
        A.Challenge(
            host.t_id, HashId.SHA384, 0, 1, bytes(48)
        ).pack(): FailureExplanation.HASH_UNUSABLE,
        A.Challenge(
            host.t_id, HashId.SHA256, 1, 1, bytes(32), bytes(256)
        ).pack(): FailureExplanation.DHGROUP_UNUSABLE,
        A.Challenge(
            host.t_id ^ 1, HashId.SHA256, 0, 1, bytes(32)
        ).pack(): FailureExplanation.INCORRECT_MESSAGE,
        A.Success2(host.t_id).pack(): FailureExplanation.INCORRECT_MESSAGE,
    }
    for message, explanation in bad.items():
        with pytest.raises(AuthenticationFailed) as info:
            host.reply(message)
        assert info.value.explanation == explanation and info.value.failure2
        sent = A.parse_message(info.value.failure2)
        assert isinstance(sent, A.Failure) and sent.message == A.MessageId.FAILURE2


def test_key_change_applies_to_the_next_authentication() -> None:
    configs = [CONFIG]
    ctrl = ControllerAuth(lambda: configs[0], NQN, SUBNQN, 0)
    _run(ctrl, HostAuth(HOST_KEY, NQN, SUBNQN))
    new = DhchapKey.generate(48)
    configs[0] = HostAuthConfig(new)
    assert ctrl.authenticated  # until the host re-authenticates
    _run(ctrl, HostAuth(new, NQN, SUBNQN))
    assert ctrl.authenticated and ctrl.transactions == 2
    old = HostAuth(HOST_KEY, NQN, SUBNQN)
    ctrl.send(old.negotiate())
    ctrl.send(old.reply(ctrl.receive()))
    assert _failure1(ctrl) == FailureExplanation.FAILED
