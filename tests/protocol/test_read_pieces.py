"""Large Reads are read and sent in pieces (budget.READ_CHUNK): a Read of MDTS from a
file or memory namespace holds about one piece of buffer, not the whole transfer, and
its data arrives whole and correct, with and without data digests. (A memory namespace's
Reads copy its memory at once rather than send views of it: block/inplace.py says why.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.target.budget import READ_CHUNK
from pynvmf.target.limits import MAX_TRANSFER
from pynvmf.target.subsystem import Namespace, Subsystem
from tests.protocol.conftest import RawTargetFactory

NQN = "nqn.2024-01.io.pynvmf.test:pieces"
BLOCK = 512
MIB = 1 << 20
SIZE = 4 * MIB


def _image(path: Path) -> bytes:
    content = os.urandom(SIZE)
    path.write_bytes(content)
    return content


@pytest.mark.parametrize("backend", ["file", "memory"])
@pytest.mark.parametrize("digest", [False, True], ids=["plain", "data-digest"])
async def test_a_read_of_mdts_holds_about_one_piece(
    raw_target_factory: RawTargetFactory, tmp_path: Path, digest: bool, backend: str
) -> None:
    content = _image(tmp_path / "ns.img")
    subsystem = Subsystem(NQN)
    device: FileDevice | MemoryDevice
    if backend == "file":
        device = FileDevice(tmp_path / "ns.img", BLOCK)
    else:
        device = MemoryDevice(SIZE, BLOCK)
        device.write_now(0, SIZE // BLOCK, content)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, f"{backend}:1"))
    rt = await raw_target_factory([subsystem])
    pool = rt.target.memory_pool
    assert MAX_TRANSFER >= MIB > READ_CHUNK
    async with await connect(
        "127.0.0.1", rt.port.port, NQN, header_digest=digest, data_digest=digest
    ) as ctrl:
        ns = ctrl.namespace(1)
        (controller,) = subsystem.controllers.values()
        conn = controller.queues[1].conn
        assert conn.ddgst is digest
        for offset, length in ((0, MAX_TRANSFER), (3 * BLOCK, MIB - 5 * BLOCK), (0, 300_000)):
            length -= length % BLOCK
            before_pdus = conn.stats.c2h_data_pdus
            baseline = pool.used  # the connections' receive buffers
            pool.peak = pool.used
            buf = bytearray(length)
            await ns.read(offset // BLOCK, memoryview(buf))
            assert buf == content[offset : offset + length]
            # One C2HData PDU per piece, and never more than two pieces held at once
            # (the next one is charged before the socket has taken the last).
            assert conn.stats.c2h_data_pdus - before_pdus == -(-length // READ_CHUNK)
            assert pool.peak - baseline <= 2 * READ_CHUNK, pool.peak - baseline
            assert pool.used == baseline
