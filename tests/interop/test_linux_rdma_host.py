"""The Linux nvme-rdma host against pynvmf's NVMe/RDMA target, over soft-RoCE in one guest.

pynvmf's target runs inside the module's peer (linux-7; linux-6.12 too under
PYNVMF_GUEST_EVERY_PEER=1: tests/support/guest_rdma.py) with the guest's Debian Python and
python3-pyverbs (the tree is copied into the guest at /opt/pynvmf:
tests/support/guest_pynvmf.py), listening on rdma:10.0.2.15:4420 with a memory namespace.
The kernel's host discovers it (trtype rdma in the log), connects, writes 4 MiB with dd in
4 KiB blocks (the data in the command capsules) and in 64 KiB blocks (above the 16 KiB
in-capsule size: the target fetches it with RDMA READ), reads it back (RDMA WRITE)
identical, and disconnects; fio verifies (crc32c) 4 KiB and 16 KiB writes (in-capsule),
64 KiB writes (RDMA READ) and 1 MiB transfers, across a disconnect and reconnect; ten
connect/disconnect cycles leave the target holding no CM ID and no more descriptors; an
rdma listener added over SPDK's RPCs (with an RDMA transport of 8 KiB in-capsule data) is
discovered, connected to, listed and removed; pynvmf logs no error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import guest_pynvmf, guest_rdma
from tests.support.guest import Guest, Peer

pytestmark = guest_rdma.RDMA_PEERS.mark()

NQN = "nqn.2014-08.org.pynvmf:rdma-host"
ADDRESS = "10.0.2.15"
PORT = 4420
RXE = "rxe0"
RPC_SOCKET = "/tmp/pynvmf.sock"


@pytest.fixture(scope="module")
def guest(linux_peer: Peer) -> Iterator[Guest]:
    with guest_rdma.rdma_guest(linux_peer, RXE) as g:
        yield g


@pytest.fixture(scope="module")
def target(guest: Guest) -> Iterator[None]:
    guest.run("modprobe nvme-rdma")
    guest_pynvmf.install(guest, check_import="pyverbs.cmid")
    # One process (the guest's Python lacks what --cores' workers need); pynvmf from the
    # copied tree, with the guest's Debian Python and its python3-pyverbs.
    guest.run(
        "cd /tmp && (PYTHONPATH=/opt/pynvmf python3 -m pynvmf target"
        f" --listen rdma:{ADDRESS}:{PORT} --memory 64M --nqn {NQN} --discovery-port 0"
        f" --cores 1 -v --rpc-socket {RPC_SOCKET}"
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


def _connect(guest: Guest) -> str:
    """``nvme connect`` to NQN; the namespace's disk once the host has made it."""
    guest.run(f"nvme connect -t rdma -a {ADDRESS} -s {PORT} -n {NQN}", timeout=150)
    return guest.run(
        "for i in $(seq 100); do for c in /sys/class/nvme/nvme*; do"
        f' [ "$(cat $c/subsysnqn 2>/dev/null)" = {NQN} ] && for n in $c/nvme*n*; do'
        ' d=/dev/$(basename $n | sed -E "s/c[0-9]+n/n/"); [ -b $d ] && { echo $d; exit 0; };'
        " done; done; sleep 0.1; done; exit 1"
    ).output.strip()


def test_connect_write_read_back_and_disconnect(guest: Guest, target: None) -> None:
    dev = _connect(guest)
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


# fio jobs (block size, offset, size), in one fio run (each job its own region): 4 KiB and
# 16 KiB writes travel in the capsule (16 KiB in-capsule data by default), 64 KiB ones by
# RDMA READ; each job reads its data back in its block size (1 MiB reads by RDMA WRITE)
# and checks crc32c.
FIO_JOBS = (("4k", "0", "1M"), ("16k", "1M", "1M"), ("64k", "2M", "2M"), ("1M", "4M", "2M"))


def _fio(guest: Guest, dev: str, verify_only: bool) -> None:
    jobs = " ".join(
        f"--name=v{bs} --bs={bs} --offset={offset} --size={size}" for bs, offset, size in FIO_JOBS
    )
    guest.run(
        f"fio --filename={dev} --direct=1 --ioengine=psync --rw=write --verify=crc32c"
        f" --do_verify=1 --verify_fatal=1 --output-format=terse"
        f"{' --verify_only' if verify_only else ''} {jobs}",
        timeout=300,
    )


