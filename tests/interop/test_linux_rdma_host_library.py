"""pynvmf's host library over NVMe/RDMA against the Linux kernel's nvmet-rdma, over
soft-RoCE in one guest.

The kernel's target (configfs: an rdma port on 10.0.2.15:4420, a null_blk namespace) and
pynvmf's host library (pynvmf.host.connect with trtype rdma, pynvmf/rdma/host_verbs.py
over python3-pyverbs, on the guest's Debian Python; the tree is copied into the guest at
/opt/pynvmf) both run in the module's peer (linux-7; 6.12 too under
PYNVMF_GUEST_EVERY_PEER=1). The host connects the admin queue and an I/O queue (RDMA CM
with the NVMe/RDMA private data; a request for an admin queue deeper than nvmet's is
rejected first, the status read back), runs Identify, writes 4 KiB (in the command
capsule: nvmet-rdma's in-capsule size is 4 KiB) and 64 KiB (a keyed SGL: the target RDMA
READs it), reads both back identical (the target RDMA WRITEs them), and disconnects; the
kernel logs no nvmet_rdma error. The same host then runs against pynvmf's own NVMe/RDMA
target (pynvmf/rdma/verbs.py, 16 KiB in-capsule) started in the same guest on the next
port, and again after a rejected request; its log has no error. Last, discovery over
RDMA: the host library reads both targets' discovery logs over rdma queues (TRTYPE rdma)
and connects to what they list; `pynvmf discover -t rdma` reads the kernel's; pynvmf's
nvmf_get_stats shows its rdma queues' counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import guest_pynvmf, guest_rdma
from tests.support.guest import (
    Guest,
    KernelTarget,
    Peer,
    setup_kernel_target,
    teardown_kernel_target,
)
from tests.support.guest_pynvmf import GUEST_DIR

pytestmark = guest_rdma.RDMA_PEERS.mark()

NQN = "nqn.2014-08.org.pynvmf:rdma-host-library"
PORT = 4420
# pynvmf's own target, in the same guest.
PYNVMF_NQN = "nqn.2014-08.org.pynvmf:rdma-host-library-pynvmf"
PYNVMF_PORT = 4421
RPC_SOCKET = "/tmp/pynvmf-rpc.sock"
RXE = "rxe0"


@pytest.fixture(scope="module")
def guest(linux_peer: Peer) -> Iterator[Guest]:
    with guest_rdma.rdma_guest(linux_peer, RXE) as g:
        yield g


@pytest.fixture(scope="module")
def kernel_target(guest: Guest) -> Iterator[KernelTarget]:
    guest_pynvmf.install(guest, check_import="pyverbs.cmid")
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
    reject = await rejected() if "reject" in sys.argv[4:] else None
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


def _run_host(guest: Guest, port: int, nqn: str, *steps: str) -> dict[str, Any]:
    """HOST against ``port`` on the guest's address (``steps``: "reject" first asks for
    an admin queue too deep): what it printed."""
    guest.write_file("/tmp/rdma_host.py", HOST)
    done = guest.run(
        f"cd /tmp && PYTHONPATH={GUEST_DIR} python3 /tmp/rdma_host.py"
        f" {guest.guest_address} {port} {nqn} {' '.join(steps)}",
        timeout=240,
    )
    print(done.output)  # the host's log and figures, for the record (pytest -s)
    lines = [ln for ln in done.output.splitlines() if ln.startswith("{")]
    assert lines, done.output
    assert "Traceback" not in done.output and "not closed within" not in done.output
    seen: dict[str, Any] = json.loads(lines[-1])
    return seen


def _check(seen: dict[str, Any], in_capsule_size: int) -> None:
    """What HOST saw of a controller whose in-capsule size is ``in_capsule_size``."""
    # Identify: IOCCSZ (the SQE and the in-capsule size), keyed SGLs (SGLS bit 2).
    assert seen["ioccsz"] * 16 == 64 + in_capsule_size, seen
    assert seen["inline"] == in_capsule_size, seen
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


def test_the_host_library_over_rdma_against_nvmet_rdma(
    guest: Guest, kernel_target: KernelTarget
) -> None:
    guest.run("dmesg -C")
    # nvmet-rdma's default in-capsule size: 4 KiB.
    seen = _run_host(guest, PORT, NQN, "reject")
    # nvmet-rdma's answer to an admin queue deeper than 32 entries, as the host reads it.
    assert seen["reject"][0] == "INVALID_HSQSIZE", seen
    _check(seen, 4096)
    kernel_log = guest.run("dmesg").output
    tail = kernel_log[-3000:]
    assert re.search(r"nvmet: (creating|Created) nvm controller", kernel_log), tail
    assert not re.search(r"nvmet_rdma: .*(error|failed)", kernel_log, re.IGNORECASE), tail


@pytest.fixture(scope="module")
def pynvmf_target(guest: Guest, kernel_target: KernelTarget) -> Iterator[None]:
    """pynvmf's own NVMe/RDMA target in the same guest, on the next port (16 KiB
    in-capsule), after the kernel's target had its test."""
    guest.run(
        f"cd /tmp && (PYTHONPATH={GUEST_DIR} python3 -m pynvmf target"
        f" --listen rdma:{guest.guest_address}:{PYNVMF_PORT} --memory 64M --nqn {PYNVMF_NQN}"
        f" --discovery-port 0 --cores 1 -v --rpc-socket {RPC_SOCKET}"
        " > /tmp/pynvmf.out 2> /tmp/pynvmf.err & echo $! > /tmp/pynvmf.pid)\n"
        "for i in $(seq 300); do grep -q ready /tmp/pynvmf.out && exit 0; sleep 0.2; done;"
        " cat /tmp/pynvmf.err; exit 1",
        timeout=120,
    )
    yield
    # For the record (-s): whether the target still ran, how a process that died did.
    alive = guest.run("kill $(cat /tmp/pynvmf.pid) && echo ran to the end", check=False)
    print(alive.output, guest.run("dmesg | grep -iE 'segfault|python3' || true").output)
    print(guest.run("cat /tmp/pynvmf.err", check=False).output)


