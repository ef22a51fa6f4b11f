"""Smoke tests of the QEMU guest harness (tests/support/guest.py) itself, on every peer.

One guest per peer boots for the whole module (~5-10 s under TCG). The tests do not depend
on each other's order: each kernel target they set up has its own port and NQN.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import guest_assets, guest_debootstrap
from tests.support.guest import (
    BOOTED,
    LINUX_6_1,
    Guest,
    GuestBootError,
    GuestCommandError,
    GuestError,
    GuestPrerequisiteError,
    GuestTimeoutError,
    Peer,
    require_guest_prerequisites,
    selected_peers,
    setup_kernel_target,
    teardown_kernel_target,
)
from tests.support.ports import free_tcp_port

NQN = "nqn.2014-08.org.pynvmf:guest-smoke"


@pytest.fixture(scope="module")
def target_port() -> int:
    return free_tcp_port()


@pytest.fixture(scope="module")
def guest(target_port: int, linux_peer: Peer) -> Iterator[Guest]:
    require_guest_prerequisites(linux_peer)
    overlay = {
        "/etc/pynvmf/smoke.txt": "from the overlay\n",
        # /bin links to /usr/bin in the base image; the overlay must not break that.
        "/bin/pynvmf-hello": "#!/bin/sh\necho hello from /bin\n",
        "/etc/pynvmf/boot.sh": "#!/bin/sh\necho ran > /tmp/boot-hook\n",
    }
    g = Guest(hostfwd=[target_port], extra_files=overlay, peer=linux_peer)
    g.start()
    try:
        yield g
    finally:
        g.stop()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AssertionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


@pytest.mark.parametrize(
    ("tool", "peer"),
    [("fio", "linux-6.1"), ("debootstrap", "linux-6.12"), ("debootstrap", "linux-7")],
)
def test_missing_tool_names_the_install_script(
    monkeypatch: pytest.MonkeyPatch, tool: str, peer: str
) -> None:
    real_which = guest_assets.which
    monkeypatch.setattr(guest_assets, "which", lambda t: None if t == tool else real_which(t))
    for which_peers in (None, peer):
        with pytest.raises(GuestPrerequisiteError) as info:
            require_guest_prerequisites(which_peers)
        assert f"{tool} (" in str(info.value)
        assert "scripts/install-system-deps.sh" in str(info.value)


def test_boot_is_quick(guest: Guest) -> None:
    assert guest.boot_seconds is not None
    # The notes promise ~6-10 s under TCG; leave room for a loaded machine.
    assert guest.boot_seconds < 60, guest.console_tail()


def test_uname_is_the_cached_kernel(guest: Guest) -> None:
    assert guest.assets is not None
    assert guest.run("uname -r").output.strip() == guest.assets.kernel_version
    assert guest.assets.peer == guest.peer.name
    assert guest.assets.kernel_version.startswith(guest.peer.kernel + ".")


def test_the_run_says_which_kernel_and_tools_ran(guest: Guest) -> None:
    """linux-7 follows Debian unstable: the console log's first line and pytest's summary
    (BOOTED) name the kernel package and the tools' versions."""
    assets = guest.assets
    assert assets is not None
    line = BOOTED[guest.peer.name]
    assert guest.console_text().startswith(f"### {line}\n")
    kernel = f"kernel {assets.kernel_version} ({assets.kernel_package} "
    assert line.startswith(f"{guest.peer.name}: {kernel}"), line
    assert f"nvme-cli {assets.versions['nvme-cli']}" in line, line
    assert f"fio {assets.versions['fio']}" in line, line
    if guest.peer.tls:
        assert f"ktls-utils {assets.versions['ktls-utils']}" in line, line


def test_exit_status(guest: Guest) -> None:
    assert guest.run("false", check=False).rc == 1
    assert guest.run("exit 7", check=False).rc == 7
    with pytest.raises(GuestCommandError) as info:
        guest.run("echo some-output; exit 3")
    assert info.value.rc == 3
    assert "exit 3" in str(info.value)
    assert "some-output" in str(info.value)


