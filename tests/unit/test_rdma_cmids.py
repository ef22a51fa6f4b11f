"""The RDMA CM listener's bookkeeping (pynvmf/rdma/cmids.py), without pyverbs: objects
with ``__slots__`` stand for pyverbs' CMID wrappers (a C struct of pointer fields in the
same order: the CM ID, the event channel, the context, the PD, the MR set)."""

from __future__ import annotations

import pytest

from pynvmf.rdma.cmids import CmIdLedger, PointerField


class Wrapper:
    """A CMID wrapper's struct: ``a_cm_id`` is the field the ledger clears. (CPython lays
    slots out in their names' sorted order: the letters keep pyverbs' order.)"""

    __slots__ = ("a_cm_id", "b_channel", "c_ctx", "d_pd", "e_mrs")

    def __init__(self, cm_id: object, channel: object) -> None:
        self.a_cm_id = cm_id
        self.b_channel = channel
        self.c_ctx = None
        self.d_pd = None
        self.e_mrs: set[object] = set()


CHANNEL = object()


def test_the_field_before_its_neighbours_is_found_read_and_cleared() -> None:
    cm_id = object()
    w = Wrapper(cm_id, CHANNEL)
    field = PointerField.before(w, (CHANNEL, None, None))
    assert field is not None
    assert field.get(w) == id(cm_id)
    field.clear(w)
    assert field.get(w) == 0
    with pytest.raises(AttributeError):
        _ = w.a_cm_id  # a NULL slot reads as unset: the field written was this one


def test_no_field_without_the_run_of_neighbours() -> None:
    w = Wrapper(object(), CHANNEL)
    assert PointerField.before(w, (object(), None, None)) is None
    assert PointerField.before(w, (None, CHANNEL, None)) is None


def _cycle(ledger: CmIdLedger[str], qpn: int, events: int) -> list[Wrapper]:
    """One connection: its connect request's wrapper (kept by its queue), ``events`` event
    wrappers of the same CM ID, then its end. Returns the event wrappers."""
    cm_id = object()
    child = Wrapper(cm_id, CHANNEL)
    ledger.learn(child, (CHANNEL, None, None))
    ledger.accepted(qpn, f"queue {qpn}")
    seen = []
    for _ in range(events):
        w = Wrapper(cm_id, CHANNEL)
        assert ledger.queue_of(qpn) == f"queue {qpn}"
        ledger.event_wrapper(w, child)
        seen.append(w)
    assert ledger.held == 1
    assert ledger.ended(qpn) == f"queue {qpn}"
    return seen


def test_connect_disconnect_cycles_leave_nothing_held() -> None:
    ledger: CmIdLedger[str] = CmIdLedger()
    for qpn in range(10):
        wrappers = _cycle(ledger, 17 + qpn, events=2)  # ESTABLISHED, DISCONNECTED
        # Disowned: collecting them destroys nothing (their CM ID pointer is NULL).
        assert all(not hasattr(w, "a_cm_id") for w in wrappers)
    assert ledger.disowning
    assert ledger.held == 0
    assert ledger.queues() == []


def test_events_of_unknown_queue_pairs_are_disowned_once_trusted() -> None:
    ledger: CmIdLedger[str] = CmIdLedger()
    _cycle(ledger, 5, events=1)
    stray = Wrapper(object(), CHANNEL)
    assert ledger.queue_of(99) is None and ledger.queue_of(None) is None
    ledger.event_wrapper(stray, None)
    assert not hasattr(stray, "a_cm_id")
    assert ledger.held == 0


def test_a_field_two_wrappers_disagree_on_is_never_written() -> None:
    # Another layout: the run is found, but it is not the CM ID (the two wrappers of one
    # connection hold different values there): wrappers are kept, and counted.
    ledger: CmIdLedger[str] = CmIdLedger()
    child = Wrapper(object(), CHANNEL)
    ledger.learn(child, (CHANNEL, None, None))
    ledger.accepted(1, "queue 1")
    other = Wrapper(object(), CHANNEL)
    ledger.event_wrapper(other, child)
    assert hasattr(other, "a_cm_id")
    assert not ledger.disowning
    assert ledger.held == 2
    ledger.learn(Wrapper(object(), CHANNEL), (CHANNEL, None, None))
    assert not ledger.disowning  # given up: never tried again


def test_without_a_layout_wrappers_are_kept_and_counted() -> None:
    ledger: CmIdLedger[str] = CmIdLedger()
    child = Wrapper(object(), CHANNEL)
    ledger.learn(child, (object(),))  # no such run
    ledger.accepted(1, "queue 1")
    ledger.event_wrapper(Wrapper(object(), CHANNEL), child)
    ledger.ended(1)
    assert ledger.held == 1


def test_an_events_connection_is_named_by_its_cm_ids_pointer() -> None:
    """The adapter's queue pairs are its own, not the CM ID's: an event's wrapper names
    its connection by the CM ID pointer read through the field found."""
    ledger: CmIdLedger[str] = CmIdLedger()
    first, second = object(), object()
    child = Wrapper(first, CHANNEL)
    assert ledger.key_of(child) is None  # nothing learnt yet
    ledger.learn(child, (CHANNEL, None, None))
    key = ledger.key_of(child)
    assert key == id(first)
    ledger.accepted(key, "queue 1")
    other = Wrapper(second, CHANNEL)
    ledger.accepted(id(second), "queue 2")
    event = Wrapper(first, CHANNEL)
    assert ledger.queue_of(ledger.key_of(event)) == "queue 1"
    assert ledger.queue_of(ledger.key_of(other)) == "queue 2"
    ledger.event_wrapper(event, child)
    assert ledger.disowning
    assert ledger.key_of(event) is None  # disowned: its pointer cleared


def test_no_key_without_a_layout() -> None:
    ledger: CmIdLedger[str] = CmIdLedger()
    child = Wrapper(object(), CHANNEL)
    ledger.learn(child, (object(),))
    assert ledger.key_of(child) is None
