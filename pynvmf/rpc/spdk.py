"""SPDK-compatible RPC methods: SPDK's scripts/rpc.py drives pynvmf with them unchanged.

Names, parameters and result shapes are SPDK v25.09's. Where SPDK has an option
pynvmf has no use for (a poll group mask, an RDMA queue size), the option is
accepted and reported as what pynvmf does; where it asks for something pynvmf
does not do (TLS, DH-HMAC-CHAP keys, metadata), the call fails with
an error naming it. `save_config` (rpc.py's, built from framework_get_config)
writes what `pynvmf target --json` loads again (pynvmf.config.spdk).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import uuid as uuid_mod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pynvmf import __version__
from pynvmf.block.file import FileDevice
from pynvmf.config.native import REDACTED_KEY
from pynvmf.config.spdk import (
    CONFIG_SUBSYSTEMS,
    bdev_config,
    keyring_config,
    listeners_of,
    nvmf_config,
    transport_json,
    trid,
)
from pynvmf.rpc.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params, change_error
from pynvmf.spec.auth import dhgroup_from_name, hash_from_name
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.target import devices as D
from pynvmf.target.controller import MAX_IO_QUEUES, QUEUE_ENTRIES
from pynvmf.target.devices import NamedDevice
from pynvmf.target.limits import MAX_TRANSFER
from pynvmf.target.server import ChangeError, Target
from pynvmf.target.subsystem import CNTLID_MAX, CNTLID_MIN, Subsystem
from pynvmf.tcp.target import TransportConfig

log = logging.getLogger(__name__)

table = MethodTable()
method = table.register

TICK_RATE = 1_000_000_000  # nvmf_get_stats' ticks per second: pynvmf counts nanoseconds


def _no_target_name(p: Params) -> None:
    p.refuse_unless("tgt_name", (), "pynvmf has one target, and it has no name")


async def _apply(change: Awaitable[Any], names: dict[str, str]) -> Any:
    try:
        return await change
    except ChangeError as exc:
        raise change_error(exc, names) from exc


def _sync(call: Callable[[], Any], names: dict[str, str]) -> Any:
    try:
        return call()
    except ChangeError as exc:
        raise change_error(exc, names) from exc


# -- application ----------------------------------------------------------------------------


@method("rpc_get_methods")
async def rpc_get_methods(cp: ControlPlane, p: Params) -> list[str]:
    p.boolean("current", False)
    p.boolean("include_aliases", False)
    p.done()
    return sorted(cp.table.methods)


@method("spdk_get_version")
async def spdk_get_version(cp: ControlPlane, p: Params) -> dict[str, Any]:
    p.done()
    parts = [*(int(x) for x in __version__.split(".")[:3]), 0, 0, 0][:3]
    return {
        "version": f"pynvmf v{__version__}",
        "fields": {"major": parts[0], "minor": parts[1], "patch": parts[2], "suffix": ""},
    }


@method("framework_wait_init")
async def framework_wait_init(cp: ControlPlane, p: Params) -> bool:
    p.done()
    return True  # a target that answers RPCs has finished starting


@method("framework_get_subsystems")
async def framework_get_subsystems(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    p.done()
    return [dict(s) for s in CONFIG_SUBSYSTEMS]


@method("framework_get_config")
async def framework_get_config(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    name = p.string("name")
    p.done()
    if name == "keyring":
        return keyring_config(cp.target)
    if name == "bdev":
        return bdev_config(cp.target)
    if name == "nvmf":
        return nvmf_config(cp.target)
    raise RpcError(INVALID_PARAMS, f"name: pynvmf has no configuration subsystem {name!r}")


@method("spdk_kill_instance")
async def spdk_kill_instance(cp: ControlPlane, p: Params) -> bool:
    sig = p.string("sig_name")
    p.done()
    if sig.upper().removeprefix("SIG") not in ("INT", "TERM", "KILL") and sig not in (
        "2",
        "9",
        "15",
    ):
        raise RpcError(
            INVALID_PARAMS, f"sig_name: {sig!r}: pynvmf stops on SIGINT, SIGTERM or SIGKILL"
        )
    if cp.shutdown is None:
        raise RpcError(INVALID_PARAMS, "sig_name: this target cannot be stopped over RPC")
    cp.shutdown()
    return True


# -- block devices ------------------------------------------------------------------------------


def _free_name(target: Target, prefix: str) -> str:
    n = 0
    while f"{prefix}{n}" in target.block_devices:
        n += 1
    return f"{prefix}{n}"


async def _register_bdev(
    target: Target, name: str, device: Any, dev_uuid: uuid_mod.UUID | None
) -> str:
    """A new device under its bdev name (a random UUID unless given); closed again if
    the target refuses it."""
    entry = NamedDevice.wrap(name, device, device_uuid=dev_uuid or uuid_mod.uuid4())
    try:
        target.add_block_device(entry)
    except ChangeError as exc:
        await device.close()
        raise change_error(exc, {}) from exc
    return name


@method("bdev_malloc_create")
async def bdev_malloc_create(cp: ControlPlane, p: Params) -> str:
    name = p.string("name", None)
    dev_uuid = p.uuid_value("uuid")
    num_blocks = p.integer("num_blocks", low=1)
    block_size = p.integer("block_size", low=1)
    p.refuse_unless("physical_block_size", (0, block_size), "pynvmf reports no physical block size")
    p.refuse_unless("optimal_io_boundary", (0,), "pynvmf splits I/O at no boundary")
    p.refuse_unless("md_size", (0,), "pynvmf namespaces have no metadata")
    p.refuse_unless("md_interleave", (False,), "pynvmf namespaces have no metadata")
    p.refuse_unless("dif_type", (0,), "pynvmf namespaces have no protection information")
    p.refuse_unless("dif_is_head_of_md", (False,), "pynvmf namespaces have no metadata")
    p.refuse_unless("dif_pi_format", (0,), "pynvmf namespaces have no protection information")
    p.done()
    target = cp.target
    name = name or _free_name(target, "Malloc")
    if name in target.block_devices:
        raise RpcError(INVALID_PARAMS, f"name: a bdev named {name!r} exists")
    try:
        device = target.memory_device(num_blocks * block_size, block_size)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"block_size: {exc}") from exc
    except OSError as exc:
        raise RpcError(INVALID_PARAMS, f"num_blocks: {exc.strerror}") from exc
    return await _register_bdev(target, name, device, dev_uuid)


@method("bdev_aio_create")
async def bdev_aio_create(cp: ControlPlane, p: Params) -> str:
    name = p.string("name")
    filename = p.string("filename")
    block_size = p.integer("block_size", 0)
    read_only = p.boolean("readonly", False)
    p.ignore("fallocate")  # pynvmf's file devices zero and deallocate with fallocate anyway
    dev_uuid = p.uuid_value("uuid")
    p.done()
    target = cp.target
    if name in target.block_devices:
        raise RpcError(INVALID_PARAMS, f"name: a bdev named {name!r} exists")
    try:
        device = FileDevice(filename, block_size or 512, read_only=read_only)
    except OSError as exc:
        raise RpcError(INVALID_PARAMS, f"filename: {filename}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"block_size: {exc}") from exc
    entry = NamedDevice.wrap(name, device, device_uuid=dev_uuid or uuid_mod.uuid4())
    try:
        target.add_block_device(entry)
    except ChangeError as exc:
        device.close_sync()
        raise change_error(exc, {}) from exc
    return name


async def _delete_bdev(cp: ControlPlane, p: Params, kind: str) -> bool:
    name = p.string("name")
    p.done()
    entry = cp.target.block_devices.get(name)
    if entry is None or entry.kind != kind:
        what = "malloc" if kind == D.MEMORY else "aio"
        raise RpcError(INVALID_PARAMS, f"name: no {what} bdev named {name!r}")
    await _apply(cp.target.remove_block_device(name), {})
    return True


@method("bdev_malloc_delete")
async def bdev_malloc_delete(cp: ControlPlane, p: Params) -> bool:
    return await _delete_bdev(cp, p, D.MEMORY)


@method("bdev_aio_delete")
async def bdev_aio_delete(cp: ControlPlane, p: Params) -> bool:
    return await _delete_bdev(cp, p, D.FILE)


# -- Ceph RBD (pynvmf.block.rbd; SPDK's bdev_rbd) ----------------------------------------------


def _rbd_error(key: str, exc: Exception) -> RpcError:
    from pynvmf.block.rbd import RbdUnavailable

    if isinstance(exc, RbdUnavailable):
        return RpcError(INVALID_PARAMS, f"{key}: {exc}")
    if isinstance(exc, OSError):
        return RpcError(INVALID_PARAMS, f"{key}: {exc.strerror or exc}")
    return RpcError(INVALID_PARAMS, f"{key}: {exc}")


@method("bdev_rbd_register_cluster")
async def bdev_rbd_register_cluster(cp: ControlPlane, p: Params) -> str:
    from pynvmf.block.rbd import ClusterSpec, RadosConnection

    name = p.string("name")
    user_id = p.string("user_id", None)
    config_param = p.string_map("config_param") or {}
    config_file = p.string("config_file", None)
    key_file = p.string("key_file", None)
    p.refuse_unless("core_mask", (None,), "pynvmf does not pin librbd's threads")
    p.done()
    if name in cp.rbd_clusters:
        raise RpcError(INVALID_PARAMS, f"name: a cluster named {name!r} is registered")
    if key_file is not None:
        config_param = {**config_param, "keyring": key_file}
    # SPDK reads the default ceph.conf only when given neither a file nor options.
    conf = config_file if config_file is not None else ("" if config_param else None)
    spec = ClusterSpec.of(conf, user_id, config_param)
    try:
        conn = await asyncio.to_thread(RadosConnection.get, spec)
    except (ImportError, OSError) as exc:
        raise _rbd_error("name", exc) from exc
    cp.rbd_clusters[name] = (spec, conn)
    return name


@method("bdev_rbd_unregister_cluster")
async def bdev_rbd_unregister_cluster(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    p.done()
    entry = cp.rbd_clusters.get(name)
    if entry is None:
        raise RpcError(INVALID_PARAMS, f"name: no cluster named {name!r}")
    users = [
        e.name
        for e in cp.target.block_devices.values()
        if e.kind == D.RBD and getattr(e.device, "cluster_spec", None) == entry[0]
    ]
    if users:
        # As SPDK: a cluster its bdevs still use stays.
        raise RpcError(INVALID_PARAMS, f"name: cluster {name!r} is used by {', '.join(users)}")
    del cp.rbd_clusters[name]
    await asyncio.to_thread(entry[1].release)
    return True


@method("bdev_rbd_get_clusters_info")
async def bdev_rbd_get_clusters_info(cp: ControlPlane, p: Params) -> Any:
    """SPDK's shapes: one object for a `name`, else a list of them."""
    name = p.string("name", None)
    p.done()
    if name is not None and name not in cp.rbd_clusters:
        raise RpcError(INVALID_PARAMS, f"name: no cluster named {name!r}")
    out = []
    for cname, (spec, _conn) in cp.rbd_clusters.items():
        if name is not None and cname != name:
            continue
        info: dict[str, Any] = {"cluster_name": cname}
        if spec.client is not None:
            info["user_id"] = spec.client
        if spec.conf:
            info["config_file"] = spec.conf
        if spec.options:
            info["config_param"] = dict(spec.options)
        out.append(info)
    return out[0] if name is not None else out


