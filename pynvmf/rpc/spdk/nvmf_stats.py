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
from pynvmf.target.subsystem import Subsystem

table = MethodTable()
method = table.register


TICK_RATE = 1_000_000_000  # nvmf_get_stats' ticks per second: pynvmf counts nanoseconds


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
                "thread": "pynvmf",
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
            qpairs.append(entry)
    return qpairs


@method("nvmf_get_stats")
async def nvmf_get_stats(cp: ControlPlane, p: Params) -> dict[str, Any]:
    no_target_name(p)
    p.done()
    target = cp.target
    controllers = [
        ctrl
        for subsystem in [target.discovery, *target.subsystems.values()]
        for ctrl in subsystem.controllers.values()
    ]
    current_io = sum(len([q for q in ctrl.queues if q]) for ctrl in controllers)
    current_admin = sum(1 for ctrl in controllers if 0 in ctrl.queues)
    completed = sum(
        s.stats.read_cmds + s.stats.write_cmds + s.stats.copy_cmds
        for s in target.subsystems.values()
    )
    return {
        "tick_rate": TICK_RATE,
        "poll_groups": [
            {
                "name": "pynvmf",
                "admin_qpairs": target.counters.admin_queues,
                "io_qpairs": target.counters.io_queues,
                "current_admin_qpairs": current_admin,
                "current_io_qpairs": current_io,
                "pending_bdev_io": 0,
                "completed_nvme_io": completed,
                # pynvmf's own field: the secure channel's per-connection decisions.
                "transports": [{"trtype": "TCP", "tls": target.tls_counters.as_dict()}],
            }
        ],
    }
