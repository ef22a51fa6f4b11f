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
discovered, connected to, listed, removed and added again on the same port; pynvmf logs
no error.
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
        r" (\d+) RDMA READs, (\d+) RDMA WRITEs, (\d+) sends with invalidate",
        closed,
    )
    print(closed)  # the figures, for the record (pytest -s)
    assert io_queues, closed
    totals = [sum(int(q[i]) for q in io_queues) for i in range(5)]
    # The 4 KiB writes came in capsules (4 MiB of them), the 64 KiB ones by RDMA READ (64
    # of them at least), the reads back by RDMA WRITE.
    assert totals[1] >= 4 << 20 and totals[2] >= 64 and totals[3] >= 128, closed
    # nvme-rdma registers the memory of each keyed transfer and asks for its key to be
    # invalidated (sub type Invalidate Key): every such command's completion went as SEND
    # with Invalidate (which the host checks against the key: a wrong one fails its queue).
    assert totals[4] >= totals[2] + 128, closed
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


def _sends_with_invalidate(log: str) -> int:
    return sum(int(n) for n in re.findall(r"rdma queue \d+ .* (\d+) sends with invalidate", log))


def test_fio_verify_across_a_reconnect(guest: Guest, target: None) -> None:
    before = _sends_with_invalidate(_log(guest))
    dev = _connect(guest)
    _fio(guest, dev, verify_only=False)
    guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    # The memory namespace keeps the data across the host's controllers.
    dev = _connect(guest)
    _fio(guest, dev, verify_only=True)
    guest.run(f"nvme disconnect -n {NQN}", timeout=120)
    log = _log(guest)
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", log)
    # The 64 KiB writes and every read were keyed, their completions sent with Invalidate
    # (the I/O queues' figures are logged as they close, before the disconnect returns or
    # just after: at least the first controller's are there).
    assert _sends_with_invalidate(log) > before, log[-3000:]


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
    # The removed listener let go of its address and port: a listener added there again
    # (blktests' control script does so for every test) opens and answers.
    _rpc(guest, ("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": where}))
    out = guest.run(f"nvme discover -t rdma -a {ADDRESS} -s {port}", timeout=120).output
    assert f"trsvcid: {port}" in out, out
    _rpc(guest, ("nvmf_subsystem_remove_listener", {"nqn": NQN, "listen_address": where}))
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", _log(guest))


