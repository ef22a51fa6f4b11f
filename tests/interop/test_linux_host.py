"""The acceptance test of the target core: the Linux kernel's NVMe/TCP host, booted
under QEMU, discovers, connects to, identifies, writes and reads pynvmf's target with
its own tools (nvme-cli, dd, fio), and nothing written is lost.

Every test runs on the oldest and the newest kernel peer (Linux 6.1 with nvme-cli 2.3, Linux
7 with Debian unstable's nvme-cli; 6.12 behaves as 7 here: tests/support/guest.py): one
guest boot per peer, and one target process shared by them. The checks that exercise a
namespace's data are check_* functions taking the subsystem (`Subsys`):
test_linux_host_rbd.py runs them on namespaces on Ceph RBD.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.guest import OLDEST_AND_NEWEST, CommandResult, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.scrape import Samples, scrape, series, value
from tests.support.target_process import TargetProcess

pytestmark = OLDEST_AND_NEWEST.mark()

MIB = 1 << 20
MEM = "nqn.2024-11.dev.pynvmf:interop-mem"
FILE = "nqn.2024-11.dev.pynvmf:interop-file"
MEM4K = "nqn.2024-11.dev.pynvmf:interop-mem4k"
RESTRICTED = "nqn.2024-11.dev.pynvmf:interop-restricted"
# mkfs.xfs (xfsprogs 6.x) refuses filesystems under 300 MiB.
DISCARD = "nqn.2024-11.dev.pynvmf:interop-discard"
# Two namespaces: Copy with descriptor formats 2/3 takes its sources from the other one.
COPYX = "nqn.2024-11.dev.pynvmf:interop-copyx"
# The same two namespaces, with Copy formats 2/3 (COPYN) or 3 alone (COPY3) enabled on every
# new controller by the target's configuration (`copy_formats`), for hosts that cannot
# enable them (Debian's 6.12 kernel will not pass Host Behavior Support on).
COPYN = "nqn.2024-11.dev.pynvmf:interop-copyn"
COPY3 = "nqn.2024-11.dev.pynvmf:interop-copy3"
ALLOWED_HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a110"
# Its commands counted by the metrics endpoint, from a host NQN of its own.
COUNTED = "nqn.2024-11.dev.pynvmf:interop-counted"
COUNTED_HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000c0a73"
SIZES = {
    MEM: 64 * MIB,
    FILE: 64 * MIB,
    MEM4K: 64 * MIB,
    RESTRICTED: 16 * MIB,
    DISCARD: 512 * MIB,
    COPYX: 16 * MIB,
    COPYN: 16 * MIB,
    COPY3: 16 * MIB,
    COUNTED: 16 * MIB,
}
BLOCK_SIZES = {MEM: 512, FILE: 512, MEM4K: 4096, RESTRICTED: 512, DISCARD: 512}

# Prints the block device of namespace $2 (default 1) of the controller connected to
# subsystem $1, waiting (bounded) for the kernel's namespace scan to create it.
DEV_FOR = r"""#!/bin/sh
nqn=$1; nsid=${2:-1}
i=0
while [ $i -lt 200 ]; do
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    [ "$(cat "$c/subsysnqn")" = "$nqn" ] || continue
    for n in $(ls "$c"); do
      case "$n" in
        nvme*n*)
          # The disk's name need not follow the NSID: its sysfs nsid tells.
          disk=$(echo "$n" | sed -E 's/c[0-9]+n/n/')
          [ "$(cat "/sys/block/$disk/nsid" 2>/dev/null)" = "$nsid" ] || continue
          [ -b "/dev/$disk" ] && { echo "/dev/$disk"; exit 0; } ;;
      esac
    done
  done
  i=$((i + 1)); sleep 0.05
done
echo "no block device for $nqn namespace $nsid" >&2
exit 1
"""


@dataclass
class Setup:
    process: TargetProcess
    metrics: tuple[str, int]
    io_port: int
    io_port6: int
    io_port_4k: int
    disc_port: int
    backing: Path


_METRICS = re.compile(r"metrics http://([\d.]+):(\d+)/metrics")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("linux-host")
    io_port, io_port6, disc_port = free_tcp_port(), free_tcp_port(), free_tcp_port()
    io_port_4k = free_tcp_port()
    backing = workdir / "namespace.img"
    config = {
        "ports": [
            {"address": "127.0.0.1", "port": io_port},
            {"address": "::1", "port": io_port6, "subsystems": [MEM]},
            {
                "address": "127.0.0.1",
                "port": io_port_4k,
                "subsystems": [MEM],
                "inline_data_size": 4096,
            },
        ],
        "discovery_ports": [{"address": "127.0.0.1", "port": disc_port}],
        "subsystems": [
            {"nqn": MEM, "namespaces": [{"nsid": 1, "memory": SIZES[MEM]}]},
            {
                "nqn": FILE,
                "namespaces": [{"nsid": 1, "file": str(backing), "size": SIZES[FILE]}],
            },
            {
                "nqn": MEM4K,
                "namespaces": [{"nsid": 1, "memory": SIZES[MEM4K], "block_size": 4096}],
            },
            {"nqn": DISCARD, "namespaces": [{"nsid": 1, "memory": SIZES[DISCARD]}]},
            {
                "nqn": COPYX,
                "namespaces": [
                    {"nsid": 1, "memory": SIZES[COPYX]},
                    {"nsid": 2, "memory": SIZES[COPYX]},
                ],
            },
            *(
                {
                    "nqn": nqn,
                    "copy_formats": formats,
                    "namespaces": [
                        {"nsid": 1, "memory": SIZES[nqn]},
                        {"nsid": 2, "memory": SIZES[nqn]},
                    ],
                }
                for nqn, formats in ((COPYN, [2, 3]), (COPY3, [3]))
            ),
            {
                "nqn": RESTRICTED,
                "hosts": [ALLOWED_HOST],
                "namespaces": [{"nsid": 1, "memory": SIZES[RESTRICTED]}],
            },
            {"nqn": COUNTED, "namespaces": [{"nsid": 1, "memory": SIZES[COUNTED]}]},
        ],
        "metrics": {"listen": "127.0.0.1:0"},
    }
    proc = TargetProcess(config, workdir)
    proc.start()
    metrics = next(m for line in proc.stdout_lines if (m := _METRICS.match(line)))
    address = (metrics.group(1), int(metrics.group(2)))
    yield Setup(proc, address, io_port, io_port6, io_port_4k, disc_port, backing)
    proc.stop()


@pytest.fixture(scope="module")
def guest(target: Setup, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR}, peer=linux_peer)
    g.start()
    yield g
    g.stop()


# -- the checks take the subsystem as a parameter ----------------------------------------------
#
# Each test that exercises a namespace's data calls a check_* function with a Subsys (its port
# and geometry), so that test_linux_host_rbd.py runs the same checks on Ceph RBD namespaces.


@dataclass(frozen=True)
class Subsys:
    """What a check needs of one subsystem of the target under test: the port it is on,
    and its namespace 1's size and block size (a check that takes two namespaces takes
    them the same size)."""

    nqn: str
    port: int
    size: int
    block_size: int = 512


def connect_args(port: int, nqn: str) -> str:
    return f"-t tcp -a {Guest.host_address} -s {port} -n {nqn}"


def connect(guest: Guest, port: int, nqn: str, extra: str = "") -> str:
    """Connects the guest to `nqn` on `port`; its namespace 1's block device."""
    guest.run(f"nvme connect {connect_args(port, nqn)} {extra}")
    return guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()


