"""Quiescing a namespace's I/O while its device changes under it (a forced shrink): new
I/O commands to it wait, those already in flight finish, and only then does the change
happen; the waiting commands go on afterwards, judged by the new size.

A Subsystem's `quiesced` maps NSIDs to the event their commands wait for: empty, the I/O
path pays one test (IoHandler.submit and execute). A Copy may read from any namespace of
its subsystem and a Flush to every namespace touches them all, so those wait while any
namespace of the subsystem is quiesced.

Every process that serves the namespace's I/O quiesces its own queues: the main process,
and with `--cores` each worker, which the main process asks in turn (cores/workers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

from pynvmf.spec.opcodes import NSID_ALL, IoOpcode
from pynvmf.target.drain import commands_waiting, drain

if TYPE_CHECKING:
    from pynvmf.target.subsystem import Subsystem

# Commands that may touch any namespace of the subsystem, not only the one they name.
_ANY_NAMESPACE: Final = frozenset({int(IoOpcode.COPY)})


def waits_for(quiesced: dict[int, asyncio.Event], opcode: int, nsid: int) -> asyncio.Event | None:
    """The event a command (`opcode` to `nsid`) has to wait for before it starts, or None
    if it may start now."""
    event = quiesced.get(nsid)
    if event is None and (opcode in _ANY_NAMESPACE or nsid == NSID_ALL) and quiesced:
        event = next(iter(quiesced.values()))
    return event


async def wait_resumed(quiesced: dict[int, asyncio.Event], opcode: int, nsid: int) -> None:
    """Wait until a command (`opcode` to `nsid`) may start: no quiesce it waits for is
    under way (one may follow another)."""
    while (event := waits_for(quiesced, opcode, nsid)) is not None:
        await event.wait()


@asynccontextmanager
async def quiesced(subsystem: Subsystem, nsid: int) -> AsyncIterator[None]:
    """Quiesce namespace `nsid` of `subsystem` in this process for the block: from the
    start new I/O commands to it wait; the block is entered once the commands that were
    in flight on the subsystem finished (drain.py: bounded, a controller whose commands
    never finish is torn down). Its callers change one device at a time (the Target's
    resize lock): a command waiting for another quiesce would hold this one's drain."""
    while (current := subsystem.quiesced.get(nsid)) is not None:
        await current.wait()
    event = asyncio.Event()
    # Set and taken together: every command in the set started before the quiesce, and
    # every later one waits (their tasks are not in the set).
    subsystem.quiesced[nsid] = event
    in_flight = commands_waiting(subsystem)
    try:
        await drain(in_flight, subsystem)
        yield
    finally:
        del subsystem.quiesced[nsid]
        event.set()
