"""The RDMA queue's registered buffers (pynvmf/rdma/buffers.py): slots by offset, bounded,
handed out in order."""

from __future__ import annotations

import itertools

import pytest

from pynvmf.rdma.buffers import ALIGN, BufferPool, OrderedWork, RegionPool, data_classes


def test_slots_are_laid_out_by_class_aligned_and_disjoint() -> None:
    pool = BufferPool([(4096, 2), (100, 3)])
    spans = sorted((s.offset, s.offset + s.size) for s in pool.slots)
    assert [s.size for s in pool.slots] == [100, 100, 100, 4096, 4096]
    assert all(s.offset % ALIGN == 0 for s in pool.slots)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert pool.size == 3 * 128 + 2 * 4096
    assert pool.largest == 4096


def test_take_prefers_the_smallest_class_then_larger_then_none() -> None:
    pool = BufferPool([(100, 1), (4096, 1)])
    a = pool.take(64)
    b = pool.take(64)
    assert a is not None and a.size == 100
    assert b is not None and b.size == 4096  # the small class is used up: a larger one
    assert pool.take(1) is None
    assert pool.in_use == 2
    pool.give(a)
    assert pool.take(4000) is None  # only the small slot is free, too small
    c = pool.take(100)
    assert c == a


def test_a_slot_given_back_twice_is_refused() -> None:
    pool = BufferPool([(64, 2)])
    slot = pool.take(10)
    assert slot is not None
    pool.give(slot)
    with pytest.raises(ValueError, match="not taken"):
        pool.give(slot)
    assert pool.in_use == 0


@pytest.mark.parametrize("classes", [[], [(0, 1)], [(64, 0)]])
def test_a_pool_without_a_usable_class_is_refused(classes: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError):
        BufferPool(classes)


def test_data_classes_hold_a_small_slot_per_command_and_the_largest_transfer() -> None:
    classes = data_classes(128, 1 << 20)
    assert classes == [(16384, 128), (131072, 16), (1 << 20, 2)]
    pool = BufferPool(classes)
    assert pool.size == 6 << 20
    assert pool.fits(1 << 20) and not pool.fits((1 << 20) + 1)
    # A queue whose transfers are small needs one class.
    assert data_classes(4, 8192) == [(8192, 4)]


def test_work_goes_in_order_and_waits_behind_a_missing_buffer() -> None:
    work: OrderedWork[str] = OrderedWork(BufferPool([(4096, 1)]), credits=8)
    first = work.push("write 1", 4096)
    assert [w for w, _ in first] == ["write 1"]
    slot = first[0][1]
    assert slot is not None
    # No buffer for the second write: it waits, and so does the SEND asked for after it
    # (its completion must follow its data).
    assert work.push("write 2", 100) == []
    assert work.push("send 2") == []
    assert work.waiting == 2 and work.waits == 2
    ready = work.done(slot)
    assert [w for w, _ in ready] == ["write 2", "send 2"]
    assert ready[0][1] == slot and ready[1][1] is None
    assert work.waiting == 0


def test_work_past_the_send_queue_depth_waits_for_a_completion() -> None:
    work: OrderedWork[int] = OrderedWork(BufferPool([(64, 4)]), credits=2)
    assert [w for w, _ in work.push(1)] == [1]
    assert [w for w, _ in work.push(2)] == [2]
    assert work.push(3) == []
    assert [w for w, _ in work.done()] == [3]
    assert work.credits == 0


def test_work_no_buffer_could_hold_is_refused_and_nothing_waits() -> None:
    work: OrderedWork[str] = OrderedWork(BufferPool([(4096, 1)]), credits=4)
    with pytest.raises(ValueError, match="largest buffer holds 4096"):
        work.push("too big", 4097)
    assert work.waiting == 0 and work.credits == 4


def test_clear_drops_what_waits() -> None:
    work: OrderedWork[str] = OrderedWork(BufferPool([(64, 1)]), credits=4)
    work.push("a", 64)
    work.push("b", 64)
    assert work.clear() == ["b"]
    assert work.waiting == 0


class FakeRegion:
    def __init__(self, size: int) -> None:
        self.size = size
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_regions_are_registered_once_per_slot_and_kept() -> None:
    made: list[FakeRegion] = []

    def register(size: int) -> FakeRegion:
        made.append(FakeRegion(size))
        return made[-1]

    regions = RegionPool(BufferPool([(1088, 1), (16448, 1)]), register)
    mr, slot = regions.take(100)
    assert slot is not None and mr.size == 1088
    regions.give(mr, slot)
    again, slot = regions.take(1000)
    assert again is mr and len(made) == 1  # the slot's region, not a new one
    # Every fitting slot in use (or none large enough): a region of its own, closed when
    # given back; the kept ones stay open until the pool closes.
    big, big_slot = regions.take(16448)
    own, own_slot = regions.take(20000)
    assert big_slot is not None and own_slot is None and own.size == 20000
    regions.give(own, own_slot)
    assert own.closed and not big.closed
    assert regions.registered == 2
    regions.give(mr, slot)
    regions.give(big, big_slot)
    regions.close()
    assert mr.closed and big.closed and regions.registered == 0
