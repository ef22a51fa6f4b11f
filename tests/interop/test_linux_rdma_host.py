"""The Linux nvme-rdma host against pynvmf's NVMe/RDMA target, over soft-RoCE in one guest.

pynvmf's target runs inside the RDMA variant of the linux-7 peer (tests/support/guest_rdma.py)
with the guest's Debian Python and python3-pyverbs (the tree is shared into the guest at
/opt/pynvmf), listening on rdma:10.0.2.15:4420 with a memory namespace. The kernel's host
discovers it (trtype rdma in the log), connects, writes 4 MiB with dd in 4 KiB blocks (the
data in the command capsules) and in 64 KiB blocks (above the 16 KiB in-capsule size: the
target fetches it with RDMA READ), reads it back (RDMA WRITE) identical, and disconnects;
pynvmf logs no error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support import guest_rdma
from tests.support.guest import Guest, Peer, require_guest_prerequisites
from tests.support.guest_pynvmf import install_pynvmf

pytestmark = guest_rdma.RDMA_PEERS.mark()

NQN = "nqn.2014-08.org.pynvmf:rdma-host"
ADDRESS = "10.0.2.15"
PORT = 4420
RXE = "rxe0"


@pytest.fixture(scope="module")
def guest(linux_peer: Peer) -> Iterator[Guest]:
    peer = guest_rdma.variant(linux_peer)
    require_guest_prerequisites(peer)
    with Guest(peer=peer) as g:
        yield g


@pytest.fixture(scope="module")
def target(guest: Guest) -> Iterator[None]:
    guest_rdma.add_soft_roce(guest, RXE)
    guest.run("modprobe nvme-rdma")
    # pynvmf (and the suite's Python packages for the guest's Python) under /opt/pynvmf.
    install_pynvmf(guest)
    # One process (the guest's Python lacks what --cores' workers need); pynvmf from the
    # shared tree, with the guest's Debian Python and its python3-pyverbs.
    guest.run(
        "cd /tmp && (PYTHONPATH=/opt/pynvmf python3 -m pynvmf target"
        f" --listen rdma:{ADDRESS}:{PORT} --memory 64M --nqn {NQN} --discovery-port 0"
        " --cores 1 -v"
        " > /tmp/target.out 2> /tmp/target.err & echo $! > /tmp/target.pid)\n"
        "for i in $(seq 300); do grep -q ready /tmp/target.out && exit 0; sleep 0.2; done;"
        " cat /tmp/target.err; exit 1",
        timeout=120,
    )
    yield
    guest.run("kill $(cat /tmp/target.pid)", check=False)


def _log(guest: Guest) -> str:
    return guest.run("cat /tmp/target.err").output


def test_discovery_lists_the_subsystem_with_trtype_rdma(guest: Guest, target: None) -> None:
    out = guest.run(f"nvme discover -t rdma -a {ADDRESS} -s {PORT}", timeout=120).output
    entries = out.split("=====Discovery Log Entry")
    ours = [e for e in entries if f"subnqn:  {NQN}" in e]
    assert ours, out
    assert re.search(r"trtype:\s+rdma", ours[0]), out
    assert re.search(r"rdma_cms:\s+rdma-cm", ours[0]), out


def test_connect_write_read_back_and_disconnect(guest: Guest, target: None) -> None:
    guest.run(f"nvme connect -t rdma -a {ADDRESS} -s {PORT} -n {NQN}", timeout=150)
    dev = guest.run(
        "for i in $(seq 100); do for c in /sys/class/nvme/nvme*; do"
        f' [ "$(cat $c/subsysnqn 2>/dev/null)" = {NQN} ] && for n in $c/nvme*n*; do'
        ' d=/dev/$(basename $n | sed -E "s/c[0-9]+n/n/"); [ -b $d ] && { echo $d; exit 0; };'
        " done; done; sleep 0.1; done; exit 1"
    ).output.strip()
    transport = guest.run(
        f"cat /sys/class/nvme/$(basename {dev} | sed -E 's/n[0-9]+$//')/transport"
    ).output.strip()
    assert transport == "rdma"
    # 4 KiB writes: the data in the capsule; 64 KiB writes: by RDMA READ; the reads by
    # RDMA WRITE. Each read back identical.
    for bs, offset_mib in (("4k", 0), ("64k", 8)):
        guest.run(
            f"head -c 4194304 /dev/urandom > /tmp/data && dd if=/tmp/data of={dev} bs={bs}"
            f" seek={offset_mib}M oflag=direct,seek_bytes status=none"
            f" && dd if={dev} of=/tmp/back bs=64k skip={offset_mib}M count=64"
            " iflag=direct,skip_bytes status=none && cmp /tmp/data /tmp/back",
            timeout=300,
        )
    guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    # Each queue's transport figures, as the target logs them when the queue closes: once
    # the admin queue closed (the host deletes it last; the discovery controller's closed
    # in the test before), all are there.
    closed = guest.run(
        "for i in $(seq 100); do n=$(grep -c 'rdma queue 0 .* closed' /tmp/target.err);"
        ' [ "$n" -ge 2 ] && break; sleep 0.1; done; grep "rdma queue" /tmp/target.err'
    ).output
    io_queues = re.findall(
        r"rdma queue [1-9]\d* .* (\d+) commands, (\d+) bytes in capsules,"
        r" (\d+) RDMA READs, (\d+) RDMA WRITEs",
        closed,
    )
    print(closed)  # the figures, for the record (pytest -s)
    assert io_queues, closed
    totals = [sum(int(q[i]) for q in io_queues) for i in range(4)]
    # The 4 KiB writes came in capsules (4 MiB of them), the 64 KiB ones by RDMA READ (64
    # of them at least), the reads back by RDMA WRITE.
    assert totals[1] >= 4 << 20 and totals[2] >= 64 and totals[3] >= 128, closed
    log = _log(guest)
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", log), log
    assert "nvmet_rdma" not in guest.run("dmesg | grep -i 'nvme.*error' || true").output
