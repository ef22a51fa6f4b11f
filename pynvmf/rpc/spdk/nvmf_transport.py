"""SPDK's NVMe-oF target-wide methods: the TCP and RDMA transports (nvmf_create_transport,
nvmf_get_transports) and the target's settings (nvmf_set_max_subsystems, nvmf_set_crdt,
nvmf_set_config).
"""

from __future__ import annotations

import logging
from typing import Any

from pynvmf.config.spdk import (
    RDMA_FIXED,
    rdma_transport,
    rdma_transport_json,
    transport_json,
)
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.calls import change_now, check_trtype, no_target_name
from pynvmf.spec.auth import dhgroup_from_name, hash_from_name
from pynvmf.target.changes import check_transport
from pynvmf.target.controller import MAX_IO_QUEUES, QUEUE_ENTRIES
from pynvmf.target.limits import MAX_TRANSFER
from pynvmf.target.target import Target
from pynvmf.tcp.target import TransportConfig

log = logging.getLogger(__name__)

table = MethodTable()
method = table.register


# What nvmf_create_transport takes (SPDK's generic options, TCP's, and those rpc.py sends for
# every transport). pynvmf applies in_capsule_data_size; the others are checked like any
# input (type and range) and, where pynvmf has a fixed value that differs, the operator is
# told it was not applied rather than left to believe it was.
_TRANSPORT_BOOLEANS = (
    "dif_insert_or_strip",
    "zcopy",
    "c2h_success",
    "disable_command_passthru",
    "no_srq",
    "no_wr_batching",
    "disable_mappable_bar0",
    "disable_adaptive_irq",
    "disable_shadow_doorbells",
)


_TRANSPORT_INTEGERS = (
    "max_queue_depth",
    "max_io_qpairs_per_ctrlr",
    "max_io_size",
    "io_unit_size",
    "max_aq_depth",
    "num_shared_buffers",
    "buf_cache_size",
    "abort_timeout_sec",
    "acceptor_poll_rate",
    "ack_timeout",
    "data_wr_pool_size",
    "kas",
    "min_kato",
    "control_msg_num",
    "sock_priority",
    "num_cqe",
    "max_srq_depth",
    "acceptor_backlog",
)


def _fixed_transport_values(target: Target) -> dict[str, int]:
    return {
        "max_queue_depth": QUEUE_ENTRIES,
        "max_aq_depth": QUEUE_ENTRIES,
        "max_io_qpairs_per_ctrlr": MAX_IO_QUEUES,
        "max_io_size": MAX_TRANSFER,
        "io_unit_size": target.transport.max_h2c_data,
    }


def _unapplied_transport_options(p: Params, target: Target) -> list[str]:
    """Check every option nvmf_create_transport may carry; what differs from pynvmf's own
    fixed values, as 'name value (pynvmf: value)'."""
    for key in _TRANSPORT_BOOLEANS:
        p.boolean(key, None)
    fixed = _fixed_transport_values(target)
    unapplied = []
    for key in _TRANSPORT_INTEGERS:
        value = p.integer(key, None, high=0xFFFFFFFF)
        if value is not None and key in fixed and value != fixed[key]:
            unapplied.append(f"{key} {value} (pynvmf: {fixed[key]})")
    return unapplied


# What pynvmf's RDMA transport cannot do, by SPDK option: only these values are taken.
_RDMA_REFUSED: dict[str, tuple[object, str]] = {
    "dif_insert_or_strip": (False, "pynvmf inserts and strips no protection information"),
}


def _rdma_options(p: Params, target: Target) -> list[str]:
    """Check an RDMA transport's options: a limit of pynvmf's RDMA queues given another
    value is refused, naming the field; SPDK's resource tunings (buffers, SRQ, batching,
    backlog: pynvmf has none of them) are checked and returned as not applied."""
    for key, (allowed, reason) in _RDMA_REFUSED.items():
        p.refuse_unless(key, (allowed,), reason)
    for key in _TRANSPORT_BOOLEANS:
        p.boolean(key, None)
    unapplied = []
    for key in _TRANSPORT_INTEGERS:
        value = p.integer(key, None, high=0xFFFFFFFF)
        fixed = RDMA_FIXED.get(key)
        if value is None:
            continue
        if fixed is not None and value != fixed:
            raise RpcError(
                INVALID_PARAMS, f"{p.name(key)}: {value}: pynvmf's RDMA transport has {fixed}"
            )
        if fixed is None:
            unapplied.append(f"{key} {value}")
    return unapplied


