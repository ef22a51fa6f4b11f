"""pynvmf's host library over NVMe/RDMA against the Linux kernel's nvmet-rdma, over
soft-RoCE in one guest.

The kernel's target (configfs: an rdma port on 10.0.2.15:4420, a null_blk namespace) and
pynvmf's host library (pynvmf.host.connect with trtype rdma, pynvmf/rdma/host_verbs.py
over python3-pyverbs, on the guest's Debian Python; the tree is shared into the guest at
/opt/pynvmf) both run in the RDMA variant of the linux-7 peer. The host connects the admin
queue and an I/O queue (RDMA CM with the NVMe/RDMA private data; a request for an admin
queue deeper than nvmet's is rejected first, the status read back), runs Identify, writes
4 KiB (in the command capsule: nvmet-rdma's in-capsule size is 4 KiB) and 64 KiB (a keyed
SGL: the target RDMA READs it), reads both back identical (the target RDMA WRITEs them),
and disconnects; the kernel logs no nvmet_rdma error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.support import guest_rdma
from tests.support.guest import (
    Guest,
    KernelTarget,
    Peer,
    require_guest_prerequisites,
    setup_kernel_target,
    teardown_kernel_target,
)
from tests.support.guest_pynvmf import GUEST_ROOT, install_pynvmf

pytestmark = guest_rdma.RDMA_PEERS.mark()

NQN = "nqn.2014-08.org.pynvmf:rdma-host-library"
PORT = 4420
RXE = "rxe0"


def _rdma_peer(linux_peer: Peer) -> Peer:
    """The peer this module boots (the RDMA variant of the kernel peer)."""
    return guest_rdma.variant(linux_peer)


@pytest.fixture(scope="module")
def guest(linux_peer: Peer) -> Iterator[Guest]:
    peer = _rdma_peer(linux_peer)
    require_guest_prerequisites(peer)
    with Guest(peer=peer) as g:
        yield g


@pytest.fixture(scope="module")
def kernel_target(guest: Guest) -> Iterator[KernelTarget]:
    guest_rdma.add_soft_roce(guest, RXE)
    install_pynvmf(guest)
    target = setup_kernel_target(
        guest, port=PORT, nqn=NQN, size_mb=64, traddr=guest.guest_address, trtype="rdma"
    )
    yield target
    teardown_kernel_target(guest, target)


# Runs in the guest: pynvmf's host library over RDMA; prints one JSON line of what it saw.
HOST = r"""
import asyncio, json, logging, os, sys
from pynvmf import host

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
address, port, nqn = sys.argv[1], int(sys.argv[2]), sys.argv[3]


async def rejected():
    # An admin queue one entry deeper than nvmet's 32: the RDMA CM reject's status.
    from pynvmf.rdma.host_queue import RdmaConnectRejected
    from pynvmf.rdma.host_verbs import open_queue

    try:
        queue = await open_queue(address, port, 0, 32)
    except RdmaConnectRejected as exc:
        return [exc.status.name if exc.status else None, str(exc)]
    queue.close()
    return None


async def main():
    reject = await rejected()
    ctrl = await host.connect(address, port, nqn, trtype="rdma", queues=1, queue_depth=16)
    out = {"reject": reject, "ioccsz": ctrl.info.ioccsz, "sgls": ctrl.info.sgls, "mn": ctrl.info.mn,
           "inline": ctrl.io_inline_limit, "queues": len(ctrl.io_queues)}
    try:
        ns = ctrl.namespaces[1]
        block = ns.capabilities.block_size
        small = os.urandom(4096)
        big = os.urandom(65536)
        await ns.write(0, small)
        await ns.write(65536 // block, big)
        back_small = bytearray(4096)
        back_big = bytearray(65536)
        await ns.read(0, memoryview(back_small))
        await ns.read(65536 // block, memoryview(back_big))
        out["small_back"] = bytes(back_small) == small
        out["big_back"] = bytes(back_big) == big
        admin = ctrl.admin.conn.stats
        io = ctrl.io_queues[0].conn.stats
        out["admin"] = [admin.commands, admin.in_capsule_bytes, admin.keyed_writes,
                        admin.keyed_reads]
        out["io"] = [io.commands, io.in_capsule_bytes, io.keyed_writes, io.keyed_reads]
    finally:
        queues = [ctrl.admin, *ctrl.io_queues]
        await ctrl.close()
    out["closed"] = all(q.closed for q in queues)
    print(json.dumps(out))


asyncio.run(main())
"""


def test_the_host_library_over_rdma_against_nvmet_rdma(
    guest: Guest, kernel_target: KernelTarget
) -> None:
    guest.run("dmesg -C")
    guest.write_file("/tmp/rdma_host.py", HOST)
    done = guest.run(
        f"cd /tmp && PYTHONPATH={GUEST_ROOT} python3 /tmp/rdma_host.py"
        f" {guest.guest_address} {PORT} {NQN}",
        timeout=240,
    )
    print(done.output)  # the host's log and figures, for the record (pytest -s)
    lines = [ln for ln in done.output.splitlines() if ln.startswith("{")]
    assert lines, done.output
    seen = json.loads(lines[-1])
    assert "Traceback" not in done.output and "not closed within" not in done.output
    # nvmet-rdma's answer to a queue too deep, as the host reads it.
    assert seen["reject"][0] == "INVALID_HSQSIZE", seen
    # nvmet-rdma's default in-capsule size: 4 KiB after the SQE; keyed SGLs (SGLS bit 2).
    assert seen["ioccsz"] * 16 == 64 + 4096 and seen["inline"] == 4096, seen
    assert seen["sgls"] & 0x4, seen
    assert seen["queues"] == 1
    assert seen["small_back"] and seen["big_back"], seen
    admin_commands, admin_in_capsule, _, _ = seen["admin"]
    # The admin queue carries no data in its capsules (its Connect's data goes keyed).
    assert admin_commands > 0 and admin_in_capsule == 0, seen
    commands, in_capsule, keyed_writes, keyed_reads = seen["io"]
    # The I/O queue's Connect (1 KiB) and the 4 KiB write in capsules; the 64 KiB write
    # by the target's RDMA READ; both reads by its RDMA WRITE.
    assert in_capsule == 1024 + 4096, seen
    assert keyed_writes == 1 and keyed_reads == 2 and commands == 5, seen
    assert seen["closed"], seen
    kernel_log = guest.run("dmesg").output
    tail = kernel_log[-3000:]
    assert re.search(r"nvmet: (creating|Created) nvm controller", kernel_log), tail
    assert not re.search(r"nvmet_rdma: .*(error|failed)", kernel_log, re.IGNORECASE), tail
