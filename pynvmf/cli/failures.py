"""A failed connection in the words a user reads: one line that names the address once,
what the controller refused and, where there is one, the command that shows what it
would accept."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from pynvmf.cli.common import CommandError
from pynvmf.cli.identity import CommandIdentity, describe
from pynvmf.host import NvmeConnectionError, NvmeConnectRejected, NvmeError
from pynvmf.spec.status import Status


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a command tried to connect to, and as whom."""

    address: str
    port: int
    identity: CommandIdentity
    trtype: str = "tcp"

    @property
    def where(self) -> str:
        return f"{self.address} port {self.port}"

    @property
    def endpoint(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def discover_command(self) -> str:
        transport = "" if self.trtype == "tcp" else f"-t {self.trtype} "
        return f"`pynvmf discover {transport}-a {self.address} -s {self.port}`"


def _refusal(attempt: Attempt, exc: NvmeConnectRejected) -> str:
    if exc.status == Status.CONNECT_INVALID_PARAM and exc.parameter == "subnqn":
        return (
            f"subsystem {exc.subnqn!r} is not served at {attempt.endpoint} "
            f"({attempt.discover_command()} lists what is)"
        )
    if exc.status == Status.CONNECT_INVALID_HOST:
        return (
            f"host {describe(attempt.identity)} is not allowed on subsystem {exc.subnqn!r} "
            f"at {attempt.endpoint} (-q/--hostnqn connects as another host)"
        )
    return f"{attempt.where}: {exc}"


def connect_failure(attempt: Attempt, exc: NvmeError) -> CommandError:
    """The one-line message for a connect() or discover() that raised `exc`."""
    if isinstance(exc, NvmeConnectRejected):
        return CommandError(_refusal(attempt, exc))
    text = str(exc)
    if isinstance(exc, NvmeConnectionError):
        cause = exc.__cause__
        if isinstance(cause, socket.gaierror):
            return CommandError(f"cannot resolve {attempt.address}: {cause.strerror}")
        if isinstance(cause, OSError) and cause.errno:
            # asyncio words a refused connection "Connect call failed (addr, port)";
            # the errno's own text ("Connection refused") is what a user recognises.
            text = os.strerror(cause.errno)
        return CommandError(f"cannot connect to {attempt.where}: {_without(attempt, text)}")
    return CommandError(f"{attempt.where}: {_without(attempt, text)}")


def _without(attempt: Attempt, text: str) -> str:
    """`text` without the library's own "ADDR port PORT: " prefixes: the address once."""
    prefix = f"{attempt.where}: "
    while text.startswith(prefix):
        text = text[len(prefix) :]
    return text
