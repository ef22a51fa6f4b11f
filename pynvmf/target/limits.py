"""The limits the target reports in Identify and enforces on commands: one place
for each, so that what a host is told and what the target checks never drift apart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pynvmf.block.device import CopyLimits

if TYPE_CHECKING:
    from pynvmf.target.subsystem import Subsystem

MDTS = 8  # 2^8 pages of 4 KiB: 1 MiB per command
MAX_TRANSFER = (1 << MDTS) * 4096

# Write Zeroes and Verify carry a 16-bit 0's based block count: 65536 blocks, 32 MiB of
# 512-byte blocks. Identify (CNS 06h) reports them as log2 of 4 KiB units, so 2^13.
WRITE_ZEROES_SIZE_LIMIT = 13
VERIFY_SIZE_LIMIT = 13
VERIFY_MAX_BYTES = (1 << VERIFY_SIZE_LIMIT) * 4096  # a longer Verify is Invalid Field

# Atomic Compare & Write Unit (Identify Controller ACWU, 0's based blocks): a fused Compare
# and Write runs alone on its namespace whatever its length, so the unit is the most
# blocks one command may carry (MDTS) in the largest block size, good for every namespace.
ACWU = MAX_TRANSFER // 4096 - 1

COPY_MAX_BYTES = 64 << 20  # MCL, in bytes: bounds what an overlapping copy may stage
COPY_MAX_RANGES = 128  # MSRC + 1
COPY_FORMATS = (0, 1, 2, 3)  # TP 4065 formats 0/1, TP 4130 formats 2/3
OCFS = sum(1 << f for f in COPY_FORMATS)  # Identify Controller's bit mask of them


def copy_limits(block_size: int) -> CopyLimits:
    max_blocks = COPY_MAX_BYTES // block_size
    return CopyLimits(min(0xFFFF, max_blocks), max_blocks, COPY_MAX_RANGES)


# Identify Controller NN: at least 1024, so hosts see room for namespaces added later.
MIN_REPORTED_NN = 1024


def reported_nn(subsystem: Subsystem) -> int:
    """The Number of Namespaces (NN) a subsystem's controllers report: NSIDs 1..NN are
    valid, and an NSID in that range with no namespace behind it is inactive. A subsystem
    created with a namespace limit reports that limit, as nvmet and SPDK do."""
    if subsystem.max_namespaces:
        return subsystem.max_namespaces
    return max(MIN_REPORTED_NN, subsystem.max_nsid)
