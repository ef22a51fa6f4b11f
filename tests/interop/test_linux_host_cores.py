"""The Linux kernel's NVMe/TCP host against `pynvmf target --cores 2`: its I/O queues
on two worker processes, the target's state in the main one.

One guest boot per kernel peer, one target process: fio verifies data written over
four I/O queues (two default, two write queues) that land on both workers, data
written through one CPU's queue is verified through the other's, when a worker
is killed the kernel host reconnects by itself and reads its data back, and
`nvme smart-log` of a subsystem removed and created again (over RPC) counts that
subsystem's commands only, a memory namespace grown over RPC, then cut (forced) while
the host reads, is served at its new size by both workers once the host's block device
has it, and fio against a
rate-limited namespace (bdev_set_qos_limit) measures the limit across both workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.rpc.client import RpcClient
from tests.interop.test_linux_host import wait_size
from tests.support.guest import NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = NEWEST.mark()

MIB = 1 << 20
MEM = "nqn.2024-11.dev.pynvmf:cores-mem"
FILE = "nqn.2024-11.dev.pynvmf:cores-file"
SMART = "nqn.2024-11.dev.pynvmf:cores-smart"
GROW = "nqn.2024-11.dev.pynvmf:cores-grow"

DEV_FOR = r"""#!/bin/sh
nqn=$1
i=0
while [ $i -lt 200 ]; do
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    [ "$(cat "$c/subsysnqn")" = "$nqn" ] || continue
    for n in $(ls "$c"); do
      case "$n" in
        nvme*n*) disk=$(echo "$n" | sed -E 's/c[0-9]+n/n/')
          [ -b "/dev/$disk" ] && { echo "/dev/$disk"; exit 0; } ;;
      esac
    done
  done
  i=$((i + 1)); sleep 0.05
done
echo "no block device for $nqn" >&2
exit 1
"""


@dataclass
class Setup:
    process: TargetProcess
    port: int
    backing: Path
    rpc_socket: str


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("linux-host-cores")
    port = free_tcp_port()
    backing = workdir / "namespace.img"
    config = {
        "ports": [{"address": "127.0.0.1", "port": port}],
        "subsystems": [
            {"nqn": MEM, "namespaces": [{"nsid": 1, "memory": 64 * MIB}]},
            {"nqn": FILE, "namespaces": [{"nsid": 1, "file": str(backing), "size": 64 * MIB}]},
        ],
    }
    rpc_socket = str(workdir / "rpc.sock")
    proc = TargetProcess(config, workdir, ["--cores", "2", "--rpc-socket", rpc_socket])
    proc.start()
    yield Setup(proc, port, backing, rpc_socket)
    proc.stop()


@pytest.fixture(scope="module")
def guest(target: Setup, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR}, peer=linux_peer)
    g.start()
    yield g
    g.stop()


def _fio(guest: Guest, dev: str, args: str) -> dict[str, object]:
    result = guest.run(
        f"fio --filename={dev} --ioengine=libaio --direct=1 --output-format=json {args}",
        timeout=300,
    )
    return json.loads(result.output[result.output.index("{") :])


def _handed(target: Setup, since: int) -> set[int]:
    """The workers that queues were handed to since `since` (the target's log)."""
    text = target.process.stderr()[since:]
    return {int(w) for w in re.findall(r"reason=handed to worker (\d+)", text)}


def _worker_pid(target: Setup, index: int) -> int:
    found = re.findall(rf"worker {index} started \(pid (\d+)\)", target.process.stderr())
    assert found, target.process.stderr()
    return int(found[-1])


def _write_on_one_worker_verify_on_the_other(
    guest: Guest, dev: str, name: str, offset_mib: int
) -> None:
    """16 MiB from `offset_mib` written through CPU 0's queue and verified through CPU 1's:
    the guest's queues are spread over both workers, so another worker reads it back."""
    common = f"--name={name} --rw=write --bs=64k --size=16m --offset={offset_mib}m --verify=crc32c"
    written = _fio(guest, dev, f"{common} --cpus_allowed=0 --do_verify=0")
    assert written["jobs"][0]["error"] == 0  # type: ignore[index]
    checked = _fio(guest, dev, f"{common} --cpus_allowed=1 --verify_only --verify_fatal=1")
    (job,) = checked["jobs"]  # type: ignore[misc]
    assert job["error"] == 0 and job["read"]["io_bytes"] == 16 * MIB, job


@pytest.mark.parametrize("nqn", [MEM, FILE])
def test_fio_verify_over_four_queues_on_both_workers(guest: Guest, target: Setup, nqn: str) -> None:
    since = len(target.process.stderr())
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {nqn} --nr-write-queues=2"
    )
    dev = guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()
    try:
        # Two default queues (one per guest CPU) and two write queues: four, two each.
        count = guest.run(
            "for c in /sys/class/nvme/nvme*; do "
            f'[ "$(cat $c/subsysnqn)" = "{nqn}" ] && cat $c/queue_count; done'
        )
        queues = int(count.output)
        assert queues == 5, queues  # the admin queue and four I/O queues
        assert _handed(target, since) == {0, 1}
        report = _fio(
            guest,
            dev,
            "--name=mix --rw=randrw --bs=4k --size=8m --offset_increment=8m --numjobs=4 "
            "--iodepth=16 --verify=crc32c --do_verify=1 --verify_fatal=1",
        )
        jobs = report["jobs"]
        assert isinstance(jobs, list) and len(jobs) == 4
        assert all(job["error"] == 0 for job in jobs), jobs
        _write_on_one_worker_verify_on_the_other(guest, dev, "cross", offset_mib=40)
    finally:
        guest.run(f"nvme disconnect -n {nqn}")


