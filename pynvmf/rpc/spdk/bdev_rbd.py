"""SPDK's bdev_rbd methods: Ceph RBD images as block devices (pynvmf.block.rbd)."""

from __future__ import annotations

import asyncio
from typing import Any

from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.bdev import free_name, register_bdev
from pynvmf.rpc.spdk.calls import apply_change
from pynvmf.target import devices as D

table = MethodTable()
method = table.register


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
    name = name or free_name(target, "Ceph")
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
    return await register_bdev(target, name, device, dev_uuid)


@method("bdev_rbd_delete")
async def bdev_rbd_delete(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    p.done()
    entry = cp.target.block_devices.get(name)
    if entry is None or entry.kind != D.RBD:
        raise RpcError(INVALID_PARAMS, f"name: no rbd bdev named {name!r}")
    await apply_change(cp.target.remove_block_device(name), {})
    return True


@method("bdev_rbd_resize")
async def bdev_rbd_resize(cp: ControlPlane, p: Params) -> bool:
    """SPDK's shape: `new_size` in MiB, never smaller than the bdev (the image is resized
    through librbd; the namespaces on it and their hosts see the new size). A smaller size
    is refused naming `new_size`, as SPDK does; pynvmf_bdev_resize with force cuts it."""
    name = p.string("name")
    new_size = p.integer("new_size", low=1)
    p.done()
    entry = cp.target.block_devices.get(name)
    if entry is None or entry.kind != D.RBD:
        raise RpcError(INVALID_PARAMS, f"name: no rbd bdev named {name!r}")
    await apply_change(
        cp.target.resize_block_device(name, new_size << 20),
        {"size": "new_size", "force": "new_size"},
    )
    return True
