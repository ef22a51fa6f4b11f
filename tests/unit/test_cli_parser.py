"""The rules every `pynvmf` command is parsed by (pynvmf.cli.parser, pynvmf.cli.common):
one meaning per letter, help on every option, no prefixes, no option twice, and the
command lines the documentation shows parse as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pynvmf.cli import build_parser
from pynvmf.cli.docs import letter_table
from pynvmf.cli.rpc_args import method_parsers

REPO = Path(__file__).resolve().parents[2]


def test_a_letter_means_one_thing_in_every_command() -> None:
    table = letter_table(build_parser())
    twice = {letter: longs for letter, (longs, _, _) in table.items() if len(longs) > 1}
    assert not twice
    # nvme-cli's letters for nvme-cli's meanings.
    expected = {
        "-t": "--transport",
        "-a": "--traddr",
        "-s": "--trsvcid",
        "-q": "--hostnqn",
        "-I": "--hostid",
        "-n": "--namespace-id",
        "-g": "--hdr-digest",
        "-G": "--data-digest",
        "-S": "--dhchap-secret",
        "-C": "--dhchap-ctrl-secret",
        "-o": "--output-format",
        "-H": "--human-readable",
        "-c": "--block-count",
        "-z": "--data-size",
        "-d": "--data",
        "-f": "--force-unit-access",
        "-v": "--verbose",
    }
    assert {letter: next(iter(longs)) for letter, (longs, _, _) in table.items()} == expected


def test_every_option_of_every_command_has_help() -> None:
    parsers = {f"pynvmf {n}": p for n, p in build_parser().subcommands().items()}
    parsers.update({f"pynvmf rpc {n}": p for n, p in method_parsers().items()})
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in parsers.items()
        for action in parser.options()
        if not action.help
    ]
    assert not missing


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["target", "--mem", "16M"], "unrecognized arguments: --mem 16M"),
        (["target", "--listen", "127.0.0.1:1", "--nqn", "a", "--nqn", "b"], "given twice"),
        (["list", "-a", "x", "--nqn", "nqn.a:b", "-g", "-g"], "given twice (-g, then -g)"),
        (["bench", "-a", "x", "--nqn", "nqn.a:b", "--bs", "4k", "--bs", "8k"], "given twice"),
        (["list", "-a", "x", "--nqn", "nqn.a:b", "-q", "a b"], "'a b' is not a valid NQN"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: pynvmf {argv[0]} ")  # the subcommand's own usage
    assert message in err


def test_repeatable_options_repeat() -> None:
    args = build_parser().parse_args(["target", "--memory", "1M", "--memory", "2MB", "-vv"])
    assert args.memory == [1 << 20, 2 << 20] and args.verbose == 2


def _documented_commands() -> list[str]:
    """`pynvmf ...` lines of the README's and docs' code blocks, continuation lines joined."""
    commands = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if page.name == "cli.md":
            continue  # generated from the parsers
        in_code = False
        pending = ""
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                continue
            line = pending + line.split("  #")[0].strip().removesuffix("&").strip()
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            if line == "pynvmf target ready":  # the banner, not a command
                continue
            if line.startswith("pynvmf ") and not re.search(r"[A-Z]{3,}|\[|\.\.\.|<|\|", line):
                commands.append(line)
    return commands


@pytest.mark.parametrize("line", _documented_commands())
def test_documented_command_lines_parse(line: str) -> None:
    argv = shlex.split(line.replace("$", "X"))[1:]
    if argv[0] == "rpc":
        return  # what follows the method is the method's (checked by tests of rpc)
    build_parser().parse_args(argv)
