"""The NVMe/TCP secure channel end to end in one process: pynvmf's host library against
pynvmf's target over TLS 1.3 with PSKs (the record layer in user space where the machine's
kernel has no kTLS, in the kernel where it has), listeners that require, allow or refuse
TLS, TREQ/SECTYPE in the discovery log, and hosts that get it wrong: each failure ends
that connection alone, says nothing secret, and other hosts keep working.

The Linux kernel's host and target (with tlshd) are the peers of
tests/interop/test_linux_tls.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect, discover
from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError
from pynvmf.spec import logpages as L
from pynvmf.spec.status import Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, ConfiguredPsk, tls_psk
from pynvmf.tls import engine as E
from pynvmf.tls import wire as W

SUBNQN = "nqn.2024-01.io.pynvmf.test:tls"
OPEN_NQN = "nqn.2024-01.io.pynvmf.test:tls-open"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-00000000000b"
HOST_C = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-00000000000c"
KEY_A = ConfiguredPsk(HASH_SHA256, bytes(range(32)))
KEY_B = ConfiguredPsk(HASH_SHA384, bytes(range(48)))
TIMEOUT = 10.0


def _subsystem(nqn: str, **kwargs: object) -> Subsystem:
    subsystem = Subsystem(nqn, **kwargs)  # type: ignore[arg-type]
    subsystem.add_namespace(Namespace.create(nqn, 1, MemoryDevice(1 << 22, 512), "memory:1"))
    return subsystem


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    t = Target(
        [
            _subsystem(SUBNQN, allow_any_host=False, allowed_hosts={HOST_A, HOST_B, HOST_C}),
            _subsystem(OPEN_NQN),
        ],
        [
            Port("127.0.0.1", 0, secure_channel="required"),
            Port("127.0.0.1", 0, secure_channel="optional"),
            Port("127.0.0.1", 0),
            Port("127.0.0.1", 0, discovery_only=True, discovery_listener=True),
        ],
    )
    await t.start()
    t.set_host_psk(SUBNQN, HOST_A, KEY_A.encode())
    t.set_host_psk(SUBNQN, HOST_B, KEY_B)
    yield t
    await t.stop()


def _port(t: Target, kind: str) -> int:
    return next(p.port for p in t.ports if p.secure_channel == kind and not p.discovery_only)


async def _round_trip(ctrl: object) -> None:
    ns = ctrl.namespaces[1]  # type: ignore[attr-defined]
    data = os.urandom(256 * 1024)
    await ns.write(0, data)
    back = bytearray(len(data))
    await ns.read(0, memoryview(back))
    assert bytes(back) == data


@pytest.mark.parametrize(
    ("hostnqn", "key", "version", "compat", "suite"),
    [
        (HOST_A, KEY_A, 0, False, "TLS_AES_128_GCM_SHA256"),
        (HOST_A, KEY_A, 1, False, "TLS_AES_128_GCM_SHA256"),
        (HOST_A, KEY_A, 0, True, "TLS_AES_128_GCM_SHA256"),
        (HOST_B, KEY_B, 0, False, "TLS_AES_256_GCM_SHA384"),
        (HOST_B, KEY_B, 1, True, "TLS_AES_256_GCM_SHA384"),
    ],
)
async def test_connect_and_io_over_tls(
    target: Target, hostnqn: str, key: ConfiguredPsk, version: int, compat: bool, suite: str
) -> None:
    for kind in ("required", "optional"):
        ctrl = await connect(
            "127.0.0.1",
            _port(target, kind),
            SUBNQN,
            hostnqn=hostnqn,
            tls_psk=key.encode(),
            tls_identity=version,
            tls_compat=compat,
            queues=2,
            header_digest=True,
            data_digest=True,
            timeout=TIMEOUT,
        )
        try:
            await _round_trip(ctrl)
            for queue in [ctrl.admin, *ctrl.io_queues]:
                assert queue is not None and queue.tls is not None
                engine = queue.tls.engine
                assert engine.suite is not None and engine.suite.name == suite
                assert engine.psk is not None
                assert engine.psk.identity.startswith(f"NVMe{version}R0".encode())
                # Where the kernel has kTLS both directions move there, else neither does.
                assert queue.tls.offload in ("ktls", "user")
        finally:
            await ctrl.close()
    counters = target.tls_counters
    assert counters.handshakes == 2 * 3 and counters.handshake_failures == 0
    assert counters.ktls_tx + counters.user_tx == counters.handshakes
    assert counters.ktls_rx + counters.user_rx == counters.handshakes


async def test_discovery_log_reports_the_secure_channel(target: Target) -> None:
    disc = next(p for p in target.ports if p.discovery_only)
    entries = await discover("127.0.0.1", disc.port, hostnqn=HOST_A)
    by_port = {int(e.trsvcid): e for e in entries if e.subnqn == SUBNQN}
    required = by_port[_port(target, "required")]
    optional = by_port[_port(target, "optional")]
    plain = by_port[_port(target, "none")]
    assert required.treq & L.Treq.SECURE_CHANNEL_MASK == L.Treq.REQUIRED
    assert optional.treq & L.Treq.SECURE_CHANNEL_MASK == L.Treq.NOT_REQUIRED
    assert plain.treq & L.Treq.SECURE_CHANNEL_MASK == L.Treq.NOT_SPECIFIED
    assert required.tcp_sectype == optional.tcp_sectype == L.TcpSecType.TLS13
    assert plain.tcp_sectype == L.TcpSecType.NONE


async def test_plain_connections_and_hosts_without_tls(target: Target) -> None:
    # A plaintext ICReq on a port that requires TLS: the connection is refused.
    with pytest.raises(NvmeConnectionError):
        await connect("127.0.0.1", _port(target, "required"), OPEN_NQN, timeout=TIMEOUT)
    # An optional port takes plain NVMe/TCP, for a subsystem whose host has no PSK.
    ctrl = await connect("127.0.0.1", _port(target, "optional"), OPEN_NQN, timeout=TIMEOUT)
    await _round_trip(ctrl)
    await ctrl.close()
    # The port's TREQ decides, as on nvmet (blktests nvme/062): a host with a PSK may
    # connect in plain NVMe/TCP where the port does not require TLS.
    for kind in ("optional", "none"):
        ctrl = await connect("127.0.0.1", _port(target, kind), SUBNQN, hostnqn=HOST_A)
        assert ctrl.admin.tls is None
        await _round_trip(ctrl)
        await ctrl.close()
    # A host of the subsystem without a PSK connects in plain NVMe/TCP.
    ctrl = await connect("127.0.0.1", _port(target, "none"), SUBNQN, hostnqn=HOST_C)
    await ctrl.close()


async def test_psk_of_one_host_cannot_connect_as_another(target: Target) -> None:
    """The TLS identity names the host and the subsystem; Connect must name the same."""
    psk = tls_psk(KEY_A, HOST_A, SUBNQN)
    with pytest.raises(NvmeStatusError) as info:
        await connect("127.0.0.1", _port(target, "required"), SUBNQN, hostnqn=HOST_C, tls_psk=psk)
    assert info.value.status & 0x7FF == Status.CONNECT_INVALID_HOST & 0x7FF
    with pytest.raises(NvmeStatusError):
        await connect("127.0.0.1", _port(target, "required"), OPEN_NQN, hostnqn=HOST_A, tls_psk=psk)


async def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data`, return everything the target sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = b""
    async with asyncio.timeout(TIMEOUT):
        while chunk := await reader.read(65536):
            got += chunk
    writer.close()
    return got


def _hello(psk: object, **kwargs: object) -> bytes:
    client = E.TlsEngine.client(psk, **kwargs)  # type: ignore[arg-type]
    client.start()
    return b"".join(client.take_output())


async def test_bad_handshakes_fail_alone(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = _port(target, "required")
    # One host connected and working throughout.
    good = await connect(
        "127.0.0.1", port, SUBNQN, hostnqn=HOST_A, tls_psk=KEY_A.encode(), timeout=TIMEOUT
    )
    wrong_key = tls_psk(ConfiguredPsk(HASH_SHA256, bytes(32)), HOST_A, SUBNQN)
    unknown = tls_psk(KEY_A, HOST_A, "nqn.2024-01.io.pynvmf.test:nowhere")
    attempts = {
        "unknown identity": (_hello(unknown), W.ALERT_UNKNOWN_PSK_IDENTITY),
        "wrong key": (_hello(wrong_key), W.ALERT_DECRYPT_ERROR),
        "wrong cipher": (
            _hello(tls_psk(KEY_A, HOST_A, SUBNQN), offer=(0x1302, 0x1303)),
            W.ALERT_HANDSHAKE_FAILURE,
        ),
        "garbage inside": (b"\x16\x03\x01\x00\x30" + os.urandom(0x30), None),
        "garbage before": (b"\x16" + os.urandom(200), None),
    }
    failures = target.tls_counters.handshake_failures
    for name, (data, alert) in attempts.items():
        answer = await _raw_exchange(port, data)
        if alert is not None:
            assert answer[:1] == bytes([W.CT_ALERT]) and answer[6] == alert, name
        await _round_trip(good)
    assert target.tls_counters.handshake_failures >= failures + len(attempts) - 1
    await good.close()
    # Nothing secret reached the log: not the configured keys, not the derived ones.
    secrets = [KEY_A.key.hex(), KEY_B.key.hex(), KEY_A.encode().split(":")[2]]
    secrets += [tls_psk(KEY_A, HOST_A, SUBNQN, v).key.hex() for v in (0, 1)]
    assert not any(s in caplog.text for s in secrets)
    assert "binder does not verify" in caplog.text


async def test_a_stalled_handshake_holds_bounded_memory(target: Target) -> None:
    """A ClientHello that never ends: the target holds one record's worth of it, no more,
    and the connection ends (record overflow) when the host sends more than TLS allows."""
    port = _port(target, "required")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff")
        await asyncio.sleep(0)
        answer = await _raw_exchange(port, b"\x16\x03\x01\xff\xff" + bytes(1 << 16))
        assert answer[:1] == bytes([W.CT_ALERT]) and answer[6] == W.ALERT_RECORD_OVERFLOW
    used = target.memory_pool.used
    assert used < 1 << 20


async def test_changes_and_outputs_never_show_keys(target: Target, tmp_path: object) -> None:
    from pathlib import Path

    from pynvmf.config.native import config_of

    path = Path(str(tmp_path)) / "key.txt"
    path.write_text(KEY_A.encode() + "\n")
    path.chmod(0o644)
    with pytest.raises(ChangeError, match="0600"):
        target.add_key("key0", str(path))
    path.chmod(0o600)
    target.add_key("key0", str(path))
    target.set_host_psk(SUBNQN, HOST_C, "key0")
    with pytest.raises(ChangeError, match="in use"):
        target.remove_key("key0")
    with pytest.raises(ChangeError, match="CRC"):
        target.set_host_psk(
            SUBNQN, HOST_C, "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8AAAAA:"
        )
    with pytest.raises(ChangeError, match="keyring"):
        target.set_host_psk(SUBNQN, HOST_C, "key1")
    text = str(config_of(target))
    assert "key0" in text and "<redacted>" in text
    assert KEY_A.encode().split(":")[2] not in text and KEY_B.encode().split(":")[2] not in text
    ctrl = await connect(
        "127.0.0.1", _port(target, "required"), SUBNQN, hostnqn=HOST_C, tls_psk=KEY_A.encode()
    )
    await ctrl.close()


async def test_cli_tls_options(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    """`pynvmf list --tls-key ...` as nvme-cli's --tls/--tls-key; bad keys are refused in
    one line that does not show them."""
    from tests.protocol.test_host_cli import run

    base = ["list", "-a", "127.0.0.1", "-s", str(_port(target, "required")), "--nqn", SUBNQN]
    base += ["-q", HOST_A]
    assert await asyncio.to_thread(run, *base, "--tls-key", KEY_A.encode()) == 0
    bad = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8AAAAA:"
    for extra in (["--tls-key", bad], ["--tls"]):
        assert await asyncio.to_thread(run, *base, *extra) != 0
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "AAECAwQF" not in err
    assert target.tls_counters.handshakes == 1


async def test_tls_queues_stay_in_the_main_process_of_a_multicore_target() -> None:
    # A handed-off socket would carry TLS records a worker has no keys for: the main
    # process serves TLS connections, and I/O over them works with workers running.
    from pynvmf.target.cores.workers import MultiCoreTarget

    t = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0, secure_channel="required")])
    t.add_subsystem(SUBNQN, allow_any_host=False, hosts=[HOST_A])
    device = t.memory_device(1 << 22, 512)
    from pynvmf.target.devices import NamedDevice

    t.add_namespace(SUBNQN, NamedDevice.wrap("tls-mem", device, owned=True), nsid=1)
    await t.start()
    try:
        t.set_host_psk(SUBNQN, HOST_A, KEY_A.encode())
        ctrl = await connect(
            "127.0.0.1",
            t.ports[0].port,
            SUBNQN,
            hostnqn=HOST_A,
            tls_psk=KEY_A.encode(),
            queues=2,
            timeout=TIMEOUT,
        )
        try:
            await _round_trip(ctrl)
            assert t.workers is not None
            assert [len(w.queues) for w in t.workers.workers] == [0, 0]
            assert t.workers.handed_off == 0
        finally:
            await ctrl.close()
    finally:
        await t.stop()


async def test_host_opens_tls_queues_one_handshake_at_a_time(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """As Linux's host: each queue's TLS handshake ends before the next connection starts
    (tlshd 1.4 serving nvmet sometimes loses the PSK of one of two concurrent handshakes)."""
    caplog.set_level(logging.DEBUG, logger="pynvmf")
    ctrl = await connect(
        "127.0.0.1",
        _port(target, "required"),
        SUBNQN,
        hostnqn=HOST_A,
        tls_psk=KEY_A.encode(),
        queues=3,
        timeout=TIMEOUT,
    )
    await ctrl.close()
    # The target's side: a connection accepted, a handshake finished.
    events = []
    for record in caplog.records:
        text = record.getMessage()
        if record.name == "pynvmf.target.protocol" and text.startswith("connection from ("):
            events.append("accept")
        elif text.startswith("connection from") and "TLS 1.3 established" in text:
            events.append("done")
    assert events == ["accept", "done"] * 4, events
