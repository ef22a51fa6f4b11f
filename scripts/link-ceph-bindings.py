"""Expose Debian's Ceph bindings (python3-rados, python3-rbd) to the project's venv.

The `rados` and `rbd` modules exist only as C extensions that Debian builds for
/usr/bin/python3 (there are no wheels on PyPI). The venv's interpreter is a
different build of the same Python minor version (pyenv's), so its site-packages
does not see Debian's dist-packages, and pointing it at all of dist-packages would
drag in every other Debian module. Instead: a directory holding symlinks to exactly
the two extension modules, and a .pth file in the venv naming that directory.

Run by `make setup` with the venv's interpreter; does nothing (and says so) when the
Debian packages are not installed or were built for another Python version, which
leaves pynvmf's optional RBD backend unavailable.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
MODULES = ("rados", "rbd")
PTH_NAME = "pynvmf-ceph-bindings.pth"


def main() -> int:
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        print("link-ceph-bindings: not running in a venv; nothing done", file=sys.stderr)
        return 1
    suffix = sysconfig.get_config_var("EXT_SUFFIX")  # e.g. .cpython-311-x86_64-linux-gnu.so
    found = {m: DIST_PACKAGES / f"{m}{suffix}" for m in MODULES}
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    missing = [str(p) for p in found.values() if not p.exists()]
    if missing:
        # Not an error: the backend is optional. A stale .pth is removed.
        pth.unlink(missing_ok=True)
        print(f"link-ceph-bindings: {', '.join(missing)} not found; no RBD backend")
        return 0
    links = venv / "ceph-bindings"
    links.mkdir(exist_ok=True)
    for so in found.values():
        link = links / so.name
        if link.is_symlink() or link.exists():
            if link.resolve() == so.resolve():
                continue
            link.unlink()
        link.symlink_to(so)
    pth.write_text(f"{links}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
