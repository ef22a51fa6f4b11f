"""The `pynvmf` command: one subcommand family per module of this package.

target (target.py), the nvme-cli style host commands (host.py), copy (copy.py),
bench (bench.py) and rpc (rpc.py); what they share lives in common.py.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pynvmf.cli.bench import add_bench_command, run_bench_command
from pynvmf.cli.copy import add_copy_command, run_copy_command
from pynvmf.cli.host import add_host_commands, run_host_command
from pynvmf.cli.rpc import add_rpc_command, run_rpc_command
from pynvmf.cli.target import add_target_command, run_target_command
from pynvmf.malloc import tune_for_io_buffers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pynvmf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_target_command(sub)
    add_host_commands(sub)
    add_copy_command(sub)
    add_bench_command(sub)
    add_rpc_command(sub)
    args = parser.parse_args(argv)
    tune_for_io_buffers()
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "target":
        return run_target_command(args)
    if args.command == "copy":
        return run_copy_command(args)
    if args.command == "bench":
        return run_bench_command(args)
    if args.command == "rpc":
        return run_rpc_command(args)
    return run_host_command(args)


if __name__ == "__main__":
    sys.exit(main())
