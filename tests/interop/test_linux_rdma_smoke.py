"""NVMe/RDMA's environment, proved in one guest (Linux 7; 6.12 too): soft-RoCE (rdma_rxe)
on the guest's network device, the kernel's nvmet-rdma target and nvme-rdma host talking
over it, and rdma-core's Python bindings (pyverbs) on the guest's Debian Python, which
pynvmf's RDMA transport uses. The machines' own kernel has no rdma_rxe, so everything RDMA
runs in a guest (docs/rdma.md).

One guest boots the module's peer (linux-7; linux-6.12 too under PYNVMF_GUEST_EVERY_PEER=1:
tests/support/guest_rdma.py); the tests share its soft-RoCE device and run in file order.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterator

import pytest

from pynvmf.rdma.cm import (
    ADMIN_QUEUE_SIZE,
    ConnectAccept,
    ConnectReject,
    ConnectRequest,
    QueueLimits,
    RejectStatus,
    answer_connect,
)
from tests.support import guest_rdma
from tests.support.guest import (
    Guest,
    Peer,
    setup_kernel_target,
    teardown_kernel_target,
)

pytestmark = guest_rdma.RDMA_PEERS.mark()

NQN = "nqn.2014-08.org.pynvmf:rdma-smoke"
# NVMe/RDMA's IANA port.
PORT = 4420
RXE = "rxe0"
DATA_MIB = 4


@pytest.fixture(scope="module")
def guest(linux_peer: Peer) -> Iterator[Guest]:
    with guest_rdma.rdma_guest(linux_peer, soft_roce=None) as g:
        yield g


@pytest.fixture(scope="module")
def soft_roce(guest: Guest) -> str:
    return guest_rdma.add_soft_roce(guest, RXE)


def test_kernel_has_the_rdma_modules(guest: Guest) -> None:
    names = " ".join(guest_rdma.MODULES)
    files = guest.run(f"for m in {names}; do modinfo -F filename $m; done").output.split()
    for module in guest_rdma.MODULES:
        assert any(f"/{module}.ko" in f for f in files), (module, files)


def test_soft_roce_link_on_the_guest_nic(guest: Guest, soft_roce: str) -> None:
    assert f"netdev {guest_rdma.NETDEV}" in soft_roce
    devices = guest.run("ibv_devices").output
    assert RXE in devices, devices
    info = guest.run(f"ibv_devinfo -d {RXE}").output
    assert re.search(r"state:\s+PORT_ACTIVE", info), info
    assert re.search(r"link_layer:\s+Ethernet", info), info
    # The verbs device user space opens (ib_uverbs, created by devtmpfs without udev).
    guest.run("ls /dev/infiniband/uverbs0 /dev/infiniband/rdma_cm")


def test_pyverbs_opens_the_soft_roce_device(guest: Guest, soft_roce: str) -> None:
    script = f"""
import pyverbs
from pyverbs.device import Context, get_device_list
from pyverbs.pd import PD
from pyverbs.mr import MR
import pyverbs.libibverbs_enums as e

names = [d.name.decode() for d in get_device_list()]
print("devices", names)
with Context(name={RXE!r}) as ctx:
    attr = ctx.query_device()
    print("max_qp_wr", attr.max_qp_wr, "max_sge", attr.max_sge)
    access = e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE | e.ibv_access_flags.IBV_ACCESS_REMOTE_READ
    with PD(ctx) as pd, MR(pd, 16384, access) as mr:
        print("mr rkey", mr.rkey, "length", mr.length)
"""
    out = guest.run("python3 -", input=script).output
    assert f"devices ['{RXE}']" in out, out
    assert re.search(r"^mr rkey \d+ length 16384$", out, re.MULTILINE), out


# One RDMA CM exchange per request in one process on the soft-RoCE device: the active side
# connects with the request's private data, the passive side prints what arrived and answers
# with the reply given (a reject, or an accept with a QP). pyverbs' ConnParam carries private
# data only when built with data_len (at most 56 bytes in a request, 196 in an accept).
CM_EXCHANGE = r"""
import sys
import pyverbs.cmid as c
from pyverbs.librdmacm_enums import RAI_PASSIVE, rdma_cm_event_type as EV
from pyverbs.librdmacm_enums import rdma_port_space as PS
from pyverbs.libibverbs_enums import ibv_qp_type
from pyverbs.qp import QPCap, QPInitAttr

addr, port = sys.argv[1], sys.argv[2]
TCP = PS.RDMA_PS_TCP


def event(channel, want):
    ev = c.CMEvent(channel)
    assert ev.event_type == want, (ev.event_str(), want)
    return ev


def qp_attr():
    return QPInitAttr(qp_type=ibv_qp_type.IBV_QPT_RC, cap=QPCap(max_send_wr=4, max_recv_wr=4))


