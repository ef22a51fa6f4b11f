"""DH-HMAC-CHAP with the Linux 6.12 and 7 kernels as the peer, both ways, in one guest boot
per peer (and a target process of its own: the rotation test changes its keys).

- The kernel's NVMe/TCP host (nvme-cli's `nvme connect --dhchap-secret` and
  `--dhchap-ctrl-secret`) authenticates to pynvmf's target (a `pynvmf target` process with
  its keys in key files and its control plane on a socket): unidirectional and
  bidirectional, three hash/group pairs, I/O after each connect; a wrong host key, a wrong
  controller key and no key at all refused while an authenticated host keeps doing I/O; a
  key rotated over the RPC (nvmf_subsystem_set_keys) taking effect when the host
  re-authenticates (the new secret written to its sysfs dhchap_secret).
- pynvmf's host library authenticates to the kernel's nvmet (configfs host attributes
  dhchap_key, dhchap_ctrl_key, dhchap_hash, dhchap_dhgroup) and re-authenticates; a wrong
  key and a wrong controller key fail as the specification says.

The 6.12 and 7 peers run this module, not 6.1: its nvme-cli 2.3 has no DH-HMAC-CHAP options
and Debian's 6.1 kernel has no nvmet authentication (Peer.dhchap is False for it).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.auth.keys import DhchapKey
from pynvmf.host import NvmeAuthenticationError, NvmeConnectionError, connect
from pynvmf.rpc.client import RpcClient
from pynvmf.spec.auth import FailureExplanation
from tests.interop.test_linux_host import DEV_FOR
from tests.support.guest import SECURE_CHANNEL, Guest, Peer, setup_kernel_target
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = SECURE_CHANNEL.mark()

MIB = 1 << 20
HOST_ID = "5a2e8f40-7c1d-4e9b-a3f6-0d8c2b1e4f70"
HOST = f"nqn.2014-08.org.nvmexpress:uuid:{HOST_ID}"
OTHER_ID = "5a2e8f40-7c1d-4e9b-a3f6-0d8c2b1e4f71"
OTHER = f"nqn.2014-08.org.nvmexpress:uuid:{OTHER_ID}"
PREFIX = "nqn.2024-11.dev.pynvmf:auth"
# pynvmf's subsystems: (name, hashes, DH groups, bidirectional)
EXPORTS = {
    "sha256-2048": (["sha256"], ["ffdhe2048"], False),
    "sha384-null": (["sha384"], ["null"], True),
    "sha512-4096": (["sha512"], ["ffdhe4096"], True),
}
ROTATE = f"{PREFIX}-rotate"
NVMET_NQN = "nqn.2024-11.dev.pynvmf:nvmet-auth"
NVMET = "/sys/kernel/config/nvmet"
# The kernel's own words for a queue that authenticated (drivers/nvme/host/auth.c).
KERNEL_AUTHENTICATED = re.compile(r"qid 0: authenticated with hash (\S+) dhgroup (\S+)")
WAIT_S = 60.0


def _nqn(name: str) -> str:
    return f"{PREFIX}-{name}"


def _key_file(path: Path, key: DhchapKey) -> str:
    path.write_text(key.representation() + "\n")
    path.chmod(0o600)
    return str(path)


@dataclass
class Setup:
    process: TargetProcess
    port: int
    rpc: str
    workdir: Path
    host_key: DhchapKey
    ctrl_key: DhchapKey


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp(f"linux-auth-{linux_peer.name}")
    host_key = DhchapKey.generate(32)
    ctrl_key = DhchapKey.generate(48)
    port = free_tcp_port()
    rpc = str(workdir / "rpc.sock")
    subsystems = []
    for name, (hashes, groups, bidirectional) in EXPORTS.items():
        host: dict[str, object] = {
            "nqn": HOST,
            "dhchap_key": "host",
            "dhchap_hash": hashes,
            "dhchap_dhgroup": groups,
        }
        if bidirectional:
            host["dhchap_ctrl_key"] = "ctrl"
        subsystems.append(
            {
                "nqn": _nqn(name),
                "hosts": [host, OTHER],
                "namespaces": [{"nsid": 1, "memory": 16 * MIB}],
            }
        )
    subsystems.append(
        {
            "nqn": ROTATE,
            "hosts": [{"nqn": HOST, "dhchap_key": "host", "dhchap_ctrl_key": "ctrl"}],
            "namespaces": [{"nsid": 1, "memory": 16 * MIB}],
        }
    )
    config = {
        "keyring": [
            {"name": "host", "path": _key_file(workdir / "host.key", host_key)},
            {"name": "ctrl", "path": _key_file(workdir / "ctrl.key", ctrl_key)},
        ],
        "ports": [{"address": "127.0.0.1", "port": port}],
        "discovery_ports": [],
        "subsystems": subsystems,
    }
    proc = TargetProcess(config, workdir, ["--rpc-socket", rpc])
    proc.start()
    yield Setup(proc, port, rpc, workdir, host_key, ctrl_key)
    proc.stop()
    log = proc.stderr()
    for key in (host_key, ctrl_key):
        assert key.representation().split(":")[2][:20] not in log
        assert key.secret.hex()[:20] not in log


@pytest.fixture(scope="module")
def nvmet_port() -> int:
    return free_tcp_port()


@pytest.fixture(scope="module")
def guest(target: Setup, nvmet_port: int, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(
        extra_files={"/usr/local/bin/dev-for": DEV_FOR}, hostfwd=[nvmet_port], peer=linux_peer
    )
    g.start()
    yield g
    g.stop()


def _connect(
    guest: Guest,
    target: Setup,
    nqn: str,
    secret: str | None,
    ctrl_secret: str | None = None,
    *,
    host: str = HOST,
    hostid: str = HOST_ID,
) -> tuple[bool, str]:
    cmd = (
        f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {nqn}"
        f" --hostnqn={host} --hostid={hostid}"
    )
    if secret is not None:
        cmd += f" --dhchap-secret={shlex.quote(secret)}"
    if ctrl_secret is not None:
        cmd += f" --dhchap-ctrl-secret={shlex.quote(ctrl_secret)}"
    result = guest.run(cmd, check=False, timeout=180)
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


def _io_round_trip(guest: Guest, nqn: str, seed: int) -> None:
    """Write 1 MiB of a pattern through the block device and read it back, uncached."""
    dev = guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()
    guest.run(
        f"head -c 1048576 /dev/urandom > /tmp/p{seed} && "
        f"dd if=/tmp/p{seed} of={dev} bs=64k seek={seed} oflag=direct conv=fsync status=none && "
        f"dd if={dev} of=/tmp/r{seed} bs=64k skip={seed} count=16 iflag=direct status=none && "
        f"cmp /tmp/p{seed} /tmp/r{seed}"
    )


def _count(target: Setup, pattern: str) -> int:
    return len(re.findall(pattern, target.process.stderr()))


# -- the Linux host against pynvmf's target --------------------------------------------------


@pytest.mark.parametrize("name", list(EXPORTS))
def test_linux_host_authenticates_and_does_io(guest: Guest, target: Setup, name: str) -> None:
    hashes, groups, bidirectional = EXPORTS[name]
    nqn = _nqn(name)
    guest.run("dmesg -C")
    before = _count(target, rf"host {re.escape(HOST)}: authenticated \({hashes[0]}, {groups[0]}")
    ok, out = _connect(
        guest,
        target,
        nqn,
        target.host_key.representation(),
        target.ctrl_key.representation() if bidirectional else None,
    )
    assert ok, out
    try:
        _io_round_trip(guest, nqn, 3)
        kernel = KERNEL_AUTHENTICATED.search(guest.run("dmesg").output)
        assert kernel is not None and kernel.groups() == (f"hmac({hashes[0]})", groups[0])
        if bidirectional:
            assert "qid 0: controller authenticated" in guest.run("dmesg").output
        # Every queue (admin and I/O) authenticated, each with the configured pair.
        pattern = rf"host {re.escape(HOST)}: authenticated \({hashes[0]}, {groups[0]}"
        pattern += r", bidirectional\)" if bidirectional else r"\)"
        got = _count(target, pattern) - before
        assert got >= 2, target.process.stderr()[-3000:]  # admin + at least one I/O queue
    finally:
        _disconnect(guest, nqn)


def test_wrong_keys_and_no_key_are_refused_and_others_keep_working(
    guest: Guest, target: Setup
) -> None:
    nqn = _nqn("sha512-4096")
    # No key at all on a subsystem that requires one: the kernel cannot go on. (First:
    # while a controller of this host NQN is connected, libnvme takes its secret from
    # that controller's sysfs dhchap_secret when none is given.)
    ok, out = _connect(guest, target, nqn, None)
    assert not ok, out
    good = _nqn("sha384-null")
    ok, out = _connect(
        guest, target, good, target.host_key.representation(), target.ctrl_key.representation()
    )
    assert ok, out
    try:
        wrong = DhchapKey.generate(32).representation()
        failed_before = _count(target, r"authentication failed \(FAILED\)")
        ok, out = _connect(guest, target, nqn, wrong)
        assert not ok, out
        target.process.wait_log(r"authentication failed \(FAILED\): the host's response", 1, WAIT_S)
        # The right host key with a wrong controller key: the host refuses the controller.
        host_refusals = _count(target, r"the host failed the authentication \(FAILED\)")
        ok, out = _connect(
            guest,
            target,
            nqn,
            target.host_key.representation(),
            DhchapKey.generate(48).representation(),
        )
        assert not ok, out
        target.process.wait_log(
            r"the host failed the authentication \(FAILED\)", host_refusals + 1, WAIT_S
        )
        # Another host listed without a key is not asked to authenticate.
        ok, out = _connect(guest, target, nqn, None, host=OTHER, hostid=OTHER_ID)
        assert ok, out
        _io_round_trip(guest, nqn, 5)
        _disconnect(guest, nqn)
        # None of that disturbed the authenticated host.
        _io_round_trip(guest, good, 7)
        assert _count(target, r"authentication failed \(FAILED\)") > failed_before
        assert guest.run("ls /sys/class/nvme | wc -l").output.strip() == "1"
    finally:
        _disconnect(guest, good)


def test_rotated_key_applies_when_the_host_reauthenticates(guest: Guest, target: Setup) -> None:
    new_key = DhchapKey.generate(64)
    ok, out = _connect(
        guest, target, ROTATE, target.host_key.representation(), target.ctrl_key.representation()
    )
    assert ok, out
    try:
        ctrl = _ctrl_of(guest, ROTATE)
        path = _key_file(target.workdir / "host2.key", new_key)
        with RpcClient(target.rpc) as rpc:
            rpc.call("keyring_file_add_key", name="host2", path=path)
            rpc.call(
                "nvmf_subsystem_set_keys",
                nqn=ROTATE,
                host=HOST,
                dhchap_key="host2",
                dhchap_ctrlr_key="ctrl",
            )
            hosts = next(s for s in rpc.call("nvmf_get_subsystems") if s["nqn"] == ROTATE)
            assert hosts["hosts"] == [
                {"nqn": HOST, "dhchap_key": "host2", "dhchap_ctrlr_key": "ctrl"}
            ]
            keys = rpc.call("keyring_get_keys")
            assert {k["name"] for k in keys} == {"host", "ctrl", "host2"}
            assert new_key.representation() not in repr(keys) + repr(hosts)
        # Authenticated queues stay so: I/O goes on with the old key's session.
        _io_round_trip(guest, ROTATE, 9)
        pattern = rf"host {re.escape(HOST)}: authenticated \(sha256, ffdhe2048, bidirectional\)"
        before = _count(target, pattern)
        # The host takes the new secret and re-authenticates every queue with it.
        guest.run(
            f"printf %s {shlex.quote(new_key.representation())} > "
            f"/sys/class/nvme/{ctrl}/dhchap_secret"
        )
        target.process.wait_log(pattern, before + 2, WAIT_S)
        _io_round_trip(guest, ROTATE, 11)
        assert _ctrl_of(guest, ROTATE) == ctrl  # the same controller, not a reconnect
    finally:
        _disconnect(guest, ROTATE)
    # New connections: the old key is refused, the new one accepted.
    ok, out = _connect(
        guest, target, ROTATE, target.host_key.representation(), target.ctrl_key.representation()
    )
    assert not ok, out
    ok, out = _connect(
        guest, target, ROTATE, new_key.representation(), target.ctrl_key.representation()
    )
    assert ok, out
    _disconnect(guest, ROTATE)


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
    host_key = DhchapKey.generate(32)
    ctrl_key = DhchapKey.generate(64)
    setup_kernel_target(guest, port=nvmet_port, nqn=NVMET_NQN, size_mb=32)
    s = f"{NVMET}/subsystems/{NVMET_NQN}"
    guest.run(
        f"set -e; modprobe nvmet; mkdir -p {NVMET}/hosts/{HOST}\n"
        f"echo 0 > {s}/attr_allow_any_host\n"
        f"ln -s {NVMET}/hosts/{HOST} {s}/allowed_hosts/{HOST}\n"
    )
    _nvmet_host_attrs(
        guest, {"key": host_key.representation(), "ctrl_key": ctrl_key.representation()}
    )
    return Nvmet(nvmet_port, host_key, ctrl_key)


async def _library_round_trip(nvmet: Nvmet, peer: Peer, **keys: object) -> None:
    async with await connect(
        "127.0.0.1", nvmet.port, NVMET_NQN, hostnqn=HOST, queues=2, timeout=60.0, **keys
    ) as ctrl:
        # The library authenticates the queues whose Connect response asks for it (AUTHREQ):
        # 7.x nvmet asks on the admin queue only, 6.12 on every queue.
        assert ctrl.authenticated_queues == ({0} if peer.nvmet_auth_admin_only else {0, 1, 2})
        data = os.urandom(64 * 1024)
        ns = ctrl.namespace(1)
        await ns.write(0, data)
        buf = bytearray(len(data))
        await ns.read(0, memoryview(buf))
        assert buf == data
        await ctrl.reauthenticate()
        await ns.read(0, memoryview(buf))
        assert buf == data


@pytest.mark.parametrize(
    ("hash_name", "dhgroup"),
    [("hmac(sha256)", "null"), ("hmac(sha384)", "ffdhe3072"), ("hmac(sha512)", "ffdhe2048")],
)
def test_host_library_authenticates_to_the_linux_target(
    guest: Guest, nvmet: Nvmet, hash_name: str, dhgroup: str
) -> None:
    _nvmet_host_attrs(guest, {"hash": hash_name, "dhgroup": dhgroup})
    guest.run("dmesg -C")
    asyncio.run(
        _library_round_trip(
            nvmet,
            guest.peer,
            dhchap_secret=nvmet.host_key.representation(),
            dhchap_ctrl_secret=nvmet.ctrl_key.representation(),
        )
    )
    asyncio.run(
        _library_round_trip(nvmet, guest.peer, dhchap_secret=nvmet.host_key.representation())
    )
    trouble = re.findall(r".*(?:failed|error|mismatch).*", guest.run("dmesg").output, re.I)
    assert not trouble, trouble


def test_host_library_wrong_keys_against_the_linux_target(guest: Guest, nvmet: Nvmet) -> None:
    _nvmet_host_attrs(guest, {"hash": "hmac(sha256)", "dhgroup": "ffdhe2048"})

    async def attempt(**keys: object) -> NvmeAuthenticationError:
        with pytest.raises(NvmeAuthenticationError) as info:
            await connect("127.0.0.1", nvmet.port, NVMET_NQN, hostnqn=HOST, timeout=60.0, **keys)
        return info.value

    guest.run("dmesg -C")
    try:
        wrong = asyncio.run(attempt(dhchap_secret=DhchapKey.generate(32).representation()))
        assert wrong.by_controller and wrong.explanation == FailureExplanation.FAILED
    except NvmeConnectionError:
        # nvmet fails the controller as it answers with Failure1 (nvmet_ctrl_fatal_error
        # comes before the AUTH_Receive completes, drivers/nvme/target/fabrics-cmd-auth.c):
        # on a loaded machine the teardown may close the connection before Failure1 is
        # out. Either way nvmet refused the key (Failed, 1), and its log says so.
        pass
    log = guest.run("dmesg").output
    assert re.search(r"qid 0:? failure1 \(1\)", log), log
    bad_ctrl = asyncio.run(
        attempt(
            dhchap_secret=nvmet.host_key.representation(),
            dhchap_ctrl_secret=DhchapKey.generate(64).representation(),
        )
    )
    assert not bad_ctrl.by_controller and bad_ctrl.explanation == FailureExplanation.FAILED
    none = asyncio.run(attempt())
    assert "requires DH-HMAC-CHAP" in str(none)
    # The right keys still work afterwards.
    asyncio.run(
        _library_round_trip(nvmet, guest.peer, dhchap_secret=nvmet.host_key.representation())
    )
