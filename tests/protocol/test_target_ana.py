"""ANA reporting on a live target driven by raw queues: the Identify fields, the ANA log
page (per port, RGO, change counts), ANA Change events (to the controllers whose log
changed, masked until read), the path-related statuses on unusable paths (touching
nothing), and the gateway pieces (peer listeners in the discovery log, CNTLID ranges)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import DISCOVERY_NQN, NOTICE_ANA_CHANGE, AdminOpcode, FeatureId
from pynvmf.spec.status import Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.cores.workers import MultiCoreTarget
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Subsystem
from tests.protocol.conftest import (
    RAW_NS1_BLOCK,
    RAW_SUBNQN,
    RawTarget,
    RawTargetFactory,
    raw_memory_subsystem,
)
from tests.protocol.test_target_compare import cmp_and_write
from tests.support.raw import RawQueue

ANA_EVENT = 0x2 | NOTICE_ANA_CHANGE << 8 | L.LogPageId.ANA << 16
ANA_LOG_MAX = 4096


@pytest.fixture
async def two_ports(raw_target_factory: RawTargetFactory) -> RawTarget:
    """RAW_SUBNQN on two ports; namespaces 1 and 2 in ANA group 1, namespace 3 in group 2."""
    rt = await raw_target_factory(None, [Port("127.0.0.1", 0), Port("127.0.0.1", 0)])
    rt.target.add_ana_group(RAW_SUBNQN, 2)
    rt.target.add_namespace(
        RAW_SUBNQN, NamedDevice.wrap("ns3", MemoryDevice(1 << 20), owned=True), nsid=3, anagrpid=2
    )
    return rt


async def ana_log(q: RawQueue, *, rgo: bool = False, rae: bool = False) -> L.AnaLog:
    numd = ANA_LOG_MAX // 4 - 1
    done = await q.cmd(
        AdminOpcode.GET_LOG_PAGE,
        cdw10=L.LogPageId.ANA | (1 << 8 if rgo else 0) | (1 << 15 if rae else 0) | numd << 16,
        read_len=ANA_LOG_MAX,
    )
    assert done.status == 0, done
    return L.AnaLog.unpack(done.data)


def states(log: L.AnaLog) -> dict[int, tuple[int, list[int]]]:
    return {g.grpid: (g.state, g.nsids) for g in log.groups}


async def enable_ana_events(q: RawQueue) -> None:
    done = await q.cmd(
        AdminOpcode.SET_FEATURES, cdw10=FeatureId.ASYNC_EVENT, cdw11=I.Oaes.ANA_CHANGE
    )
    assert done.status == 0 and done.result & I.Oaes.ANA_CHANGE, done


async def quiet(q: RawQueue, aer: asyncio.Future[object]) -> bool:
    """Whether the AER is still outstanding once a later command on the same queue has
    completed: the target completes an event's AER before it answers what follows."""
    assert (await q.cmd(AdminOpcode.KEEP_ALIVE)).status == 0
    return not aer.done()


async def test_identify_reports_ana_and_the_namespaces_groups(two_ports: RawTarget) -> None:
    q = await two_ports.admin()
    ident = I.IdentifyController.unpack((await q.identify(I.Cns.CTRL)).data)
    assert ident.cmic == I.Cmic.MULTI_PORT | I.Cmic.MULTI_CTRL | I.Cmic.ANA
    assert ident.anatt > 0
    # Every state reportable; ANAGRPID fixed while attached.
    assert ident.anacap & 0x1F == 0x1F and ident.anacap & 1 << 6
    assert ident.anagrpmax == ident.nanagrpid == 128
    assert 0 < ident.mnan <= ident.nn
    # The largest log the host must allocate fits one command (MDTS), or Linux disables ANA.
    assert 16 + ident.nanagrpid * 32 + ident.mnan * 4 <= (1 << ident.mdts) * 4096
    assert ident.oaes & I.Oaes.ANA_CHANGE
    for nsid, grpid in ((1, 1), (2, 1), (3, 2)):
        raw = (await q.identify(I.Cns.NS, nsid=nsid)).data
        assert struct.unpack_from("<I", raw, 92)[0] == grpid  # ANAGRPID, bytes 92-95
        assert raw[30] & I.NMIC_SHARED
        indep = I.IdentifyNamespaceIndependent.unpack(
            (await q.identify(I.Cns.CS_INDEP_NS, nsid=nsid)).data
        )
        assert indep.anagrpid == grpid and indep.nmic & I.NMIC_SHARED


