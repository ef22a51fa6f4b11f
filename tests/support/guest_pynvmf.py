"""pynvmf's own tree in a guest, for the tests that run it there with the guest's Debian
Python (the RDMA ones: the machines' kernel has no soft-RoCE, so pynvmf's end of an
NVMe/RDMA connection runs inside the guest)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tests.support.guest import Guest

REPO = Path(__file__).resolve().parents[2]
# Where the tree goes in the guest: run with PYTHONPATH=GUEST_ROOT.
GUEST_ROOT = "/opt/pynvmf"


def pynvmf_bundle() -> bytes:
    """pynvmf's source as a tar.gz."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(
            REPO / "pynvmf",
            arcname="pynvmf",
            filter=lambda info: None if "__pycache__" in info.name else info,
        )
    return out.getvalue()


def install_pynvmf(guest: Guest) -> None:
    """pynvmf, and the Python packages its peer bundles for the guest's Python (the
    peer's ``python_bundle``), under GUEST_ROOT."""
    guest.write_file("/tmp/pynvmf.tgz", pynvmf_bundle())
    install = f"mkdir -p {GUEST_ROOT} && tar -C {GUEST_ROOT} -xzf /tmp/pynvmf.tgz"
    bundle = guest.peer.python_bundle
    if bundle is not None:
        guest.write_file("/tmp/python.tgz", bundle().read_bytes())
        install += f" && tar -C {GUEST_ROOT} -xzf /tmp/python.tgz"
    guest.run(install)