def test_output_is_intact(guest: Guest) -> None:
    assert guest.run("printf 'one\\n\\n  two\\tthree \\nfour\\n'").output == (
        "one\n\n  two\tthree \nfour\n"
    )
    assert guest.run("printf abc").output == "abc"
    assert guest.run("true").output == ""
    lines = guest.run("seq 1 3000").output
    assert lines == "".join(f"{i}\n" for i in range(1, 3001))
    # Quotes, $ and backslashes reach the guest's shell unmangled.
    script = "x='a \"b\" $c \\\\ d'\nprintf '%s\\n' \"$x\"\necho 1>&2 to-stderr"
    assert guest.run(script).output == 'a "b" $c \\\\ d\nto-stderr\n'


def test_files_round_trip(guest: Guest) -> None:
    small = bytes(range(256)) * 40  # over the console
    guest.write_file("/tmp/small", small, mode=0o600)
    assert guest.read_file("/tmp/small") == small
    assert guest.run("stat -c %a /tmp/small").output == "600\n"
    big = os.urandom(3 << 20)  # over the network
    guest.write_file("/tmp/big", big)
    assert guest.run("sha256sum /tmp/big").output.split()[0] == hashlib.sha256(big).hexdigest()
    assert guest.read_file("/tmp/big") == big


def test_overlay_files(guest: Guest) -> None:
    assert guest.run("cat /etc/pynvmf/smoke.txt").output == "from the overlay\n"
    assert guest.run("pynvmf-hello").output == "hello from /bin\n"
    assert guest.run("cat /tmp/boot-hook").output == "ran\n"
    guest.run("test -L /bin && test -L /lib")


def test_stdin_input(guest: Guest) -> None:
    data = b"line one\n\x00\x01\xff binary\r\n"
    assert guest.run("wc -c", input=data).output.strip() == str(len(data))
    assert guest.run("cat", input="text\n").output == "text\n"
    assert guest.run("cat").output == ""  # /dev/null without input


def test_command_timeout_leaves_guest_usable(guest: Guest) -> None:
    started = time.monotonic()
    with pytest.raises(GuestTimeoutError):
        guest.run("echo before; sleep 30", timeout=2)
    assert time.monotonic() - started < 20
    assert guest.run("echo after").output == "after\n"


def _upstream(debian_version: str) -> str:
    """The upstream part of a Debian version: "1:2.16-1+b1" -> "2.16", and what a
    downgrade's "+really" names: bookworm's "2.4+really2.3-3" is nvme-cli 2.3."""
    upstream = debian_version.split(":", 1)[-1].rsplit("-", 1)[0]
    return upstream.rsplit("+really", 1)[-1]


def test_tools_are_the_versions_the_build_recorded(guest: Guest) -> None:
    assert guest.assets is not None
    versions = guest.assets.versions
    nvme_cli = _upstream(versions["nvme-cli"])
    assert f"nvme version {nvme_cli} " in guest.run("nvme version").output
    assert guest.run("fio --version").output.strip() == f"fio-{_upstream(versions['fio'])}"
    guest.run("dd if=/dev/zero of=/tmp/z bs=4k count=4 status=none && cmp /tmp/z /tmp/z")
    guest.run("sha256sum /tmp/z && test -s /etc/nvme/hostnqn && test -s /etc/nvme/hostid")


def test_host_role_modules(guest: Guest) -> None:
    guest.run("modprobe nvme-tcp")
    guest.run("test -c /dev/nvme-fabrics")
    assert "nvme_tcp" in guest.run("lsmod").output


def test_guest_reaches_host_loopback(guest: Guest) -> None:
    # What host-role tests rely on: a server on the machine's 127.0.0.1 is the guest's
    # host_address.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(60)
        port = srv.getsockname()[1]
        got: list[bytes] = []

        def accept() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(30)
                got.append(_recv_exactly(conn, 6))

        t = threading.Thread(target=accept)
        t.start()
        guest.run(f"echo hello | nc -w 5 {guest.host_address} {port}", timeout=60)
        t.join(60)
    assert got == [b"hello\n"]


