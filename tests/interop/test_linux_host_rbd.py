"""Namespaces on Ceph RBD images pass the Linux host's checks that file and memory
namespaces pass, on the oldest and the newest kernel peer (Linux 6.1 with nvme-cli 2.3,
Linux 7 with Debian unstable's nvme-cli): one guest boot per peer, one target process
shared by both.

The checks are the other modules' own check_* functions, called with RBD subsystems:

- test_linux_host.py: connect + Identify + `nvme list`, dd at three offsets, fio
  randwrite + verify, disconnect + reconnect keeps the data, a read past the end (LBA
  Out of Range), flushed data is stored (here: in the image, read back through librbd
  on the machine, where the file module reads its backing file), 16 KiB in-capsule
  writes, the 4 KiB in-capsule port falling back to R2T, header and data digests with
  fio verify, `nvme copy` (one range, sixteen, format 1 + FUA, at the end, past it),
  blkdiscard of exact ranges, mkfs.xfs (its discard of the whole device) + mount +
  fstrim + remount, the host selecting every I/O command set, and Copy across two
  namespaces (two images) with descriptor formats 2 and 3;
- test_linux_host_reservations.py: Write Exclusive both ways, Report + Preempt + the
  notification log (with its AEN), bad input from nvme-cli, persistence through power
  loss on request (the namespace's `ptpl_file`: an RBD namespace has no file beside it)
  and the kernel's own pr_ops; pynvmf's host library is the other registrant;
- test_linux_host_compare.py: Identify of Compare/Verify/fused, `nvme compare` match
  and mismatch, `nvme verify`, and fused commands refused by Linux itself.

On RBD a Copy is carried out by the gateway (librbd copies no ranges: docs/rbd.md), and a
deallocated range is `aio_write_zeroes`. Besides, RBD-specific: DLFEAT and VWC as librbd's
cache sets them, fio with fsyncs reaching librbd, Write Zeroes of an exact range, what dd,
blkdiscard, Write Zeroes and the shutdown's flush leave in the image, and `pynvmf target
--rbd` (the command line, not a configuration file) serving an image.

Not repeated here, because no backend takes part in them: the discovery log's listing,
a host that is not allowed, IPv6.

The target runs against the session's test cluster (tests/support/ceph_cluster.py).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.host import Controller
from pynvmf.rpc.client import RpcClient
from tests.interop import test_linux_host as host
from tests.interop import test_linux_host_compare as compare
from tests.interop import test_linux_host_reservations as resv
from tests.interop.test_linux_host import DEV_FOR, Subsys
from tests.support.ceph_cluster import CephCluster
from tests.support.guest import NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = NEWEST.mark()

MIB = 1 << 20
PREFIX = "nqn.2024-11.dev.pynvmf:interop-rbd"
RBD = PREFIX  # one namespace, the image MAIN_IMAGE
RBD4K = f"{PREFIX}-4k"  # 4 KiB blocks, on an image that is not a whole number of them
COPYX, COPYN, COPY3 = f"{PREFIX}-copyx", f"{PREFIX}-copyn", f"{PREFIX}-copy3"
RESV = f"{PREFIX}-resv"
COMPARE = f"{PREFIX}-compare"
CLI = f"{PREFIX}-cli"
SIZE = 320 * MIB  # mkfs.xfs refuses file systems under 300 MiB
SMALL = 16 * MIB
MAIN_IMAGE = "interop-linux-host"
IMAGE_4K = "interop-rbd-4k-1"
SIZE_4K = 64 * MIB  # the namespace: the image's 64 MiB + 3 KiB rounded down to 4 KiB blocks
CLI_IMAGE = "interop-linux-host-cli"
RESV_NAMESPACES = (
    resv.NS_WRITE_EXCLUSIVE,
    resv.NS_REPORT,
    resv.NS_BAD_INPUT,
    resv.NS_FILE,
    resv.NS_PR_OPS,
)


@dataclass
class Setup:
    process: TargetProcess
    port: int
    port_4k: int
    cluster: CephCluster
    ptpl_file: Path

    def ss(self, nqn: str, size: int = SMALL) -> Subsys:
        if nqn == RBD4K:
            return Subsys(nqn, self.port, SIZE_4K, 4096)
        return Subsys(nqn, self.port, size)


def _images() -> dict[str, int]:
    """Every image the target serves: name -> size."""
    images = {MAIN_IMAGE: SIZE, IMAGE_4K: SIZE_4K + 3072, f"{COMPARE}-1": SMALL}
    for nqn in (COPYX, COPYN, COPY3):
        images |= {f"{nqn}-1": SMALL, f"{nqn}-2": SMALL}
    images |= {f"{RESV}-{nsid}": SMALL for nsid in RESV_NAMESPACES}
    return {name.split(":")[-1]: size for name, size in images.items()}


def _image(nqn: str, nsid: int) -> str:
    return f"{nqn}-{nsid}".split(":")[-1]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, ceph_cluster: CephCluster) -> Iterator[Setup]:
    workdir: Path = tmp_path_factory.mktemp("linux-host-rbd")
    images = _images()
    for name, size in images.items():
        ceph_cluster.create_image(name, size)
    port, port_4k = free_tcp_port(), free_tcp_port()
    ptpl_file = workdir / "resv.ptpl.json"

    def rbd(image: str) -> dict[str, str]:
        return {"pool": "rbd", "image": image, "conf": str(ceph_cluster.conf)}

    def pair(nqn: str) -> list[dict[str, object]]:
        return [{"nsid": n, "rbd": rbd(_image(nqn, n))} for n in (1, 2)]

    config = {
        "ports": [
            {"address": "127.0.0.1", "port": port},
            {
                "address": "127.0.0.1",
                "port": port_4k,
                "subsystems": [RBD],
                "inline_data_size": 4096,
            },
        ],
        "discovery_ports": [],
        "subsystems": [
            {"nqn": RBD, "namespaces": [{"nsid": 1, "rbd": rbd(MAIN_IMAGE)}]},
            {
                "nqn": RBD4K,
                "namespaces": [{"nsid": 1, "rbd": rbd(IMAGE_4K), "block_size": 4096}],
            },
            {"nqn": COPYX, "namespaces": pair(COPYX)},
            {"nqn": COPYN, "copy_formats": [2, 3], "namespaces": pair(COPYN)},
            {"nqn": COPY3, "copy_formats": [3], "namespaces": pair(COPY3)},
            {
                "nqn": RESV,
                "namespaces": [
                    {
                        "nsid": n,
                        "rbd": rbd(_image(RESV, n)),
                        **({"ptpl_file": str(ptpl_file)} if n == resv.NS_FILE else {}),
                    }
                    for n in RESV_NAMESPACES
                ],
            },
            {"nqn": COMPARE, "namespaces": [{"nsid": 1, "rbd": rbd(_image(COMPARE, 1))}]},
        ],
    }
    proc = TargetProcess(config, workdir)
    proc.start()
    yield Setup(proc, port, port_4k, ceph_cluster, ptpl_file)
    proc.stop()
    for name in images:
        ceph_cluster.remove_image(name)


@pytest.fixture(scope="module")
def guest(
    target: Setup, tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer
) -> Iterator[Guest]:
    prtool = resv.build_prtool(tmp_path_factory.mktemp("prtool"))
    g = Guest(
        extra_files={"/usr/local/bin/dev-for": DEV_FOR, "/usr/local/bin/prtool": prtool},
        peer=linux_peer,
    )
    g.start()
    yield g
    g.stop()


@pytest.fixture(autouse=True)
def _target_alive(target: Setup) -> Iterator[None]:
    yield
    assert target.process.alive, target.process.stderr()


def _image_bytes(cluster: CephCluster, image: str, offset: int, length: int) -> bytes:
    """A byte range of an image, read through librbd on the machine (another client than
    the target's: it sees what the target's librbd has written out, not its cache)."""
    import rbd

    with cluster.admin().open_ioctx("rbd") as io, rbd.Image(io, image, read_only=True) as img:
        data: bytes = img.read(offset, length)
        return data


def _image_sum(cluster: CephCluster, image: str, offset: int, length: int) -> str:
    return hashlib.sha256(_image_bytes(cluster, image, offset, length)).hexdigest()


def _no_io_errors(guest: Guest) -> None:
    errors = guest.run("dmesg | grep -c -E 'I/O Error|blk_update_request' || true").output
    assert errors.strip() == "0", guest.run("dmesg | tail -20").output


# -- the command line: `pynvmf target --rbd` ---------------------------------------------------


def _rbd_target_process(
    cluster: CephCluster, workdir: Path, image: str, nqn: str, port: int, *extra: str
) -> TargetProcess:
    """`pynvmf target --rbd` serving `image` as `nqn` on `port`, started."""
    proc = TargetProcess(
        None,
        workdir,
        [
            "--rbd",
            f"rbd/{image}",
            "--ceph-conf",
            str(cluster.conf),
            "--listen",
            f"127.0.0.1:{port}",
            "--discovery-port",
            "0",
            "--nqn",
            nqn,
            *extra,
        ],
    )
    proc.start()
    return proc


def _log_tail(proc: TargetProcess) -> str:
    """What the target logged last: whether it heard of the resize, and when."""
    return proc.stderr_path.read_text(errors="replace")[-4000:]


def test_pynvmf_target_rbd_command_line_serves_the_image(
    guest: Guest, ceph_cluster: CephCluster, tmp_path: Path
) -> None:
    ceph_cluster.create_image(CLI_IMAGE, 64 * MIB)
    port = free_tcp_port()
    proc = _rbd_target_process(ceph_cluster, tmp_path, CLI_IMAGE, CLI, port)
    try:
        ss = Subsys(CLI, port, 64 * MIB)
        host.check_connect_identify_and_list(guest, ss)
        written = host.check_dd_at_several_offsets(guest, ss)
        # The disconnect shut the controller down, which flushed librbd's cache.
        for offset, digest in written.items():
            assert _image_sum(ceph_cluster, CLI_IMAGE, offset, 65536) == digest, offset
    finally:
        try:
            proc.stop()
        finally:
            ceph_cluster.remove_image(CLI_IMAGE)


GROW = f"{PREFIX}-grow"
GROW_IMAGE = "interop-linux-host-grow"


def test_an_image_grown_over_rpc_and_by_another_ceph_client_takes_its_size_on_the_host(
    guest: Guest, ceph_cluster: CephCluster, tmp_path: Path
) -> None:
    """bdev_rbd_resize (SPDK's RPC), then `rbd resize` on the machine (another Ceph
    client, heard through the watch on the image's header): each time the host's block
    device takes the new size without reconnecting, and the blocks past the old end hold
    what it writes, in the image."""
    ceph_cluster.create_image(GROW_IMAGE, 16 * MIB)
    port = free_tcp_port()
    rpc_socket = str(tmp_path / "rpc.sock")
    proc = _rbd_target_process(
        ceph_cluster, tmp_path, GROW_IMAGE, GROW, port, "--rpc-socket", rpc_socket
    )
    try:
        dev = host.connect(guest, port, GROW)
        assert int(guest.run(f"blockdev --getsize64 {dev}").output) == 16 * MIB
        with RpcClient(rpc_socket) as rpc:
            (name,) = [
                b["name"]
                for b in rpc.call("bdev_get_bdevs")
                if b["product_name"] == "Ceph Rbd Disk"
            ]
            assert rpc.call("bdev_rbd_resize", name=name, new_size=32) is True
        assert host.wait_size(guest, dev, 32 * MIB) == 32 * MIB, _log_tail(proc)
        subprocess.run(
            ["rbd", "-c", str(ceph_cluster.conf), "resize", "--size", "48M", f"rbd/{GROW_IMAGE}"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        assert host.wait_size(guest, dev, 48 * MIB) == 48 * MIB, _log_tail(proc)
        offset = 40 * MIB
        digest = guest.run(
            "dd if=/dev/urandom of=/tmp/r1 bs=65536 count=1 2>/dev/null && "
            f"dd if=/tmp/r1 of={dev} bs=65536 seek={offset // 65536} oflag=direct 2>/dev/null "
            "&& sync && sha256sum /tmp/r1"
        ).output.split()[0]
        host.disconnect(guest, GROW)  # the shutdown flushes librbd's cache
        assert _image_sum(ceph_cluster, GROW_IMAGE, offset, 65536) == digest
    finally:
        try:
            proc.stop()
        finally:
            ceph_cluster.remove_image(GROW_IMAGE)


# -- test_linux_host.py's checks ---------------------------------------------------------------


# As the file module runs these on 512-byte and 4 KiB blocks.
BLOCK_SIZES = pytest.mark.parametrize("nqn", [RBD, RBD4K], ids=["512", "4k"])


@BLOCK_SIZES
def test_connect_identify_and_list(guest: Guest, target: Setup, nqn: str) -> None:
    host.check_connect_identify_and_list(guest, target.ss(nqn, SIZE))
    dev = host.connect(guest, target.port, nqn)
    try:
        out = guest.run(f"nvme id-ns {dev} -o json").output
        ns = json.loads(out[out.index("{") :])
        # DLFEAT 001b: deallocated blocks read back as zeroes (librbd write_zeroes).
        assert ns["dlfeat"] & 7 == 1
        out = guest.run(f"nvme id-ctrl {dev} -o json").output
        ctrl = json.loads(out[out.index("{") :])
        assert ctrl["vwc"] & 1  # librbd's cache: the host sends flushes
    finally:
        host.disconnect(guest, nqn)


@BLOCK_SIZES
def test_dd_at_several_offsets_reads_back_identical_and_is_in_the_image(
    guest: Guest, target: Setup, nqn: str
) -> None:
    written = host.check_dd_at_several_offsets(guest, target.ss(nqn, SIZE))
    # The disconnect shut the controller down, which flushed librbd's cache.
    image = IMAGE_4K if nqn == RBD4K else MAIN_IMAGE
    for offset, digest in written.items():
        assert _image_sum(target.cluster, image, offset, 65536) == digest, offset


@BLOCK_SIZES
def test_fio_random_write_verify(guest: Guest, target: Setup, nqn: str) -> None:
    host.check_fio_random_write_verify(guest, target.ss(nqn, SIZE))


def test_fio_write_verify_with_flushes(guest: Guest, target: Setup) -> None:
    dev = host.connect(guest, target.port, RBD)
    try:
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
    finally:
        host.disconnect(guest, RBD)


def test_disconnect_then_reconnect_keeps_the_data(guest: Guest, target: Setup) -> None:
    host.check_disconnect_then_reconnect_keeps_the_data(guest, target.ss(RBD, SIZE))


def test_out_of_range_read_gets_lba_out_of_range(guest: Guest, target: Setup) -> None:
    host.check_out_of_range_read_gets_lba_out_of_range(guest, target.ss(RBD, SIZE))


def test_flushed_data_is_in_the_image(guest: Guest, target: Setup) -> None:
    offset = 5 * MIB
    host.check_flushed_data_is_stored(
        guest,
        target.ss(RBD, SIZE),
        offset,
        lambda: _image_bytes(target.cluster, MAIN_IMAGE, offset, 256 * 1024),
    )


def test_16k_in_capsule_target_receives_8k_and_16k_writes_in_the_capsule(
    guest: Guest, target: Setup
) -> None:
    host.check_16k_in_capsule(guest, target.process, target.ss(RBD, SIZE))


def test_4k_in_capsule_target_falls_back_to_r2t_with_the_same_data(
    guest: Guest, target: Setup
) -> None:
    host.check_4k_in_capsule_falls_back_to_r2t(
        guest, target.process, Subsys(RBD, target.port_4k, SIZE)
    )


def test_header_and_data_digests_with_fio_verify(guest: Guest, target: Setup) -> None:
    host.check_header_and_data_digests(guest, target.process, target.ss(RBD, SIZE))


@BLOCK_SIZES
def test_nvme_copy_single_many_ranges_at_the_end_and_past_it(
    guest: Guest, target: Setup, nqn: str
) -> None:
    host.check_nvme_copy_single_many_ranges_at_the_end_and_past_it(guest, target.ss(nqn, SIZE))


def test_blkdiscard_deallocates_exactly_its_ranges(guest: Guest, target: Setup) -> None:
    host.check_blkdiscard_deallocates_exactly_its_ranges(guest, target.ss(RBD, SIZE))
    # 1 MiB is a quarter of an RBD object (4 MiB): a partial discard, zeroes in the image.
    zero = hashlib.sha256(bytes(MIB)).hexdigest()
    assert _image_sum(target.cluster, MAIN_IMAGE, 17 * MIB, MIB) == zero
    assert _image_sum(target.cluster, MAIN_IMAGE, 19 * MIB, MIB) == zero


def test_write_zeroes_zeroes_exactly_its_range_in_the_image(guest: Guest, target: Setup) -> None:
    """Write Zeroes (ONCS bit 3) is librbd's write_zeroes: 1.5 MiB from the middle of an
    object into the next one. Where the guest has util-linux (6.12, 7) the block layer sends
    it (`blkdiscard -z`, BLKZEROOUT); 6.1's busybox blkdiscard has no -z, so there nvme-cli
    sends it."""
    dev = host.connect(guest, target.port, RBD)
    try:
        guest.run(
            "dd if=/dev/urandom of=/tmp/z8 bs=1M count=8 2>/dev/null && "
            f"dd if=/tmp/z8 of={dev} bs=1M seek=32 oflag=direct 2>/dev/null"
        )
        start, length = 35 * MIB + 512 * 1024, 3 * MIB // 2
        if guest.peer.util_linux:
            # The kernel takes Write Zeroes for the device: BLKZEROOUT sends it, not pages.
            sysfs = f"/sys/block/{dev.removeprefix('/dev/')}/queue/write_zeroes_max_bytes"
            assert int(guest.run(f"cat {sysfs}").output) >= length
            guest.run(f"blkdiscard -z -o {start} -l {length} {dev}")
        else:
            out = guest.run(
                f"nvme write-zeroes {dev} --start-block={start // 512} "
                f"--block-count={length // 512 - 1}"
            ).output
            assert "Success" in out, out
        zero = hashlib.sha256(bytes(length)).hexdigest()
        # Read in 512 KiB blocks: every offset and length here is a multiple of them.
        k = 512 * 1024
        got = guest.run(
            f"dd if={dev} bs={k} skip={start // k} count={length // k} iflag=direct "
            "2>/dev/null | sha256sum"
        ).output.split()[0]
        assert got == zero
        # What is around it is still there: the device's and the pattern's bytes agree.
        for off, n in ((32 * MIB, start - 32 * MIB), (start + length, 40 * MIB - start - length)):
            want = guest.run(
                f"dd if=/tmp/z8 bs={k} skip={(off - 32 * MIB) // k} count={n // k} "
                "2>/dev/null | sha256sum"
            ).output.split()[0]
            have = guest.run(
                f"dd if={dev} bs={k} skip={off // k} count={n // k} iflag=direct "
                "2>/dev/null | sha256sum"
            ).output.split()[0]
            assert have == want, off
        guest.run(f"nvme flush {dev}")
        assert _image_sum(target.cluster, MAIN_IMAGE, start, length) == zero
        _no_io_errors(guest)
    finally:
        host.disconnect(guest, RBD)


def test_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest: Guest, target: Setup) -> None:
    host.check_mkfs_xfs_with_discard_mount_fstrim_and_remount(guest, target.ss(RBD, SIZE))


def test_host_selects_all_io_command_sets_and_reads_their_structures(
    guest: Guest, target: Setup
) -> None:
    host.check_host_selects_all_io_command_sets(guest, target.ss(RBD, SIZE))


def test_cross_namespace_copy_is_refused_until_the_host_enables_formats_2_and_3(
    guest: Guest, target: Setup
) -> None:
    host.check_cross_namespace_copy_is_refused_until_the_host_enables_formats_2_and_3(
        guest, target.ss(COPYX)
    )


def test_nvme_cli_copy_formats_2_and_3_with_snsids(guest: Guest, target: Setup) -> None:
    host.check_nvme_cli_copy_formats_2_and_3_with_snsids(guest, target.ss(COPYN), target.ss(COPY3))


# -- test_linux_host_compare.py's checks ---------------------------------------------------------


@pytest.fixture
def compare_dev(guest: Guest, target: Setup) -> Iterator[str]:
    yield host.connect(guest, target.port, COMPARE)
    host.disconnect(guest, COMPARE)


def test_identify_reports_compare_verify_and_fused_compare_and_write(
    guest: Guest, compare_dev: str
) -> None:
    compare.check_identify_reports_compare_verify_and_fused_compare_and_write(guest, compare_dev)


def test_nvme_compare_match_and_mismatch(guest: Guest, compare_dev: str) -> None:
    compare.check_nvme_compare_match_and_mismatch(guest, compare_dev)


def test_nvme_verify(guest: Guest, compare_dev: str) -> None:
    compare.check_nvme_verify(guest, compare_dev, SMALL)


def test_linux_user_space_cannot_send_fused_commands(guest: Guest, compare_dev: str) -> None:
    compare.check_linux_user_space_cannot_send_fused_commands(guest, compare_dev)


# -- test_linux_host_reservations.py's checks ----------------------------------------------------


@pytest.fixture(scope="module")
def linux(guest: Guest, target: Setup) -> Iterator[resv.Linux]:
    yield resv.attach_linux(guest, target.port, RESV, RESV_NAMESPACES)
    guest.run(f"nvme disconnect -n {RESV}")


@pytest.fixture
async def pynvmf(target: Setup) -> AsyncIterator[Controller]:
    ctrl = await resv.connect_pynvmf(target.port, RESV)
    yield ctrl
    await ctrl.close()


async def test_write_exclusive_refuses_the_other_host_both_ways(
    linux: resv.Linux, pynvmf: Controller
) -> None:
    await resv.check_write_exclusive_refuses_the_other_host_both_ways(
        linux, pynvmf, resv.NS_WRITE_EXCLUSIVE
    )


async def test_report_preempt_and_the_notification_log(
    linux: resv.Linux, pynvmf: Controller
) -> None:
    await resv.check_report_preempt_and_the_notification_log(linux, pynvmf, resv.NS_REPORT)


async def test_bad_input_from_nvme_cli(linux: resv.Linux, pynvmf: Controller) -> None:
    await resv.check_bad_input_from_nvme_cli(linux, pynvmf, resv.NS_BAD_INPUT)


async def test_an_rbd_namespace_with_a_ptpl_file_persists_when_the_kernel_asks(
    linux: resv.Linux, pynvmf: Controller, target: Setup
) -> None:
    await resv.check_persists_when_the_kernel_asks(linux, pynvmf, resv.NS_FILE, target.ptpl_file)


async def test_the_kernels_own_pr_ops(linux: resv.Linux, pynvmf: Controller) -> None:
    await resv.check_the_kernels_own_pr_ops(linux, pynvmf, resv.NS_PR_OPS)
