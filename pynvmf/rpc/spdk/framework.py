"""SPDK's application methods (rpc_get_methods, spdk_get_version, framework_*,
spdk_kill_instance): what the process is and which configuration it holds.
"""

from __future__ import annotations

from typing import Any

from pynvmf import __version__
from pynvmf.config.spdk import (
    CONFIG_SUBSYSTEMS,
    bdev_config,
    keyring_config,
    nvmf_config,
)
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params

table = MethodTable()
method = table.register


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
