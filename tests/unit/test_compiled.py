"""The compiled build (setup.py, `make compiled`) and the module list the test guard and the
benchmarks consult (pynvmf.compiled) name the same modules."""

from __future__ import annotations

import ast
from pathlib import Path

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
