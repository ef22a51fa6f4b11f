"""The guest NVMe/RDMA runs in: a kernel peer's root filesystem with rdma-core.

The machines' own kernel has no ``rdma_rxe``; Debian's 7.x kernel has it (soft-RoCE), with
``ib_core``, ``rdma_cm``, ``ib_uverbs``, ``nvme-rdma`` and ``nvmet-rdma``, all in the module
tree every debootstrap peer carries (guest_debootstrap._furnish_rootfs copies it whole).
What the plain peer lacks is user space: rdma-core's udev rules and ``rdma_rxe`` provider
(``librxe`` in ibverbs-providers), and the Python bindings (python3-pyverbs, which pynvmf's
RDMA transport uses on the guest's Debian Python). The ``rdma`` tool that creates a soft-RoCE
link is iproute2's, already in the plain peer.

This variant adds those packages, cached apart from the plain image (guest_debootstrap's
``variant``), so the peers the other interoperability tests boot keep their image, size and
build time.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from tests.support import guest_debootstrap
from tests.support.guest import LINUX_7, Guest, GuestError, Peer, PeerSet

VARIANT = "rdma"

# Added to the peers' packages (guest_debootstrap.PACKAGES) for NVMe/RDMA over soft-RoCE.
PACKAGES: tuple[str, ...] = (
    "rdma-core",  # udev rules, rdma-ndd, the rdma_rxe module options
    "ibverbs-providers",  # librxe: user-space verbs on a soft-RoCE device
    "ibverbs-utils",  # ibv_devices, ibv_devinfo: what the device offers
    "python3-pyverbs",  # rdma-core's Python bindings (pyverbs), for pynvmf in the guest
)


def _variant(peer: Peer, suite: guest_debootstrap.Suite) -> Peer:
    prepare = functools.partial(
        guest_debootstrap.prepare_assets, suite, variant=VARIANT, extra_packages=PACKAGES
    )
    return dataclasses.replace(peer, prepare=prepare)


# The kernel peers NVMe/RDMA runs on, by name (the 6.12 kernel has the same modules; its
# variant is a line here when a test needs it).
PEERS: dict[str, Peer] = {
    LINUX_7.name: _variant(LINUX_7, guest_debootstrap.SID),
}
# For a test module's ``linux_peer`` (PYNVMF_GUEST_PEERS selects among them by name); the
# module's guest boots ``variant(linux_peer)``.
RDMA_PEERS = PeerSet((LINUX_7,))

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


def variant(peer: Peer) -> Peer:
    """The RDMA variant of a kernel peer ``linux_peer`` names."""
    return PEERS[peer.name]


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