def test_the_host_library_over_rdma_against_pynvmf_target(
    guest: Guest, pynvmf_target: None
) -> None:
    _check(_run_host(guest, PYNVMF_PORT, PYNVMF_NQN), 16384)
    # The target's figures once the admin queue closed (the host deletes it last).
    closed = guest.run(
        "for i in $(seq 100); do grep -q 'rdma queue 0 .* closed' /tmp/pynvmf.err && break;"
        ' sleep 0.1; done; grep "rdma queue" /tmp/pynvmf.err'
    ).output
    assert re.search(r"rdma queue 1 .* closed: 5 commands, 5120 bytes in capsules,", closed), closed
    log = guest.run("cat /tmp/pynvmf.err").output
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", log), log


def test_a_connect_after_a_reject_against_pynvmf_target(guest: Guest, pynvmf_target: None) -> None:
    # A rejected request leaves nothing behind (verbs.py destroys its CM ID through the
    # one wrapper the listener made for it): the next request is served.
    seen = _run_host(guest, PYNVMF_PORT, PYNVMF_NQN, "reject")
    assert seen["reject"][0] == "INVALID_HSQSIZE", seen
    _check(seen, 16384)


# Runs in the guest: discovery over rdma queues at each (port, NQN) given, then a connect
# to the entry that lists NQN (connect_entry: the transport its TRTYPE names), a 4 KiB
# write read back; prints one JSON line.
DISCOVER = r"""
import asyncio, json, os, sys
from pynvmf import host

address = sys.argv[1]
targets = [(int(p), nqn) for p, nqn in (a.split("=") for a in sys.argv[2:])]


async def one(port, nqn):
    entries = await host.discover(address, port, trtype="rdma")
    seen = {"log": [[e.trtype, e.subtype, e.subnqn, e.trsvcid] for e in entries]}
    [entry] = [e for e in entries if e.subnqn == nqn]
    ctrl = await host.connect_entry(entry, queues=1, queue_depth=16)
    try:
        seen["trtype"] = ctrl.trtype
        seen["queues"] = len(ctrl.io_queues)
        data = os.urandom(4096)
        await ctrl.namespaces[1].write(8, data)
        back = bytearray(4096)
        await ctrl.namespaces[1].read(8, memoryview(back))
        seen["back"] = bytes(back) == data
    finally:
        await ctrl.close()
    return seen


async def main():
    print(json.dumps({nqn: await one(port, nqn) for port, nqn in targets}))


asyncio.run(main())
"""

