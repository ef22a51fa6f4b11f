"""Secure channel concatenation, sans I/O: the generated PSK, its digest, identity and TLS
PSK against the Linux kernel's known answers (drivers/nvme/common/tests, the KUnit test of
nvme_auth_generate_psk, nvme_auth_generate_digest and nvme_auth_derive_tls_psk) and against
the formulas computed here by hand with `cryptography`'s HKDF; then the two DH-HMAC-CHAP
state machines agreeing on that PSK (NEWTLSPSK, REPLACETLSPSK, uni- and bidirectional), the
controller's refusals (the AUTH_Failure1 explanations the specification names), and the
target's bounded store of generated PSKs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from pynvmf.auth import ControllerAuth, DhchapKey, HostAuth, HostAuthConfig
from pynvmf.auth.crypto import generated_psk
from pynvmf.auth.host import AuthenticationFailed
from pynvmf.spec import auth as A
from pynvmf.spec.auth import DhGroupId, FailureExplanation, HashId, SecureConcat
from pynvmf.target.generated_psks import GeneratedPsks
from pynvmf.tcp.psk import PskError, generated_tls_psks

# The kernel's KUnit inputs: KS = "ABCD...", C1 = 00 01 02 ..., C2 = ff fe fd ...
KUNIT_HOSTNQN = "hostnqn"
KUNIT_SUBNQN = "subsysnqn"
KUNIT = {
    HashId.SHA256: (
        "1733c59fa7f48fcf37f5f26fc4ff0268ad4f78e030f4f3b0bfd1d47e7bb1447a",
        "OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI=",
        "3c17da628474a04d2247c4cab47968c915388193f7c071bd9489cc3666cd7cc8",
    ),
    HashId.SHA384: (
        "f14b2dd3234c459694d3bc63f8968bd6b37c2c6de849e22e118749001ce4bbe8"
        "640b9e3a748cb11ce4b1d71d359cce39",
        "cffMWk8TSS7HOQebjgYEIkrPrjWPV4JE5cdPB8WhEvY4JBW5YynKyv66XscN4A9n",
        "2774753233537b3fa50eb7d16a8e43457d85f4906c005b2236616c5d80939d08"
        "98fff15bb8b77119d2be0aac423e7590",
    ),
}
KUNIT_SHA512_PSK = (
    "9c9f089a618b47d2d75f4b6c28070424487b445dd96e70c4c09b55e8b6000152"
    "a3363c3454043f38f0b85036ded40655350aa87b8b6a282b5c1acae16233dd5b"
)


def _kunit_inputs(length: int) -> tuple[bytes, bytes, bytes]:
    return (
        bytes(ord("A") + i for i in range(length)),
        bytes(range(length)),
        bytes(0xFF - i for i in range(length)),
    )


@pytest.mark.parametrize("hash_id", list(KUNIT))
def test_generated_psk_digest_and_tls_psk_are_the_kernels(hash_id: HashId) -> None:
    psk_hex, digest, tls_hex = KUNIT[hash_id]
    psk = generated_psk(hash_id, *_kunit_inputs(hash_id.length))
    assert psk.hex() == psk_hex
    standard, older = generated_tls_psks(hash_id, psk, KUNIT_HOSTNQN, KUNIT_SUBNQN)
    identity = f"NVMe1G{hash_id:02d} {KUNIT_HOSTNQN} {KUNIT_SUBNQN} {digest}"
    assert standard.identity == older.identity == identity.encode()
    assert standard.key.hex() == tls_hex
    assert standard.generated and standard.hash_id == hash_id and not standard.derivation
    assert older.key != standard.key and older.derivation == "Linux 6.15-6.17's"


def test_sha512_generates_a_psk_but_no_tls_psk() -> None:
    psk = generated_psk(HashId.SHA512, *_kunit_inputs(64))
    assert psk.hex() == KUNIT_SHA512_PSK
    # NVMe/TCP has no SHA-512 cipher suite; Linux refuses the digest too.
    with pytest.raises(PskError):
        generated_tls_psks(int(HashId.SHA512), psk, KUNIT_HOSTNQN, KUNIT_SUBNQN)


@pytest.mark.parametrize("hash_id", list(KUNIT))
def test_tls_psk_by_hand(hash_id: HashId) -> None:
    """The specification's formulas written out here, with cryptography's HKDF-Expand and
    the HkdfLabel of RFC 8446 §7.1 built by hand (and Linux 6.15-6.17's label, which lacks
    the two vectors' length bytes)."""
    name = hash_id.hashlib_name
    algorithm = hashes.SHA256() if hash_id == HashId.SHA256 else hashes.SHA384()
    length = hash_id.length
    psk = hmac.new(b"session key", b"\x01" * length + b"\x02" * length, name).digest()
    host, sub = "nqn.2014-08.org.nvmexpress:uuid:h", "nqn.2024-01.io.pynvmf:s"
    mac = hmac.new(psk, f"{host} {sub} NVMe-over-Fabrics".encode(), name).digest()
    digest = base64.b64encode(mac).decode()
    prk = hmac.new(bytes(length), psk, name).digest()  # HKDF-Extract(0, PSK)
    label = b"tls13 nvme-tls-psk"
    context = f"{hash_id:02d} {digest}".encode()
    rfc = struct.pack("!HB", length, len(label)) + label + bytes([len(context)]) + context
    legacy = struct.pack("!H", length) + label + context
    expected = [HKDFExpand(algorithm, length, info).derive(prk) for info in (rfc, legacy)]
    got = generated_tls_psks(hash_id, psk, host, sub)
    assert [p.key for p in got] == expected
    assert got[0].identity == f"NVMe1G{hash_id:02d} {host} {sub} {digest}".encode()
    assert "session" not in repr(got[0]) and psk.hex() not in repr(got[0])


# -- the state machines ------------------------------------------------------------------

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:d8e3f2a0-1b2c-4d5e-8f90-a1b2c3d4e5f6"
SUBNQN = "nqn.2024-11.dev.pynvmf:concat-unit"
HOST_KEY = DhchapKey.generate(32)
CTRL_KEY = DhchapKey.generate(48)
CONFIG = HostAuthConfig(HOST_KEY, CTRL_KEY)


def _controller(
    config: HostAuthConfig = CONFIG, *, qid: int = 0, tls_offered: bool = True, on_tls: bool = False
) -> ControllerAuth:
    return ControllerAuth(
        lambda: config, HOSTNQN, SUBNQN, qid, tls_offered=tls_offered, on_tls=on_tls
    )


def _failure1(ctrl: ControllerAuth) -> int:
    msg = A.parse_message(ctrl.receive())
    assert isinstance(msg, A.Failure) and msg.message == A.MessageId.FAILURE1
    assert ctrl.closing and not ctrl.authenticated
    return msg.explanation


@pytest.mark.parametrize("hash_id", [HashId.SHA256, HashId.SHA384])
@pytest.mark.parametrize("group", [DhGroupId.FFDHE2048, DhGroupId.FFDHE3072])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("concat", [SecureConcat.NEW_TLS_PSK, SecureConcat.REPLACE_TLS_PSK])
def test_both_sides_generate_the_same_psk(
    hash_id: HashId, group: DhGroupId, bidirectional: bool, concat: SecureConcat
) -> None:
    config = HostAuthConfig(HOST_KEY, CTRL_KEY, (HashId.SHA512, hash_id), (DhGroupId.NULL, group))
    ctrl = _controller(config, on_tls=concat == SecureConcat.REPLACE_TLS_PSK)
    host = HostAuth(
        HOST_KEY, HOSTNQN, SUBNQN, ctrl_key=CTRL_KEY if bidirectional else None, concat=concat
    )
    ctrl.send(host.negotiate())
    reply = A.parse_message(host.reply(ctrl.receive()))
    assert isinstance(reply, A.Reply)
    # C2 always (the PSK needs it); S2 0 unless the host also authenticates the controller.
    assert reply.c2 is not None and bool(reply.seqnum) == bidirectional
    ctrl.send(reply.pack())
    success1 = A.parse_message(ctrl.receive())
    assert isinstance(success1, A.Success1) and (success1.response is not None) == bidirectional
    success2 = host.success1(success1.pack())
    assert (success2 is not None) == bidirectional
    if success2 is not None:
        assert ctrl.take_generated_psk() is None  # not before Success2
        ctrl.send(success2)
    assert ctrl.authenticated and not ctrl.closing
    # SHA-512 and the null group are skipped: a TLS PSK cannot come of them.
    assert (host.hash_id, host.dhgroup) == (hash_id, group)
    generated = ctrl.take_generated_psk()
    assert generated is not None and generated == (hash_id, host.generated_psk)
    assert ctrl.take_generated_psk() is None  # handed over once


def test_without_concatenation_nothing_is_generated() -> None:
    ctrl = _controller()
    host = HostAuth(HOST_KEY, HOSTNQN, SUBNQN, ctrl_key=CTRL_KEY)
    ctrl.send(host.negotiate())
    ctrl.send(host.reply(ctrl.receive()))
    success2 = host.success1(ctrl.receive())
    assert success2 is not None
    ctrl.send(success2)
    assert ctrl.authenticated and ctrl.take_generated_psk() is None
    assert host.generated_psk is None


def test_sc_c_is_part_of_r1() -> None:
    """R1 covers SC_C: the Reply of a host that computed R1 with SC_C 00h while its
    Negotiate asked for NEWTLSPSK fails; the same exchange with R1 over 02h succeeds."""
    config = HostAuthConfig(HOST_KEY, CTRL_KEY, (HashId.SHA256,), (DhGroupId.FFDHE2048,))
    for r1_sc_c, explanation in ((SecureConcat.NONE, FailureExplanation.FAILED), (None, None)):
        ctrl = _controller(config)
        asking = HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=6, concat=SecureConcat.NEW_TLS_PSK)
        ctrl.send(asking.negotiate())
        # This host's R1 is over SC_C 00h; with the controller key it sends C2 (S2 set).
        answering = (
            asking
            if r1_sc_c is None
            else HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=6, ctrl_key=CTRL_KEY, concat=r1_sc_c)
        )
        ctrl.send(answering.reply(ctrl.receive()))
        if explanation is None:
            assert answering.success1(ctrl.receive()) is None and ctrl.authenticated
        else:
            assert _failure1(ctrl) == explanation


