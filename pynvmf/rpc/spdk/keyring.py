"""SPDK's keyring methods: keys by name, read from files (keyring_file_*)."""

from __future__ import annotations

from typing import Any

from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.calls import change_now

table = MethodTable()
method = table.register


@method("keyring_file_add_key")
async def keyring_file_add_key(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    path = p.string("path")
    p.done()
    change_now(lambda: cp.target.add_key(name, path), {})
    return True


@method("keyring_file_remove_key")
async def keyring_file_remove_key(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    p.done()
    change_now(lambda: cp.target.remove_key(name), {})
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
