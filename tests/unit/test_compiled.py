"""The compiled build (setup.py: `pip install .`, `make compiled`, cibuildwheel): the module
list the test guard and the benchmarks consult (pynvmf.compiled) names the modules setup.py
compiles, a build without a C compiler falls back to pure Python and says so, and the
command line says which build runs."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pynvmf import __version__
from pynvmf.cli import main
from pynvmf.compiled import HOT_MODULES, compiled_modules

REPO = Path(__file__).resolve().parents[2]


def _setup_list() -> list[str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED list")


def test_setup_compiles_the_hot_modules() -> None:
    paths = _setup_list()
    assert [p.removesuffix(".py").replace("/", ".") for p in paths] == list(HOT_MODULES)
    for path in paths:
        assert (REPO / path).is_file(), path


def test_the_hot_modules_are_all_compiled_or_none() -> None:
    # A partial build (one module left out of the group) would test neither path.
    assert compiled_modules() in ([], list(HOT_MODULES))


def test_the_version_says_which_build_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pynvmf {__version__}: "), out
    if compiled_modules():
        assert f"compiled (mypyc, {len(HOT_MODULES)} hot modules)" in out, out
    else:
        assert "pure Python" in out, out


def test_a_build_without_a_c_compiler_installs_pure_python(tmp_path: Path) -> None:
    # What `pip install .` does where mypyc is there but no C compiler works: the same
    # build_ext, with a compiler that fails.
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path)
    shutil.copytree(
        REPO / "pynvmf", tmp_path / "pynvmf", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYNVMF_PURE", "PYNVMF_MYPYC")}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tmp_path,
        env={**env, "CC": "false"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "the compiled build failed" in done.stderr, done.stderr
    assert "installing pure Python" in done.stderr
    assert not list((tmp_path / "pynvmf").rglob("*.so"))


def test_cibuildwheel_builds_a_compiled_wheel_for_every_supported_cpython() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", "linux"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert "cp311-manylinux_x86_64" in out, out
    assert not [i for i in out if "musllinux" in i or i.startswith("pp")], out
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    # A wheel whose compile failed must fail, not ship as pure Python under a platform tag.
    assert config["environment"]["PYNVMF_MYPYC"] == "1"
