"""`make blktests ARGS="--trtype rdma"`: where each target is over NVMe/RDMA, and pynvmf's
target in the guest.

Soft-RoCE exists only in the guest (the machines' kernel has no ``rdma_rxe``:
docs/rdma.md), so over RDMA every target runs there, on the guest's one network device:

- ``nvmet``: blktests itself adds soft-RoCE (``USE_RXE``: rdma_rxe rather than siw, the
  module the other two columns use) on each test's setup and removes it, with
  ``rdma_rxe``, on its cleanup; it connects to the device's address.
- ``nvmet-control``: the same nvmet, an rdma port on the soft-RoCE device the harness
  adds (blktests starts none when NVME_TARGET_CONTROL is set).
- ``pynvmf``: ``pynvmf target --empty`` run by the guest's Debian Python with
  python3-pyverbs (the tree copied in: tests/support/guest_pynvmf.py), its RPC on the
  guest's 127.0.0.1; the control script makes its RDMA transport and listener.
"""

from __future__ import annotations

from tests.support import guest_pynvmf
from tests.support.guest import Guest, GuestError

# The guest's network device and its address (guest_assets' init), where soft-RoCE is.
NETDEV = "eth0"
ADDRESS = "10.0.2.15"
# The guest pynvmf target's RPC, in the guest.
RPC = "127.0.0.1:5260"
TRSVCID = "4420"
# blktests' settings over RDMA, for every target.
SETTINGS = {"NVMET_TRTYPES": "rdma", "USE_RXE": "1"}
TARGET_OUT = "/tmp/pynvmf-target.out"
TARGET_LOG = "/tmp/pynvmf-target.err"


def exports(target: str, img_size: str) -> dict[str, str]:
    """What a target's control script is told over RDMA (nvmet's own column: nothing)."""
    if target == "nvmet-control":
        return {
            "NVMET_TRTYPE": "rdma",
            "NVMET_TRADDR": ADDRESS,
            "NVMET_TRSVCID": TRSVCID,
            "NVME_IMG_SIZE": img_size,
        }
    if target == "pynvmf":
        return {
            "PYNVMF_TRTYPE": "rdma",
            "PYNVMF_RPC": RPC,
            "PYNVMF_TRADDR": ADDRESS,
            "PYNVMF_TRSVCID": TRSVCID,
            "NVME_IMG_SIZE": img_size,
        }
    return {}


def prepare(guest: Guest) -> None:
    """The host's and nvmet's RDMA modules (blktests requires both loaded or loadable)."""
    guest.run("modprobe nvme-rdma && modprobe nvmet-rdma && modprobe rdma_ucm", timeout=120)


def ensure_soft_roce(guest: Guest) -> None:
    """A soft-RoCE link on NETDEV, ACTIVE, unless one is there (blktests' nvmet column
    removes its own after each test, with rdma_rxe)."""
    guest.run(
        f"""set -e
modprobe rdma_rxe
rdma link show | grep -q 'netdev {NETDEV}\\b' || rdma link add rxe0 type rxe netdev {NETDEV}
i=0
until rdma link show | grep 'netdev {NETDEV}\\b' | grep -q 'state ACTIVE'; do
    [ "$i" -lt 100 ] || {{ rdma link show; exit 1; }}
    sleep 0.1; i=$((i + 1))
done""",
        timeout=60,
    )


def start_target(guest: Guest, target_args: list[str]) -> None:
    """pynvmf's target in the guest, RPC on RPC; returns once it says it is ready."""
    guest_pynvmf.install(guest, check_import="pyverbs.cmid")
    # One process: the guest's Python lacks what --cores' workers need.
    args = " ".join(["--empty", "--rpc-listen", RPC, "--cores", "1", *target_args])
    out = guest.run(
        f"cd /tmp && (PYTHONPATH={guest_pynvmf.GUEST_DIR} python3 -m pynvmf target {args}"
        f" > {TARGET_OUT} 2> {TARGET_LOG} & echo $! > /tmp/pynvmf-target.pid)\n"
        f"for i in $(seq 600); do grep -q ready {TARGET_OUT} && exit 0; sleep 0.2; done;"
        f" cat {TARGET_LOG}; exit 1",
        timeout=180,
        check=False,
    )
    if out.rc != 0:
        raise GuestError(f"pynvmf's target did not start in the guest:\n{out.output}")


def stop_target(guest: Guest) -> str:
    """Stop the guest's pynvmf target; its log."""
    guest.run(
        "pid=$(cat /tmp/pynvmf-target.pid) && kill $pid && for i in $(seq 100); do"
        " kill -0 $pid 2>/dev/null || break; sleep 0.1; done",
        check=False,
    )
    return guest.run(f"cat {TARGET_LOG}", check=False).output
