"""The glibc malloc tuning the target and the CLI apply at start-up."""

from __future__ import annotations

import ctypes
import platform

from pynvmf.malloc import tune_for_io_buffers


def test_tuning_applies_on_glibc() -> None:
    on_glibc = platform.libc_ver()[0] == "glibc"
    assert tune_for_io_buffers() is on_glibc


def test_tuning_is_idempotent() -> None:
    first = tune_for_io_buffers()
    assert tune_for_io_buffers() is first
    # malloc still works normally afterwards, large and small.
    assert len(bytearray(4 << 20)) == 4 << 20
    assert ctypes.create_string_buffer(16).raw == bytes(16)
