"""SPDK's thread_get_stats in v25.09's shape: one thread per poll group, that is per
process (the main process, and each worker of `--cores N`; target/poll_groups.py).

busy is the CPU time the process has used since it started (user and system, from the
operating system's accounting), idle the rest of the time it has existed: an asyncio
event loop that waits for its sockets is idle as SPDK's reactor is between polls. A
process that waits for a CPU counts as idle. pynvmf has no pollers: their counts are 0.
"""

from __future__ import annotations

import os
from typing import Any

from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.target.poll_groups import TICK_RATE, PollGroup, busy_idle_ns

table = MethodTable()
method = table.register


def _cpumask(pid: int) -> str:
    """The CPUs process `pid` may run on, as SPDK writes a mask (hexadecimal, no 0x)."""
    try:
        cpus = os.sched_getaffinity(pid) if pid else set()
    except OSError:
        cpus = set()
    return format(sum(1 << cpu for cpu in cpus), "x")


def _thread_json(index: int, group: PollGroup) -> dict[str, Any]:
    busy, idle = busy_idle_ns(group)
    return {
        "name": group.name,
        "id": index + 1,  # SPDK's thread ids start from 1
        "cpumask": _cpumask(group.pid),
        "busy": busy,
        "idle": idle,
        "active_pollers_count": 0,
        "timed_pollers_count": 0,
        "paused_pollers_count": 0,
    }


@method("thread_get_stats")
async def thread_get_stats(cp: ControlPlane, p: Params) -> dict[str, Any]:
    p.done()
    groups = cp.target.poll_groups()
    return {
        "tick_rate": TICK_RATE,
        "threads": [_thread_json(i, g) for i, g in enumerate(groups)],
    }
