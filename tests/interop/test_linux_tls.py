"""The NVMe/TCP secure channel (TLS 1.3 with PSKs) against the real peers of the Linux
guests that have it (6.12 and 7): the kernel host (``nvme connect --tls``, tlshd from
ktls-utils, the key in the ``.nvme`` keyring put there by nvme-cli) against pynvmf's target,
and pynvmf's host library against the kernel target (nvmet with a TLS port, tlshd answering
the handshake).

pynvmf's side runs on the machine (its record layer in user space where the machine's
kernel has no kTLS, in the kernel where it has) and, for the kernel offload, in the guest
itself with the guest's Python (3.13 in trixie, 3.14 in sid; both kernels have kTLS): both
directions' records must then go through the kernel on pynvmf's side.

One guest boot per peer (6.1 has no NVMe/TCP TLS), and a target process per peer.

Found with these peers, and asserted so that a change shows (``Peer.tls_compat_keys``,
``Peer.tlshd_sha384``): Debian 13's nvme-cli 2.13 (libnvme 1.13) derives the keys it
inserts with the label encoding later libnvme calls "compat" (pynvmf's target tries both;
the host library needs ``tls_compat=True`` for a target whose keyring nvme-cli 2.13
filled); sid's nvme-cli 2.16 (libnvme 1.16) derives them as the specification says. Debian
13's tlshd 1.0 binds an ``NVMe0R02`` (SHA-384) key with SHA-256, so no NVMe/TCP cipher suite
fits: pynvmf's target refuses it with a message that says so; sid's tlshd 1.4 binds it with
SHA-384 and the connection uses TLS_AES_256_GCM_SHA384. The Linux hosts offer ``NVMe0R0x``
identities only.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pynvmf.host import connect
from pynvmf.host.errors import NvmeConnectionError
from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, ConfiguredPsk, PskError, tls_psk
from tests.support import guest_pynvmf
from tests.support.guest import SECURE_CHANNEL, Guest, Peer
from tests.support.guest_assets import TLSHD_CONF
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = SECURE_CHANNEL.mark()

MIB = 1 << 20
SUBNQN = "nqn.2014-08.org.pynvmf:tls-interop"
LINUX_NQN = "nqn.2014-08.org.pynvmf:tls-linux-target"
HOST1 = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000075e1"
HOST2 = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000075e2"
HOST3 = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000075e3"
# Ports inside the guest: nvmet's TLS port (forwarded from the machine) and pynvmf's
# target run in the guest (loopback only).
GUEST_TARGET_PORT = 44330
TIMEOUT = 60.0  # a TCG guest is slow


@dataclass
class Setup:
    process: TargetProcess
    required: int
    optional: int
    discovery: int
    key1: ConfiguredPsk
    key2: ConfiguredPsk


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer) -> Iterator[Setup]:
    # A target process per peer: what one peer's host was refused for is in its log.
    workdir = tmp_path_factory.mktemp(f"linux-tls-{linux_peer.name}")
    key1 = ConfiguredPsk(HASH_SHA256, secrets.token_bytes(32))
    key2 = ConfiguredPsk(HASH_SHA384, secrets.token_bytes(48))
    keyfile = workdir / "key1.txt"
    keyfile.write_text(key1.encode() + "\n")
    keyfile.chmod(0o600)
    required, optional, discovery = free_tcp_port(), free_tcp_port(), free_tcp_port()
    config = {
        "keyring": [{"name": "key1", "path": str(keyfile)}],
        "ports": [
            {"address": "127.0.0.1", "port": required, "secure_channel": "required"},
            {"address": "127.0.0.1", "port": optional, "secure_channel": "optional"},
        ],
        "discovery_ports": [{"address": "127.0.0.1", "port": discovery}],
        "subsystems": [
            {
                "nqn": SUBNQN,
                "hosts": [
                    {"nqn": HOST1, "psk": "key1"},
                    {"nqn": HOST2, "psk": key2.encode()},
                    HOST3,
                ],
                "namespaces": [{"nsid": 1, "memory": 64 * MIB}],
            }
        ],
    }
    process = TargetProcess(config, workdir)
    process.start()
    yield Setup(process, required, optional, discovery, key1, key2)
    process.stop(expect=None)
    assert not any(k in process.stderr() for k in (key1.encode(), key2.encode()))


@pytest.fixture(scope="module")
def guest(linux_peer: Peer, target: Setup) -> Iterator[Guest]:
    nvmet_port = free_tcp_port()
    g = Guest(peer=linux_peer, hostfwd=[nvmet_port], memory_mb=1536)
    g.start()
    g.nvmet_port = nvmet_port  # type: ignore[attr-defined]
    g.run("modprobe tls && modprobe nvme-tcp && modprobe nvmet-tcp && modprobe nvme-keyring")
    g.write_file("/etc/tlshd.conf", TLSHD_CONF)
    g.run("(tlshd > /tmp/tlshd.log 2>&1 &) ; sleep 0.5; busybox pidof tlshd")
    # pynvmf and the suite's cryptography for the guest's Python.
    guest_pynvmf.install(g, check_import="pynvmf.tls.channel")
    yield g
    g.stop()


def _insert(guest: Guest, key: ConfiguredPsk, hostnqn: str, subnqn: str, version: int = 0) -> str:
    """nvme-cli puts the key's TLS PSK in the .nvme keyring; returns the identity."""
    out = guest.run(
        f"nvme gen-tls-key --secret {key.key.hex()} --hmac {key.hash_id} --hostnqn {hostnqn}"
        f" --subsysnqn {subnqn} --identity {version} --insert"
    ).output
    assert key.encode() in out, out  # the same interchange form
    keys = guest.run("cat /proc/keys").output
    pattern = rf"\spsk\s+(NVMe{version}R0\d {re.escape(hostnqn)} {re.escape(subnqn)}(?: \S+)?):"
    found = re.findall(pattern, keys)
    assert found, keys
    return found[0]


