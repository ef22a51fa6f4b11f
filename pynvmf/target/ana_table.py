"""The ANA path statuses of `pynvmf target --cores N`, in memory the workers share.

An I/O command through a path whose ANA state does not serve it gets a path-related
status (ana.PATH_STATUS) before anything moves. The main process decides those
statuses (ana.AnaGroups.path_status, from the groups' states on each listener); a
worker must apply a change from the moment `Target.set_ana_state` returns, before the
ANA Change event reaches any host, or a host that read the new log page could have a
command accepted under the old state (a gateway that lost its lease would go on
writing). A message to every worker would make set_ana_state wait for answers; this
table needs none: the main process writes the statuses here inside AnaGroups' own
index update (which runs before any event is raised), and a worker reads them with
each command.

Layout: one memfd of 16-bit entries, mapped MAP_SHARED by the main process and every
worker.
- `SUBSYSTEMS` flags, one per subsystem slot: AnaGroups.any_blocked of that subsystem
  (while it is 0, a command pays this one read, as in one process it pays one
  attribute test);
- `ROWS` rows of ANAGRPMAX + 1 entries, one row per (subsystem, listener) with queues
  on workers: entry g is the status a command to a namespace of ANA group g gets
  through that listener (0: served).
The main process is the only writer. Each entry is one aligned 2-byte store, which a
reader sees whole; the rows are written before the flag, so a reader that sees a
subsystem's flag set also sees its rows as they were when it was set.

What the workers read is thus the main process's decision itself, not a second
implementation of it: the row holds path_status() for each group.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.target.ana import ANAGRPMAX

if TYPE_CHECKING:
    from pynvmf.target.server import Port
    from pynvmf.target.subsystem import Subsystem

SUBSYSTEMS = 1024
ROWS = 4096
ENTRIES = ANAGRPMAX + 1  # entry 0 of a row is unused: group IDs start at 1
_ENTRY = 2  # bytes
SIZE = (SUBSYSTEMS + ROWS * ENTRIES) * _ENTRY


def _row_base(row: int) -> int:
    return SUBSYSTEMS + row * ENTRIES


class _Mapping:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map = mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED)
        self.view = memoryview(self.map).cast("H")

    def close(self) -> None:
        self.view.release()
        self.map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(eq=False)
class _Entry:
    subsystem: Subsystem
    slot: int
    rows: dict[Port, int] = field(default_factory=dict)


class AnaTable:
    """The main process's side: it places subsystems and listeners in the table and
    writes their statuses whenever their AnaGroups change."""

    def __init__(self) -> None:
        fd = os.memfd_create("pynvmf-ana", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._mapping = _Mapping(fd)
        self._entries: dict[str, _Entry] = {}
        self._free_slots = list(range(SUBSYSTEMS - 1, -1, -1))
        self._free_rows = list(range(ROWS - 1, -1, -1))

    def fileno(self) -> int:
        """The memfd, for a worker (which maps it with AnaView.open)."""
        return self._mapping.fd

    def close(self) -> None:
        for entry in self._entries.values():
            entry.subsystem.ana.on_index = None
        self._entries.clear()
        self._mapping.close()

    def slot(self, subsystem: Subsystem) -> int | None:
        """The flag slot of `subsystem` (placed, and its flag written, on first use);
        None if the table is full (its queues are then served by the main process)."""
        entry = self._entry(subsystem)
        return None if entry is None else entry.slot

    def row(self, subsystem: Subsystem, port: Port) -> int | None:
        """The row of `subsystem` on listener `port`, with the current statuses in it;
        None if the table is full."""
        entry = self._entry(subsystem)
        if entry is None:
            return None
        row = entry.rows.get(port)
        if row is None:
            if not self._free_rows:
                return None
            row = entry.rows[port] = self._free_rows.pop()
            self._write(entry)
        return row

    def release(self, nqn: str) -> None:
        """Subsystem `nqn` is gone (and the workers dropped it): its places are free."""
        entry = self._entries.pop(nqn, None)
        if entry is None:
            return
        if entry.subsystem.ana.on_index is not None:
            entry.subsystem.ana.on_index = None
        view = self._mapping.view
        for row in entry.rows.values():
            base = _row_base(row)
            for i in range(base, base + ENTRIES):
                view[i] = 0
            self._free_rows.append(row)
        view[entry.slot] = 0
        self._free_slots.append(entry.slot)

    def _entry(self, subsystem: Subsystem) -> _Entry | None:
        entry = self._entries.get(subsystem.nqn)
        if entry is not None and entry.subsystem is not subsystem:
            # A subsystem of that NQN removed and added again: the new one starts afresh.
            self.release(subsystem.nqn)
            entry = None
        if entry is None:
            if not self._free_slots:
                return None
            entry = _Entry(subsystem, self._free_slots.pop())
            self._entries[subsystem.nqn] = entry
            subsystem.ana.on_index = lambda _ana, e=entry: self._write(e)
            self._write(entry)
        return entry

    def _write(self, entry: _Entry) -> None:
        """The statuses of `entry`'s subsystem as its AnaGroups now decide them: the rows,
        then the flag (see the module's docstring)."""
        ana = entry.subsystem.ana
        view = self._mapping.view
        for port, row in entry.rows.items():
            base = _row_base(row)
            for grpid in range(1, ENTRIES):
                status = ana.path_status(port, grpid)
                if view[base + grpid] != status:
                    view[base + grpid] = status
        view[entry.slot] = 1 if ana.any_blocked else 0


class AnaView:
    """A worker's side, in place of a subsystem's AnaGroups for its I/O queues: the two
    things IoHandler (and a fused Compare and Write) read of it, from the table."""

    __slots__ = ("_view", "rows", "slot")

    def __init__(self, view: memoryview, slot: int) -> None:
        self._view = view
        self.slot = slot
        self.rows: dict[int, int] = {}  # listener (portid) -> row

    @staticmethod
    def open(fd: int) -> memoryview:
        """The table behind the memfd `fd` (closed: the mapping keeps its own), for the
        AnaViews of a worker."""
        try:
            table = mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        return memoryview(table).cast("H")

    @property
    def any_blocked(self) -> bool:
        return self._view[self.slot] != 0

    def path_status(self, port: Port, grpid: int) -> int:
        row = self.rows.get(port.portid)
        if row is None or not 0 < grpid < ENTRIES:
            return 0
        return self._view[_row_base(row) + grpid]


__all__ = ["AnaTable", "AnaView"]
