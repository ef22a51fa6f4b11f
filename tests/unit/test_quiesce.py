"""quiesce.py: which commands wait while a namespace is quiesced, and until when."""

from __future__ import annotations

import asyncio

from pynvmf.spec.opcodes import NSID_ALL, IoOpcode
from pynvmf.target.quiesce import quiesced, wait_resumed, waits_for
from pynvmf.target.subsystem import Subsystem

NQN = "nqn.2024-01.io.pynvmf.test:quiesce"


async def test_commands_to_the_namespace_wait_until_the_quiesce_ends() -> None:
    subsystem = Subsystem(NQN)
    q = subsystem.quiesced
    assert waits_for(q, IoOpcode.READ, 1) is None
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def shrink() -> None:
        async with quiesced(subsystem, 1):
            inside.set()
            await leave.wait()

    task = asyncio.ensure_future(shrink())
    await inside.wait()
    assert waits_for(q, IoOpcode.READ, 1) is q[1]
    assert waits_for(q, IoOpcode.WRITE, 2) is None  # another namespace goes on
    # A Copy may read any namespace, a Flush to all flushes them all: they wait.
    assert waits_for(q, IoOpcode.COPY, 2) is q[1]
    assert waits_for(q, IoOpcode.FLUSH, NSID_ALL) is q[1]
    waiter = asyncio.ensure_future(wait_resumed(q, IoOpcode.READ, 1))
    await asyncio.wait([waiter], timeout=0)
    assert not waiter.done()
    await wait_resumed(q, IoOpcode.READ, 2)  # at once
    leave.set()
    await task
    await asyncio.wait_for(waiter, 5)
    assert not q


async def test_a_second_quiesce_of_a_namespace_waits_for_the_first() -> None:
    subsystem = Subsystem(NQN)
    order: list[str] = []
    leave = asyncio.Event()

    async def first() -> None:
        async with quiesced(subsystem, 1):
            order.append("first in")
            await leave.wait()
            order.append("first out")

    async def second() -> None:
        async with quiesced(subsystem, 1):
            order.append("second in")

    a = asyncio.ensure_future(first())
    await asyncio.wait([a], timeout=0)
    b = asyncio.ensure_future(second())
    await asyncio.wait([b], timeout=0)
    assert order == ["first in"]
    leave.set()
    await asyncio.wait_for(asyncio.gather(a, b), 5)
    assert order == ["first in", "first out", "second in"]
    assert not subsystem.quiesced
