"""Which of the modules the compiled build (`make compiled`, setup.py) compiles are in use
as compiled extensions: Python prefers an extension module next to a .py file of the same
name, so a tree that has been built runs the compiled code until `make clean-compiled`."""

from __future__ import annotations

import importlib
import importlib.machinery
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

try:
    from mypy_extensions import mypyc_attr, trait
except ImportError:  # mypy brings it (the compiled extra); a pure install need not have it

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[T], T]:
        """What mypyc reads of a compiled class (tcp/glue.py); nothing at run time."""
        return lambda cls: cls

    def trait(cls: T) -> T:
        """A mypyc trait (target/transport.py): a plain class at run time."""
        return cls


# The modules setup.py compiles (a test checks that the two lists agree).
HOT_MODULES = (
    "pynvmf.tcp.framing",
    "pynvmf.tcp.target",
    "pynvmf.target.transport",
    "pynvmf.tcp.host",
    "pynvmf.target.queue",
    "pynvmf.target.io",
    "pynvmf.block.inplace",
    "pynvmf.block.copy_now",
    "pynvmf.tcp.glue",
    "pynvmf.host.queue",
    "pynvmf.host.namespace",
    "pynvmf.target.command_counts",
    "pynvmf.rdma.queue",
)


def compiled_modules() -> list[str]:
    """The HOT_MODULES loaded from an extension module rather than from their source."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [
        name
        for name in HOT_MODULES
        if (importlib.import_module(name).__file__ or "").endswith(suffixes)
    ]


def stale_modules() -> list[str]:
    """The compiled HOT_MODULES whose source changed after they were built, in a source
    tree: they run the old code until `make compiled` runs again."""
    if not (Path(__file__).resolve().parents[1] / "setup.py").is_file():
        # An installed wheel: its files' times are when pip unpacked them, in no order.
        return []
    stale = []
    for name in compiled_modules():
        built = Path(importlib.import_module(name).__file__ or "")
        source = built.with_name(built.name.split(".", 1)[0] + ".py")
        if source.is_file() and source.stat().st_mtime > built.stat().st_mtime:
            stale.append(name)
    return stale


def build_description() -> str:
    """Which build runs, in words: what `pynvmf --version` and the target's first line say."""
    compiled = compiled_modules()
    if not compiled:
        return "pure Python (no compiled modules: `pip install .` or `make compiled` builds them)"
    if len(compiled) < len(HOT_MODULES):
        missing = sorted(set(HOT_MODULES) - set(compiled))
        return f"partly compiled: {', '.join(missing)} pure Python (a build left incomplete)"
    stale = stale_modules()
    if stale:
        return f"compiled (mypyc), but {', '.join(stale)} changed since: `make compiled`"
    return f"compiled (mypyc, {len(compiled)} hot modules)"
