"""`--cores 2` with ANA in use: I/O queues on the workers meet the states the main
process sets, from the moment `set_ana_state` returns.

A MultiCoreTarget with two real worker processes, one subsystem on two listeners,
namespace 1 in ANA group 1 and namespace 2 in group 2; raw queues (tests/support/raw.py)
on both listeners, each I/O queue handed to a worker. What is checked: every path-related
status (302h, 301h, 303h) per listener and group on the workers, before any R2T and with
nothing written, fused pairs included; the ANA Change event and the log page from the
main process agree with what the workers do; no command sent after set_ana_state
returned is accepted; groups and namespaces added at run time; a subsystem removed and
added again starts from its own states.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import AdminOpcode
from pynvmf.spec.status import Status
from pynvmf.target.cores.workers import MultiCoreTarget, RemoteQueue
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from tests.protocol.conftest import RawTarget
from tests.protocol.test_target_ana import ANA_EVENT, ana_log, enable_ana_events, states
from tests.protocol.test_target_compare import cmp_and_write
from tests.support.raw import RawQueue

NQN = "nqn.2024-01.io.pynvmf.test:cores-ana"
BLOCK = 512
BLOCKS = 4096


def _add_memory(target: MultiCoreTarget, nsid: int, anagrpid: int) -> None:
    device = target.memory_device(BLOCKS * BLOCK, BLOCK)
    entry = NamedDevice.wrap(f"{NQN}/{nsid}", device, owned=True)
    target.add_namespace(NQN, entry, nsid=nsid, anagrpid=anagrpid)


def _subsystem(target: MultiCoreTarget) -> None:
    target.add_subsystem(NQN)
    target.add_ana_group(NQN, 2)
    _add_memory(target, 1, 1)
    _add_memory(target, 2, 2)


@pytest.fixture
async def rt() -> AsyncIterator[RawTarget]:
    target = MultiCoreTarget(2, ports=[Port("127.0.0.1", 0), Port("127.0.0.1", 0)])
    _subsystem(target)
    await target.start()
    raw = RawTarget(target)
    yield raw
    await raw.aclose()


async def _io(rt: RawTarget, admin: RawQueue, qid: int, port: Port) -> RawQueue:
    queue = await rt.open(port)
    await queue.handshake()
    done = await queue.connect(NQN, qid=qid, cntlid=admin.cntlid)
    assert done.status == 0, done
    return queue


async def _paths(rt: RawTarget) -> tuple[RawQueue, RawQueue, list[RawQueue], list[RawQueue]]:
    """An association through each listener with two I/O queues; all four queues on the
    workers, two each."""
    port_a, port_b = rt.target.ports
    admin_a = await rt.admin(NQN, port=port_a)
    admin_b = await rt.admin(NQN, port=port_b)
    io_a = [await _io(rt, admin_a, qid, port_a) for qid in (1, 2)]
    io_b = [await _io(rt, admin_b, qid, port_b) for qid in (1, 2)]
    target = rt.target
    assert isinstance(target, MultiCoreTarget) and target.workers is not None
    assert [len(w.queues) for w in target.workers.workers] == [2, 2]
    for ctrl in target.subsystems[NQN].controllers.values():
        assert all(isinstance(q, RemoteQueue) for qid, q in ctrl.queues.items() if qid)
    return admin_a, admin_b, io_a, io_b


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("inaccessible", Status.ANA_INACCESSIBLE),
        ("persistent_loss", Status.ANA_PERSISTENT_LOSS),
        ("change", Status.ANA_TRANSITION),
    ],
)
async def test_queues_on_the_workers_get_each_listeners_path_status(
    rt: RawTarget, state: str, status: int
) -> None:
    target = rt.target
    port_b = target.ports[1]
    admin_a, admin_b, io_a, io_b = await _paths(rt)
    for admin in (admin_a, admin_b):
        await enable_ana_events(admin)
    aer_a = admin_a.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    aer_b = admin_b.cmd_nowait(AdminOpcode.ASYNC_EVENT_REQUEST)
    original = bytes(range(256)) * 32  # 8 KiB: more than a capsule holds, so R2T
    assert (await io_a[0].write(1, 0, original, BLOCK)).status == 0
    told = target.set_ana_state(NQN, 1, state, port_b.address, port_b.port)
    assert told == 1
    new = b"\xee" * len(original)
    for queue in io_b:  # one on each worker
        r2t_before = queue.counters.r2t
        for done in (
            await queue.write(1, 0, new, BLOCK, inline=False),
            await queue.write(1, 0, new[:BLOCK], BLOCK, inline=True),
            await queue.read(1, 0, 16, BLOCK),
            await queue.cmd(0x08, nsid=1, cdw12=15),  # Write Zeroes
            await queue.cmd(0x00, nsid=1),  # Flush
        ):
            assert (done.status, done.dnr) == (status, False), done
        assert queue.counters.r2t == r2t_before  # no data was asked for
        cmp, wr = await cmp_and_write(queue, 0, original[:BLOCK], new[:BLOCK])
        assert (cmp.status, cmp.dnr, wr.status, wr.dnr) == (status, False, status, False)
        # Group 2 through the same listener is served.
        assert (await queue.read(2, 0, 1, BLOCK)).status == 0
    # The other listener serves group 1, and nothing was written.
    for queue in io_a:
        back = await queue.read(1, 0, 16, BLOCK)
        assert back.status == 0 and back.data == original
    # The event went to the controller on B alone; its log page says what its queues did.
    done = await asyncio.wait_for(aer_b, 5)
    assert (done.status, done.result) == (0, ANA_EVENT)
    assert not aer_a.done()
    assert states(await ana_log(admin_b))[1][0] == AnaState[state.upper()]
    assert states(await ana_log(admin_a))[1][0] == AnaState.OPTIMIZED
    # Non-optimized serves I/O on the workers again.
    target.set_ana_state(NQN, 1, "non_optimized", port_b.address, port_b.port)
    for queue in io_b:
        assert (await queue.write(1, 0, new[:BLOCK], BLOCK)).status == 0
    assert states(await ana_log(admin_b))[1][0] == AnaState.NON_OPTIMIZED


async def test_no_command_sent_after_set_ana_state_returned_is_accepted(rt: RawTarget) -> None:
    target = rt.target
    port_b = target.ports[1]
    _admin_a, _admin_b, io_a, io_b = await _paths(rt)
    data = b"\x5a" * BLOCK
    # A stream of writes on both workers' queues, and the change in the middle of it.
    before = [q.write(1, lba, data, BLOCK) for lba in range(0, 64) for q in io_b]
    sent_before = [asyncio.ensure_future(c) for c in before]
    await asyncio.sleep(0)  # the first of them leave
    target.set_ana_state(NQN, None, "inaccessible", port_b.address, port_b.port)
    after = [
        asyncio.ensure_future(q.write(1, lba, data, BLOCK))
        for lba in range(1024, 1024 + 64)
        for q in io_b
    ]
    for done in await asyncio.gather(*sent_before):
        # Sent before: either state may have applied (as on one queue in one process).
        assert done.status in (0, Status.ANA_INACCESSIBLE), done
    for done in await asyncio.gather(*after):
        assert (done.status, done.dnr) == (Status.ANA_INACCESSIBLE, False), done
    back = await io_a[0].read(1, 1024, 64, BLOCK)
    assert back.status == 0 and back.data == bytes(64 * BLOCK)
    # And back: the first command after the change is served.
    target.set_ana_state(NQN, None, "optimized", port_b.address, port_b.port)
    for queue in io_b:
        assert (await queue.write(1, 2048, data, BLOCK)).status == 0


async def test_groups_and_namespaces_added_at_run_time_reach_the_workers(rt: RawTarget) -> None:
    target = rt.target
    assert isinstance(target, MultiCoreTarget)
    # Added to the running target (the workers get the namespace, with its group, by
    # message); the queues handed over after it find it there (one channel, in order).
    target.add_ana_group(NQN, 3, "inaccessible")
    _add_memory(target, 3, 3)
    _admin_a, _admin_b, io_a, _io_b = await _paths(rt)
    for queue in io_a:
        done = await queue.read(3, 0, 1, BLOCK)
        assert (done.status, done.dnr) == (Status.ANA_INACCESSIBLE, False), done
        assert (await queue.read(1, 0, 1, BLOCK)).status == 0
    target.set_ana_state(NQN, 3, "optimized")
    for queue in io_a:
        assert (await queue.read(3, 0, 1, BLOCK)).status == 0
    # A change on every listener, of every group.
    target.set_ana_state(NQN, None, "change")
    for queue in io_a:
        for nsid in (1, 2, 3):
            assert (await queue.read(nsid, 0, 1, BLOCK)).status == Status.ANA_TRANSITION
    target.set_ana_state(NQN, None, "optimized")
    for queue in io_a:
        for nsid in (1, 2, 3):
            assert (await queue.read(nsid, 0, 1, BLOCK)).status == 0


async def test_a_subsystem_added_again_starts_from_its_own_states(rt: RawTarget) -> None:
    target = rt.target
    assert isinstance(target, MultiCoreTarget)
    _admin_a, _admin_b, io_a, _io_b = await _paths(rt)
    target.set_ana_state(NQN, None, "persistent_loss")
    assert (await io_a[0].read(1, 0, 1, BLOCK)).status == Status.ANA_PERSISTENT_LOSS
    listeners = [(p.address, p.port) for p in target.ports]
    await target.remove_subsystem(NQN)
    for queue in rt.queues:
        await queue.expect_eof(timeout=10)
    rt.queues.clear()
    _subsystem(target)
    for address, number in listeners:  # new ports (the old ones closed with it)
        await target.add_listener(NQN, address, number)
    _admin_a, _admin_b, io_a, io_b = await _paths(rt)
    for queue in io_a + io_b:
        assert (await queue.read(1, 0, 1, BLOCK)).status == 0
