"""Reservations between two hosts with different Host Identifiers, over real TCP against the
in-process target: pynvmf's host library (and the raw client where the order of PDUs is the
point), conflicts, preemption, notifications with their AEN, Persist Through Power Loss
across a target restart, and bad input.

The checks that take only controllers (tests/support/reservation_checks.py: two or three
hosts registered or not, on a subsystem with namespaces 1 and 2) also run against the Linux
kernel's nvmet (tests/interop/test_linux_target_reservations.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.device import Buffer
from pynvmf.block.memory import MemoryDevice
from pynvmf.config.native import build_target
from pynvmf.host import Controller, connect
from pynvmf.host.queue import Submission
from pynvmf.spec import identify as I
from pynvmf.spec import reservations as R
from pynvmf.spec.command import CopyRange, copy_cdw12, pack_copy_ranges
from pynvmf.spec.opcodes import AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.reservations import (
    AcquireAction,
    Cptpl,
    RegisterAction,
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
from tests.support.reservation_checks import (
    BLOCK,
    EA,
    HOST_A,
    HOST_B,
    HOST_C,
    KA,
    KB,
    WE,
    check_bad_input,
    check_exclusive_access,
    check_mask,
    check_one_host_two_controllers,
    check_preempt,
    check_release_and_clear,
    check_report,
    check_write_exclusive,
    status_of,
)

NQN = "nqn.2024-01.org.pynvmf:reservations"
BLOCKS = 4096


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


async def test_report_lists_both_registrants_with_host_ids_and_keys(
    start: Start, hosts: Hosts
) -> None:
    await check_report(*await _two_registered(start, hosts))


async def test_preempt_reaches_the_preempted_hosts_parked_aer_and_log(
    start: Start, hosts: Hosts
) -> None:
    await check_preempt(*await _two_registered(start, hosts))


async def test_release_and_clear_notify_the_other_registrants(start: Start, hosts: Hosts) -> None:
    await check_release_and_clear(*await _two_registered(start, hosts))


async def test_the_mask_silences_one_controller_for_one_namespace(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem(nsids=2)])
    await check_mask(await hosts(target, HOST_A), await hosts(target, HOST_B))


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
        assert await status_of(a.namespace(1).write(0, bytes(BLOCK))) == (
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


async def test_bad_input_gets_its_status_and_changes_nothing(start: Start, hosts: Hosts) -> None:
    await check_bad_input(*await _two_registered(start, hosts))


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
    assert await status_of(na.set_reservation_persistence(True)) == Status.INVALID_FIELD
    await na.set_reservation_persistence(False)


async def test_the_host_identifier_feature_is_the_connect_host_id(
    start: Start, hosts: Hosts
) -> None:
    target = await start([subsystem()])
    a = await hosts(target, HOST_A)
    assert await a.host_identifier() == HOST_A[1]
    buf = memoryview(bytearray(16))
    # EXHID 0 asks for a 64-bit identifier, which a fabrics host does not have.
    assert await status_of(a.get_features(FeatureId.HOST_ID, 0, into=buf)) == Status.INVALID_FIELD


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
    assert await status_of(b.namespace(1).write(0, bytes(BLOCK))) == Status.RESERVATION_CONFLICT
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
    assert await status_of(copy_from_2(b)) == Status.RESERVATION_CONFLICT
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
    return await status_of(queue.wait(cmp)), await status_of(queue.wait(wr))


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