server = c.CMEventChannel()
listen = c.CMID(creator=server, port_space=TCP)
listen.bind_addr(c.AddrInfo(src=addr, src_service=port, port_space=TCP, flags=RAI_PASSIVE))
listen.listen()
for line in sys.stdin:
    request, kind, reply = line.split()
    client = c.CMEventChannel()
    host = c.CMID(creator=client, port_space=TCP)
    host.resolve_addr(c.AddrInfo(src=addr, dst=addr, dst_service=port, port_space=TCP))
    event(client, EV.RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    host.resolve_route()
    event(client, EV.RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
    host.create_qp(qp_attr())
    param = c.ConnParam(data_len=56)
    param.set_private_data(bytes.fromhex(request))
    host.connect(param)
    ev = event(server, EV.RDMA_CM_EVENT_CONNECT_REQUEST)
    print("request", bytes(ev.private_data).hex())
    child = c.CMID(creator=ev, listen_id=listen)
    ev.ack_cm_event()
    if kind == "reject":
        child.reject(bytes.fromhex(reply))
        ev = event(client, EV.RDMA_CM_EVENT_REJECTED)
    else:
        child.create_qp(qp_attr())
        accept = c.ConnParam(data_len=196)
        accept.set_private_data(bytes.fromhex(reply))
        child.accept(accept)
        ev = event(client, EV.RDMA_CM_EVENT_ESTABLISHED)
    print(kind, bytes(ev.private_data).hex())
    ev.ack_cm_event()
    if kind == "accept":
        event(server, EV.RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
        host.disconnect()
        event(server, EV.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
        # The answer to the host's DREQ: without it the host's side waits for the CM timeout.
        child.disconnect()
        event(client, EV.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()
    child.close()
    host.close()
"""


def test_pyverbs_carries_the_nvme_rdma_private_data(guest: Guest, soft_roce: str) -> None:
    limits = QueueLimits(max_qid=4, io_queue_size=128)
    admin = ConnectRequest.for_queue(qid=0, queue_size=ADMIN_QUEUE_SIZE)
    # One entry more than the admin queue holds.
    too_deep = ConnectRequest(qid=0, hrqsize=ADMIN_QUEUE_SIZE + 1, hsqsize=ADMIN_QUEUE_SIZE)
    lines = []
    for request in (too_deep, admin):
        answer = answer_connect(request.encode(), limits, set())
        kind, reply = (
            ("reject", answer.encode())
            if isinstance(answer, ConnectReject)
            else ("accept", answer[1].encode())
        )
        lines.append(f"{request.encode().hex()} {kind} {reply.hex()}\n")
    guest.write_file("/tmp/cm_exchange.py", CM_EXCHANGE)
    out = guest.run(
        f"python3 /tmp/cm_exchange.py {guest.guest_address} {PORT + 1}",
        input="".join(lines),
        timeout=120,
    ).output
    seen = re.findall(r"^(request|reject|accept) ([0-9a-f]+)$", out, re.MULTILINE)
    assert [kind for kind, _ in seen] == ["request", "reject", "request", "accept"], out
    # The CM pads a request's private data to 56 bytes, a reject's and an accept's further.
    received = [bytes.fromhex(data) for _, data in seen]
    assert ConnectRequest.decode(received[0]) == too_deep
    assert ConnectReject.decode(received[1]).status is RejectStatus.INVALID_HSQSIZE
    assert ConnectRequest.decode(received[2]) == admin
    assert ConnectAccept.decode(received[3]) == ConnectAccept(crqsize=ADMIN_QUEUE_SIZE)


def test_kernel_nvme_rdma_host_against_nvmet_rdma(guest: Guest, soft_roce: str) -> None:
    addr = guest.guest_address
    target = setup_kernel_target(guest, port=PORT, nqn=NQN, size_mb=64, traddr=addr, trtype="rdma")
    try:
        log = guest.run(f"nvme discover -t rdma -a {addr} -s {PORT}", timeout=120).output
        assert re.search(r"trtype:\s+rdma", log), log
        assert NQN in log, log
        guest.run(f"nvme connect -t rdma -a {addr} -s {PORT} -n {NQN}", timeout=120)
        try:
            ctrl, dev = _connected(guest)
            pattern = hashlib.sha256(b"pynvmf rdma smoke").digest() * (DATA_MIB << 15)
            guest.write_file("/tmp/pattern", pattern)
            guest.run(
                f"dd if=/tmp/pattern of={dev} bs=64k oflag=direct status=none"
                f" && dd if={dev} of=/tmp/back bs=64k count={DATA_MIB * 16} iflag=direct"
                " status=none",
                timeout=120,
            )
            back = guest.run("sha256sum /tmp/back").output.split()[0]
            assert back == hashlib.sha256(pattern).hexdigest()
            transport = guest.run(f"cat /sys/class/nvme/{ctrl}/transport").output.strip()
            assert transport == "rdma"
        finally:
            out = guest.run(f"nvme disconnect -n {NQN}", timeout=60).output
            assert "disconnected 1 controller" in out, out
        kernel_log = guest.run("dmesg").output
        assert not re.search(r"nvmet_rdma: .*(error|failed)", kernel_log, re.IGNORECASE), (
            kernel_log[-3000:]
        )
    finally:
        teardown_kernel_target(guest, target)


# Prints "<controller> <disk>" of namespace 1 of the controller connected to subsystem $1,
# waiting (bounded) for the kernel's namespace scan to create the disk.
CONNECTED = r"""
nqn=$1
i=0
while [ $i -lt 200 ]; do
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
    for n in $(ls "$c"); do
      case "$n" in
        nvme*n1)
          # With native multipath the path is nvmeXcYn1, the disk nvmeXn1.
          disk=$(echo "$n" | sed -E 's/c[0-9]+n/n/')
          [ -b "/dev/$disk" ] && { echo "${c##*/} /dev/$disk"; exit 0; } ;;
      esac
    done
  done
  i=$((i + 1)); sleep 0.05
done
echo "no block device for $nqn" >&2
exit 1
"""


def _connected(guest: Guest) -> tuple[str, str]:
    """(controller, disk) of the namespace the host connected to ``NQN``."""
    ctrl, dev = guest.run(f"sh -s {shlex.quote(NQN)}", input=CONNECTED).output.split()
    return ctrl, dev
