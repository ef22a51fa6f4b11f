"""pynvmf itself in a guest, run by the guest's Debian Python: for the tests that need the
guest kernel's features on pynvmf's side of a connection (kTLS, soft-RoCE).

The tree's ``pynvmf`` package and the suite's builds of the Python packages pynvmf needs
that the image lacks (``Peer.python_bundle``: guest_debootstrap.python_bundle) are
unpacked under :data:`GUEST_DIR`; run it with ``PYTHONPATH=/opt/pynvmf python3 -m pynvmf``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tests.support.guest import Guest

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = "/opt/pynvmf"


def tree_tarball(root: Path = REPO, package: str = "pynvmf") -> bytes:
    """``root/package`` as a tar.gz (no ``__pycache__``), rooted at ``package``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(
            root / package,
            arcname=package,
            filter=lambda info: None if "__pycache__" in info.name else info,
        )
    return out.getvalue()


def install(guest: Guest, check_import: str = "pynvmf") -> None:
    """Unpack pynvmf and the peer's Python bundle under GUEST_DIR in ``guest``, then import
    ``check_import`` there with the guest's Python (a missing package fails here)."""
    bundle = guest.peer.python_bundle
    if bundle is None:
        raise AssertionError(f"{guest.peer.name} has no Python bundle for pynvmf")
    guest.write_file("/tmp/pynvmf.tgz", tree_tarball())
    guest.write_file("/tmp/python.tgz", bundle().read_bytes())
    guest.run(
        f"mkdir -p {GUEST_DIR} && tar -C {GUEST_DIR} -xzf /tmp/pynvmf.tgz"
        f" && tar -C {GUEST_DIR} -xzf /tmp/python.tgz"
        f" && PYTHONPATH={GUEST_DIR} python3 -c 'import {check_import}'"
    )