REFUSALS: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    # case: (controller's setting, the host's Negotiate, the explanation)
    "I/O queue": ({"qid": 1}, {}, FailureExplanation.CONCAT_MISMATCH),
    "listener without TLS": ({"tls_offered": False}, {}, FailureExplanation.CONCAT_MISMATCH),
    "NEWTLSPSK over TLS": ({"on_tls": True}, {}, FailureExplanation.CONCAT_MISMATCH),
    "REPLACETLSPSK without TLS": (
        {},
        {"sc_c": SecureConcat.REPLACE_TLS_PSK},
        FailureExplanation.CONCAT_MISMATCH,
    ),
    "obsolete 01h": ({}, {"sc_c": 0x01}, FailureExplanation.CONCAT_MISMATCH),
    "reserved 04h": ({}, {"sc_c": 0x04}, FailureExplanation.CONCAT_MISMATCH),
    "null group only": ({}, {"groups": (DhGroupId.NULL,)}, FailureExplanation.CONCAT_MISMATCH),
    "SHA-512 only": ({}, {"hashes": (HashId.SHA512,)}, FailureExplanation.HASH_UNUSABLE),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_concatenation_refusals(case: str) -> None:
    setting, negotiate, explanation = REFUSALS[case]
    ctrl = _controller(**setting)
    ctrl.send(
        A.Negotiate(
            5,
            negotiate.get("hashes", (HashId.SHA256, HashId.SHA384, HashId.SHA512)),
            negotiate.get("groups", tuple(DhGroupId)),
            negotiate.get("sc_c", SecureConcat.NEW_TLS_PSK),
        ).pack()
    )
    assert _failure1(ctrl) == explanation


