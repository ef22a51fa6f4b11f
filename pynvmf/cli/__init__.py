"""The `pynvmf` command: one subcommand family per module of this package.

target (target.py), the nvme-cli style host commands (host.py), copy (copy.py),
bench (bench.py), rpc (rpc.py), top (top.py, its figures in top_view.py) and controllers
(controllers.py), replay (replay.py); what they
share lives in common.py (the options), parser.py (the parser's rules), identity.py (the
host identity) and failures.py (a failed connection in words). docs/cli.md is generated
from build_parser() (scripts/cli-docs.py).
"""

from __future__ import annotations

import argparse
import logging
import sys

from pynvmf.cli.bench import add_bench_command, run_bench_command
from pynvmf.cli.controllers import add_controllers_command, run_controllers_command
from pynvmf.cli.copy import add_copy_command, run_copy_command
from pynvmf.cli.host import add_host_commands, run_host_command
from pynvmf.cli.parser import Parser
from pynvmf.cli.replay import add_replay_command, run_replay_command
from pynvmf.cli.rpc import add_rpc_command, run_rpc_command
from pynvmf.cli.target import add_target_command, run_target_command
from pynvmf.cli.top import add_top_command, run_top_command
from pynvmf.logs import configure
from pynvmf.malloc import tune_for_io_buffers


def build_parser() -> Parser:
    """The parser of the whole command line."""
    parser = Parser(
        prog="pynvmf",
        description="An NVMe/TCP target, and host commands with nvme-cli's options (docs/cli.md).",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="the version, and which build runs"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_target_command(sub)
    add_host_commands(sub)
    add_copy_command(sub)
    add_bench_command(sub)
    add_rpc_command(sub)
    add_top_command(sub)
    add_controllers_command(sub)
    add_replay_command(sub)
    return parser


class _Version(argparse.Action):
    """--version: computed when asked, since which build runs means importing the hot
    modules (argparse's own version action takes a string made for every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from pynvmf import __version__
        from pynvmf.compiled import build_description

        print(f"pynvmf {__version__}: {build_description()}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the command `args` holds (build_parser's result); the exit status."""
    tune_for_io_buffers()
    # --log-format is the target's option; the other commands log text.
    configure(logging.WARNING - 10 * min(args.verbose, 2), getattr(args, "log_format", "text"))
    if args.command == "target":
        return run_target_command(args)
    if args.command == "copy":
        return run_copy_command(args)
    if args.command == "bench":
        return run_bench_command(args)
    if args.command == "rpc":
        return run_rpc_command(args)
    if args.command == "top":
        return run_top_command(args)
    if args.command == "controllers":
        return run_controllers_command(args)
    if args.command == "replay":
        return run_replay_command(args)
    return run_host_command(args)


if __name__ == "__main__":
    sys.exit(main())
