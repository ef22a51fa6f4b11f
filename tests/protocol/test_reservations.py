"""Reservations between two hosts with different Host Identifiers, over real TCP against the
in-process target: pynvmf's host library (and the raw client where the order of PDUs is the
point), conflicts, preemption, notifications with their AEN, Persist Through Power Loss
across a target restart, and bad input.

The checks that take only controllers (check_*: two or three hosts registered or not, on
a subsystem with namespaces 1 and 2) also run against the Linux kernel's nvmet
(tests/interop/test_linux_target_reservations.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.device import Buffer
from pynvmf.block.memory import MemoryDevice
from pynvmf.config.native import build_target
from pynvmf.host import Controller, NvmeStatusError, connect
from pynvmf.host.queue import Submission
from pynvmf.spec import identify as I
from pynvmf.spec import reservations as R
from pynvmf.spec.command import CNTLID_DYNAMIC, CopyRange, copy_cdw12, pack_copy_ranges
from pynvmf.spec.opcodes import NSID_ALL, AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.reservations import (
    AcquireAction,
    Cptpl,
    NotificationMask,
    NotificationType,
    RegisterAction,
    ReleaseAction,
    ReservationType,
)
from pynvmf.spec.status import Status
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RawTarget
from tests.support.raw import HOSTID as RAW_HOSTID
from tests.support.raw import HOSTNQN as RAW_HOSTNQN
from tests.support.raw import RawQueue

NQN = "nqn.2024-01.org.pynvmf:reservations"
BLOCK = 512
BLOCKS = 4096
WE = ReservationType.WRITE_EXCLUSIVE
EA = ReservationType.EXCLUSIVE_ACCESS
KA, KB, KC = 0xA1, 0xB2, 0xC3
# The six-byte AEN: type 6 (I/O command set specific), info 0, log page 80h.
RESERVATION_AEN = 6 | 0 << 8 | 0x80 << 16


def _identity(n: int) -> tuple[str, bytes]:
    ident = uuid.UUID(f"00000000-0000-4000-8000-0000000000{n:02x}")
    return f"nqn.2014-08.org.nvmexpress:uuid:{ident}", ident.bytes


HOST_A, HOST_B, HOST_C = _identity(0xA), _identity(0xB), _identity(0xC)


class GatedDevice(MemoryDevice):
    """A memory device whose writes wait for `gate` once `hold` is set."""

    def __init__(self, size: int, block_size: int) -> None:
        super().__init__(size, block_size)
        self.hold = False
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        if self.hold:
            self.started.set()
            await self.gate.wait()
        await super().write(lba, data, fua=fua)


def subsystem(*, device: MemoryDevice | None = None, nsids: int = 1) -> Subsystem:
    sub = Subsystem(NQN)
    for nsid in range(1, nsids + 1):
        dev = device if device is not None and nsid == 1 else MemoryDevice(BLOCK * BLOCKS, BLOCK)
        sub.add_namespace(Namespace.create(NQN, nsid, dev, f"memory:{nsid}"))
    return sub


Start = Callable[..., Awaitable[Target]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    started: list[Target] = []

    async def make(subsystems: list[Subsystem] | Target) -> Target:
        target = (
            subsystems
            if isinstance(subsystems, Target)
            else Target(subsystems, [Port("127.0.0.1", 0)])
        )
        await target.start()
        started.append(target)
        return target

    yield make
    for target in started:
        await target.stop()


@pytest.fixture
async def hosts() -> AsyncIterator[Callable[..., Awaitable[Controller]]]:
    made: list[Controller] = []

    async def make(target: Target, who: tuple[str, bytes], **kwargs: Any) -> Controller:
        ctrl = await connect(
            "127.0.0.1", target.ports[0].port, NQN, hostnqn=who[0], hostid=who[1], **kwargs
        )
        made.append(ctrl)
        return ctrl

    yield make
    for ctrl in made:
        await ctrl.close()


Hosts = Callable[..., Awaitable[Controller]]


async def _status_of(aw: Awaitable[object]) -> int:
    try:
        await aw
    except NvmeStatusError as exc:
        assert exc.dnr, exc
        return exc.status
    return Status.SUCCESS


async def _two_registered(start: Start, hosts: Hosts, **kw: Any) -> tuple[Controller, Controller]:
    target = await start([subsystem(**kw)])
    a, b = await hosts(target, HOST_A), await hosts(target, HOST_B)
    await a.namespace(1).reservation_register(nrkey=KA)
    await b.namespace(1).reservation_register(nrkey=KB)
    return a, b


async def test_identify_advertises_reservations(start: Start, hosts: Hosts) -> None:
    target = await start([subsystem()])
    a = await hosts(target, HOST_A)
    assert a.info is not None and a.info.oncs & I.Oncs.RESERVATIONS
    ns = await a.identify_namespace(1)
    # Every type and IEKEY as revision 1.3 defines it; no persistence for memory.
    assert ns.rescap == 0xFE
    buf = bytearray(4096)
    await a.admin_command(AdminOpcode.IDENTIFY, 1, I.Cns.CS_INDEP_NS, into=memoryview(buf))
    assert I.IdentifyNamespaceIndependent.unpack(buf).rescap == 0xFE


async def test_write_exclusive_refuses_the_other_hosts_writes_and_touches_nothing(
    start: Start, hosts: Hosts
) -> None:
    await check_write_exclusive(*await _two_registered(start, hosts))


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
        assert await _status_of(attempt) == Status.RESERVATION_CONFLICT
    # Refused before any data moved: no R2T for the 64 KiB write.
    assert sum(q.conn.stats.r2t_received for q in b.io_queues) == r2t_before
    back = bytearray(len(pattern))
    await nb.read(0, memoryview(back))  # reads stay open to everyone
    assert back == pattern
    await na.write(0, bytes(BLOCK))  # the holder writes
    await na.reservation_release(WE, crkey=KA)
    await nb.write(0, bytes(BLOCK))  # released: open again


async def test_exclusive_access_refuses_reads_too_and_registrants_only_lets_registrants_in(
    start: Start, hosts: Hosts
) -> None:
    a, b = await _two_registered(start, hosts)
    target_port = a.port
    c = await connect("127.0.0.1", target_port, NQN, hostnqn=HOST_C[0], hostid=HOST_C[1])
    try:
        await check_exclusive_access(a, b, c)
    finally:
        await c.close()


async def check_exclusive_access(a: Controller, b: Controller, c: Controller) -> None:
    """`a` and `b` registered KA and KB on namespace 1; `c`, a third host, did not."""
    na, nb, nc = a.namespace(1), b.namespace(1), c.namespace(1)
    buf = memoryview(bytearray(BLOCK))
    await na.reservation_acquire(EA, crkey=KA)
    assert await _status_of(nb.read(0, buf)) == Status.RESERVATION_CONFLICT
    assert await _status_of(nc.read(0, buf)) == Status.RESERVATION_CONFLICT
    await na.read(0, buf)
    await na.reservation_acquire(
        ReservationType.EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
        crkey=KA,
        prkey=KA,
        action=AcquireAction.PREEMPT,
    )
    await nb.read(0, buf)
    await nb.write(0, bytes(BLOCK))
    assert await _status_of(nc.read(0, buf)) == Status.RESERVATION_CONFLICT
    assert await _status_of(nc.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT


async def test_report_lists_both_registrants_with_host_ids_and_keys(
    start: Start, hosts: Hosts
) -> None:
    await check_report(*await _two_registered(start, hosts))


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
    assert await _status_of(no_eds) == Status.HOST_ID_INCONSISTENT


async def test_preempt_reaches_the_preempted_hosts_parked_aer_and_log(
    start: Start, hosts: Hosts
) -> None:
    await check_preempt(*await _two_registered(start, hosts))


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
    assert await _status_of(na.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT
    assert await _status_of(na.reservation_release(WE, crkey=KA)) == Status.RESERVATION_CONFLICT
    report = await nb.reservation_report()
    assert [(r.hostid, r.holds) for r in report.registrants] == [(HOST_B[1], True)]
    # The preempting host was told nothing: its AER is still parked, its log empty.
    assert not other_aer.done()
    assert (await b.reservation_notification()).count == 0
    other_aer.cancel()


async def test_release_and_clear_notify_the_other_registrants(start: Start, hosts: Hosts) -> None:
    await check_release_and_clear(*await _two_registered(start, hosts))


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


async def test_the_mask_silences_one_controller_for_one_namespace(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem(nsids=2)])
    await check_mask(await hosts(target, HOST_A), await hosts(target, HOST_B))


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
    assert await _status_of(get_all) == Status.INVALID_FIELD
    await b.set_features(FeatureId.RESERVATION_MASK, R.NOTIFICATION_MASK_ALL, nsid=NSID_ALL)
    assert await b.namespace(2).reservation_notification_mask() == R.NOTIFICATION_MASK_ALL
    bad = b.set_features(FeatureId.RESERVATION_MASK, 1, nsid=1)  # bit 0 is reserved
    assert await _status_of(bad) == Status.INVALID_FIELD
    missing = b.get_features(FeatureId.RESERVATION_MASK, nsid=9)
    assert await _status_of(missing) == no_namespace
    # The Select field, where ONCS says the controller has it (nvmet does not, and answers
    # the current value whatever SEL says).
    assert b.info is not None
    if b.info.oncs & I.Oncs.SAVE_FEATURES:
        caps = await b.get_features(FeatureId.RESERVATION_MASK, sel=3, nsid=1)
        assert caps == 0x6  # changeable, namespace specific


async def test_preempt_and_abort_completes_only_after_the_preempted_hosts_writes(
    start: Start, hosts: Hosts
) -> None:
    device = GatedDevice(BLOCK * BLOCKS, BLOCK)
    target = await start([subsystem(device=device)])
    a = await hosts(target, HOST_A)
    raw = RawTarget(target)
    try:
        b_admin = await raw.admin(NQN, hostnqn=RAW_HOSTNQN)
        b_io = await raw.io_queue(b_admin, 1, NQN, hostnqn=RAW_HOSTNQN)
        await a.namespace(1).reservation_register(nrkey=KA)
        done = await _raw_register(b_io, KB)
        assert done.status == 0, done
        await a.namespace(1).reservation_acquire(WE, crkey=KA)
        device.hold = True
        write = asyncio.ensure_future(a.namespace(1).write(0, b"\xaa" * BLOCK))
        await device.started.wait()
        acquire = b_io.cmd_nowait(
            IoOpcode.RESERVATION_ACQUIRE,
            nsid=1,
            cdw10=R.acquire_cdw10(AcquireAction.PREEMPT_AND_ABORT, WE),
            data=R.ACQUIRE_DATA.pack(KB, KA),
        )
        # Commands complete in order of the PDUs received: the report answering means the
        # target has committed the preemption, and the acquire would have answered first.
        report = await b_io.cmd(
            IoOpcode.RESERVATION_REPORT,
            nsid=1,
            cdw10=R.report_numd(4096),
            cdw11=1,
            read_len=4096,
        )
        status = R.ReservationStatus.unpack(report.data)
        assert [(r.hostid, r.holds) for r in status.registrants] == [(RAW_HOSTID, True)]
        assert not acquire.done()
        assert not write.done()
        device.gate.set()
        await write  # admitted before the preemption: it completes
        assert (await acquire).status == 0
        device.hold = False
        assert await _status_of(a.namespace(1).write(0, bytes(BLOCK))) == (
            Status.RESERVATION_CONFLICT
        )
    finally:
        await raw.aclose()


async def _raw_register(queue: RawQueue, key: int) -> Any:
    return await queue.cmd(
        IoOpcode.RESERVATION_REGISTER,
        nsid=1,
        cdw10=R.register_cdw10(RegisterAction.REGISTER),
        data=R.REGISTER_DATA.pack(0, key),
    )


async def test_controllers_of_one_host_share_its_registration(start: Start, hosts: Hosts) -> None:
    target = await start([subsystem()])
    await check_one_host_two_controllers(
        await hosts(target, HOST_A), await hosts(target, HOST_A), await hosts(target, HOST_B)
    )


async def check_one_host_two_controllers(a1: Controller, a2: Controller, b: Controller) -> None:
    """`a1` and `a2` are two controllers of HOST_A, `b` one of HOST_B, none registered."""
    assert a1.cntlid != a2.cntlid
    await a1.namespace(1).reservation_register(nrkey=KA)
    await b.namespace(1).reservation_register(nrkey=KB)
    # The second controller is the same registrant: same key, so registering is a no-op.
    await a2.namespace(1).reservation_register(nrkey=KA)
    clash = a2.namespace(1).reservation_register(nrkey=KC)
    assert await _status_of(clash) == Status.RESERVATION_CONFLICT
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


async def test_bad_input_gets_its_status_and_changes_nothing(start: Start, hosts: Hosts) -> None:
    await check_bad_input(*await _two_registered(start, hosts))


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
    got = {name: await _status_of(send()) for name, send, _status in cases}
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


async def test_memory_namespace_takes_cptpl_11b_but_does_not_persist(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem()])
    a = await hosts(target, HOST_A)
    na = a.namespace(1)
    # The Linux host's pr_ops set CPTPL 11b on every register.
    await na.reservation_register(nrkey=KA, cptpl=Cptpl.PERSIST)
    assert not await na.reservation_persistence()
    assert not (await na.reservation_report()).ptpls
    assert await _status_of(na.set_reservation_persistence(True)) == Status.INVALID_FIELD
    await na.set_reservation_persistence(False)


async def test_the_host_identifier_feature_is_the_connect_host_id(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem()])
    a = await hosts(target, HOST_A)
    assert await a.host_identifier() == HOST_A[1]
    buf = memoryview(bytearray(16))
    # EXHID 0 asks for a 64-bit identifier, which a fabrics host does not have.
    assert await _status_of(a.get_features(FeatureId.HOST_ID, 0, into=buf)) == (
        Status.INVALID_FIELD
    )


async def test_persist_through_power_loss_survives_a_target_restart(
    start: Start, hosts: Hosts, tmp_path: Path
) -> None:
    image = tmp_path / "ns.img"
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [{"nqn": NQN, "namespaces": [{"nsid": 1, "file": str(image), "size": "2M"}]}],
    }
    first = await build_target(config)
    await start(first)
    a, b = await hosts(first, HOST_A), await hosts(first, HOST_B)
    na = a.namespace(1)
    assert (await a.identify_namespace(1)).rescap == 0xFF
    await na.reservation_register(nrkey=KA, cptpl=Cptpl.PERSIST)
    await b.namespace(1).reservation_register(nrkey=KB)
    await na.reservation_acquire(WE, crkey=KA)
    assert await na.reservation_persistence()
    saved = await na.reservation_report()
    await a.close()
    await b.close()
    await first.stop()

    second = await build_target(config)
    await start(second)
    a, b = await hosts(second, HOST_A), await hosts(second, HOST_B)
    report = await b.namespace(1).reservation_report()
    assert report == saved and report.ptpls and report.rtype == WE
    assert await _status_of(b.namespace(1).write(0, bytes(BLOCK))) == (Status.RESERVATION_CONFLICT)
    await a.namespace(1).write(0, bytes(BLOCK))
    # PTPL cleared: the next restart starts with nothing.
    await a.namespace(1).set_reservation_persistence(False)
    await a.close()
    await b.close()
    await second.stop()
    third = await build_target(config)
    await start(third)
    b = await hosts(third, HOST_B)
    report = await b.namespace(1).reservation_report()
    assert report.count == 0 and report.rtype == 0 and not report.ptpls
    await b.namespace(1).write(0, bytes(BLOCK))


async def test_a_copy_reading_another_namespace_meets_its_reservation(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem(nsids=2)])
    a, b = await hosts(target, HOST_A), await hosts(target, HOST_B)
    n2 = a.namespace(2)
    await n2.write(0, b"\x5a" * BLOCK)
    await n2.reservation_register(nrkey=KA)
    await n2.reservation_acquire(EA, crkey=KA)
    assert await b.enable_copy_formats() & 1 << 2

    def copy_from_2(ctrl: Controller) -> Awaitable[int]:
        return ctrl.io_command(
            IoOpcode.COPY,
            1,
            0,
            0,
            copy_cdw12(1, 2),
            data=pack_copy_ranges([CopyRange(0, 1, snsid=2)], 2),
        )

    # B may write namespace 1, but not read namespace 2, which A holds exclusively.
    assert await _status_of(copy_from_2(b)) == Status.RESERVATION_CONFLICT
    back = bytearray(BLOCK)
    await b.namespace(1).read(0, memoryview(back))
    assert back == bytes(BLOCK)
    await a.enable_copy_formats()
    await copy_from_2(a)
    await b.namespace(1).read(0, memoryview(back))
    assert back == b"\x5a" * BLOCK


async def _fused_statuses(ctrl: Controller, expected: bytes, new: bytes) -> tuple[int, int]:
    """The Compare's and the Write's status of one fused Compare and Write at LBA 0."""
    queue = ctrl.next_queue()
    cmp, wr = await queue.submit_fused(
        Submission(IoOpcode.COMPARE, 1, 0, 0, 0, data=expected),
        Submission(IoOpcode.WRITE, 1, 0, 0, 0, data=new),
    )
    return await _status_of(queue.wait(cmp)), await _status_of(queue.wait(wr))


async def test_a_fused_compare_and_write_meets_the_reservation_as_a_read_and_a_write(
    start: Start, hosts: Hosts
) -> None:
    a, b = await _two_registered(start, hosts)
    na = a.namespace(1)
    old, new = bytes(BLOCK), b"\x77" * BLOCK
    await na.reservation_acquire(WE, crkey=KA)
    # Write Exclusive: B's Compare would be allowed, its Write is not; the pair fails.
    assert await _fused_statuses(b, old, new) == (Status.FUSED_FAIL, Status.RESERVATION_CONFLICT)
    await na.reservation_acquire(EA, crkey=KA, prkey=KA, action=AcquireAction.PREEMPT)
    assert await _fused_statuses(b, old, new) == (Status.RESERVATION_CONFLICT, Status.FUSED_FAIL)
    back = bytearray(BLOCK)
    await na.read(0, memoryview(back))
    assert back == old
    # The holder's pair runs.
    assert await na.compare_and_write(0, old, new)
    await na.read(0, memoryview(back))
    assert back == new


async def test_a_removed_namespace_takes_its_reservation_with_it(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem(nsids=2)])
    a, b = await hosts(target, HOST_A), await hosts(target, HOST_B)
    await a.namespace(1).reservation_register(nrkey=KA)
    await a.namespace(1).reservation_acquire(EA, crkey=KA)
    sub = target.subsystems[NQN]
    assert list(sub.registered) == [1]
    await target.remove_namespace(NQN, 1)
    assert sub.registered == {}
    await b.namespace(2).write(0, bytes(BLOCK))  # the other namespace never noticed
    device = NamedDevice.wrap("fresh", MemoryDevice(BLOCK * BLOCKS, BLOCK), owned=True)
    target.add_namespace(NQN, device, nsid=1)
    await b.refresh_namespaces()
    # A new namespace behind the NSID: no registrants, no reservation.
    assert (await b.namespace(1).reservation_report()).count == 0
    await b.namespace(1).write(0, bytes(BLOCK))
