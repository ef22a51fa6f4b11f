"""The acceptance test of the target core: the Linux kernel's NVMe/TCP host, booted
under QEMU, discovers, connects to, identifies, writes and reads pynvmf's target with
its own tools (nvme-cli, dd, fio), and nothing written is lost.

One guest boot and one target process serve the whole module.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.interop.guest import Guest, free_tcp_port
from tests.interop.target_process import TargetProcess

MIB = 1 << 20
MEM = "nqn.2024-11.dev.pynvmf:interop-mem"
FILE = "nqn.2024-11.dev.pynvmf:interop-file"
MEM4K = "nqn.2024-11.dev.pynvmf:interop-mem4k"
RESTRICTED = "nqn.2024-11.dev.pynvmf:interop-restricted"
# mkfs.xfs (xfsprogs 6.x) refuses filesystems under 300 MiB.
DISCARD = "nqn.2024-11.dev.pynvmf:interop-discard"
ALLOWED_HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a110"
SIZES = {MEM: 64 * MIB, FILE: 64 * MIB, MEM4K: 64 * MIB, RESTRICTED: 16 * MIB, DISCARD: 512 * MIB}
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
        nvme*n"$nsid")
          dev=/dev/$(echo "$n" | sed -E 's/c[0-9]+n/n/')
          [ -b "$dev" ] && { echo "$dev"; exit 0; } ;;
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
    io_port: int
    io_port6: int
    io_port_4k: int
    disc_port: int
    backing: Path


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
                "nqn": RESTRICTED,
                "hosts": [ALLOWED_HOST],
                "namespaces": [{"nsid": 1, "memory": SIZES[RESTRICTED]}],
            },
        ],
    }
    proc = TargetProcess(config, workdir)
    proc.start()
    yield Setup(proc, io_port, io_port6, io_port_4k, disc_port, backing)
    status = proc.stop()
    assert status == 0, f"target exited with {status}:\n{proc.stderr()}"


@pytest.fixture(scope="module")
def guest(target: Setup) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR})
    g.start()
    yield g
    g.stop()


def _connect_args(target: Setup, nqn: str) -> str:
    return f"-t tcp -a {Guest.host_address} -s {target.io_port} -n {nqn}"


def _connect(guest: Guest, target: Setup, nqn: str, extra: str = "") -> str:
    guest.run(f"nvme connect {_connect_args(target, nqn)} {extra}")
    return guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()


def _disconnect(guest: Guest, nqn: str) -> None:
    out = guest.run(f"nvme disconnect -n {nqn}").output
    assert "disconnected 1 controller" in out


def _subnqns(discover_output: str) -> list[str]:
    return re.findall(r"^subnqn:\s+(\S+)", discover_output, re.MULTILINE)


def test_discover_lists_every_subsystem_the_host_may_use(guest: Guest, target: Setup) -> None:
    for port in (target.disc_port, target.io_port):
        out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {port}").output
        listed = _subnqns(out)
        # MEM is on the IPv4 port, the IPv6 port and the 4 KiB in-capsule port; the last
        # entry is the discovery subsystem answering.
        assert sorted(listed) == sorted(
            [MEM, FILE, MEM4K, DISCARD, MEM, MEM, "nqn.2014-08.org.nvmexpress.discovery"]
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
    dev = _connect(guest, target, nqn)
    try:
        listing = json.loads(guest.run("nvme list -o json").output)
        (entry,) = [d for d in listing["Devices"] if d["DevicePath"] == dev]
        assert entry["PhysicalSize"] == SIZES[nqn]
        assert entry["SectorSize"] == BLOCK_SIZES[nqn]
        assert entry["ModelNumber"].strip() == "pynvmf"
        id_ctrl = json.loads(guest.run(f"nvme id-ctrl {dev} -o json").output)
        assert id_ctrl["subnqn"] == nqn
        assert id_ctrl["cntrltype"] == 1
        assert id_ctrl["maxcmd"] > 0
        assert id_ctrl["ioccsz"] == (64 + 16384) // 16
        id_ns = json.loads(guest.run(f"nvme id-ns {dev} -o json").output)
        assert id_ns["nsze"] == SIZES[nqn] // BLOCK_SIZES[nqn]
        lbaf = id_ns["lbafs"][id_ns["flbas"] & 0xF]
        assert 1 << lbaf["ds"] == BLOCK_SIZES[nqn]
        sysfs = guest.run(f"cat /sys/block/{dev.removeprefix('/dev/')}/queue/logical_block_size")
        assert int(sysfs.output) == BLOCK_SIZES[nqn]
        descs = guest.run(f"nvme ns-descs {dev}").output
        assert "nguid" in descs.lower() and "uuid" in descs.lower()
    finally:
        _disconnect(guest, nqn)


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_dd_at_several_offsets_reads_back_identical(guest: Guest, target: Setup, nqn: str) -> None:
    dev = _connect(guest, target, nqn)
    try:
        size = SIZES[nqn]
        # The start, an unaligned spot in the middle, and the very last 64 KiB.
        for offset in (0, 3 * MIB + 40960, size - 65536):
            guest.run(
                "dd if=/dev/urandom of=/tmp/pattern bs=4096 count=16 2>/dev/null && "
                f"dd if=/tmp/pattern of={dev} bs=4096 seek={offset // 4096} "
                "oflag=direct conv=notrunc 2>/dev/null && "
                f"dd if={dev} of=/tmp/back bs=4096 skip={offset // 4096} count=16 "
                "iflag=direct 2>/dev/null && cmp /tmp/pattern /tmp/back"
            )
    finally:
        _disconnect(guest, nqn)


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_fio_random_write_verify(guest: Guest, target: Setup, nqn: str) -> None:
    dev = _connect(guest, target, nqn)
    try:
        bs = max(4096, BLOCK_SIZES[nqn])
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
        _disconnect(guest, nqn)


def test_disconnect_then_reconnect_keeps_the_data(guest: Guest, target: Setup) -> None:
    dev = _connect(guest, target, MEM)
    guest.run(
        "dd if=/dev/urandom of=/tmp/keep bs=4096 count=8 2>/dev/null && "
        f"dd if=/tmp/keep of={dev} bs=4096 seek=1000 oflag=direct 2>/dev/null"
    )
    _disconnect(guest, MEM)
    assert guest.run(f"sh /usr/local/bin/dev-for {MEM}", check=False, timeout=60).rc != 0
    dev = _connect(guest, target, MEM)
    try:
        guest.run(
            f"dd if={dev} of=/tmp/again bs=4096 skip=1000 count=8 iflag=direct 2>/dev/null"
            " && cmp /tmp/keep /tmp/again"
        )
    finally:
        _disconnect(guest, MEM)


def test_host_not_allowed_is_refused(guest: Guest, target: Setup) -> None:
    refused = guest.run(f"nvme connect {_connect_args(target, RESTRICTED)}", check=False)
    assert refused.rc != 0
    assert "nvme0" not in guest.run("ls /dev").output.split()
    dmesg = guest.run("dmesg | tail -5").output
    # The kernel names the status: Connect Invalid Host (0x184) with Do Not Retry (0x4000).
    assert f"Connect for subsystem {RESTRICTED} is not allowed" in dmesg, dmesg
    assert f"ret={0x4000 | 0x184}" in dmesg, dmesg
    # The host that is allowed gets in.
    dev = _connect(guest, target, RESTRICTED, f"--hostnqn={ALLOWED_HOST}")
    assert dev.startswith("/dev/nvme")
    _disconnect(guest, RESTRICTED)


def test_out_of_range_read_gets_lba_out_of_range(guest: Guest, target: Setup) -> None:
    dev = _connect(guest, target, MEM)
    try:
        last = SIZES[MEM] // 512
        out = guest.run(
            f"nvme read {dev} --start-block={last} --block-count=0 --data-size=512",
            check=False,
        )
        assert out.rc != 0
        assert "LBA_RANGE" in out.output or "Out of Range" in out.output, out.output
    finally:
        _disconnect(guest, MEM)


def test_flushed_file_data_is_in_the_backing_file(guest: Guest, target: Setup) -> None:
    dev = _connect(guest, target, FILE)
    try:
        offset = 5 * MIB
        digest = guest.run(
            "dd if=/dev/urandom of=/tmp/durable bs=4096 count=64 2>/dev/null && "
            f"dd if=/tmp/durable of={dev} bs=4096 seek={offset // 4096} oflag=direct "
            f"2>/dev/null && nvme flush {dev} >/dev/null && sha256sum /tmp/durable"
        ).output.split()[0]
    finally:
        _disconnect(guest, FILE)
    backing = target.backing
    with backing.open("rb") as f:
        f.seek(offset)
        assert hashlib.sha256(f.read(64 * 4096)).hexdigest() == digest


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
        _disconnect(guest, MEM)


# -- offloads negotiated with the real host: in-capsule data and digests ----------------------

_CLOSED = re.compile(
    r"connection closed: port=(\S+) qid=(\d+) cntlid=\d+ digests=(\S+) (.*) reason="
)


def _log_offset(target: Setup) -> int:
    return len(target.process.stderr())


def _connection_stats(target: Setup, port: int, since: int) -> list[dict[str, int | str]]:
    """The target's per-connection transport counters for `port`, logged at close.

    The kernel's disconnect returns before the target has seen every socket close,
    so wait (bounded) for the admin queue's line, which the kernel closes last.
    """
    deadline = time.monotonic() + 30
    while True:
        stats = []
        for m in _CLOSED.finditer(target.process.stderr()[since:]):
            if m.group(1) != f"127.0.0.1:{port}":
                continue
            entry: dict[str, int | str] = {"qid": int(m.group(2)), "digests": m.group(3)}
            for field in m.group(4).split():
                key, value = field.split("=")
                entry[key] = int(value)
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
    since = _log_offset(target)
    dev = _connect(guest, target, MEM)
    try:
        for bs in (8192, 16384):
            _fio_write_verify(guest, dev, bs, 2 * MIB)
    finally:
        _disconnect(guest, MEM)
    stats = _connection_stats(target, target.io_port, since)
    assert _io_queue_totals(stats, "r2t") == 0, stats
    assert _io_queue_totals(stats, "in_capsule_bytes") >= 4 * MIB, stats


def test_4k_in_capsule_target_falls_back_to_r2t_with_the_same_data(
    guest: Guest, target: Setup
) -> None:
    since = _log_offset(target)
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {target.io_port_4k} -n {MEM}")
    dev = guest.run(f"sh /usr/local/bin/dev-for {MEM}").output.strip()
    try:
        for bs in (8192, 16384):
            _fio_write_verify(guest, dev, bs, 2 * MIB)
    finally:
        _disconnect(guest, MEM)
    stats = _connection_stats(target, target.io_port_4k, since)
    writes = 2 * MIB // 8192 + 2 * MIB // 16384
    # Exactly one R2T per fio write (reads never need one), answered by one H2CData each
    # since the host's writes are smaller than MAXH2CDATA.
    assert _io_queue_totals(stats, "r2t") == writes, stats
    assert _io_queue_totals(stats, "h2c_data") == writes, stats
    # Nothing larger than 4 KiB travelled in a capsule.
    assert _io_queue_totals(stats, "in_capsule_bytes") < writes * 8192, stats


def test_header_and_data_digests_with_fio_verify(guest: Guest, target: Setup) -> None:
    since = _log_offset(target)
    dev = _connect(guest, target, MEM, "--hdr-digest --data-digest")
    try:
        _fio_write_verify(guest, dev, 4096, 2 * MIB)  # in the capsule
        _fio_write_verify(guest, dev, 65536, 4 * MIB)  # R2T and H2CData
    finally:
        _disconnect(guest, MEM)
    stats = _connection_stats(target, target.io_port, since)
    assert stats and all(e["digests"] == "hd" for e in stats), stats
    assert _io_queue_totals(stats, "data_digest_errors") == 0
    assert _io_queue_totals(stats, "r2t") >= 4 * MIB // 65536


# -- copy offload: the kernel host's `nvme copy` ------------------------------------------------


@pytest.mark.parametrize("nqn", [MEM, FILE, MEM4K])
def test_nvme_copy_single_many_ranges_at_the_end_and_past_it(
    guest: Guest, target: Setup, nqn: str
) -> None:
    bs = BLOCK_SIZES[nqn]
    last = SIZES[nqn] // bs  # the first LBA past the end
    dev = _connect(guest, target, nqn)

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
        _disconnect(guest, nqn)


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
    dev = _connect(guest, target, DISCARD)
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
        assert errors == "0", guest.run("dmesg | tail -20").output
    finally:
        _disconnect(guest, DISCARD)


def test_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest: Guest, target: Setup) -> None:
    dev = _connect(guest, target, DISCARD)
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
        guest.run(f"mount -t xfs {dev} /mnt/x")
        mounted = True
        guest.run("sha256sum -c /tmp/keep.sum", timeout=60)
        errors = guest.run("dmesg | grep -c -E 'I/O Error|error' || true").output.strip()
        assert errors == "0", guest.run("dmesg | tail -20").output
    finally:
        if mounted:
            guest.run("umount /mnt/x", check=False)
        _disconnect(guest, DISCARD)


# -- NVMe 2.0: the host selects every I/O command set (CAP.CSS bit 6) ---------------------------


def test_host_selects_all_io_command_sets_and_reads_their_structures(
    guest: Guest, target: Setup
) -> None:
    dev = _connect(guest, target, MEM)
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
        _disconnect(guest, MEM)
