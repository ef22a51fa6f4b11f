"""Copy offload all the way down: an NVMe Copy sent to a file namespace on XFS becomes
copy_file_range in the target, which XFS turns into a reflink — the copy shares the
source's extents instead of moving the bytes.

The file system is a loop-mounted XFS image made by the test (needs root, as CI is).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.host import connect
from pynvmf.spec.command import CopyRange, copy_cdw12, pack_copy_ranges
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:reflink"
BLOCK = 4096
MIB = 1 << 20


def _require_root() -> None:
    if os.geteuid() == 0:
        return
    message = "loop-mounting an XFS image needs root"
    if os.environ.get("CI"):
        pytest.fail(message + ": CI must run as root")
    pytest.skip(message)


@pytest.fixture
def xfs_mount(tmp_path: Path) -> Iterator[Path]:
    _require_root()
    image = tmp_path / "xfs.img"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with image.open("wb") as f:
        f.truncate(512 * MIB)  # the smallest size mkfs.xfs accepts comfortably is 300 MB
    subprocess.run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


_EXTENT = re.compile(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):")


def _shared_ranges(path: Path) -> list[tuple[int, int]]:
    """(first logical block, count) of every extent filefrag reports as shared."""
    out = subprocess.run(
        ["filefrag", "-v", str(path)], capture_output=True, text=True, check=True
    ).stdout
    ranges = []
    for line in out.splitlines():
        m = _EXTENT.match(line)
        if m and "shared" in line:
            ranges.append((int(m.group(1)), int(m.group(5))))
    return ranges


def _covered(ranges: list[tuple[int, int]], start: int, count: int) -> bool:
    blocks = set()
    for first, n in ranges:
        blocks.update(range(first, first + n))
    return all(b in blocks for b in range(start, start + count))


async def test_nvme_copy_on_xfs_shares_extents(xfs_mount: Path) -> None:
    path = xfs_mount / "ns1.img"
    device = FileDevice(path, BLOCK, size_bytes=256 * MIB, create=True)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, f"file:{path}"))
    port = Port("127.0.0.1", 0)
    target = Target([subsystem], [port])
    await target.start()
    try:
        async with await connect("127.0.0.1", port.port, NQN) as ctrl:
            ns = ctrl.namespace(1)
            data = random.Random(3).randbytes(64 * MIB)
            await ns.write(0, data)
            await ns.flush()
            assert _shared_ranges(path) == []
            nblocks = len(data) // BLOCK
            dst = 32768
            # Four 16 MiB ranges in one Copy command (each within MSSRL).
            ranges = [CopyRange(i * 4096, 4096) for i in range(4)]
            await ctrl.io_command(
                IoOpcode.COPY,
                1,
                dst & 0xFFFFFFFF,
                dst >> 32,
                copy_cdw12(len(ranges), 0, fua=True),
                data=pack_copy_ranges(ranges, 0),
            )
            back = bytearray(len(data))
            await ns.read(dst, memoryview(back))
            assert back == data
        # The copy was a metadata operation: source and destination blocks are shared
        # extents of the file (the file system block is the namespace block here).
        shared = _shared_ranges(path)
        assert _covered(shared, 0, nblocks), shared
        assert _covered(shared, dst, nblocks), shared
    finally:
        await target.stop()