def test_a_reply_without_c2_is_refused() -> None:
    ctrl = _controller(HostAuthConfig(HOST_KEY, None, (HashId.SHA256,), (DhGroupId.FFDHE2048,)))
    concat_host = HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=9, concat=SecureConcat.NEW_TLS_PSK)
    ctrl.send(concat_host.negotiate())
    reply = A.parse_message(concat_host.reply(ctrl.receive()))
    assert isinstance(reply, A.Reply)
    ctrl.send(A.Reply(9, reply.response, 0, None, reply.dh_value).pack())
    assert _failure1(ctrl) == FailureExplanation.FAILED


def test_c2_with_s2_0_without_concatenation_is_still_refused() -> None:
    ctrl = _controller(HostAuthConfig(HOST_KEY, None, (HashId.SHA256,), (DhGroupId.FFDHE2048,)))
    host = HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=9)
    ctrl.send(host.negotiate())
    reply = A.parse_message(host.reply(ctrl.receive()))
    assert isinstance(reply, A.Reply)
    ctrl.send(A.Reply(9, reply.response, 0, b"\x07" * 32, reply.dh_value).pack())
    assert _failure1(ctrl) == FailureExplanation.INCORRECT_PAYLOAD


def test_host_refuses_the_null_group_and_sha512_for_concatenation() -> None:
    host = HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=4, concat=SecureConcat.NEW_TLS_PSK)
    offered = A.parse_message(host.negotiate())
    assert isinstance(offered, A.Negotiate) and offered.sc_c == SecureConcat.NEW_TLS_PSK
    assert HashId.SHA512 not in offered.hashes and DhGroupId.NULL not in offered.dhgroups
    null = A.Challenge(4, HashId.SHA256, DhGroupId.NULL, 1, b"\x01" * 32).pack()
    with pytest.raises(AuthenticationFailed) as info:
        host.reply(null)
    assert info.value.failure2 is not None
    # Neither was offered (a PSK cannot be generated with them): not usable.
    assert info.value.explanation == FailureExplanation.DHGROUP_UNUSABLE
    sha512 = A.Challenge(4, HashId.SHA512, DhGroupId.FFDHE2048, 1, b"\x01" * 64, b"\x02").pack()
    with pytest.raises(AuthenticationFailed) as info:
        HostAuth(HOST_KEY, HOSTNQN, SUBNQN, t_id=4, concat=SecureConcat.NEW_TLS_PSK).reply(sha512)
    assert info.value.explanation == FailureExplanation.HASH_UNUSABLE


