"""NVMe/RDMA in the debootstrap peers' guests: soft-RoCE on the guest's network device.

The machines' own kernel has no ``rdma_rxe``; Debian's 6.12 and 7.x kernels have it
(soft-RoCE), with ``ib_core``, ``rdma_cm``, ``ib_uverbs``, ``nvme-rdma`` and ``nvmet-rdma``,
all in the module tree every debootstrap peer carries (guest_debootstrap._furnish_rootfs
copies it whole). The user space (rdma-core's udev rules and ``rdma_rxe`` provider,
``librxe`` in ibverbs-providers, ibverbs-utils and python3-pyverbs, which pynvmf's RDMA
transport uses on the guest's Debian Python) is in guest_debootstrap.PACKAGES: every
trixie and sid image has it, so an RDMA module boots ``linux_peer`` itself. The ``rdma``
tool that creates a soft-RoCE link is iproute2's.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from tests.support import guest_debootstrap
from tests.support.guest import (
    LINUX_6_12,
    LINUX_7,
    Guest,
    GuestError,
    Peer,
    PeerSet,
    require_guest_prerequisites,
)

# What the images carry for NVMe/RDMA (the peer's description names some).
PACKAGES = guest_debootstrap.RDMA_PACKAGES

# The RDMA modules' peers (a module's ``pytestmark``): linux-7, and linux-6.12 (the same
# modules and packages) under PYNVMF_GUEST_EVERY_PEER=1. linux-6.1's initramfs has no
# rdma-core.
RDMA_PEERS = PeerSet((LINUX_7,), others=(LINUX_6_12,))

# The guest's one network device (guest_assets' init brings it up as 10.0.2.15).
NETDEV = "eth0"
# The kernel modules soft-RoCE and NVMe/RDMA need on both sides.
MODULES: tuple[str, ...] = (
    "ib_core",
    "rdma_cm",
    "ib_uverbs",
    "rdma_rxe",
    "nvme-rdma",
    "nvmet-rdma",
)


def add_soft_roce(guest: Guest, name: str = "rxe0", netdev: str = NETDEV) -> str:
    """Load rdma_rxe and add a soft-RoCE device ``name`` on ``netdev``; wait until its port
    is ACTIVE. Returns ``rdma link show``'s line for it."""
    script = f"""set -e
modprobe rdma_rxe
modprobe ib_uverbs
modprobe rdma_ucm
rdma link add {name} type rxe netdev {netdev}
i=0
until rdma link show {name}/1 | grep -q 'state ACTIVE'; do
    [ "$i" -lt 100 ] || {{ rdma link show; exit 1; }}
    sleep 0.1; i=$((i + 1))
done
rdma link show {name}/1
"""
    out = guest.run(script, timeout=60).output
    line = next((ln for ln in out.splitlines() if re.search(rf"\b{name}/1\b", ln)), None)
    if line is None:
        raise GuestError(f"no soft-RoCE link {name} after rdma link add:\n{out}")
    return line


@contextlib.contextmanager
def rdma_guest(peer: Peer, soft_roce: str | None = "rxe0") -> Iterator[Guest]:
    """A module's guest on ``peer`` (its ``linux_peer``), with the soft-RoCE device
    ``soft_roce`` added (None: none yet)."""
    require_guest_prerequisites(peer)
    with Guest(peer=peer) as guest:
        if soft_roce is not None:
            add_soft_roce(guest, soft_roce)
        yield guest
