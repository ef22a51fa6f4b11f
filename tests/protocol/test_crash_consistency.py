"""Nothing acknowledged is lost when the target dies: `kill -9` of a `pynvmf target` process
in the middle of FUA writes and of writes followed by Flush, on a file namespace, twenty
times; after each restart every acknowledged block reads back as written.

A process killed this way loses what it holds in user space, not the page cache (a power
loss would; FUA and Flush reach the disk through fdatasync/RWF_DSYNC, which the file
backend's tests check): this is the check that no acknowledged write is still inside the
target when it dies. A write counts as acknowledged when it completed with FUA, or when a
Flush issued after it completed; each trial writes every block at most once, with a pattern
naming the trial and the block, so a block reads back either as its acknowledged pattern or
(not acknowledged) as anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import struct
from pathlib import Path

import pytest

from pynvmf.host import connect
from pynvmf.host.errors import NvmeError
from pynvmf.host.namespace import RemoteNamespace
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = pytest.mark.timeout(600)

NQN = "nqn.2024-11.dev.pynvmf:crash"
BLOCK = 4096
BLOCKS = 4096  # 16 MiB
TRIALS = 20
_HEADER = struct.Struct("<QQ")  # trial, block


def _pattern(trial: int, block: int) -> bytes:
    head = _HEADER.pack(trial, block)
    return head + random.Random(trial * BLOCKS + block).randbytes(BLOCK - len(head))


def _start(image: Path, workdir: Path, port: int) -> TargetProcess:
    proc = TargetProcess(
        None,
        workdir,
        [
            "--listen",
            f"127.0.0.1:{port}",
            "--discovery-port",
            "0",
            "--nqn",
            NQN,
            "--file",
            str(image),
            "--block-size",
            str(BLOCK),
        ],
    )
    proc.start()
    return proc


async def _writer(
    ns: RemoteNamespace, trial: int, blocks: list[int], acked: set[int], fua: bool
) -> None:
    """Write `blocks` one after another; with FUA each is acknowledged on completion,
    without it every few writes a Flush acknowledges the ones completed before it."""
    pending: list[int] = []
    for block in blocks:
        await ns.write(block, _pattern(trial, block), fua=fua)
        if fua:
            acked.add(block)
            continue
        pending.append(block)
        if len(pending) >= 4:
            done, pending = pending, []
            await ns.flush()
            acked.update(done)


async def _trial(trial: int, proc: TargetProcess, port: int, rng: random.Random) -> set[int]:
    """Write to the running `proc` and kill it at a random moment; the blocks acknowledged
    before it died."""
    acked: set[int] = set()
    blocks = rng.sample(range(BLOCKS), BLOCKS)  # more than can be written before the crash
    try:
        ctrl = await connect("127.0.0.1", port, NQN, queues=2, kato_ms=0)
        ns = ctrl.namespace(1)
        writers = [
            asyncio.create_task(_writer(ns, trial, blocks[i::4], acked, fua=i % 2 == 0))
            for i in range(4)
        ]
        await asyncio.sleep(rng.uniform(0.02, 0.25))  # the moment of the crash, at random
        proc.stop(sig=signal.SIGKILL, expect=-signal.SIGKILL)
        for task in writers:
            with contextlib.suppress(NvmeError, ConnectionError, OSError):
                await task
        with contextlib.suppress(NvmeError, ConnectionError, OSError):
            await ctrl.close()
    finally:
        if proc.alive:
            proc.stop(sig=signal.SIGKILL, expect=None)
    return acked


async def test_kill_9_loses_no_acknowledged_write(tmp_path: Path) -> None:
    image = tmp_path / "ns.img"
    image.write_bytes(bytes(BLOCK * BLOCKS))
    rng = random.Random(1)
    acknowledged = 0
    port = free_tcp_port()
    proc = _start(image, tmp_path, port)
    try:
        for trial in range(1, TRIALS + 1):
            acked = await _trial(trial, proc, port, rng)
            acknowledged += len(acked)
            # The restarted target is checked, then is the next trial's victim: one start
            # per trial.
            port = free_tcp_port()
            proc = _start(image, tmp_path, port)
            async with await connect("127.0.0.1", port, NQN) as ctrl:
                ns = ctrl.namespace(1)
                buf = bytearray(BLOCK)
                for block in sorted(acked):
                    await ns.read(block, memoryview(buf))
                    assert buf == _pattern(trial, block), (trial, block)
        proc.stop()
    finally:
        if proc.alive:
            proc.stop(sig=signal.SIGKILL, expect=None)
    # The crashes came while writes were flowing: acknowledged, but not all of them.
    assert TRIALS * 8 < acknowledged < TRIALS * BLOCKS, acknowledged
    print(f"{TRIALS} kill -9 trials, {acknowledged} acknowledged writes, none lost")