def test_identities_match_nvme_cli(guest: Guest) -> None:
    """nvme gen-tls-key names keys as pynvmf derives them (the NVMe1R0x digest depends on
    the retained PSK: libnvme 1.13's "compat" derivation, 1.16's the specification's) and
    nvme check-tls-key refuses a bad CRC as pynvmf does."""
    compat = guest.peer.tls_compat_keys
    for hash_id, size in ((HASH_SHA256, 32), (HASH_SHA384, 48)):
        key = ConfiguredPsk(hash_id, secrets.token_bytes(size))
        subnqn = f"{SUBNQN}-vectors-{hash_id}"
        for version in (0, 1):
            identity = _insert(guest, key, HOST3, subnqn, version)
            ours = tls_psk(key, HOST3, subnqn, version, compat=compat).identity.decode()
            assert identity == ours
            if version == 1:
                other = tls_psk(key, HOST3, subnqn, version, compat=not compat).identity
                assert identity != other.decode()
    good = ConfiguredPsk(HASH_SHA256, bytes(32)).encode()
    bad = good[:-9] + ("A" if good[-9] != "A" else "B") + good[-8:]
    assert guest.run(f"nvme check-tls-key --keydata '{bad}'", check=False).rc != 0
    with pytest.raises(PskError, match="CRC"):
        ConfiguredPsk.parse(bad)


def _tls_lines(target: Setup) -> list[str]:
    return [line for line in target.process.stderr().splitlines() if "pynvmf.tls" in line]


def test_discover_reports_treq_and_sectype(guest: Guest, target: Setup) -> None:
    out = guest.run(
        f"nvme discover -t tcp -a {Guest.host_address} -s {target.discovery} --hostnqn {HOST1}"
    ).output
    blocks = out.split("=====Discovery Log Entry")[1:]
    by_port = {re.search(r"trsvcid: (\d+)", b).group(1): b for b in blocks}  # type: ignore[union-attr]
    assert "treq:    required" in by_port[str(target.required)]
    assert "treq:    not required" in by_port[str(target.optional)]
    for port in (target.required, target.optional):
        assert "sectype: tls13" in by_port[str(port)]
    assert "sectype: none" in by_port[str(target.discovery)]


def _connect_tls(guest: Guest, port: int, hostnqn: str, *, tls: bool = True) -> int:
    return guest.run(
        f"timeout 120 nvme connect -t tcp -a {Guest.host_address} -s {port} -n {SUBNQN}"
        f" --hostnqn {hostnqn}{' --tls' if tls else ''}",
        check=False,
        timeout=150,
    ).rc


def _io_check(guest: Guest, nqn: str) -> None:
    dev = guest.run(
        "for i in $(seq 100); do for c in /sys/class/nvme/nvme*; do"
        f' [ "$(cat $c/subsysnqn 2>/dev/null)" = {nqn} ] && for n in $c/nvme*n*; do'
        ' d=/dev/$(basename $n | sed -E "s/c[0-9]+n/n/"); [ -b $d ] && { echo $d; exit 0; };'
        " done; done; sleep 0.1; done; exit 1"
    ).output.strip()
    guest.run(
        f"head -c 4194304 /dev/urandom > /tmp/data && dd if=/tmp/data of={dev} bs=1M"
        f" oflag=direct status=none && dd if={dev} of=/tmp/back bs=1M count=4 iflag=direct"
        " status=none && cmp /tmp/data /tmp/back",
        timeout=300,
    )
    out = guest.run(
        f"fio --name=v --filename={dev} --rw=randwrite --bs=4k --size=4M --iodepth=16"
        " --ioengine=libaio --direct=1 --verify=crc32c --do_verify=1",
        timeout=300,
    ).output
    assert "err= 0" in out, out


