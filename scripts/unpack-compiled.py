"""Put the compiled modules of a built wheel next to their sources (`make compiled`).

The wheel is the one `pip wheel .` builds for a user (setup.py compiles the hot modules
into it), so the compiled pass of `make test` runs that wheel's extensions. The script
refuses a wheel that is not what a compiled build must be: a platform-specific tag and an
extension for every module pynvmf.compiled.HOT_MODULES names, plus mypyc's shared
library; a build that fell back to pure Python is reported, not unpacked.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from pynvmf.compiled import HOT_MODULES

REPO = Path(__file__).resolve().parents[1]


def extensions_of(wheel: zipfile.ZipFile) -> dict[str, str]:
    """The wheel's extension modules: dotted module name -> member name."""
    found = {}
    for member in wheel.namelist():
        if member.startswith("pynvmf/") and member.endswith(".so"):
            module = member.removesuffix(".so").split(".", 1)[0].replace("/", ".")
            found[module] = member
    return found


def main(path: str) -> int:
    if path.endswith("-none-any.whl"):
        print(f"{path}: a pure-Python wheel, not the compiled build", file=sys.stderr)
        return 1
    with zipfile.ZipFile(path) as wheel:
        found = extensions_of(wheel)
        missing = sorted(set(HOT_MODULES) - set(found))
        if missing or "pynvmf._compiled__mypyc" not in found:
            print(
                f"{path}: no extension for {', '.join(missing) or 'pynvmf._compiled__mypyc'}",
                file=sys.stderr,
            )
            return 1
        for member in found.values():
            wheel.extract(member, REPO)
    print(f"compiled: {len(HOT_MODULES)} hot modules from {Path(path).name}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: unpack-compiled.py WHEEL")
    sys.exit(main(sys.argv[1]))
