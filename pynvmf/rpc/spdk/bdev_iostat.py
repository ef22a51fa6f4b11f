"""SPDK's bdev_get_iostat: the I/O each block device did for the hosts, in v25.09's
shape; the counts are target/device_io.py's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pynvmf.rpc.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.target.device_io import DeviceIo
from pynvmf.target.poll_groups import TICK_RATE

table = MethodTable()
method = table.register

# SPDK's answers to a bdev it cannot open, and to per_channel without a name (-errno).
ENODEV = 19
EINVAL = 22
RESET_MODES = ("all", "maxmin", "none")


def _stat_json(name: str, io: DeviceIo) -> dict[str, Any]:
    # SPDK's order: the counts, then the latency ticks (DeviceIo's), then the failed I/O
    # by bdev status, of which pynvmf's devices have none (a command's NVMe status comes
    # from the target, before or instead of the device).
    return {"name": name, **dataclasses.asdict(io), "io_error": {}}


@method("bdev_get_iostat")
async def bdev_get_iostat(cp: ControlPlane, p: Params) -> dict[str, Any]:
    name = p.string("name", None)
    per_channel = p.boolean("per_channel", False)
    reset_mode = p.string("reset_mode", "none")
    p.done()
    if reset_mode not in RESET_MODES:
        raise RpcError(INTERNAL_ERROR, "spdk_json_decode_object failed")
    if per_channel and name is None:
        raise RpcError(-EINVAL, "Invalid argument")
    target = cp.target
    entries = list(target.block_devices.values())
    if name is not None:
        entries = [e for e in entries if name in (e.name, str(e.uuid) if e.uuid else None)]
        if not entries:
            raise RpcError(-ENODEV, "No such device")
    if per_channel:
        raise RpcError(
            INVALID_PARAMS, "per_channel: pynvmf counts a block device's I/O, not its threads'"
        )
    if reset_mode == "all":
        raise RpcError(INVALID_PARAMS, "reset_mode: 'all': pynvmf's counters never go backwards")
    # "maxmin": the latency maxima and minima start again once answered, as SPDK's.
    reset = reset_mode == "maxmin"
    return {
        "tick_rate": TICK_RATE,
        "ticks": time.monotonic_ns(),
        "bdevs": [
            _stat_json(e.name, target.device_io_of(e.name, reset_extremes=reset)) for e in entries
        ],
    }
