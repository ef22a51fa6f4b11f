"""Label values a host chooses (its NQN), made safe and bounded for an exposition.

A host picks its NQN, so it may send a huge one, one with odd characters, or connect
under a thousand of them: each would be a series. `label_value` keeps a value printable
and short; `BoundedLabels` lets at most `limit` distinct values through and folds the
others into one series, counting how many it folded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pynvmf.target.command_counts import OPCODE_SLOTS, OTHER_OPCODE
from pynvmf.target.io import IO_COMMANDS

# The `opcode` label of each opcode slot (command_counts.py): the NVM command set's
# commands by name, any other opcode as "other". Here, not in collector.py, so that what
# answers pynvmf_get_host_stats does not import prometheus-client.
OPCODE_LABELS: tuple[str, ...] = tuple(
    IO_COMMANDS[op].name if op in IO_COMMANDS and op < OPCODE_SLOTS else "other"
    for op in range(OTHER_OPCODE + 1)
)

# An NQN is at most 223 bytes (NVMe Base 2.1, 4.5): a legitimate one is never cut.
MAX_LABEL_CHARS = 256
# What a value cut short keeps of itself: a prefix and a hash of the whole, so that two
# long values that share a prefix stay two series.
_KEPT_CHARS = MAX_LABEL_CHARS - 17
OTHER = "_other"
DEFAULT_HOST_LIMIT = 256


def label_value(text: str) -> str:
    """`text` with every character that is not printable (control characters, lone
    surrogates a decoder let through) as '?', and cut to MAX_LABEL_CHARS with a hash of
    the whole appended when longer. prometheus-client escapes the rest (\\, ", newline)."""
    clean = text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)
    clean = clean.encode("utf-8", "replace").decode("utf-8")
    if len(clean) <= MAX_LABEL_CHARS:
        return clean
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{clean[:_KEPT_CHARS]}~{digest}"


class BoundedLabels:
    """At most `limit` distinct values of one label at a time; the rest are OTHER.

    A value keeps its own series for as long as it is present at every scrape (a series
    does not move between a value and OTHER while it exists); a value no longer present
    gives its place up, and places go to new values in sorted order, so which values
    are folded does not depend on the order of a dictionary."""

    def __init__(self, limit: int = DEFAULT_HOST_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"a label needs room for at least one value, not {limit}")
        self.limit = limit
        self._kept: set[str] = set()
        self.folded = 0  # distinct values folded into OTHER at the last scrape

    def assign(self, present: Iterable[str]) -> dict[str, str]:
        """The label of each value present now (given as label_value made it)."""
        values = set(present)
        self._kept &= values
        for value in sorted(values - self._kept):
            if len(self._kept) >= self.limit:
                break
            self._kept.add(value)
        self.folded = len(values - self._kept)
        return {value: value if value in self._kept else OTHER for value in values}
