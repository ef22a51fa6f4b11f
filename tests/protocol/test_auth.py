"""DH-HMAC-CHAP on a live in-process target: the host library authenticates and
re-authenticates; a raw client sends the messages a broken or hostile host would (wrong
transaction ID, out of order, a hash or group not offered, truncated, replayed) and gets
the AUTH_Failure1 the specification names, then its connection closed; meanwhile another
host's authenticated controller keeps doing I/O, and no secret reaches the log."""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import pytest

from pynvmf.auth import DhchapKey, HostAuth
from pynvmf.auth.controller import HostAuthConfig
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeAuthenticationError, connect
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.spec import auth as A
from pynvmf.spec.auth import DhGroupId, FailureExplanation, HashId
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import Status
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RawTarget, RawTargetFactory
from tests.support.raw import HOSTNQN, Completion, RawQueue
from tests.support.scrape import samples_of, series, value

NQN = "nqn.2024-01.io.pynvmf.test:auth"
OPEN_NQN = "nqn.2024-01.io.pynvmf.test:auth-open"
OTHER = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-1111-2222-3333-444455556666"
HOST_KEY = DhchapKey.generate(32)
CTRL_KEY = DhchapKey.generate(48)
OTHER_KEY = DhchapKey.generate(64)


def _subsystem(nqn: str, hosts: set[str]) -> Subsystem:
    sub = Subsystem(nqn, allow_any_host=not hosts, allowed_hosts=hosts)
    sub.add_namespace(Namespace.create(nqn, 1, MemoryDevice(1 << 20, 512), "memory:1"))
    return sub


@pytest.fixture
async def auth_target(raw_target_factory: RawTargetFactory) -> RawTarget:
    raw = await raw_target_factory(
        [_subsystem(NQN, {HOSTNQN, OTHER}), _subsystem(OPEN_NQN, set())],
        [Port("127.0.0.1", 0)],
    )
    target: Target = raw.target
    target.set_host_keys(NQN, HOSTNQN, HostAuthConfig(HOST_KEY, CTRL_KEY))
    target.set_host_keys(NQN, OTHER, HostAuthConfig(OTHER_KEY))
    return raw


def _lib(port: Port, nqn: str, **kw: object) -> Awaitable[Controller]:
    """The host library as the raw client's host (HOSTNQN) unless told otherwise."""
    kw.setdefault("hostnqn", HOSTNQN)
    return connect(port.address, port.port, nqn, **kw)  # type: ignore[arg-type]


def _secrets_absent(text: str) -> None:
    for key in (HOST_KEY, CTRL_KEY, OTHER_KEY):
        assert key.representation().split(":")[2][:16] not in text
        assert key.secret.hex()[:16] not in text


async def _other_host(raw: RawTarget) -> Controller:
    """Another host, authenticated, with I/O queues: it must not notice the failures."""
    port = raw.port
    return await _lib(port, NQN, hostnqn=OTHER, queues=2, dhchap_secret=OTHER_KEY)


async def _other_still_works(ctrl: Controller, pattern: bytes) -> None:
    ns = ctrl.namespace(1)
    await ns.write(8, pattern * 512)
    buf = bytearray(512)
    await ns.read(8, memoryview(buf))
    assert buf == pattern * 512


