"""The ANA table of `--cores N` (pynvmf/target/cores/ana_table.py): what a worker reads through
an AnaView is what the main process's AnaGroups decides, after every kind of change."""

from __future__ import annotations

import random

from pynvmf.spec.logpages import AnaState
from pynvmf.target.cores import ana_table
from pynvmf.target.cores.ana_table import AnaTable, AnaView
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Subsystem

STATES = list(AnaState)


def _check(sub: Subsystem, view: AnaView, ports: list[Port]) -> None:
    assert bool(view.any_blocked) == sub.ana.any_blocked
    for port in ports:
        for grpid in range(1, ana_table.ENTRIES):
            assert view.path_status(port, grpid) == sub.ana.path_status(port, grpid)


def test_the_view_reads_what_anagroups_decides_after_every_change() -> None:
    rng = random.Random(11)
    table = AnaTable()
    try:
        other = Subsystem("nqn.2024-01.io.pynvmf.test:other")
        sub = Subsystem("nqn.2024-01.io.pynvmf.test:table")
        ports = [Port("127.0.0.1", 4420 + i, portid=i + 1) for i in range(3)]
        assert table.slot(other) is not None
        slot = table.slot(sub)
        assert slot is not None
        view = AnaView.open(table.fileno(), slot)  # a mapping of its own, as a worker's
        for port in ports:
            row = table.row(sub, port)
            assert row is not None
            view.rows[port.portid] = row
        _check(sub, view, ports)
        assert not view.any_blocked
        for _ in range(200):
            kind = rng.randrange(3)
            if kind == 0:
                sub.ana.add(rng.randrange(1, 129), rng.choice(STATES))
                continue  # add() indexes by itself
            group = rng.choice(list(sub.ana.groups.values()))
            if kind == 1:
                group.state = rng.choice(STATES)
                group.on_port.clear()
            else:
                group.on_port[rng.choice(ports)] = rng.choice(STATES)
            sub.ana.changed([group])
            _check(sub, view, ports)
        sub.ana.forget_port(ports[0])
        _check(sub, view, ports)
        # The other subsystem's page saw none of it.
        other_view = AnaView.open(table.fileno(), table.slot(other) or 0)
        assert not other_view.any_blocked and bytes(other_view) == bytes(ana_table.PAGE)
        # Released, the page reads as served, and the hook is gone.
        table.release(sub.nqn)
        assert sub.ana.on_index is None
        assert not view.any_blocked
        assert all(view.path_status(p, g) == 0 for p in ports for g in range(1, 129))
    finally:
        table.close()


def test_a_full_table_places_nothing_more() -> None:
    table = AnaTable()
    try:
        sub = Subsystem("nqn.2024-01.io.pynvmf.test:full")
        rows = [table.row(sub, Port("127.0.0.1", i, portid=i)) for i in range(ana_table.ROWS)]
        assert rows == list(range(ana_table.ROWS))
        assert table.row(sub, Port("127.0.0.1", 99, portid=99)) is None
        table._free = []
        assert table.slot(Subsystem("nqn.2024-01.io.pynvmf.test:other")) is None
        assert table.slot(sub) is not None  # placed already
    finally:
        table.close()


def test_the_rows_of_closed_listeners_are_taken_again() -> None:
    open_ports: set[int] = set(range(ana_table.ROWS))
    table = AnaTable(lambda port: port.portid in open_ports)
    try:
        sub = Subsystem("nqn.2024-01.io.pynvmf.test:churn")
        ports = [Port("127.0.0.1", i, portid=i) for i in range(ana_table.ROWS)]
        for port in ports:
            assert table.row(sub, port) is not None
        sub.ana.add(2, AnaState.INACCESSIBLE)
        open_ports.discard(5)  # listener 5 closed, 99 opened
        open_ports.add(99)
        new = Port("127.0.0.1", 99, portid=99)
        assert table.row(sub, new) == 5
        view = AnaView.open(table.fileno(), table.slot(sub) or 0)
        view.rows[new.portid] = 5
        assert view.path_status(new, 2) == sub.ana.path_status(new, 2) != 0
        assert table.row(sub, ports[5]) is None  # closed, and every row taken
    finally:
        table.close()
