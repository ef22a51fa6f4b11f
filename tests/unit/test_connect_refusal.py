"""Every Connect status in words, from one table (pynvmf.host.fabrics.connect_refusal):
the field a Connect Invalid Parameters status points at (IATTR/IPO), the host a Connect
Invalid Host refuses, and the rest."""

from __future__ import annotations

import pytest

from pynvmf.host import HostIdentity, NvmeConnectRejected, NvmeStatusError
from pynvmf.host.fabrics import connect_refusal
from pynvmf.spec import command as C
from pynvmf.spec.command import Sqe, build_sqe
from pynvmf.spec.opcodes import AdminOpcode
from pynvmf.spec.status import DNR, Status

SUBNQN = "nqn.2024-01.io.example:disk"
IDENTITY = HostIdentity(
    "nqn.2014-08.org.nvmexpress:uuid:0c5a3c52-6f6e-4b1e-8f0e-000000000001",
    bytes.fromhex("0c5a3c526f6e4b1e8f0e000000000002"),
)
CONNECT = C.ConnectCommand(recfmt=0, qid=3, sqsize=127, cattr=0, kato=0)


def status_error(status: int, result: int = 0) -> NvmeStatusError:
    command = Sqe.unpack(build_sqe(AdminOpcode.FABRICS, cid=1))
    return NvmeStatusError(status | DNR, command, admin=True, result=result)


def refusal(status: int, result: int = 0) -> tuple[str | None, str]:
    return connect_refusal(status_error(status, result), CONNECT, IDENTITY, SUBNQN, 7)


@pytest.mark.parametrize(
    ("offset", "in_data", "parameter", "words"),
    [
        (256, True, "subnqn", f"subsystem '{SUBNQN}' is not served on this port"),
        (512, True, "hostnqn", f"host NQN '{IDENTITY.hostnqn}' refused"),
        (0, True, "hostid", "host ID 0c5a3c52-6f6e-4b1e-8f0e-000000000002 refused"),
        (16, True, "cntlid", "controller ID 0x7 refused (no such controller: gone?)"),
        (42, False, "qid", "queue ID 3 refused (more queues than the controller has?)"),
        (44, False, "sqsize", "queue size 128 refused"),
        (46, False, "cattr", "connect attributes 0x0 refused"),
        (48, False, "kato", "keep alive timeout 0 ms refused"),
        (40, False, "recfmt", "record format 0 refused"),
        (300, True, None, "an invalid parameter at byte 300 of the Connect data"),
        (50, False, None, "an invalid parameter at byte 50 of the Connect command"),
    ],
)
def test_invalid_parameters_name_the_field(
    offset: int, in_data: bool, parameter: str | None, words: str
) -> None:
    result = C.connect_invalid_param_result(offset, in_data=in_data)
    assert refusal(Status.CONNECT_INVALID_PARAM, result) == (parameter, words)


@pytest.mark.parametrize(
    ("status", "parameter", "words"),
    [
        (
            Status.CONNECT_INVALID_HOST,
            "hostnqn",
            f"host '{IDENTITY.hostnqn}' is not allowed to connect to subsystem '{SUBNQN}'",
        ),
        (Status.CONNECT_CTRL_BUSY, None, "the controller is busy, or no controller is available"),
        (Status.CONNECT_INCOMPATIBLE_FORMAT, None, "record format 0 is not supported"),
        (Status.CONNECT_RESTART_DISCOVERY, None, "the subsystem moved: discover it again"),
        (Status.AUTH_REQUIRED, None, "the controller requires authentication first"),
        (Status.INTERNAL_ERROR, None, "internal error"),
    ],
)
def test_every_other_status_in_words(status: int, parameter: str | None, words: str) -> None:
    assert refusal(status) == (parameter, words)


def test_the_refusal_says_what_and_keeps_the_status() -> None:
    error = status_error(
        Status.CONNECT_INVALID_PARAM, C.connect_invalid_param_result(256, in_data=True)
    )
    parameter, reason = connect_refusal(error, CONNECT, IDENTITY, SUBNQN, 0xFFFF)
    rejected = NvmeConnectRejected(
        error, parameter=parameter, reason=reason, qid=0, subnqn=SUBNQN, hostnqn=IDENTITY.hostnqn
    )
    assert rejected.status == Status.CONNECT_INVALID_PARAM and rejected.dnr
    assert rejected.parameter == "subnqn"
    assert str(rejected) == (
        f"Fabrics CONNECT refused: subsystem '{SUBNQN}' is not served on this port "
        "(CONNECT_INVALID_PARAM, SCT 0x1 SC 0x82, DNR)"
    )
