"""Build hook: mypyc compiles the target's per-command modules from the same Python source
into C extensions that Python imports instead of the .py files (docs/performance.md,
"Compiled hot modules"), as mypy and black ship their wheels. `pip install .` and
`pip wheel .` build them by default (mypy comes with the build requirements); where they
cannot be built (no C compiler) the install goes on as pure Python and says so, and
PYNVMF_PURE=1 asks for pure Python. PYNVMF_MYPYC=1 (what `make compiled` sets) makes a
failed compile an error instead. `make setup`'s editable install is pure: the test suite
chooses its path (tests/conftest.py). pyproject.toml holds everything else."""

from __future__ import annotations

import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

# The modules a command passes through (profile: benchmarks/instructions.py), compiled as
# one group. host.py is compiled with them because its HostConnection derives from the
# compiled PduConnection (an interpreted class cannot derive from a compiled one). The
# host library's queue and namespace are compiled for the host's per-command cost (18%
# fewer instructions per Read, docs/performance.md "The host library compiled"); their
# classes derive from interpreted ones, so mypyc makes them ordinary Python classes with compiled
# methods, which compiled callers call directly (a method patched on the class is not
# seen: hence host/queue.py's watch_commands). tcp/glue.py, the asyncio glue HostQueue
# derives from, is compiled with it, so that the host's per-command calls into it
# (_flush, buffer_updated) are compiled calls; its ConnectionGlue allows interpreted
# subclasses (mypyc_attr), for the target's TargetProtocol, which stays interpreted.
# target/command_counts.py is compiled with io.py so that the hot path's per-host counts
# (NamespaceCounts) are native int fields: an add each, no allocation (docs/metrics.md).
# block/copy.py (the planner) stays
# interpreted: compiled, a failed background write of an emulated chunk was not raised
# (tests/unit/test_block_copy.py), and its single-range path gains little more.
COMPILED = [
    "pynvmf/tcp/framing.py",
    "pynvmf/tcp/target.py",
    "pynvmf/target/transport.py",
    "pynvmf/tcp/host.py",
    "pynvmf/target/queue.py",
    "pynvmf/target/io.py",
    "pynvmf/block/inplace.py",
    "pynvmf/block/copy_now.py",
    "pynvmf/tcp/glue.py",
    "pynvmf/host/queue.py",
    "pynvmf/host/namespace.py",
    "pynvmf/target/command_counts.py",
    "pynvmf/rdma/queue.py",
]
# mypy's checks stop at the compiled modules (the rest of the package is not type-clean
# under mypy, and need not be: it stays interpreted); crc32c-rs has no type stubs.
MYPY_OPTIONS = ["--follow-imports=silent", "--ignore-missing-imports"]


def _say(message: str) -> None:
    # pip shows a build's output only with -v: `pynvmf --version` and the target's start
    # line say which build runs.
    print(f"pynvmf: {message}", file=sys.stderr)


class BuildHotModules(build_ext):
    """All the hot modules or none: mypyc's modules are shims over one shared library, and
    a shim whose library failed to build would break the import of the pure module."""

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except (CCompilerError, CompileError, ExecError, PlatformError) as exc:
            if STRICT:
                raise
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []
            # The compiler's whole command line is in `exc`: its status is the reason.
            reason = re.sub(r"\[.*\]", "[...]", str(exc), flags=re.DOTALL)
            _say(f"the compiled build failed ({reason}): installing pure Python")


def hot_extensions() -> list[Extension]:
    """The compiled modules' extensions, or none (pure Python) with the reason said."""
    if os.environ.get("PYNVMF_PURE") == "1" and not STRICT:
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if STRICT:
            raise
        _say("mypy (mypyc) is not installed: installing pure Python (slower)")
        return []
    extensions: list[Extension] = mypycify(
        MYPY_OPTIONS + COMPILED,
        opt_level="3",
        group_name="pynvmf._compiled",
        target_dir="build/mypyc",
    )
    return extensions


STRICT = os.environ.get("PYNVMF_MYPYC") == "1"
setup(ext_modules=hot_extensions(), cmdclass={"build_ext": BuildHotModules})
