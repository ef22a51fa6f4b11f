"""Sizes as people type them: one grammar for every command-line option and for the
configuration file, so that `1MB` means the same wherever it is accepted.

A size is a whole number with an optional unit: K, M, G, T or P are powers of 1024,
also written KiB or KB (1MB is 1 MiB, as in fio's default); B is bytes. Case does not
matter. What a bare number counts depends on the place (bytes for a size, blocks for
`pynvmf copy`'s COUNT), so the caller learns whether a unit was given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIZE_EXAMPLES = "e.g. 4096, 64K, 1M, 2GiB"

_MULTIPLIERS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE = re.compile(r"\s*(\d+)\s*(?:([kmgtp])(?:i?b)?|(b))?\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number as typed: `number` times `multiplier` (1 for a bare number or B)."""

    number: int
    multiplier: int
    has_unit: bool

    @property
    def value(self) -> int:
        return self.number * self.multiplier


def parse_quantity(text: str) -> Quantity:
    """`text` in the size grammar; ValueError (naming `text`) if it is not."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} ({SIZE_EXAMPLES})")
    number, unit, byte = m.groups()
    if unit is not None:
        return Quantity(int(number), _MULTIPLIERS[unit.lower()], True)
    return Quantity(int(number), 1, byte is not None)


def parse_size(text: str | int) -> int:
    """A size in bytes: a bare number is bytes. An int (a JSON file's number) is taken as
    it is; anything else is read as text, so that `true` is refused as `"true"` is."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    return parse_quantity(str(text)).value


def format_size(nbytes: int) -> str:
    """`nbytes` in the largest binary unit that divides it: 1 MiB, 64 KiB, 513 bytes."""
    for name, multiplier in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30),
                             ("MiB", 1 << 20), ("KiB", 1 << 10)):  # fmt: skip
        if nbytes and nbytes % multiplier == 0:
            return f"{nbytes // multiplier} {name}"
    return f"{nbytes} bytes"
