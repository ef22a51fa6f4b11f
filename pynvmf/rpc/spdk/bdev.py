"""SPDK's block device methods for memory and file devices (bdev_malloc_*, bdev_aio_*),
and those for every block device (bdev_get_bdevs, bdev_wait_for_examine).
"""

from __future__ import annotations

import logging
import uuid as uuid_mod
from typing import Any

from pynvmf.block.file import FileDevice
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params, change_error
from pynvmf.rpc.spdk.calls import apply_change
from pynvmf.target import devices as D
from pynvmf.target import qos
from pynvmf.target.changes import ChangeError
from pynvmf.target.devices import NamedDevice
from pynvmf.target.qos import QosLimits
from pynvmf.target.target import Target

log = logging.getLogger(__name__)

table = MethodTable()
method = table.register


def free_name(target: Target, prefix: str) -> str:
    n = 0
    while f"{prefix}{n}" in target.block_devices:
        n += 1
    return f"{prefix}{n}"


async def register_bdev(
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
    name = name or free_name(target, "Malloc")
    if name in target.block_devices:
        raise RpcError(INVALID_PARAMS, f"name: a bdev named {name!r} exists")
    try:
        device = target.memory_device(num_blocks * block_size, block_size)
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, f"block_size: {exc}") from exc
    except OSError as exc:
        raise RpcError(INVALID_PARAMS, f"num_blocks: {exc.strerror}") from exc
    return await register_bdev(target, name, device, dev_uuid)


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
    await apply_change(cp.target.remove_block_device(name), {})
    return True


@method("bdev_malloc_delete")
async def bdev_malloc_delete(cp: ControlPlane, p: Params) -> bool:
    return await _delete_bdev(cp, p, D.MEMORY)


@method("bdev_aio_delete")
async def bdev_aio_delete(cp: ControlPlane, p: Params) -> bool:
    return await _delete_bdev(cp, p, D.FILE)


@method("bdev_aio_rescan")
async def bdev_aio_rescan(cp: ControlPlane, p: Params) -> bool:
    """The file or block device grew, or was cut outside: its bdev, and the namespaces on
    it, take the size (hosts are told; a cut is followed as a forced shrink is)."""
    name = p.string("name")
    p.done()
    entry = cp.target.block_devices.get(name)
    if entry is None or entry.kind != D.FILE:
        raise RpcError(INVALID_PARAMS, f"name: no aio bdev named {name!r}")
    await apply_change(cp.target.resize_block_device(name), {})
    return True


@method("bdev_set_qos_limit")
async def bdev_set_qos_limit(cp: ControlPlane, p: Params) -> bool:
    """A bdev's rate limits, as SPDK's: 0 removes one, one left out keeps its value; an
    IOPS limit that is not a multiple of 1,000 is rounded up to one, as SPDK does (with
    a line in the log). The namespace on it is paced from the next command on."""
    name = p.string("name")
    given = {key: p.integer(key, None) for key in qos.LIMIT_NAMES}
    p.done()
    given = {key: value for key, value in given.items() if value is not None}
    if not given:
        raise RpcError(INVALID_PARAMS, f"{', '.join(qos.LIMIT_NAMES)}: no rate limits specified")
    limits = await apply_change(cp.target.set_qos_limits(name, given), {})
    rounded = [key for key, value in given.items() if value and value != limits.as_dict()[key]]
    for key in rounded:
        log.warning(
            "bdev %s: %s %d is not a multiple of %d: rounded up to %d",
            name,
            key,
            given[key],
            qos.IOS_PER_SEC_STEP,
            limits.as_dict()[key],
        )
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
    limits = entry.qos.limits if entry.qos is not None else QosLimits()
    out["assigned_rate_limits"] = limits.as_dict()
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


@method("bdev_wait_for_examine")
async def bdev_wait_for_examine(cp: ControlPlane, p: Params) -> bool:
    p.done()
    return True  # pynvmf's block devices are ready when created