def test_a_killed_worker_the_kernel_host_reconnects_and_reads_its_data(
    guest: Guest, target: Setup
) -> None:
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {MEM} "
        "--reconnect-delay=1 --ctrl-loss-tmo=60"
    )
    dev = guest.run(f"sh /usr/local/bin/dev-for {MEM}").output.strip()
    try:
        guest.run(
            f"dd if=/dev/urandom of=/tmp/pattern bs=64k count=16 && "
            f"dd if=/tmp/pattern of={dev} bs=64k oflag=direct conv=fsync"
        )
        os.kill(_worker_pid(target, 0), signal.SIGKILL)
        # The kernel sees a queue drop, resets the controller, reconnects after a second
        # (a replacement worker by then, or the other one), and the read waits for it.
        out = guest.run(
            f"dd if={dev} of=/tmp/back bs=64k count=16 iflag=direct && "
            "cmp /tmp/pattern /tmp/back && echo SAME",
            timeout=120,
        ).output
        assert "SAME" in out, out
        assert "is gone with" in target.process.stderr()
    finally:
        guest.run(f"nvme disconnect -n {MEM}")


def _smart_log(guest: Guest, nqn: str, writes: int, reads: int) -> dict[str, object]:
    """`nvme smart-log` of the controller of `nqn` once it counts `writes` write commands
    and `reads` read commands (the workers report their counts to the main process a few
    times a second, so a log read just after the I/O may not hold the last of it yet)."""
    deadline = time.monotonic() + 30
    while True:
        out = guest.run(
            "for c in /sys/class/nvme/nvme*; do "
            f'[ "$(cat $c/subsysnqn)" = "{nqn}" ] && nvme smart-log /dev/$(basename $c) -o json; '
            "done"
        ).output
        smart: dict[str, object] = json.loads(out[out.index("{") :])
        if (
            int(str(smart["host_write_commands"])) >= writes
            and int(str(smart["host_read_commands"])) >= reads
        ):
            return smart
        assert time.monotonic() < deadline, smart
        time.sleep(0.2)  # the next poll of the condition above