async def test_the_ana_log_lists_groups_with_nsids_and_rgo_leaves_them_out(
    two_ports: RawTarget,
) -> None:
    q = await two_ports.admin()
    log = await ana_log(q)
    assert states(log) == {1: (AnaState.OPTIMIZED, [1, 2]), 2: (AnaState.OPTIMIZED, [3])}
    packed = log.pack()
    assert len(packed) == 16 + 2 * 32 + 3 * 4
    groups_only = await ana_log(q, rgo=True)
    assert groups_only.chgcnt == log.chgcnt
    assert [(g.grpid, g.state, g.nsids) for g in groups_only.groups] == [
        (1, AnaState.OPTIMIZED, []),
        (2, AnaState.OPTIMIZED, []),
    ]
    assert struct.unpack_from("<I", groups_only.pack(), 16 + 4)[0] == 0  # NNSIDS


async def test_states_are_per_listener_and_the_change_counts_move(two_ports: RawTarget) -> None:
    target = two_ports.target
    port_a, port_b = target.ports
    qa = await two_ports.admin(port=port_a)
    qb = await two_ports.admin(port=port_b)
    before = await ana_log(qa)
    target.set_ana_state(RAW_SUBNQN, 2, "inaccessible", port_b.address, port_b.port)
    la, lb = await ana_log(qa), await ana_log(qb)
    assert states(la)[2][0] == AnaState.OPTIMIZED
    assert states(lb)[2][0] == AnaState.INACCESSIBLE
    assert states(lb)[1][0] == AnaState.OPTIMIZED
    assert lb.chgcnt == la.chgcnt == before.chgcnt + 1
    # The group that changed carries the new count; the other keeps its own.
    group1, group2 = lb.groups
    assert group2.chgcnt == lb.chgcnt and group1.chgcnt == before.groups[0].chgcnt
    # Setting what is already so is no change.
    told = target.set_ana_state(RAW_SUBNQN, 2, "inaccessible", port_b.address, port_b.port)
    assert told == 0 and (await ana_log(qb)).chgcnt == lb.chgcnt
    # Without an address: every listener, and the per-listener state is gone.
    target.set_ana_state(RAW_SUBNQN, None, AnaState.NON_OPTIMIZED)
    for q in (qa, qb):
        assert {g: s for g, (s, _) in states(await ana_log(q)).items()} == {
            1: AnaState.NON_OPTIMIZED,
            2: AnaState.NON_OPTIMIZED,
        }


