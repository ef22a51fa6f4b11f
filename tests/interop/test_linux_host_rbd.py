"""A namespace on a Ceph RBD image passes the Linux host's checks that a file namespace
passes (test_linux_host.py): dd at several offsets, fio write + verify with flushes,
exact discards, mkfs.xfs + mount + checksums + fstrim + remount; and what the guest
wrote is in the image (read back through librbd on the machine).

The target runs as `pynvmf target --rbd rbd/IMAGE --ceph-conf ...` (the CLI), against
the session's test cluster (tests/ceph/cluster.py). One peer, Linux 6.1: what varies
here is the backend, not the host, and the checks run on both peers for file and
memory namespaces already.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ceph.cluster import CephCluster
from tests.interop.guest import LINUX_6_1, Guest, Peer, free_tcp_port
from tests.interop.target_process import TargetProcess
from tests.interop.test_linux_host import DEV_FOR

pytestmark = pytest.mark.parametrize(
    "linux_peer", [LINUX_6_1], indirect=True, scope="module", ids=str
)

MIB = 1 << 20
NQN = "nqn.2024-11.dev.pynvmf:interop-rbd"
SIZE = 320 * MIB  # mkfs.xfs refuses file systems under 300 MiB


@dataclass
class Setup:
    process: TargetProcess
    port: int
    image: str
    cluster: CephCluster


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, ceph_cluster: CephCluster) -> Iterator[Setup]:
    workdir: Path = tmp_path_factory.mktemp("linux-host-rbd")
    image = "interop-linux-host"
    ceph_cluster.create_image(image, SIZE)
    port = free_tcp_port()
    proc = TargetProcess(
        None,
        workdir,
        [
            "--rbd",
            f"rbd/{image}",
            "--ceph-conf",
            str(ceph_cluster.conf),
            "--listen",
            f"127.0.0.1:{port}",
            "--discovery-port",
            "0",
            "--nqn",
            NQN,
        ],
    )
    proc.start()
    yield Setup(proc, port, image, ceph_cluster)
    status = proc.stop()
    assert status == 0, f"target exited with {status}:\n{proc.stderr()}"
    ceph_cluster.remove_image(image)


@pytest.fixture(scope="module")
def guest(target: Setup, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR}, peer=linux_peer)
    g.start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def dev(guest: Guest, target: Setup) -> Iterator[str]:
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {NQN}")
    yield guest.run(f"sh /usr/local/bin/dev-for {NQN}").output.strip()
    guest.run(f"nvme disconnect -n {NQN}", check=False)


def _sums(guest: Guest, dev: str, regions: list[tuple[int, int]]) -> list[str]:
    """SHA-256 of each (offset MiB, length MiB) region of `dev`, read with O_DIRECT."""
    return [
        guest.run(
            f"dd if={dev} bs=1M skip={off} count={n} iflag=direct 2>/dev/null | sha256sum"
        ).output.split()[0]
        for off, n in regions
    ]


def _image_sum(target: Setup, offset: int, length: int) -> str:
    """SHA-256 of a byte range of the image, read through librbd on the machine."""
    import rbd

    with (
        target.cluster.admin().open_ioctx("rbd") as io,
        rbd.Image(io, target.image, read_only=True) as img,
    ):
        return hashlib.sha256(img.read(offset, length)).hexdigest()


def _no_io_errors(guest: Guest) -> None:
    errors = guest.run("dmesg | grep -c -E 'I/O Error|blk_update_request' || true").output
    assert errors.strip() == "0", guest.run("dmesg | tail -20").output


def test_identify_reports_the_image(guest: Guest, dev: str) -> None:
    out = guest.run(f"nvme id-ns {dev} -o json").output
    ns = json.loads(out[out.index("{") :])
    assert ns["nsze"] == SIZE // 512
    # DLFEAT 001b: deallocated blocks read back as zeroes (librbd write_zeroes).
    assert ns["dlfeat"] & 7 == 1
    out = guest.run(f"nvme id-ctrl {dev} -o json").output
    ctrl = json.loads(out[out.index("{") :])
    assert ctrl["vwc"] & 1  # librbd's cache: the host sends flushes


def test_dd_at_several_offsets_is_in_the_image(guest: Guest, target: Setup, dev: str) -> None:
    for offset in (0, 3 * MIB + 40960, SIZE - 65536):
        guest.run(
            "dd if=/dev/urandom of=/tmp/pattern bs=4096 count=16 2>/dev/null && "
            f"/usr/bin/dd if=/tmp/pattern of={dev} bs=4096 seek={offset // 4096} "
            "oflag=direct,dsync conv=notrunc 2>/dev/null && "
            f"dd if={dev} of=/tmp/back bs=4096 skip={offset // 4096} count=16 "
            "iflag=direct 2>/dev/null && cmp /tmp/pattern /tmp/back"
        )
        guest_sum = guest.run("sha256sum /tmp/pattern").output.split()[0]
        assert _image_sum(target, offset, 65536) == guest_sum


def test_fio_write_verify_with_flushes(guest: Guest, dev: str) -> None:
    result = guest.run(
        f"fio --name=verify --filename={dev} --ioengine=libaio --direct=1 "
        "--rw=randwrite --bs=4k --size=8m --offset=8m --iodepth=32 --fsync=16 "
        "--verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=json",
        timeout=300,
    )
    (job,) = json.loads(result.output[result.output.index("{") :])["jobs"]
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == 8 * MIB and job["read"]["io_bytes"] == 8 * MIB
    assert job["sync"]["total_ios"] > 0  # the flushes went to the target (and librbd)
    guest.run(f"nvme flush {dev} -n 1")
    _no_io_errors(guest)


def test_blkdiscard_deallocates_exactly_its_ranges(guest: Guest, target: Setup, dev: str) -> None:
    guest.run(
        "dd if=/dev/urandom of=/tmp/d8 bs=1M count=8 2>/dev/null && "
        f"dd if=/tmp/d8 of={dev} bs=1M seek=16 oflag=direct 2>/dev/null"
    )
    keep = _sums(guest, dev, [(16, 1), (18, 1), (20, 4)])
    # 1 MiB is a quarter of an RBD object (4 MiB): a partial discard, still exact.
    guest.run(f"blkdiscard -o {17 * MIB} -l {MIB} {dev}")
    guest.run(f"blkdiscard -o {19 * MIB} -l {MIB} {dev}")
    zero = hashlib.sha256(bytes(MIB)).hexdigest()
    assert _sums(guest, dev, [(17, 1), (19, 1)]) == [zero, zero]
    assert _sums(guest, dev, [(16, 1), (18, 1), (20, 4)]) == keep
    assert _image_sum(target, 17 * MIB, MIB) == zero
    _no_io_errors(guest)


def test_mkfs_xfs_mount_checksums_fstrim_remount(guest: Guest, target: Setup, dev: str) -> None:
    mounted = False
    try:
        guest.run(f"mkfs.xfs -f {dev}", timeout=300)
        guest.run("modprobe xfs && mkdir -p /mnt/r")
        guest.run(f"mount -t xfs {dev} /mnt/r")
        mounted = True
        guest.run(
            "dd if=/dev/urandom of=/mnt/r/keep bs=1M count=8 2>/dev/null && "
            "dd if=/dev/urandom of=/mnt/r/gone bs=1M count=32 2>/dev/null && sync && "
            "sha256sum /mnt/r/keep > /tmp/keep.sum && rm /mnt/r/gone && sync"
        )
        trimmed = guest.run("fstrim -v /mnt/r").output
        match = re.search(r"(\d+) bytes", trimmed)
        assert match is not None and int(match.group(1)) >= 32 * MIB, trimmed
        guest.run("umount /mnt/r")
        mounted = False
        # Drop the guest's page cache: the remount reads from the target, i.e. from RBD.
        guest.run("echo 3 > /proc/sys/vm/drop_caches")
        guest.run(f"mount -t xfs {dev} /mnt/r")
        mounted = True
        guest.run("sha256sum -c /tmp/keep.sum", timeout=60)
        _no_io_errors(guest)
    finally:
        if mounted:
            guest.run("umount /mnt/r", check=False)
