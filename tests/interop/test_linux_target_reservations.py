"""Reservations through pynvmf's host library against the Linux kernel's nvmet (6.13+, the
peers whose ``Peer.nvmet_reservations`` is set: linux-7) and against pynvmf's own target,
the same assertions on both: two and three hosts with their own Host Identifiers register,
acquire, conflict, report, preempt, release and clear; the preempted and released hosts
read their Reservation Notification log pages (and the AEN that announces one); the
notification mask silences one namespace.

The kernel target is a guest booted once for the module, exporting two null_blk namespaces
with ``resv_enable``; every test leaves no registrant behind (the ``hosts`` fixture clears
what a test left). pynvmf's target runs in-process, new for each test. Where the two
targets differ the difference is a field of the target under test (:class:`ResvTarget`),
checked by the tests: nvmet (7.2) completes a Release whose type is not the reservation's
with Reservation Conflict, where the NVM Command Set specification (and SPDK, and pynvmf)
say Invalid Field in Command; and nvmet has no Reservation Persistence feature (83h: Get
Features fails with Invalid Field) for namespaces that do not persist reservations.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeStatusError, connect
from pynvmf.spec import identify as I
from pynvmf.spec.command import CNTLID_DYNAMIC
from pynvmf.spec.opcodes import AdminOpcode
from pynvmf.spec.reservations import (
    RESCAP_ALL_TYPES,
    AcquireAction,
    NotificationMask,
    NotificationType,
    RegisterAction,
    ReleaseAction,
    Rescap,
    ReservationType,
)
from pynvmf.spec.status import Status
from pynvmf.target.server import Port, Target
from pynvmf.target.subsystem import Namespace, Subsystem
from tests.interop.guest import (
    PEERS,
    Guest,
    free_tcp_port,
    require_guest_prerequisites,
    selected_peers,
    setup_kernel_target,
)

NQN = "nqn.2014-08.org.pynvmf:host-reservations"
MIB = 1 << 20
SIZE = 16 * MIB
BLOCK = 512
NSIDS = (1, 2)
WE = ReservationType.WRITE_EXCLUSIVE
EA = ReservationType.EXCLUSIVE_ACCESS
KA, KB, KC = 0xA1, 0xB2, 0xC3
# The AEN a new Reservation Notification log page raises: type 6 (I/O command set
# specific), information 0 (log page available), log page 80h.
RESERVATION_AEN = 6 | 0 << 8 | 0x80 << 16
TIMEOUT = 30.0  # a TCG guest is slow to answer
# Kinds of target: the kernel peers whose nvmet has reservations, and pynvmf's.
TARGET_KINDS = [p.name for p in selected_peers() if p.nvmet_reservations] + ["pynvmf"]


def _identity(n: int) -> tuple[str, bytes]:
    ident = uuid.UUID(f"00000000-0000-4000-8000-00000000c0{n:02x}")
    return f"nqn.2014-08.org.nvmexpress:uuid:{ident}", ident.bytes


HOST_A, HOST_B, HOST_C = _identity(0xA), _identity(0xB), _identity(0xC)


@dataclass(frozen=True)
class ResvTarget:
    kind: str
    port: int
    # The status of a Release whose RTYPE is not the reservation's.
    release_type_mismatch: int
    # Whether Get Features Reservation Persistence (83h) answers for a namespace that
    # cannot persist reservations (PTPLS clear).
    persistence_feature: bool


@pytest.fixture(scope="module", params=TARGET_KINDS)
def target_kind(request: pytest.FixtureRequest) -> str:
    """Module-scoped, so that pytest runs each kind's tests together."""
    kind: str = request.param
    return kind


@pytest.fixture(scope="module")
def kernel_target(target_kind: str) -> Iterator[ResvTarget]:
    peer = PEERS[target_kind]
    require_guest_prerequisites(peer)
    port = free_tcp_port()
    with Guest(hostfwd=[port], peer=peer) as guest:
        for nsid in NSIDS:
            setup_kernel_target(
                guest,
                port=port,
                nqn=NQN,
                nsid=nsid,
                size_mb=SIZE // MIB,
                block_size=BLOCK,
                reservations=True,
            )
        yield ResvTarget(
            peer.name,
            port,
            release_type_mismatch=Status.RESERVATION_CONFLICT,
            persistence_feature=False,
        )


@pytest.fixture
async def pynvmf_target() -> AsyncIterator[ResvTarget]:
    subsystem = Subsystem(NQN)
    for nsid in NSIDS:
        device = MemoryDevice(SIZE, BLOCK)
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    try:
        yield ResvTarget(
            "pynvmf",
            target.ports[0].port,
            release_type_mismatch=Status.INVALID_FIELD,
            persistence_feature=True,
        )
    finally:
        await target.stop()


