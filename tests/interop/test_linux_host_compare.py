"""Compare and Verify from the Linux kernel's NVMe/TCP host (both peers under QEMU)
with nvme-cli's own commands, and what Linux user space can do with fused commands.

`nvme compare` goes through NVME_IOCTL_SUBMIT_IO and `nvme verify` through the I/O
passthrough ioctl; the kernel refuses any SQE flags a user passes (drivers/nvme/host/
ioctl.c: `io.flags` / `cmd.flags` must be 0, -EINVAL otherwise), so no user space tool
on Linux can send a fused pair: that is checked here too, on the wire's side (nothing
arrives, nothing is written).

One guest boot per peer and one target process serve the whole module; the checks are
check_* functions taking the block device, which test_linux_host_rbd.py runs on Ceph RBD.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.guest import OLDEST_AND_NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = OLDEST_AND_NEWEST.mark()

MIB = 1 << 20
MEM = "nqn.2024-11.dev.pynvmf:interop-compare-mem"
FILE = "nqn.2024-11.dev.pynvmf:interop-compare-file"
BS = 512

DEV_FOR = r"""#!/bin/sh
nqn=$1
i=0
while [ $i -lt 200 ]; do
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
    for n in $(ls "$c"); do
      case "$n" in
        nvme*n1) dev=/dev/$(echo "$n" | sed -E 's/c[0-9]+n/n/')
                 [ -b "$dev" ] && { echo "$dev"; exit 0; } ;;
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


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("linux-host-compare")
    port = free_tcp_port()
    config = {
        "ports": [{"address": "127.0.0.1", "port": port}],
        "discovery_ports": [],
        "subsystems": [
            {"nqn": MEM, "namespaces": [{"nsid": 1, "memory": 16 * MIB}]},
            {
                "nqn": FILE,
                "namespaces": [{"nsid": 1, "file": str(workdir / "ns.img"), "size": 16 * MIB}],
            },
        ],
    }
    proc = TargetProcess(config, workdir)
    proc.start()
    yield Setup(proc, port)
    proc.stop()


@pytest.fixture(scope="module")
def guest(target: Setup, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR}, peer=linux_peer)
    g.start()
    yield g
    g.stop()


@pytest.fixture(params=[MEM, FILE], ids=["memory", "file"])
def dev(request: pytest.FixtureRequest, guest: Guest, target: Setup) -> Iterator[str]:
    nqn = request.param
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {target.port} -n {nqn}")
    yield guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()
    assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {nqn}").output


def _sha(guest: Guest, dev: str, lba: int, count: int) -> str:
    out = guest.run(
        f"dd if={dev} bs={BS} skip={lba} count={count} iflag=direct 2>/dev/null | sha256sum"
    ).output
    return out.split()[0]


# Each test calls a check_* function with the block device, so that test_linux_host_rbd.py
# runs the same checks on a namespace on Ceph RBD.


def test_identify_reports_compare_verify_and_fused_compare_and_write(
    guest: Guest, dev: str
) -> None:
    check_identify_reports_compare_verify_and_fused_compare_and_write(guest, dev)


def check_identify_reports_compare_verify_and_fused_compare_and_write(
    guest: Guest, dev: str
) -> None:
    ctrl = json.loads(guest.run(f"nvme id-ctrl {dev} -o json").output)
    assert ctrl["oncs"] & 0x1 and ctrl["oncs"] & 0x80  # Compare, Verify
    assert ctrl["fuses"] == 1  # Compare and Write
    assert ctrl["acwu"] == 255


def test_nvme_compare_match_and_mismatch(guest: Guest, dev: str) -> None:
    check_nvme_compare_match_and_mismatch(guest, dev)