# A host that breaks the rules, in the guest on pyverbs (the guest's Python), its capsules
# built here byte by byte (nothing of pynvmf's encoders): connect requests the binding
# rejects; then a controller with an admin and an I/O queue whose commands name too little
# host memory, an rkey the host never registered, and a SEND larger than the target's
# receive buffers. One JSON line per step.
HOSTILE_HOST = r"""
import json, os, struct, sys
import pyverbs.cmid as c
from pyverbs.librdmacm_enums import rdma_cm_event_type as EV, rdma_port_space as PS
from pyverbs.libibverbs_enums import ibv_qp_type, ibv_access_flags as A, ibv_wc_status
from pyverbs.mr import MR
from pyverbs.qp import QPCap, QPInitAttr

addr, port, subnqn, hostnqn = sys.argv[1:5]
TCP = PS.RDMA_PS_TCP
LOCAL = A.IBV_ACCESS_LOCAL_WRITE | A.IBV_ACCESS_REMOTE_READ | A.IBV_ACCESS_REMOTE_WRITE


def say(**kw):
    print(json.dumps(kw), flush=True)


def must(step, answer):  # a step the next ones need: stop at once if it failed
    say(step=step, **answer)
    if answer.get("sc", 1) != 0:
        os._exit(1)
    return answer


def private(qid, hrqsize, hsqsize, cntlid=0, recfmt=0):
    return struct.pack("<HHHHH22x", recfmt, qid, hrqsize, hsqsize, cntlid)


class Queue:
    def __init__(self, data):
        self.ch = c.CMEventChannel()
        self.id = c.CMID(creator=self.ch, port_space=TCP)
        self.id.resolve_addr(c.AddrInfo(src=addr, dst=addr, dst_service=port, port_space=TCP))
        self.expect(EV.RDMA_CM_EVENT_ADDR_RESOLVED)
        self.id.resolve_route()
        self.expect(EV.RDMA_CM_EVENT_ROUTE_RESOLVED)
        # The CM makes the queue pair's completion queues (rdma_get_*_comp wait on them).
        self.id.create_qp(
            QPInitAttr(qp_type=ibv_qp_type.IBV_QPT_RC, cap=QPCap(max_send_wr=16, max_recv_wr=16))
        )
        self.pd = self.id.pd
        self.cqes = [MR(self.pd, 64, LOCAL) for _ in range(8)]
        for mr in self.cqes:
            self.id.post_recv(mr)
        param = c.ConnParam(data_len=56)
        param.set_private_data(data)
        self.id.connect(param)
        ev = c.CMEvent(self.ch)
        self.event, self.data = ev.event_str(), bytes(ev.private_data or b"")
        ev.ack_cm_event()
        self.cid = 0

    def expect(self, kind):
        ev = c.CMEvent(self.ch)
        assert ev.event_type == kind, ev.event_str()
        ev.ack_cm_event()

    def next_event(self):
        ev = c.CMEvent(self.ch)
        name = ev.event_str()
        ev.ack_cm_event()
        return name

    def send(self, sqe, data=b""):
        mr = MR(self.pd, max(len(sqe) + len(data), 1), LOCAL)
        mr.write(sqe + data, len(sqe) + len(data))
        self.id.post_send(mr)
        self.sent = mr  # registered until its completion
        return self.id.get_send_comp().status

    def command(self, sqe, data=b""):
        status = self.send(sqe, data)
        if status != ibv_wc_status.IBV_WC_SUCCESS:
            return {"send_status": int(status)}
        wc = self.id.get_recv_comp()
        if wc.status != ibv_wc_status.IBV_WC_SUCCESS:
            return {"recv_status": int(wc.status)}
        mr = self.cqes.pop(0)
        cqe = mr.read(16, 0)
        self.id.post_recv(mr)
        self.cqes.append(mr)
        dw0, _dw1, _sqhd, _sqid, cid, status = struct.unpack("<IIHHHH", cqe)
        return {"result": dw0, "cid": cid, "sc": (status >> 1) & 0x7FF, "dnr": status >> 15}

    def sqe(self, opcode, nsid=0, sgl=None, cdws=(0,) * 6, byte4=0):
        self.cid += 1
        head = struct.pack("<BBHI", opcode, 0x40, self.cid, nsid)
        if byte4:
            head = struct.pack("<BBHB3x", opcode, 0x40, self.cid, byte4)
        # No data: a keyed SGL data block of length 0 (what Linux's nvme-rdma sends).
        sgl = keyed(0, 0, 0) if sgl is None else sgl
        return head + b"\0" * 16 + sgl + struct.pack("<6I", *cdws)


def in_capsule(length):  # SGL data block, sub type offset, at offset 0
    return struct.pack("<QI3xB", 0, length, 0x01)


def keyed(address, length, key):  # keyed SGL data block, sub type address
    return struct.pack("<Q", address) + length.to_bytes(3, "little") + struct.pack("<IB", key, 0x40)


def fabrics_connect(q, qid, sqsize, cntlid):
    data = bytearray(1024)
    data[0:16] = bytes(range(16))
    data[16:18] = struct.pack("<H", cntlid)
    data[256 : 256 + len(subnqn)] = subnqn.encode()
    data[512 : 512 + len(hostnqn)] = hostnqn.encode()
    cdws = (qid << 16, sqsize - 1, 30000, 0, 0, 0)
    return q.command(q.sqe(0x7F, sgl=in_capsule(1024), cdws=cdws, byte4=0x01), bytes(data))


# 1. Connect requests the binding rejects: the REJECTED event and its status.
for name, data in [
    ("recfmt", private(0, 32, 31, recfmt=1)),
    ("qid", private(200, 32, 31, 1)),
    ("hsqsize", private(0, 34, 33)),
    ("hrqsize", private(1, 16, 31, 1)),
    ("cntlid", private(1, 32, 31, 0x7777)),
]:
    q = Queue(data)
    say(step="reject", case=name, event=q.event, data=q.data[:4].hex())
    q.id.close()

# 2. A controller: admin queue, Fabrics Connect, then an I/O queue of its own.
admin = Queue(private(0, 32, 31))
say(step="admin", event=admin.event)
cntlid = must("admin connect", fabrics_connect(admin, 0, 32, 0xFFFF))["result"] & 0xFFFF
# Property Set CC (EN, 64-byte SQEs, 16-byte CQEs), then Property Get CSTS until RDY.
must("enable", admin.command(admin.sqe(0x7F, cdws=(0, 0x14, 0x460001, 0, 0, 0))))
for _ in range(100):
    if admin.command(admin.sqe(0x7F, cdws=(0, 0x1C, 0, 0, 0, 0), byte4=0x04))["result"] & 1:
        break
io = Queue(private(1, 32, 31, cntlid))
say(step="io", event=io.event)
must("io connect", fabrics_connect(io, 1, 32, cntlid))

# 3. A Write of 8 blocks (4 KiB) whose keyed SGL names 512 bytes of host memory.
buf = MR(io.pd, 4096, LOCAL)
sqe = io.sqe(0x01, 1, keyed(buf.buf, 512, buf.rkey), (0, 0, 7, 0, 0, 0))
say(step="short sgl", **io.command(sqe))
# 4. A Read of one block whose SGL names 4 KiB: the target sends no more than it has, so it
# refuses (nothing of its memory past the block leaves).
sqe = io.sqe(0x02, 1, keyed(buf.buf, 4096, buf.rkey), (0, 0, 0, 0, 0, 0))
say(step="long sgl", **io.command(sqe))
# 5. A Write whose keyed SGL names a key this host never registered: the target's RDMA READ
# fails, and that queue ends.
sqe = io.sqe(0x01, 1, keyed(buf.buf, 4096, buf.rkey ^ 0x5A5A5A), (0, 0, 7, 0, 0, 0))
io.send(sqe)
say(step="bad key", event=io.next_event())
# 6. The admin queue of the same controller still answers (Keep Alive).
say(step="keep alive", **admin.command(admin.sqe(0x18)))
# 7. A SEND larger than the target's receive buffers: that queue ends.
status = admin.send(admin.sqe(0x18), b"\0" * 65536)
say(step="oversized send", send_status=int(status), event=admin.next_event())
# 8. The target still serves a new host.
again = Queue(private(0, 32, 31))
say(step="again", event=again.event)
say(step="again connect", **fabrics_connect(again, 0, 32, 0xFFFF))
again.id.disconnect()
os._exit(0)  # pyverbs' objects are not torn down in order at exit
"""