def test_linux_host_connects_over_tls(guest: Guest, target: Setup) -> None:
    _insert(guest, target.key1, HOST1, SUBNQN)
    before = len(_tls_lines(target))
    for port in (target.required, target.optional):
        assert _connect_tls(guest, port, HOST1) == 0, guest.run("dmesg | tail").output
        _io_check(guest, SUBNQN)
        guest.run(f"nvme disconnect -n {SUBNQN}")
    lines = _tls_lines(target)[before:]
    established = [line for line in lines if "TLS 1.3 established" in line]
    # Admin queue and two I/O queues (the guest has two CPUs), on each port.
    assert len(established) >= 2 * 3, lines
    assert all("TLS_AES_128_GCM_SHA256" in line and "NVMe0R01" in line for line in established)
    # The machine's kernel decides where records go; either way it is logged.
    assert all("records sent by" in line for line in established)
    closed = [x for x in target.process.stderr().splitlines() if "connection closed" in x]
    assert any("tls=ktls" in x or "tls=user" in x for x in closed)


def test_plain_and_wrong_connections(guest: Guest, target: Setup) -> None:
    # Plain NVMe/TCP to a port that requires TLS.
    assert _connect_tls(guest, target.required, HOST1, tls=False) != 0
    assert "the port requires TLS" in target.process.stderr()
    # A host with a PSK, in plain NVMe/TCP to a port that allows it: the port's TREQ
    # decides, as on nvmet (blktests nvme/062).
    assert _connect_tls(guest, target.optional, HOST1, tls=False) == 0
    _io_check(guest, SUBNQN)
    guest.run(f"nvme disconnect -n {SUBNQN}")
    # A host whose key the target does not have (the keyring holds another one for it).
    wrong = ConfiguredPsk(HASH_SHA256, secrets.token_bytes(32))
    _insert(guest, wrong, HOST3, SUBNQN)
    assert _connect_tls(guest, target.required, HOST3) != 0
    assert "no PSK for any identity offered" in target.process.stderr()
    # Debian 13's tlshd binds the SHA-384 key with SHA-256 (see the module's docstring);
    # sid's gets it right.
    _insert(guest, target.key2, HOST2, SUBNQN)
    if guest.peer.tlshd_sha384:
        before = len(_tls_lines(target))
        assert _connect_tls(guest, target.required, HOST2) == 0
        _io_check(guest, SUBNQN)
        guest.run(f"nvme disconnect -n {SUBNQN}")
        established = [x for x in _tls_lines(target)[before:] if "TLS 1.3 established" in x]
        assert established, _tls_lines(target)[before:]
        assert all("TLS_AES_256_GCM_SHA384" in x and "NVMe0R02" in x for x in established)
    else:
        assert _connect_tls(guest, target.required, HOST2) != 0
        assert "computes its binder with SHA256" in target.process.stderr()
    # The target still serves the host that has it right.
    assert _connect_tls(guest, target.required, HOST1) == 0
    _io_check(guest, SUBNQN)
    guest.run(f"nvme disconnect -n {SUBNQN}")


def _setup_nvmet_tls(guest: Guest, key: ConfiguredPsk) -> None:
    _insert(guest, key, HOST1, LINUX_NQN)
    port = guest.nvmet_port  # type: ignore[attr-defined]
    guest.run(
        "set -e; modprobe null_blk nr_devices=0 2>/dev/null || true\n"
        "B=/sys/kernel/config/nullb/tlsb; mkdir $B; echo 64 > $B/size\n"
        "echo 1 > $B/memory_backed; echo 1 > $B/power\n"
        f"N=/sys/kernel/config/nvmet; S=$N/subsystems/{LINUX_NQN}\n"
        "mkdir $S; echo 1 > $S/attr_allow_any_host; mkdir $S/namespaces/1\n"
        "printf /dev/tlsb > $S/namespaces/1/device_path; echo 1 > $S/namespaces/1/enable\n"
        "P=$N/ports/77; mkdir $P; echo tcp > $P/addr_trtype; echo ipv4 > $P/addr_adrfam\n"
        f"echo 0.0.0.0 > $P/addr_traddr; echo {port} > $P/addr_trsvcid\n"
        "echo tls1.3 > $P/addr_tsas; test $(cat $P/addr_treq) = required\n"
        f"ln -s $S $P/subsystems/{LINUX_NQN}\n"
    )


