"""`pynvmf target`: run an NVMe/TCP target, optionally with its JSON-RPC control plane.

The target starts from one of: the options (the default: one 1 GiB in-memory
namespace), `--config` (pynvmf's JSON), `--json` (what SPDK's save_config wrote,
as `nvmf_tgt --json` reads it), `--nvmetcli-config` (what `nvmetcli save` wrote), or
`--empty` (nothing: subsystems come over RPC).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

from pynvmf import __version__
from pynvmf.aio import install_uvloop
from pynvmf.cli.common import size, verbose_option
from pynvmf.compiled import build_description
from pynvmf.config.native import (
    DEFAULT_NQN,
    ConfigError,
    apply_config,
    config_from_options,
    load_config,
    metrics_listen_of,
    parse_listen,
    parse_metrics_listen,
)
from pynvmf.config.nvmetcli import load_nvmetcli
from pynvmf.config.spdk import load_spdk_config
from pynvmf.ha.gateway import Gateway, GatewayConfig
from pynvmf.logs import LOG_FORMATS
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.record.tap import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_TOTAL_BYTES, Recorder
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import DEFAULT_SOCKET, RpcServer, control_plane
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.ports import DISCOVERY_PORT
from pynvmf.target import ana
from pynvmf.target.budget import (
    DEFAULT_CONNECTION_DATA,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    ConnectionLimits,
    raise_open_file_limit,
)
from pynvmf.target.changes import ChangeError
from pynvmf.target.cores.workers import available_cores, make_target
from pynvmf.target.faults import parse_scenario
from pynvmf.target.target import Target

log = logging.getLogger("pynvmf")


def add_target_command(sub: Any) -> None:
    p = sub.add_parser(
        "target",
        help="run an NVMe/TCP target",
        description="Serve NVMe/TCP until SIGINT or SIGTERM. Without a configuration "
        "source the options build one subsystem (--nqn) of in-memory, file, block device "
        "or Ceph RBD namespaces (one 1 GiB memory namespace if none is given), listening "
        "on --listen (127.0.0.1:4420) with a discovery-only port beside it. A source "
        "(--config, --json, --nvmetcli-config or --empty) replaces those options; the "
        "RPC (--rpc-socket) changes a running target. The banner lists the ports and "
        "the nvme-cli commands that reach them.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", help="pynvmf JSON configuration (docs/configuration.md)"
    )
    source.add_argument(
        "--json", metavar="FILE", help="SPDK JSON configuration, as rpc.py save_config writes it"
    )
    source.add_argument(
        "--nvmetcli-config",
        metavar="FILE",
        help="the Linux target's configuration, as nvmetcli save writes it",
    )
    source.add_argument(
        "--empty", action="store_true", help="start with no subsystem and no port (use the RPC)"
    )
    p.add_argument(
        "--rpc-socket",
        nargs="?",
        const=DEFAULT_SOCKET,
        metavar="PATH",
        help=f"serve JSON-RPC on this Unix socket, mode 0600 (default path {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--rpc-listen",
        metavar="ADDR:PORT",
        help="also serve JSON-RPC on TCP (no authentication: a trusted network only)",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (docs/metrics.md; "
        "overrides the configuration file's metrics.listen)",
    )
    p.add_argument(
        "--faults",
        metavar="FILE",
        help="a fault scenario: a JSON list of fault rules, each added at_ms after the "
        "start and removed for_ms after (docs/faults.md)",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help="record every connection's PDUs, with timing, one file per connection in DIR "
        "(docs/record-replay.md; implies --cores 1)",
    )
    p.add_argument(
        "--record-max-file",
        type=size(4096),
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="SIZE",
        help="a recording file stops at this size (default 64M)",
    )
    p.add_argument(
        "--record-max-total",
        type=size(4096),
        default=DEFAULT_MAX_TOTAL_BYTES,
        metavar="SIZE",
        help="all recording stops once DIR's files hold this much (default 1G)",
    )
    p.add_argument(
        "--latency-tracking",
        action="store_true",
        help="time every I/O command: latency and stage histograms in the metrics and in "
        "pynvmf_get_host_stats (costs the hot path, docs/metrics.md; also over the RPC)",
    )
    p.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="[rdma:]ADDR:PORT",
        help="listen address, repeatable; IPv6 in brackets; rdma: before it for NVMe/RDMA "
        "(pyverbs and an RDMA device, docs/rdma.md) (default 127.0.0.1:4420, NVMe/TCP)",
    )
    p.add_argument(
        "--memory",
        action="append",
        default=[],
        # 0 passes here: the configuration says why it cannot be (not a block multiple).
        type=size(0),
        metavar="SIZE",
        help="add an in-memory namespace of SIZE (e.g. 64M, 1G), repeatable",
    )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="add a namespace backed by a file or block device, repeatable",
    )
    p.add_argument(
        "--rbd",
        action="append",
        default=[],
        metavar="POOL/IMAGE",
        help="add a namespace on a Ceph RBD image (needs python3-rbd), repeatable",
    )
    p.add_argument(
        "--ceph-conf",
        metavar="FILE",
        help="ceph.conf for --rbd (default: librados' search, /etc/ceph/ceph.conf)",
    )
    p.add_argument(
        "--ceph-client",
        metavar="ID",
        help="Ceph client id for --rbd, e.g. admin for client.admin (default: librados')",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=512,
        choices=(512, 4096),
        help="logical block size of the namespaces the options add (default 512)",
    )
    p.add_argument("--nqn", default=DEFAULT_NQN, help=f"subsystem NQN (default {DEFAULT_NQN})")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOSTNQN",
        help="allow only these host NQNs (repeatable; default: any host); a Linux host's is "
        "in its /etc/nvme/hostnqn",
    )
    p.add_argument(
        "--inline-data-size",
        type=int,
        default=16384,
        metavar="BYTES",
        help="write data a host may send in the command capsule (IOCCSZ; default 16384)",
    )
    p.add_argument(
        "--discovery-port",
        type=int,
        default=DISCOVERY_PORT,
        metavar="PORT",
        help=f"discovery-only port on each listen address (default {DISCOVERY_PORT}, 0: none)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive,
        default=0,
        metavar="N",
        help="connections the target accepts in all (default: the open file limit, less 256)",
    )
    p.add_argument(
        "--max-connections-per-address",
        type=_positive,
        default=DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        metavar="N",
        help=f"connections from one remote address (default {DEFAULT_MAX_CONNECTIONS_PER_ADDRESS})",
    )
    p.add_argument(
        "--max-memory",
        type=size(1 << 20),
        default=0,
        metavar="SIZE",
        help="data buffers the target holds for all hosts at once (default: half the memory)",
    )
    p.add_argument(
        "--max-connection-data",
        type=size(1 << 20),
        default=DEFAULT_CONNECTION_DATA,
        metavar="SIZE",
        help="data buffers one connection holds at once (default 32M)",
    )
    p.add_argument(
        "--cores",
        type=_positive,
        default=None,
        metavar="N",
        help="worker processes serving the I/O queues (default: the cores this process may "
        "use; 1: everything in one process)",
    )
    p.add_argument(
        "--busy-poll",
        type=int,
        default=0,
        metavar="USEC",
        help="keep polling the sockets for USEC microseconds after each input instead of "
        "sleeping (lower latency at low queue depth, a busy core meanwhile; default 0: off; "
        "in the main process and in every worker)",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="the log on stderr as text, or as JSON lines with the connection, host, "
        "subsystem and queue of each record about one (docs/target.md; default text)",
    )
    verbose_option(p)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text}")
    return value


def _print_banner(
    target: Target, rpc: RpcServer | None, socket_path: str | None, metrics: MetricsEndpoint
) -> None:
    io_ports = [p for p in target.ports if not p.discovery_only]
    print(f"build pynvmf {__version__}: {build_description()}", flush=True)
    for port in target.ports:
        kind = "discovery" if port.discovery_only else "nvme"
        print(f"listening {kind} {port}", flush=True)
    if socket_path:
        print(f"rpc unix {socket_path}")
    if rpc is not None and rpc.tcp_address is not None:
        host, port_number = rpc.tcp_address
        print(f"rpc tcp {f'[{host}]' if ':' in host else host}:{port_number}")
    if metrics.address is not None:
        host, port_number = metrics.address
        print(f"metrics http://{f'[{host}]' if ':' in host else host}:{port_number}/metrics")
    for port in target.ports:
        if port.discovery_only:
            print(f"  nvme discover -t tcp -a {port.address} -s {port.port}")
    for port in io_ports:
        for nqn in target.subsystems:
            if port.exposes(nqn):
                print(f"  nvme connect -t tcp -a {port.address} -s {port.port} -n {nqn}")
    # Last, so that whoever waits for it has the lines above too.
    print("pynvmf target ready", flush=True)


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from exc


def check_options(args: argparse.Namespace) -> None:
    """What argparse cannot check alone, before anything is built or listens."""
    if args.max_memory and args.max_connection_data > args.max_memory:
        raise ConfigError(
            f"--max-connection-data {args.max_connection_data} is more than "
            f"--max-memory {args.max_memory}"
        )
    if args.rpc_listen:
        try:  # refused before the target starts, not half-way
            parse_listen(args.rpc_listen)
        except ConfigError as exc:
            raise ConfigError(f"--rpc-listen: {exc}") from None
    if args.record and args.cores not in (None, 1):
        raise ConfigError("--record: recording needs a target on one core (--cores 1)")
    if args.metrics_listen:
        try:
            parse_metrics_listen(args.metrics_listen)
        except ConfigError as exc:
            raise ConfigError(f"--metrics-listen: {exc}") from None


async def _load(
    target: Target, args: argparse.Namespace, stop: asyncio.Event, metrics: MetricsEndpoint
) -> tuple[Any, GatewayConfig | None, tuple[str, int] | None]:
    """Build the target from the chosen source; the control plane (also used for --json),
    the configuration file's gateway section, if any, and where the metrics are served
    (--metrics-listen, else the file's metrics.listen), if anywhere."""
    cp = control_plane(target, shutdown=stop.set, metrics=metrics)
    gateway = None
    metrics_listen = parse_metrics_listen(args.metrics_listen) if args.metrics_listen else None
    if args.json:
        await load_spdk_config(cp, _read_json(args.json), args.json)
    elif args.nvmetcli_config:
        await load_nvmetcli(target, _read_json(args.nvmetcli_config), args.nvmetcli_config)
    elif args.config:
        config = load_config(args.config)
        if "gateway" in config:  # checked before anything is built
            gateway = GatewayConfig.parse(config["gateway"])
        metrics_listen = metrics_listen or metrics_listen_of(config)
        await apply_config(target, config)
    elif not args.empty:
        await apply_config(
            target,
            config_from_options(
                listen=args.listen,
                memory=args.memory,
                files=args.file,
                rbd_images=args.rbd,
                ceph_conf=args.ceph_conf,
                ceph_client=args.ceph_client,
                nqn=args.nqn,
                allow_hosts=args.allow_host,
                block_size=args.block_size,
                inline_data_size=args.inline_data_size,
                discovery_port=args.discovery_port,
            ),
        )
    return cp, gateway, metrics_listen


def _announce(grpid: int, state: AnaState) -> None:
    # On stdout, as the banner: what a supervisor (or a test) watches for.
    print(f"ana group {grpid} {ana.NAMES[state]}", flush=True)


async def _run_target(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    target = make_target(
        # Recording keeps one association's queues in one process (docs/record-replay.md).
        1 if args.record else args.cores or available_cores(),
        limits=ConnectionLimits(
            max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
            max_memory=args.max_memory,
            connection_data=args.max_connection_data,
        ),
        busy_poll_us=args.busy_poll,
    )
    rpc: RpcServer | None = None
    gateway: Gateway | None = None
    metrics = MetricsEndpoint(target)
    try:
        cp, gateway_config, metrics_listen = await _load(target, args, stop, metrics)
        if not target.ports and not (args.rpc_socket or args.rpc_listen):
            raise ConfigError("the configuration has no ports (and there is no RPC to add some)")
        if args.latency_tracking:
            target.set_latency_tracking(True)
        if metrics_listen is not None:
            # First of all that listens: a port it cannot have leaves nothing started.
            await metrics.listen(*metrics_listen)
        if gateway_config is not None:
            # Before the ports listen: no host sees a group optimized that is not owned.
            gateway = Gateway(target, gateway_config, announce=_announce)
            shared = await gateway.share()  # the group's subsystems, before setup needs them
            if shared is not None:
                cp.settle = shared.flush  # an RPC change returns once it is shared
            gateway.setup()
            await gateway.start()
        if args.record:
            try:
                target.record_connections(
                    Recorder(
                        args.record,
                        max_file_bytes=args.record_max_file,
                        max_total_bytes=args.record_max_total,
                    )
                )
            except OSError as exc:
                raise ConfigError(f"--record {args.record}: {_why(exc)}") from exc
        await target.start()
        if args.faults:
            _schedule_faults(target, args.faults)
        if gateway is not None and gateway.shared is not None:
            gateway.shared.local_changed()  # its listeners have their port numbers now
        if args.rpc_socket or args.rpc_listen:
            rpc = RpcServer(cp)
            if args.rpc_socket:
                try:
                    await rpc.listen_unix(args.rpc_socket)
                except OSError as exc:
                    raise ConfigError(f"--rpc-socket {args.rpc_socket}: {_why(exc)}") from exc
            if args.rpc_listen:
                address, port = parse_listen(args.rpc_listen)
                try:
                    await rpc.listen_tcp(address, port)
                except OSError as exc:
                    raise ConfigError(f"--rpc-listen {args.rpc_listen}: {_why(exc)}") from exc
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        _print_banner(target, rpc, args.rpc_socket, metrics)
        await stop.wait()
        log.info("shutting down")
    finally:
        await metrics.close()
        if rpc is not None:
            await rpc.close()
        if gateway is not None:
            await gateway.stop()  # its groups given up cleanly: no one fences it
        await target.stop()
    return 0


def _schedule_faults(target: Target, path: str) -> None:
    try:
        target.schedule_faults(parse_scenario(_read_json(path)))
    except ChangeError as exc:
        raise ConfigError(f"--faults {path}: {exc}") from None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def run_target_command(args: argparse.Namespace) -> int:
    try:
        check_options(args)
        install_uvloop()
        # Every host connection is a file descriptor: take all the system allows.
        raise_open_file_limit()
        return asyncio.run(_run_target(args))
    except RpcError as exc:
        print(f"pynvmf target: {exc.message}", file=sys.stderr)
        return 2
    except (ConfigError, OSError, ValueError) as exc:
        print(f"pynvmf target: {exc}", file=sys.stderr)
        return 2
