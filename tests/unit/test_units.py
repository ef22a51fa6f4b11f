"""The one size grammar of the command line and the configuration file (pynvmf.units)."""

from __future__ import annotations

import pytest

from pynvmf.units import format_size, parse_quantity, parse_size

MiB = 1 << 20


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("4096B", 4096),
        ("4k", 4096),
        ("64K", 64 << 10),
        ("1M", MiB),
        ("1MB", MiB),  # as fio's default reads it, and as `target --memory` always did
        ("1MiB", MiB),
        ("1mb", MiB),
        ("2GiB", 2 << 30),
        (" 3 T ", 3 << 40),
        ("1P", 1 << 50),
    ],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "-1", "1.5M", "10X", "1MX", "1 0K", "0x10"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_a_json_number_is_bytes_and_a_boolean_is_no_size() -> None:
    assert parse_size(7) == 7
    with pytest.raises(ValueError, match="not a size"):
        parse_size(True)


def test_a_bare_number_says_it_had_no_unit() -> None:
    # `pynvmf copy` counts blocks with a bare number, bytes with a unit.
    assert not parse_quantity("8").has_unit
    assert parse_quantity("8B").has_unit and parse_quantity("8B").value == 8


def test_format_size() -> None:
    assert [format_size(n) for n in (MiB, 64 << 10, 513, 0, 3 << 30)] == [
        "1 MiB",
        "64 KiB",
        "513 bytes",
        "0 bytes",
        "3 GiB",
    ]