# -- the host library ------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
async def test_host_library_authenticates_every_queue(
    auth_target: RawTarget, bidirectional: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = auth_target.port
    async with await _lib(
        port,
        NQN,
        queues=3,
        dhchap_secret=HOST_KEY.representation(),
        dhchap_ctrl_secret=CTRL_KEY.representation() if bidirectional else None,
    ) as ctrl:
        assert ctrl.authenticated_queues == {0, 1, 2, 3}
        await _other_still_works(ctrl, b"\x11")
        await ctrl.reauthenticate()
        await _other_still_works(ctrl, b"\x12")
        (sub_ctrl,) = [
            c
            for c in auth_target.target.subsystems[NQN].controllers.values()
            if c.hostnqn == HOSTNQN
        ]
        assert all(
            q.auth is not None and q.auth.transactions == 2 for q in sub_ctrl.queues.values()
        )
    assert caplog.text.count("authenticated (sha256, ffdhe2048") == 8
    _secrets_absent(caplog.text)


@pytest.mark.parametrize(
    ("hashes", "groups"),
    [((HashId.SHA384,), (DhGroupId.NULL,)), ((HashId.SHA512,), (DhGroupId.FFDHE3072,))],
)
async def test_configured_hash_and_group_are_used(
    auth_target: RawTarget, hashes: tuple, groups: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    auth_target.target.set_host_keys(NQN, HOSTNQN, HostAuthConfig(HOST_KEY, None, hashes, groups))
    port = auth_target.port
    async with await _lib(port, NQN, dhchap_secret=HOST_KEY) as ctrl:
        assert ctrl.authenticated_queues == {0, 1}
    assert f"authenticated ({hashes[0].hashlib_name}, {groups[0].text})" in caplog.text


async def test_wrong_host_key_is_refused_and_no_controller_remains(
    auth_target: RawTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    other = await _other_host(auth_target)
    port = auth_target.port
    with pytest.raises(NvmeAuthenticationError) as info:
        await _lib(port, NQN, dhchap_secret=DhchapKey.generate(32))
    assert info.value.by_controller and info.value.explanation == FailureExplanation.FAILED
    controllers = auth_target.target.subsystems[NQN].controllers.values()
    assert [c.hostnqn for c in controllers] == [OTHER]
    await _other_still_works(other, b"\x21")
    await other.close()
    _secrets_absent(caplog.text)


async def test_wrong_controller_key_is_refused_by_the_host(auth_target: RawTarget) -> None:
    port = auth_target.port
    with pytest.raises(NvmeAuthenticationError) as info:
        await _lib(
            port,
            NQN,
            dhchap_secret=HOST_KEY,
            dhchap_ctrl_secret=DhchapKey.generate(48),
        )
    assert not info.value.by_controller and info.value.explanation == FailureExplanation.FAILED
    assert not any(
        c.hostnqn == HOSTNQN for c in auth_target.target.subsystems[NQN].controllers.values()
    )


async def test_controller_key_asked_for_but_none_configured(auth_target: RawTarget) -> None:
    port = auth_target.port
    with pytest.raises(NvmeAuthenticationError) as info:
        await _lib(
            port,
            NQN,
            hostnqn=OTHER,
            dhchap_secret=OTHER_KEY,
            dhchap_ctrl_secret=CTRL_KEY,
        )
    assert info.value.by_controller and info.value.explanation == FailureExplanation.FAILED


async def test_no_secret_for_a_subsystem_that_requires_one(auth_target: RawTarget) -> None:
    port = auth_target.port
    with pytest.raises(NvmeAuthenticationError, match="requires DH-HMAC-CHAP"):
        await _lib(port, NQN)
    # A secret given to a subsystem that asks for none is not used (as Linux's host).
    async with await _lib(port, OPEN_NQN, dhchap_secret=HOST_KEY) as ctrl:
        assert ctrl.authenticated_queues == set()


async def test_rotated_key_applies_to_the_next_authentication(auth_target: RawTarget) -> None:
    port = auth_target.port
    new = DhchapKey.generate(32)
    async with await _lib(port, NQN, dhchap_secret=HOST_KEY) as ctrl:
        auth_target.target.set_host_keys(NQN, HOSTNQN, HostAuthConfig(new))
        await _other_still_works(ctrl, b"\x31")  # authenticated queues stay so
        await ctrl.reauthenticate(new)
        await _other_still_works(ctrl, b"\x32")
    with pytest.raises(NvmeAuthenticationError):
        await _lib(port, NQN, dhchap_secret=HOST_KEY)
    async with await _lib(port, NQN, dhchap_secret=new) as ctrl:
        assert ctrl.authenticated_queues == {0, 1}


async def test_failed_reauthentication_closes_the_queue(auth_target: RawTarget) -> None:
    port = auth_target.port
    ctrl = await _lib(port, NQN, dhchap_secret=HOST_KEY)
    auth_target.target.set_host_keys(NQN, HOSTNQN, HostAuthConfig(DhchapKey.generate(32)))
    with pytest.raises(NvmeAuthenticationError):
        await ctrl.reauthenticate()
    await ctrl.close()
    assert not any(
        c.hostnqn == HOSTNQN for c in auth_target.target.subsystems[NQN].controllers.values()
    )


# -- a raw client ------------------------------------------------------------------------------


async def _send(q: RawQueue, payload: bytes, **kw: object) -> Completion:
    return await q.cmd(
        AdminOpcode.FABRICS,
        nsid=FabricsType.AUTH_SEND,
        cdw10=kw.pop("cdw10", A.auth_cdw10()),  # type: ignore[arg-type]
        cdw11=kw.pop("tl", len(payload)),  # type: ignore[arg-type]
        data=payload,
        inline=True,
    )


async def _recv(q: RawQueue, al: int = 4096) -> Completion:
    return await q.cmd(
        AdminOpcode.FABRICS, nsid=FabricsType.AUTH_RECV, cdw10=A.auth_cdw10(), cdw11=al, read_len=al
    )


async def _unauthenticated(raw: RawTarget, hostnqn: str = HOSTNQN) -> RawQueue:
    q = await raw.open()
    await q.handshake()
    done = await q.connect(NQN, hostnqn=hostnqn)
    assert done.status == 0 and done.result & A.AUTHREQ_ATR, done
    return q


async def _expect_failure1(q: RawQueue, explanation: int) -> None:
    done = await _recv(q)
    assert done.status == 0, done
    msg = A.parse_message(done.data)
    assert isinstance(msg, A.Failure) and msg.message == A.MessageId.FAILURE1, msg
    assert msg.explanation == explanation, A.explanation_name(msg.explanation)
    await q.expect_eof()


async def test_only_connect_auth_and_property_get_before_authentication(
    auth_target: RawTarget,
) -> None:
    q = await _unauthenticated(auth_target)
    assert (await q.prop_get(0x0)).status == 0  # CAP
    for done in (
        await q.prop_set(0x14, 1),
        await q.identify(1),
        await q.cmd(AdminOpcode.KEEP_ALIVE),
    ):
        assert done.status == Status.AUTH_REQUIRED and done.dnr, done
    # Wrong SECP, a zero TL: Invalid Field before any message is looked at.
    bad = await _send(q, b"\0" * 8, cdw10=0xEA010100)
    assert bad.status == Status.INVALID_FIELD and bad.dnr
    assert (await _send(q, b"", tl=0)).status in (Status.INVALID_FIELD, Status.SGL_INVALID_DATA)


async def test_io_queue_must_authenticate_too(auth_target: RawTarget) -> None:
    port = auth_target.port
    async with await _lib(port, NQN, dhchap_secret=HOST_KEY, queues=0) as ctrl:
        q = await auth_target.open()
        await q.handshake()
        done = await q.connect(NQN, qid=1, cntlid=ctrl.cntlid)
        assert done.status == 0 and done.result & A.AUTHREQ_ATR
        read = await q.cmd(0x02, nsid=1, read_len=512)
        assert read.status == Status.AUTH_REQUIRED and read.dnr
        auth = HostAuth(HOST_KEY, HOSTNQN, NQN)
        assert (await _send(q, auth.negotiate())).status == 0
        challenge = await _recv(q)
        assert (await _send(q, auth.reply(challenge.data))).status == 0
        assert auth.success1((await _recv(q)).data) is None
        read = await q.cmd(0x02, nsid=1, cdw12=0, read_len=512)
        assert read.status == 0 and len(read.data) == 512


def _negotiate(t_id: int = 7, **kw: object) -> bytes:
    return A.Negotiate(
        t_id,
        kw.get("hashes", (1, 2, 3)),
        kw.get("groups", (0, 1, 2, 3, 4, 5)),
        kw.get("sc_c", 0),  # type: ignore[arg-type]
    ).pack()


async def _through_challenge(q: RawQueue, auth: HostAuth) -> bytes:
    assert (await _send(q, auth.negotiate())).status == 0
    challenge = await _recv(q)
    assert challenge.status == 0
    return auth.reply(challenge.data)


CASES = {
    "truncated negotiate": FailureExplanation.INCORRECT_PAYLOAD,
    "hash not offered": FailureExplanation.HASH_UNUSABLE,
    "group not offered": FailureExplanation.DHGROUP_UNUSABLE,
    "secure channel": FailureExplanation.CONCAT_MISMATCH,
    "reply first": FailureExplanation.INCORRECT_MESSAGE,
    "wrong transaction": FailureExplanation.INCORRECT_PAYLOAD,
    "truncated reply": FailureExplanation.INCORRECT_PAYLOAD,
    "reply twice": FailureExplanation.INCORRECT_MESSAGE,
    "replayed reply": FailureExplanation.FAILED,
    "success2 unasked": FailureExplanation.INCORRECT_MESSAGE,
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_messages_fail_that_connection_alone(
    auth_target: RawTarget, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    target = auth_target.target
    target.set_host_keys(
        NQN,
        HOSTNQN,
        HostAuthConfig(HOST_KEY, CTRL_KEY, (HashId.SHA256,), (DhGroupId.FFDHE2048,)),
    )
    other = await _other_host(auth_target)
    q = await _unauthenticated(auth_target)
    auth = HostAuth(HOST_KEY, HOSTNQN, NQN, t_id=7)
    if case == "truncated negotiate":
        await _send(q, auth.negotiate()[:40])
    elif case == "hash not offered":
        await _send(q, _negotiate(hashes=(2, 3)))
    elif case == "group not offered":
        await _send(q, _negotiate(groups=(0, 3)))
    elif case == "secure channel":
        await _send(q, _negotiate(sc_c=1))
    elif case == "reply first":
        await _send(q, A.Reply(7, bytes(32)).pack())
    elif case == "wrong transaction":
        reply = A.parse_message(await _through_challenge(q, auth))
        await _send(q, A.Reply(8, reply.response, dh_value=reply.dh_value).pack())  # type: ignore[union-attr]
    elif case == "truncated reply":
        await _send(q, (await _through_challenge(q, auth))[:-10])
    elif case == "reply twice":
        reply = await _through_challenge(q, auth)
        await _send(q, reply)
        await _send(q, reply)
    elif case == "replayed reply":
        # A Reply recorded from an earlier, successful transaction on another connection.
        first = await _unauthenticated(auth_target)
        recorded = await _through_challenge(first, auth)
        assert (await _send(first, recorded)).status == 0
        assert auth.success1((await _recv(first)).data) is None
        await _send(q, auth.negotiate())
        await _recv(q)
        await _send(q, recorded)
    elif case == "success2 unasked":
        await _through_challenge(q, auth)
        await _send(q, A.Success2(7).pack())
    await _expect_failure1(q, CASES[case])
    await _other_still_works(other, b"\x41")
    await other.close()
    assert "authentication failed" in caplog.text
    _secrets_absent(caplog.text)


async def test_failure2_from_the_host_ends_the_connection(auth_target: RawTarget) -> None:
    q = await _unauthenticated(auth_target)
    auth = HostAuth(HOST_KEY, HOSTNQN, NQN, t_id=3)
    await _through_challenge(q, auth)
    done = await _send(
        q, A.Failure(A.MessageId.FAILURE2, 3, FailureExplanation.HASH_UNUSABLE).pack()
    )
    assert done.status == 0
    await q.expect_eof()


async def test_key_file_with_bad_crc_is_refused_without_the_key(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    from pynvmf.target.changes import ChangeError

    caplog.set_level(logging.DEBUG)
    text = HOST_KEY.representation()
    body = text.split(":")[2]
    bad = text.replace(body, ("B" if body[0] == "A" else "A") + body[1:])
    path = tmp_path / "bad.key"
    path.write_text(bad)
    path.chmod(0o600)
    target = Target([], [])
    with pytest.raises(ChangeError, match="CRC") as info:
        target.add_key("k", str(path))
    assert body[1:17] not in str(info.value)
    open_path = tmp_path / "open.key"
    open_path.write_text(text)
    open_path.chmod(0o644)
    with pytest.raises(ChangeError, match="0600"):
        target.add_key("k", str(open_path))
    assert not target.keyring
    _secrets_absent(caplog.text)


async def test_a_key_added_while_connected_lets_the_host_authenticate(
    auth_target: RawTarget,
) -> None:
    port = auth_target.port
    async with await _lib(port, OPEN_NQN, queues=1) as ctrl:
        assert ctrl.authenticated_queues == set()
        # The open subsystem now lists the host with a key: the next authentication uses it.
        auth_target.target.add_host(OPEN_NQN, HOSTNQN, auth=HostAuthConfig(HOST_KEY))
        await ctrl.reauthenticate(HOST_KEY)
        assert ctrl.authenticated_queues == {0, 1}
        await _other_still_works(ctrl, b"\x51")
        with pytest.raises(NvmeAuthenticationError):
            await ctrl.reauthenticate(DhchapKey.generate(32))


async def test_outcomes_are_counted_for_the_metrics(auth_target: RawTarget) -> None:
    """Every transaction that ends is counted once: the successes (re-authentications
    too), the failures by their reason."""
    port = auth_target.port
    async with await _lib(port, NQN, queues=2, dhchap_secret=HOST_KEY) as ctrl:
        await ctrl.reauthenticate()
    with pytest.raises(NvmeAuthenticationError):
        await _lib(port, NQN, dhchap_secret=DhchapKey.generate(32))
    m = samples_of(MetricsEndpoint(auth_target.target).exposition().decode())
    assert value(m, "pynvmf_auth_successes_total") == 6  # 3 queues, twice
    assert series(m, "pynvmf_auth_failures_total") == {frozenset({("reason", "FAILED")}): 1}
