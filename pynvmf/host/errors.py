"""Exceptions of the host library."""

from __future__ import annotations

from pynvmf.spec import status as S
from pynvmf.spec.command import Sqe
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, IoOpcode


class NvmeError(Exception):
    """Base of every error the host library raises about a remote controller."""


class NvmeStatusError(NvmeError):
    """A command completed with a non-zero NVMe status.

    `status` is the status value as spec.status defines it, (SCT << 8) | SC, so it
    compares equal to a `Status` member; `dnr` and `more` are the bits above it.
    `result` is the completion's DW0 | DW1 << 32 (some statuses explain themselves
    there: a Connect's IATTR/IPO).
    """

    def __init__(self, status: int, command: Sqe, *, admin: bool = False, result: int = 0) -> None:
        self.raw_status = status
        self.result = result
        self.status = status & 0x7FF
        self.sct, self.sc = S.split(status)
        self.dnr = bool(status & S.DNR)
        self.more = bool(status & S.MORE)
        self.name = S.status_name(status, io=not admin and command.opcode != AdminOpcode.FABRICS)
        self.command = command
        self.opcode = command.opcode
        self.admin = admin
        super().__init__(
            f"{_command_name(command, admin)} failed: {self.name} "
            f"(SCT {self.sct:#x} SC {self.sc:#04x}{', DNR' if self.dnr else ''})"
        )


class NvmeConnectRejected(NvmeStatusError):
    """The controller refused a Connect. `parameter` is the Connect field its IATTR/IPO
    name (pynvmf.spec.command.connect_parameter: "subnqn", "hostnqn", "qid"...), None
    when the status names none; `reason` says in words what was refused (the words the
    message starts with); `qid`, `subnqn` and `hostnqn` are what the Connect asked for."""

    def __init__(
        self,
        error: NvmeStatusError,
        *,
        parameter: str | None,
        reason: str,
        qid: int,
        subnqn: str,
        hostnqn: str,
    ) -> None:
        super().__init__(error.raw_status, error.command, admin=error.admin, result=error.result)
        self.parameter = parameter
        self.reason = reason
        self.qid = qid
        self.subnqn = subnqn
        self.hostnqn = hostnqn
        dnr = ", DNR" if self.dnr else ""
        status = f"{self.name}, SCT {self.sct:#x} SC {self.sc:#04x}{dnr}"
        self.args = (f"Fabrics CONNECT refused: {reason} ({status})",)


class NvmeUnsupportedError(NvmeError):
    """The controller does not support the command (Identify says so): nothing was sent."""


class NvmeTransportUnavailableError(NvmeError):
    """The transport asked for cannot be used on this machine (trtype rdma without
    rdma-core's Python bindings, pyverbs): nothing was sent."""


class NvmeConnectionError(NvmeError, ConnectionError):
    """The queue's connection is gone (closed, lost, or ended by a protocol error):
    the command's outcome is unknown."""


class NvmeAuthenticationError(NvmeError):
    """DH-HMAC-CHAP failed on a queue: the controller refused (`by_controller`, with the
    reason explanation of its AUTH_Failure1) or the host did (the controller's message or
    response was wrong; the host sent AUTH_Failure2). `explanation` is the reason code
    explanation (pynvmf.spec.auth.FailureExplanation), 0 when there was no exchange."""

    def __init__(self, text: str, explanation: int = 0, *, by_controller: bool = False) -> None:
        super().__init__(text)
        self.explanation = explanation
        self.by_controller = by_controller


class NvmeTimeoutError(NvmeError, TimeoutError):
    """The controller did not reach a state in the time the specification allows."""


def _command_name(command: Sqe, admin: bool) -> str:
    opcode = command.opcode
    if opcode == AdminOpcode.FABRICS:
        try:
            return f"Fabrics {FabricsType(command.fctype).name}"
        except ValueError:
            return f"Fabrics command {command.fctype:#04x}"
    table: type[AdminOpcode] | type[IoOpcode] = AdminOpcode if admin else IoOpcode
    try:
        return table(opcode).name
    except ValueError:
        return f"opcode {opcode:#04x}"
