"""docs/cli.md, written from the parsers themselves so that it cannot drift from them:
the option letters, where the host identity comes from, and every command's --help.

`python scripts/cli-docs.py` writes it; tests/unit/test_cli_docs.py fails when it is out
of date.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterator

from pynvmf.cli import build_parser
from pynvmf.cli.identity import CONFIG_DIR_ENV, HOSTID_ENV, HOSTNQN_ENV
from pynvmf.cli.parser import Parser
from pynvmf.cli.rpc_args import method_parsers

WIDTH = 100

_INTRO = f"""\
# The `pynvmf` command line

This page is generated from the command's parsers by `python scripts/cli-docs.py`
(`tests/unit/test_cli_docs.py` fails when it is out of date): what it says is what the
commands do.

The host commands (`discover`, `list`, `id-ctrl`, `id-ns`, `read`, `write`), `copy` and
`bench` take nvme-cli's options for nvme-cli's meanings; `bench` takes fio's workload
options; `rpc` calls SPDK's JSON-RPC methods, with rpc.py's own arguments for the common
ones. Every command refuses an option given twice and an abbreviated option name, and
reports a usage error with its own usage (exit status 2; a failure is exit status 1,
Ctrl-C 130).

## Option letters

A letter means one thing in every pynvmf command: the table lists each with its long
name and the commands that take it (generated from the parsers, which a test holds to
one meaning per letter). nvme-cli itself gives some letters two meanings, one in the
fabrics commands and one in the I/O commands; pynvmf's host commands are both at once,
so it keeps one:

- `-n` is the namespace ID, as in `nvme id-ns`, `nvme read` and `nvme write`. The
  subsystem NQN, `nvme connect -n`, is `--nqn`. A command given an NQN after `-n`, or
  `-n` where it takes no namespace, says so.
- `-s` is the TCP port, as in `nvme connect`. `nvme read -s` (the first block) is
  `--start-block`; a read or write whose port is refused says so.
- `-t` is the transport, as in `nvme connect` and `nvme discover`: `tcp` (the default)
  or `rdma` (NVMe/RDMA through rdma-core's pyverbs, [rdma.md](rdma.md); without it the
  command says so in one line, and TLS or digests with `rdma` are refused before anything
  is sent). With `rdma`, `-s` defaults to 4420 for `discover` too, as nvme-cli's: an rdma
  port answers the discovery NQN on the I/O controllers' port. pynvmf has no `connect`
  or `connect-all` (it attaches no kernel device): `discover` lists what a log holds,
  and the host library's `connect_entry` follows an entry over the transport it names.
- `-c` is `--block-count`, 0's based as nvme-cli's (`-c 0` is one block); `-z` is
  `--data-size` in bytes. `copy`'s count is `--count` (blocks or a size, 1's based).
- `-q` is the host NQN everywhere (`copy --quiet` has no letter).
- `rpc` spells out `--server` and `--timeout` (rpc.py's `-s` and `-t`). The arguments
  after an rpc METHOD are rpc.py's for that method, with rpc.py's letters: they belong to
  the method, not to pynvmf.

## Host identity

The host NQN and Host Identifier the commands present are, first found of:

1. `-q/--hostnqn` and `-I/--hostid`;
2. `${HOSTNQN_ENV}` and `${HOSTID_ENV}`, as libnvme reads them (set and empty: none);
3. `/etc/nvme/hostnqn` and `/etc/nvme/hostid` (their first line), as nvme-cli, libnvme
   and `nvme connect` read them; `${CONFIG_DIR_ENV}` names another directory (the test
   suite points it at its own, so that no test depends on the machine's);
4. for the Host Identifier, the UUID of a UUID host NQN (`nqn.2014-08.org.nvmexpress:uuid:...`),
   as nvme-cli derives it;
5. otherwise an identity pynvmf makes once and stores in `$XDG_STATE_HOME/pynvmf/hostnqn`
   (and `hostid` where the NQN holds no UUID), `~/.local/state/pynvmf/` by default,
   reporting it on stderr the time it is made. `nvme gen-hostnqn > /etc/nvme/hostnqn`
   gives the machine one identity that nvme-cli and pynvmf share.

A subsystem restricted to the machine's host NQN (`--allow-host "$(cat /etc/nvme/hostnqn)"`)
thus admits `pynvmf` as it admits `nvme connect`, and a reservation holder keeps its
identity from one command to the next.
"""


def _help(parser: argparse.ArgumentParser) -> str:
    # A fixed width: the page must not depend on the terminal it was made in.
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)
    return parser.format_help().rstrip()


def _short_options(parser: Parser) -> Iterator[tuple[str, str, str, str]]:
    """(letter, long name, help, command) of every one-letter option of every command."""
    for name, sub in parser.subcommands().items():
        for action in sub.options():
            if "-h" in action.option_strings:
                continue
            letters = [o for o in action.option_strings if len(o) == 2 and o[1] != "-"]
            names = [o for o in action.option_strings if o.startswith("--")]
            for letter in letters:
                yield letter, names[0] if names else letter, action.help or "", name


def letter_table(parser: Parser) -> dict[str, tuple[set[str], str, list[str]]]:
    """letter -> (the long names it stands for, its help, the commands that take it)."""
    table: dict[str, tuple[set[str], str, list[str]]] = {}
    for letter, long, text, command in _short_options(parser):
        longs, _, commands = table.setdefault(letter, (set(), text, []))
        longs.add(long)
        commands.append(command)
    return table


def render() -> str:
    parser = build_parser()
    lines = [_INTRO]
    lines.append("| Letter | Option | Meaning | Commands |")
    lines.append("|---|---|---|---|")
    for letter, (longs, text, commands) in sorted(
        letter_table(parser).items(), key=lambda item: (item[0].lower(), item[0])
    ):
        meaning = text.split(" (")[0].split(";")[0]
        lines.append(
            f"| `{letter}` | `{', '.join(sorted(longs))}` | {meaning} | {', '.join(commands)} |"
        )
    lines.append("")
    lines.append("## Commands")
    lines.append("")
    lines.append("```text")
    lines.append(_help(parser))
    lines.append("```")
    for name, sub in parser.subcommands().items():
        lines.append("")
        lines.append(f"### pynvmf {name}")
        lines.append("")
        lines.append("```text")
        lines.append(_help(sub))
        lines.append("```")
    lines.append("")
    lines.append("## rpc.py's arguments of the common methods")
    lines.append("")
    lines.append(
        "`pynvmf rpc METHOD` takes these as SPDK's rpc.py does; every method also takes "
        "`KEY=TEXT`, `KEY:=JSON` or one `{JSON}` object."
    )
    for name, method in method_parsers().items():
        lines.append("")
        lines.append(f"### pynvmf rpc {name}")
        lines.append("")
        lines.append("```text")
        lines.append(_help(method))
        lines.append("```")
    return "\n".join(lines) + "\n"
