"""`make blktests` (tests/blktests/run.py) without a guest: what it writes into the guest
(blktests' config, the systemctl stand-in), how it reads blktests' results and the table
it writes. The run itself takes hours under TCG and is not part of `make test`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.blktests import rdma
from tests.blktests import run as R
from tests.blktests.guest import PACKAGES, PEERS

REPO = Path(__file__).resolve().parents[2]


def _systemctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "systemctl"
    script.write_text(R.SYSTEMCTL)
    script.chmod(0o755)
    return subprocess.run(["sh", str(script), *args], capture_output=True, text=True, check=False)


def test_systemctl_stand_in_answers_what_blktests_asks(tmp_path: Path) -> None:
    # _have_systemd_tlshd_service greps list-unit-files; _systemctl_start starts a unit
    # only when is-active says it is not running.
    assert "tlshd" in _systemctl(tmp_path, "list-unit-files").stdout
    assert _systemctl(tmp_path, "is-active", "--quiet", "tlshd-not-running-here").returncode == 1
    own = _systemctl(tmp_path, "is-active", "--quiet", os.path.basename(sys.executable))
    assert own.returncode == 0  # a process of that name runs: this test's Python
    assert _systemctl(tmp_path, "start", "something-else").returncode == 0
    assert _systemctl(tmp_path, "reload", "tlshd").returncode == 1


def test_config_per_target() -> None:
    settings = {"NVME_IMG_SIZE": "1G", "TIMEOUT": "30"}
    nvmet = R._config("nvmet", settings, {})
    assert "NVMET_TRTYPES=tcp" in nvmet and "NVME_TARGET_CONTROL" not in nvmet
    ctl = R._config("nvmet-control", settings, {"NVME_IMG_SIZE": "1G"})
    assert f"NVME_TARGET_CONTROL={R.GUEST_CONTROL}/nvmet-target-control" in ctl
    assert "export NVME_IMG_SIZE=1G" in ctl
    pyn = R._config("pynvmf", settings, {"PYNVMF_RPC": "10.0.2.2:5260"})
    assert f"NVME_TARGET_CONTROL={R.GUEST_CONTROL}/nvme-target-control" in pyn
    assert "export PYNVMF_RPC=10.0.2.2:5260" in pyn


def test_tcp_is_the_default_and_its_settings_do_not_change() -> None:
    assert R.trtype_settings("tcp") == {}
    pyn = R.target_exports("pynvmf", "tcp", "1G", "10.0.2.2:5260", 4433)
    assert pyn == {
        "PYNVMF_RPC": "10.0.2.2:5260",
        "PYNVMF_TRSVCID": "4433",
        "PYNVMF_LISTEN": "127.0.0.1:4433",
        "NVME_IMG_SIZE": "1G",
    }
    assert R.target_exports("nvmet-control", "tcp", "1G") == {"NVME_IMG_SIZE": "1G"}
    assert R.target_exports("nvmet", "tcp", "1G") == {}


def test_over_rdma_every_target_is_in_the_guest_on_soft_roce() -> None:
    settings = {"NVME_IMG_SIZE": "1G", **R.trtype_settings("rdma")}
    # blktests' own nvmet: rdma, with rdma_rxe (the soft-RoCE the other columns use).
    nvmet = R._config("nvmet", settings, R.target_exports("nvmet", "rdma", "1G"))
    assert "NVMET_TRTYPES=rdma" in nvmet and "NVMET_TRTYPES=tcp" not in nvmet
    assert "USE_RXE=1" in nvmet and "export" not in nvmet
    # nvmet through its control script: an rdma port on the guest's soft-RoCE address.
    ctl = R.target_exports("nvmet-control", "rdma", "1G")
    assert ctl["NVMET_TRTYPE"] == "rdma" and ctl["NVMET_TRADDR"] == rdma.ADDRESS
    # pynvmf in the guest: its RPC on the guest's loopback, its listener on soft-RoCE.
    pyn = R.target_exports("pynvmf", "rdma", "1G", "10.0.2.2:5260", 4433)
    assert pyn["PYNVMF_TRTYPE"] == "rdma" and pyn["PYNVMF_RPC"] == rdma.RPC
    assert pyn["PYNVMF_RPC"].startswith("127.0.0.1:") and pyn["PYNVMF_TRADDR"] == rdma.ADDRESS
    assert "PYNVMF_LISTEN" not in pyn
    text = R._config("pynvmf", settings, pyn)
    assert "export PYNVMF_TRTYPE=rdma" in text and "NVMET_TRTYPES=rdma" in text


def test_each_transport_has_its_notes() -> None:
    # The "why" column of docs/blktests.md's tables, one file per transport, each JSON
    # mapping test names to text.
    assert set(R.NOTES_BY_TRTYPE) == set(R.TRTYPES)
    for path in R.NOTES_BY_TRTYPE.values():
        notes = json.loads(path.read_text())
        assert all(k.startswith("nvme/") and isinstance(v, str) for k, v in notes.items())


def test_the_trtype_option_takes_tcp_or_rdma_only(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        R.main(["--blktests-dir", str(tmp_path), "--trtype", "fc"])
    assert exc.value.code == 2


def test_results_are_read_from_blktests_records_and_output() -> None:
    passed = R.parse_results(
        "nvme/041", {"record": "runtime\t12.0s\nstatus\tpass\nexit_status\t0\n"}, ""
    )
    assert (passed.status, passed.runtime) == ("pass", "12.0s")
    failed = R.parse_results(
        "nvme/062",
        {"record": "status\tfail\nreason\toutput\n", "diff": "+FAIL: nvme connect\n"},
        "",
    )
    assert (failed.status, failed.reason, failed.detail) == (
        "fail",
        "output",
        "+FAIL: nvme connect\n",
    )
    console = (
        "nvme/063 (tr=tcp) (concat) [not run]\n"
        "    runtime  12.3s  ...  \n"
        "    nvme-fabrics does not support concat\n"
        "    tlshd version is older than 1.0.0\n"
    )
    skipped = R.parse_results("nvme/063", {"record": "status\tnot run\n"}, console)
    assert skipped.status == "not run"
    assert (
        skipped.reason == "nvme-fabrics does not support concat; tlshd version is older than 1.0.0"
    )
    assert R.parse_results("nvme/001", {"record": ""}, "").status == "unknown"
    # A test_device() test with no TEST_DEVS leaves no record: not run, and why.
    device = R.parse_results("nvme/032", {"record": ""}, "", device_test=True)
    assert (device.status, device.reason) == (
        "not run",
        "needs a test device (TEST_DEVS: none here)",
    )


def test_table_has_a_row_per_test_and_says_why() -> None:
    a = R.Run("nvmet", {"nvme/003": R.Result("nvme/003", "pass")})
    a.results["nvme/002"] = R.Result("nvme/002", "not run", "nvme_trtype=tcp is not supported")
    b = R.Run("pynvmf", {"nvme/003": R.Result("nvme/003", "fail", "output")})
    b.results["nvme/002"] = R.Result("nvme/002", "not run", "nvme_trtype=tcp is not supported")
    text = R.table([a, b], {"nvme/003": "a | reason"})
    lines = text.splitlines()
    assert lines[0] == "| test | nvmet | pynvmf | why |"
    assert (
        lines[2] == "| nvme/002 | not run | not run | not run: nvme_trtype=tcp is not supported |"
    )
    assert lines[3] == "| nvme/003 | pass | FAIL (output) | a \\| reason |"


def test_the_harness_refuses_to_run_without_blktests(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BLKTESTS_DIR"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.blktests.run", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "BLKTESTS_DIR" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "tests.blktests.run", "--blktests-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "not a blktests checkout" in done.stderr


def test_guest_variant_has_what_blktests_check_requires() -> None:
    # check's required commands (gawk, udevadm, column), uuidgen, and Python for the
    # control scripts; fio, nvme-cli, keyutils and tlshd are in every peer's image.
    for package in ("gawk", "udev", "bsdextrautils", "uuid-runtime", "python3"):
        assert package in PACKAGES
    assert PEERS


def test_patch_touches_only_blktests_target_paths() -> None:
    text = R.PATCH.read_text()
    files = [line.split()[-1] for line in text.splitlines() if line.startswith("+++ ")]
    assert files == ["b/common/nvme", "b/tests/nvme/062", "b/tests/nvme/rc"]


@pytest.mark.skipif(
    not os.environ.get("BLKTESTS_DIR"),
    reason="BLKTESTS_DIR names no blktests checkout (blktests is in no package archive)",
)
def test_patch_applies_to_the_checkout(tmp_path: Path) -> None:
    tree = R.prepare_tree(Path(os.environ["BLKTESTS_DIR"]), tmp_path, patch=True)
    assert (tree / "src" / "nvme-delay-ioctl").exists()
    assert "set-host" in (tree / "tests" / "nvme" / "rc").read_text()
    for script in ("common/nvme", "tests/nvme/rc", "tests/nvme/062"):
        subprocess.run(["bash", "-n", str(tree / script)], check=True)