def test_target_role_icreq_over_hostfwd(guest: Guest, target_port: int) -> None:
    target = setup_kernel_target(guest, port=target_port, nqn=NQN, size_mb=64)
    assert target.device.startswith("/dev/nullb")
    icreq = bytearray(128)
    icreq[0] = 0x00  # PDU type ICReq
    icreq[2] = 128  # header length
    struct.pack_into("<I", icreq, 4, 128)  # PDU length
    with socket.create_connection(("127.0.0.1", target_port), timeout=30) as sock:
        sock.sendall(icreq)
        resp = _recv_exactly(sock, 8)
        (plen,) = struct.unpack_from("<I", resp, 4)
        assert resp[0] == 0x01, resp.hex()  # ICResp
        assert plen == 128
        body = _recv_exactly(sock, plen - 8)
    (maxh2cdata,) = struct.unpack_from("<I", resp + body, 12)
    assert maxh2cdata > 0


def test_target_with_4k_blocks(guest: Guest) -> None:
    port = free_tcp_port()
    nqn = NQN + "-4k"
    target = setup_kernel_target(guest, port=port, nqn=nqn, size_mb=16, block_size=4096)
    dev = target.device.rsplit("/", 1)[-1]
    assert guest.run(f"cat /sys/block/{dev}/queue/logical_block_size").output.strip() == "4096"
    assert guest.run(f"cat /sys/block/{dev}/size").output.strip() == str(16 * 2048)
    # Memory-backed: what is written is read back.
    guest.run(
        f"dd if=/dev/urandom of=/tmp/r bs=4k count=8 status=none"
        f" && dd if=/tmp/r of={target.device} bs=4k oflag=direct status=none"
        f" && dd if={target.device} of=/tmp/r2 bs=4k count=8 iflag=direct status=none"
        f" && cmp /tmp/r /tmp/r2"
    )
    # fio with libaio on the device: its ~70 shared libraries made it into the initramfs.
    guest.run(
        f"fio --name=smoke --filename={target.device} --ioengine=libaio --direct=1"
        " --rw=randwrite --bs=4k --iodepth=4 --size=1M --verify=crc32c --output-format=terse",
        timeout=120,
    )
    teardown_kernel_target(guest, target)
    guest.run(f"test ! -e /sys/kernel/config/nvmet/subsystems/{nqn}")
    guest.run(f"test ! -e {target.device}")


HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000005e1"


def test_tls_and_dhchap_are_what_the_peer_says(guest: Guest) -> None:
    """Peer.tls and Peer.dhchap tell tests what the guest can do: the kernel's config, the
    modules, tlshd, the .nvme keyring and nvme-cli's key commands agree with them."""
    assets = guest.assets
    assert assets is not None
    config = assets.config.read_text()
    assert ("CONFIG_NVME_TCP_TLS=y" in config.splitlines()) == guest.peer.tls
    assert ("CONFIG_NVME_HOST_AUTH=y" in config.splitlines()) == guest.peer.dhchap
    assert ("CONFIG_NVME_TARGET_AUTH=y" in config.splitlines()) == guest.peer.dhchap
    subnqn = "nqn.2014-08.org.pynvmf:smoke-tls"
    if guest.peer.tls:
        guest.run("modprobe tls && modprobe nvme-keyring && grep -q '^tls ' /proc/modules")
        assert guest.run("tlshd --version 2>&1").output.startswith("tlshd")
        # The keyring the kernel's NVMe/TCP host and tlshd share, and a PSK inserted in it.
        out = guest.run(
            f"nvme gen-tls-key --hostnqn {HOSTNQN} --subsysnqn {subnqn} --insert"
        ).output
        assert "NVMeTLSkey-1:01:" in out, out
        keys = guest.run("cat /proc/keys").output
        assert re.search(r"\skeyring\s+\.nvme: 1$", keys, re.MULTILINE), keys
        assert re.search(rf"\spsk\s+NVMe0R01 {HOSTNQN} {subnqn}: 32$", keys, re.MULTILINE), keys
        assert "--tls " in guest.run("nvme connect --help 2>&1", check=False).output
    else:
        # Neither the tls module nor nvme-cli 2.3's --tls.
        assert guest.run("modprobe tls", check=False).rc != 0
        assert "--tls " not in guest.run("nvme connect --help 2>&1", check=False).output
    if guest.peer.dhchap:
        key = guest.run(f"nvme gen-dhchap-key --hmac=1 --nqn {HOSTNQN}").output.strip()
        assert re.fullmatch(r"DHHC-1:01:[A-Za-z0-9+/=]+:", key), key
        # The kernel target takes per-host keys.
        guest.run("modprobe nvmet")
        hosts = "/sys/kernel/config/nvmet/hosts"
        guest.run(f"mkdir {hosts}/{HOSTNQN} && test -e {hosts}/{HOSTNQN}/dhchap_key")
        guest.run(f"rmdir {hosts}/{HOSTNQN}")
    else:
        guest.run(f"mkdir /sys/kernel/config/nvmet/hosts/{HOSTNQN}")
        guest.run(f"test ! -e /sys/kernel/config/nvmet/hosts/{HOSTNQN}/dhchap_key")
        guest.run(f"rmdir /sys/kernel/config/nvmet/hosts/{HOSTNQN}")


