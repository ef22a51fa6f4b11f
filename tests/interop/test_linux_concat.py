"""Secure channel concatenation (DH-HMAC-CHAP generating the TLS PSK of every queue) with
the Linux kernel as the peer, both ways, in one guest boot per peer that has it (kernel
6.15+: the peers are chosen by their kernel's version).

- The kernel's host (`nvme connect --dhchap-secret ... --concat`, tlshd for the handshakes)
  against a `pynvmf target` process (a listener that takes plain and TLS connections, the
  host with a DH-HMAC-CHAP key and no TLS PSK): SHA-256/ffdhe2048 and SHA-384/ffdhe3072,
  every queue over TLS with the generated ``NVMe1G0x`` identity, direct I/O and fio verify,
  a controller reset (a new PSK), a re-authentication with a rotated secret written to
  sysfs (REPLACETLSPSK), and the host asking for it on a listener without TLS (refused:
  secure channel concatenation mismatch) while a concatenated host keeps doing I/O. The
  target runs with its default `--cores` (worker processes: the TLS queues stay in the main
  process).
- pynvmf's host library (`connect(..., concat=True)`) against the kernel's nvmet (configfs:
  the host's dhchap_key, hash and group; the port's addr_tsas tls1.3 and addr_treq "not
  required"; tlshd answering the handshakes): both hashes, the
  generated identity equal to the one nvmet put in its ``.nvme`` keyring, I/O, and a
  re-authentication over TLS (REPLACETLSPSK). Found: with a bidirectional authentication
  nvmet 7.2 generates no PSK (see test_host_library_bidirectional_concatenation_and_nvmet).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.auth.keys import DhchapKey
from pynvmf.host import connect
from pynvmf.host.errors import NvmeConnectionError
from pynvmf.rpc.client import RpcClient
from tests.interop.test_linux_host import DEV_FOR
from tests.interop.test_linux_tls import TLSHD_CONF
from tests.support.guest import CONCATENATION, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = CONCATENATION.mark()

MIB = 1 << 20
HOST_ID = "5a2e8f40-7c1d-4e9b-a3f6-0d8c2b1ec0c0"
HOST = f"nqn.2014-08.org.nvmexpress:uuid:{HOST_ID}"
PREFIX = "nqn.2024-11.dev.pynvmf:concat"
# pynvmf's subsystems: name -> (hash, DH group, TLS cipher suite it leads to)
EXPORTS = {
    "sha256": ("sha256", "ffdhe2048", "TLS_AES_128_GCM_SHA256"),
    "sha384": ("sha384", "ffdhe3072", "TLS_AES_256_GCM_SHA384"),
}
ROTATE = f"{PREFIX}-rotate"
NVMET_NQN = "nqn.2024-11.dev.pynvmf:nvmet-concat"
NVMET = "/sys/kernel/config/nvmet"
WAIT_S = 120.0  # a TCG guest is slow
TIMEOUT = 60.0


def _nqn(name: str) -> str:
    return f"{PREFIX}-{name}"


def _key_file(path: Path, key: DhchapKey) -> str:
    path.write_text(key.representation() + "\n")
    path.chmod(0o600)
    return str(path)


@dataclass
class Setup:
    process: TargetProcess
    port: int  # plain and TLS ("optional")
    plain: int  # no TLS
    rpc: str
    workdir: Path
    host_key: DhchapKey


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp(f"linux-concat-{linux_peer.name}")
    host_key = DhchapKey.generate(32)
    port, plain = free_tcp_port(), free_tcp_port()
    rpc = str(workdir / "rpc.sock")
    subsystems: list[dict[str, object]] = [
        {
            "nqn": _nqn(name),
            "hosts": [
                {"nqn": HOST, "dhchap_key": "host", "dhchap_hash": [h], "dhchap_dhgroup": [g]}
            ],
            "namespaces": [{"nsid": 1, "memory": 16 * MIB}],
        }
        for name, (h, g, _suite) in EXPORTS.items()
    ]
    subsystems.append(
        {
            "nqn": ROTATE,
            "hosts": [{"nqn": HOST, "dhchap_key": "host"}],
            "namespaces": [{"nsid": 1, "memory": 16 * MIB}],
        }
    )
    config = {
        "keyring": [{"name": "host", "path": _key_file(workdir / "host.key", host_key)}],
        "ports": [
            {"address": "127.0.0.1", "port": port, "secure_channel": "optional"},
            {"address": "127.0.0.1", "port": plain},
        ],
        "discovery_ports": [],
        "subsystems": subsystems,
    }
    proc = TargetProcess(config, workdir, ["--rpc-socket", rpc])
    proc.start()
    yield Setup(proc, port, plain, rpc, workdir, host_key)
    proc.stop()
    log = proc.stderr()
    assert host_key.representation().split(":")[2][:20] not in log
    assert host_key.secret.hex()[:20] not in log


@pytest.fixture(scope="module")
def nvmet_port() -> int:
    return free_tcp_port()


@pytest.fixture(scope="module")
def guest(target: Setup, nvmet_port: int, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(
        extra_files={"/usr/local/bin/dev-for": DEV_FOR},
        hostfwd=[nvmet_port],
        peer=linux_peer,
        memory_mb=1536,
    )
    g.start()
    g.run(
        "modprobe tls && modprobe nvme-tcp && modprobe nvmet-tcp && modprobe nvme-keyring"
        " && modprobe nvme-auth"
    )
    g.write_file("/etc/tlshd.conf", TLSHD_CONF)
    g.run("(tlshd > /tmp/tlshd.log 2>&1 &) ; sleep 0.5; busybox pidof tlshd || pidof tlshd")
    yield g
    g.stop()


# -- helpers ---------------------------------------------------------------------------------


def _connect(guest: Guest, port: int, nqn: str, secret: str) -> tuple[bool, str]:
    result = guest.run(
        f"timeout 150 nvme connect -t tcp -a {Guest.host_address} -s {port} -n {nqn}"
        f" --hostnqn={HOST} --hostid={HOST_ID} --dhchap-secret={shlex.quote(secret)} --concat",
        check=False,
        timeout=180,
    )
    return result.ok, result.output


def _disconnect(guest: Guest, nqn: str) -> None:
    out = guest.run(f"nvme disconnect -n {nqn}").output
    assert "disconnected 1 controller" in out


def _ctrl_of(guest: Guest, nqn: str) -> str:
    out = guest.run(
        f'for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn)" = {nqn} ] && basename $c;'
        " done; true"
    ).output.split()
    assert len(out) == 1, out
    return out[0]


def _tls_key(guest: Guest, ctrl: str) -> str:
    """The serial of the key the controller's TLS channel uses (sysfs tls_key)."""
    return guest.run(f"cat /sys/class/nvme/{ctrl}/tls_key").output.strip()


