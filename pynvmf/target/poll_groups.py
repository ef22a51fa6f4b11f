"""Where the target's queues are served, as SPDK's statistics calls name it: a poll group
is a process (the main process, and each worker of `pynvmf target --cores N`), named
as SPDK names its poll groups' threads (nvmf_tgt_poll_group_000, ...).

Every figure is a count the target keeps already (queues connected, commands counted
per host), read when asked: nothing here runs per command.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from pynvmf.target.command_counts import OTHER_OPCODE, CommandCounts, Report

# The ticks of SPDK's statistics calls (tick_rate ticks a second): pynvmf counts nanoseconds.
TICK_RATE = 1_000_000_000


def group_name(index: int) -> str:
    """The name of poll group `index`: 0 the main process, then the workers from 1."""
    return f"nvmf_tgt_poll_group_{index:03d}"


@dataclass
class PollGroup:
    """One process's queues and counts (SPDK's spdk_nvmf_poll_group_stat)."""

    name: str
    pid: int
    admin_qpairs: int  # admin queues connected since it started
    io_qpairs: int  # I/O queues connected since it started
    current_admin_qpairs: int
    current_io_qpairs: int
    completed_nvme_io: int  # I/O commands completed
    started: float  # time.monotonic() when the process started


def completed_commands(counts: CommandCounts) -> int:
    """The I/O commands `counts` counted, of every opcode, host and namespace."""
    total = 0
    for host in counts.hosts.values():
        for per_ns in host.namespaces.values():
            total += sum(per_ns.as_list()[: OTHER_OPCODE + 1])
    return total


def report_commands(report: Report) -> int:
    """The I/O commands in a worker's report of command counts (CommandCounts.take)."""
    # An entry: subsystem NQN, host NQN, {nsid: counts}, then errors and histograms.
    return sum(sum(counts[: OTHER_OPCODE + 1]) for entry in report for counts in entry[2].values())


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_time_ns(pid: int) -> int | None:
    """The CPU time (user and system) process `pid` has used, from /proc; None if it is
    gone."""
    if pid == os.getpid():
        times = os.times()
        return int((times.user + times.system) * 1e9)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The fields after the command name (which may hold spaces), from state on.
    fields = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) * 1_000_000_000 // _CLOCK_TICKS


def busy_idle_ns(group: PollGroup) -> tuple[int, int]:
    """How long the process of `group` has run on a CPU since it started, and how long
    it has not (its event loop waiting, or the process waiting for a CPU): SPDK's busy
    and idle ticks of the thread, from the operating system's accounting."""
    cpu = cpu_time_ns(group.pid) if group.pid else None
    if cpu is None:
        return 0, 0
    elapsed = int((time.monotonic() - group.started) * 1e9)
    return cpu, max(0, elapsed - cpu)