async def _host_round_trip(port: int, key: ConfiguredPsk, compat: bool) -> str:
    ctrl = await connect(
        "127.0.0.1",
        port,
        LINUX_NQN,
        hostnqn=HOST1,
        tls_psk=key.encode(),
        tls_compat=compat,
        queues=2,
        timeout=TIMEOUT,
    )
    try:
        ns = ctrl.namespaces[1]
        data = os.urandom(MIB)
        await ns.write(0, data)
        back = bytearray(len(data))
        await ns.read(0, memoryview(back))
        assert bytes(back) == data
        engines = [q.tls.engine for q in [ctrl.admin, *ctrl.io_queues] if q and q.tls]
        assert len(engines) == 3
        assert all(
            e.suite is not None and e.suite.name == "TLS_AES_128_GCM_SHA256" for e in engines
        )
        return ctrl.io_queues[0].tls.offload  # type: ignore[union-attr]
    finally:
        await ctrl.close()


def test_pynvmf_host_against_the_linux_target(guest: Guest) -> None:
    key = ConfiguredPsk(HASH_SHA256, secrets.token_bytes(32))
    _setup_nvmet_tls(guest, key)
    port = guest.nvmet_port  # type: ignore[attr-defined]
    # nvme-cli derived the target's key as its libnvme does.
    compat = guest.peer.tls_compat_keys
    offload = asyncio.run(_host_round_trip(port, key, compat=compat))
    assert offload in ("ktls", "user")
    with pytest.raises(NvmeConnectionError):
        asyncio.run(_host_round_trip(port, key, compat=not compat))
    with pytest.raises(NvmeConnectionError):
        asyncio.run(_host_round_trip(port, ConfiguredPsk(HASH_SHA256, bytes(32)), compat=compat))
    # nvmet still serves the right key after the failures.
    asyncio.run(_host_round_trip(port, key, compat=compat))
    assert "TLS handshake complete, error" not in guest.run("dmesg | grep -i nvmet || true").output


GUEST_HOST_SCRIPT = """
import asyncio, os, sys
from pynvmf.host import connect

async def main():
    ctrl = await connect("127.0.0.1", int(sys.argv[1]), sys.argv[2], hostnqn=sys.argv[3],
                         tls_psk=sys.argv[4], tls_compat=sys.argv[5] == "compat", queues=2,
                         timeout=60)
    ns = ctrl.namespaces[1]
    data = os.urandom(4 << 20)
    await ns.write(0, data)
    back = bytearray(len(data))
    await ns.read(0, memoryview(back))
    assert bytes(back) == data
    for q in [ctrl.admin, *ctrl.io_queues]:
        print("offload", q.tls.offload, q.tls.engine.suite.name)
    await ctrl.close()

asyncio.run(main())
"""


