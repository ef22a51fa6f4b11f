"""Asymmetric Namespace Access: a subsystem's ANA groups and their state on each listener.

Every namespace belongs to one ANA group (ANAGRPID, group 1 unless configured). A
group's state is kept per listener (port), as nvmet keeps it per port and SPDK per
subsystem listener: a host reaching the subsystem through a port sees the states of that
port, in the ANA log page and in the statuses its I/O gets. A group has a state that
applies on every listener (optimized unless configured) and may have a different one on
some listeners.

This module is the model: which state applies where, the change counts, and the log page
a controller on a port reads. What a change means for connected hosts (which
controllers get the ANA Change event) is decided by Target.set_ana_state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.spec.logpages import AnaGroupDescriptor, AnaLog, AnaState
from pynvmf.spec.status import Status

if TYPE_CHECKING:
    from pynvmf.target.port import Port

DEFAULT_GROUP = 1
# ANAGRPMAX and NANAGRPID: group IDs 1..128 may be used (nvmet's limit, too). With MNAN
# namespaces the whole log (16 + 128 * 32 + MNAN * 4 bytes) must fit MDTS, or the Linux
# host leaves ANA off.
ANAGRPMAX = 128
ANATT = 10  # ANA Transition Time, seconds: how long a group may stay in "change"
# ANACAP: every state can be reported (bits 0-4), and a namespace's ANAGRPID does not
# change while it is attached (bit 6): it is fixed when the namespace is added.
ANACAP = 0x1F | 1 << 6

STATE_NAMES: dict[str, AnaState] = {
    "optimized": AnaState.OPTIMIZED,
    "non_optimized": AnaState.NON_OPTIMIZED,
    "inaccessible": AnaState.INACCESSIBLE,
    "persistent_loss": AnaState.PERSISTENT_LOSS,
    "change": AnaState.CHANGE,
}
NAMES: dict[AnaState, str] = {state: name for name, state in STATE_NAMES.items()}

# The status an I/O command gets through a path in a state that does not serve it (no
# DNR: the host retries it on another path). Optimized and non-optimized paths serve all.
PATH_STATUS: dict[AnaState, int] = {
    AnaState.INACCESSIBLE: Status.ANA_INACCESSIBLE,
    AnaState.PERSISTENT_LOSS: Status.ANA_PERSISTENT_LOSS,
    AnaState.CHANGE: Status.ANA_TRANSITION,
}


def parse_state(value: object) -> AnaState | None:
    """An ANA state from its SPDK name (case insensitive, "non-optimized" too), or None."""
    if isinstance(value, AnaState):
        return value
    if not isinstance(value, str):
        return None
    return STATE_NAMES.get(value.lower().replace("-", "_"))


@dataclass
class AnaGroup:
    grpid: int
    # The state on listeners without one of their own.
    state: AnaState = AnaState.OPTIMIZED
    on_port: dict[Port, AnaState] = field(default_factory=dict)
    # The subsystem's change count when this group last changed (the descriptor's CHGCNT).
    chgcnt: int = 0

    def state_on(self, port: Port) -> AnaState:
        return self.on_port.get(port, self.state)


@dataclass
class AnaGroups:
    """The ANA groups of one subsystem."""

    groups: dict[int, AnaGroup] = field(default_factory=dict)
    # The ANA log's change count: one more on every change of what some log page says.
    chgcnt: int = 0
    # For the I/O path: whether some group is unusable through some port (while none
    # is, a command pays one attribute test); port -> {group: path status} for the ports
    # with states of their own, and the statuses on every other port. An int (0/1),
    # not a bool: a worker's AnaView reads it as a byte of shared memory, and the
    # compiled I/O path checks the annotated type of what it reads.
    any_blocked: int = 0
    blocked: dict[Port, dict[int, int]] = field(default_factory=dict)
    default_blocked: dict[int, int] = field(default_factory=dict)
    # Called after every change of what path_status answers (the I/O queues of worker
    # processes read a copy: cores/ana_table.py), before any event about it is raised.
    on_index: Callable[[AnaGroups], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.groups.setdefault(DEFAULT_GROUP, AnaGroup(DEFAULT_GROUP))

    def group(self, grpid: int) -> AnaGroup | None:
        return self.groups.get(grpid)

    def add(self, grpid: int, state: AnaState = AnaState.OPTIMIZED) -> AnaGroup:
        group = self.groups.get(grpid)
        if group is None:
            group = self.groups[grpid] = AnaGroup(grpid, state)
            self.changed([group])
        return group

    def changed(self, groups: Iterable[AnaGroup]) -> None:
        """What the log says changed: a new change count, on the groups given too."""
        self.chgcnt += 1
        for group in groups:
            group.chgcnt = self.chgcnt
        self._index()

    def forget_port(self, port: Port) -> None:
        """A listener went away: its own states go with it."""
        for group in self.groups.values():
            group.on_port.pop(port, None)
        self._index()

    def _index(self) -> None:
        groups = self.groups.values()
        defaults = {g.grpid: PATH_STATUS[g.state] for g in groups if g.state in PATH_STATUS}
        blocked: dict[Port, dict[int, int]] = {}
        for port in {port for g in groups for port in g.on_port}:
            statuses = dict(defaults)
            for g in groups:
                state = g.on_port.get(port)
                if state in PATH_STATUS:
                    statuses[g.grpid] = PATH_STATUS[state]
                elif state is not None:
                    statuses.pop(g.grpid, None)
            blocked[port] = statuses
        self.blocked = blocked
        self.default_blocked = defaults
        self.any_blocked = int(bool(defaults) or any(blocked.values()))
        if self.on_index is not None:
            self.on_index(self)

    def path_status(self, port: Port, grpid: int) -> int:
        """The status an I/O command to a namespace of group `grpid` gets through `port`
        (0: it is served)."""
        statuses = self.blocked.get(port, self.default_blocked)
        return statuses.get(grpid, 0)

    def log(self, port: Port, members: dict[int, list[int]]) -> AnaLog:
        """The ANA log page as a controller on `port` reads it; `members` lists each
        group's NSIDs, ascending (the Linux host walks them in step with its own)."""
        return AnaLog(
            self.chgcnt,
            [
                AnaGroupDescriptor(grpid, g.state_on(port), g.chgcnt, members.get(grpid, []))
                for grpid, g in sorted(self.groups.items())
            ],
        )