STATS = f"""
import json
from pynvmf.rpc.client import RpcClient
with RpcClient({RPC_SOCKET!r}) as client:
    print(json.dumps(client.call("nvmf_get_stats", {{}})))
"""


def _last_json(output: str) -> Any:
    lines = [ln for ln in output.splitlines() if ln.startswith(("{", "["))]
    assert lines, output
    return json.loads(lines[-1])


def test_discovery_over_rdma_the_cli_and_the_rdma_statistics(
    guest: Guest, kernel_target: KernelTarget, pynvmf_target: None
) -> None:
    address = guest.guest_address
    guest.write_file("/tmp/rdma_discover.py", DISCOVER)
    done = guest.run(
        f"cd /tmp && PYTHONPATH={GUEST_DIR} python3 /tmp/rdma_discover.py {address}"
        f" {PORT}={NQN} {PYNVMF_PORT}={PYNVMF_NQN}",
        timeout=240,
    )
    print(done.output)
    assert "Traceback" not in done.output
    seen = _last_json(done.output)
    for nqn, port in ((NQN, PORT), (PYNVMF_NQN, PYNVMF_PORT)):
        # Every entry of both logs says TRTYPE rdma (1); the subsystem is listed at its port.
        assert {trtype for trtype, *_ in seen[nqn]["log"]} == {1}, seen
        assert [2, nqn, str(port)] in [e[1:] for e in seen[nqn]["log"]], seen
        assert seen[nqn]["trtype"] == "rdma" and seen[nqn]["queues"] == 1, seen
        assert seen[nqn]["back"], seen

    # The command line: nvme-cli's -t rdma, the port by default 4420 (the kernel's).
    cli = guest.run(
        f"cd /tmp && PYTHONPATH={GUEST_DIR} python3 -m pynvmf discover -t rdma -a {address}"
        " -o json",
        timeout=240,
    )
    # -o json prints the log indented, over several lines.
    output = cli.output
    records = json.loads(output[output.index("{\n") : output.rindex("}") + 1])["records"]
    ours = [r for r in records if r["subnqn"] == NQN]
    assert ours and ours[0]["trtype"] == "rdma" and ours[0]["trsvcid"] == str(PORT), cli.output

    # pynvmf's target counted what its rdma queues carried (the host library's runs).
    guest.write_file("/tmp/rdma_stats.py", STATS)
    stats = _last_json(guest.run(f"PYTHONPATH={GUEST_DIR} python3 /tmp/rdma_stats.py").output)
    print(json.dumps(stats))
    [rdma] = [t for t in stats["poll_groups"][0]["transports"] if t["trtype"] == "RDMA"]
    [device] = rdma["devices"]
    assert device["name"] == f"rdma:{address}:{PYNVMF_PORT}", device
    assert device["requests"] > 0 and device["completions"] > device["requests"], device
    assert device["in_capsule_bytes"] > 0 and device["rdma_reads"] > 0, device
    assert device["rdma_writes"] > 0 and device["total_send_wrs"] > 0, device
    # Each run opened an admin and an I/O queue (those alive still may be closing).
    assert device["queues_opened"] >= 2, device
