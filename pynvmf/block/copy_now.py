"""The copy planner's rule for a Copy it can do at once, compiled.

This is part of the planner (block/copy.py binds it as `copy_one_range_now`, and holds
the rest of its rules). It is a module of its own so the compiled build
(docs/performance.md) can compile it without compiling the planner: the target calls it
for every one-range Copy to a memory namespace, and from compiled code a call into an
interpreted function costs more than the memmove of the 8 KiB it copies.
"""

from __future__ import annotations

from pynvmf.block.device import BlockDevice
from pynvmf.block.inplace import InPlace


def copy_one_range_now(dev: BlockDevice, src_lba: int, dst_lba: int, nblocks: int) -> bool:
    """copy_one_range for a device that does its native copy at once (a memory device:
    `inplace`, block/inplace.py), without a coroutine: the same rule, a native copy with
    memmove semantics, so True means CopyReport(native_blocks=nblocks) (not built: this
    runs per Copy command). False, having done nothing, where that does not apply
    (another device, a range outside it): then copy_one_range or a plan decides."""
    inplace: InPlace | None = getattr(dev, "inplace", None)
    return (
        inplace is not None
        and inplace.copies
        and nblocks > 0
        and inplace.copy_within(src_lba, dst_lba, nblocks)
    )
