"""SPDK's NVMe-oF methods that report what is connected: controllers, queue pairs and
the target's statistics.
"""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

from pynvmf.config.spdk import (
    trid,
)
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.calls import no_target_name
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.poll_groups import TICK_RATE
from pynvmf.target.subsystem import Subsystem

table = MethodTable()
method = table.register


def _subsystem_or_discovery(cp: ControlPlane, p: Params) -> Subsystem:
    nqn = p.string("nqn")
    no_target_name(p)
    p.done()
    if nqn == DISCOVERY_NQN:
        return cp.target.discovery
    subsystem = cp.target.subsystems.get(nqn)
    if subsystem is None:
        raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    return subsystem


def _hostid(raw: bytes) -> str:
    return str(uuid_mod.UUID(bytes=bytes(raw))) if len(raw) == 16 else raw.hex()


@method("nvmf_subsystem_get_controllers")
async def nvmf_subsystem_get_controllers(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    subsystem = _subsystem_or_discovery(cp, p)
    return [
        {
            "cntlid": ctrl.cntlid,
            "cntrltype": "discovery" if ctrl.is_discovery else "io",
            "hostnqn": ctrl.hostnqn,
            "hostid": _hostid(ctrl.hostid),
            "num_io_qpairs": len(ctrl.queues),
            # pynvmf's own: the keep-alive timeout the host set.
            "kato_ms": ctrl.kato_ms,
        }
        for _, ctrl in sorted(subsystem.controllers.items())
    ]


@method("nvmf_subsystem_get_qpairs")
async def nvmf_subsystem_get_qpairs(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    subsystem = _subsystem_or_discovery(cp, p)
    qpairs = []
    for _, ctrl in sorted(subsystem.controllers.items()):
        for qid, queue in sorted(ctrl.queues.items()):
            entry: dict[str, Any] = {
                "cntlid": ctrl.cntlid,
                "qid": qid,
                "state": "enabled",
                "thread": cp.target.poll_group_of(queue),
                "hostnqn": ctrl.hostnqn,
                "listen_address": trid(queue.port),
            }
            if queue.peer_address:
                peer_host, peer_port = queue.peer_address[:2]
                entry["peer_address"] = {
                    "trtype": "TCP",
                    "adrfam": "IPv6" if ":" in peer_host else "IPv4",
                    "traddr": peer_host,
                    "trsvcid": str(peer_port),
                }
            if queue.auth is not None:
                entry["auth"] = queue.auth.describe()
            # pynvmf's own: whether the queue's connection is TLS.
            entry["tls"] = queue.tls_psk is not None
            qpairs.append(entry)
    return qpairs


@method("nvmf_get_stats")
async def nvmf_get_stats(cp: ControlPlane, p: Params) -> dict[str, Any]:
    no_target_name(p)
    p.done()
    target = cp.target
    groups = []
    for index, group in enumerate(target.poll_groups()):
        transport: dict[str, Any] = {"trtype": "TCP"}  # SPDK's TCP transport adds nothing
        if index == 0:
            # pynvmf's own field: the secure channel's per-connection decisions, all of
            # them made in the main process.
            transport["tls"] = target.tls_counters.as_dict()
        groups.append(
            {
                "name": group.name,
                "admin_qpairs": group.admin_qpairs,
                "io_qpairs": group.io_qpairs,
                "current_admin_qpairs": group.current_admin_qpairs,
                "current_io_qpairs": group.current_io_qpairs,
                # A command waits for a device in asyncio, not in a queue of its own.
                "pending_bdev_io": 0,
                "completed_nvme_io": group.completed_nvme_io,
                "transports": [transport],
            }
        )
    return {"tick_rate": TICK_RATE, "poll_groups": groups}
