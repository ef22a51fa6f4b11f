"""The control plane with the Linux kernel's NVMe/TCP host (under QEMU) connected: a
namespace added over RPC appears on the host without a reconnect and goes again when
removed; a removed subsystem takes the host's controller out of `live`, and the host
reconnects by itself once the subsystem is back; a persistent discovery controller
hears of new subsystems; blktests' NVME_TARGET_CONTROL script sets up what the
host then connects to; a namespace visible to chosen hosts appears and goes on this one;
a file namespace and a memory namespace that grow, or are cut (forced), take their new
size on the host's block device without a reconnect.

On Linux 6.1 and 7 (6.12 with PYNVMF_GUEST_EVERY_PEER=1: tests/support/guest.py's rule):
per peer, one guest boot and one target process (`pynvmf target --empty` with its RPC
on a Unix socket and on TCP) serve the whole module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.rpc.client import RpcClient, RpcClientError
from pynvmf.spec.opcodes import DISCOVERY_NQN
from tests.interop.test_linux_host import DEV_FOR, wait_size
from tests.support.guest import OLDEST_AND_NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

MIB = 1 << 20
NQN = "nqn.2024-11.dev.pynvmf:control-plane"
NEW_NQN = "nqn.2024-11.dev.pynvmf:control-plane-new"
NS2_UUID = "6a1c3a2e-93b4-4d0e-9a55-2d1f0c7b9e42"
SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "blktests" / "nvme-target-control"

pytestmark = OLDEST_AND_NEWEST.mark()

# Exits 0 once the controller of subsystem $1 has no namespace of NSID $2 (bounded wait).
NS_GONE = r"""#!/bin/sh
nqn=$1; nsid=$2
i=0
while [ $i -lt 200 ]; do
  found=
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
    for n in $(ls "$c"); do
      case "$n" in
        nvme*n*)
          # The disk's name need not follow the NSID: its sysfs nsid tells.
          disk=$(echo "$n" | sed -E 's/c[0-9]+n/n/')
          [ "$(cat "/sys/block/$disk/nsid" 2>/dev/null)" = "$nsid" ] && found=1 ;;
      esac
    done
  done
  [ -z "$found" ] && exit 0
  i=$((i + 1)); sleep 0.05
done
echo "namespace $nsid of $nqn is still there" >&2
exit 1
"""

# Waits (up to $3 seconds) until the state of the controller of subsystem $1 is $2, or
# with "!$2" until it is anything else; prints the state.
CTRL_STATE = r"""#!/bin/sh
nqn=$1; want=$2; limit=${3:-30}
i=0
while [ $i -lt $((limit * 10)) ]; do
  state=
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
    state=$(cat "$c/state")
  done
  case "$want" in
    !*) [ -n "$state" ] && [ "$state" != "${want#!}" ] && { echo "$state"; exit 0; } ;;
    *) [ "$state" = "$want" ] && { echo "$state"; exit 0; } ;;
  esac
  i=$((i + 1)); sleep 0.1