def _io_check(guest: Guest, nqn: str, seed: int) -> None:
    """Direct I/O through the block device and fio verify: the TLS queues carry data."""
    dev = guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()
    guest.run(
        f"head -c 1048576 /dev/urandom > /tmp/p{seed} && "
        f"dd if=/tmp/p{seed} of={dev} bs=64k seek={seed} oflag=direct conv=fsync status=none && "
        f"dd if={dev} of=/tmp/r{seed} bs=64k skip={seed} count=16 iflag=direct status=none && "
        f"cmp /tmp/p{seed} /tmp/r{seed}",
        timeout=300,
    )
    out = guest.run(
        f"fio --name=v --filename={dev} --rw=randwrite --bs=4k --size=4M --iodepth=16"
        " --ioengine=libaio --direct=1 --verify=crc32c --do_verify=1",
        timeout=600,
    ).output
    assert "err= 0" in out, out


def _count(target: Setup, pattern: str) -> int:
    return len(re.findall(pattern, target.process.stderr()))


NEW = rf"host {re.escape(HOST)}: authenticated \((\S+), (\S+), NEW_TLS_PSK"
REPLACE = rf"host {re.escape(HOST)}: authenticated \((\S+), (\S+), REPLACE_TLS_PSK"


def _established(target: Setup, suite: str, hash_id: int) -> int:
    return _count(target, rf"TLS 1.3 established: {suite}, \S+ \S+, identity NVMe1G0{hash_id}")


# -- the Linux host against pynvmf's target --------------------------------------------------


