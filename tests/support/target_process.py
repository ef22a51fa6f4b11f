"""Run `pynvmf target` as a separate process, as a user or a service manager does.

The one way the tests and the benchmarks start the command: `start()` returns once the
target printed its ready line (the last of its banner, after every port listens), never
after a guessed delay; the banner's ports are `listeners` (`address`, `port` and
`discovery_port` for the first ones), so a test may let the target bind port 0. `stop()`
sends SIGTERM, waits, and fails with the target's log when the exit status is not the one
expected. Its log (stderr) goes to `workdir/target.stderr` as it comes, and
`wait_log()` waits for lines in it as they arrive.

pynvmf.bench.target_process is another thing: a target in a `multiprocessing` child that
the benchmarks pin to a CPU, without the command line.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

READY_LINE = "pynvmf target ready"
# The banner's line for each port (pynvmf.cli.target): "listening nvme 127.0.0.1:4420".
_LISTENING = re.compile(r"listening (nvme|discovery) \[?([^\s\]]+)\]?:(\d+)")
# How long the readers may take to drain the pipes once the target has exited.
_DRAIN_S = 10.0


@dataclass(frozen=True)
class Listener:
    kind: str  # "nvme" or "discovery"
    address: str
    port: int


class TargetProcess:
    """`python -m pynvmf target ARGS -v`, started and stopped like a user would.

    With a configuration dictionary, it is written to `workdir/target.json` and passed as
    --config. `wrapper` goes before the command (`taskset -c 0`, `valgrind ...`);
    `verbose=False` leaves out -v (a benchmark measures the target as it runs by default)."""

    def __init__(
        self,
        config: dict[str, Any] | None,
        workdir: Path,
        args: Sequence[str] | None = None,
        *,
        wrapper: Sequence[str] = (),
        verbose: bool = True,
    ) -> None:
        self.args = list(args or [])
        if config is not None:
            config_path = workdir / "target.json"
            config_path.write_text(json.dumps(config, indent=2))
            self.args += ["--config", str(config_path)]
        self.wrapper = list(wrapper)
        self.verbose = verbose
        self.stderr_path = workdir / "target.stderr"
        self.stdout_lines: list[str] = []
        self.listeners: list[Listener] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log: list[str] = []
        self._log_changed = threading.Condition()
        self._log_ended = False
        self._readers: list[threading.Thread] = []
        self._proc: subprocess.Popen[str] | None = None

    # -- starting -----------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        self._proc = subprocess.Popen(
            [
                *self.wrapper,
                *(sys.executable, "-m", "pynvmf", "target", *self.args),
                *(["-v"] if self.verbose else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
        )
        log_file = self.stderr_path.open("w")
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, args=(log_file,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        try:
            while (line := self._next_stdout(timeout, "its ready line").strip()) != READY_LINE:
                if found := _LISTENING.match(line):
                    kind, address, port = found.groups()
                    self.listeners.append(Listener(kind, address, int(port)))
        except BaseException:
            self._end(signal.SIGKILL, timeout=_DRAIN_S)
            raise

    # -- where it listens ---------------------------------------------------------------------

    def _first(self, kind: str) -> Listener:
        for listener in self.listeners:
            if listener.kind == kind:
                return listener
        raise LookupError(f"the target's banner names no {kind} port: {self.listeners}")

    @property
    def address(self) -> str:
        """The address of the first NVMe (I/O) port."""
        return self._first("nvme").address

    @property
    def port(self) -> int:
        """The first NVMe (I/O) port: the one bound, also where port 0 was asked for."""
        return self._first("nvme").port

    @property
    def discovery_port(self) -> int:
        return self._first("discovery").port

    # -- what it prints -----------------------------------------------------------------------

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.stdout_lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self, log_file: IO[str]) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        with log_file:
            for line in self._proc.stderr:
                log_file.write(line)
                log_file.flush()  # the file is read while the target runs, and after a crash
                with self._log_changed:
                    self._log.append(line)
                    self._log_changed.notify_all()
        with self._log_changed:
            self._log_ended = True
            self._log_changed.notify_all()

    def _next_stdout(self, timeout: float, waiting_for: str) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"target printed no {waiting_for} within {timeout} s:\n{self.stderr()}"
            ) from None
        if line is None:
            raise RuntimeError(f"target exited before printing {waiting_for}:\n{self.stderr()}")
        return line

    def wait_stdout(self, text: str, timeout: float = 30) -> str:
        """Everything printed so far, once `text` is in it (the banner goes on after the
        ready line)."""
        while text not in "".join(self.stdout_lines):
            self._next_stdout(timeout, repr(text))
        return "".join(self.stdout_lines)

    def stderr(self) -> str:
        """The target's log so far."""
        with self._log_changed:
            return "".join(self._log)

    def wait_log(self, pattern: str, count: int = 1, timeout: float = 60) -> list[Any]:
        """Once `count` lines of the log match the regular expression `pattern` (woken as
        each line arrives, not polling): the matches so far (`re.findall`'s, line by line)."""
        regex = re.compile(pattern)
        found: list[Any] = []
        seen = 0

        def enough() -> bool:
            nonlocal seen
            for line in self._log[seen:]:
                found.extend(regex.findall(line))
            seen = len(self._log)
            return len(found) >= count or self._log_ended

        with self._log_changed:
            self._log_changed.wait_for(enough, timeout)
            tail = "".join(self._log[-40:])
        if len(found) >= count:
            return found
        why = "the target exited" if self._log_ended else f"not within {timeout} s"
        raise AssertionError(
            f"{count} x {pattern!r} not in the target's log ({why}; got {len(found)}):\n{tail}"
        )

    # -- the process --------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def send_signal(self, sig: int) -> None:
        """A signal that does not end it (SIGSTOP, SIGCONT, SIGHUP...)."""
        assert self._proc is not None
        self._proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        """The exit status of a target that is stopping by itself (spdk_kill_instance)."""
        assert self._proc is not None
        status = self._proc.wait(timeout)
        self._drain()
        return status

    def stop(self, timeout: float = 30, sig: int = signal.SIGTERM, expect: int | None = 0) -> int:
        """SIGTERM (as a service manager would), SIGINT (^C) or SIGKILL; the exit status.

        With `expect` (0: a clean stop; None: any status will do), another status fails
        with the target's log."""
        if self._proc is None:
            return 0
        status = self._end(sig, timeout)
        if expect is not None and status != expect:
            raise AssertionError(f"target exited with {status}, not {expect}:\n{self.stderr()}")
        return status

    def _end(self, sig: int, timeout: float) -> int:
        assert self._proc is not None
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
        try:
            status = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            self._drain()
            raise AssertionError(
                f"target still running {timeout} s after signal {sig}:\n{self.stderr()}"
            ) from None
        self._drain()
        return status

    def _drain(self) -> None:
        """Wait for the readers to take the last lines (bounded: a worker process the
        target left behind may hold the pipes open)."""
        for reader in self._readers:
            reader.join(_DRAIN_S)
