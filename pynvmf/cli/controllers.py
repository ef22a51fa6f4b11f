"""`pynvmf controllers [--server S] [--subsystem NQN] [--json]`: who is connected to a
running target, one line per controller, from its RPC (SPDK's nvmf_get_subsystems,
nvmf_subsystem_get_controllers and nvmf_subsystem_get_qpairs):

    SUBSYSTEM  CNTLID  HOST  HOSTID  ADDRESS  QUEUES  KATO  AUTH  TLS

ADDRESS is where the admin queue's connection comes from; QUEUES counts the admin queue
and the I/O queues; KATO is the keep-alive timeout the host set (ms); AUTH the
DH-HMAC-CHAP state of its queues (SPDK's names, with the hash and group) or "-"; TLS
whether its queues' connections are TLS. Host NQNs are the hosts' own text, shown
printable and cut (as the metrics' labels). --json prints the joined records instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pynvmf.cli.common import EXIT_FAILURE, verbose_option
from pynvmf.cli.parser import RawDescriptionFormatter
from pynvmf.cli.rpc import add_server_options
from pynvmf.cli.top_view import Table, plain_text
from pynvmf.metrics.labels import label_value
from pynvmf.rpc.client import RpcClient, RpcClientError

HEADERS = ("SUBSYSTEM", "CNTLID", "HOST", "HOSTID", "ADDRESS", "QUEUES", "KATO", "AUTH", "TLS")
NUMERIC = frozenset({1, 5, 6})


@dataclass(frozen=True, slots=True)
class Connected:
    subsystem: str
    cntlid: int
    host: str
    hostid: str
    address: str
    queues: int
    kato_ms: int | None
    auth: str
    tls: bool


def _address(qpair: Mapping[str, Any]) -> str:
    peer = qpair.get("peer_address")
    if not isinstance(peer, Mapping):
        return "-"
    host = str(peer.get("traddr", ""))
    port = str(peer.get("trsvcid", ""))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _auth(qpairs: Iterable[Mapping[str, Any]]) -> str:
    states = sorted(
        {
            f"{a.get('state')} {a.get('digest')} {a.get('dhgroup')}"
            for q in qpairs
            if isinstance(a := q.get("auth"), Mapping)
        }
    )
    return ", ".join(states) if states else "-"


def joined(
    controllers: Mapping[str, list[dict[str, Any]]], qpairs: Mapping[str, list[dict[str, Any]]]
) -> list[Connected]:
    """One record per controller, by subsystem NQN then controller ID, from the answers
    of nvmf_subsystem_get_controllers and nvmf_subsystem_get_qpairs per subsystem."""
    out = []
    for nqn in sorted(controllers):
        for ctrl in sorted(controllers[nqn], key=lambda c: int(c["cntlid"])):
            mine = [q for q in qpairs.get(nqn, []) if q.get("cntlid") == ctrl["cntlid"]]
            admin = next((q for q in mine if q.get("qid") == 0), mine[0] if mine else {})
            out.append(
                Connected(
                    subsystem=nqn,
                    cntlid=int(ctrl["cntlid"]),
                    host=str(ctrl.get("hostnqn", "")),
                    hostid=str(ctrl.get("hostid", "")),
                    address=_address(admin),
                    queues=int(ctrl.get("num_io_qpairs", len(mine))),
                    kato_ms=ctrl.get("kato_ms"),
                    auth=_auth(mine),
                    tls=any(q.get("tls") for q in mine),
                )
            )
    return out


def table(records: Iterable[Connected]) -> Table:
    lines = tuple(
        (
            label_value(r.subsystem),
            str(r.cntlid),
            label_value(r.host),
            r.hostid,
            r.address,
            str(r.queues),
            "-" if r.kato_ms is None else str(r.kato_ms),
            r.auth,
            "yes" if r.tls else "no",
        )
        for r in records
    )
    return Table(
        headers=HEADERS,
        lines=lines,
        connected=tuple(True for _ in lines),
        numeric=NUMERIC,
        sorted_column=None,
        sorted_by="subsystem, controller ID",
    )


def add_controllers_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "controllers",
        help="who is connected to a running target: a line per controller",
        description=__doc__,
        formatter_class=RawDescriptionFormatter,
    )
    add_server_options(p)
    p.add_argument("--subsystem", metavar="NQN", help="only this subsystem's controllers")
    p.add_argument("--json", action="store_true", help="the records as JSON")
    verbose_option(p)


def run_controllers_command(args: argparse.Namespace) -> int:
    try:
        with RpcClient(args.server, timeout=args.timeout) as client:
            if args.subsystem is not None:
                nqns = [args.subsystem]
            else:
                nqns = [s["nqn"] for s in client.call("nvmf_get_subsystems")]
            controllers = {n: client.call("nvmf_subsystem_get_controllers", nqn=n) for n in nqns}
            qpairs = {n: client.call("nvmf_subsystem_get_qpairs", nqn=n) for n in nqns}
    except RpcClientError as exc:
        code = f" (code {exc.code})" if exc.code is not None else ""
        print(f"pynvmf controllers: {args.server}: {exc.message}{code}", file=sys.stderr)
        return EXIT_FAILURE
    records = joined(controllers, qpairs)
    if args.json:
        print(json.dumps([asdict(r) for r in records], indent=2))
    else:
        print(plain_text(table(records)))
    return 0
