"""Write docs/cli.md from the command line's parsers (pynvmf.cli.docs); with --check,
only say whether it is up to date (exit status 1 if not)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pynvmf.cli.docs import render

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: python scripts/cli-docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
