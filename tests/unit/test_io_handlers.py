"""The one way to change how an I/O opcode is executed (io.set_handler): a worker of
`--cores N` sends the reservation commands to the main process with it."""

from __future__ import annotations

import pytest

from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target import io
from pynvmf.target.outcome import Outcome


def test_only_an_opcode_the_effects_log_lists_can_be_given_a_handler() -> None:
    async def handler(_io: io.IoHandler, _req: object) -> Outcome:
        raise AssertionError("never run")

    # Vendor specific, and not an NVM opcode at all: the Commands Supported and Effects
    # log would not list it, so the target must not execute it.
    for opcode in (0x80, 0xFF):
        with pytest.raises(ValueError, match="not an I/O command"):
            io.set_handler(opcode, handler)  # type: ignore[arg-type]
    assert IoOpcode.RESERVATION_REGISTER in io.IO_COMMANDS