def test_ktls_on_pynvmf_side_in_the_guest(guest: Guest) -> None:
    """pynvmf in the guest, whose kernel has kTLS: its host library against nvmet, and the
    kernel's host against its target, with both directions' records in the kernel."""
    key = ConfiguredPsk(HASH_SHA256, secrets.token_bytes(32))
    if "tls-linux-target" not in guest.run("ls /sys/kernel/config/nvmet/subsystems").output:
        _setup_nvmet_tls(guest, key)
    else:
        _insert(guest, key, HOST1, LINUX_NQN)
    guest.write_file("/tmp/host.py", GUEST_HOST_SCRIPT)
    out = guest.run(
        f"cd /tmp && PYTHONPATH=/opt/pynvmf python3 /tmp/host.py {guest.nvmet_port}"  # type: ignore[attr-defined]
        f" {LINUX_NQN} {HOST1} '{key.encode()}'"
        f" {'compat' if guest.peer.tls_compat_keys else 'specification'}",
        timeout=300,
    ).output
    assert out.count("offload ktls TLS_AES_128_GCM_SHA256") == 3, out
    # The kernel host against pynvmf's target in the guest.
    subnqn = f"{SUBNQN}-guest"
    config = {
        "ports": [
            {"address": "127.0.0.1", "port": GUEST_TARGET_PORT, "secure_channel": "required"}
        ],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": subnqn,
                "hosts": [{"nqn": HOST1, "psk": key.encode()}],
                "namespaces": [{"nsid": 1, "memory": "64M"}],
            }
        ],
    }
    guest.write_file("/tmp/target.json", json.dumps(config), mode=0o600)
    # One process: the guest's Python is Debian's with python3-cryptography alone, and the
    # worker processes of --cores need posix_ipc (a compiled dependency it does not have).
    guest.run(
        "cd /tmp && (PYTHONPATH=/opt/pynvmf python3 -m pynvmf target --config /tmp/target.json"
        " --cores 1 -v > /tmp/target.out 2> /tmp/target.err & echo $! > /tmp/target.pid)\n"
        "for i in $(seq 300); do grep -q ready /tmp/target.out && exit 0; sleep 0.2; done;"
        " cat /tmp/target.err; exit 1",
        timeout=120,
    )
    _insert(guest, key, HOST1, subnqn)
    guest.run(
        f"nvme connect -t tcp -a 127.0.0.1 -s {GUEST_TARGET_PORT} -n {subnqn}"
        f" --hostnqn {HOST1} --tls",
        timeout=150,
    )
    _io_check(guest, subnqn)
    guest.run(f"nvme disconnect -n {subnqn}")
    log = guest.run("sleep 1; cat /tmp/target.err").output
    established = [x for x in log.splitlines() if "TLS 1.3 established" in x]
    assert len(established) >= 3 and all("by the kernel (kTLS)" in x for x in established), log
    assert log.count("TLS receive by the kernel") >= 3, log
    closed = [x for x in log.splitlines() if "connection closed" in x]
    assert closed and all("tls=ktls" in x for x in closed), log
    assert key.encode() not in log
    guest.run("kill $(cat /tmp/target.pid)")


KTLS_SCRIPT = """
import os, socket, sys
from pynvmf.tls import channel as C
from pynvmf.tls import engine as E
from pynvmf.tls import ktls as K
from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, TlsPsk

for hash_id, size in ((HASH_SHA256, 32), (HASH_SHA384, 48)):
    psk = TlsPsk(b"NVMe0R0%d h s" % hash_id, hash_id, os.urandom(size))
    lsock = socket.create_server(("127.0.0.1", 0))
    csock = socket.create_connection(lsock.getsockname())
    ssock, _ = lsock.accept()
    client, server = E.TlsEngine.client(psk), E.TlsEngine.server(lambda i: [psk])
    client.start()
    csock.sendall(b"".join(client.take_output()))  # ClientHello
    flight = []
    while not flight:
        server.feed(ssock.recv(65536))
        flight = server.take_output()
    ssock.sendall(b"".join(flight))  # ServerHello, EncryptedExtensions, Finished
    while not client.established:
        client.feed(csock.recv(65536))
    csock.sendall(b"".join(client.take_output()))  # Finished
    while not server.established:
        server.feed(ssock.recv(65536))
    # The client's record layer into the kernel, both directions.
    tx, rx = client.traffic()
    assert K.ktls_attach(csock) == "", "no ULP"
    assert K.ktls_set(csock, K.TLS_TX, tx) == "" and K.ktls_set(csock, K.TLS_RX, rx) == ""
    payload = os.urandom(100000)
    csock.sendall(payload)  # the kernel seals
    got = b""
    while len(got) < len(payload):
        got += b"".join(bytes(x) for x in server.feed(ssock.recv(65536)))
    assert got == payload, "kernel TX"
    for r in server.protect([payload]):
        ssock.sendall(r)
    back = b""
    while len(back) < len(payload):
        back += csock.recv(65536)  # the kernel opens
    assert back == payload, "kernel RX"
    # A control record (close_notify) on the kernel's receive path: recv fails with EIO.
    server.close()
    for r in server.take_output():
        ssock.sendall(r)
    try:
        csock.recv(65536)
        print("no error")
    except OSError as exc:
        assert C.kernel_record_error(exc), exc
        print("ktls ok", tx.suite.name)
"""


def test_ktls_crypto_info_and_control_records(guest: Guest) -> None:
    """The kernel takes pynvmf's keys, IVs and sequence numbers for both suites (what it
    seals pynvmf's engine opens, and the reverse), and an alert reaching the kernel's
    receive path fails recv() with EIO, which the glue ends the connection on."""
    guest.write_file("/tmp/ktls.py", KTLS_SCRIPT)
    out = guest.run("cd /tmp && PYTHONPATH=/opt/pynvmf python3 /tmp/ktls.py", timeout=300).output
    assert "ktls ok TLS_AES_128_GCM_SHA256" in out and "ktls ok TLS_AES_256_GCM_SHA384" in out, out
