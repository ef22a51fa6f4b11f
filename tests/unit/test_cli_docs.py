"""docs/cli.md is what the parsers say (pynvmf.cli.docs): regenerate it with
`python scripts/cli-docs.py` when a command's options change."""

from __future__ import annotations

from pathlib import Path

from pynvmf.cli.docs import render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_up_to_date() -> None:
    assert PAGE.read_text() == render(), "docs/cli.md is out of date: python scripts/cli-docs.py"