@method("bdev_rbd_create")
async def bdev_rbd_create(cp: ControlPlane, p: Params) -> str:
    from pynvmf.block.rbd import ClusterSpec, RbdDevice

    name = p.string("name", None)
    pool = p.string("pool_name")
    image = p.string("rbd_name")
    block_size = p.integer("block_size", low=1)
    user_id = p.string("user_id", None)
    config = p.string_map("config")
    cluster_name = p.string("cluster_name", None)
    dev_uuid = p.uuid_value("uuid")
    read_only = p.boolean("read_only", False)
    p.done()
    if not pool:
        raise RpcError(INVALID_PARAMS, "pool_name: empty")
    if not image:
        raise RpcError(INVALID_PARAMS, "rbd_name: empty")
    if block_size & (block_size - 1) or block_size < 512:
        raise RpcError(INVALID_PARAMS, f"block_size: {block_size} is not a power of two >= 512")
    target = cp.target
    name = name or _free_name(target, "Ceph")
    if name in target.block_devices:
        raise RpcError(INVALID_PARAMS, f"name: a bdev named {name!r} exists")
    if cluster_name is not None:
        if user_id is not None or config is not None:
            raise RpcError(
                INVALID_PARAMS, "cluster_name: user_id and config belong to the registered cluster"
            )
        registered = cp.rbd_clusters.get(cluster_name)
        if registered is None:
            raise RpcError(INVALID_PARAMS, f"cluster_name: no cluster named {cluster_name!r}")
        spec = registered[0]
    else:
        spec = ClusterSpec.of("" if config else None, user_id, config or {})
    try:
        device = await RbdDevice.open_async(
            pool,
            image,
            conf=spec.conf,
            client=spec.client,
            options=dict(spec.options),
            block_size=block_size,
            read_only=read_only,
        )
    except (ImportError, OSError) as exc:
        raise _rbd_error("rbd_name", exc) from exc
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"block_size: {exc}") from exc
    return await _register_bdev(target, name, device, dev_uuid)


