"""Ctrl-C during `pynvmf bench`'s measurement: the first stops the jobs as the end of
--runtime does, so that the report covers the time measured so far (the command then
exits with 130); a second one aborts at once, without a report.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

from pynvmf.bench.progress import CLEAR_LINE


class Interrupt:
    """Ctrl-C during the measurement: the first sets `stop`, which ends the jobs as the
    end of --runtime does (the report then covers the time measured); a second one does
    what the handler before ours does (asyncio.Runner's cancels the main task: the run
    aborts without a report). The second is handled in the loop too, not by handing
    SIGINT back to a Python-level handler: that one runs only when the main thread next
    runs bytecode, and a loop waiting on a target that stopped answering, with the
    transport compiled (make compiled), may not do so for a long time."""

    def __init__(self, stop: asyncio.Event, err: TextIO, progress_line: bool) -> None:
        self._stop = stop
        self._err = err
        self._progress_line = progress_line
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self.interrupted = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            # Started with Ctrl-C ignored (a background job of a script, nohup): keep it so.
            return
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread (or no signals here): Ctrl-C keeps aborting the run.
            return
        self._loop, self._previous = loop, previous

    def uninstall(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.remove_signal_handler(signal.SIGINT)
        # remove_signal_handler installs Python's default handler; the one before ours
        # (asyncio.Runner's, which cancels the main task) lets the run clean up.
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self) -> None:
        if self.interrupted:
            previous = self._previous
            self.uninstall()
            if callable(previous):
                previous(signal.SIGINT, None)
                return
            raise KeyboardInterrupt
        self.interrupted = True
        self._stop.set()
        # Said now rather than after the report: the jobs may take a while to drain
        # their I/Os, and the user should know that a second Ctrl-C is what aborts.
        clear = CLEAR_LINE if self._progress_line else ""
        self._err.write(
            f"{clear}pynvmf bench: interrupted, reporting the time measured so far "
            "(Ctrl-C again to abort)\n"
        )
        self._err.flush()