def test_the_smart_log_of_a_subsystem_created_again_counts_its_own_commands(
    guest: Guest, target: Setup
) -> None:
    def create() -> None:
        with RpcClient(target.rpc_socket) as rpc:
            rpc.call("nvmf_create_subsystem", nqn=SMART, allow_any_host=True)
            rpc.call("nvmf_subsystem_add_ns", nqn=SMART, namespace={"bdev_name": "Smart0"})

    def io(writes: int, reads: int) -> dict[str, object]:
        connect = f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {SMART}"
        guest.run(connect)
        dev = guest.run(f"sh /usr/local/bin/dev-for {SMART}").output.strip()
        try:
            guest.run(
                f"dd if=/dev/zero of={dev} bs=4k count={writes} oflag=direct 2>/dev/null && "
                f"dd if={dev} of=/dev/null bs=4k count={reads} iflag=direct 2>/dev/null"
            )
            return _smart_log(guest, SMART, writes, reads)
        finally:
            guest.run(f"nvme disconnect -n {SMART}")

    with RpcClient(target.rpc_socket) as rpc:
        rpc.call("bdev_malloc_create", name="Smart0", num_blocks=16 * MIB // 512, block_size=512)
    try:
        create()
        old = io(writes=64, reads=64)
        assert int(str(old["host_write_commands"])) == 64, old
        with RpcClient(target.rpc_socket) as rpc:
            assert rpc.call("nvmf_delete_subsystem", nqn=SMART) is True
        create()
        # Fewer commands than the old subsystem had: with the old one's counts carried
        # over (or turned negative) the log would be wrong, or could not be read at all.
        new = io(writes=8, reads=0)
        assert int(str(new["host_write_commands"])) == 8, new
        assert int(str(new["data_units_written"])) == 1, new
        old_reads, new_reads = old["host_read_commands"], new["host_read_commands"]
        assert int(str(new_reads)) < int(str(old_reads)), (old, new)
    finally:
        # The target serves the next kernel peer's guest too.
        with RpcClient(target.rpc_socket) as rpc:
            if any(s["nqn"] == SMART for s in rpc.call("nvmf_get_subsystems")):
                rpc.call("nvmf_delete_subsystem", nqn=SMART)
            rpc.call("bdev_malloc_delete", name="Smart0")


def test_a_rate_limited_namespace_measures_its_limit(guest: Guest, target: Setup) -> None:
    """SPDK's bdev_set_qos_limit on the memory namespace's device: the kernel host's fio,
    two jobs on two queues (one on each worker), measures 4 MiB/s within 5%; with the
    limit removed the same load goes faster. (A bandwidth limit: an emulated guest
    reads about 1,200 4 KiB commands a second, too near SPDK's smallest IOPS limit.)"""
    nqn = MEM
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {nqn}")
    dev = guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()
    load = (
        "--name=qos --rw=randread --bs=128k --size=32m --numjobs=2 --iodepth=8 "
        "--cpus_allowed_policy=split --cpus_allowed=0,1 --time_based --runtime=8 "
        "--ramp_time=2 --group_reporting"
    )
    try:
        with RpcClient(target.rpc_socket) as rpc:
            rpc.call("bdev_set_qos_limit", {"name": f"{nqn}/1", "rw_mbytes_per_sec": 4})
            (bdev,) = rpc.call("bdev_get_bdevs", {"name": f"{nqn}/1"})
            assert bdev["assigned_rate_limits"]["rw_mbytes_per_sec"] == 4
        limited = _fio(guest, dev, load)["jobs"][0]["read"]["bw"]  # type: ignore[index]
        with RpcClient(target.rpc_socket) as rpc:
            rpc.call("bdev_set_qos_limit", {"name": f"{nqn}/1", "rw_mbytes_per_sec": 0})
        free = _fio(guest, dev, load)["jobs"][0]["read"]["bw"]  # type: ignore[index]
    finally:
        guest.run(f"nvme disconnect -n {nqn}")
    # fio's bw: KiB/s.
    print(f"{guest.peer.name}: limited {limited} KiB/s, unlimited {free} KiB/s")
    assert abs(limited - 4096) <= 0.05 * 4096, (limited, free)
    assert free > 1.5 * 4096, (limited, free)


def test_a_memory_namespace_grown_over_rpc_is_served_at_its_new_size_by_both_workers(
    guest: Guest, target: Setup
) -> None:
    """The workers take the new size before the event: once the kernel host's block
    device has it, data written past the old end through one CPU's queue (one worker) is
    verified through the other's."""
    with RpcClient(target.rpc_socket) as rpc:
        rpc.call("bdev_malloc_create", name="Grow0", num_blocks=16 * MIB // 512, block_size=512)
        rpc.call("nvmf_create_subsystem", nqn=GROW, allow_any_host=True)
        rpc.call("nvmf_subsystem_add_ns", nqn=GROW, namespace={"bdev_name": "Grow0"})
    try:
        since = len(target.process.stderr())
        guest.run(
            f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {GROW} "
            "--nr-write-queues=2"
        )
        dev = guest.run(f"sh /usr/local/bin/dev-for {GROW}").output.strip()
        try:
            assert _handed(target, since) == {0, 1}
            guest.run(
                "dd if=/dev/urandom of=/tmp/k1 bs=4096 count=4 2>/dev/null && "
                f"dd if=/tmp/k1 of={dev} bs=4096 seek={16 * MIB // 4096 - 4} oflag=direct "
                "2>/dev/null"
            )
            with RpcClient(target.rpc_socket) as rpc:
                grown = rpc.call("pynvmf_bdev_resize", name="Grow0", size_bytes=48 * MIB)
            assert grown == 48 * MIB // 512
            assert wait_size(guest, dev, 48 * MIB) == 48 * MIB
            guest.run(
                f"dd if={dev} of=/tmp/k2 bs=4096 skip={16 * MIB // 4096 - 4} count=4 "
                "iflag=direct 2>/dev/null && cmp /tmp/k1 /tmp/k2"
            )
            _write_on_one_worker_verify_on_the_other(guest, dev, "grown", offset_mib=24)
            # Cut, forced, while the host reads across the old end on both CPUs (both
            # workers): each quiesces the namespace and serves the new size before the
            # memory is cut, so none is gone (a SIGBUS), and the host follows.
            guest.run(
                "command -v taskset >/dev/null && "
                "for c in 0 1; do taskset -c $c sh -c 'while :; do "
                f"dd if={dev} of=/dev/null bs=64k count=640 iflag=direct; done' "
                ">/dev/null 2>&1 & echo $! >> /tmp/readers; done && "
                "kill -0 $(cat /tmp/readers)"  # both reading
            )
            try:
                with RpcClient(target.rpc_socket) as rpc:
                    cut = rpc.call(
                        "pynvmf_bdev_resize", name="Grow0", size_bytes=32 * MIB, force=True
                    )
                assert cut == 32 * MIB // 512
                assert wait_size(guest, dev, 32 * MIB) == 32 * MIB
            finally:
                guest.run("kill $(cat /tmp/readers); rm /tmp/readers", check=False)
            assert "is gone with" not in target.process.stderr()[since:]
            guest.run(
                f"dd if={dev} of=/tmp/k3 bs=4096 skip={16 * MIB // 4096 - 4} count=4 "
                "iflag=direct 2>/dev/null && cmp /tmp/k1 /tmp/k3"
            )
            _write_on_one_worker_verify_on_the_other(guest, dev, "cut", offset_mib=8)
        finally:
            guest.run(f"nvme disconnect -n {GROW}")
    finally:
        # The target serves the next kernel peer's guest too.
        with RpcClient(target.rpc_socket) as rpc:
            rpc.call("nvmf_delete_subsystem", nqn=GROW)
            rpc.call("bdev_malloc_delete", name="Grow0")
