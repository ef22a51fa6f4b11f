"""Properties of the reservation state machine under any sequence of commands from a few
hosts with any fields, and of the reservation structures a peer controls (the Reservation
Status and Notification pages a host parses)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pynvmf.spec import reservations as R
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target import reservations as T

HOSTS = [bytes([n]) * 16 for n in range(1, 4)]
ALLOWED = {
    Status.SUCCESS,
    Status.RESERVATION_CONFLICT | DNR,
    Status.INVALID_FIELD | DNR,
}
# CDW10 from its fields, reserved values and reserved bits included, so that valid
# commands are common and invalid ones still come.
cdw10s = st.builds(
    lambda action, iekey, rtype, cptpl, noise: (
        action | iekey << 3 | rtype << 8 | cptpl << 30 | noise << 16
    ),
    st.sampled_from([0, 0, 0, 1, 1, 2, 3, 7]),
    st.sampled_from([0, 0, 0, 1]),
    st.sampled_from([*range(1, 7), *range(1, 7), 0, 7, 0xFF]),
    st.sampled_from([0, 0, 2, 3, 1]),
    st.sampled_from([0, 0, 0, 1, 0x3FFF]),
)


def _key(data: st.DataObject, state: T.ReservationState) -> int:
    """Mostly a key some host holds (else nothing but conflicts), sometimes any."""
    held = sorted(set(state.registrants.values()))
    return data.draw(st.sampled_from([*held, *held, 0, 1, 2, 0xFFFF_FFFF_FFFF_FFFF]))


def _run(data: st.DataObject, state: T.ReservationState) -> tuple[bytes, T.Decision]:
    kind = data.draw(st.sampled_from(["register", "acquire", "release"]))
    host = data.draw(st.sampled_from(HOSTS))
    cdw10 = data.draw(cdw10s)
    key1, key2 = _key(data, state), _key(data, state)
    if kind == "register":
        fields = R.RegisterFields.from_cdw10(cdw10)
        capable = data.draw(st.booleans())
        return host, T.register(state, host, fields, key1, key2, ptpl_capable=capable)
    fields_ar = R.AcquireReleaseFields.from_cdw10(cdw10)
    if kind == "acquire":
        return host, T.acquire(state, host, fields_ar, key1, key2)
    return host, T.release(state, host, fields_ar, key1)


def _consistent(state: T.ReservationState) -> None:
    assert state.rtype in (0, *list(R.ReservationType))
    assert set(state.registrants) <= set(HOSTS)
    if state.rtype in R.ALL_REGISTRANTS_TYPES:
        assert state.holder is None and state.registrants
    elif state.rtype:
        assert state.holder in state.registrants
    else:
        assert state.holder is None
    assert 0 <= state.generation <= 0xFFFFFFFF


@given(st.integers(0, 60), st.data())
def test_any_command_sequence_keeps_the_state_consistent(steps: int, data: st.DataObject) -> None:
    state = T.ReservationState()
    for _ in range(steps):
        before = state.copy()
        host, decision = _run(data, state)
        assert decision.status in ALLOWED
        # The decision never touches the state it was given.
        assert state == before
        if decision.status:
            assert decision.state is None and not decision.notices and not decision.preempted
            continue
        if decision.state is not None:
            state = decision.state
        _consistent(state)
        # Nobody is told about their own command; only registrants are.
        assert all(h != host and h in before.registrants for h, _kind in decision.notices)
        assert host not in decision.preempted
        assert not set(decision.preempted) & set(state.registrants)
        # The holder is never refused; the file round-trips whatever the state.
        for h in HOSTS:
            if state.holds(h):
                assert T.access_status(state, h, IoOpcode.WRITE) == 0
        persisted = state.copy()
        persisted.ptpl = True
        assert T.decode_state(T.encode_state(persisted)) == persisted


@given(st.binary(max_size=64 + 4 * 64), st.booleans())
def test_a_reservation_status_parses_or_refuses_a_short_header(raw: bytes, eds: bool) -> None:
    try:
        status = R.ReservationStatus.unpack(raw, extended=eds)
    except ValueError:
        assert len(raw) < R.STATUS_HEADER_SIZE
        return
    head = R.STATUS_HEADER_EXTENDED_SIZE if eds else R.STATUS_HEADER_SIZE
    entry = R.REGCTL_EXT_SIZE if eds else R.REGCTL_SIZE
    assert len(status.registrants) <= status.count
    assert head + len(status.registrants) * entry <= max(len(raw), head)


@given(st.binary(min_size=64, max_size=64))
def test_a_notification_page_always_parses_and_packs_back(raw: bytes) -> None:
    page = R.ReservationNotification.unpack(raw)
    packed = page.pack()
    # The reserved bytes are not kept; everything else is.
    assert packed[:10] == raw[:10] and packed[12:16] == raw[12:16]