@pytest.fixture
def target(request: pytest.FixtureRequest, target_kind: str) -> ResvTarget:
    """Not a coroutine: the async fixture it picks must be set up outside the running loop."""
    fixture = "pynvmf_target" if target_kind == "pynvmf" else "kernel_target"
    chosen: ResvTarget = request.getfixturevalue(fixture)
    return chosen


Hosts = Callable[[tuple[str, bytes]], Awaitable[Controller]]


async def _status_of(aw: Awaitable[object]) -> int:
    try:
        await aw
    except NvmeStatusError as exc:
        return exc.status
    return Status.SUCCESS


async def _clear_all(ctrl: Controller) -> None:
    """Whatever registrations and reservation a namespace has, gone (IEKEY replaces any key
    this host had, then Clear drops everyone's)."""
    for nsid in NSIDS:
        ns = ctrl.namespace(nsid)
        if await _status_of(ns.reservation_register(nrkey=KA)) != Status.SUCCESS:
            await ns.reservation_register(nrkey=KA, action=RegisterAction.REPLACE, iekey=True)
        await ns.reservation_release(0, crkey=KA, action=ReleaseAction.CLEAR)
        assert (await ns.reservation_report()).count == 0


@pytest.fixture
async def hosts(target: ResvTarget) -> AsyncIterator[Hosts]:
    """Controllers of the target as given hosts; afterwards no registrant is left."""
    made: list[Controller] = []

    async def make(who: tuple[str, bytes]) -> Controller:
        ctrl = await connect(
            "127.0.0.1", target.port, NQN, hostnqn=who[0], hostid=who[1], timeout=TIMEOUT
        )
        made.append(ctrl)
        return ctrl

    yield make
    try:
        if target.kind != "pynvmf":
            cleaner = await make(HOST_A)
            await _clear_all(cleaner)
            # What a test's hosts were told about the clearing is not the next test's.
            for ctrl in made:
                while (await ctrl.reservation_notification()).count:
                    pass
    finally:
        for ctrl in made:
            await ctrl.close()


async def _two_registered(hosts: Hosts) -> tuple[Controller, Controller]:
    a, b = await hosts(HOST_A), await hosts(HOST_B)
    await a.namespace(1).reservation_register(nrkey=KA)
    await b.namespace(1).reservation_register(nrkey=KB)
    return a, b


async def test_identify_advertises_reservations(target: ResvTarget, hosts: Hosts) -> None:
    a = await hosts(HOST_A)
    assert a.info is not None and a.info.oncs & I.Oncs.RESERVATIONS
    for nsid in NSIDS:
        ns = await a.identify_namespace(nsid)
        # Every type, and IEKEY as revision 1.3 defines it; neither target persists these
        # namespaces' reservations.
        assert ns.rescap == RESCAP_ALL_TYPES | Rescap.IEKEY, hex(ns.rescap)
    assert await a.host_identifier() == HOST_A[1]
    persistence = a.namespace(1).reservation_persistence()
    if target.persistence_feature:
        assert await persistence is False
    else:
        assert await _status_of(persistence) == Status.INVALID_FIELD


async def test_write_exclusive_refuses_the_other_hosts_writes(
    target: ResvTarget, hosts: Hosts
) -> None:
    a, b = await _two_registered(hosts)
    na, nb = a.namespace(1), b.namespace(1)
    pattern = bytes(range(256)) * 256  # 64 KiB: beyond the in-capsule size
    await na.write(0, pattern)
    await na.reservation_acquire(WE, crkey=KA)
    for attempt in (nb.write(0, bytes(BLOCK)), nb.write(0, pattern), nb.write_zeroes(0, 8)):
        assert await _status_of(attempt) == Status.RESERVATION_CONFLICT
    back = bytearray(len(pattern))
    await nb.read(0, memoryview(back))  # reads stay open to everyone
    assert back == pattern
    await na.write(0, bytes(BLOCK))  # the holder writes
    # Another type, or the wrong key, does not release it.
    mismatch = await _status_of(na.reservation_release(EA, crkey=KA))
    assert mismatch == target.release_type_mismatch
    assert await _status_of(na.reservation_release(WE, crkey=KB)) == Status.RESERVATION_CONFLICT
    assert await _status_of(nb.reservation_acquire(WE, crkey=KB)) == Status.RESERVATION_CONFLICT
    await na.reservation_release(WE, crkey=KA)
    await nb.write(0, bytes(BLOCK))  # released: open again


async def test_exclusive_access_refuses_reads_and_registrants_only_lets_registrants_in(
    target: ResvTarget, hosts: Hosts
) -> None:
    a, b = await _two_registered(hosts)
    c = await hosts(HOST_C)
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


