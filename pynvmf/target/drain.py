"""Waiting for the commands in flight on a subsystem before what they use goes away (a
namespace's device, a whole subsystem), with a bound: a host that never sends the data
of a write it started would otherwise hold the removal, and every change after it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pynvmf.logs import about

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.target.subsystem import Subsystem

log = logging.getLogger(__name__)

# How long a removal waits for the commands in flight on its subsystem before it tears
# down the controllers still holding some.
DRAIN_TIMEOUT = 10.0


def commands_waiting(subsystem: Subsystem) -> set[asyncio.Task[None]]:
    """The commands on the subsystem's queues that are waiting for something; any of
    them may be using any of its namespaces (a Copy reads from several)."""
    return commands_waiting_on(subsystem.controllers.values())


def commands_waiting_on(controllers: Iterable[Controller]) -> set[asyncio.Task[None]]:
    """The commands waiting for something on these controllers' queues."""
    return {
        task
        for ctrl in controllers
        for queue in ctrl.queues.values()
        for task in queue.commands_waiting
    }


async def drain(waiting: set[asyncio.Task[None]], subsystem: Subsystem | None = None) -> None:
    """Wait for the commands that were in flight. If some do not finish in time, tear
    down the controllers holding them (their hosts retry elsewhere or later), whose
    commands then end as their connections close."""
    if not waiting:
        return
    _done, pending = await asyncio.wait(waiting, timeout=DRAIN_TIMEOUT)
    if not pending:
        return
    if subsystem is not None:
        for ctrl in list(subsystem.controllers.values()):
            if any(
                task in queue.commands_waiting for queue in ctrl.queues.values() for task in pending
            ):
                about(log, ctrl).warning(
                    "controller %d of %s: commands did not finish in %.0f s, tearing it down",
                    ctrl.cntlid,
                    subsystem.nqn,
                    DRAIN_TIMEOUT,
                )
                ctrl.destroy("commands in flight did not finish")
    _done, pending = await asyncio.wait(pending, timeout=DRAIN_TIMEOUT)
    if pending:
        log.error("%d commands still in flight after their controllers went away", len(pending))
