"""The reservation state machine against the specification's rules and tables
(NVMe Base 2.0 section 8.19, NVM Command Set "Reservations"), without a network."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from pynvmf.config.files import write_atomically
from pynvmf.spec import reservations as R
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.reservations import (
    AcquireAction,
    AcquireReleaseFields,
    Cptpl,
    NotificationMask,
    NotificationType,
    RegisterAction,
    RegisterFields,
    ReleaseAction,
    ReservationType,
)
from pynvmf.spec.status import DNR, Status
from pynvmf.target import reservations as T
from pynvmf.target.controller import Controller
from pynvmf.target.reservations import (
    NamespaceReservation,
    NotificationLog,
    ReservationState,
)
from pynvmf.target.subsystem import Subsystem

A = bytes.fromhex("aa" * 16)
B = bytes.fromhex("bb" * 16)
C = bytes.fromhex("cc" * 16)
KA, KB, KC = 0xA, 0xB, 0xC
CONFLICT = Status.RESERVATION_CONFLICT | DNR
INVALID = Status.INVALID_FIELD | DNR
RELEASED = NotificationType.RESERVATION_RELEASED
REG_PREEMPTED = NotificationType.REGISTRATION_PREEMPTED
RES_PREEMPTED = NotificationType.RESERVATION_PREEMPTED
WE = ReservationType.WRITE_EXCLUSIVE
EA = ReservationType.EXCLUSIVE_ACCESS
WERO = ReservationType.WRITE_EXCLUSIVE_REGISTRANTS_ONLY
EARO = ReservationType.EXCLUSIVE_ACCESS_REGISTRANTS_ONLY
WEAR = ReservationType.WRITE_EXCLUSIVE_ALL_REGISTRANTS
EAAR = ReservationType.EXCLUSIVE_ACCESS_ALL_REGISTRANTS


def reg(action: int, *, iekey: bool = False, cptpl: int = 0) -> RegisterFields:
    return RegisterFields.from_cdw10(R.register_cdw10(action, iekey=iekey, cptpl=cptpl))


def acq(action: int, rtype: int, *, iekey: bool = False) -> AcquireReleaseFields:
    return AcquireReleaseFields.from_cdw10(R.acquire_cdw10(action, rtype, iekey=iekey))


def rel(action: int, rtype: int, *, iekey: bool = False) -> AcquireReleaseFields:
    return AcquireReleaseFields.from_cdw10(R.release_cdw10(action, rtype, iekey=iekey))


def registered(*hosts: tuple[bytes, int]) -> ReservationState:
    state = ReservationState()
    for host, key in hosts:
        decision = T.register(state, host, reg(RegisterAction.REGISTER), 0, key, ptpl_capable=False)
        assert decision.status == 0 and decision.state is not None
        state = decision.state
    return state


def reserved(rtype: int, holder: bytes, *hosts: tuple[bytes, int]) -> ReservationState:
    state = registered(*hosts)
    decision = T.acquire(
        state, holder, acq(AcquireAction.ACQUIRE, rtype), state.registrants[holder], 0
    )
    assert decision.status == 0 and decision.state is not None
    return decision.state


# -- the table: Command Behavior in the Presence of a Reservation ---------------------------

# Transcribed from the specification, one row per type: for the read command group and
# then the write command group, whether the reservation holder, a registrant and a host
# that is not a registrant are Allowed or get a Conflict.
SPEC_TABLE = {
    WE: ("AAA", "ACC"),
    EA: ("ACC", "ACC"),
    WERO: ("AAA", "AAC"),
    EARO: ("AAC", "AAC"),
    WEAR: ("AAA", "AAC"),
    EAAR: ("AAC", "AAC"),
}
READS = (IoOpcode.READ, IoOpcode.COMPARE, IoOpcode.VERIFY)
WRITES = (
    IoOpcode.WRITE,
    IoOpcode.WRITE_UNCORRECTABLE,
    IoOpcode.WRITE_ZEROES,
    IoOpcode.DATASET_MANAGEMENT,
    IoOpcode.FLUSH,
    IoOpcode.COPY,
)


@pytest.mark.parametrize("rtype", list(ReservationType))
@pytest.mark.parametrize("role", [0, 1, 2], ids=["holder", "registrant", "non-registrant"])
@pytest.mark.parametrize("group", [0, 1], ids=["read", "write"])
def test_every_type_role_and_command_group_as_the_spec_table(
    rtype: ReservationType, role: int, group: int
) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB))
    host = (A, B, C)[role]
    expected = CONFLICT if SPEC_TABLE[rtype][group][role] == "C" else 0
    res = NamespaceReservation()
    res.commit(state)
    for opcode in (READS, WRITES)[group]:
        assert T.access_status(state, host, opcode) == expected, (rtype.name, opcode)
        assert res.refuses(host, opcode) == bool(expected)


@pytest.mark.parametrize("rtype", list(ReservationType))
def test_commands_outside_the_groups_and_no_reservation_are_never_refused(
    rtype: ReservationType,
) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB))
    for opcode in (
        IoOpcode.RESERVATION_REGISTER,
        IoOpcode.RESERVATION_REPORT,
        IoOpcode.RESERVATION_ACQUIRE,
        IoOpcode.RESERVATION_RELEASE,
    ):
        assert T.access_status(state, C, opcode) == 0
    unreserved = registered((A, KA))
    for opcode in READS + WRITES:
        assert T.access_status(unreserved, C, opcode) == 0


# -- Register -------------------------------------------------------------------------------


def test_register_twice_with_the_same_key_succeeds_with_another_conflicts() -> None:
    state = registered((A, KA))
    same = T.register(state, A, reg(RegisterAction.REGISTER), 0, KA, ptpl_capable=False)
    assert same.status == 0 and same.state is not None
    assert same.state.registrants == {A: KA}
    assert same.state.generation == state.generation + 1
    other = T.register(state, A, reg(RegisterAction.REGISTER), 0, KB, ptpl_capable=False)
    assert other.status == CONFLICT and other.state is None


def test_registrations_are_bounded() -> None:
    state = ReservationState(
        registrants={bytes([n % 256, n // 256]) * 8: n for n in range(T.MAX_REGISTRANTS)}
    )
    full = T.register(state, A, reg(RegisterAction.REGISTER), 0, KA, ptpl_capable=False)
    assert full.status == Status.INTERNAL_ERROR | DNR and full.state is None
    # A registrant may still register again or replace its key.
    known = next(iter(state.registrants))
    again = T.register(state, known, reg(RegisterAction.REGISTER), 0, 0, ptpl_capable=False)
    assert again.status == 0


def test_replace_checks_the_current_key_unless_iekey() -> None:
    state = registered((A, KA))
    wrong = T.register(state, A, reg(RegisterAction.REPLACE), KB, KC, ptpl_capable=False)
    assert wrong.status == CONFLICT
    ok = T.register(state, A, reg(RegisterAction.REPLACE), KA, KC, ptpl_capable=False)
    assert ok.state is not None and ok.state.registrants == {A: KC}
    ignored = T.register(
        state, A, reg(RegisterAction.REPLACE, iekey=True), 0x999, KC, ptpl_capable=False
    )
    assert ignored.state is not None and ignored.state.registrants == {A: KC}
    # A host with no registration has nothing to replace, IEKEY or not.
    none = T.register(state, B, reg(RegisterAction.REPLACE, iekey=True), 0, KB, ptpl_capable=False)
    assert none.status == CONFLICT


def test_unregister_checks_the_key_unless_iekey() -> None:
    state = registered((A, KA), (B, KB))
    assert (
        T.register(state, A, reg(RegisterAction.UNREGISTER), KB, 0, ptpl_capable=False).status
        == CONFLICT
    )
    assert (
        T.register(state, C, reg(RegisterAction.UNREGISTER), 0, 0, ptpl_capable=False).status
        == CONFLICT
    )
    ok = T.register(state, A, reg(RegisterAction.UNREGISTER, iekey=True), 0, 0, ptpl_capable=False)
    assert ok.state is not None and ok.state.registrants == {B: KB}


@pytest.mark.parametrize("action", [3, 4, 7])
def test_reserved_register_actions_and_cptpl_01b_are_invalid_fields(action: int) -> None:
    state = registered((A, KA))
    assert (
        T.register(state, B, RegisterFields(action, False, 0), 0, KB, ptpl_capable=True).status
        == INVALID
    )
    bad = RegisterFields(RegisterAction.REGISTER, False, 1)
    assert T.register(state, B, bad, 0, KB, ptpl_capable=True).status == INVALID


@pytest.mark.parametrize(
    ("rtype", "notified"),
    [(WE, []), (EA, []), (WERO, [B, C]), (EARO, [B, C])],
)
def test_the_holder_unregistering_releases_and_notifies_for_registrants_only(
    rtype: ReservationType, notified: list[bytes]
) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB), (C, KC))
    decision = T.register(state, A, reg(RegisterAction.UNREGISTER), KA, 0, ptpl_capable=False)
    assert decision.state is not None
    assert decision.state.rtype == 0 and decision.state.holder is None
    assert decision.notices == [(h, RELEASED) for h in notified]


@pytest.mark.parametrize("rtype", [WEAR, EAAR])
def test_all_registrants_reservation_lasts_until_the_last_registrant_leaves(
    rtype: ReservationType,
) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB))
    first = T.register(state, A, reg(RegisterAction.UNREGISTER), KA, 0, ptpl_capable=False)
    assert first.state is not None and first.state.rtype == rtype and not first.notices
    assert first.state.holds(B)
    last = T.register(first.state, B, reg(RegisterAction.UNREGISTER), KB, 0, ptpl_capable=False)
    assert last.state is not None and last.state.rtype == 0


def test_cptpl_sets_ptpl_only_where_the_namespace_can_persist() -> None:
    state = ReservationState()
    persist = reg(RegisterAction.REGISTER, cptpl=Cptpl.PERSIST)
    capable = T.register(state, A, persist, 0, KA, ptpl_capable=True)
    assert capable.state is not None and capable.state.ptpl
    # The Linux host asks for 11b on every register: accepted, and PTPL stays 0.
    memory = T.register(state, A, persist, 0, KA, ptpl_capable=False)
    assert memory.status == 0 and memory.state is not None and not memory.state.ptpl
    cleared = T.register(
        capable.state, A, reg(RegisterAction.REGISTER, cptpl=Cptpl.CLEAR), 0, KA, ptpl_capable=True
    )
    assert cleared.state is not None and not cleared.state.ptpl


# -- Acquire --------------------------------------------------------------------------------


def test_acquire_needs_a_registration_with_the_key() -> None:
    state = registered((A, KA))
    assert T.acquire(state, A, acq(AcquireAction.ACQUIRE, WE), KB, 0).status == CONFLICT
    assert T.acquire(state, B, acq(AcquireAction.ACQUIRE, WE), 0, 0).status == CONFLICT
    ok = T.acquire(state, A, acq(AcquireAction.ACQUIRE, WE), KA, 0)
    assert ok.state is not None and ok.state.rtype == WE and ok.state.holder == A
    # Acquiring is not among what moves the generation.
    assert ok.state.generation == state.generation


def test_acquire_again_the_same_type_is_success_another_type_or_host_conflicts() -> None:
    state = reserved(WE, A, (A, KA), (B, KB))
    same = T.acquire(state, A, acq(AcquireAction.ACQUIRE, WE), KA, 0)
    assert same.status == 0 and same.state is None
    assert T.acquire(state, A, acq(AcquireAction.ACQUIRE, EA), KA, 0).status == CONFLICT
    assert T.acquire(state, B, acq(AcquireAction.ACQUIRE, WE), KB, 0).status == CONFLICT


def test_every_registrant_holds_an_all_registrants_reservation() -> None:
    state = reserved(WEAR, A, (A, KA), (B, KB))
    assert T.acquire(state, B, acq(AcquireAction.ACQUIRE, WEAR), KB, 0).status == 0
    assert T.acquire(state, B, acq(AcquireAction.ACQUIRE, WE), KB, 0).status == CONFLICT


@pytest.mark.parametrize(
    "fields",
    [
        AcquireReleaseFields(3, False, WE),
        AcquireReleaseFields(7, False, WE),
        AcquireReleaseFields(AcquireAction.ACQUIRE, False, 0),
        AcquireReleaseFields(AcquireAction.ACQUIRE, False, 7),
        AcquireReleaseFields(AcquireAction.PREEMPT, False, 0xFF),
        AcquireReleaseFields(AcquireAction.ACQUIRE, True, WE),
    ],
)
def test_invalid_acquire_fields(fields: AcquireReleaseFields) -> None:
    state = registered((A, KA))
    assert T.acquire(state, A, fields, KA, 0).status == INVALID


# -- Preempt --------------------------------------------------------------------------------


def test_preempting_the_holder_unregisters_it_and_takes_the_reservation() -> None:
    state = reserved(WE, A, (A, KA), (B, KB), (C, KC))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT, EA), KB, KA)
    assert d.status == 0 and d.state is not None
    assert d.state.registrants == {B: KB, C: KC}
    assert d.state.rtype == EA and d.state.holder == B
    assert d.state.generation == state.generation + 1
    # A lost its registration; C (still registered) sees its access change with the type.
    assert d.notices == [(A, REG_PREEMPTED), (C, RELEASED)]
    assert d.preempted == ()


def test_preempt_keeping_the_type_notifies_only_the_preempted() -> None:
    state = reserved(WE, A, (A, KA), (B, KB), (C, KC))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, KA)
    assert d.notices == [(A, REG_PREEMPTED)]


def test_preempt_and_abort_names_the_hosts_to_wait_for() -> None:
    state = reserved(WE, A, (A, KA), (B, KB), (C, KA))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT_AND_ABORT, WE), KB, KA)
    assert d.state is not None and d.state.registrants == {B: KB}
    assert set(d.preempted) == {A, C}


def test_the_holder_preempting_itself_changes_the_type() -> None:
    state = reserved(WE, A, (A, KA), (B, KB))
    d = T.acquire(state, A, acq(AcquireAction.PREEMPT, EA), KA, KA)
    assert d.state is not None and d.state.holder == A and d.state.rtype == EA
    assert d.state.registrants == {A: KA, B: KB}
    assert d.notices == [(B, RELEASED)]


def test_preempting_a_registration_that_does_not_hold_the_reservation() -> None:
    state = reserved(WE, A, (A, KA), (B, KB), (C, KC))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, KC)
    assert d.state is not None and d.state.registrants == {A: KA, B: KB}
    assert d.state.holder == A and d.state.rtype == WE
    assert d.notices == [(C, REG_PREEMPTED)]
    assert T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, 0x999).status == CONFLICT
    # PRKEY 0 matching no holder is an invalid field with a single holder.
    assert T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, 0).status == INVALID


def test_preempt_without_a_reservation_only_unregisters() -> None:
    state = registered((A, KA), (B, KB))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, KA)
    assert d.state is not None and d.state.registrants == {B: KB} and d.state.rtype == 0
    assert d.notices == [(A, REG_PREEMPTED)]
    assert T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, KC).status == CONFLICT


@pytest.mark.parametrize("rtype", [WEAR, EAAR])
def test_preempt_of_all_registrants_with_prkey_zero_takes_it_over(rtype: ReservationType) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB), (C, KC))
    d = T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, 0)
    assert d.state is not None and d.state.registrants == {B: KB}
    assert d.state.rtype == WE and d.state.holder == B
    assert d.notices == [(A, REG_PREEMPTED), (C, REG_PREEMPTED)]
    by_key = T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, KC)
    assert by_key.state is not None and by_key.state.registrants == {A: KA, B: KB}
    assert by_key.state.rtype == rtype
    assert T.acquire(state, B, acq(AcquireAction.PREEMPT, WE), KB, 0x999).status == CONFLICT


# -- Release --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rtype", "notified"),
    [(WE, []), (EA, []), (WERO, [B]), (EARO, [B]), (WEAR, [B]), (EAAR, [B])],
)
def test_release_by_the_holder(rtype: ReservationType, notified: list[bytes]) -> None:
    state = reserved(rtype, A, (A, KA), (B, KB))
    d = T.release(state, A, rel(ReleaseAction.RELEASE, rtype), KA)
    assert d.state is not None and d.state.rtype == 0
    assert d.state.registrants == {A: KA, B: KB}
    assert d.notices == [(h, RELEASED) for h in notified]


def test_release_by_a_registrant_that_does_not_hold_it_changes_nothing() -> None:
    state = reserved(WE, A, (A, KA), (B, KB))
    d = T.release(state, B, rel(ReleaseAction.RELEASE, WE), KB)
    assert d.status == 0 and d.state is None
    # Not the holder: no effect, whatever the type says.
    assert T.release(state, B, rel(ReleaseAction.RELEASE, EA), KB).status == 0
    assert T.release(registered((A, KA)), A, rel(ReleaseAction.RELEASE, WE), KA).status == 0


def test_release_of_another_type_is_an_invalid_field() -> None:
    state = reserved(WE, A, (A, KA))
    assert T.release(state, A, rel(ReleaseAction.RELEASE, EA), KA).status == INVALID
    assert T.release(state, A, rel(ReleaseAction.RELEASE, 9), KA).status == INVALID


def test_release_checks_registration_key_action_and_iekey() -> None:
    state = reserved(WE, A, (A, KA))
    assert T.release(state, A, rel(ReleaseAction.RELEASE, WE), KB).status == CONFLICT
    assert T.release(state, C, rel(ReleaseAction.RELEASE, WE), 0).status == CONFLICT
    assert T.release(state, A, rel(2, WE), KA).status == INVALID
    assert T.release(state, A, rel(ReleaseAction.RELEASE, WE, iekey=True), KA).status == INVALID


def test_clear_unregisters_everyone_and_tells_the_others() -> None:
    state = reserved(WE, A, (A, KA), (B, KB), (C, KC))
    d = T.release(state, B, rel(ReleaseAction.CLEAR, 0), KB)
    assert d.state is not None and not d.state.registrants and d.state.rtype == 0
    assert d.state.generation == state.generation + 1
    assert d.notices == [(A, RES_PREEMPTED), (C, RES_PREEMPTED)]


# -- report ---------------------------------------------------------------------------------


def test_report_lists_each_registrant_host_with_its_key_and_holding() -> None:
    state = reserved(WE, B, (A, KA), (B, KB))
    page = T.status_report(state).pack(extended=True)
    assert len(page) == 64 + 2 * 64
    back = R.ReservationStatus.unpack(page)
    assert (back.generation, back.rtype, back.count, back.ptpls) == (2, WE, 2, False)
    assert [(r.hostid, r.rkey, r.holds, r.cntlid) for r in back.registrants] == [
        (A, KA, False, 0xFFFF),
        (B, KB, True, 0xFFFF),
    ]
    # Truncated: the header still counts both, the entries that fit are there.
    cut = R.ReservationStatus.unpack(page[:128])
    assert cut.count == 2 and len(cut.registrants) == 1
    all_regs = T.status_report(reserved(EAAR, A, (A, KA), (B, KB)))
    assert all(r.holds for r in all_regs.registrants)


def test_reservation_status_layouts() -> None:
    status = R.ReservationStatus(
        generation=0x01020304,
        rtype=3,
        ptpls=True,
        registrants=[R.RegisteredController(A, 0x1122334455667788, True, 7)],
    )
    page = status.pack()
    assert page[0:4] == bytes.fromhex("04030201") and page[4] == 3
    assert page[5:7] == b"\x01\x00" and page[9] == 1 and page[24:64] == bytes(40)
    entry = page[64:]
    assert entry[0:2] == b"\x07\x00" and entry[2] == 1 and entry[3:8] == bytes(5)
    assert entry[8:16] == (0x1122334455667788).to_bytes(8, "little") and entry[16:32] == A
    short = R.ReservationStatus(registrants=[R.RegisteredController(b"12345678", 5)]).pack(
        extended=False
    )
    assert (
        len(short) == 48 and short[32:40] == b"12345678" and short[40:48] == bytes([5]) + bytes(7)
    )


def test_notification_page_layout() -> None:
    page = R.ReservationNotification(count=5, type=2, available=300, nsid=9).pack()
    assert len(page) == 64
    assert page[0:8] == (5).to_bytes(8, "little") and page[8] == 2
    assert page[9] == 255 and page[12:16] == (9).to_bytes(4, "little") and page[16:] == bytes(48)


# -- notifications to controllers --------------------------------------------------------


def make_controller(subsystem: Subsystem, cntlid: int, hostid: bytes) -> Controller:
    ctrl = Controller(
        cast(Any, None), subsystem, cntlid, f"nqn.host:{hostid.hex()}", hostid, 0, cast(Any, None)
    )
    subsystem.controllers[cntlid] = ctrl
    return ctrl


def test_notices_reach_every_controller_of_the_host_and_no_other() -> None:
    subsystem = Subsystem("nqn.test:notices")
    a1, a2 = make_controller(subsystem, 1, A), make_controller(subsystem, 2, A)
    b = make_controller(subsystem, 3, B)
    T.deliver(subsystem, 1, [(A, REG_PREEMPTED)])
    for ctrl in (a1, a2):
        assert len(ctrl.reservation_log) == 1
        # The event: type 6 (I/O command set), info 0, log page 80h.
        assert list(ctrl.pending_events) == [6 | 0 << 8 | 0x80 << 16]
    assert len(b.reservation_log) == 0 and not b.pending_events
    page = a1.reservation_log.take()
    assert (page.count, page.type, page.available, page.nsid) == (1, REG_PREEMPTED, 0, 1)
    assert a1.reservation_log.take() == R.ReservationNotification()


def test_the_mask_suppresses_the_types_it_names_per_namespace() -> None:
    log = NotificationLog()
    log.masks[1] = NotificationMask.RESPRE
    assert not log.add(1, RES_PREEMPTED)
    assert log.add(2, RES_PREEMPTED)
    assert log.add(1, RELEASED)
    assert [log.take().type, log.take().type] == [RES_PREEMPTED, RELEASED]
    log.masks[1] = R.NOTIFICATION_MASK_ALL
    assert not any(log.add(1, kind) for kind in (REG_PREEMPTED, RELEASED, RES_PREEMPTED))


def test_a_full_log_keeps_its_memory_bounded_and_shows_the_gap() -> None:
    log = NotificationLog(capacity=3)
    for _ in range(5):
        log.add(1, RELEASED)
    assert len(log) == 3
    pages = [log.take() for _ in range(3)]
    assert [p.count for p in pages] == [1, 2, 5]
    assert [p.available for p in pages] == [2, 1, 0]


# -- the I/O path -------------------------------------------------------------------------


class _Req:
    def __init__(self, opcode: int) -> None:
        self.sqe = type("S", (), {"opcode": opcode, "nsid": 1})()


async def test_preempt_and_abort_waits_for_the_commands_under_way() -> None:
    res = NamespaceReservation()
    res.commit(reserved(WEAR, A, (A, KA), (B, KB)))
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow_write(io: Any, req: Any) -> Any:
        started.set()
        await finish.wait()
        return 0, 0, None

    io = type("Io", (), {"ctrl": type("Ctrl", (), {"hostid": A})()})()
    write = asyncio.create_task(res.guard(io, cast(Any, _Req(IoOpcode.WRITE)), slow_write))
    await started.wait()
    wait = asyncio.create_task(res.wait_for([A]))
    other = asyncio.create_task(res.wait_for([C]))  # nothing of C's under way
    await other
    assert not wait.done()
    finish.set()
    assert await write == (0, 0, None)
    await wait


# -- Persist Through Power Loss -------------------------------------------------------------


def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ns.ptpl.json"
    state = reserved(WERO, B, (A, KA), (B, KB))
    state.ptpl = True
    write_atomically(path, T.encode_state(state))
    assert T.load_state(path) == state
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    state.ptpl = False
    write_atomically(path, T.encode_state(state))
    assert T.load_state(path) == ReservationState()
    assert T.load_state(tmp_path / "missing") == ReservationState()


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        {"format": 99, "ptpl": True},
        {
            "format": 1,
            "ptpl": True,
            "generation": 1,
            "rtype": 1,
            "holder": "aa" * 16,
            "registrants": [],
        },
        {"format": 1, "ptpl": True, "generation": 1, "rtype": 9, "holder": None, "registrants": []},
        {
            "format": 1,
            "ptpl": True,
            "generation": 1,
            "rtype": 0,
            "holder": None,
            "registrants": [{"hostid": "aa", "key": 1}],
        },
    ],
)
def test_a_damaged_file_is_refused_not_dropped(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "ns.ptpl.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ValueError):
        NamespaceReservation(path)


async def test_the_file_is_written_only_with_ptpl(tmp_path: Path) -> None:
    path = tmp_path / "ns.ptpl.json"
    res = NamespaceReservation(path)
    assert res.rescap == 0xFF and NamespaceReservation().rescap == 0xFE
    subsystem = Subsystem("nqn.test:ptpl")

    def register(cptpl: int) -> Any:
        return lambda s: T.register(
            s, A, reg(RegisterAction.REGISTER, cptpl=cptpl), 0, KA, ptpl_capable=True
        )

    assert await res.change(subsystem, register(Cptpl.NO_CHANGE)) == 0
    assert not path.exists()
    assert await res.change(subsystem, register(Cptpl.PERSIST)) == 0
    assert NamespaceReservation(path).state == res.state
    assert await res.change(subsystem, register(Cptpl.CLEAR)) == 0
    assert NamespaceReservation(path).state == ReservationState()


async def test_a_failed_save_changes_nothing(tmp_path: Path) -> None:
    res = NamespaceReservation(tmp_path / "gone" / "ns.ptpl.json")
    status = await res.change(
        Subsystem("nqn.test:fail"),
        lambda s: T.register(
            s, A, reg(RegisterAction.REGISTER, cptpl=Cptpl.PERSIST), 0, KA, ptpl_capable=True
        ),
    )
    assert status == Status.INTERNAL_ERROR
    assert res.state == ReservationState()


def test_the_subsystem_index_holds_exactly_the_namespaces_with_registrants() -> None:
    index: dict[int, NamespaceReservation] = {}
    res = NamespaceReservation()
    res.attach(index, 3)
    assert index == {}
    res.commit(registered((A, KA)))
    assert index == {3: res}
    res.commit(ReservationState())
    assert index == {}