async def _create_rdma_transport(cp: ControlPlane, p: Params) -> bool:
    no_target_name(p)
    current = cp.target.transport
    inline = p.integer("in_capsule_data_size", current.inline_data_size, high=0xFFFFFFFF)
    unapplied = _rdma_options(p, cp.target)
    p.done()
    if cp.rdma_transport is not None:
        raise RpcError(INVALID_PARAMS, "trtype: transport type 'RDMA' already exists")
    config = TransportConfig(
        inline_data_size=inline,
        max_h2c_data=current.max_h2c_data,
        allow_header_digest=current.allow_header_digest,
        allow_data_digest=current.allow_data_digest,
        cpda=current.cpda,
    )
    change_now(lambda: check_transport(config), {"inline_data_size": "in_capsule_data_size"})
    cp.rdma_transport = config
    if unapplied:
        log.warning("nvmf_create_transport RDMA: not applied: %s", ", ".join(unapplied))
    return True


@method("nvmf_create_transport")
async def nvmf_create_transport(cp: ControlPlane, p: Params) -> bool:
    if check_trtype(p) == "rdma":
        return await _create_rdma_transport(cp, p)
    no_target_name(p)
    inline = p.integer("in_capsule_data_size", None, high=0xFFFFFFFF)
    unapplied = _unapplied_transport_options(p, cp.target)
    p.done()
    if cp.transport_created:
        raise RpcError(INVALID_PARAMS, "trtype: transport type 'TCP' already exists")
    current = cp.target.transport
    if inline is not None:
        config = TransportConfig(
            inline_data_size=inline,
            max_h2c_data=current.max_h2c_data,
            allow_header_digest=current.allow_header_digest,
            allow_data_digest=current.allow_data_digest,
            cpda=current.cpda,
        )
        change_now(
            lambda: cp.target.set_transport(config), {"inline_data_size": "in_capsule_data_size"}
        )
    cp.transport_created = True
    if unapplied:
        log.warning("nvmf_create_transport: not applied: %s", ", ".join(unapplied))
    return True


@method("nvmf_get_transports")
async def nvmf_get_transports(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    trtype = p.string("trtype", None)
    no_target_name(p)
    p.done()
    transports = [transport_json(cp.target)]
    rdma = rdma_transport(cp.target, cp.rdma_transport)
    if rdma is not None:
        transports.append(rdma_transport_json(rdma))
    if trtype is not None:
        transports = [t for t in transports if t["trtype"] == trtype.upper()]
        if not transports:
            raise RpcError(INVALID_PARAMS, f"trtype: no transport {trtype!r}")
    return transports


@method("nvmf_set_max_subsystems")
async def nvmf_set_max_subsystems(cp: ControlPlane, p: Params) -> bool:
    limit = p.integer("max_subsystems", low=1, high=0xFFFFFFFF)
    p.done()
    if limit < len(cp.target.subsystems):
        raise RpcError(
            INVALID_PARAMS,
            f"max_subsystems: the target has {len(cp.target.subsystems)} subsystems already",
        )
    cp.target.max_subsystems = limit
    return True


@method("nvmf_set_crdt")
async def nvmf_set_crdt(cp: ControlPlane, p: Params) -> bool:
    # The Command Retry Delay Times Identify Controller reports (100 ms units): what a
    # fault rule's CRD names (docs/faults.md).
    crdt = tuple(p.integer(f"crdt{i}", cp.target.crdt[i - 1], high=0xFFFF) for i in (1, 2, 3))
    p.done()
    cp.target.set_crdt((crdt[0], crdt[1], crdt[2]))
    return True


@method("nvmf_set_config")
async def nvmf_set_config(cp: ControlPlane, p: Params) -> bool:
    passthru = p.nested("admin_cmd_passthru", required=False)
    if passthru is not None:
        for key in ("identify_ctrlr", "vendor_specific"):
            passthru.refuse_unless(key, (False,), "pynvmf passes no admin commands through")
        passthru.done()
    p.refuse_unless("poll_groups_mask", (), "pynvmf runs its target in one thread")
    p.refuse_unless(
        "discovery_filter", ("match_any",), "pynvmf's discovery log lists every listener"
    )
    digests = p.strings("dhchap_digests")
    groups = p.strings("dhchap_dhgroups")
    p.done()
    try:
        hashes = tuple(hash_from_name(d) for d in digests) if digests is not None else None
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"dhchap_digests: {exc}") from None
    try:
        dhgroups = tuple(dhgroup_from_name(g) for g in groups) if groups is not None else None
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"dhchap_dhgroups: {exc}") from None
    # The hashes and DH groups of hosts whose keys are set from now on (SPDK's too).
    if hashes:
        cp.target.dhchap_hashes = hashes
    if dhgroups:
        cp.target.dhchap_dhgroups = dhgroups
    return True
