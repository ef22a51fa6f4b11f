"""Run `pynvmf target` as a separate process, as a user or a service manager does."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

READY_LINE = "pynvmf target ready"


class TargetProcess:
    """`python -m pynvmf target ARGS`, started and stopped like a user would.

    With a configuration dictionary, it is written to a file and passed as --config.
    """

    def __init__(
        self, config: dict[str, Any] | None, workdir: Path, args: list[str] | None = None
    ) -> None:
        self.args = list(args or [])
        if config is not None:
            config_path = workdir / "target.json"
            config_path.write_text(json.dumps(config, indent=2))
            self.args += ["--config", str(config_path)]
        self.stderr_path = workdir / "target.stderr"
        self.stdout_lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pynvmf", "target", *self.args, "-v"],
            stdout=subprocess.PIPE,
            stderr=self.stderr_path.open("w"),
            text=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"target did not become ready:\n{self.stderr()}") from None
            if line is None:
                raise RuntimeError(f"target exited before it was ready:\n{self.stderr()}")
            if line.strip() == READY_LINE:
                return

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.stdout_lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_stdout(self, text: str, timeout: float = 30) -> str:
        """Everything printed so far, once `text` is in it (the banner goes on after the
        ready line)."""
        while text not in "".join(self.stdout_lines):
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"target never printed {text!r}") from None
            if line is None:
                raise RuntimeError(f"target exited before printing {text!r}:\n{self.stderr()}")
        return "".join(self.stdout_lines)

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float = 30) -> int:
        """The exit status of a target that is stopping by itself (spdk_kill_instance)."""
        assert self._proc is not None
        return self._proc.wait(timeout)

    def stop(self, timeout: float = 30, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (as a service manager would) or SIGINT (^C); returns the exit status."""
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise
