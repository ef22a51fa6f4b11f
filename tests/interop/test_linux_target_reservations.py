"""Reservations through pynvmf's host library against the Linux kernel's nvmet (6.13+, the
peers whose ``Peer.nvmet_reservations`` is set: linux-7) and against pynvmf's own target:
the two- and three-host checks of tests/support/reservation_checks.py (which
tests/protocol/test_reservations.py runs too) run on both. Hosts with their own Host
Identifiers register, acquire, conflict (a conflicting 64 KiB write refused before any
R2T), report, preempt (with the AEN and the log page), release and clear, share one
registration across two controllers of a host, set the notification mask per namespace,
and send bad input.

The kernel target is a guest booted once for the module; each test gets a subsystem of
its own (two null_blk namespaces with ``resv_enable``), so no registration, generation or
log page count carries over. pynvmf's target runs in-process, new for each test. Where
nvmet answers otherwise than pynvmf the difference is a field of the target under test
(:class:`ResvTarget`), asserted by the tests: Linux 7.2's nvmet answers a reserved action
value with Invalid Opcode and a Release of another type than held with Reservation
Conflict (the NVM Command Set specification, SPDK and pynvmf: Invalid Field in Command),
takes the reserved CPTPL value 01b, answers Get Features of the notification mask for an
inactive NSID with Invalid Field (pynvmf: Invalid Namespace or Format), and has no
Reservation Persistence feature for namespaces that cannot persist reservations.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, NvmeStatusError, connect
from pynvmf.spec import identify as I
from pynvmf.spec.reservations import RESCAP_ALL_TYPES, Rescap
from pynvmf.spec.status import Status
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support import reservation_checks as checks
from tests.support.guest import (
    NVMET_RESERVATIONS,
    PEERS,
    Guest,
    require_guest_prerequisites,
    setup_kernel_target,
    teardown_kernel_target,
)
from tests.support.ports import free_tcp_port
from tests.support.reservation_checks import HOST_A, HOST_B, HOST_C, KA, KB

NQN = "nqn.2014-08.org.pynvmf:host-reservations"
MIB = 1 << 20
SIZE = 16 * MIB
BLOCK = 512
NSIDS = (1, 2)
TIMEOUT = 30.0  # a TCG guest is slow to answer
# Kinds of target: the kernel peers whose nvmet has reservations, and pynvmf's.
TARGET_KINDS = [p.name for p in NVMET_RESERVATIONS.peers()] + ["pynvmf"]


@dataclass(frozen=True)
class ResvTarget:
    kind: str
    port: int
    nqn: str
    # Whether Get Features Reservation Persistence (83h) answers for a namespace that
    # cannot persist reservations (PTPLS clear).
    persistence_feature: bool = True
    # Get Features of the notification mask (82h) for an inactive NSID.
    no_namespace: int = Status.INVALID_NS
    # checks.check_bad_input's cases this target answers otherwise than pynvmf's.
    bad_input: Mapping[str, int] = field(default_factory=dict)


@dataclass
class KernelGuest:
    guest: Guest
    port: int
    subsystems: Iterator[int]


@pytest.fixture(scope="module", params=TARGET_KINDS)
def target_kind(request: pytest.FixtureRequest) -> str:
    """Module-scoped, so that pytest runs each kind's tests together."""
    kind: str = request.param
    return kind


@pytest.fixture(scope="module")
def kernel_guest(target_kind: str) -> Iterator[KernelGuest]:
    peer = PEERS[target_kind]
    require_guest_prerequisites(peer)
    port = free_tcp_port()
    with Guest(hostfwd=[port], peer=peer) as guest:
        yield KernelGuest(guest, port, itertools.count())


@pytest.fixture
def kernel_target(kernel_guest: KernelGuest) -> Iterator[ResvTarget]:
    nqn = f"{NQN}-{next(kernel_guest.subsystems)}"
    exports = [
        setup_kernel_target(
            kernel_guest.guest,
            port=kernel_guest.port,
            nqn=nqn,
            nsid=nsid,
            size_mb=SIZE // MIB,
            block_size=BLOCK,
            reservations=True,
        )
        for nsid in NSIDS
    ]
    # What Linux 7.2's nvmet answers otherwise (the module's docstring).
    yield ResvTarget(
        kernel_guest.guest.peer.name,
        kernel_guest.port,
        nqn,
        persistence_feature=False,
        no_namespace=Status.INVALID_FIELD,
        bad_input={
            "register: reserved action": Status.INVALID_OPCODE,
            "acquire: reserved action": Status.INVALID_OPCODE,
            "release: reserved action": Status.INVALID_OPCODE,
            "register: reserved CPTPL": Status.SUCCESS,
            "release: another type": Status.RESERVATION_CONFLICT,
        },
    )
    for export in exports:
        teardown_kernel_target(kernel_guest.guest, export)


@pytest.fixture
async def pynvmf_target() -> AsyncIterator[ResvTarget]:
    subsystem = Subsystem(NQN)
    for nsid in NSIDS:
        device = MemoryDevice(SIZE, BLOCK)
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    try:
        yield ResvTarget("pynvmf", target.ports[0].port, NQN)
    finally:
        await target.stop()


@pytest.fixture
def target(request: pytest.FixtureRequest, target_kind: str) -> ResvTarget:
    """Not a coroutine: the async fixture it picks must be set up outside the running loop."""
    fixture = "pynvmf_target" if target_kind == "pynvmf" else "kernel_target"
    chosen: ResvTarget = request.getfixturevalue(fixture)
    return chosen


Hosts = Callable[[tuple[str, bytes]], Awaitable[Controller]]


@pytest.fixture
async def hosts(target: ResvTarget) -> AsyncIterator[Hosts]:
    """Controllers of the target as given hosts, closed afterwards."""
    made: list[Controller] = []

    async def make(who: tuple[str, bytes]) -> Controller:
        ctrl = await connect(
            "127.0.0.1", target.port, target.nqn, hostnqn=who[0], hostid=who[1], timeout=TIMEOUT
        )
        made.append(ctrl)
        return ctrl

    yield make
    for ctrl in made:
        await ctrl.close()


async def _status_of(aw: Awaitable[object]) -> int:
    try:
        await aw
    except NvmeStatusError as exc:
        return exc.status
    return Status.SUCCESS


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


async def test_write_exclusive(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_write_exclusive(*await _two_registered(hosts))


async def test_exclusive_access_and_registrants_only(target: ResvTarget, hosts: Hosts) -> None:
    a, b = await _two_registered(hosts)
    await checks.check_exclusive_access(a, b, await hosts(HOST_C))


async def test_report(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_report(*await _two_registered(hosts))


async def test_preempt(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_preempt(*await _two_registered(hosts))


async def test_release_and_clear(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_release_and_clear(*await _two_registered(hosts))


async def test_the_mask(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_mask(await hosts(HOST_A), await hosts(HOST_B), target.no_namespace)


async def test_one_host_two_controllers(target: ResvTarget, hosts: Hosts) -> None:
    await checks.check_one_host_two_controllers(
        await hosts(HOST_A), await hosts(HOST_A), await hosts(HOST_B)
    )


async def test_bad_input(target: ResvTarget, hosts: Hosts) -> None:
    a, b = await _two_registered(hosts)
    await checks.check_bad_input(a, b, target.bad_input)
