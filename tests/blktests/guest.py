"""The guest blktests runs in: a kernel peer's root filesystem with what blktests needs.

blktests (``./check``) wants bash, GNU awk, util-linux, fio, udevadm, getconf, nvme-cli,
xfsprogs (nvme/012's mkfs), uuidgen, keyutils and tlshd (nvme/062-063), and Python 3 for
the control scripts in contrib/blktests. The interoperability peers' images have most of
it; this variant adds the rest, cached apart from them (guest_debootstrap.prepare_assets'
``variant``), so the peers used by ``make test`` keep their size and build time.
"""

from __future__ import annotations

import dataclasses
import functools

from tests.support import guest_debootstrap
from tests.support.guest import LINUX_6_12, LINUX_7, Peer

VARIANT = "blktests"

# Added to the peers' packages (guest_debootstrap.PACKAGES) for blktests' nvme group.
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


def _variant(peer: Peer, suite: guest_debootstrap.Suite) -> Peer:
    prepare = functools.partial(
        guest_debootstrap.prepare_assets, suite, variant=VARIANT, extra_packages=PACKAGES
    )
    return dataclasses.replace(peer, prepare=prepare)


# The kernel peers blktests can run on, by name, oldest first.
PEERS: dict[str, Peer] = {
    LINUX_6_12.name: _variant(LINUX_6_12, guest_debootstrap.TRIXIE),
    LINUX_7.name: _variant(LINUX_7, guest_debootstrap.SID),
}