async def test_report_lists_the_registrants_with_host_ids_and_keys(
    target: ResvTarget, hosts: Hosts
) -> None:
    a, b = await _two_registered(hosts)
    await b.namespace(1).reservation_acquire(WE, crkey=KB)
    report = await a.namespace(1).reservation_report()
    assert (report.rtype, report.count, report.ptpls) == (WE, 2, False)
    got = sorted((r.hostid, r.rkey, r.holds) for r in report.registrants)
    assert got == [(HOST_A[1], KA, False), (HOST_B[1], KB, True)]
    # Both targets are dynamic controller subsystems: no registrant names its controller.
    assert {r.cntlid for r in report.registrants} == {CNTLID_DYNAMIC}
    # A buffer that holds the header alone: the count still says two.
    short = await a.namespace(1).reservation_report(length=64)
    assert short.count == 2 and short.registrants == []
    # Fabrics Host Identifiers are 128-bit: the 64-bit structure cannot carry them.
    no_eds = a.namespace(1).reservation_report(extended=False)
    assert await _status_of(no_eds) == Status.HOST_ID_INCONSISTENT
    # Unregistering takes a host out of the report.
    await a.namespace(1).reservation_register(crkey=KA, action=RegisterAction.UNREGISTER)
    report = await b.namespace(1).reservation_report()
    assert [(r.hostid, r.holds) for r in report.registrants] == [(HOST_B[1], True)]


async def test_preempt_tells_the_preempted_host_by_aen_and_log_page(
    target: ResvTarget, hosts: Hosts
) -> None:
    a, b = await _two_registered(hosts)
    na, nb = a.namespace(1), b.namespace(1)
    await na.reservation_acquire(WE, crkey=KA)
    aer = asyncio.ensure_future(a.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    await nb.reservation_acquire(WE, crkey=KB, prkey=KA, action=AcquireAction.PREEMPT)
    assert (await asyncio.wait_for(aer, TIMEOUT)) & 0xFFFFFF == RESERVATION_AEN
    page = await a.reservation_notification()
    assert (page.count, page.type, page.nsid) == (1, NotificationType.REGISTRATION_PREEMPTED, 1)
    assert (await a.reservation_notification()).count == 0  # read means removed
    # A is no registrant any more: its writes conflict, its old key is nothing.
    assert await _status_of(na.write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT
    assert await _status_of(na.reservation_release(WE, crkey=KA)) == Status.RESERVATION_CONFLICT
    report = await nb.reservation_report()
    assert [(r.hostid, r.holds) for r in report.registrants] == [(HOST_B[1], True)]
    # The preempting host was told nothing.
    assert (await b.reservation_notification()).count == 0


async def test_release_and_clear_notify_the_other_registrants(
    target: ResvTarget, hosts: Hosts
) -> None:
    a, b = await _two_registered(hosts)
    na, nb = a.namespace(1), b.namespace(1)
    rtype = ReservationType.WRITE_EXCLUSIVE_REGISTRANTS_ONLY
    await na.reservation_acquire(rtype, crkey=KA)
    await na.reservation_release(rtype, crkey=KA)
    page = await b.reservation_notification()
    assert (page.type, page.nsid) == (NotificationType.RESERVATION_RELEASED, 1)
    await na.reservation_release(0, crkey=KA, action=ReleaseAction.CLEAR)
    page = await b.reservation_notification()
    assert (page.type, page.nsid) == (NotificationType.RESERVATION_PREEMPTED, 1)
    assert (await a.reservation_notification()).count == 0
    report = await nb.reservation_report()
    assert report.count == 0 and report.rtype == 0


async def test_the_mask_silences_one_namespace(target: ResvTarget, hosts: Hosts) -> None:
    a, b = await hosts(HOST_A), await hosts(HOST_B)
    for nsid in NSIDS:
        await a.namespace(nsid).reservation_register(nrkey=KA)
        await b.namespace(nsid).reservation_register(nrkey=KB)
    nb = b.namespace(1)
    await nb.set_reservation_notification_mask(NotificationMask.RESPRE)
    assert await nb.reservation_notification_mask() == NotificationMask.RESPRE
    assert await b.namespace(2).reservation_notification_mask() == 0
    for nsid in NSIDS:
        await a.namespace(nsid).reservation_release(0, crkey=KA, action=ReleaseAction.CLEAR)
    page = await b.reservation_notification()
    assert (page.type, page.nsid) == (NotificationType.RESERVATION_PREEMPTED, 2)
    assert (await b.reservation_notification()).count == 0
    await nb.set_reservation_notification_mask(0)
