"""`pynvmf target`: run an NVMe/TCP target."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

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


def add_target_command(sub: Any) -> None:
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
    # Last, so that whoever waits for it has the lines above too.
    print("pynvmf target ready", flush=True)


async def _run_target(config: dict[str, Any]) -> int:
    target = await build_target(config)
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


def run_target_command(args: argparse.Namespace) -> int:
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
