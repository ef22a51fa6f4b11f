"""The copy planner's rule for a Copy it can do at once, compiled.

This is part of the planner (block/copy.py holds the rest of its rules, and
`watch_copies_now` to see this one's decisions). It is a module of its own so the
compiled build (docs/performance.md) can compile it without compiling the planner: the
target calls it for every one-range Copy to a memory namespace, and from compiled code a
call into an interpreted function, or a boxed call through a module variable, costs
about as much as the memmove of the 8 KiB it copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pynvmf.block.inplace import InPlace

# Told the block count of every copy done here (block/copy.py `watch_copies_now`; the
# Copy tests). Final, so compiled code reads it without a module lookup: unwatched, a
# copy pays one length test for it.
WATCHERS: Final[list[Callable[[int], object]]] = []


def copy_one_range_now(inplace: InPlace, src_lba: int, dst_lba: int, nblocks: int) -> bool:
    """copy_one_range for a device that does its native copy at once (a memory device:
    its `inplace`, block/inplace.py), without a coroutine: the same rule, a native copy
    with memmove semantics, so True means CopyReport(native_blocks=nblocks) (not built:
    this runs per Copy command). False, having done nothing, where that does not apply
    (the device wants its own copy_within called, a range outside it): then
    copy_one_range or a plan decides."""
    if not (inplace.copies and nblocks > 0 and inplace.copy_within(src_lba, dst_lba, nblocks)):
        return False
    if WATCHERS:
        for watcher in WATCHERS:
            watcher(nblocks)
    return True
