"""Reservation checks that take only controllers, run against pynvmf's target
(tests/protocol/test_reservations.py) and the Linux kernel's nvmet
(tests/interop/test_linux_target_reservations.py): two or three hosts (HOST_A, HOST_B,
HOST_C, with keys KA, KB, KC), registered or not, on a subsystem with namespaces 1 and 2
of 512-byte blocks."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping

from pynvmf.host import Controller, NvmeStatusError
from pynvmf.spec import identify as I
from pynvmf.spec import reservations as R
from pynvmf.spec.command import CNTLID_DYNAMIC
from pynvmf.spec.opcodes import NSID_ALL, AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.reservations import (
    AcquireAction,
    NotificationMask,
    NotificationType,
    RegisterAction,
    ReleaseAction,
    ReservationType,
)
from pynvmf.spec.status import Status

BLOCK = 512
WE = ReservationType.WRITE_EXCLUSIVE
EA = ReservationType.EXCLUSIVE_ACCESS
KA, KB, KC = 0xA1, 0xB2, 0xC3

# The six-byte AEN: type 6 (I/O command set specific), info 0, log page 80h.
RESERVATION_AEN = 6 | 0 << 8 | 0x80 << 16


def _identity(n: int) -> tuple[str, bytes]:
    ident = uuid.UUID(f"00000000-0000-4000-8000-0000000000{n:02x}")
    return f"nqn.2014-08.org.nvmexpress:uuid:{ident}", ident.bytes


HOST_A, HOST_B, HOST_C = _identity(0xA), _identity(0xB), _identity(0xC)


async def status_of(aw: Awaitable[object]) -> int:
    try:
        await aw
    except NvmeStatusError as exc:
        assert exc.dnr, exc
        return exc.status
    return Status.SUCCESS


async def check_write_exclusive(a: Controller, b: Controller) -> None:
    """`a` and `b` registered KA and KB on namespace 1."""
    na, nb = a.namespace(1), b.namespace(1)
    pattern = bytes(range(256)) * 256  # 64 KiB: beyond the in-capsule size, R2T territory
    await na.write(0, pattern)
    await na.reservation_acquire(WE, crkey=KA)
    r2t_before = sum(q.conn.stats.r2t_received for q in b.io_queues)
    for attempt in (
        nb.write(0, bytes(BLOCK)),
        nb.write(0, bytes(len(pattern))),
        nb.write_zeroes(0, 8),
        nb.deallocate(0, 8),
        nb.flush(),
    ):
        assert await status_of(attempt) == Status.RESERVATION_CONFLICT
    # Refused before any data moved: no R2T for the 64 KiB write.
    assert sum(q.conn.stats.r2t_received for q in b.io_queues) == r2t_before
    back = bytearray(len(pattern))
    await nb.read(0, memoryview(back))  # reads stay open to everyone
    assert back == pattern
    await na.write(0, bytes(BLOCK))  # the holder writes
    await na.reservation_release(WE, crkey=KA)
    await nb.write(0, bytes(BLOCK))  # released: open again


async def check_exclusive_access(a: Controller, b: Controller, c: Controller) -> None:
    """`a` and `b` registered KA and KB on namespace 1; `c`, a third host, did not."""
    na, nb, nc = a.namespace(1), b.namespace(1), c.namespace(1)
    buf = memoryview(bytearray(BLOCK))
    await na.reservation_acquire(EA, crkey=KA)
    assert await status_of(nb.read(0, buf)) == Status.RESERVATION_CONFLICT
    assert await status_of(nc.read(0, buf)) == Status.RESERVATION_CONFLICT
    await na.read(0, buf)
    await na.reservation_acquire(
        ReservationType.EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
        crkey=KA,
        prkey=KA,
        action=AcquireAction.PREEMPT,
    )
    await nb.read(0, buf)
    await nb.write(0, bytes(BLOCK))
    assert await status_of(nc.read(0, buf)) == Status.RESERVATION_CONFLICT
    assert await status_of(nc.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT


async def check_report(a: Controller, b: Controller) -> None:
    """`a` and `b` (HOST_A, HOST_B) registered KA and KB on namespace 1, in that order."""
    await b.namespace(1).reservation_acquire(WE, crkey=KB)
    report = await a.namespace(1).reservation_report()
    assert (report.rtype, report.count, report.ptpls, report.generation) == (WE, 2, False, 2)
    assert [(r.hostid, r.rkey, r.holds, r.cntlid) for r in report.registrants] == [
        (HOST_A[1], KA, False, CNTLID_DYNAMIC),
        (HOST_B[1], KB, True, CNTLID_DYNAMIC),
    ]
    # A buffer that holds only the header: REGCTL still counts both.
    short = await a.namespace(1).reservation_report(length=64)
    assert short.count == 2 and short.registrants == []
    one = await a.namespace(1).reservation_report(length=128)
    assert [r.hostid for r in one.registrants] == [HOST_A[1]]
    # Fabrics host IDs are 128-bit: the 64-bit structure cannot carry them.
    no_eds = a.namespace(1).reservation_report(extended=False)
    assert await status_of(no_eds) == Status.HOST_ID_INCONSISTENT


async def check_preempt(a: Controller, b: Controller) -> None:
    """`a` and `b` (HOST_A, HOST_B) registered KA and KB on namespace 1; neither has a
    notification pending."""
    na, nb = a.namespace(1), b.namespace(1)
    await na.reservation_acquire(WE, crkey=KA)
    aer = asyncio.ensure_future(a.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    other_aer = asyncio.ensure_future(b.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    await nb.reservation_acquire(WE, crkey=KB, prkey=KA, action=AcquireAction.PREEMPT)
    assert (await aer) & 0xFFFFFF == RESERVATION_AEN
    page = await a.reservation_notification()
    assert (page.count, page.type, page.available, page.nsid) == (
        1,
        NotificationType.REGISTRATION_PREEMPTED,
        0,
        1,
    )
    assert (await a.reservation_notification()).count == 0  # read means removed
    # A is no registrant any more: its writes conflict, its old key is nothing.
    assert await status_of(na.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT
    assert await status_of(na.reservation_release(WE, crkey=KA)) == Status.RESERVATION_CONFLICT
    report = await nb.reservation_report()
    assert [(r.hostid, r.holds) for r in report.registrants] == [(HOST_B[1], True)]
    # The preempting host was told nothing: its AER is still parked, its log empty.
    assert not other_aer.done()
    assert (await b.reservation_notification()).count == 0
    other_aer.cancel()


async def check_release_and_clear(a: Controller, b: Controller) -> None:
    """`a` and `b` registered KA and KB on namespace 1; `b`'s controller has been sent no
    notification yet (its log page count starts at 1)."""
    na, nb = a.namespace(1), b.namespace(1)
    rtype = ReservationType.WRITE_EXCLUSIVE_REGISTRANTS_ONLY
    await na.reservation_acquire(rtype, crkey=KA)
    await na.reservation_release(rtype, crkey=KA)
    page = await b.reservation_notification()
    assert (page.type, page.nsid) == (NotificationType.RESERVATION_RELEASED, 1)
    await na.reservation_release(0, crkey=KA, action=ReleaseAction.CLEAR)
    page = await b.reservation_notification()
    assert page.type == NotificationType.RESERVATION_PREEMPTED and page.count == 2
    assert (await a.reservation_notification()).count == 0
    report = await nb.reservation_report()
    assert report.count == 0 and report.rtype == 0


async def check_mask(a: Controller, b: Controller, no_namespace: int = Status.INVALID_NS) -> None:
    """`a` and `b` are two hosts' controllers, neither registered, on a subsystem with
    namespaces 1 and 2 and no namespace 9 (NN above 9): Get Features of the mask for it
    fails with `no_namespace` (pynvmf: Invalid Namespace or Format)."""
    for nsid in (1, 2):
        await a.namespace(nsid).reservation_register(nrkey=KA)
        await b.namespace(nsid).reservation_register(nrkey=KB)
    nb = b.namespace(1)
    await nb.set_reservation_notification_mask(NotificationMask.RESPRE)
    assert await nb.reservation_notification_mask() == NotificationMask.RESPRE
    assert await b.namespace(2).reservation_notification_mask() == 0
    for nsid in (1, 2):
        await a.namespace(nsid).reservation_release(0, crkey=KA, action=ReleaseAction.CLEAR)
    page = await b.reservation_notification()
    assert (page.type, page.nsid, page.available) == (NotificationType.RESERVATION_PREEMPTED, 2, 0)
    # The feature names one namespace: "all" is refused on Get, every namespace on Set.
    get_all = b.get_features(FeatureId.RESERVATION_MASK, nsid=NSID_ALL)
    assert await status_of(get_all) == Status.INVALID_FIELD
    await b.set_features(FeatureId.RESERVATION_MASK, R.NOTIFICATION_MASK_ALL, nsid=NSID_ALL)
    assert await b.namespace(2).reservation_notification_mask() == R.NOTIFICATION_MASK_ALL
    bad = b.set_features(FeatureId.RESERVATION_MASK, 1, nsid=1)  # bit 0 is reserved
    assert await status_of(bad) == Status.INVALID_FIELD
    missing = b.get_features(FeatureId.RESERVATION_MASK, nsid=9)
    assert await status_of(missing) == no_namespace
    # The Select field, where ONCS says the controller has it (nvmet does not, and answers
    # the current value whatever SEL says).
    assert b.info is not None
    if b.info.oncs & I.Oncs.SAVE_FEATURES:
        caps = await b.get_features(FeatureId.RESERVATION_MASK, sel=3, nsid=1)
        assert caps == 0x6  # changeable, namespace specific


async def check_one_host_two_controllers(a1: Controller, a2: Controller, b: Controller) -> None:
    """`a1` and `a2` are two controllers of HOST_A, `b` one of HOST_B, none registered."""
    assert a1.cntlid != a2.cntlid
    await a1.namespace(1).reservation_register(nrkey=KA)
    await b.namespace(1).reservation_register(nrkey=KB)
    # The second controller is the same registrant: same key, so registering is a no-op.
    await a2.namespace(1).reservation_register(nrkey=KA)
    clash = a2.namespace(1).reservation_register(nrkey=KC)
    assert await status_of(clash) == Status.RESERVATION_CONFLICT
    await a2.namespace(1).reservation_acquire(WE, crkey=KA)
    await a1.namespace(1).write(0, bytes(BLOCK))  # the holder is the host
    report = await b.namespace(1).reservation_report()
    assert [(r.hostid, r.holds) for r in report.registrants] == [
        (HOST_A[1], True),
        (HOST_B[1], False),
    ]
    await b.namespace(1).reservation_acquire(WE, crkey=KB, prkey=KA, action=AcquireAction.PREEMPT)
    for ctrl in (a1, a2):
        assert (await ctrl.reservation_notification()).type == (
            NotificationType.REGISTRATION_PREEMPTED
        )


async def check_bad_input(
    a: Controller, b: Controller, differences: Mapping[str, int] | None = None
) -> None:
    """`a` and `b` registered KA and KB on namespace 1 of a subsystem without namespace 7.
    `differences` names the cases where the target under test answers with another status
    than pynvmf's (and that status)."""
    na, nb = a.namespace(1), b.namespace(1)
    await na.reservation_acquire(WE, crkey=KA)
    before = await nb.reservation_report()

    def io(opcode: int, cdw10: int, data: bytes, nsid: int = 1) -> Awaitable[int]:
        return b.io_command(opcode, nsid, cdw10, data=data)

    # Each case runs only when its turn comes: a name, what to send, the status expected.
    cases: list[tuple[str, Callable[[], Awaitable[object]], int]] = [
        # Reserved values of the action and type fields: Invalid Field.
        (
            "register: reserved action",
            lambda: io(IoOpcode.RESERVATION_REGISTER, 3, R.REGISTER_DATA.pack(0, KC)),
            Status.INVALID_FIELD,
        ),
        (
            "register: reserved CPTPL",
            lambda: io(
                IoOpcode.RESERVATION_REGISTER,
                R.register_cdw10(0, cptpl=1),
                R.REGISTER_DATA.pack(0, KB),
            ),
            Status.INVALID_FIELD,
        ),
        (
            "acquire: reserved action",
            lambda: io(IoOpcode.RESERVATION_ACQUIRE, 3 | WE << 8, R.ACQUIRE_DATA.pack(KB, 0)),
            Status.INVALID_FIELD,
        ),
        (
            "acquire: reserved type",
            lambda: io(IoOpcode.RESERVATION_ACQUIRE, 7 << 8, R.ACQUIRE_DATA.pack(KB, 0)),
            Status.INVALID_FIELD,
        ),
        (
            "acquire: type 0",
            lambda: io(IoOpcode.RESERVATION_ACQUIRE, 0 << 8, R.ACQUIRE_DATA.pack(KB, 0)),
            Status.INVALID_FIELD,
        ),
        (
            "acquire: IEKEY",
            lambda: nb.reservation_acquire(EA, crkey=KB, iekey=True),
            Status.INVALID_FIELD,
        ),
        (
            "release: reserved action",
            lambda: io(IoOpcode.RESERVATION_RELEASE, 2 | WE << 8, R.RELEASE_DATA.pack(KB)),
            Status.INVALID_FIELD,
        ),
        (
            "release: IEKEY",
            lambda: na.reservation_release(WE, crkey=KA, iekey=True),
            Status.INVALID_FIELD,
        ),
        # The holder releasing another type than it holds.
        (
            "release: another type",
            lambda: na.reservation_release(EA, crkey=KA),
            Status.INVALID_FIELD,
        ),
        # Key mismatches, and a host with no registration.
        (
            "unregister: wrong key",
            lambda: nb.reservation_register(action=RegisterAction.UNREGISTER, crkey=KC),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "replace: wrong key",
            lambda: nb.reservation_register(action=RegisterAction.REPLACE, crkey=KC, nrkey=1),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "register: another key",
            lambda: nb.reservation_register(nrkey=KC),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "acquire: wrong key",
            lambda: nb.reservation_acquire(WE, crkey=KC),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "acquire: held by another",
            lambda: nb.reservation_acquire(WE, crkey=KB),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "preempt: no such key",
            lambda: nb.reservation_acquire(WE, crkey=KB, prkey=0x999, action=AcquireAction.PREEMPT),
            Status.RESERVATION_CONFLICT,
        ),
        (
            "preempt: key 0",
            lambda: nb.reservation_acquire(WE, crkey=KB, prkey=0, action=AcquireAction.PREEMPT),
            Status.INVALID_FIELD,
        ),
        (
            "release: wrong key",
            lambda: nb.reservation_release(WE, crkey=KC),
            Status.RESERVATION_CONFLICT,
        ),
        # The keys missing from the data: too short for the structure.
        (
            "register: short data",
            lambda: io(IoOpcode.RESERVATION_REGISTER, 0, bytes(8)),
            Status.SGL_INVALID_DATA,
        ),
        (
            "acquire: short data",
            lambda: io(IoOpcode.RESERVATION_ACQUIRE, WE << 8, bytes(12)),
            Status.SGL_INVALID_DATA,
        ),
        (
            "release: short data",
            lambda: io(IoOpcode.RESERVATION_RELEASE, WE << 8, bytes(4)),
            Status.SGL_INVALID_DATA,
        ),
        (
            "register: no namespace",
            lambda: io(IoOpcode.RESERVATION_REGISTER, 0, R.REGISTER_DATA.pack(0, KC), nsid=7),
            Status.INVALID_NS,
        ),
        # A release by a registrant that does not hold the reservation: no effect.
        ("release: not the holder", lambda: nb.reservation_release(WE, crkey=KB), Status.SUCCESS),
        (
            "release: not the holder, another type",
            lambda: nb.reservation_release(EA, crkey=KB),
            Status.SUCCESS,
        ),
    ]
    expected = {name: status for name, _send, status in cases} | dict(differences or {})
    got = {name: await status_of(send()) for name, send, _status in cases}
    assert got == expected
    after = await nb.reservation_report()
    # Nothing changed but the generation, which every Register that completes successfully
    # increments (a target that took the reserved CPTPL value re-registered KB).
    registered = [n for n, status in got.items() if n.startswith("register") and not status]
    assert after == dataclasses.replace(before, generation=before.generation + len(registered))
    # Reserved bits are ignored (the receiver does not check them).
    await nb.reservation_register(nrkey=KB)
    await b.io_command(
        IoOpcode.RESERVATION_REGISTER,
        1,
        R.register_cdw10(RegisterAction.REGISTER) | 0x0FFFFFF0,
        data=R.REGISTER_DATA.pack(0, KB),
    )
    # The Linux host sends Release with 16 bytes of data: a larger buffer is fine.
    await b.io_command(
        IoOpcode.RESERVATION_RELEASE,
        1,
        R.release_cdw10(0, WE),
        data=R.RELEASE_DATA.pack(KB) + bytes(8),
    )
    # Nothing above disturbed the holder.
    await na.write(0, bytes(BLOCK))