@pytest.mark.parametrize("name", list(EXPORTS))
def test_linux_host_concatenates_and_resets(guest: Guest, target: Setup, name: str) -> None:
    hash_name, group, suite = EXPORTS[name]
    hash_id = 1 if hash_name == "sha256" else 2
    nqn = _nqn(name)
    guest.run("dmesg -C")
    new_before = _count(target, NEW)
    tls_before = _established(target, suite, hash_id)
    ok, out = _connect(guest, target.port, nqn, target.host_key.representation())
    assert ok, out + guest.run("dmesg | tail -30").output
    try:
        ctrl = _ctrl_of(guest, nqn)
        first = _tls_key(guest, ctrl)
        assert first and first != "0", first
        dmesg = guest.run("dmesg").output
        assert f"authenticated with hash hmac({hash_name}) dhgroup {group}" in dmesg, dmesg
        assert re.findall(NEW, target.process.stderr())[new_before:] == [(hash_name, group)]
        # The TLS admin queue and the I/O queues (one per guest CPU, two), none asked to
        # authenticate.
        assert _established(target, suite, hash_id) - tls_before >= 3
        _io_check(guest, nqn, 3)
        # A reset: the host revokes its PSK, authenticates again and gets a new one.
        guest.run(f"nvme reset /dev/{ctrl}", timeout=180)
        target.process.wait_log(NEW, new_before + 2, WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while _tls_key(guest, ctrl) in ("", first) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _tls_key(guest, ctrl) not in ("", first)
        _io_check(guest, nqn, 5)
    finally:
        _disconnect(guest, nqn)


def test_linux_host_reauthenticates_with_a_rotated_secret(guest: Guest, target: Setup) -> None:
    new_key = DhchapKey.generate(48)
    ok, out = _connect(guest, target.port, ROTATE, target.host_key.representation())
    assert ok, out
    try:
        ctrl = _ctrl_of(guest, ROTATE)
        path = _key_file(target.workdir / "host2.key", new_key)
        with RpcClient(target.rpc) as rpc:
            rpc.call("keyring_file_add_key", name="host2", path=path)
            rpc.call("nvmf_subsystem_set_keys", nqn=ROTATE, host=HOST, dhchap_key="host2")
        replaced = _count(target, REPLACE)
        # The new secret in sysfs: the host re-authenticates its admin queue, over TLS, and
        # asks for a PSK that replaces the channel's (REPLACETLSPSK).
        guest.run(
            f"printf %s {shlex.quote(new_key.representation())} > "
            f"/sys/class/nvme/{ctrl}/dhchap_secret"
        )
        target.process.wait_log(REPLACE, replaced + 1, WAIT_S)
        _io_check(guest, ROTATE, 7)
        assert _ctrl_of(guest, ROTATE) == ctrl  # the same controller, not a reconnect
        # A reset after that: a new authentication with the new secret.
        new = _count(target, NEW)
        guest.run(f"nvme reset /dev/{ctrl}", timeout=180)
        target.process.wait_log(NEW, new + 1, WAIT_S)
        _io_check(guest, ROTATE, 9)
    finally:
        _disconnect(guest, ROTATE)


def test_linux_host_concatenation_on_a_listener_without_tls(guest: Guest, target: Setup) -> None:
    nqn = _nqn("sha256")
    ok, out = _connect(guest, target.port, nqn, target.host_key.representation())
    assert ok, out
    try:
        refused = _count(target, r"NEWTLSPSK on a listener without TLS")
        ok, out = _connect(guest, target.plain, _nqn("sha384"), target.host_key.representation())
        assert not ok, out
        target.process.wait_log(r"NEWTLSPSK on a listener without TLS", refused + 1, WAIT_S)
        assert "CONCAT_MISMATCH" in target.process.stderr()
        # The concatenated host did not notice.
        _io_check(guest, nqn, 11)
    finally:
        _disconnect(guest, nqn)


# -- pynvmf's host library against the kernel's target ----------------------------------------


@dataclass
class Nvmet:
    port: int
    host_key: DhchapKey
    ctrl_key: DhchapKey


def _nvmet_host_attrs(guest: Guest, attrs: dict[str, str]) -> None:
    h = f"{NVMET}/hosts/{HOST}"
    guest.run("\n".join(f"printf %s {shlex.quote(v)} > {h}/dhchap_{k}" for k, v in attrs.items()))


@pytest.fixture(scope="module")
def nvmet(guest: Guest, nvmet_port: int) -> Nvmet:
    """nvmet exporting a null_blk namespace to HOST on a port that takes plain and TLS
    connections (tsas tls1.3, treq "not required"), HOST with DH-HMAC-CHAP keys."""
    host_key = DhchapKey.generate(32)
    ctrl_key = DhchapKey.generate(48)
    s = f"{NVMET}/subsystems/{NVMET_NQN}"
    guest.run(
        "set -e; modprobe nvmet; modprobe null_blk nr_devices=0 2>/dev/null || true\n"
        "B=/sys/kernel/config/nullb/concatb; mkdir $B; echo 64 > $B/size\n"
        "echo 1 > $B/memory_backed; echo 1 > $B/power\n"
        f"mkdir {s}; echo 0 > {s}/attr_allow_any_host; mkdir {s}/namespaces/1\n"
        f"printf /dev/concatb > {s}/namespaces/1/device_path; echo 1 > {s}/namespaces/1/enable\n"
        f"mkdir -p {NVMET}/hosts/{HOST}; ln -s {NVMET}/hosts/{HOST} {s}/allowed_hosts/{HOST}\n"
        f"P={NVMET}/ports/88; mkdir $P; echo tcp > $P/addr_trtype; echo ipv4 > $P/addr_adrfam\n"
        f"echo 0.0.0.0 > $P/addr_traddr; echo {nvmet_port} > $P/addr_trsvcid\n"
        "echo tls1.3 > $P/addr_tsas; echo 'not required' > $P/addr_treq\n"
        f"ln -s {s} $P/subsystems/{NVMET_NQN}\n"
    )
    _nvmet_host_attrs(guest, {"key": host_key.representation()})
    return Nvmet(nvmet_port, host_key, ctrl_key)


async def _library_concat(guest: Guest, nvmet: Nvmet, suite: str, **keys: object) -> None:
    async with await connect(
        "127.0.0.1",
        nvmet.port,
        NVMET_NQN,
        hostnqn=HOST,
        queues=2,
        timeout=TIMEOUT,
        concat=True,
        dhchap_secret=nvmet.host_key.representation(),
        **keys,
    ) as ctrl:
        psk = ctrl.tls_psk
        assert psk is not None and psk.generated
        engines = [q.tls.engine for q in [ctrl.admin, *ctrl.io_queues] if q and q.tls]
        assert len(engines) == 3
        assert all(e.suite is not None and e.suite.name == suite for e in engines)
        # nvmet put the PSK it generated in its .nvme keyring under the identity it derived:
        # the same as ours (the digest in it comes from the generated PSK).
        keys_now = guest.run("cat /proc/keys").output
        assert psk.identity.decode() in keys_now, keys_now
        data = os.urandom(256 * 1024)
        ns = ctrl.namespace(1)
        await ns.write(0, data)
        buf = bytearray(len(data))
        await ns.read(0, memoryview(buf))
        assert buf == data
        # Re-authentication over TLS: REPLACETLSPSK, a new PSK nvmet holds too.
        await ctrl.reauthenticate()
        new = ctrl.tls_psk
        assert new is not None and new.identity != psk.identity
        assert new.identity.decode() in guest.run("cat /proc/keys").output
        await ns.read(0, memoryview(buf))
        assert buf == data


@pytest.mark.parametrize(
    ("hash_name", "dhgroup", "suite"),
    [
        ("hmac(sha256)", "ffdhe2048", "TLS_AES_128_GCM_SHA256"),
        ("hmac(sha384)", "ffdhe3072", "TLS_AES_256_GCM_SHA384"),
    ],
)
def test_host_library_concatenates_to_the_linux_target(
    guest: Guest, nvmet: Nvmet, hash_name: str, dhgroup: str, suite: str
) -> None:
    # nvmet holds a controller key too: with S2 0 (no controller authentication, what
    # Linux's host does with --concat) it sends no R2 and generates the PSK at the Reply.
    _nvmet_host_attrs(
        guest,
        {"hash": hash_name, "dhgroup": dhgroup, "ctrl_key": nvmet.ctrl_key.representation()},
    )
    guest.run("dmesg -C")
    asyncio.run(_library_concat(guest, nvmet, suite))
    trouble = re.findall(r".*(?:failed|error|mismatch).*", guest.run("dmesg").output, re.I)
    assert not trouble, trouble


def test_host_library_bidirectional_concatenation_and_nvmet(guest: Guest, nvmet: Nvmet) -> None:
    """With the controller's secret as well, pynvmf's host authenticates the controller
    (S2 set; the PSK comes with Success2, as the specification and pynvmf's target have it).
    Linux 7.2's nvmet verifies the host, sends a correct R2 (over SC_C) and then generates no
    PSK: it frees C1, C2 and the session key once Success1 is out ("failed to generate PSK,
    error -22"), so the TLS connection that follows finds no key. Asserted, so that a
    fixed nvmet shows; the host's error says what to do."""
    _nvmet_host_attrs(
        guest,
        {
            "hash": "hmac(sha256)",
            "dhgroup": "ffdhe2048",
            "ctrl_key": nvmet.ctrl_key.representation(),
        },
    )
    guest.run("dmesg -C")
    with pytest.raises(NvmeConnectionError, match="generates none then"):
        asyncio.run(
            _library_concat(
                guest,
                nvmet,
                "TLS_AES_128_GCM_SHA256",
                dhchap_ctrl_secret=nvmet.ctrl_key.representation(),
            )
        )
    assert "failed to generate PSK" in guest.run("dmesg").output
    # Without the controller secret the same host and target concatenate.
    asyncio.run(_library_concat(guest, nvmet, "TLS_AES_128_GCM_SHA256"))