def test_root_filesystem_writes_stay_in_the_guest(guest: Guest) -> None:
    assets = guest.assets
    assert assets is not None
    # 6.1: the initramfs is the guest; 6.12, 7: a cached ext4 image QEMU opens with
    # snapshot=on.
    assert (assets.root_disk is None) == (guest.peer is LINUX_6_1)
    guest.run('test "$(stat -f -c %T /tmp)" = tmpfs')
    if assets.root_disk is None:
        return
    before = assets.root_disk.stat()
    guest.run("dd if=/dev/urandom of=/root/scratch bs=1M count=8 status=none && sync")
    guest.run('test "$(stat -f -c %T /)" = ext2/ext3')
    after = assets.root_disk.stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


# -- booting: retries and giving up (the default peer; the loop is the same for both) ------


def test_a_boot_that_dies_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    real_boot = Guest._boot
    calls: list[str] = []

    def flaky_boot(self: Guest, accel: str, initrd: object, timeout: float) -> None:
        calls.append(accel)
        if len(calls) == 1:
            # What an oops before the command server comes up looks like to start().
            raise GuestError("QEMU exited during boot (status 0): simulated oops")
        real_boot(self, accel, initrd, timeout)  # type: ignore[arg-type]

    monkeypatch.setattr(Guest, "_boot", flaky_boot)
    monkeypatch.setenv("PYNVMF_GUEST_BOOT_ATTEMPTS", "2")
    monkeypatch.delenv("PYNVMF_GUEST_KVM", raising=False)
    with Guest() as g:
        assert g.run("echo up").output == "up\n"
        assert len(calls) == 2
        assert len(g.failed_boots) == 1 and "simulated oops" in g.failed_boots[0]


def test_giving_up_on_boots_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYNVMF_GUEST_BOOT_ATTEMPTS", "2")
    monkeypatch.delenv("PYNVMF_GUEST_KVM", raising=False)
    # No init: the kernel panics at once (panic=-1 and -no-reboot end QEMU) on every attempt.
    g = Guest(kernel_args=["rdinit=/pynvmf-no-such-init"], boot_timeout=120)
    with pytest.raises(GuestBootError) as info:
        g.start()
    message = str(info.value)
    assert "failed to boot 2 times, giving up" in message, message
    assert "attempt 1/2" in message and "attempt 2/2" in message, message
    assert "QEMU exited during boot" in message, message
    assert len(g.failed_boots) == 2
    assert not g.running


@pytest.mark.parametrize(
    "suite",
    [s for s in guest_debootstrap.SUITES if s.peer in {p.name for p in selected_peers()}],
    ids=lambda s: s.peer,
)
def test_the_suite_stays_out_of_the_machines_apt(suite: guest_debootstrap.Suite) -> None:
    """The 6.12 and 7 peers' package lists live in the guest cache; the machine's apt never
    hears of trixie or sid."""
    assets = guest_debootstrap.prepare_assets(suite)
    lists = assets.cache_dir / "apt" / "lists"
    assert list(lists.glob(f"*_dists_{suite.name}_*Packages*")), sorted(lists.iterdir())
    machine = guest_assets.run_tool(["apt-get", "indextargets", "--format", "$(CODENAME)"])
    assert suite.name not in machine.split(), machine
    assert not list(Path("/var/lib/apt/lists").glob(f"*_dists_{suite.name}_*"))
    for sources in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        if sources.is_file():
            assert not re.search(rf"\b{suite.name}\b", sources.read_text()), sources