def test_fio_verify_across_a_reconnect(guest: Guest, target: None) -> None:
    dev = _connect(guest)
    _fio(guest, dev, verify_only=False)
    guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    # The memory namespace keeps the data across the host's controllers.
    dev = _connect(guest)
    _fio(guest, dev, verify_only=True)
    guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", _log(guest))


CYCLES = 10


def test_connect_disconnect_cycles_hold_nothing(guest: Guest, target: None) -> None:
    pid = guest.run("cat /tmp/target.pid").output.strip()
    fds = f"ls /proc/{pid}/fd | wc -l"
    before = int(guest.run(fds).output)
    closed_before = len(re.findall(r"rdma queue \d+ .* closed", _log(guest)))
    guest.run(
        f"for i in $(seq {CYCLES}); do"
        f" nvme connect -t rdma -a {ADDRESS} -s {PORT} -n {NQN} >/dev/null || exit 1;"
        f" nvme disconnect -n {NQN} >/dev/null || exit 1; done",
        timeout=300,
    )
    # Each cycle closes the admin queue and at least one I/O queue; the last close logs
    # what the listener holds then (RdmaListener.held_cm_ids).
    log = guest.run(
        "for i in $(seq 100); do tail -1 /tmp/target.err | grep -q 'holds 0 CM IDs' && break;"
        " sleep 0.1; done; cat /tmp/target.err"
    ).output
    closes = re.findall(r"rdma queue \d+ .* closed: .*; the listener holds (\d+) CM IDs", log)
    assert len(closes) - closed_before >= 2 * CYCLES, log[-3000:]
    assert closes[-1] == "0", log[-3000:]
    # What a connection had (its CM ID, completion channels and queues) is gone: the
    # process holds the descriptors it held before the cycles.
    assert int(guest.run(fds).output) == before
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", log), log[-3000:]


# Makes JSON-RPC calls (a JSON list of [method, params] on stdin) through one client in
# one process (the guest's Python starts in seconds under TCG); prints the results as JSON.
RPC_CALLS = f"""
import json, sys
from pynvmf.rpc.client import RpcClient
with RpcClient({RPC_SOCKET!r}) as client:
    print(json.dumps([client.call(m, p) for m, p in json.load(sys.stdin)]))
"""


def _rpc(guest: Guest, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """SPDK's methods called on the target in the guest, in order: their results."""
    guest.write_file("/tmp/rpc_calls.py", RPC_CALLS)
    out = guest.run(
        "PYTHONPATH=/opt/pynvmf python3 /tmp/rpc_calls.py",
        input=json.dumps([list(c) for c in calls]),
        timeout=120,
    ).output
    return list(json.loads(out.strip().splitlines()[-1]))


def test_an_rdma_listener_added_over_spdks_rpcs(guest: Guest, target: None) -> None:
    port = PORT + 1
    where = {"trtype": "RDMA", "adrfam": "IPv4", "traddr": ADDRESS, "trsvcid": str(port)}
    *_, listeners = _rpc(
        guest,
        ("nvmf_create_transport", {"trtype": "RDMA", "in_capsule_data_size": 8192}),
        ("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": where}),
        ("nvmf_subsystem_get_listeners", {"nqn": NQN}),
    )
    assert where in [entry["address"] for entry in listeners]
    out = guest.run(f"nvme discover -t rdma -a {ADDRESS} -s {port}", timeout=120).output
    ours = [e for e in out.split("=====Discovery Log Entry") if f"trsvcid: {port}" in e]
    assert ours and f"subnqn:  {NQN}" in ours[0] and re.search(r"trtype:\s+rdma", ours[0]), out
    guest.run(f"nvme connect -t rdma -a {ADDRESS} -s {port} -n {NQN}", timeout=150)
    try:
        ctrl = guest.run(
            "for c in /sys/class/nvme/nvme*; do"
            f' [ "$(cat $c/subsysnqn)" = {NQN} ] && basename $c && break; done'
        ).output.strip()
        # The listener's transport: 8 KiB of in-capsule data, IOCCSZ (8192 + 64) / 16.
        ioccsz = guest.run(f"nvme id-ctrl /dev/{ctrl} | grep '^ioccsz'").output
        assert re.search(r"ioccsz\s*:\s*516\b", ioccsz), ioccsz
    finally:
        guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    _, listeners = _rpc(
        guest,
        ("nvmf_subsystem_remove_listener", {"nqn": NQN, "listen_address": where}),
        ("nvmf_subsystem_get_listeners", {"nqn": NQN}),
    )
    assert [entry["address"]["trsvcid"] for entry in listeners] == [str(PORT)]
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", _log(guest))
