"""Fixtures shared by every test directory."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from pynvmf.cli.identity import CONFIG_DIR_ENV, HOSTID_ENV, HOSTNQN_ENV
from pynvmf.compiled import HOT_MODULES, compiled_modules, stale_modules
from tests.support.ceph_cluster import CephCluster, have_ceph

_images = itertools.count()

# The host identity the pynvmf commands present in tests (pynvmf.cli.identity).
TEST_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:5e57c11a-0000-4000-8000-00000000c11a"


def pytest_configure(config: pytest.Config) -> None:
    """A run tests the path it says it tests: the pure-Python one unless PYNVMF_COMPILED=1
    (`make test` runs tests/unit and tests/protocol again that way after `make compiled`),
    and then every hot module compiled. A tree left built would otherwise make every
    later run test the compiled code while it claims to test the source."""
    compiled = compiled_modules()
    if os.environ.get("PYNVMF_COMPILED") == "1":
        missing = sorted(set(HOT_MODULES) - set(compiled))
        if missing:
            raise pytest.UsageError(
                f"PYNVMF_COMPILED=1 but {', '.join(missing)} not compiled: `make compiled`"
            )
        stale = stale_modules()
        if stale:
            raise pytest.UsageError(
                f"{', '.join(stale)} changed since they were compiled: `make compiled`"
            )
    elif compiled:
        raise pytest.UsageError(
            f"{', '.join(compiled)} compiled in this tree (a `make compiled` build): "
            "`make clean-compiled` to test the pure-Python path, or PYNVMF_COMPILED=1 to "
            "test the compiled one"
        )


# What runs alone (`serial`): `make test` runs the rest first on every CPU (pytest-xdist's
# `-n`), then these in one process. A guest under TCG takes every CPU it is given and its
# tests wait on it with deadlines; the modules below assert rates or the order of what
# concurrent processes log, which another test's load beside them would change.
SERIAL_DIRS: tuple[str, ...] = ("tests/interop/", "tests/ceph/", "tests/blktests/")
SERIAL_MODULES: dict[str, str] = {
    "tests/unit/test_qos.py": "two processes sharing a limit reach its rate",
    "tests/protocol/test_qos.py": "hosts under a limit reach its rate within 5%",
    "tests/protocol/test_log_methods.py": "what the workers log before a level changes",
    "tests/protocol/test_bench_cli.py": "a job's mean rate against its overall rate",
    "tests/unit/test_bench_loadgen.py": "rates sampled from a device timed by the clock",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.partition("::")[0]
        if module.startswith(SERIAL_DIRS) or module in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


# Seconds each test module took (setup, call and teardown of its tests, module fixtures
# included), for the summary: `make test` has a 40-minute budget on 2 cores, and the
# modules are what a cut removes or moves.
_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.partition("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _module_seconds:
        return
    total = sum(_module_seconds.values())
    terminalreporter.write_sep("=", f"slowest modules (of {total / 60:.1f} minutes in tests)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda e: -e[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {module}")


def pytest_report_header(config: pytest.Config) -> str:
    return f"pynvmf hot modules: {'compiled (mypyc)' if compiled_modules() else 'pure Python'}"


@pytest.fixture(autouse=True, scope="session")
def _host_identity_of_the_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The commands' host identity in tests is neither this machine's /etc/nvme nor the
    user's stored one: PYNVMF_NVME_CONFIG_DIR names an empty directory, and the state
    directory holds TEST_HOSTNQN, as if a first command had stored it. Subprocesses
    inherit both. A test of the identity itself sets its own."""
    root = tmp_path_factory.mktemp("host-identity")
    (root / "nvme").mkdir()
    (root / "state" / "pynvmf").mkdir(parents=True)
    (root / "state" / "pynvmf" / "hostnqn").write_text(TEST_HOSTNQN + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CONFIG_DIR_ENV, str(root / "nvme"))
        mp.setenv("XDG_STATE_HOME", str(root / "state"))
        mp.delenv(HOSTNQN_ENV, raising=False)
        mp.delenv(HOSTID_ENV, raising=False)
        yield


@pytest.fixture(scope="session")
def ceph_cluster() -> Iterator[CephCluster]:
    """One throwaway Ceph cluster (a monitor, a memstore OSD; tests/support/ceph_cluster.py) for
    the whole session, started by the first test that needs it. The packages are a
    prerequisite that scripts/install-system-deps.sh installs, so a missing one fails
    the test rather than skipping it."""
    if not have_ceph():
        pytest.fail(
            "Ceph is not installed: run scripts/install-system-deps.sh (ceph-mon, ceph-osd, "
            "ceph-common, python3-rados, python3-rbd), then `make setup`"
        )
    with CephCluster() as cluster:
        yield cluster


@pytest.fixture
def rbd_image(ceph_cluster: CephCluster) -> Iterator[Callable[[int], str]]:
    """make(size) -> the name of a new image in the cluster's pool, removed after the test
    (if its test left it closed)."""
    made: list[str] = []

    def make(size: int = 64 << 20) -> str:
        name = f"img{next(_images)}"
        ceph_cluster.create_image(name, size)
        made.append(name)
        return name

    yield make
    for name in made:
        # One still open (a fenced client's watch) stays: memstore forgets it at the end.
        with contextlib.suppress(Exception):
            ceph_cluster.remove_image(name)
