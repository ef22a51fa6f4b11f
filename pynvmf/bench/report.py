"""Describing where and how a benchmark ran, and writing its tables as Markdown.

Benchmark results mean little without the command, the machine and the software
they came from, so every report starts with `environment_lines()`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from pynvmf.tcp import digest


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def uvloop_version() -> str | None:
    try:
        import uvloop
    except ImportError:
        return None
    return str(uvloop.__version__)


def command_line() -> str:
    """This process's command line, as one could paste it into a shell (naming the
    interpreter when it is a virtual environment's, which decides the packages)."""
    python = sys.executable if sys.prefix != sys.base_prefix else "python3"
    return shlex.join([python, *sys.argv])


def machine_line() -> str:
    return (
        f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )


def software_line() -> str:
    uv = uvloop_version()
    return f"uvloop {uv or 'not installed'}, CRC32C: {digest.IMPLEMENTATION}"


def load_line() -> str:
    """The load average: other work on the machine is the usual source of noise."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


def environment_lines() -> list[str]:
    """Command, machine, software, date and load at the start, one per line."""
    return [
        f"command: `{command_line()}`",
        f"machine: {machine_line()}",
        f"software: {software_line()}",
        f"date: {date.today().isoformat()}, load average at start {load_line()}",
    ]


def size_label(size: int) -> str:
    """512 B, 4 KiB, 1 MiB: block and buffer sizes as tables show them."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table; the first column left-aligned, the others right-aligned."""
    align = ["---", *("---:" for _ in headers[1:])]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table for a terminal: columns padded, the first left-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join(
            [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
        )

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


_BEGIN = "<!-- results: begin (written by {name}; text outside these markers is kept) -->"
_END = "<!-- results: end -->"


def write_results(path: Path, title: str, generator: str, body: str) -> None:
    """Put `body` between the results markers of `path`, keeping any text around them
    (the discussion written by hand); a new file gets a title and the markers."""
    begin = _BEGIN.format(name=generator)
    block = f"{begin}\n{body.rstrip()}\n{_END}"
    if path.exists():
        text = path.read_text()
        pattern = re.compile(r"<!-- results: begin[^>]*-->.*?<!-- results: end -->", re.S)
        if pattern.search(text):
            path.write_text(pattern.sub(lambda _: block, text, count=1))
            return
        path.write_text(text.rstrip() + "\n\n" + block + "\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {title}\n\n{block}\n")
