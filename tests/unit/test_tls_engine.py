"""The TLS 1.3 PSK engine (pynvmf.tls.engine.TlsEngine): against OpenSSL's s_server and
s_client (real peers, TLS_AES_128_GCM_SHA256: OpenSSL's command-line PSK is SHA-256 only;
the SHA-384 suite meets real peers in tests/interop/test_linux_tls.py), against itself for
both suites and key exchange modes, and with hostile input: each failure ends that
session with the alert RFC 8446 names, holds a bounded buffer, and says nothing secret.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable

import pytest

from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, TlsPsk
from pynvmf.tls import engine as E
from pynvmf.tls import ktls as K
from pynvmf.tls import records as R
from pynvmf.tls import wire as W

IDENTITY = b"NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:1 nqn.2014-08.org.pynvmf:t"
KEY = bytes(range(32))
PSK = TlsPsk(IDENTITY, HASH_SHA256, KEY)
PSK384 = TlsPsk(IDENTITY.replace(b"R01", b"R02"), HASH_SHA384, bytes(range(48)))


def lookup_for(*psks: TlsPsk) -> Callable[[bytes], list[TlsPsk]]:
    table = {p.identity: p for p in psks}
    return lambda identity: [table[identity]] if identity in table else []


def pump(client: E.TlsEngine, server: E.TlsEngine) -> None:
    for _ in range(6):
        for record in client.take_output():
            server.feed(record)
        for record in server.take_output():
            client.feed(record)


@pytest.mark.parametrize("psk", [PSK, PSK384], ids=["sha256", "sha384"])
@pytest.mark.parametrize(
    "modes", [(W.PSK_DHE_KE,), (W.PSK_KE,), (W.PSK_DHE_KE, W.PSK_KE)], ids=["dhe", "ke", "both"]
)
def test_handshake_and_records_both_suites(psk: TlsPsk, modes: tuple[int, ...]) -> None:
    client = E.TlsEngine.client(psk, modes=modes)
    server = E.TlsEngine.server(lookup_for(PSK, PSK384))
    client.start()
    pump(client, server)
    assert client.established and server.established
    assert client.suite is server.suite is W.SUITE_FOR_HASH[psk.hash_id]
    assert client.mode == server.mode == modes[0]
    assert server.psk == psk
    payload = os.urandom(40000)
    records = client.protect([payload[:100], memoryview(payload)[100:]])
    # 2^14 bytes of plaintext at most per record; each record as header and body buffers.
    assert len(records) == 2 * 3 and all(len(h) == 5 for h in records[::2])
    assert b"".join(b for r in records for b in server.feed(r)) == payload
    # Both directions, and the traffic ciphers kTLS would take agree on sequence numbers.
    assert b"".join(b for r in server.protect([b"pong"]) for b in client.feed(r)) == b"pong"
    ctx, crx = client.traffic()
    stx, srx = server.traffic()
    assert (ctx.key, ctx.iv, ctx.seq) == (srx.key, srx.iv, srx.seq) == (ctx.key, ctx.iv, 3)
    assert (stx.key, stx.seq) == (crx.key, crx.seq) == (stx.key, 1)


def test_ktls_crypto_info_layout() -> None:
    """struct tls12_crypto_info_aes_gcm_128/256 (linux/tls.h): version, cipher, iv[8],
    key, salt[4], rec_seq[8]; TLS 1.3's 12-byte IV is salt || iv."""
    cipher = R.RecordCipher(W.TLS_AES_256_GCM_SHA384, bytes(48))
    cipher.seq = 5
    info = K.crypto_info(cipher)
    assert len(info) == 4 + 8 + 32 + 4 + 8
    version, kind = struct.unpack_from("=HH", info)
    assert (version, kind) == (0x0304, 52)
    assert info[4:12] == cipher.iv[4:] and info[12:44] == cipher.key
    assert info[44:48] == cipher.iv[:4] and info[48:] == (5).to_bytes(8, "big")
    assert len(K.crypto_info(R.RecordCipher(W.TLS_AES_128_GCM_SHA256, bytes(32)))) == 40