def check_nvme_compare_match_and_mismatch(guest: Guest, dev: str) -> None:
    """`dev` has 512-byte blocks and at least 1 MiB."""
    lba, count = 2048, 16
    guest.run(
        f"dd if=/dev/urandom of=/tmp/cmp bs={BS} count={count} 2>/dev/null && "
        f"dd if=/tmp/cmp of={dev} bs={BS} seek={lba} oflag=direct 2>/dev/null"
    )
    before = _sha(guest, dev, lba, count)
    args = f"--start-block={lba} --block-count={count - 1} --data-size={count * BS}"
    same = guest.run(f"nvme compare {dev} {args} --data=/tmp/cmp", check=False)
    assert same.rc == 0 and "compare: Success" in same.output, same.output
    # One byte off in the last block: Compare Failure, and the namespace is unchanged.
    # The byte written is 01h, or 02h where the random data already had 01h there (1 run
    # in 256 otherwise compared equal data).
    last = f"dd of=/tmp/cmp2 bs=1 seek={count * BS - 1} conv=notrunc 2>/dev/null"
    guest.run(
        f"cp /tmp/cmp /tmp/cmp2 && printf '\\001' | {last} && "
        f"{{ ! cmp -s /tmp/cmp /tmp/cmp2 || printf '\\002' | {last}; }}"
    )
    assert guest.run("cmp -s /tmp/cmp /tmp/cmp2", check=False).rc == 1
    diff = guest.run(f"nvme compare {dev} {args} --data=/tmp/cmp2", check=False)
    assert diff.rc != 0, diff.output
    # SCT 2h SC 85h with DNR, as nvme-cli names it.
    assert "NVMe status: Compare Failure" in diff.output and "(0x4285)" in diff.output, diff.output
    assert _sha(guest, dev, lba, count) == before


def test_nvme_verify(guest: Guest, dev: str) -> None:
    check_nvme_verify(guest, dev, 16 * MIB)


def check_nvme_verify(guest: Guest, dev: str, size: int) -> None:
    """`dev` has 512-byte blocks and `size` bytes, at most 32 MiB (VSL)."""
    nblocks = size // BS
    # The whole namespace in one command, within VSL (32 MiB).
    ok = guest.run(f"nvme verify {dev} --start-block=0 --block-count={nblocks - 1}", check=False)
    assert ok.rc == 0 and "NVME Verify Success" in ok.output, ok.output
    fua = guest.run(f"nvme verify {dev} --start-block=100 --block-count=7 --force-unit-access")
    assert "NVME Verify Success" in fua.output, fua.output
    beyond = guest.run(
        f"nvme verify {dev} --start-block={nblocks - 4} --block-count=7", check=False
    )
    assert beyond.rc != 0 and "LBA Out of Range" in beyond.output, beyond.output
    assert "(0x4080)" in beyond.output


def test_linux_user_space_cannot_send_fused_commands(guest: Guest, dev: str) -> None:
    check_linux_user_space_cannot_send_fused_commands(guest, dev)


def check_linux_user_space_cannot_send_fused_commands(guest: Guest, dev: str) -> None:
    """A Write with FUSE 10b (second command) and a Compare with 01b through
    `nvme io-passthru --flags`: the kernel refuses them before anything is sent."""
    lba = 3000
    guest.run(f"dd if=/dev/zero of={dev} bs={BS} seek={lba} count=1 oflag=direct 2>/dev/null")
    guest.run(f"head -c {BS} /dev/urandom > /tmp/blk")
    before = _sha(guest, dev, lba, 1)
    for opcode, fuse in ((0x05, 0x1), (0x01, 0x2)):
        out = guest.run(
            f"nvme io-passthru {dev} --opcode={opcode} --flags={fuse} --namespace-id=1 "
            f"--data-len={BS} --write --input-file=/tmp/blk --cdw10={lba} --cdw12=0",
            check=False,
        )
        assert out.rc != 0 and "Invalid argument" in out.output, out.output
    # The same Write without FUSE bits goes through: the refusal was the flags'.
    plain = guest.run(
        f"nvme io-passthru {dev} --opcode=0x01 --namespace-id=1 --data-len={BS} --write "
        f"--input-file=/tmp/blk --cdw10={lba} --cdw12=0",
        check=False,
    )
    assert plain.rc == 0, plain.output
    assert _sha(guest, dev, lba, 1) != before
    assert _sha(guest, dev, lba, 1) == guest.run("sha256sum /tmp/blk").output.split()[0]


@pytest.fixture(autouse=True)
def _target_alive(target: Setup) -> Iterator[None]:
    yield
    assert target.process.alive, target.process.stderr()