@method("bdev_rbd_delete")
async def bdev_rbd_delete(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    p.done()
    entry = cp.target.block_devices.get(name)
    if entry is None or entry.kind != D.RBD:
        raise RpcError(INVALID_PARAMS, f"name: no rbd bdev named {name!r}")
    await _apply(cp.target.remove_block_device(name), {})
    return True


@method("bdev_get_bdevs")
async def bdev_get_bdevs(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    name = p.string("name", None)
    p.ignore("timeout")  # SPDK waits that long for a bdev to appear; pynvmf's do not appear
    p.done()
    target = cp.target
    entries = list(target.block_devices.values())
    if name is not None:
        entries = [e for e in entries if name in (e.name, str(e.uuid) if e.uuid else None)]
        if not entries:
            raise RpcError(INVALID_PARAMS, f"name: no bdev named {name!r}")
    return [_bdev_json(target, e) for e in entries]


def _bdev_json(target: Target, entry: NamedDevice) -> dict[str, Any]:
    caps = entry.device.capabilities
    product = {D.MEMORY: "Malloc disk", D.FILE: "AIO disk", D.RBD: "Ceph Rbd Disk"}.get(
        entry.kind, "pynvmf device"
    )
    out: dict[str, Any] = {
        "name": entry.name,
        "aliases": [str(entry.uuid)] if entry.uuid else [],
        "product_name": product,
        "block_size": caps.block_size,
        "num_blocks": caps.num_blocks,
    }
    if entry.uuid:
        out["uuid"] = str(entry.uuid)
    out["claimed"] = bool(target.device_users(entry.name))
    out["zoned"] = False
    out["supported_io_types"] = {
        "read": True,
        "write": not entry.read_only,
        "unmap": caps.deallocate,
        "flush": True,
        "write_zeroes": caps.write_zeroes,
        "copy": True,
    }
    driver: dict[str, Any] = {}
    if entry.kind == D.FILE:
        driver["aio"] = {
            "filename": entry.path,
            "block_size_override": caps.block_size != 512,
            "readonly": entry.read_only,
            "fallocate": True,
        }
    elif entry.kind == D.RBD:
        dev: Any = entry.device
        spec = dev.cluster_spec
        rbd: dict[str, Any] = {"pool_name": dev.pool, "rbd_name": dev.image_name}
        if spec.client is not None:
            rbd["user_id"] = spec.client
        if spec.options:
            rbd["config"] = dict(spec.options)
        rbd["state"] = dev.state.value  # pynvmf's: ok, unreachable, fenced, closed
        driver["rbd"] = rbd
    out["driver_specific"] = driver
    return out


# -- the NVMe-oF target: transport ------------------------------------------------------------

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


def _check_trtype(p: Params, key: str = "trtype") -> None:
    trtype = p.string(key)
    if trtype.upper() != "TCP":
        raise RpcError(INVALID_PARAMS, f"{p.name(key)}: {trtype!r}: pynvmf serves NVMe/TCP only")


@method("nvmf_create_transport")
async def nvmf_create_transport(cp: ControlPlane, p: Params) -> bool:
    _check_trtype(p)
    _no_target_name(p)
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
        _sync(lambda: cp.target.set_transport(config), {"inline_data_size": "in_capsule_data_size"})
    cp.transport_created = True
    if unapplied:
        log.warning("nvmf_create_transport: not applied: %s", ", ".join(unapplied))
    return True


@method("nvmf_get_transports")
async def nvmf_get_transports(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    trtype = p.string("trtype", None)
    _no_target_name(p)
    p.done()
    if trtype is not None and trtype.upper() != "TCP":
        raise RpcError(INVALID_PARAMS, f"trtype: no transport {trtype!r}")
    return [transport_json(cp.target)]


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
    for key in ("crdt1", "crdt2", "crdt3"):
        p.refuse_unless(key, (0,), "pynvmf asks for no command retry delays")
    p.done()
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


@method("bdev_wait_for_examine")
async def bdev_wait_for_examine(cp: ControlPlane, p: Params) -> bool:
    p.done()
    return True  # pynvmf's block devices are ready when created


# -- subsystems ---------------------------------------------------------------------------------


@method("nvmf_create_subsystem")
async def nvmf_create_subsystem(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    _no_target_name(p)
    serial = p.string("serial_number", "")
    model = p.string("model_number", "pynvmf")
    max_namespaces = p.integer("max_namespaces", 0, high=0xFFFFFFFF)
    allow_any_host = p.boolean("allow_any_host", False)
    # pynvmf's subsystems always report ANA (as nvmet's do): with one group, optimized
    # on every listener, a host sees what it would without.
    p.boolean("ana_reporting", False)
    min_cntlid = p.integer("min_cntlid", CNTLID_MIN, high=0xFFFF)
    max_cntlid = p.integer("max_cntlid", CNTLID_MAX, high=0xFFFF)
    p.refuse_unless("max_discard_size_kib", (0,), "pynvmf limits no discard size")
    p.refuse_unless("max_write_zeroes_size_kib", (0,), "pynvmf has its own Write Zeroes limit")
    p.refuse_unless("passthrough", (False,), "pynvmf passes no commands through")
    p.refuse_unless("enable_nssr", (False,), "pynvmf has no NVM subsystem reset")
    p.done()
    _sync(
        lambda: cp.target.add_subsystem(
            nqn,
            serial=serial,
            model=model,
            allow_any_host=allow_any_host,
            max_namespaces=max_namespaces,
            cntlid_min=min_cntlid,
            cntlid_max=max_cntlid,
        ),
        {"serial": "serial_number", "model": "model_number", "cntlid_min": "min_cntlid"},
    )
    return True


@method("nvmf_delete_subsystem")
async def nvmf_delete_subsystem(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    _no_target_name(p)
    p.done()
    await _apply(cp.target.remove_subsystem(nqn), {})
    return True


def _host_json(subsystem: Subsystem, hostnqn: str) -> dict[str, Any]:
    """A host as SPDK lists it: its NQN and its keys' keyring names (never the keys)."""
    out: dict[str, Any] = {"nqn": hostnqn}
    auth = subsystem.host_auth.get(hostnqn)
    if auth is not None:
        out["dhchap_key"] = auth.host_key_name or REDACTED_KEY
        if auth.ctrl_key is not None:
            out["dhchap_ctrlr_key"] = auth.ctrl_key_name or REDACTED_KEY
    if hostnqn in subsystem.host_psks:
        out["psk"] = subsystem.host_psk_names.get(hostnqn) or REDACTED_KEY
    return out


def _subsystem_json(target: Target, subsystem: Subsystem) -> dict[str, Any]:
    discovery = subsystem.nqn == DISCOVERY_NQN
    out: dict[str, Any] = {
        "nqn": subsystem.nqn,
        "subtype": "Discovery" if discovery else "NVMe",
        "listen_addresses": [trid(port) for port in listeners_of(target, subsystem.nqn)],
        "allow_any_host": subsystem.allow_any_host,
        "hosts": [_host_json(subsystem, h) for h in sorted(subsystem.allowed_hosts)],
    }
    if discovery:
        return out
    out["serial_number"] = subsystem.serial
    out["model_number"] = subsystem.model
    if subsystem.max_namespaces:
        out["max_namespaces"] = subsystem.max_namespaces
    out["min_cntlid"] = subsystem.cntlid_min
    out["max_cntlid"] = subsystem.cntlid_max
    out["namespaces"] = [
        {
            "nsid": ns.nsid,
            "bdev_name": ns.device_name,
            "name": ns.device_name,
            "nguid": ns.nguid.hex().upper(),
            "eui64": ns.eui64.hex().upper(),
            "uuid": str(ns.uuid),
            "anagrpid": ns.anagrpid,
        }
        for _, ns in sorted(subsystem.namespaces.items())
    ]
    return out


@method("nvmf_get_subsystems")
async def nvmf_get_subsystems(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    nqn = p.string("nqn", None)
    _no_target_name(p)
    p.done()
    target = cp.target
    subsystems = [target.discovery, *target.subsystems.values()]
    if nqn is not None:
        subsystems = [s for s in subsystems if s.nqn == nqn]
        if not subsystems:
            raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    return [_subsystem_json(target, s) for s in subsystems]


# -- listeners ----------------------------------------------------------------------------------


def _listen_address(p: Params, key: str = "listen_address") -> tuple[str, int]:
    a = p.nested(key)
    assert a is not None
    _check_trtype(a)
    adrfam = a.string("adrfam", "ipv4")
    traddr = a.string("traddr")
    trsvcid = a.string("trsvcid")
    a.done()
    try:
        ip = ipaddress.ip_address(traddr)
    except ValueError:
        raise RpcError(
            INVALID_PARAMS, f"{a.name('traddr')}: {traddr!r} is not an IP address"
        ) from None
    if adrfam.lower() not in ("ipv4", "ipv6"):
        raise RpcError(
            INVALID_PARAMS, f"{a.name('adrfam')}: {adrfam!r}: pynvmf serves IPv4 and IPv6"
        )
    if adrfam.lower() != f"ipv{ip.version}":
        raise RpcError(INVALID_PARAMS, f"{a.name('adrfam')}: {adrfam} does not match {traddr}")
    if not trsvcid.isdigit() or not 1 <= int(trsvcid) <= 0xFFFF:
        raise RpcError(INVALID_PARAMS, f"{a.name('trsvcid')}: {trsvcid!r} is not a TCP port")
    return traddr, int(trsvcid)


_LISTENER_NAMES = {"address": "listen_address.traddr", "port": "listen_address.trsvcid"}


@method("nvmf_subsystem_add_listener")
async def nvmf_subsystem_add_listener(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    address, port = _listen_address(p)
    _no_target_name(p)
    secure = p.boolean("secure_channel", False)
    ana_state = p.string("ana_state", None)
    p.refuse_unless("sock_impl", ("posix",), "pynvmf listens with the kernel's sockets")
    p.done()
    state = _ana_state(p, ana_state) if ana_state is not None else None
    subsystem = cp.target.subsystems.get(nqn)
    if secure and subsystem is not None and subsystem.allow_any_host:
        # SPDK's rule: a TLS listener serves hosts that have PSKs, so not "any host".
        raise RpcError(
            INTERNAL_ERROR, "Cannot establish secure channel, when 'allow_any_host' is set"
        )
    await _apply(
        cp.target.add_listener(nqn, address, port, secure_channel="required" if secure else None),
        {**_LISTENER_NAMES, "secure_channel": "secure_channel"},
    )
    if state is not None and nqn != DISCOVERY_NQN:
        # SPDK's listener option: the state of every ANA group on this listener.
        _sync(lambda: cp.target.set_ana_state(nqn, None, state, address, port), _LISTENER_NAMES)
    return True


def _ana_state(p: Params, name: str) -> AnaState:
    state = ana.parse_state(name)
    if state is None:
        raise RpcError(
            INVALID_PARAMS,
            f"{p.name('ana_state')}: {name!r} is not an ANA state ({', '.join(ana.STATE_NAMES)})",
        )
    return state


@method("nvmf_subsystem_listener_set_ana_state")
async def nvmf_subsystem_listener_set_ana_state(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    address, port = _listen_address(p)
    name = p.string("ana_state")
    anagrpid = p.integer("anagrpid", 0, high=0xFFFFFFFF)
    _no_target_name(p)
    p.done()
    state = _ana_state(p, name)
    _sync(
        lambda: cp.target.set_ana_state(nqn, anagrpid or None, state, address, port),
        _LISTENER_NAMES,
    )
    return True


@method("nvmf_subsystem_remove_listener")
async def nvmf_subsystem_remove_listener(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    address, port = _listen_address(p)
    _no_target_name(p)
    p.ignore("secure_channel", "ana_state", "sock_impl")  # SPDK's decoder takes them here too
    p.done()
    await _apply(cp.target.remove_listener(nqn, address, port), _LISTENER_NAMES)
    return True


@method("nvmf_subsystem_get_listeners")
async def nvmf_subsystem_get_listeners(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    nqn = p.string("nqn")
    _no_target_name(p)
    p.done()
    if nqn != DISCOVERY_NQN and nqn not in cp.target.subsystems:
        raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    if nqn == DISCOVERY_NQN:
        return [{"address": trid(port)} for port in listeners_of(cp.target, nqn)]
    groups = cp.target.subsystems[nqn].ana.groups
    return [
        {
            "address": trid(port),
            "ana_states": [
                {"ana_group": grpid, "ana_state": ana.NAMES[group.state_on(port)]}
                for grpid, group in sorted(groups.items())
            ],
        }
        for port in listeners_of(cp.target, nqn)
    ]


# -- namespaces ---------------------------------------------------------------------------------

_NS_NAMES = {
    "nsid": "namespace.nsid",
    "device": "namespace.bdev_name",
    "uuid": "namespace.uuid",
    "nguid": "namespace.nguid",
    "eui64": "namespace.eui64",
    "ptpl_file": "namespace.ptpl_file",
    "anagrpid": "namespace.anagrpid",
}


@method("nvmf_subsystem_add_ns")
async def nvmf_subsystem_add_ns(cp: ControlPlane, p: Params) -> int:
    nqn = p.string("nqn")
    _no_target_name(p)
    ns = p.nested("namespace")
    assert ns is not None
    bdev_name = ns.string("bdev_name")
    nsid = ns.integer("nsid", 0, high=0xFFFFFFFF)
    ns_uuid = ns.uuid_value("uuid")
    nguid = ns.hex_bytes("nguid", 16)
    eui64 = ns.hex_bytes("eui64", 8)
    ptpl_file = ns.string("ptpl_file", None)
    anagrpid = ns.integer("anagrpid", 0, high=0xFFFFFFFF)
    ns.refuse_unless("no_auto_visible", (False,), "pynvmf shows every namespace to every host")
    ns.ignore("hide_metadata")  # pynvmf's namespaces have no metadata to hide
    ns.done()
    p.done()
    added = _sync(
        lambda: cp.target.add_namespace(
            nqn,
            bdev_name,
            nsid=nsid or None,
            ns_uuid=ns_uuid,
            nguid=nguid,
            eui64=eui64,
            ptpl_file=None if ptpl_file is None else Path(ptpl_file),
            anagrpid=anagrpid or None,
        ),
        _NS_NAMES,
    )
    return added.nsid


@method("nvmf_subsystem_remove_ns")
async def nvmf_subsystem_remove_ns(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    nsid = p.integer("nsid", high=0xFFFFFFFF)
    _no_target_name(p)
    p.done()
    await _apply(cp.target.remove_namespace(nqn, nsid), {})
    return True


# -- hosts ------------------------------------------------------------------------------------


@method("nvmf_subsystem_add_host")
async def nvmf_subsystem_add_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    host = p.string("host")
    _no_target_name(p)
    psk = p.string("psk", None)
    key = p.string("dhchap_key", None)
    ctrl_key = p.string("dhchap_ctrlr_key", None)
    p.done()
    target = cp.target
    if psk is not None and psk not in target.keyring:
        # SPDK takes keyring names only (keyring_file_add_key first): a key or a path here
        # would end up in logs and saved configurations.
        raise RpcError(INVALID_PARAMS, f"psk: no key named {psk!r} in the keyring")

    def change() -> None:
        auth = target.auth_config(key, ctrl_key) if key is not None else None
        if auth is None and ctrl_key is not None:
            raise ChangeError("dhchap_key", "a controller key needs a host key")
        target.add_host(nqn, host, auth=auth, psk=psk)

    _sync(change, {"hostnqn": "host"})
    return True


@method("nvmf_subsystem_set_keys")
async def nvmf_subsystem_set_keys(cp: ControlPlane, p: Params) -> bool:
    """New DH-HMAC-CHAP keys for a host (none: it no longer authenticates); queues already
    authenticated stay so, the next (re-)authentication uses them."""
    nqn = p.string("nqn")
    host = p.string("host")
    _no_target_name(p)
    key = p.string("dhchap_key", None)
    ctrl_key = p.string("dhchap_ctrlr_key", None)
    p.done()
    target = cp.target

    def change() -> None:
        if key is None and ctrl_key is not None:
            raise ChangeError("dhchap_key", "a controller key needs a host key")
        auth = target.auth_config(key, ctrl_key) if key is not None else None
        target.set_host_keys(nqn, host, auth)

    _sync(change, {})
    return True


# -- keyring ------------------------------------------------------------------------------------


@method("keyring_file_add_key")
async def keyring_file_add_key(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    path = p.string("path")
    p.done()
    _sync(lambda: cp.target.add_key(name, path), {})
    return True


@method("keyring_file_remove_key")
async def keyring_file_remove_key(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    p.done()
    _sync(lambda: cp.target.remove_key(name), {})
    return True


@method("keyring_get_keys")
async def keyring_get_keys(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    p.done()
    target = cp.target

    def users(name: str) -> int:
        count = 0
        for s in target.subsystems.values():
            count += sum(name in (a.host_key_name, a.ctrl_key_name) for a in s.host_auth.values())
            count += list(s.host_psk_names.values()).count(name)
        return count

    return [
        {
            "name": e.name,
            "module": "keyring_file",
            "removed": False,
            "probed": True,
            # The keyring's reference and one per host that uses the key, as SPDK counts.
            "refcnt": 1 + users(e.name),
            "path": e.path,
        }
        for e in target.keyring.values()
    ]


@method("nvmf_subsystem_remove_host")
async def nvmf_subsystem_remove_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    host = p.string("host")
    _no_target_name(p)
    p.done()
    _sync(lambda: cp.target.remove_host(nqn, host), {"hostnqn": "host"})
    return True


@method("nvmf_subsystem_allow_any_host")
async def nvmf_subsystem_allow_any_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    allow = p.boolean("allow_any_host")
    _no_target_name(p)
    p.done()
    _sync(lambda: cp.target.set_allow_any_host(nqn, allow), {})
    return True


# -- what is connected --------------------------------------------------------------------------


def _subsystem_or_discovery(cp: ControlPlane, p: Params) -> Subsystem:
    nqn = p.string("nqn")
    _no_target_name(p)
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
    _no_target_name(p)
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


# -- configuration --------------------------------------------------------------------------------