# The NVMe/RDMA binding's reject statuses (NVMe over Fabrics, RDMA transport binding).
REJECT_STATUS = {"recfmt": 2, "qid": 3, "hsqsize": 4, "hrqsize": 5, "cntlid": 9}
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000bad01"


def test_a_host_that_breaks_the_rules_loses_its_queue_only(guest: Guest, target: None) -> None:
    guest.write_file("/tmp/hostile_host.py", HOSTILE_HOST)
    out = guest.run(
        f"python3 /tmp/hostile_host.py {ADDRESS} {PORT} {NQN} {HOSTNQN}", timeout=300
    ).output
    steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    by = {(s["step"], s.get("case")): s for s in steps}
    for case, status in REJECT_STATUS.items():
        rejected = by["reject", case]
        assert rejected["event"] == "RDMA_CM_EVENT_REJECTED", rejected
        # RECFMT 0, then STS: the status the binding names for that field.
        assert rejected["data"] == f"0000{status:02x}00", rejected
    assert by["admin", None]["event"] == "RDMA_CM_EVENT_ESTABLISHED", out
    assert by["admin connect", None]["sc"] == 0, out
    assert by["enable", None]["sc"] == 0, out
    assert by["io connect", None]["sc"] == 0, out
    # Data SGL Length Invalid, DNR: the descriptor names less (or more) than the blocks.
    for step in ("short sgl", "long sgl"):
        assert (by[step, None]["sc"], by[step, None]["dnr"]) == (0x0F, 1), out
    assert by["bad key", None]["event"] == "RDMA_CM_EVENT_DISCONNECTED", out
    assert by["keep alive", None]["sc"] == 0, out
    assert by["oversized send", None]["event"] == "RDMA_CM_EVENT_DISCONNECTED", out
    assert by["again connect", None]["sc"] == 0, out
    log = _log(guest)
    # Each queue's end says why: the READ the bad key failed, the receive the verbs refused.
    assert "reason: RDMA READ of command" in log, log[-3000:]
    assert "reason: receive failed" in log, log[-3000:]
    assert not re.search(r"\b(ERROR|Traceback|exception)\b", log), log[-3000:]
    assert guest.run("kill -0 $(cat /tmp/target.pid)", check=False).ok
