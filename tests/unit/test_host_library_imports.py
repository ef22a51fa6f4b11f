"""The host library runs where only Debian's Python is (the interop tests run it inside
the Linux guests, with Debian's python3-cryptography alone): importing it must not need
the target's own dependencies."""

from __future__ import annotations

import subprocess
import sys

# Not in the guests' Debian Python; the target needs them, the host library must not.
TARGET_ONLY = ("posix_ipc", "uvloop", "crc32c")


def test_host_library_imports_without_the_targets_dependencies() -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in TARGET_ONLY)
    code = f"import sys; {blocked}; from pynvmf.host import connect; print(connect.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "connect"


def test_target_runs_without_prometheus_client_until_it_serves_metrics() -> None:
    # The guests run `pynvmf target` from the tree on Debian's Python too (with --cores 1,
    # as posix_ipc is missing there); only --metrics-listen needs prometheus-client.
    code = (
        "import sys; sys.modules['prometheus_client'] = None; sys.modules['posix_ipc'] = None\n"
        "import pynvmf.cli.target, pynvmf.rpc.pynvmf_methods\n"
        "from pynvmf.metrics.endpoint import MetricsEndpoint\n"
        "from pynvmf.target.target import Target\n"
        "print(MetricsEndpoint(Target()).address)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_the_command_line_imports_without_rich() -> None:
    # `pynvmf top`'s live view needs rich; the guests' Debian Python has none, and every
    # other command (and top's plain tables) must still run there.
    code = (
        "import sys; sys.modules['rich'] = None\n"
        "from pynvmf.cli import build_parser\n"
        "print(build_parser().parse_args(['top', '--once']).command)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "top"