# -- OpenSSL as the peer --------------------------------------------------------------------


def _openssl() -> str:
    path = shutil.which("openssl")
    assert path, "openssl is missing: run scripts/install-system-deps.sh"
    return path


def test_client_against_openssl_s_server() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            *(_openssl(), "s_server", "-accept", f"127.0.0.1:{port}", "-tls1_3", "-nocert"),
            *("-psk", KEY.hex(), "-psk_identity", IDENTITY.decode(), "-rev", "-naccept", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        while server.stdout.readline().strip() != b"ACCEPT":
            pass
        engine = E.TlsEngine.client(PSK)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            engine.start()
            got: list[bytes] = []
            sent = False
            while not got:
                for record in engine.take_output():
                    sock.sendall(record)
                if engine.established and not sent:
                    for record in engine.protect([b"hello over tls\n"]):
                        sock.sendall(record)
                    sent = True
                data = sock.recv(65536)
                assert data, f"s_server closed: {engine.error}"
                got += engine.feed(data)
            assert engine.error is None
            # s_server -rev answers each line reversed; a NewSessionTicket came first.
            assert b"".join(got) == b"slt revo olleh\n"
            assert engine.stats.post_handshake_messages >= 1
            assert engine.mode == W.PSK_DHE_KE
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    "extra",
    [[], ["-groups", "P-256"], ["-groups", "P-384"], ["-allow_no_dhe_kex"]],
    ids=["x25519", "p256", "p384", "psk_ke-allowed"],
)
def test_server_against_openssl_s_client(extra: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = subprocess.Popen(
            [
                *(_openssl(), "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_3", "-quiet"),
                *("-psk", KEY.hex(), "-psk_identity", IDENTITY.decode(), *extra),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            listener.settimeout(20)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(20)
                engine = E.TlsEngine.server(lookup_for(PSK))
                assert client.stdin is not None and client.stdout is not None
                client.stdin.write(b"ping\n")
                client.stdin.flush()
                got: list[bytes] = []
                while not got:
                    data = conn.recv(65536)
                    assert data, f"s_client closed: {engine.error}"
                    got += engine.feed(data)
                    for record in engine.take_output():
                        conn.sendall(record)
                assert b"".join(got) == b"ping\n"
                for record in engine.protect([b"pong\n"]):
                    conn.sendall(record)
                assert client.stdout.readline() == b"pong\n"
                assert engine.suite is W.TLS_AES_128_GCM_SHA256
        finally:
            client.kill()
            client.wait()


# -- hostile input --------------------------------------------------------------------------


def _client_hello(psk: TlsPsk = PSK, **kwargs: object) -> bytes:
    client = E.TlsEngine.client(psk, **kwargs)  # type: ignore[arg-type]
    client.start()
    return b"".join(client.take_output())


def _alert_of(records: list[bytes]) -> int:
    assert records, "no alert sent"
    last = records[-1]
    assert last[0] == W.CT_ALERT, last[:5]
    return last[6]


def test_unknown_identity() -> None:
    server = E.TlsEngine.server(lookup_for())
    server.feed(_client_hello())
    assert server.error is not None and server.error.alert == W.ALERT_UNKNOWN_PSK_IDENTITY
    assert _alert_of(server.take_output()) == W.ALERT_UNKNOWN_PSK_IDENTITY
    assert not server.established


def test_wrong_key() -> None:
    server = E.TlsEngine.server(lookup_for(TlsPsk(IDENTITY, HASH_SHA256, bytes(32))))
    server.feed(_client_hello())
    assert server.error is not None and server.error.alert == W.ALERT_DECRYPT_ERROR


def test_cipher_suite_other_than_the_psks() -> None:
    """A client offering TLS_AES_256_GCM_SHA384 for a SHA-256 PSK (or any other suite) has
    nothing the NVMe/TCP rules allow: handshake_failure."""
    hello = bytearray(_client_hello())
    # Patch the one cipher suite offered (after version, random and an empty session id).
    offset = 5 + 4 + 2 + 32 + 1 + 2
    assert hello[offset : offset + 2] == b"\x13\x01"
    hello[offset : offset + 2] = b"\x13\x03"  # TLS_CHACHA20_POLY1305_SHA256
    server = E.TlsEngine.server(lookup_for(PSK))
    server.feed(bytes(hello))
    assert server.error is not None and server.error.alert == W.ALERT_HANDSHAKE_FAILURE
    assert "TLS_AES_128_GCM_SHA256" in str(server.error)


def test_binder_with_the_other_hash_is_explained() -> None:
    """Debian 13's tlshd binds NVMe0R02 (SHA-384) keys with SHA-256 and offers
    TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256."""
    lying = TlsPsk(PSK384.identity, HASH_SHA256, PSK384.key)
    server = E.TlsEngine.server(lookup_for(PSK384))
    server.feed(_client_hello(lying, offer=(0x1302, 0x1303)))
    assert server.error is not None and "SHA256" in str(server.error)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00" * 72,  # a plain ICReq's first bytes
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\xff\xff" + bytes(100),  # a record longer than TLS allows
        b"\x16\x03\x03\x00\x05\x01\x00\x00\x01\x00",  # a truncated ClientHello
        b"\x16\x03\x03\x00\x04\x02\x00\x00\x00",  # a ServerHello to a server
        b"\x17\x03\x03\x00\x10" + bytes(16),  # application data before any handshake
        b"\x15\x03\x03\x00\x02\x02\x28",  # a fatal alert
    ],
    ids=["icreq", "http", "overflow", "truncated", "wrong-message", "early-data", "alert"],
)
def test_garbage_before_the_handshake(data: bytes) -> None:
    server = E.TlsEngine.server(lookup_for(PSK))
    server.feed(data)
    assert server.error is not None
    assert not server.established
    # Nothing more is taken in, and the buffer stays what it was.
    size = server.buffer_size
    server.feed(os.urandom(1 << 20))
    assert server.buffer_size == size


def test_garbage_inside_the_handshake_and_after() -> None:
    client = E.TlsEngine.client(PSK)
    server = E.TlsEngine.server(lookup_for(PSK))
    client.start()
    for record in client.take_output():
        server.feed(record)
    flight = server.take_output()
    # Flip a byte of the encrypted EncryptedExtensions/Finished record.
    tampered = bytearray(flight[-1])
    tampered[-1] ^= 1
    client.feed(flight[0])
    client.feed(bytes(tampered))
    assert client.error is not None and client.error.alert == W.ALERT_BAD_RECORD_MAC
    assert _alert_of(client.take_output()) == W.ALERT_BAD_RECORD_MAC
    # After the handshake: a tampered application record ends the session.
    client, server = E.TlsEngine.client(PSK), E.TlsEngine.server(lookup_for(PSK))
    client.start()
    pump(client, server)
    record = bytearray(b"".join(client.protect([b"x" * 100])))
    record[20] ^= 0x80
    assert server.feed(bytes(record)) == []
    assert server.error is not None and server.error.alert == W.ALERT_BAD_RECORD_MAC


def test_handshake_message_size_is_bounded() -> None:
    server = E.TlsEngine.server(lookup_for(PSK))
    # A ClientHello header claiming 16 MiB, fed in plausible records.
    server.feed(b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff" + bytes(0x4000 - 4))
    assert server.error is not None and server.error.alert == W.ALERT_HANDSHAKE_FAILURE


def test_failures_log_and_say_nothing_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = [KEY.hex(), KEY.hex().upper(), repr(KEY)]
    for lookup in (lookup_for(), lookup_for(TlsPsk(IDENTITY, HASH_SHA256, bytes(32)))):
        server = E.TlsEngine.server(lookup)
        server.feed(_client_hello())
        text = str(server.error) + repr(server) + caplog.text
        assert not any(s in text for s in secrets)
    client, server = E.TlsEngine.client(PSK), E.TlsEngine.server(lookup_for(PSK))
    client.start()
    pump(client, server)
    tx, _ = client.traffic()
    assert tx.key.hex() not in repr(tx) + repr(client)