def disconnect(guest: Guest, nqn: str) -> None:
    out = guest.run(f"nvme disconnect -n {nqn}").output
    assert "disconnected 1 controller" in out


def wait_size(guest: Guest, dev: str, size: int) -> int:
    """The size of block device `dev` once it is `size` bytes (a namespace that grew:
    the host revalidates it on the event), or what it is after 30 s (a guest under
    emulation on a loaded machine takes seconds to rescan)."""
    out = guest.run(
        f"i=0; while [ $i -lt 300 ] && [ $(blockdev --getsize64 {dev}) != {size} ]; "
        f"do i=$((i + 1)); sleep 0.1; done; blockdev --getsize64 {dev}"
    ).output
    return int(out)


def _ss(target: Setup, nqn: str) -> Subsys:
    return Subsys(nqn, target.io_port, SIZES[nqn], BLOCK_SIZES.get(nqn, 512))


def _subnqns(discover_output: str) -> list[str]:
    return re.findall(r"^subnqn:\s+(\S+)", discover_output, re.MULTILINE)


def test_discover_lists_every_subsystem_the_host_may_use(guest: Guest, target: Setup) -> None:
    for port in (target.disc_port, target.io_port):
        out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {port}").output
        listed = _subnqns(out)
        # MEM is on the IPv4 port, the IPv6 port and the 4 KiB in-capsule port; the last
        # entry is the discovery subsystem answering. COUNTED: the metrics test's.
        assert sorted(listed) == sorted(
            [
                MEM,
                FILE,
                MEM4K,
                DISCARD,
                COPYX,
                COPYN,
                COPY3,
                COUNTED,
                MEM,
                MEM,
                "nqn.2014-08.org.nvmexpress.discovery",
            ]
        ), out
        assert f"trsvcid: {target.io_port}" in out
        assert re.search(rf"adrfam:\s+ipv6\n.*\n.*\n.*\ntrsvcid: {target.io_port6}\n", out), out
    out = guest.run(
        f"nvme discover -t tcp -a {Guest.host_address} -s {target.disc_port} "
        f"--hostnqn={ALLOWED_HOST}"
    ).output
    assert RESTRICTED in _subnqns(out)


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_connect_identify_and_list(guest: Guest, target: Setup, nqn: str) -> None:
    check_connect_identify_and_list(guest, _ss(target, nqn))


def check_connect_identify_and_list(guest: Guest, ss: Subsys) -> None:
    nqn = ss.nqn
    dev = connect(guest, ss.port, nqn)
    try:
        listing = json.loads(guest.run("nvme list -o json").output)
        (entry,) = [d for d in listing["Devices"] if d["DevicePath"] == dev]
        assert entry["PhysicalSize"] == ss.size
        assert entry["SectorSize"] == ss.block_size
        assert entry["ModelNumber"].strip() == "pynvmf"
        id_ctrl = json.loads(guest.run(f"nvme id-ctrl {dev} -o json").output)
        assert id_ctrl["subnqn"] == nqn
        assert id_ctrl["cntrltype"] == 1
        assert id_ctrl["maxcmd"] > 0
        assert id_ctrl["ioccsz"] == (64 + 16384) // 16
        id_ns = json.loads(guest.run(f"nvme id-ns {dev} -o json").output)
        assert id_ns["nsze"] == ss.size // ss.block_size
        lbaf = id_ns["lbafs"][id_ns["flbas"] & 0xF]
        assert 1 << lbaf["ds"] == ss.block_size
        sysfs = guest.run(f"cat /sys/block/{dev.removeprefix('/dev/')}/queue/logical_block_size")
        assert int(sysfs.output) == ss.block_size
        descs = guest.run(f"nvme ns-descs {dev}").output
        assert "nguid" in descs.lower() and "uuid" in descs.lower()
    finally:
        disconnect(guest, nqn)


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_dd_at_several_offsets_reads_back_identical(guest: Guest, target: Setup, nqn: str) -> None:
    check_dd_at_several_offsets(guest, _ss(target, nqn))


def check_dd_at_several_offsets(guest: Guest, ss: Subsys) -> dict[int, str]:
    """{offset: SHA-256 of the 64 KiB written there} (for a check of the backing store)."""
    dev = connect(guest, ss.port, ss.nqn)
    written = {}
    try:
        # The start, an unaligned spot in the middle, and the very last 64 KiB.
        for offset in (0, 3 * MIB + 40960, ss.size - 65536):
            written[offset] = guest.run(
                "dd if=/dev/urandom of=/tmp/pattern bs=4096 count=16 2>/dev/null && "
                f"dd if=/tmp/pattern of={dev} bs=4096 seek={offset // 4096} "
                "oflag=direct conv=notrunc 2>/dev/null && "
                f"dd if={dev} of=/tmp/back bs=4096 skip={offset // 4096} count=16 "
                "iflag=direct 2>/dev/null && cmp /tmp/pattern /tmp/back && sha256sum /tmp/back"
            ).output.split()[0]
    finally:
        disconnect(guest, ss.nqn)
    return written


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_fio_random_write_verify(guest: Guest, target: Setup, nqn: str) -> None:
    check_fio_random_write_verify(guest, _ss(target, nqn))