# -- the target's store ------------------------------------------------------------------


def _psks(host: str = HOSTNQN, sub: str = SUBNQN, seed: bytes = b"") -> list:
    psk = hashlib.sha256(seed + host.encode() + sub.encode()).digest()
    return generated_tls_psks(1, psk, host, sub)


def test_store_keeps_a_psk_until_its_controller_goes() -> None:
    store = GeneratedPsks()
    first = _psks(seed=b"1")
    store.add(first)
    assert store.find(first[0].identity) == first
    assert store.find(first[0].identity.replace(b"NVMe1G01", b"NVMe1G02")) == []
    creator = object()  # the controller whose authentication made it is not its owner
    store.controller_gone(creator)  # type: ignore[arg-type]
    assert store.find(first[0].identity) == first
    ctrl = object()
    store.take(first[0], ctrl)  # type: ignore[arg-type]
    # REPLACETLSPSK: the new one takes the old one's place.
    second = _psks(seed=b"2")
    store.replace(first[0], second, ctrl)  # type: ignore[arg-type]
    assert store.find(first[0].identity) == [] and store.find(second[0].identity) == second
    store.controller_gone(ctrl)  # type: ignore[arg-type]
    assert len(store) == 0


def test_store_is_bounded_per_host_and_subsystem() -> None:
    store = GeneratedPsks(per_pair=3)
    taken = _psks(seed=b"taken")
    store.add(taken)
    store.take(taken[0], object())  # type: ignore[arg-type]
    others = [_psks("nqn.2014-08.org.nvmexpress:uuid:other", seed=bytes([i])) for i in range(3)]
    for psks in others:
        store.add(psks)
    mine = [_psks(seed=bytes([i])) for i in range(5)]
    for psks in mine:
        store.add(psks)
    # Three per pair: the oldest untaken went first, the taken one stays.
    assert store.find(taken[0].identity) == taken
    assert [bool(store.find(p[0].identity)) for p in mine] == [False, False, False, True, True]
    assert all(store.find(p[0].identity) for p in others)
    assert len(store) == 6
    store.forget(hostnqn=HOSTNQN, subnqn=SUBNQN)
    assert len(store) == 3
    store.forget(subnqn=SUBNQN)
    assert len(store) == 0