async def test_an_ana_change_event_goes_to_the_controllers_whose_log_changed(
    two_ports: RawTarget,
) -> None:
    target = two_ports.target
    port_a, port_b = target.ports
    qa = await two_ports.admin(port=port_a)
    qb = await two_ports.admin(port=port_b)
    silent = await two_ports.admin(port=port_b)  # never enables the event
    for q in (qa, qb):
        await enable_ana_events(q)
    aer_a = qa.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    aer_b = qb.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    aer_silent = silent.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    told = target.set_ana_state(RAW_SUBNQN, 2, "inaccessible", port_b.address, port_b.port)
    assert told == 2  # the two controllers on port B; not A's
    done = await asyncio.wait_for(aer_b, 5)
    assert (done.status, done.result) == (0, ANA_EVENT)
    assert await quiet(qa, aer_a)
    assert await quiet(silent, aer_silent)
    # Masked until read: another change on B raises nothing for B ...
    aer_b = qb.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    target.set_ana_state(RAW_SUBNQN, 2, "change", port_b.address, port_b.port)
    assert await quiet(qb, aer_b)
    # ... and reading the log with RAE keeps it masked ...
    assert states(await ana_log(qb, rae=True))[2][0] == AnaState.CHANGE
    target.set_ana_state(RAW_SUBNQN, 2, "optimized", port_b.address, port_b.port)
    assert await quiet(qb, aer_b)
    # ... until the host reads it without: then the next change is told.
    assert states(await ana_log(qb))[2][0] == AnaState.OPTIMIZED
    target.set_ana_state(RAW_SUBNQN, 2, "inaccessible", port_b.address, port_b.port)
    done = await asyncio.wait_for(aer_b, 5)
    assert done.result == ANA_EVENT
    # A change on every listener reaches A too.
    target.set_ana_state(RAW_SUBNQN, 1, "non_optimized")
    done = await asyncio.wait_for(aer_a, 5)
    assert done.result == ANA_EVENT
    # A namespace added to a group changes the log (its NSID list) for everyone.
    aer_a = qa.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    assert (await ana_log(qa)).groups  # reading unmasks
    target.add_namespace(
        RAW_SUBNQN, NamedDevice.wrap("ns4", MemoryDevice(1 << 20), owned=True), nsid=4, anagrpid=2
    )
    done = await asyncio.wait_for(aer_a, 5)
    assert done.result == ANA_EVENT
    assert states(await ana_log(qa))[2][1] == [3, 4]


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("inaccessible", Status.ANA_INACCESSIBLE),
        ("persistent_loss", Status.ANA_PERSISTENT_LOSS),
        ("change", Status.ANA_TRANSITION),
    ],
)
async def test_io_through_an_unusable_path_gets_a_path_status_and_touches_nothing(
    two_ports: RawTarget, state: str, status: int
) -> None:
    target = two_ports.target
    port_b = target.ports[1]
    admin_b = await two_ports.admin(port=port_b)
    io_b = await two_ports.open(port_b)
    await io_b.handshake()
    assert (await io_b.connect(RAW_SUBNQN, qid=1, cntlid=admin_b.cntlid)).status == 0
    host_a = await two_ports.host()
    io_a = host_a.io[0]
    original = bytes(range(256)) * 32  # 8 KiB: more than fits a capsule, so it needs R2T
    assert (await io_a.write(1, 0, original, RAW_NS1_BLOCK)).status == 0
    target.set_ana_state(RAW_SUBNQN, 1, state, port_b.address, port_b.port)
    r2t_before = io_b.counters.r2t
    new = b"\xee" * len(original)
    for done in (
        await io_b.write(1, 0, new, RAW_NS1_BLOCK, inline=False),
        await io_b.write(1, 0, new[:512], RAW_NS1_BLOCK, inline=True),
        await io_b.read(1, 0, 16, RAW_NS1_BLOCK),
        await io_b.cmd(0x08, nsid=1, cdw12=15),  # Write Zeroes
        await io_b.cmd(0x00, nsid=1),  # Flush
        await io_b.cmd(0x0E, nsid=1, read_len=4096, cdw10=1023),  # Reservation Report
    ):
        assert (done.status, done.dnr) == (status, False), done
    assert io_b.counters.r2t == r2t_before  # no data was asked for
    # Namespace 3 (group 2) and the admin queue are served through the same port.
    assert (await io_b.read(3, 0, 1, 512)).status == 0
    assert (await admin_b.identify(I.Cns.NS, nsid=1)).status == 0
    # Nothing was touched: the other path reads the original data.
    back = await io_a.read(1, 0, 16, RAW_NS1_BLOCK)
    assert back.status == 0 and back.data == original
    # Non-optimized serves I/O.
    target.set_ana_state(RAW_SUBNQN, 1, "non_optimized", port_b.address, port_b.port)
    assert (await io_b.read(1, 0, 16, RAW_NS1_BLOCK)).status == 0


