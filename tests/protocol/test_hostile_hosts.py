"""Hostile and careless hosts against the live in-process target: what a host can make the
target hold, for how long, and what is given back when it goes."""

from __future__ import annotations

import asyncio
import gc
import resource
import time
from collections.abc import Callable, Iterator

import pytest

from pynvmf.target.controller import Controller
from pynvmf.target.io import IoHandler
from pynvmf.target.queue import TargetQueue
from pynvmf.target.server import TargetProtocol
from pynvmf.tcp.framing import PduReader
from pynvmf.tcp.target import TargetConnection
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_SUBNQN, RawTarget

pytestmark = pytest.mark.timeout(120)

CONNECTION_OBJECTS = (TargetProtocol, TargetConnection, PduReader, TargetQueue, IoHandler)


def _live(kinds: tuple[type, ...]) -> dict[str, int]:
    counts = {kind.__name__: 0 for kind in kinds}
    for obj in gc.get_objects():
        for kind in kinds:
            if type(obj) is kind:
                counts[kind.__name__] += 1
    return {name: n for name, n in counts.items() if n}


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Poll `condition` (the target reacts to a close on its own schedule)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counting frees objects: what a cycle keeps alive stays visible."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_closed_connection_is_freed_without_the_cycle_collector(
    raw_target: RawTarget, no_cycle_collector: None
) -> None:
    assert _live((*CONNECTION_OBJECTS, Controller)) == {}
    host = await raw_target.host(io_queues=2)
    for io in host.io:
        assert (await io.write(1, 0, bytes(4096), RAW_NS1_BLOCK)).status == 0
        assert (await io.read(1, 0, 8, RAW_NS1_BLOCK)).status == 0
    # A write whose data never comes, and an AER, are in flight when the host goes.
    host.io[0].cmd_nowait(0x01, nsid=1, cdw12=63, data=bytes(32768), inline=False)
    host.admin.cmd_nowait(0x0C)
    assert _live((TargetProtocol,)) == {"TargetProtocol": 3}
    for queue in [*host.io, host.admin]:
        await queue.close()
    raw_target.queues.clear()
    await _until(lambda: not _live((*CONNECTION_OBJECTS, Controller)), "the objects to go")
    subsystem = raw_target.target.subsystems[RAW_SUBNQN]
    assert subsystem.controllers == {}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def test_rss_stays_flat_over_thousands_of_connect_and_close_cycles(
    raw_target: RawTarget,
) -> None:
    async def cycle() -> None:
        admin = await raw_target.admin()
        await admin.close()
        raw_target.queues.clear()

    for _ in range(300):  # warm up: allocator arenas, caches
        await cycle()
    await _until(lambda: not _live((TargetProtocol,)), "the warm-up connections to go")
    before = _rss()
    for _ in range(3000):
        await cycle()
    await _until(lambda: not _live((TargetProtocol,)), "the connections to go")
    grown = _rss() - before
    # Each leaked connection would hold its 256 KiB receive buffer: 3000 of them, 750 MiB.
    assert grown < 16 << 20, f"RSS grew by {grown / (1 << 20):.1f} MiB"