def check_fio_random_write_verify(guest: Guest, ss: Subsys) -> None:
    dev = connect(guest, ss.port, ss.nqn)
    try:
        bs = max(4096, ss.block_size)
        result = guest.run(
            f"fio --name=verify --filename={dev} --ioengine=libaio --direct=1 "
            f"--rw=randwrite --bs={bs} --size=4m --offset=8m --iodepth=16 "
            "--verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=json",
            timeout=300,
        )
        report = json.loads(result.output[result.output.index("{") :])
        (job,) = report["jobs"]
        assert job["error"] == 0
        assert job["write"]["io_bytes"] == 4 * MIB
        assert job["read"]["io_bytes"] == 4 * MIB  # the verify pass read everything back
    finally:
        disconnect(guest, ss.nqn)


def test_disconnect_then_reconnect_keeps_the_data(guest: Guest, target: Setup) -> None:
    check_disconnect_then_reconnect_keeps_the_data(guest, _ss(target, MEM))


def check_disconnect_then_reconnect_keeps_the_data(guest: Guest, ss: Subsys) -> None:
    dev = connect(guest, ss.port, ss.nqn)
    guest.run(
        "dd if=/dev/urandom of=/tmp/keep bs=4096 count=8 2>/dev/null && "
        f"dd if=/tmp/keep of={dev} bs=4096 seek=1000 oflag=direct 2>/dev/null"
    )
    disconnect(guest, ss.nqn)
    # nvme disconnect returns once the controller is deleted, its disks with it.
    left = guest.run("cat /sys/class/nvme/nvme*/subsysnqn 2>/dev/null || true").output
    assert ss.nqn not in left.split(), left
    dev = connect(guest, ss.port, ss.nqn)
    try:
        guest.run(
            f"dd if={dev} of=/tmp/again bs=4096 skip=1000 count=8 iflag=direct 2>/dev/null"
            " && cmp /tmp/keep /tmp/again"
        )
    finally:
        disconnect(guest, ss.nqn)


def test_host_not_allowed_is_refused(guest: Guest, target: Setup) -> None:
    refused = guest.run(f"nvme connect {connect_args(target.io_port, RESTRICTED)}", check=False)
    assert refused.rc != 0
    assert "nvme0" not in guest.run("ls /dev").output.split()
    dmesg = guest.run("dmesg | tail -5").output
    # The kernel names the status: Connect Invalid Host (0x184) with Do Not Retry (0x4000).
    assert f"Connect for subsystem {RESTRICTED} is not allowed" in dmesg, dmesg
    assert f"ret={0x4000 | 0x184}" in dmesg, dmesg
    # The host that is allowed gets in.
    dev = connect(guest, target.io_port, RESTRICTED, f"--hostnqn={ALLOWED_HOST}")
    assert dev.startswith("/dev/nvme")
    disconnect(guest, RESTRICTED)


def test_out_of_range_read_gets_lba_out_of_range(guest: Guest, target: Setup) -> None:
    check_out_of_range_read_gets_lba_out_of_range(guest, _ss(target, MEM))


def check_out_of_range_read_gets_lba_out_of_range(guest: Guest, ss: Subsys) -> None:
    dev = connect(guest, ss.port, ss.nqn)
    try:
        last = ss.size // ss.block_size
        out = guest.run(
            f"nvme read {dev} --start-block={last} --block-count=0 --data-size={ss.block_size}",
            check=False,
        )
        assert out.rc != 0
        assert "LBA_RANGE" in out.output or "Out of Range" in out.output, out.output
    finally:
        disconnect(guest, ss.nqn)


def test_flushed_file_data_is_in_the_backing_file(guest: Guest, target: Setup) -> None:
    offset = 5 * MIB

    def stored() -> bytes:
        with target.backing.open("rb") as f:
            f.seek(offset)
            return f.read(256 * 1024)

    check_flushed_data_is_stored(guest, _ss(target, FILE), offset, stored)


def check_flushed_data_is_stored(
    guest: Guest, ss: Subsys, offset: int, stored: Callable[[], bytes]
) -> None:
    """256 KiB written at `offset` and flushed, while connected: `stored()` reads the same
    bytes from the backing store behind the target."""
    dev = connect(guest, ss.port, ss.nqn)
    try:
        digest = guest.run(
            "dd if=/dev/urandom of=/tmp/durable bs=4096 count=64 2>/dev/null && "
            f"dd if=/tmp/durable of={dev} bs=4096 seek={offset // 4096} oflag=direct "
            f"2>/dev/null && nvme flush {dev} >/dev/null && sha256sum /tmp/durable"
        ).output.split()[0]
        assert hashlib.sha256(stored()).hexdigest() == digest
    finally:
        disconnect(guest, ss.nqn)


GUEST_IPV6 = "fec0::15"
HOST_IPV6 = "fec0::2"  # QEMU user networking's view of the machine's ::1


def test_ipv6_discover_connect_and_io(guest: Guest, target: Setup) -> None:
    guest.run(
        # A static address without duplicate detection: the router advertisement that
        # would configure one may come seconds later under emulation.
        "echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad; "
        f"ip -6 addr show dev eth0 | grep -q {GUEST_IPV6} || "
        f"ip -6 addr add {GUEST_IPV6}/64 dev eth0; "
        f"ip -6 route replace default via {HOST_IPV6} dev eth0"
    )
    out = guest.run(f"nvme discover -t tcp -a {HOST_IPV6} -s {target.io_port6}").output
    assert "adrfam:  ipv6" in out and MEM in _subnqns(out), out
    guest.run(f"nvme connect -t tcp -a {HOST_IPV6} -s {target.io_port6} -n {MEM}")
    dev = guest.run(f"sh /usr/local/bin/dev-for {MEM}").output.strip()
    try:
        guest.run(
            "dd if=/dev/urandom of=/tmp/v6 bs=4096 count=32 2>/dev/null && "
            f"dd if=/tmp/v6 of={dev} bs=4096 seek=2000 oflag=direct 2>/dev/null && "
            f"dd if={dev} of=/tmp/v6back bs=4096 skip=2000 count=32 iflag=direct 2>/dev/null"
            " && cmp /tmp/v6 /tmp/v6back"
        )
        address = guest.run("cat /sys/class/nvme/nvme*/address").output
        assert f"traddr={HOST_IPV6}" in address, address
    finally:
        disconnect(guest, MEM)