async def test_a_fused_compare_and_write_on_an_inaccessible_path_is_refused(
    two_ports: RawTarget,
) -> None:
    target = two_ports.target
    host = await two_ports.host()
    io = host.io[0]
    original = b"\x11" * 512
    assert (await io.write(1, 0, original, RAW_NS1_BLOCK)).status == 0
    target.set_ana_state(RAW_SUBNQN, 1, "inaccessible")
    cmp, wr = await cmp_and_write(io, 0, original, b"\x22" * 512)
    assert (cmp.status, cmp.dnr) == (Status.ANA_INACCESSIBLE, False)
    assert (wr.status, wr.dnr) == (Status.ANA_INACCESSIBLE, False)
    target.set_ana_state(RAW_SUBNQN, 1, "optimized")
    assert (await io.read(1, 0, 1, RAW_NS1_BLOCK)).data == original


async def test_bad_ana_changes_are_refused_and_change_nothing(two_ports: RawTarget) -> None:
    target = two_ports.target
    port_b = target.ports[1]
    q = await two_ports.admin()
    before = await ana_log(q)
    for args, field in (
        ((RAW_SUBNQN, 9, "optimized"), "anagrpid"),
        ((RAW_SUBNQN, 0, "optimized"), "anagrpid"),
        ((RAW_SUBNQN, 129, "optimized"), "anagrpid"),
        ((RAW_SUBNQN, 1, "sleepy"), "ana_state"),
        ((RAW_SUBNQN, 1, 3), "ana_state"),
        ((RAW_SUBNQN, 1, "inaccessible", "127.0.0.1", 1), "address"),
        ((RAW_SUBNQN + "x", 1, "inaccessible"), "nqn"),
    ):
        with pytest.raises(ChangeError) as info:
            target.set_ana_state(*args)  # type: ignore[arg-type]
        assert info.value.field == field, args
    with pytest.raises(ChangeError):
        target.add_ana_group(RAW_SUBNQN, 2)  # exists
    with pytest.raises(ChangeError) as info:
        target.add_namespace(
            RAW_SUBNQN, NamedDevice.wrap("x", MemoryDevice(4096), owned=True), anagrpid=200
        )
    assert info.value.field == "anagrpid"
    assert 4 not in target.subsystems[RAW_SUBNQN].namespaces
    assert await ana_log(q) == before
    assert port_b in target.ports


async def test_discovery_lists_the_peer_gateways_listeners(two_ports: RawTarget) -> None:
    target = two_ports.target
    target.add_peer_listener(RAW_SUBNQN, "127.0.0.1", 24420, portid=7)
    with pytest.raises(ChangeError):
        target.add_peer_listener(RAW_SUBNQN, "127.0.0.1", 24420)
    q = await two_ports.admin(DISCOVERY_NQN)
    page = await _discovery(q)
    peers = [e for e in page.entries if e.trsvcid == "24420"]
    assert [(e.subnqn, e.traddr, e.portid, e.subtype) for e in peers] == [
        (RAW_SUBNQN, "127.0.0.1", 7, L.SubType.NVME)
    ]
    ours = {e.trsvcid for e in page.entries if e.subnqn == RAW_SUBNQN}
    assert ours == {str(p.port) for p in target.ports} | {"24420"}
    target.remove_peer_listener(RAW_SUBNQN, "127.0.0.1", 24420)
    assert not [e for e in (await _discovery(q)).entries if e.trsvcid == "24420"]


async def _discovery(q: RawQueue) -> L.DiscoveryLogPage:
    head = await q.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
    numrec = L.DiscoveryLogHeader.unpack(head.data).numrec
    full = await q.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE + numrec * 1024)
    return L.DiscoveryLogPage.unpack(full.data)


