"""Build hook for the opt-in compiled build (`make compiled`): with PYNVMF_MYPYC=1, mypyc
compiles the target's per-command modules from the same Python source into C extensions
that Python imports instead of the .py files (docs/performance.md, "Compiled hot
modules"). Without it (the default, and `pip install -e .`) nothing is compiled and the
package is pure Python; pyproject.toml holds everything else."""

from __future__ import annotations

import os

from setuptools import setup

# The modules a command passes through (profile: benchmarks/instructions.py), compiled as
# one group. host.py is compiled with them because its HostConnection derives from the
# compiled PduConnection (an interpreted class cannot derive from a compiled one). The
# host library's queue and namespace are compiled for the host's per-command cost (18%
# fewer instructions per Read, docs/performance.md "The host library compiled"); their classes derive
# from interpreted ones, so mypyc makes them ordinary Python classes with compiled
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
    "pynvmf/tcp/host.py",
    "pynvmf/target/queue.py",
    "pynvmf/target/io.py",
    "pynvmf/block/inplace.py",
    "pynvmf/block/copy_now.py",
    "pynvmf/tcp/glue.py",
    "pynvmf/host/queue.py",
    "pynvmf/host/namespace.py",
    "pynvmf/target/command_counts.py",
]
# mypy's checks stop at the compiled modules (the rest of the package is not type-clean
# under mypy, and need not be: it stays interpreted); crc32c-rs has no type stubs.
MYPY_OPTIONS = ["--follow-imports=silent", "--ignore-missing-imports"]

ext_modules = []
if os.environ.get("PYNVMF_MYPYC") == "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(
        MYPY_OPTIONS + COMPILED,
        opt_level="3",
        group_name="pynvmf._compiled",
        target_dir="build/mypyc",
    )
setup(ext_modules=ext_modules)
