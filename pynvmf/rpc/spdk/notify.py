"""SPDK's notification methods (notify_get_types, notify_get_notifications): the
target's notification log (pynvmf.target.notifications), read by a client that polls.
"""

from __future__ import annotations

from typing import Any

from pynvmf.rpc.methods import ControlPlane, MethodTable, Params

table = MethodTable()
method = table.register


@method("notify_get_types")
async def notify_get_types(cp: ControlPlane, p: Params) -> list[str]:
    p.done()
    return list(cp.target.notifications.types)


@method("notify_get_notifications")
async def notify_get_notifications(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    first_id = p.integer("id", 0)
    max_count = p.integer("max", None)
    p.done()
    return [
        {"type": n.type, "ctx": n.ctx, "id": n.id}
        for n in cp.target.notifications.read(first_id, max_count)
    ]
