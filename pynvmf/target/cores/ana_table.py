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

Layout: one memfd, mapped MAP_SHARED by the main process and by every worker, one page
per subsystem slot:
- byte 0: the subsystem's AnaGroups.any_blocked (while it is 0, a command pays this one
  read, where in one process it pays one attribute test);
- from byte 2, `ROWS` rows of ANAGRPMAX + 1 16-bit entries, one row per listener with
  queues on workers: entry g is the status a command to a namespace of ANA group g gets
  through that listener (0: served; entry 0 is unused, group IDs start at 1).
A page of its own per subsystem lets a worker map just that page as its AnaView, whose
`any_blocked` is then a property with a C getter (`operator.itemgetter(0)` of the
mapping): about 450 instructions per test, where a Python-level property reading a
memoryview costs about 1,040 and AnaGroups' attribute about 45 (callgrind, CPython
3.11, 200,000 tests in a loop, minus the loop alone; docs/cores.md).

The main process is the only writer. Each entry is one aligned store, which a reader
sees whole; the rows are written before the flag, so a reader that sees a subsystem's
flag set also sees its rows as they were when it was set. What the workers read is the
main process's decision itself, not a second implementation of it: a row holds
path_status() for each group.
"""

from __future__ import annotations

import mmap
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.target.ana import ANAGRPMAX

if TYPE_CHECKING:
    from pynvmf.target.port import Port
    from pynvmf.target.subsystem import Subsystem

PAGE = mmap.PAGESIZE
SUBSYSTEMS = 1024
ENTRIES = ANAGRPMAX + 1
_FIRST_ROW = 1  # in 16-bit entries: bytes 0-1 are the flag
ROWS = (PAGE // 2 - _FIRST_ROW) // ENTRIES  # 15 listeners per subsystem with 4 KiB pages
SIZE = SUBSYSTEMS * PAGE


def _entry(row: int, grpid: int) -> int:
    return _FIRST_ROW + row * ENTRIES + grpid


@dataclass(eq=False)
class _Placed:
    subsystem: Subsystem
    slot: int
    entries: memoryview  # the page as 16-bit entries
    flags: memoryview  # the page as bytes
    rows: dict[Port, int] = field(default_factory=dict)


class AnaTable:
    """The main process's side: it places subsystems and their listeners in the table
    and writes their statuses whenever their AnaGroups change."""

    def __init__(self, listening: Callable[[Port], bool] = lambda _port: True) -> None:
        # Whether a listener is still open: the rows of closed ones are taken again.
        self._listening = listening
        fd = os.memfd_create("pynvmf-ana", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._bytes = memoryview(self._map)
        self._placed: dict[str, _Placed] = {}
        self._free = list(range(SUBSYSTEMS - 1, -1, -1))

    def fileno(self) -> int:
        """The memfd, for a worker (which maps its subsystems' pages: AnaView)."""
        return self._fd

    def close(self) -> None:
        for nqn in list(self._placed):
            self.release(nqn)
        if self._fd >= 0:
            self._bytes.release()
            self._map.close()
            os.close(self._fd)
            self._fd = -1

    def slot(self, subsystem: Subsystem) -> int | None:
        """The page of `subsystem` (placed, its flag written, on first use); None if
        every page is taken (its queues are then served by the main process)."""
        placed = self._place(subsystem)
        return None if placed is None else placed.slot

    def row(self, subsystem: Subsystem, port: Port) -> int | None:
        """The row of `subsystem` on listener `port`, the current statuses in it; None if
        the table has no room (served by the main process)."""
        placed = self._place(subsystem)
        if placed is None:
            return None
        row = placed.rows.get(port)
        if row is None:
            if len(placed.rows) >= ROWS:
                # Rows of listeners that closed (their queues went with them).
                for gone in [p for p in placed.rows if not self._listening(p)]:
                    del placed.rows[gone]
            free = sorted(set(range(ROWS)) - set(placed.rows.values()))
            if not free:
                return None
            row = placed.rows[port] = free[0]
            self._write(placed)
        return row

    def release(self, nqn: str) -> None:
        """Subsystem `nqn` is gone (and the workers dropped it): its page is zeroed and
        free."""
        placed = self._placed.pop(nqn, None)
        if placed is None:
            return
        placed.subsystem.ana.on_index = None
        placed.flags[:] = bytes(PAGE)
        placed.entries.release()
        placed.flags.release()
        self._free.append(placed.slot)

    def _place(self, subsystem: Subsystem) -> _Placed | None:
        placed = self._placed.get(subsystem.nqn)
        if placed is not None and placed.subsystem is not subsystem:
            # A subsystem of that NQN removed and added again: the new one starts afresh.
            self.release(subsystem.nqn)
            placed = None
        if placed is None:
            if not self._free:
                return None
            slot = self._free.pop()
            page = self._bytes[slot * PAGE : (slot + 1) * PAGE]
            placed = _Placed(subsystem, slot, page.cast("H"), page)
            self._placed[subsystem.nqn] = placed
            subsystem.ana.on_index = lambda _ana, p=placed: self._write(p)
            self._write(placed)
        return placed

    def _write(self, placed: _Placed) -> None:
        """The statuses of `placed`'s subsystem as its AnaGroups now decide them: the rows,
        then the flag (see the module's docstring)."""
        ana = placed.subsystem.ana
        entries = placed.entries
        for port, row in placed.rows.items():
            for grpid in range(1, ENTRIES):
                status = ana.path_status(port, grpid)
                i = _entry(row, grpid)
                if entries[i] != status:
                    entries[i] = status
        placed.flags[0] = 1 if ana.any_blocked else 0


class AnaView(mmap.mmap):
    """A worker's side, in place of a subsystem's AnaGroups for its I/O queues: its page
    of the table, with the two things IoHandler (and a fused Compare and Write) read of
    an AnaGroups."""

    # Byte 0 of the page, read by C code: no Python frame per command.
    any_blocked = property(operator.itemgetter(0))

    rows: dict[int, int]  # listener (portid) -> row
    _entries: memoryview

    @classmethod
    def open(cls, fd: int, slot: int) -> AnaView:
        """The page of subsystem slot `slot` of the table behind memfd `fd` (which stays
        the caller's: the mapping holds the memory)."""
        view = cls(fd, PAGE, flags=mmap.MAP_SHARED, offset=slot * PAGE)
        view.rows = {}
        view._entries = memoryview(view).cast("H")
        return view

    def path_status(self, port: Port, grpid: int) -> int:
        row = self.rows.get(port.portid)
        if row is None or not 0 < grpid < ENTRIES:
            return 0
        return self._entries[_entry(row, grpid)]


__all__ = ["AnaTable", "AnaView"]
