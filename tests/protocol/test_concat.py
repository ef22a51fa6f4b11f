"""Secure channel concatenation end to end in one process: pynvmf's host library (as Linux's
`nvme connect --concat` does it) against pynvmf's target, with and without worker processes.

The admin queue authenticates over plain TCP asking for a new TLS PSK (SC_C NEWTLSPSK), the
host closes it and connects every queue over TLS 1.3 with the PSK that authentication
generated (identity NVMe1G0x ...); the I/O queues of that channel are not asked to
authenticate again. A re-authentication over TLS replaces the PSK (REPLACETLSPSK). And the
bad inputs: concatenation asked on a listener without TLS (AUTH_Failure1 "secure channel
concatenation mismatch"), a generated identity that matches no authentication (the TLS
handshake fails, that connection alone), an I/O queue for a controller whose admin queue
never authenticated (Authentication Required), a host authenticating over and over (the
target holds a bounded number of PSKs). Other hosts keep working, and no key is logged.

The Linux kernel's host and nvmet are the peers of tests/interop/test_linux_concat.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator

import pytest

from pynvmf.auth import DhchapKey, HostAuth
from pynvmf.auth.controller import HostAuthConfig
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeAuthenticationError, connect
from pynvmf.host import fabrics as F
from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError
from pynvmf.host.fabrics import HostIdentity
from pynvmf.host.queue import HostQueue
from pynvmf.spec import auth as A
from pynvmf.spec.auth import DhGroupId, FailureExplanation, HashId, SecureConcat
from pynvmf.spec.status import Status
from pynvmf.target.generated_psks import MAX_PER_PAIR
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.psk import generated_tls_psks
from tests.support.raw import RawQueue

NQN = "nqn.2024-01.io.pynvmf.test:concat"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-1111-2222-3333-00000000000a"
OTHER = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-1111-2222-3333-00000000000b"
HOST_KEY = DhchapKey.generate(32)
CTRL_KEY = DhchapKey.generate(48)
OTHER_KEY = DhchapKey.generate(32)
TIMEOUT = 10.0


def _subsystem() -> Subsystem:
    sub = Subsystem(NQN, allow_any_host=False, allowed_hosts={HOST, OTHER})
    sub.add_namespace(Namespace.create(NQN, 1, MemoryDevice(1 << 22, 512), "memory:1"))
    return sub


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    t = Target(
        [_subsystem()],
        [Port("127.0.0.1", 0, secure_channel="optional"), Port("127.0.0.1", 0)],
    )
    await t.start()
    t.set_host_keys(NQN, HOST, HostAuthConfig(HOST_KEY, CTRL_KEY))
    t.set_host_keys(NQN, OTHER, HostAuthConfig(OTHER_KEY))
    yield t
    await t.stop()


def _port(t: Target, tls: bool = True) -> int:
    return next(p.port for p in t.ports if (p.secure_channel != "none") == tls)


async def _concat(t: Target, port: int | None = None, **kw: object) -> Controller:
    kw.setdefault("hostnqn", HOST)
    kw.setdefault("dhchap_secret", HOST_KEY)
    return await connect(  # type: ignore[arg-type]
        "127.0.0.1", port or _port(t), NQN, concat=True, timeout=TIMEOUT, **kw
    )


async def _round_trip(ctrl: Controller, lba: int = 0) -> None:
    ns = ctrl.namespaces[1]
    data = os.urandom(64 * 1024)
    await ns.write(lba, data)
    back = bytearray(len(data))
    await ns.read(lba, memoryview(back))
    assert bytes(back) == data


async def _other_host(t: Target) -> Controller:
    """Another host, concatenated too, with I/O queues: it must not notice the failures."""
    return await _concat(t, hostnqn=OTHER, dhchap_secret=OTHER_KEY, queues=2)


def _target_controllers(t: Target, hostnqn: str = HOST) -> list:
    return [c for c in t.subsystems[NQN].controllers.values() if c.hostnqn == hostnqn]


def _secrets_absent(text: str, *keys: bytes) -> None:
    for key in (HOST_KEY, CTRL_KEY, OTHER_KEY):
        assert key.secret.hex()[:16] not in text
        assert key.representation().split(":")[2][:16] not in text
    for key in keys:
        assert key.hex()[:16] not in text


@pytest.mark.parametrize(
    ("hash_id", "group"),
    [(HashId.SHA256, DhGroupId.FFDHE2048), (HashId.SHA384, DhGroupId.FFDHE3072)],
)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
async def test_concatenated_connect_io_and_replacement(
    target: Target,
    hash_id: HashId,
    group: DhGroupId,
    bidirectional: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    target.set_host_keys(NQN, HOST, HostAuthConfig(HOST_KEY, CTRL_KEY, (hash_id,), (group,)))
    ctrl = await _concat(target, queues=2, dhchap_ctrl_secret=CTRL_KEY if bidirectional else None)
    try:
        psk = ctrl.tls_psk
        assert psk is not None and psk.generated
        assert psk.identity.startswith(f"NVMe1G{hash_id:02d} {HOST} {NQN} ".encode())
        suite = "TLS_AES_128_GCM_SHA256" if hash_id == HashId.SHA256 else "TLS_AES_256_GCM_SHA384"
        for queue in [ctrl.admin, *ctrl.io_queues]:
            assert queue is not None and queue.tls is not None
            engine = queue.tls.engine
            assert engine.psk == psk and engine.suite is not None and engine.suite.name == suite
        # The plain admin queue authenticated; the TLS channel's queues were not asked to.
        assert ctrl.authenticated_queues == {0}
        (sub_ctrl,) = _target_controllers(target)
        assert (
            sub_ctrl.generated_psk is not None and sub_ctrl.generated_psk.identity == psk.identity
        )
        assert all(q.auth is None for q in sub_ctrl.queues.values())
        assert len(target.generated_psks) == 1
        await _round_trip(ctrl)
        # Re-authentication over TLS: a new PSK replaces the channel's (REPLACETLSPSK).
        await ctrl.reauthenticate()
        new = ctrl.tls_psk
        assert new is not None and new.identity != psk.identity
        assert target.generated_psks.find(psk.identity) == []
        assert target.generated_psks.find(new.identity)[0].key == new.key
        assert (
            sub_ctrl.generated_psk is not None and sub_ctrl.generated_psk.identity == new.identity
        )
        await _round_trip(ctrl, 256)  # the queues made with the old PSK keep working
        # An I/O queue connected now (in place of qid 2) uses the new PSK, and is tied to
        # the controller.
        last = ctrl.io_queues.pop()
        last.close()
        await last.wait_closed()
        extra = await HostQueue.open("127.0.0.1", _port(target), 2, 8, tls_psk=new)
        result = await F.connect_queue(
            extra, HostIdentity.resolve(HOST), NQN, sqsize=8, cntlid=ctrl.cntlid
        )
        assert not result & A.AUTHREQ_ATR
        extra.close()
        await extra.wait_closed()
        # The old one opens nothing any more.
        with pytest.raises(NvmeConnectionError):
            await HostQueue.open("127.0.0.1", _port(target), 2, 8, tls_psk=psk, timeout=TIMEOUT)
    finally:
        await ctrl.close()
    assert len(target.generated_psks) == 0  # it went with its controller
    assert "NEW_TLS_PSK for secure channel concatenation" in caplog.text
    assert "REPLACE_TLS_PSK for secure channel concatenation" in caplog.text
    _secrets_absent(caplog.text, psk.key, new.key)


async def test_many_hosts_and_a_reset(target: Target) -> None:
    """Two hosts concatenated at once; a host that connects again (Linux's nvme reset:
    its key revoked, a new authentication) gets a new PSK and the old one is gone."""
    other = await _other_host(target)
    first = await _concat(target, queues=1)
    old = first.tls_psk
    await first.close()
    second = await _concat(target, queues=1)
    assert second.tls_psk is not None and old is not None
    assert second.tls_psk.identity != old.identity
    assert target.generated_psks.find(old.identity) == []
    await _round_trip(second)
    await _round_trip(other, 512)
    await second.close()
    await other.close()


async def test_concatenation_on_a_listener_without_tls(target: Target) -> None:
    other = await _other_host(target)
    with pytest.raises(NvmeAuthenticationError) as info:
        await _concat(target, _port(target, tls=False))
    assert info.value.by_controller
    assert info.value.explanation == FailureExplanation.CONCAT_MISMATCH
    assert _target_controllers(target) == []
    assert len(target.generated_psks) == 1  # the other host's
    # The same host without concatenation authenticates there as before.
    async with await connect(
        "127.0.0.1", _port(target, tls=False), NQN, hostnqn=HOST, dhchap_secret=HOST_KEY
    ) as plain:
        assert plain.authenticated_queues == {0, 1}
    await _round_trip(other)
    await other.close()


async def test_generated_identity_that_matches_no_authentication(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    other = await _other_host(target)
    # A well-formed NVMe1G identity for this host, from no authentication the target made.
    forged = generated_tls_psks(1, os.urandom(32), HOST, NQN)[0]
    failures = target.tls_counters.handshake_failures
    with pytest.raises(NvmeConnectionError):
        await connect(
            "127.0.0.1", _port(target), NQN, hostnqn=HOST, tls_psk=forged, timeout=TIMEOUT
        )
    assert target.tls_counters.handshake_failures == failures + 1
    assert "unknown_psk_identity" in caplog.text or "no PSK for any identity" in caplog.text
    # A generated PSK whose controller went is as unknown.
    ctrl = await _concat(target, queues=1)
    stale = ctrl.tls_psk
    await ctrl.close()
    with pytest.raises(NvmeConnectionError):
        await connect("127.0.0.1", _port(target), NQN, hostnqn=HOST, tls_psk=stale)
    # So is one of a host whose key was taken away since.
    ctrl = await _concat(target, queues=1)
    held = ctrl.tls_psk
    target.set_host_keys(NQN, HOST, None)
    with pytest.raises(NvmeConnectionError):
        await HostQueue.open("127.0.0.1", _port(target), 2, 8, tls_psk=held, timeout=TIMEOUT)
    await ctrl.close()
    await _round_trip(other)
    await other.close()


async def test_io_queue_of_a_controller_that_never_authenticated(target: Target) -> None:
    """Connect's I/O queue for a controller whose host must authenticate and whose admin
    queue has not: Authentication Required, over plain TCP and over a concatenated TLS
    channel alike; the queue is not bound."""
    other = await _other_host(target)
    admin = await RawQueue.open("127.0.0.1", _port(target))
    await admin.handshake()
    hostid = HostIdentity.resolve(HOST).hostid
    done = await admin.connect(NQN, hostnqn=HOST, hostid=hostid)
    assert done.status == 0 and done.result & A.AUTHREQ_ATR
    cntlid = done.result & 0xFFFF
    io = await RawQueue.open("127.0.0.1", _port(target))
    await io.handshake()
    refused = await io.connect(NQN, qid=1, cntlid=cntlid, hostnqn=HOST, hostid=hostid)
    assert refused.status == Status.AUTH_REQUIRED and refused.dnr, refused
    # A valid generated PSK (the other controller's authentication) does not open it either.
    concatenated = await _concat(target, queues=0)
    assert concatenated.tls_psk is not None
    queue = await HostQueue.open("127.0.0.1", _port(target), 1, 8, tls_psk=concatenated.tls_psk)
    with pytest.raises(NvmeStatusError) as info:
        await F.connect_queue(queue, HostIdentity.resolve(HOST), NQN, sqsize=8, cntlid=cntlid)
    assert info.value.status == Status.AUTH_REQUIRED and info.value.dnr
    queue.close()
    (unauthenticated,) = [c for c in _target_controllers(target) if c.cntlid == cntlid]
    assert list(unauthenticated.queues) == [0]
    for q in (admin, io):
        await q.close()
    await concatenated.close()
    await _round_trip(other)
    await other.close()


async def test_io_queue_over_the_generated_psk_of_the_plain_controller(target: Target) -> None:
    """The PSK is for the queues that follow, not only for a new admin queue: an I/O queue
    of the controller whose plain admin queue generated it connects over TLS with it, and
    is not asked to authenticate."""
    identity = HostIdentity.resolve(HOST)
    admin = await HostQueue.open("127.0.0.1", _port(target), 0, 32)
    result = await F.connect_queue(admin, identity, NQN, sqsize=31, kato_ms=5000)
    assert result & A.AUTHREQ_ATR
    auth = HostAuth(HOST_KEY, HOST, NQN, concat=SecureConcat.NEW_TLS_PSK)
    await F.authenticate(admin, auth)
    assert auth.generated_psk is not None and auth.hash_id is not None
    psk = generated_tls_psks(auth.hash_id, auth.generated_psk, HOST, NQN)[0]
    await F.property_set(admin, 0x14, 0x460001)  # CC: EN, IOSQES 6, IOCQES 4
    io = await HostQueue.open("127.0.0.1", _port(target), 1, 8, tls_psk=psk)
    result = await F.connect_queue(io, identity, NQN, sqsize=8, cntlid=result & 0xFFFF)
    assert not result & A.AUTHREQ_ATR
    for q in (io, admin):
        q.close()
        await q.wait_closed()


async def test_generated_psks_are_bounded(target: Target) -> None:
    """A host that authenticates again and again, asking for a PSK each time and never
    using one, makes the target hold at most MAX_PER_PAIR of them."""
    identity = HostIdentity.resolve(HOST)
    admin = await HostQueue.open("127.0.0.1", _port(target), 0, 32)
    assert (await F.connect_queue(admin, identity, NQN, sqsize=31)) & A.AUTHREQ_ATR
    identities = set()
    for _ in range(MAX_PER_PAIR + 4):
        auth = HostAuth(HOST_KEY, HOST, NQN, concat=SecureConcat.NEW_TLS_PSK)
        await F.authenticate(admin, auth)
        assert auth.generated_psk is not None and auth.hash_id is not None
        identities.add(generated_tls_psks(auth.hash_id, auth.generated_psk, HOST, NQN)[0].identity)
    assert len(identities) == MAX_PER_PAIR + 4
    assert len(target.generated_psks) == MAX_PER_PAIR
    admin.close()
    await admin.wait_closed()


async def test_hosts_library_refuses_what_linux_refuses(target: Target) -> None:
    with pytest.raises(ValueError, match="DH-HMAC-CHAP"):
        await connect("127.0.0.1", _port(target), NQN, hostnqn=HOST, concat=True)
    with pytest.raises(ValueError, match="generates its TLS PSK"):
        await connect(
            "127.0.0.1",
            _port(target),
            NQN,
            hostnqn=HOST,
            concat=True,
            dhchap_secret=HOST_KEY,
            tls_psk=generated_tls_psks(1, bytes(32), HOST, NQN)[0],
        )
    # A controller that does not ask to authenticate leaves nothing to generate a PSK from.
    target.set_host_keys(NQN, HOST, None)
    with pytest.raises(NvmeAuthenticationError, match="does not ask to authenticate"):
        await _concat(target)


async def test_cli_concat(target: Target) -> None:
    import asyncio

    from tests.protocol.test_host_cli import run

    base = ["list", "-a", "127.0.0.1", "-s", str(_port(target)), "--nqn", NQN, "-q", HOST]
    base += ["-S", HOST_KEY.representation()]
    assert await asyncio.to_thread(run, *base, "--concat") == 0
    assert await asyncio.to_thread(run, *base, "--concat", "--tls") != 0
    assert target.tls_counters.handshakes == 1  # `list` opens the admin queue alone


async def test_concatenation_with_worker_processes() -> None:
    """`--cores 2`: the plain admin queue authenticates in the main process, and the TLS
    queues stay there (a worker would have no record keys); I/O works with workers up."""
    from pynvmf.target.cores.workers import MultiCoreTarget
    from pynvmf.target.devices import NamedDevice

    t = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0, secure_channel="optional")])
    t.add_subsystem(NQN, allow_any_host=False, hosts=[HOST])
    device = t.memory_device(1 << 22, 512)
    t.add_namespace(NQN, NamedDevice.wrap("concat-mem", device, owned=True), nsid=1)
    await t.start()
    try:
        t.set_host_keys(NQN, HOST, HostAuthConfig(HOST_KEY))
        ctrl = await connect(
            "127.0.0.1",
            t.ports[0].port,
            NQN,
            hostnqn=HOST,
            dhchap_secret=HOST_KEY,
            concat=True,
            queues=2,
            timeout=TIMEOUT,
        )
        try:
            await _round_trip(ctrl)
            assert all(q.tls is not None for q in ctrl.io_queues)
            assert t.workers is not None and t.workers.handed_off == 0
            await ctrl.reauthenticate()
            await _round_trip(ctrl, 128)
        finally:
            await ctrl.close()
        assert len(t.generated_psks) == 0
    finally:
        await t.stop()


async def test_a_host_that_derives_the_tls_psk_as_linux_6_15_did(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Linux 6.15-6.17 built the HKDF label without its length bytes: the target finds
    that derivation of the generated PSK too, and says so."""
    caplog.set_level(logging.INFO)
    identity = HostIdentity.resolve(HOST)
    admin = await HostQueue.open("127.0.0.1", _port(target), 0, 32)
    await F.connect_queue(admin, identity, NQN, sqsize=31)
    auth = HostAuth(HOST_KEY, HOST, NQN, concat=SecureConcat.NEW_TLS_PSK)
    await F.authenticate(admin, auth)
    admin.close()
    await admin.wait_closed()
    assert auth.generated_psk is not None and auth.hash_id is not None
    standard, older = generated_tls_psks(auth.hash_id, auth.generated_psk, HOST, NQN)
    ctrl = await connect(
        "127.0.0.1", _port(target), NQN, hostnqn=HOST, tls_psk=older, queues=1, timeout=TIMEOUT
    )
    await _round_trip(ctrl)
    await ctrl.close()
    assert "(Linux 6.15-6.17's derivation)" in caplog.text
    assert standard.key != older.key