# -- offloads negotiated with the real host: in-capsule data and digests ----------------------

_CLOSED = re.compile(
    r"connection closed: port=(\S+) qid=(\d+) cntlid=\d+ digests=(\S+) (.*) reason="
)


def _log_offset(process: TargetProcess) -> int:
    return len(process.stderr())


def _connection_stats(process: TargetProcess, port: int, since: int) -> list[dict[str, int | str]]:
    """The target's per-connection transport counters for `port`, logged at close.

    The kernel's disconnect returns before the target has seen every socket close,
    so wait (bounded) for the admin queue's line, which the kernel closes last.
    """
    deadline = time.monotonic() + 30
    while True:
        stats = []
        for m in _CLOSED.finditer(process.stderr()[since:]):
            if m.group(1) != f"127.0.0.1:{port}":
                continue
            entry: dict[str, int | str] = {"qid": int(m.group(2)), "digests": m.group(3)}
            for field in m.group(4).split():
                key, value = field.split("=")
                entry[key] = int(value) if value.isdigit() else value  # tls=user|ktls|-
            stats.append(entry)
        if any(e["qid"] == 0 for e in stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _fio_write_verify(guest: Guest, dev: str, bs: int, size: int) -> None:
    result = guest.run(
        f"fio --name=inline --filename={dev} --ioengine=libaio --direct=1 --rw=randwrite "
        f"--bs={bs} --size={size} --iodepth=16 --verify=crc32c --do_verify=1 "
        "--verify_fatal=1 --output-format=json",
        timeout=300,
    )
    (job,) = json.loads(result.output[result.output.index("{") :])["jobs"]
    assert job["error"] == 0 and job["write"]["io_bytes"] == size


def _io_queue_totals(stats: list[dict[str, int | str]], key: str) -> int:
    return sum(int(e[key]) for e in stats if e["qid"] != 0)


def test_16k_in_capsule_target_receives_8k_and_16k_writes_in_the_capsule(
    guest: Guest, target: Setup
) -> None:
    check_16k_in_capsule(guest, target.process, _ss(target, MEM))


def check_16k_in_capsule(guest: Guest, process: TargetProcess, ss: Subsys) -> None:
    """`ss.port` has the default in-capsule data size (16 KiB)."""
    since = _log_offset(process)
    dev = connect(guest, ss.port, ss.nqn)
    try:
        for bs in (8192, 16384):
            _fio_write_verify(guest, dev, bs, 2 * MIB)
    finally:
        disconnect(guest, ss.nqn)
    stats = _connection_stats(process, ss.port, since)
    assert _io_queue_totals(stats, "r2t") == 0, stats
    assert _io_queue_totals(stats, "in_capsule_bytes") >= 4 * MIB, stats


def test_4k_in_capsule_target_falls_back_to_r2t_with_the_same_data(
    guest: Guest, target: Setup
) -> None:
    check_4k_in_capsule_falls_back_to_r2t(
        guest, target.process, Subsys(MEM, target.io_port_4k, SIZES[MEM])
    )


def check_4k_in_capsule_falls_back_to_r2t(guest: Guest, process: TargetProcess, ss: Subsys) -> None:
    """`ss.port` takes 4 KiB of in-capsule data."""
    since = _log_offset(process)
    dev = connect(guest, ss.port, ss.nqn)
    try:
        for bs in (8192, 16384):
            _fio_write_verify(guest, dev, bs, 2 * MIB)
    finally:
        disconnect(guest, ss.nqn)
    stats = _connection_stats(process, ss.port, since)
    writes = 2 * MIB // 8192 + 2 * MIB // 16384
    # Exactly one R2T per fio write (reads never need one), answered by one H2CData each
    # since the host's writes are smaller than MAXH2CDATA.
    assert _io_queue_totals(stats, "r2t") == writes, stats
    assert _io_queue_totals(stats, "h2c_data") == writes, stats
    # Nothing larger than 4 KiB travelled in a capsule.
    assert _io_queue_totals(stats, "in_capsule_bytes") < writes * 8192, stats


def test_header_and_data_digests_with_fio_verify(guest: Guest, target: Setup) -> None:
    check_header_and_data_digests(guest, target.process, _ss(target, MEM))


def check_header_and_data_digests(guest: Guest, process: TargetProcess, ss: Subsys) -> None:
    since = _log_offset(process)
    dev = connect(guest, ss.port, ss.nqn, "--hdr-digest --data-digest")
    try:
        _fio_write_verify(guest, dev, 4096, 2 * MIB)  # in the capsule
        _fio_write_verify(guest, dev, 65536, 4 * MIB)  # R2T and H2CData
    finally:
        disconnect(guest, ss.nqn)
    stats = _connection_stats(process, ss.port, since)
    assert stats and all(e["digests"] == "hd" for e in stats), stats
    assert _io_queue_totals(stats, "data_digest_errors") == 0
    assert _io_queue_totals(stats, "r2t") >= 4 * MIB // 65536


# -- copy offload: the kernel host's `nvme copy` ------------------------------------------------


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_nvme_copy_single_many_ranges_at_the_end_and_past_it(
    guest: Guest, target: Setup, nqn: str
) -> None:
    check_nvme_copy_single_many_ranges_at_the_end_and_past_it(guest, _ss(target, nqn))


def check_nvme_copy_single_many_ranges_at_the_end_and_past_it(guest: Guest, ss: Subsys) -> None:
    bs = ss.block_size
    last = ss.size // bs  # the first LBA past the end
    dev = connect(guest, ss.port, ss.nqn)

    def read_blocks(lba: int, count: int, path: str) -> None:
        guest.run(
            f"dd if={dev} of={path} bs={bs} skip={lba} count={count} iflag=direct 2>/dev/null"
        )

    def expect(path: str, pieces: list[tuple[int, int]]) -> None:
        """`path` must equal the listed (first block, count) pieces of /tmp/csrc."""
        parts = "; ".join(
            f"dd if=/tmp/csrc bs={bs} skip={s} count={n} 2>/dev/null" for s, n in pieces
        )
        guest.run(f"({parts}) > /tmp/cexp && cmp {path} /tmp/cexp")

    def nvme_copy(sdlba: int, ranges: list[tuple[int, int]], extra: str = "") -> str:
        slbs = ",".join(str(src + s) for s, _ in ranges)
        nlbs = ",".join(str(n - 1) for _, n in ranges)  # nvme-cli takes 0's based counts
        return guest.run(
            f"nvme copy {dev} --sdlba={sdlba} --slbs={slbs} --blocks={nlbs} {extra}", check=False
        ).output

    try:
        src = 1000
        guest.run(
            f"dd if=/dev/urandom of=/tmp/csrc bs={bs} count=48 2>/dev/null && "
            f"dd if=/tmp/csrc of={dev} bs={bs} seek={src} oflag=direct 2>/dev/null"
        )
        # One range.
        assert "NVMe Copy: success" in nvme_copy(last // 4, [(0, 8)])
        read_blocks(last // 4, 8, "/tmp/cdst")
        expect("/tmp/cdst", [(0, 8)])
        # Sixteen ranges, in a shuffled order, gathered into one destination.
        ranges = [(3 * i, 3) for i in (5, 0, 15, 7, 2, 9, 1, 14, 3, 11, 4, 13, 6, 10, 8, 12)]
        assert "NVMe Copy: success" in nvme_copy(last // 2, ranges)
        read_blocks(last // 2, 48, "/tmp/cdst")
        expect("/tmp/cdst", ranges)
        # Descriptor format 1 and FUA.
        assert "NVMe Copy: success" in nvme_copy(3 * last // 4, [(40, 8), (8, 8)], "--format=1 -f")
        read_blocks(3 * last // 4, 16, "/tmp/cdst")
        expect("/tmp/cdst", [(40, 8), (8, 8)])
        # The very end of the namespace.
        assert "NVMe Copy: success" in nvme_copy(last - 8, [(16, 8)])
        read_blocks(last - 8, 8, "/tmp/cdst")
        expect("/tmp/cdst", [(16, 8)])
        # Past it: LBA Out of Range, and the blocks that were there are untouched.
        read_blocks(last - 8, 8, "/tmp/before")
        out = nvme_copy(last - 4, [(24, 8)])
        assert "LBA Out of Range" in out, out
        read_blocks(last - 8, 8, "/tmp/after")
        guest.run("cmp /tmp/before /tmp/after")
        # A source range past the end fails the same way.
        out = guest.run(
            f"nvme copy {dev} --sdlba=100 --slbs={last - 2} --blocks=7", check=False
        ).output
        assert "LBA Out of Range" in out, out
    finally:
        disconnect(guest, ss.nqn)


# -- discard: what the kernel's block layer sends (a range list in a whole page) ---------------


def _region_sums(guest: Guest, dev: str, regions: list[tuple[int, int]]) -> list[str]:
    """SHA-256 of each (offset MiB, length MiB) region of `dev`, read with O_DIRECT."""
    sums = []
    for offset, length in regions:
        out = guest.run(
            f"dd if={dev} bs=1M skip={offset} count={length} iflag=direct 2>/dev/null | sha256sum"
        ).output
        sums.append(out.split()[0])
    return sums


def test_blkdiscard_deallocates_exactly_its_ranges(guest: Guest, target: Setup) -> None:
    check_blkdiscard_deallocates_exactly_its_ranges(guest, _ss(target, DISCARD))


def check_blkdiscard_deallocates_exactly_its_ranges(guest: Guest, ss: Subsys) -> None:
    dev = connect(guest, ss.port, ss.nqn)
    try:
        guest.run(
            "dd if=/dev/urandom of=/tmp/d8 bs=1M count=8 2>/dev/null && "
            f"dd if=/tmp/d8 of={dev} bs=1M seek=16 oflag=direct 2>/dev/null"
        )
        keep = _region_sums(guest, dev, [(16, 1), (18, 1), (20, 4)])
        # One range (2 MiB in), then two more in one call each side of the kept MiB.
        guest.run(f"blkdiscard -o {17 * MIB} -l {MIB} {dev}")
        guest.run(f"blkdiscard -o {19 * MIB} -l {MIB} {dev}")
        zero_mib = guest.run("dd if=/dev/zero bs=1M count=1 2>/dev/null | sha256sum").output
        assert _region_sums(guest, dev, [(17, 1), (19, 1)]) == [zero_mib.split()[0]] * 2
        # DLFEAT: deallocated blocks read as zeroes, and nothing around them changed.
        assert _region_sums(guest, dev, [(16, 1), (18, 1), (20, 4)]) == keep
        errors = guest.run("dmesg | grep -c 'I/O Error' || true").output.strip()
        assert errors == "0", guest.run("dmesg | grep -E -B3 -A3 'I/O Error|error'").output
    finally:
        disconnect(guest, ss.nqn)


def test_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest: Guest, target: Setup) -> None:
    check_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest, _ss(target, DISCARD))


def check_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest: Guest, ss: Subsys) -> None:
    """`ss.size` is at least 300 MiB (mkfs.xfs refuses less)."""
    # Only what the kernel logs from here on counts: an earlier check's disconnect may have
    # left "failed nvme_keep_alive_end_io error=4" (6.12, seen once in a full run): the host
    # failing a keep-alive it queued as it deleted the controller (4 is BLK_STS_TRANSPORT,
    # and the "long keepalive RTT" of 2^32 ms printed with it says it was never sent).
    logged = int(guest.run("dmesg | wc -l").output)
    dev = connect(guest, ss.port, ss.nqn)
    mounted = False
    try:
        guest.run(
            "dd if=/dev/urandom of=/tmp/junk bs=1M count=4 2>/dev/null && "
            f"dd if=/tmp/junk of={dev} bs=1M seek=200 oflag=direct 2>/dev/null"
        )
        # mkfs.xfs discards the whole device first (its default -K off): every block of
        # the namespace is deallocated, so the junk written above reads back as zeroes.
        guest.run(f"mkfs.xfs -f {dev}", timeout=300)
        zero = guest.run("dd if=/dev/zero bs=1M count=4 2>/dev/null | sha256sum").output
        assert _region_sums(guest, dev, [(200, 4)]) == [zero.split()[0]]
        guest.run("modprobe xfs && mkdir -p /mnt/x")
        guest.run(f"mount -t xfs {dev} /mnt/x")
        mounted = True
        guest.run(
            "dd if=/dev/urandom of=/mnt/x/keep bs=1M count=8 2>/dev/null && "
            "dd if=/dev/urandom of=/mnt/x/gone bs=1M count=32 2>/dev/null && sync && "
            "sha256sum /mnt/x/keep > /tmp/keep.sum && rm /mnt/x/gone && sync"
        )
        trimmed = guest.run("fstrim -v /mnt/x").output
        # busybox fstrim prints "/mnt/x: N bytes trimmed"
        assert int(re.search(r"(\d+) bytes", trimmed).group(1)) >= 32 * MIB, trimmed  # type: ignore[union-attr]
        guest.run("umount /mnt/x")
        mounted = False
        # Drop the guest's page cache: the remount reads from the target.
        guest.run("echo 3 > /proc/sys/vm/drop_caches")
        guest.run(f"mount -t xfs {dev} /mnt/x")
        mounted = True
        guest.run("sha256sum -c /tmp/keep.sum", timeout=60)
        since = f"dmesg | tail -n +{logged + 1}"
        errors = guest.run(f"{since} | grep -c -E 'I/O Error|error' || true").output.strip()
        assert errors == "0", guest.run(f"{since} | grep -E -B3 -A3 'I/O Error|error'").output
    finally:
        if mounted:
            guest.run("umount /mnt/x", check=False)
        disconnect(guest, ss.nqn)


# -- NVMe 2.0: the host selects every I/O command set (CAP.CSS bit 6) ---------------------------


def test_host_selects_all_io_command_sets_and_reads_their_structures(
    guest: Guest, target: Setup
) -> None:
    check_host_selects_all_io_command_sets(guest, _ss(target, MEM))


def check_host_selects_all_io_command_sets(guest: Guest, ss: Subsys) -> None:
    dev = connect(guest, ss.port, ss.nqn)
    ctrl = re.sub(r"n\d+$", "", dev)
    try:
        cap = guest.run(f"nvme get-property {ctrl} --offset=0 -o json", check=False).output
        cc = guest.run(f"nvme get-property {ctrl} --offset=0x14").output
        # "property: 0x14 (CC), value: 460061": CSS (bits 6:4) = 110b, EN = 1
        value = int(re.search(r"value: *(?:0x)?([0-9a-fA-F]+)", cc).group(1), 16)  # type: ignore[union-attr]
        assert (value >> 4) & 0x7 == 0b110 and value & 1, (cc, cap)
        iocs = guest.run(f"nvme id-iocs {ctrl}").output
        assert re.search(r"I/O Command Set Combination\[0\]:\s*1\b", iocs), iocs
        nvm_ctrl = json.loads(guest.run(f"nvme nvm-id-ctrl {ctrl} -o json").output)
        assert (nvm_ctrl["wzsl"], nvm_ctrl["vsl"]) == (13, 13)
        indep = guest.run(f"nvme cmdset-ind-id-ns {dev} -n 1 -H").output
        assert re.search(r"nstat\s*:\s*0x1\b", indep), indep
        # I/O works as before on the controller enabled this way.
        guest.run(
            "dd if=/dev/urandom of=/tmp/css bs=4096 count=4 2>/dev/null && "
            f"dd if=/tmp/css of={dev} bs=4096 seek=77 oflag=direct 2>/dev/null && "
            f"dd if={dev} of=/tmp/css.back bs=4096 skip=77 count=4 iflag=direct 2>/dev/null"
            " && cmp /tmp/css /tmp/css.back"
        )
    finally:
        disconnect(guest, ss.nqn)


# -- Copy across namespaces: descriptor formats 2h/3h (TP 4130) ---------------------------------
#
# pynvmf accepts formats 2 and 3 (a source NSID per range) once the host has enabled them in
# the Host Behavior Support feature (16h, CDFE at bytes 4-5). Neither kernel enables them
# itself. Linux 6.1 passes `nvme set-feature -f 0x16` through, so a user can; Debian's 6.12
# kernel refuses that command from user space (nvme_admin_cmd_allowed() in
# drivers/nvme/host/ioctl.c rejects Set Features of Host Behavior Support, HMB, Number of
# Queues and APST with EACCES, even for root), so on 6.12 the formats stay disabled and
# nvme-cli 2.13's `nvme copy --format 2|3 --snsids` gets Invalid Field in Command.

HOST_BEHAVIOR_CDFE_2_3 = bytes(4) + bytes([0x0C, 0x00]) + bytes(506)
COPY_OPCODE = 0x19
# Source Range Entries with a source NSID (our own encoding, for nvme-cli 2.3's io-passthru;
# test_nvme_cli_copy_formats_2_and_3 checks nvme-cli 2.13's): format 2 is 32 bytes, format 3
# 40 (its extra bytes carry 64-bit protection information, unused here).
_COPY_F2 = struct.Struct("<I4xQH14x")
_COPY_F3 = struct.Struct("<I4xQH22x")


def _copy_descriptors(fmt: int, ranges: list[tuple[int, int, int]]) -> bytes:
    """(source NSID, first LBA, blocks) per range, as format 2 or 3 Source Range Entries."""
    entry = _COPY_F2 if fmt == 2 else _COPY_F3
    return b"".join(entry.pack(nsid, slba, nlb - 1) for nsid, slba, nlb in ranges)


def _passthru_copy(
    guest: Guest, dev: str, fmt: int, sdlba: int, ranges: list[tuple[int, int, int]]
) -> CommandResult:
    """A Copy with format `fmt` sent through `nvme io-passthru` (nvme-cli 2.3 has no other
    way to send formats 2/3)."""
    data = _copy_descriptors(fmt, ranges)
    guest.write_file("/tmp/copy-desc", data)
    cdw12 = (len(ranges) - 1) | fmt << 8
    return guest.run(
        f"nvme io-passthru {dev} --opcode={COPY_OPCODE} --namespace-id=1"
        f" --cdw10={sdlba & 0xFFFFFFFF} --cdw11={sdlba >> 32} --cdw12={cdw12}"
        f" --data-len={len(data)} --input-file=/tmp/copy-desc --write",
        check=False,
    )


def _cli_copy(
    guest: Guest, dev: str, fmt: int, sdlba: int, ranges: list[tuple[int, int, int]]
) -> CommandResult:
    """The same Copy built by nvme-cli itself (2.13: --format 2|3 with --snsids)."""
    snsids = ",".join(str(n) for n, _, _ in ranges)
    slbs = ",".join(str(s) for _, s, _ in ranges)
    nlbs = ",".join(str(b - 1) for _, _, b in ranges)  # 0's based
    return guest.run(
        f"nvme copy {dev} --format={fmt} --sdlba={sdlba} --slbs={slbs} --blocks={nlbs}"
        f" --snsids={snsids}",
        check=False,
    )


def _fill(guest: Guest, dev: str, lba: int, blocks: int, path: str) -> None:
    guest.run(
        f"dd if=/dev/urandom of={path} bs=512 count={blocks} status=none && "
        f"dd if={path} of={dev} bs=512 seek={lba} oflag=direct status=none"
    )


def _blocks_equal(guest: Guest, dev: str, lba: int, pieces: list[tuple[str, int, int]]) -> None:
    """Blocks from `lba` of `dev` must be the (file, first block, count) pieces in order."""
    total = sum(n for _, _, n in pieces)
    parts = "; ".join(f"dd if={f} bs=512 skip={s} count={n} status=none" for f, s, n in pieces)
    guest.run(
        f"dd if={dev} of=/tmp/copy-got bs=512 skip={lba} count={total} iflag=direct status=none"
        f" && ({parts}) > /tmp/copy-want && cmp /tmp/copy-got /tmp/copy-want"
    )


def _copyx_devices(guest: Guest, nqn: str) -> tuple[str, str, str]:
    """(controller, namespace 1, namespace 2) devices of the connected subsystem `nqn`."""
    ns1 = guest.run(f"sh /usr/local/bin/dev-for {nqn} 1").output.strip()
    ns2 = guest.run(f"sh /usr/local/bin/dev-for {nqn} 2").output.strip()
    found = guest.run(f"grep -lx {nqn} /sys/class/nvme/nvme*/subsysnqn").output.split()
    assert len(found) == 1, found
    return f"/dev/{found[0].split('/')[-2]}", ns1, ns2


def _bad_source_nsids(guest: Guest, ctrl: str, copy: Callable[[int], CommandResult]) -> None:
    """A source NSID of no namespace: inactive (within NN) or invalid (beyond it)."""
    nn = json.loads(guest.run(f"nvme id-ctrl {ctrl} -o json").output)["nn"]
    out = copy(9)
    assert nn > 9 and out.rc != 0 and "Invalid Field in Command" in out.output, (nn, out)
    out = copy(nn + 1)
    assert out.rc != 0 and "Invalid Namespace or Format" in out.output, (nn, out)


def _enable_formats_2_and_3(guest: Guest, ctrl: str) -> CommandResult:
    guest.write_file("/tmp/hbs", HOST_BEHAVIOR_CDFE_2_3)
    return guest.run(
        f"nvme set-feature {ctrl} --feature-id=0x16 --data-len=512 --data=/tmp/hbs", check=False
    )


def test_cross_namespace_copy_is_refused_until_the_host_enables_formats_2_and_3(
    guest: Guest, target: Setup
) -> None:
    check_cross_namespace_copy_is_refused_until_the_host_enables_formats_2_and_3(
        guest, _ss(target, COPYX)
    )


def check_cross_namespace_copy_is_refused_until_the_host_enables_formats_2_and_3(
    guest: Guest, ss: Subsys
) -> None:
    """`ss` has two namespaces of at least 64 KiB, and copy formats 2/3 off by default."""
    guest.run(f"nvme connect {connect_args(ss.port, ss.nqn)}")
    ctrl, ns1, ns2 = _copyx_devices(guest, ss.nqn)
    # 6.1 has nvme-cli 2.3, whose `nvme copy` knows formats 0 and 1 only.
    send = _cli_copy if guest.peer.cli_copy_formats_2_3 else _passthru_copy
    try:
        _fill(guest, ns2, 100, 24, "/tmp/x2")
        _fill(guest, ns1, 0, 64, "/tmp/x1")  # what the destination holds before
        cross = [(2, 100, 8), (2, 116, 8)]
        # Not enabled (as on every new controller): Invalid Field in Command, nothing written.
        for fmt in (2, 3):
            out = send(guest, ns1, fmt, 0, cross)
            assert out.rc != 0 and "Invalid Field in Command" in out.output, out
        _blocks_equal(guest, ns1, 0, [("/tmp/x1", 0, 64)])
        enable = _enable_formats_2_and_3(guest, ctrl)
        if not guest.peer.user_host_behavior:
            # The kernel keeps Host Behavior Support to itself: the command never leaves it,
            # and the formats stay disabled.
            assert enable.rc != 0 and "Permission denied" in enable.output, enable
            hbs = guest.run(f"nvme get-feature {ctrl} --feature-id=0x16 -H").output
            assert re.search(r"\(CDF2E\)\s*:\s*False", hbs), hbs
            assert re.search(r"\(CDF3E\)\s*:\s*False", hbs), hbs
            out = send(guest, ns1, 2, 0, cross)
            assert out.rc != 0 and "Invalid Field in Command" in out.output, out
            _blocks_equal(guest, ns1, 0, [("/tmp/x1", 0, 64)])
            return
        assert enable.rc == 0, enable
        raw = guest.run(
            f"nvme get-feature {ctrl} --feature-id=0x16 --data-len=512 -b | od -An -tx1 -N8"
        ).output.split()
        assert raw == ["00", "00", "00", "00", "0c", "00", "00", "00"], raw
        # Format 2: two ranges of namespace 2 gathered at LBA 0 of namespace 1.
        out = send(guest, ns1, 2, 0, cross)
        assert out.rc == 0, out
        _blocks_equal(guest, ns1, 0, [("/tmp/x2", 0, 8), ("/tmp/x2", 16, 8), ("/tmp/x1", 16, 48)])
        # Format 3, a range of each namespace (namespace 1's own blocks too).
        out = send(guest, ns1, 3, 32, [(1, 56, 4), (2, 108, 8)])
        assert out.rc == 0, out
        _blocks_equal(guest, ns1, 32, [("/tmp/x1", 56, 4), ("/tmp/x2", 8, 8), ("/tmp/x1", 44, 20)])
        _bad_source_nsids(guest, ctrl, lambda nsid: send(guest, ns1, 2, 0, [(nsid, 100, 8)]))
    finally:
        disconnect(guest, ss.nqn)
    # The setting belonged to that controller: the next one starts with the formats disabled.
    guest.run(f"nvme connect {connect_args(ss.port, ss.nqn)}")
    try:
        _ctrl, ns1, _ns2 = _copyx_devices(guest, ss.nqn)
        out = send(guest, ns1, 2, 0, [(2, 100, 8)])
        assert out.rc != 0 and "Invalid Field in Command" in out.output, out
    finally:
        disconnect(guest, ss.nqn)


def test_nvme_cli_copy_formats_2_and_3_with_snsids(guest: Guest, target: Setup) -> None:
    check_nvme_cli_copy_formats_2_and_3_with_snsids(guest, _ss(target, COPYN), _ss(target, COPY3))


def check_nvme_cli_copy_formats_2_and_3_with_snsids(
    guest: Guest, copyn: Subsys, copy3: Subsys
) -> None:
    """`copyn` and `copy3` have two namespaces of at least 1 MiB each, and the target's
    configuration enables copy formats 2 and 3 (`copyn`) or 3 alone (`copy3`)."""
    if not guest.peer.cli_copy_formats_2_3:
        # nvme-cli 2.3 refuses the formats itself; nothing is sent.
        out = guest.run("nvme copy /dev/null --format=2 --sdlba=0 --slbs=0 --blocks=0", check=False)
        assert out.rc != 0 and "invalid format" in out.output, out
        return
    guest.run(f"nvme connect {connect_args(copyn.port, copyn.nqn)}")
    try:
        ctrl, ns1, ns2 = _copyx_devices(guest, copyn.nqn)
        _fill(guest, ns2, 200, 32, "/tmp/n2")
        _fill(guest, ns1, 300, 16, "/tmp/n1")
        # The target's configuration enabled the formats: nvme-cli 2.13 reads them back.
        hbs = guest.run(f"nvme get-feature {ctrl} --feature-id=0x16 -H").output
        assert re.search(r"\(CDF2E\)\s*:\s*True", hbs), hbs
        assert re.search(r"\(CDF3E\)\s*:\s*True", hbs), hbs
        assert re.search(r"\(CDF4E\)\s*:\s*False", hbs), hbs
        # Format 2: ranges of both namespaces, gathered in namespace 1.
        out = _cli_copy(guest, ns1, 2, 1000, [(2, 200, 8), (1, 300, 4), (2, 224, 8)])
        assert out.rc == 0 and "NVMe Copy: success" in out.output, out
        _blocks_equal(guest, ns1, 1000, [("/tmp/n2", 0, 8), ("/tmp/n1", 0, 4), ("/tmp/n2", 24, 8)])
        # Format 3 (40-byte entries), into namespace 2 from namespace 1.
        out = _cli_copy(guest, ns2, 3, 2000, [(1, 304, 12), (2, 208, 16)])
        assert out.rc == 0 and "NVMe Copy: success" in out.output, out
        _blocks_equal(guest, ns2, 2000, [("/tmp/n1", 4, 12), ("/tmp/n2", 8, 16)])
        # The source NSID is checked per range.
        _bad_source_nsids(
            guest, ctrl, lambda nsid: _cli_copy(guest, ns1, 2, 1000, [(2, 200, 8), (nsid, 0, 8)])
        )
        last = copyn.size // copyn.block_size
        out = _cli_copy(guest, ns1, 3, 0, [(2, last - 4, 8)])
        assert out.rc != 0 and "LBA Out of Range" in out.output, out
    finally:
        disconnect(guest, copyn.nqn)
    # Format 3 alone enabled: format 2 is refused.
    guest.run(f"nvme connect {connect_args(copy3.port, copy3.nqn)}")
    try:
        _ctrl, ns1, _ns2 = _copyx_devices(guest, copy3.nqn)
        out = _cli_copy(guest, ns1, 2, 1000, [(2, 200, 8)])
        assert out.rc != 0 and "Invalid Field in Command" in out.output, out
        out = _cli_copy(guest, ns1, 3, 1000, [(2, 200, 8)])
        assert out.rc == 0, out
    finally:
        disconnect(guest, copy3.nqn)


async def _scrape_until(address: tuple[str, int], done: Callable[[Samples], bool]) -> Samples:
    """Scrape until `done`: a worker process reports its counts every half second at most."""
    async with asyncio.timeout(30):
        while not done(m := await scrape(*address)):
            await asyncio.sleep(0.05)
    return m


def test_metrics_count_the_kernel_hosts_commands_exactly(guest: Guest, target: Setup) -> None:
    """Commands nvme-cli sends through the kernel's passthrough, counted per host and
    namespace by pynvmf_commands_total and its bytes and errors: writes and an out of
    range read, which the kernel never sends by itself (its own reads at connect time,
    the partition scan's, are left out of the comparison). One target serves every guest
    kernel of the module: what an earlier one counted is the baseline."""
    labels = {"subsystem": COUNTED, "nsid": "1", "host": COUNTED_HOST}
    error = {"opcode": "read", "status": "lba_out_of_range", **labels}
    before = asyncio.run(scrape(*target.metrics))
    writes = value(before, "pynvmf_commands_total", opcode="write", **labels) or 0
    written = value(before, "pynvmf_command_bytes_total", direction="write", **labels) or 0
    failed = value(before, "pynvmf_command_errors_total", **error) or 0
    dev = connect(guest, target.io_port, COUNTED, f"--hostnqn={COUNTED_HOST}")
    try:
        for lba in (0, 8, 16):
            guest.run(f"nvme write {dev} --start-block={lba} --block-count=7 --data-size=4096")
        last = SIZES[COUNTED] // 512
        out = guest.run(
            f"nvme read {dev} --start-block={last} --block-count=0 --data-size=512", check=False
        )
        assert out.rc != 0
    finally:
        disconnect(guest, COUNTED)
    m = asyncio.run(
        _scrape_until(
            target.metrics,
            lambda m: (
                value(m, "pynvmf_commands_total", opcode="write", **labels) == writes + 3
                and value(m, "pynvmf_command_errors_total", **error) == failed + 1
            ),
        )
    )
    assert value(m, "pynvmf_command_bytes_total", direction="write", **labels) == (
        written + 3 * 4096
    )
    errors = [dict(k) for k in series(m, "pynvmf_command_errors_total")]
    assert [k for k in errors if k["subsystem"] == COUNTED] == [error]
    commands = [dict(k) for k in series(m, "pynvmf_commands_total")]
    assert {k["host"] for k in commands if k["subsystem"] == COUNTED} == {COUNTED_HOST}
