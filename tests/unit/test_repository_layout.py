"""The source stays visible to contributors whose global ignore file skips folders named
like build output (Cargo's and Maven's `target/`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_global_target_ignore_does_not_hide_the_target_package(tmp_path: Path) -> None:
    global_ignore = tmp_path / "ignore"
    global_ignore.write_text("target/\n")
    done = subprocess.run(
        [
            "git",
            "-c",
            f"core.excludesFile={global_ignore}",
            "check-ignore",
            "-v",
            "pynvmf/target/new_module.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # 1: not ignored (0 would be ignored, 128 an error).
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
