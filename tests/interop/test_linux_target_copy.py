"""The copy planner through pynvmf's host on the Linux kernel's nvmet-tcp (in a QEMU guest:
the oldest and the newest peer, 6.1 and 7, tests/support/guest.py), which has no Copy
command (ONCS bit 8 clear), and on pynvmf's own target (in-process), which has. The same
16-range copy runs against each: the planner emulates it on a kernel target (the data
crosses the connection twice, read and write) and offloads it to pynvmf's (one Copy
command, a few hundred bytes), and the result is the same bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from pynvmf.block import copy as block_copy
from pynvmf.block.copy import CopyReport, SourceRange
from pynvmf.block.device import CopyOffload
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import Controller, connect
from pynvmf.spec import identify as I
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.guest import (
    OLDEST_AND_NEWEST,
    PEERS,
    Guest,
    require_guest_prerequisites,
    setup_kernel_target,
)
from tests.support.ports import free_tcp_port

KIB = 1024
MIB = 1024 * KIB

NQN = "nqn.2014-08.org.pynvmf:host-copy"
SIZE = 64 * MIB
BS = 512
NUM_BLOCKS = SIZE // BS
RANGES = 16
# Range lengths: from one block up to this (a few MiB in all, quick over slirp).
MAX_RANGE_BLOCKS = 512 * KIB // BS
# Sources live below SOURCE_AREA; the destination starts at DST_LBA, far above.
SOURCE_AREA = 32 * MIB // BS
DST_LBA = 40 * MIB // BS + 3
SEED = 4130
CONNECT_TIMEOUT = 30.0  # a TCG guest is slow to answer
KERNEL_TROUBLE = re.compile(
    r"nvme.*(error|fail|expired|unexpected|invalid|fatal|timeout|unhandled|warn)"
    r"|BUG|WARNING|Call Trace",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class CopyTarget:
    kind: str
    port: int
    guest: Guest | None = None


# The kernel peers this module runs on (of those selected), and pynvmf's target.
TARGET_KINDS = [p.name for p in OLDEST_AND_NEWEST.peers()] + ["pynvmf"]


@pytest.fixture(scope="module", params=TARGET_KINDS)
def target_kind(request: pytest.FixtureRequest) -> str:
    """Module-scoped, so that pytest boots each kernel peer once."""
    kind: str = request.param
    return kind


@pytest.fixture(scope="module")
def linux_target(target_kind: str) -> Iterator[CopyTarget]:
    """One guest boot per kernel peer: a null_blk namespace exported by nvmet-tcp."""
    peer = PEERS[target_kind]
    require_guest_prerequisites(peer)
    port = free_tcp_port()
    guest = Guest(hostfwd=[port], peer=peer)
    guest.start()
    try:
        setup_kernel_target(guest, port=port, nqn=NQN, size_mb=SIZE // MIB, block_size=BS)
        guest.run("dmesg -c")  # what the set-up logged is not this test's business
        yield CopyTarget("linux", port, guest)
    finally:
        guest.stop()


@pytest.fixture
async def pynvmf_target() -> AsyncIterator[CopyTarget]:
    """pynvmf's target in this test's event loop, with the same namespace."""
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(SIZE, BS), "memory:copy"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    try:
        yield CopyTarget("pynvmf", target.ports[0].port)
    finally:
        await target.stop()


@pytest.fixture
def target(request: pytest.FixtureRequest, target_kind: str) -> CopyTarget:
    """The target of this kind. Not a coroutine: the async fixture it picks must be set up
    outside the running event loop."""
    fixture = "pynvmf_target" if target_kind == "pynvmf" else "linux_target"
    chosen: CopyTarget = request.getfixturevalue(fixture)
    return chosen


@dataclass(frozen=True)
class Layout:
    """The copy: (lba, data) of each source, in copy order."""

    sources: tuple[tuple[int, bytes], ...]

    @property
    def expected(self) -> bytes:
        return b"".join(data for _lba, data in self.sources)


def make_layout() -> Layout:
    """RANGES sources of random lengths at random, non-overlapping places, shuffled."""
    rng = random.Random(SEED)
    slot = SOURCE_AREA // RANGES
    sources = []
    for i in range(RANGES):
        n = rng.randint(1, MAX_RANGE_BLOCKS)
        lba = i * slot + rng.randrange(slot - n + 1)
        sources.append((lba, rng.randbytes(n * BS)))
    rng.shuffle(sources)
    return Layout(tuple(sources))


def wire_bytes(ctrl: Controller) -> int:
    return ctrl.bytes_sent + ctrl.bytes_received


async def test_copy_is_emulated_on_the_kernel_target_and_offloaded_on_pynvmf(
    target: CopyTarget,
) -> None:
    layout = make_layout()
    expected = layout.expected
    total = len(expected) // BS
    async with await connect(
        "127.0.0.1", target.port, NQN, queues=2, queue_depth=16, timeout=CONNECT_TIMEOUT
    ) as ctrl:
        assert ctrl.info is not None
        ns = ctrl.namespace(1)
        has_copy = bool(ctrl.info.oncs & I.Oncs.COPY)
        assert has_copy == (target.kind == "pynvmf")
        assert isinstance(ns, CopyOffload) == has_copy

        await asyncio.gather(*(ns.write(lba, data) for lba, data in layout.sources))
        # Something else in the destination first, so that a copy that wrote nothing fails.
        await ns.write(DST_LBA, random.Random(SEED + 1).randbytes(len(expected)))

        sources = [SourceRange(ns, lba, len(data) // BS) for lba, data in layout.sources]
        before = wire_bytes(ctrl)
        report = await block_copy.copy(sources, ns, DST_LBA)
        moved = wire_bytes(ctrl) - before

        result = bytearray(len(expected))
        await ns.read(DST_LBA, memoryview(result))
        # The sources are untouched.
        for lba, data in layout.sources:
            back = bytearray(len(data))
            await ns.read(lba, memoryview(back))
            assert back == data, f"source at LBA {lba} changed"

    # The same bytes on both targets: the concatenated sources.
    assert hashlib.sha256(result).hexdigest() == hashlib.sha256(expected).hexdigest()
    ratio = moved / len(expected)
    print(f"{target.kind}: {report}, {moved} bytes for {len(expected)} copied ({ratio:.5f}x)")
    if target.kind == "linux":
        assert report == CopyReport(emulated_blocks=total)
        assert 1.9 <= ratio <= 2.2
        assert target.guest is not None
        log = (await asyncio.to_thread(target.guest.run, "dmesg -c")).output
        trouble = [line for line in log.splitlines() if KERNEL_TROUBLE.search(line)]
        assert not trouble, "the kernel logged trouble:\n" + "\n".join(trouble)
    else:
        assert report == CopyReport(offloaded_blocks=total, commands=1)
        assert moved < len(expected) / 100
