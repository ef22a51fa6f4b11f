"""SPDK's NVMe-oF methods that report what is connected: controllers, queue pairs and
the target's statistics.
"""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

from pynvmf.config.spdk import rdma_transport, trid
from pynvmf.rdma.counters import RdmaQueueTally, RdmaTransportCounters
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
    has_rdma = rdma_transport(target, cp.rdma_transport) is not None or bool(
        target.rdma_counters.ports()
    )
    groups = []
    for index, group in enumerate(target.poll_groups()):
        transport: dict[str, Any] = {"trtype": "TCP"}  # SPDK's TCP transport adds nothing
        transports = [transport]
        if index == 0:
            # pynvmf's own field: the secure channel's per-connection decisions, all of
            # them made in the main process.
            transport["tls"] = target.tls_counters.as_dict()
        if has_rdma:
            # Every rdma queue is served by the main process (poll group 0); the workers'
            # groups list the transport with no device, as an SPDK poll group without one.
            transports.append(_rdma_stats(target.rdma_counters if index == 0 else None))
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
                "transports": transports,
            }
        )
    return {"tick_rate": TICK_RATE, "poll_groups": groups}


def _rdma_stats(counters: RdmaTransportCounters | None) -> dict[str, Any]:
    """The RDMA transport's entry in a poll group, shaped as SPDK's (lib/nvmf/rdma.c's
    poll group statistics): a "device" per rdma port, named by the port, from what its
    queues counted (pynvmf/rdma/counters.py)."""
    ports = counters.ports() if counters is not None else []
    return {
        "trtype": "RDMA",
        # pynvmf's queues wait for no shared data buffer.
        "pending_data_buffer": 0,
        "devices": [_rdma_device(name, tally) for name, tally in ports],
    }


def _rdma_device(name: str, tally: RdmaQueueTally) -> dict[str, Any]:
    c = tally.total()
    # The work requests the queues posted on their send queues: a SEND per completion,
    # an RDMA READ or WRITE per transfer; each posted alone (one doorbell each). Their
    # receive queues: a receive posted again per command.
    sends = c.completions + c.rdma_reads + c.rdma_writes
    return {
        "name": name,
        # pynvmf waits on completion channels rather than polling: no polls to count.
        "polls": 0,
        "idle_polls": 0,
        # Work completions: a receive per command, a SEND per completion, a READ each
        # (WRITEs are unsignalled: the SEND behind each completes for it).
        "completions": c.commands + c.completions + c.rdma_reads,
        "requests": c.commands,
        "request_latency": 0,
        # pynvmf's queues never wait for a free request or send queue depth.
        "pending_free_request": 0,
        "pending_rdma_read": 0,
        "pending_rdma_write": 0,
        "pending_rdma_send": 0,
        "total_send_wrs": sends,
        "send_doorbell_updates": sends,
        "total_recv_wrs": c.commands,
        "recv_doorbell_updates": c.commands,
        # pynvmf's own fields: what NVMe/RDMA's in-capsule data changes, and the queues.
        "in_capsule_bytes": c.in_capsule_bytes,
        "rdma_reads": c.rdma_reads,
        "rdma_writes": c.rdma_writes,
        "queues_opened": tally.queues,
        "queues_alive": tally.alive,
    }
