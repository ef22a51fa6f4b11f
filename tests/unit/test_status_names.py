"""Status names in the host's errors: command specific codes depend on the command."""

from __future__ import annotations

from pynvmf.host.errors import NvmeStatusError
from pynvmf.spec import status as S
from pynvmf.spec.command import Sqe, build_sqe
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode


def test_copy_statuses_are_named_as_the_nvm_command_set_does() -> None:
    copy = Sqe.unpack(build_sqe(IoOpcode.COPY, cid=1, nsid=1))
    err = NvmeStatusError(S.CMD_SIZE_LIMIT_EXCEEDED | S.DNR, copy)
    assert err.name == "CMD_SIZE_LIMIT_EXCEEDED"
    assert "Connect" not in str(err) and "DISCOVERY" not in str(err)
    err = NvmeStatusError(S.INCOMPATIBLE_NS_OR_FORMAT | S.DNR, copy)
    assert err.name == "INCOMPATIBLE_NS_OR_FORMAT"
    assert "COPY failed: INCOMPATIBLE_NS_OR_FORMAT (SCT 0x1 SC 0x85, DNR)" in str(err)


def test_the_same_numbers_on_a_fabrics_command_are_connect_statuses() -> None:
    connect = Sqe.unpack(build_sqe(AdminOpcode.FABRICS, cid=1))
    assert NvmeStatusError(0x183, connect, admin=True).name == "CONNECT_RESTART_DISCOVERY"
    assert NvmeStatusError(0x184, connect, admin=True).name == "CONNECT_INVALID_HOST"


def test_generic_statuses_keep_their_names_on_any_command() -> None:
    read = Sqe.unpack(build_sqe(IoOpcode.READ, cid=1, nsid=1))
    assert NvmeStatusError(S.Status.LBA_OUT_OF_RANGE, read).name == "LBA_OUT_OF_RANGE"
    assert S.status_name(0x1FE, io=True) == "SCT1/SCfe"