done
echo "controller of $nqn: state '$state', not '$want'" >&2
exit 1
"""


@dataclass
class Served:
    process: TargetProcess
    socket: str
    rpc_port: int
    io_port: int
    disc_port: int

    def rpc(self) -> RpcClient:
        return RpcClient(self.socket)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer) -> Iterator[Served]:
    # A target per peer: the tests reuse NQNs and bdev names, each peer's run from scratch.
    workdir = tmp_path_factory.mktemp("control-plane")
    socket_path = str(workdir / "rpc.sock")
    rpc_port, io_port, disc_port = free_tcp_port(), free_tcp_port(), free_tcp_port()
    proc = TargetProcess(
        None,
        workdir,
        ["--empty", "--rpc-socket", socket_path, "--rpc-listen", f"127.0.0.1:{rpc_port}"],
    )
    proc.start()
    served = Served(proc, socket_path, rpc_port, io_port, disc_port)
    with served.rpc() as rpc:
        rpc.call(
            "nvmf_subsystem_add_listener",
            nqn=DISCOVERY_NQN,
            listen_address=_address(disc_port),
        )
    yield served
    proc.stop()


@pytest.fixture(scope="module")
def guest(served: Served, linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(
        extra_files={
            "/usr/local/bin/dev-for": DEV_FOR,
            "/usr/local/bin/ns-gone": NS_GONE,
            "/usr/local/bin/ctrl-state": CTRL_STATE,
        },
        peer=linux_peer,
    )
    g.start()
    yield g
    g.stop()


def _address(port: int) -> dict[str, str]:
    return {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": str(port)}


def _create(rpc: RpcClient, nqn: str, port: int, bdev: str) -> None:
    rpc.call("nvmf_create_subsystem", nqn=nqn, allow_any_host=True)
    rpc.call("nvmf_subsystem_add_ns", nqn=nqn, namespace={"bdev_name": bdev, "nsid": 1})
    rpc.call("nvmf_subsystem_add_listener", nqn=nqn, listen_address=_address(port))


def _dev(guest: Guest, nqn: str, nsid: int = 1) -> str:
    return guest.run(f"sh /usr/local/bin/dev-for {nqn} {nsid}").output.strip()


def test_namespaces_added_and_removed_over_rpc_come_and_go_on_the_linux_host(
    guest: Guest, served: Served
) -> None:
    with served.rpc() as rpc:
        rpc.call("bdev_malloc_create", name="Cp0", num_blocks=64 * MIB // 512, block_size=512)
        _create(rpc, NQN, served.io_port, "Cp0")
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {served.io_port} -n {NQN} "
        "--reconnect-delay 1 --ctrl-loss-tmo 120"
    )
    first = _dev(guest, NQN)
    with served.rpc() as rpc:
        rpc.call("bdev_malloc_create", name="Cp1", num_blocks=32 * MIB // 4096, block_size=4096)
        nsid = rpc.call(
            "nvmf_subsystem_add_ns", nqn=NQN, namespace={"bdev_name": "Cp1", "uuid": NS2_UUID}
        )
    assert nsid == 2
    # No reconnect: the Namespace Attribute Changed event makes the host rescan.
    second = _dev(guest, NQN, 2)
    name = second.removeprefix("/dev/")
    assert guest.run(f"cat /sys/block/{name}/uuid").output.strip() == NS2_UUID
    assert int(guest.run(f"cat /sys/block/{name}/queue/logical_block_size").output) == 4096
    assert int(guest.run(f"cat /sys/block/{name}/size").output) * 512 == 32 * MIB
    guest.run(
        "dd if=/dev/urandom of=/tmp/p2 bs=4096 count=8 2>/dev/null && "
        f"dd if=/tmp/p2 of={second} bs=4096 oflag=direct 2>/dev/null && "
        f"dd if={second} of=/tmp/b2 bs=4096 count=8 iflag=direct 2>/dev/null && cmp /tmp/p2 /tmp/b2"
    )
    with served.rpc() as rpc:
        assert rpc.call("nvmf_subsystem_remove_ns", nqn=NQN, nsid=2) is True
    guest.run(f"sh /usr/local/bin/ns-gone {NQN} 2")
    assert guest.run(f"test -b {second}", check=False).rc != 0
    # Namespace 1 was not disturbed.
    assert _dev(guest, NQN) == first
    assert guest.run(f"sh /usr/local/bin/ctrl-state {NQN} live 5").output.strip() == "live"


def test_a_removed_subsystem_takes_the_controller_out_of_live_and_it_reconnects_by_itself(
    guest: Guest, served: Served
) -> None:
    dev = _dev(guest, NQN)
    guest.run(
        "dd if=/dev/urandom of=/tmp/p1 bs=4096 count=16 2>/dev/null && "
        f"dd if=/tmp/p1 of={dev} bs=4096 seek=7 oflag=direct 2>/dev/null"
    )
    with served.rpc() as rpc:
        assert rpc.call("nvmf_delete_subsystem", nqn=NQN) is True
    state = guest.run(f"sh /usr/local/bin/ctrl-state {NQN} '!live' 30").output.strip()
    assert state in ("resetting", "connecting"), state
    # While it is gone, the host's attempts fail (nothing listens on the port).
    assert guest.run(f"sh /usr/local/bin/ctrl-state {NQN} live 3", check=False).rc != 0
    with served.rpc() as rpc:
        # The bdev outlived the subsystem; served again with the same identities.
        _create(rpc, NQN, served.io_port, "Cp0")
    assert guest.run(f"sh /usr/local/bin/ctrl-state {NQN} live 60").output.strip() == "live"
    again = _dev(guest, NQN)
    guest.run(
        f"dd if={again} of=/tmp/b1 bs=4096 skip=7 count=16 iflag=direct 2>/dev/null && "
        "cmp /tmp/p1 /tmp/b1"
    )
    with served.rpc() as rpc:
        (ctrl,) = rpc.call("nvmf_subsystem_get_controllers", nqn=NQN)
        qpairs = rpc.call("nvmf_subsystem_get_qpairs", nqn=NQN)
    assert ctrl["cntrltype"] == "io" and len(qpairs) == ctrl["num_io_qpairs"] > 1
    assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {NQN}").output


def test_a_persistent_discovery_controller_hears_of_a_new_subsystem(
    guest: Guest, served: Served
) -> None:
    # The kernel passes the event on as a uevent (NVME_AEN=...): record them.
    guest.run(
        "rm -f /tmp/aen; (busybox uevent sh -c 'echo \"$NVME_AEN\" >> /tmp/aen' >/dev/null 2>&1 &)"
    )
    out = guest.run(
        f"nvme discover -t tcp -a {Guest.host_address} -s {served.disc_port} --persistent"
    ).output
    assert NEW_NQN not in out
    new_port = free_tcp_port()
    with served.rpc() as rpc:
        rpc.call("bdev_malloc_create", name="Cp2", num_blocks=2048, block_size=512)
        _create(rpc, NEW_NQN, new_port, "Cp2")
    # Discovery Log Page Change: Notice (2), F0h, log page 70h.
    guest.run(
        "i=0; while [ $i -lt 100 ]; do grep -q '^0x70f002$' /tmp/aen 2>/dev/null && exit 0; "
        "i=$((i + 1)); sleep 0.1; done; cat /tmp/aen; exit 1"
    )
    out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {served.disc_port}").output
    assert NEW_NQN in out and f"trsvcid: {new_port}" in out
    guest.run(f"nvme disconnect -n {DISCOVERY_NQN}")
    guest.run("pkill -f 'busybox uevent' || killall uevent || true", check=False)


def _control(served: Served, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_blktests_target_control_sets_up_what_the_linux_host_connects_to(
    guest: Guest, served: Served
) -> None:
    port = free_tcp_port()
    hostid = str(uuid.uuid4())
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYNVMF_RPC": f"127.0.0.1:{served.rpc_port}",
        "PYNVMF_TRADDR": Guest.host_address,  # what the guest connects to...
        "PYNVMF_LISTEN": f"127.0.0.1:{port}",  # ...and where the target listens for it
        "PYNVMF_TRSVCID": str(port),
        "PYNVMF_HOSTNQN": f"nqn.2014-08.org.nvmexpress:uuid:{hostid}",
        "PYNVMF_HOSTID": hostid,
    }
    # What _setup_nvmet and _nvmet_target_setup ask, in their order.
    config = {}
    for option in (
        "hostnqn",
        "hostid",
        "traddr",
        "trsvid",
        "subsys-uuid",
        "subsysnqn",
        "trtype",
    ):
        result = _control(served, "config", f"--show-{option}", env=env)
        assert result.returncode == 0 and result.stderr == ""
        config[option] = result.stdout.strip()
    assert config["trtype"] == "tcp" and config["traddr"] == Guest.host_address
    result = _control(
        served,
        "setup",
        "--subsysnqn",
        config["subsysnqn"],
        "--subsys-uuid",
        config["subsys-uuid"],
        "--hostnqn",
        config["hostnqn"],
        env=env,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    # _nvme_connect_subsys with NVME_TARGET_CONTROL set.
    guest.run(
        f"nvme connect --transport {config['trtype']} --traddr {config['traddr']} "
        f"--trsvcid {config['trsvid']} --nqn {config['subsysnqn']} "
        f"--hostnqn={config['hostnqn']} --hostid={config['hostid']}"
    )
    dev = _dev(guest, config["subsysnqn"])
    name = dev.removeprefix("/dev/")
    # _find_nvme_ns: the namespace is found by its UUID.
    assert guest.run(f"cat /sys/block/{name}/uuid").output.strip() == config["subsys-uuid"]
    assert int(guest.run(f"cat /sys/block/{name}/size").output) * 512 >= 1 << 30
    guest.run(  # fresh: zero-filled
        f"dd if={dev} of=/tmp/z1 bs=65536 count=16 iflag=direct 2>/dev/null && "
        "dd if=/dev/zero of=/tmp/z0 bs=65536 count=16 2>/dev/null && cmp /tmp/z0 /tmp/z1"
    )
    assert (
        "disconnected 1 controller" in guest.run(f"nvme disconnect -n {config['subsysnqn']}").output
    )
    result = _control(served, "cleanup", "--subsysnqn", config["subsysnqn"], env=env)
    assert (result.returncode, result.stderr) == (0, "")
    with served.rpc() as rpc:
        nqns = [s["nqn"] for s in rpc.call("nvmf_get_subsystems")]
    assert config["subsysnqn"] not in nqns


VIS_NQN = "nqn.2024-11.dev.pynvmf:control-plane-visibility"
LINUX_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:7e3a1c52-0d4b-4f6e-8a90-1b2c3d4e5f60"
OTHER_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:7e3a1c52-0d4b-4f6e-8a90-1b2c3d4e5f61"


def test_a_hidden_namespace_appears_and_goes_on_the_linux_host_it_is_added_to(
    guest: Guest, served: Served
) -> None:
    port = free_tcp_port()
    with served.rpc() as rpc:
        rpc.call("bdev_malloc_create", name="Vis1", num_blocks=2048, block_size=512)
        rpc.call("bdev_malloc_create", name="Vis2", num_blocks=4096, block_size=512)
        rpc.call("bdev_malloc_create", name="Vis3", num_blocks=2048, block_size=512)
        _create(rpc, VIS_NQN, port, "Vis1")
        rpc.call(
            "nvmf_subsystem_add_ns",
            nqn=VIS_NQN,
            namespace={"bdev_name": "Vis2", "nsid": 2, "no_auto_visible": True},
        )
        rpc.call("nvmf_ns_add_host", nqn=VIS_NQN, nsid=2, host=OTHER_HOSTNQN)
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {VIS_NQN} "
        f"--hostnqn {LINUX_HOSTNQN}"
    )
    first = _dev(guest, VIS_NQN)
    with served.rpc() as rpc:
        # Visible to every host: the event makes the kernel rescan the active list,
        # which would bring namespace 2 too if this host could see it.
        rpc.call("nvmf_subsystem_add_ns", nqn=VIS_NQN, namespace={"bdev_name": "Vis3", "nsid": 3})
    _dev(guest, VIS_NQN, 3)
    guest.run(f"sh /usr/local/bin/ns-gone {VIS_NQN} 2")  # never there
    with served.rpc() as rpc:
        rpc.call("nvmf_ns_add_host", nqn=VIS_NQN, nsid=2, host=LINUX_HOSTNQN)
    second = _dev(guest, VIS_NQN, 2)  # no reconnect: the event alone
    name = second.removeprefix("/dev/")
    assert int(guest.run(f"cat /sys/block/{name}/size").output) == 4096
    guest.run(
        "dd if=/dev/urandom of=/tmp/v2 bs=4096 count=4 2>/dev/null && "
        f"dd if=/tmp/v2 of={second} bs=4096 oflag=direct 2>/dev/null && "
        f"dd if={second} of=/tmp/w2 bs=4096 count=4 iflag=direct 2>/dev/null && cmp /tmp/v2 /tmp/w2"
    )
    with served.rpc() as rpc:
        assert rpc.call("nvmf_ns_remove_host", nqn=VIS_NQN, nsid=2, host=LINUX_HOSTNQN) is True
        (sub,) = rpc.call("nvmf_get_subsystems", nqn=VIS_NQN)
    guest.run(f"sh /usr/local/bin/ns-gone {VIS_NQN} 2")
    assert _dev(guest, VIS_NQN) == first
    assert guest.run(f"sh /usr/local/bin/ctrl-state {VIS_NQN} live 5").output.strip() == "live"
    (ns2,) = [ns for ns in sub["namespaces"] if ns["nsid"] == 2]
    assert ns2["no_auto_visible"] is True and ns2["hosts"] == [{"nqn": OTHER_HOSTNQN}]
    assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {VIS_NQN}").output


GROW_NQN = "nqn.2024-11.dev.pynvmf:control-plane-grow"


def test_a_grown_file_namespace_takes_its_size_on_the_linux_host(
    guest: Guest, served: Served, tmp_path: Path
) -> None:
    image = tmp_path / "grow.img"
    image.write_bytes(b"")
    os.truncate(image, 16 * MIB)
    port = free_tcp_port()
    with served.rpc() as rpc:
        rpc.call("bdev_aio_create", name="Grow0", filename=str(image), block_size=512)
        _create(rpc, GROW_NQN, port, "Grow0")
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {GROW_NQN}")
    dev = _dev(guest, GROW_NQN)
    assert int(guest.run(f"blockdev --getsize64 {dev}").output) == 16 * MIB
    os.truncate(image, 48 * MIB)  # grown outside, then rescanned: SPDK's way
    with served.rpc() as rpc:
        assert rpc.call("bdev_aio_rescan", name="Grow0") is True
    # No reconnect: the Namespace Attribute Changed event makes the host revalidate.
    assert wait_size(guest, dev, 48 * MIB) == 48 * MIB
    # The blocks past the old end are there: written and read back by the host.
    guest.run(
        "dd if=/dev/urandom of=/tmp/g1 bs=4096 count=4 2>/dev/null && "
        f"dd if=/tmp/g1 of={dev} bs=4096 seek={40 * MIB // 4096} oflag=direct 2>/dev/null && "
        f"dd if={dev} of=/tmp/g2 bs=4096 skip={40 * MIB // 4096} count=4 iflag=direct "
        "2>/dev/null && cmp /tmp/g1 /tmp/g2"
    )
    with served.rpc() as rpc:
        assert rpc.call("pynvmf_bdev_resize", name="Grow0", size_bytes=64 * MIB) == 64 * MIB // 512
    assert wait_size(guest, dev, 64 * MIB) == 64 * MIB
    # Cut, forced: the host's block device follows, without a reconnect, the blocks
    # below the new end kept.
    guest.run(f"dd if=/tmp/g1 of={dev} bs=4096 seek={28 * MIB // 4096} oflag=direct 2>/dev/null")
    with served.rpc() as rpc, pytest.raises(RpcClientError, match=r"^force: "):
        rpc.call("pynvmf_bdev_resize", name="Grow0", size_bytes=32 * MIB)
    with served.rpc() as rpc:
        assert rpc.call("pynvmf_bdev_resize", name="Grow0", size_bytes=32 * MIB, force=True) == (
            32 * MIB // 512
        )
    assert wait_size(guest, dev, 32 * MIB) == 32 * MIB
    assert image.stat().st_size == 32 * MIB
    guest.run(
        f"dd if={dev} of=/tmp/g3 bs=4096 skip={28 * MIB // 4096} count=4 iflag=direct "
        "2>/dev/null && cmp /tmp/g1 /tmp/g3"
    )
    # Cut outside (another process truncates the file), then rescanned: followed, the
    # host's block device too, the blocks below the new end kept.
    guest.run(f"dd if=/tmp/g1 of={dev} bs=4096 seek={20 * MIB // 4096} oflag=direct 2>/dev/null")
    os.truncate(image, 24 * MIB)
    with served.rpc() as rpc:
        assert rpc.call("bdev_aio_rescan", name="Grow0") is True
    assert wait_size(guest, dev, 24 * MIB) == 24 * MIB
    guest.run(
        f"dd if={dev} of=/tmp/g4 bs=4096 skip={20 * MIB // 4096} count=4 iflag=direct "
        "2>/dev/null && cmp /tmp/g1 /tmp/g4"
    )
    assert image.stat().st_size == 24 * MIB
    assert guest.run(f"sh /usr/local/bin/ctrl-state {GROW_NQN} live 5").output.strip() == "live"
    assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {GROW_NQN}").output


GROW_MEM_NQN = "nqn.2024-11.dev.pynvmf:control-plane-grow-memory"


def test_a_grown_memory_namespace_keeps_its_data_and_takes_its_size_on_the_linux_host(
    guest: Guest, served: Served
) -> None:
    port = free_tcp_port()
    with served.rpc() as rpc:
        rpc.call("bdev_malloc_create", name="GrowMem0", num_blocks=16 * MIB // 512, block_size=512)
        _create(rpc, GROW_MEM_NQN, port, "GrowMem0")
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {GROW_MEM_NQN}")
    dev = _dev(guest, GROW_MEM_NQN)
    assert int(guest.run(f"blockdev --getsize64 {dev}").output) == 16 * MIB
    last = 16 * MIB // 4096 - 4
    guest.run(
        "dd if=/dev/urandom of=/tmp/m1 bs=4096 count=4 2>/dev/null && "
        f"dd if=/tmp/m1 of={dev} bs=4096 seek={last} oflag=direct 2>/dev/null"
    )
    with served.rpc() as rpc:
        assert rpc.call("pynvmf_bdev_resize", name="GrowMem0", size_bytes=48 * MIB) == (
            48 * MIB // 512
        )
    # No reconnect: the Namespace Attribute Changed event makes the host revalidate.
    assert wait_size(guest, dev, 48 * MIB) == 48 * MIB
    guest.run(  # the blocks before the old end kept, those past it usable
        f"dd if={dev} of=/tmp/m2 bs=4096 skip={last} count=4 iflag=direct 2>/dev/null && "
        "cmp /tmp/m1 /tmp/m2 && "
        f"dd if=/tmp/m1 of={dev} bs=4096 seek={40 * MIB // 4096} oflag=direct 2>/dev/null && "
        f"dd if={dev} of=/tmp/m3 bs=4096 skip={40 * MIB // 4096} count=4 iflag=direct "
        "2>/dev/null && cmp /tmp/m1 /tmp/m3"
    )
    # Smaller drops data: refused unless forced, the host's size kept.
    with served.rpc() as rpc, pytest.raises(RpcClientError, match=r"^force: "):
        rpc.call("pynvmf_bdev_resize", name="GrowMem0", size_bytes=24 * MIB)
    assert int(guest.run(f"blockdev --getsize64 {dev}").output) == 48 * MIB
    # Forced: the host's block device follows without a reconnect, the blocks below the
    # new end kept.
    with served.rpc() as rpc:
        assert rpc.call("pynvmf_bdev_resize", name="GrowMem0", size_bytes=24 * MIB, force=True) == (
            24 * MIB // 512
        )
    assert wait_size(guest, dev, 24 * MIB) == 24 * MIB
    guest.run(
        f"dd if={dev} of=/tmp/m4 bs=4096 skip={last} count=4 iflag=direct 2>/dev/null && "
        "cmp /tmp/m1 /tmp/m4"
    )
    assert guest.run(f"sh /usr/local/bin/ctrl-state {GROW_MEM_NQN} live 5").output.strip() == "live"
    assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {GROW_MEM_NQN}").output
