"""The host library's ANA support against the live target: the ANA log and a namespace
through two controllers (two ports) that follows ANA states and survives a lost path."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pynvmf.host import connect
from pynvmf.host.controller import Controller
from pynvmf.host.multipath import MultipathNamespace, NoUsablePath, ana_state, read_ana_log
from pynvmf.spec.logpages import AnaState
from pynvmf.target.port import Port
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_SUBNQN, raw_memory_subsystem


@pytest.fixture
async def gateways() -> AsyncIterator[tuple[Target, list[Controller]]]:
    target = Target([raw_memory_subsystem()], [Port("127.0.0.1", 0), Port("127.0.0.1", 0)])
    await target.start()
    controllers = [await connect(p.address, p.port, RAW_SUBNQN) for p in target.ports]
    yield target, controllers
    for ctrl in controllers:
        await ctrl.close()
    await target.stop()


async def test_the_ana_log_and_a_namespaces_state_through_each_controller(
    gateways: tuple[Target, list[Controller]],
) -> None:
    target, (ca, cb) = gateways
    port_b = target.ports[1]
    target.set_ana_state(RAW_SUBNQN, 1, "inaccessible", port_b.address, port_b.port)
    log = await read_ana_log(cb)
    assert [(g.grpid, g.state, g.nsids) for g in log.groups] == [(1, AnaState.INACCESSIBLE, [1, 2])]
    assert (await read_ana_log(cb, groups_only=True)).groups[0].nsids == []
    assert await ana_state(ca.namespace(1)) == AnaState.OPTIMIZED
    assert await ana_state(cb.namespace(1)) == AnaState.INACCESSIBLE


async def test_io_follows_the_optimized_path_and_moves_on_a_path_status(
    gateways: tuple[Target, list[Controller]],
) -> None:
    target, (ca, cb) = gateways
    port_a, port_b = target.ports
    mp = MultipathNamespace([ca.namespace(1), cb.namespace(1)], wait_s=2)
    target.set_ana_state(RAW_SUBNQN, 1, "inaccessible", port_b.address, port_b.port)
    await mp.write(0, b"\x01" * 4096)
    assert mp.states == [AnaState.OPTIMIZED, AnaState.INACCESSIBLE] and mp.retries == 0
    # The states swap behind the library's back: the next command through A gets ANA
    # Inaccessible, the library reads the logs again and sends it through B.
    target.set_ana_state(RAW_SUBNQN, 1, "inaccessible", port_a.address, port_a.port)
    target.set_ana_state(RAW_SUBNQN, 1, "optimized", port_b.address, port_b.port)
    await mp.write(8, b"\x02" * 4096)
    assert mp.retries == 1 and mp.states == [AnaState.INACCESSIBLE, AnaState.OPTIMIZED]
    buf = bytearray(8192)
    await mp.read(0, memoryview(buf))
    assert buf == b"\x01" * 4096 + b"\x02" * 4096
    # Non-optimized serves when nothing is optimized.
    target.set_ana_state(RAW_SUBNQN, 1, "non_optimized")
    await mp.refresh()
    await mp.flush()
    # No usable path: it waits, then says so.
    target.set_ana_state(RAW_SUBNQN, 1, "change")
    with pytest.raises(NoUsablePath):
        await mp.read(0, memoryview(buf))


async def test_a_lost_path_moves_io_to_the_other(
    gateways: tuple[Target, list[Controller]],
) -> None:
    target, (ca, cb) = gateways
    port_a = target.ports[0]
    mp = MultipathNamespace([ca.namespace(1), cb.namespace(1)], wait_s=2)
    await mp.write(0, b"\x05" * 512)
    await target.remove_port(port_a)  # gateway A's path goes away
    await mp.write(1, b"\x06" * 512)
    buf = bytearray(1024)
    await mp.read(0, memoryview(buf))
    assert buf == b"\x05" * 512 + b"\x06" * 512
    assert mp.states[0] is None and mp.states[1] == AnaState.OPTIMIZED


async def test_paths_must_be_one_namespace(gateways: tuple[Target, list[Controller]]) -> None:
    _target, (ca, cb) = gateways
    with pytest.raises(ValueError):
        MultipathNamespace([])
    with pytest.raises(ValueError, match="is not"):
        MultipathNamespace([ca.namespace(1), cb.namespace(2)])
