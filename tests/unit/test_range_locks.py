"""RangeLocks (block/range_locks.py): what one process holds another waits for, and a
shared memory namespace's copies hold what they touch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest

from pynvmf.block import range_locks as R
from pynvmf.block.file import FileDevice
from pynvmf.block.range_locks import STRIPE_BYTES, RangeLocks, stripes_for
from pynvmf.block.shared_memory import SharedMemoryDevice

BLOCK = 512


@pytest.fixture
def locks() -> Iterator[tuple[RangeLocks, RangeLocks]]:
    """The semaphores of 1 MiB as their creator and another handle (another process's
    view of them: a semaphore has no owner, so two handles exclude each other as two
    processes do)."""
    mine = RangeLocks.create(1 << 20)
    theirs = RangeLocks.open(mine.name, mine.count)
    yield mine, theirs
    theirs.close()
    mine.close()


def test_stripe_counts_are_powers_of_two_up_to_the_limit() -> None:
    assert stripes_for(512) == 1
    assert stripes_for(STRIPE_BYTES + 1) == 2
    assert stripes_for(5 * STRIPE_BYTES) == 8
    assert stripes_for(1 << 40) == R.MAX_STRIPES


def test_a_held_range_excludes_every_overlapping_range_and_no_other(
    locks: tuple[RangeLocks, RangeLocks],
) -> None:
    mine, theirs = locks
    assert mine.count == 16
    mine.hold(4096, 8192)
    assert not theirs.try_hold(0, 4097)  # the same stripe
    assert not theirs.try_hold(STRIPE_BYTES - 512, STRIPE_BYTES + 512)  # spans it
    # Stripe 16 wraps onto the same semaphore as stripe 0: held too.
    assert not theirs.try_hold(16 * STRIPE_BYTES, 16 * STRIPE_BYTES + 512)
    assert theirs.try_hold(STRIPE_BYTES, 2 * STRIPE_BYTES)  # stripe 1 is free
    theirs.release(STRIPE_BYTES, 2 * STRIPE_BYTES)
    mine.release(4096, 8192)
    assert theirs.try_hold(0, 4097)
    theirs.release(0, 4097)


def test_a_range_across_stripes_holds_them_all_and_gives_them_all_back(
    locks: tuple[RangeLocks, RangeLocks],
) -> None:
    mine, theirs = locks
    mine.hold(STRIPE_BYTES - 512, 3 * STRIPE_BYTES + 512)  # stripes 0..3
    for stripe in range(4):
        start = stripe * STRIPE_BYTES
        assert not theirs.try_hold(start, start + 512)
    assert theirs.try_hold(4 * STRIPE_BYTES, 4 * STRIPE_BYTES + 512)
    theirs.release(4 * STRIPE_BYTES, 4 * STRIPE_BYTES + 512)
    mine.release(STRIPE_BYTES - 512, 3 * STRIPE_BYTES + 512)
    # A range longer than all the stripes together holds each semaphore once.
    mine.hold(0, 64 * STRIPE_BYTES)
    assert not theirs.try_hold(5 * STRIPE_BYTES, 5 * STRIPE_BYTES + 1)
    mine.release(0, 64 * STRIPE_BYTES)
    assert theirs.try_hold(0, 16 * STRIPE_BYTES)
    theirs.release(0, 16 * STRIPE_BYTES)


def test_two_ranges_are_held_as_one_set(locks: tuple[RangeLocks, RangeLocks]) -> None:
    mine, theirs = locks
    # Source and destination in the same stripe: its semaphore is taken once (taking it
    # twice would wait for ever).
    held = mine.hold_two(0, 512, 1024, 1536)
    assert held == [0]
    mine.release_stripes(held)
    held = mine.hold_two(2 * STRIPE_BYTES, 2 * STRIPE_BYTES + 512, 0, 512)
    assert held == [0, 2]
    assert not theirs.try_hold(0, 1) and not theirs.try_hold(2 * STRIPE_BYTES, 1 + 2 * STRIPE_BYTES)
    mine.release_stripes(held)
    assert theirs.try_hold(0, 3 * STRIPE_BYTES)
    theirs.release(0, 3 * STRIPE_BYTES)


def test_the_creator_removes_the_semaphores_and_others_only_close_theirs() -> None:
    mine = RangeLocks.create(4096)
    theirs = RangeLocks.open(mine.name, mine.count)
    theirs.close()
    RangeLocks.open(mine.name, mine.count).close()  # still there
    mine.close()
    with pytest.raises(posix_ipc.ExistentialError):
        RangeLocks.open(mine.name, mine.count)


def test_a_shared_memory_namespace_copies_only_what_no_other_process_holds() -> None:
    device = SharedMemoryDevice(1 << 20, BLOCK)
    # The same memory and semaphores as a worker process opens them.
    worker = SharedMemoryDevice(1 << 20, BLOCK, fd=os.dup(device.fileno()), locks=device.locks)
    other = RangeLocks.open(*device.locks)
    try:
        inplace = worker.inplace
        assert inplace is not None
        assert inplace.write_now(8, 8, b"\x11" * 4096)
        other.hold(8 * BLOCK, 9 * BLOCK)  # one block of the range, held elsewhere
        wrote = threading.Event()

        def write() -> None:
            assert inplace.write_now(8, 8, b"\x22" * 4096)
            wrote.set()

        writer = threading.Thread(target=write)
        writer.start()
        # The write waits for the block (a negative check: it cannot pass wrongly).
        assert not wrote.wait(0.3)
        assert os.pread(device.fileno(), 4096, 8 * BLOCK) == b"\x11" * 4096
        other.release(8 * BLOCK, 9 * BLOCK)
        writer.join(10)
        assert wrote.is_set()
        assert worker.read_now(8, 8, 4096) == b"\x22" * 4096
    finally:
        other.close()
        worker.close_sync()
        device.close_sync()


def _waits_for_the_held_range(held: RangeLocks, off: int, end: int, io: Callable[[], None]) -> None:
    """`io` does not finish while another handle holds [off, end), and does once it is
    released."""
    held.hold(off, end)
    done = threading.Event()

    def run() -> None:
        io()
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert not done.wait(0.3)  # a negative check: it cannot pass wrongly
    finally:
        held.release(off, end)
        thread.join(10)
    assert done.is_set()


def test_a_shared_file_reads_writes_and_zeroes_only_what_no_other_process_holds(
    tmp_path: Path,
) -> None:
    main = FileDevice(tmp_path / "ns.img", BLOCK, size_bytes=1 << 20, create=True)
    name, count = main.share()
    worker = FileDevice(tmp_path / "ns.img", BLOCK, locks=(name, count))
    assert main.share() == (name, count)  # once shared, the same semaphores
    other = RangeLocks.open(name, count)
    try:
        buf = bytearray(4096)
        _waits_for_the_held_range(
            other, 4096, 4608, lambda: asyncio.run(worker.write(8, b"\x33" * 4096))
        )
        _waits_for_the_held_range(
            other, 4096, 4608, lambda: asyncio.run(worker.read(8, memoryview(buf)))
        )
        assert buf == b"\x33" * 4096
        _waits_for_the_held_range(other, 4096, 4608, lambda: asyncio.run(worker.write_zeroes(8, 8)))
        _waits_for_the_held_range(
            other,
            2 * STRIPE_BYTES,
            2 * STRIPE_BYTES + 512,
            lambda: asyncio.run(worker.copy_within(0, 2 * STRIPE_BYTES // BLOCK, 8)),
        )
        asyncio.run(worker.read(8, memoryview(buf)))
        assert buf == bytes(4096)
    finally:
        other.close()
        asyncio.run(worker.close())
        asyncio.run(main.close())
    with pytest.raises(posix_ipc.ExistentialError):  # the sharing process removed them
        RangeLocks.open(name, count)


def test_semaphores_of_a_target_that_no_longer_runs_are_removed() -> None:
    # A process that made semaphores and was killed before it could remove them.
    code = (
        "import os, signal\n"
        "from pynvmf.block.range_locks import RangeLocks\n"
        "locks = RangeLocks.create(4096)\n"
        "print(locks.name, locks.count, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    name, count = proc.stdout.split()
    RangeLocks.open(name, int(count)).close()  # left behind
    live = RangeLocks.create(4096)  # this process's own stay
    try:
        assert R.remove_stale() >= 1
        with pytest.raises(posix_ipc.ExistentialError):
            RangeLocks.open(name, int(count))
        RangeLocks.open(live.name, live.count).close()
    finally:
        live.close()
