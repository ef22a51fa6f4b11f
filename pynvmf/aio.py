"""Small asyncio helpers shared by the target and the host."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

log = logging.getLogger(__name__)

_background: set[asyncio.Task[Any]] = set()


def start_eager(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
    """Run `coro` now, up to its first real suspension; a Task takes over only then,
    and is returned (None: the coroutine already finished).

    Most commands on an in-memory or page-cached namespace never suspend, so this
    saves the Task and the event-loop round trip that create_task would cost per
    I/O (Python 3.12's eager task factory does the same). The coroutine must
    handle its own exceptions; anything escaping is logged.
    """
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    except Exception:
        log.exception("command handler failed")
        return None
    task = asyncio.ensure_future(_continue(coro, yielded))
    _background.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("command handler failed", exc_info=task.exception())


@types.coroutine
def _continue(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    # Hand the awaitable the coroutine is blocked on to the Task driving us, and
    # pass whatever the Task sends or throws back into the coroutine.
    # Neither the awaitable nor what it gave back stays referenced from this frame while
    # the coroutine runs: a failed future would hold this frame through its exception's
    # traceback (a cycle keeping a closed queue alive), and a result may be a megabyte of
    # write data.
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:
            yielded = None
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            yielded = None
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                sent = None


def uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop constructor, or None where uvloop is not installed.

    For asyncio.Runner(loop_factory=...): unlike install_uvloop it changes nothing
    global, so a process that goes on to use asyncio otherwise is not affected."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def install_uvloop() -> bool:
    """Make every new event loop of this process uvloop's, where it is installed (a
    process that serves, and whose helpers may start loops of their own); True if so."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
