"""The guest blktests runs in: a kernel peer's root filesystem with what blktests needs.

blktests (``./check``) wants bash, GNU awk, util-linux, fio, udevadm, getconf, nvme-cli,
xfsprogs (nvme/012's mkfs), uuidgen, keyutils and tlshd (nvme/062-063), and Python 3 for
the control scripts in contrib/blktests. The interoperability peers' images have most of
it; this variant adds the rest, cached apart from them (guest_trixie.prepare_assets'
``variant``), so the peers used by ``make test`` keep their size and build time.
"""

from __future__ import annotations

import dataclasses

from tests.interop import guest_trixie
from tests.interop.guest import LINUX_6_12, Peer

VARIANT = "blktests"

# Added to the peer's packages (guest_trixie.PACKAGES) for blktests' nvme group.
PACKAGES: tuple[str, ...] = (
    "bash",
    "gawk",
    "coreutils",
    "bsdextrautils",  # column (check's output)
    "util-linux",
    "udev",  # udevadm (check requires it); pulls systemd, whose systemctl stays unused
    "uuid-runtime",  # uuidgen
    "procps",
    "python3",  # contrib/blktests' control scripts
    "kmod",
    "xfsprogs",
    "e2fsprogs",
    "keyutils",
    "ktls-utils",
)


def _prepare_trixie() -> guest_trixie.GuestAssets:
    return guest_trixie.prepare_assets(variant=VARIANT, extra_packages=PACKAGES)


# The kernel peers blktests can run on, by name.
PEERS: dict[str, Peer] = {
    LINUX_6_12.name: dataclasses.replace(LINUX_6_12, prepare=_prepare_trixie),
}