async def test_replacetlspsk_on_a_channel_of_a_configured_psk(target: Target) -> None:
    """REPLACETLSPSK on an admin queue whose TLS channel uses a configured PSK (the host
    has one and a DH-HMAC-CHAP key): the target holds the generated PSK for that controller,
    the configured one stays, and an I/O queue connects over TLS with either."""
    from pynvmf.tcp.psk import HASH_SHA256, ConfiguredPsk

    configured = ConfiguredPsk(HASH_SHA256, os.urandom(32))
    target.set_host_psk(NQN, OTHER, configured)
    ctrl = await connect(
        "127.0.0.1",
        _port(target),
        NQN,
        hostnqn=OTHER,
        dhchap_secret=OTHER_KEY,
        tls_psk=configured,
        queues=3,
        timeout=TIMEOUT,
    )
    try:
        assert ctrl.admin is not None and ctrl.authenticated_queues == {0, 1, 2, 3}
        for queue in ctrl.io_queues[1:]:  # qid 2 and 3 come back below
            queue.close()
            await queue.wait_closed()
        del ctrl.io_queues[1:]
        auth = HostAuth(OTHER_KEY, OTHER, NQN, concat=SecureConcat.REPLACE_TLS_PSK)
        await F.authenticate(ctrl.admin, auth)
        assert auth.generated_psk is not None and auth.hash_id is not None
        psk = generated_tls_psks(auth.hash_id, auth.generated_psk, OTHER, NQN)[0]
        (sub_ctrl,) = _target_controllers(target, OTHER)
        assert sub_ctrl.generated_psk is not None
        assert sub_ctrl.generated_psk.identity == psk.identity
        identity = HostIdentity.resolve(OTHER)
        for qid, key in ((2, psk), (3, ctrl.tls_psk)):
            queue = await HostQueue.open("127.0.0.1", _port(target), qid, 8, tls_psk=key)
            result = await F.connect_queue(queue, identity, NQN, sqsize=8, cntlid=ctrl.cntlid)
            # Over the generated PSK no authentication is asked; over the configured one,
            # as before, it is.
            assert bool(result & A.AUTHREQ_ATR) == (key is not psk)
            queue.close()
            await queue.wait_closed()
    finally:
        await ctrl.close()
    assert len(target.generated_psks) == 0
