"""The `pynvmf` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from pynvmf.bench_cli import add_bench_command, run_bench_command
from pynvmf.copy_cli import add_copy_command, run_copy_command
from pynvmf.host_cli import add_host_commands, run_host_command
from pynvmf.malloc import tune_for_io_buffers
from pynvmf.target.config import (
    DEFAULT_NQN,
    ConfigError,
    build_target,
    config_from_options,
    load_config,
)
from pynvmf.target.server import DISCOVERY_PORT, Target


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _target_parser(sub: Any) -> None:
    p = sub.add_parser("target", help="run an NVMe/TCP target")
    p.add_argument("--config", help="JSON configuration file (see README)")
    p.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="listen address, repeatable; IPv6 in brackets (default 127.0.0.1:4420)",
    )
    p.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="SIZE",
        help="add an in-memory namespace of SIZE (e.g. 1G), repeatable",
    )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="add a namespace backed by a file or block device, repeatable",
    )
    p.add_argument("--block-size", type=int, default=512, choices=(512, 4096))
    p.add_argument("--nqn", default=DEFAULT_NQN, help=f"subsystem NQN (default {DEFAULT_NQN})")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOSTNQN",
        help="allow only these host NQNs (repeatable; default: any host)",
    )
    p.add_argument("--inline-data-size", type=int, default=16384, metavar="BYTES")
    p.add_argument(
        "--discovery-port",
        type=int,
        default=DISCOVERY_PORT,
        help=f"discovery-only port on each listen address (default {DISCOVERY_PORT}, 0: none)",
    )
    p.add_argument("-v", "--verbose", action="count", default=0)


def _print_banner(target: Target) -> None:
    print("pynvmf target ready", flush=True)
    io_ports = [p for p in target.ports if not p.discovery_only]
    for port in target.ports:
        kind = "discovery" if port.discovery_only else "nvme"
        print(f"listening {kind} {port}", flush=True)
    for port in target.ports:
        if port.discovery_only:
            print(f"  nvme discover -t tcp -a {port.address} -s {port.port}")
    for port in io_ports:
        for nqn in target.subsystems:
            if port.exposes(nqn):
                print(f"  nvme connect -t tcp -a {port.address} -s {port.port} -n {nqn}")
    sys.stdout.flush()


async def _run_target(config: dict[str, Any]) -> int:
    target = build_target(config)
    await target.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _print_banner(target)
    await stop.wait()
    logging.getLogger("pynvmf").info("shutting down")
    await target.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pynvmf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _target_parser(sub)
    add_host_commands(sub)
    add_copy_command(sub)
    add_bench_command(sub)
    args = parser.parse_args(argv)
    tune_for_io_buffers()
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "copy":
        return run_copy_command(args)
    if args.command == "bench":
        return run_bench_command(args)
    if args.command != "target":
        return run_host_command(args)
    if args.command == "target":
        try:
            if args.config:
                config = load_config(args.config)
            else:
                config = config_from_options(
                    listen=args.listen,
                    memory=args.memory,
                    files=args.file,
                    nqn=args.nqn,
                    allow_hosts=args.allow_host,
                    block_size=args.block_size,
                    inline_data_size=args.inline_data_size,
                    discovery_port=args.discovery_port,
                )
            _install_uvloop()
            return asyncio.run(_run_target(config))
        except (ConfigError, OSError, ValueError) as exc:
            print(f"pynvmf target: {exc}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