async def test_two_gateways_share_identities_with_disjoint_controller_ids(
    raw_target_factory: RawTargetFactory,
) -> None:
    """Two targets configured as gateways of one subsystem: same NQN, serial, NSIDs and
    namespace identifiers; controller IDs from disjoint ranges."""
    gateways = []
    for low, high in ((1, 2040), (2041, 4080)):
        subsystem: Subsystem = raw_memory_subsystem(
            serial="GWSERIAL01", cntlid_min=low, cntlid_max=high
        )
        gateways.append(await raw_target_factory([subsystem]))
    seen = []
    for gw in gateways:
        q = await gw.admin()
        ident = I.IdentifyController.unpack((await q.identify(I.Cns.CTRL)).data)
        ns = I.IdentifyNamespace.unpack((await q.identify(I.Cns.NS, nsid=1)).data)
        seen.append((ident.subnqn, ident.sn, ns.nguid, ns.eui64, ident.cntlid))
    (nqn_a, sn_a, nguid_a, eui_a, id_a), (nqn_b, sn_b, nguid_b, eui_b, id_b) = seen
    assert (nqn_a, sn_a, nguid_a, eui_a) == (nqn_b, sn_b, nguid_b, eui_b)
    assert 1 <= id_a <= 2040 < id_b <= 4080


async def test_the_ana_log_reads_in_pieces_up_to_its_largest_size(two_ports: RawTarget) -> None:
    """nvme-cli 2.3 reads the log in pieces sized by what Identify promises (header,
    NANAGRPID descriptors, MNAN NSIDs): past the groups it reads zeros; past that size,
    Invalid Field."""
    q = await two_ports.admin()
    ident = I.IdentifyController.unpack((await q.identify(I.Cns.CTRL)).data)
    largest = L.ANA_HEADER_SIZE + ident.nanagrpid * L.ANA_DESC_SIZE + 4 * ident.mnan
    whole = await ana_log(q)
    head = await q.get_log_page(L.LogPageId.ANA, 16)
    assert head.data == whole.pack()[:16]
    tail = await q.get_log_page(L.LogPageId.ANA, 4096, offset=4096)
    assert tail.status == 0 and tail.data == bytes(4096)
    last = await q.get_log_page(L.LogPageId.ANA, 4, offset=largest - 4)
    assert last.status == 0 and last.data == bytes(4)
    beyond = await q.get_log_page(L.LogPageId.ANA, 4, offset=largest + 4)
    assert (beyond.status, beyond.dnr) == (Status.INVALID_FIELD, True)


async def test_discovery_entries_leave_the_secure_channel_unspecified(
    two_ports: RawTarget,
) -> None:
    # libnvme 1.3 takes "not required" to mean TLS is possible and asks Linux 6.1 for it.
    q = await two_ports.admin(DISCOVERY_NQN)
    page = await _discovery(q)
    assert page.entries and all(e.treq & 0x3 == L.Treq.NOT_SPECIFIED for e in page.entries)


async def test_a_namespace_moved_to_another_ana_group_is_judged_by_it_on_a_worker() -> None:
    """--cores: the worker serving the I/O queue judges the moved namespace's I/O by its
    new group's state (inaccessible here) by the time the host hears of the move."""
    target = MultiCoreTarget(1, ports=[Port("127.0.0.1", 0)])
    target.add_subsystem(RAW_SUBNQN)
    device = target.memory_device(64 * 512, 512)
    target.add_namespace(RAW_SUBNQN, NamedDevice.wrap("moved", device, owned=True), nsid=1)
    await target.start()
    raw = RawTarget(target)
    try:
        admin = await raw.admin()
        io = await raw.io_queue(admin, 1)
        assert target.workers is not None
        assert [len(w.queues) for w in target.workers.workers] == [1]
        assert (await io.read(1, 0, 1, 512)).status == 0
        target.subsystems[RAW_SUBNQN].ana.add(2, AnaState.INACCESSIBLE)
        await enable_ana_events(admin)
        aer = admin.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
        target.set_namespace_ana_group(RAW_SUBNQN, 1, 2)
        # The event comes once the worker took the move: I/O after it sees the new group.
        done = await asyncio.wait_for(aer, 10)
        assert (done.status, done.result) == (0, ANA_EVENT)
        assert (await io.read(1, 0, 1, 512)).status == Status.ANA_INACCESSIBLE
        assert target.subsystems[RAW_SUBNQN].namespaces[1].anagrpid == 2
    finally:
        await raw.aclose()
