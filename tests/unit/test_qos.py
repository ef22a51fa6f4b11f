"""Rate limits of a block device (target/qos.py's rules, with an injected clock, and
qos_gate.py's waiting queue): SPDK's rounding, each limit counting what SPDK counts, the
long-run rate, overrun by one large command, and nothing charged for a command that
must wait."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from pynvmf.block.range_locks import RangeLocks
from pynvmf.target import qos
from pynvmf.target.qos import MIB, TOLERANCE_NS, QosLimits, admit, normalized, set_rates
from pynvmf.target.qos_gate import QosGate

S = 1_000_000_000


def state(limits: QosLimits) -> memoryview:
    view = memoryview(bytearray(qos.STATE_BYTES)).cast("q")
    set_rates(view, limits)
    return view


def admitted_in(
    view: memoryview, seconds: float, *, is_read: bool = True, nbytes: int = 4096
) -> int:
    """How many commands, each sent as soon as admitted, go in `seconds` from 0: a clock
    that jumps to each admission time."""
    now, end, n = 0, int(seconds * S), 0
    while True:
        wait = admit(view, is_read, nbytes, now)
        if wait:
            now += wait
            if now >= end:
                return n
        else:
            n += 1


def test_spdk_rounds_iops_up_to_a_multiple_of_1000() -> None:
    assert normalized(QosLimits(rw_ios_per_sec=1500)).rw_ios_per_sec == 2000
    assert normalized(QosLimits(rw_ios_per_sec=1)).rw_ios_per_sec == 1000
    assert normalized(QosLimits(rw_ios_per_sec=4000)).rw_ios_per_sec == 4000
    assert normalized(QosLimits(rw_ios_per_sec=0)).rw_ios_per_sec == 0
    largest = normalized(QosLimits(w_mbytes_per_sec=(1 << 64) - 1))
    assert largest.w_mbytes_per_sec == qos.MAX_MBYTES_PER_SEC
    view = state(largest)  # fits the state's 64-bit integers
    assert admit(view, False, 1 << 30, 0) == 0


def test_a_limit_left_out_keeps_its_value_and_0_removes_one() -> None:
    limits = QosLimits().changed({"rw_ios_per_sec": 2000, "r_mbytes_per_sec": 4})
    assert limits == QosLimits(2000, 0, 4, 0)
    limits = limits.changed({"rw_ios_per_sec": 0})
    assert limits == QosLimits(0, 0, 4, 0) and limits.any
    assert not limits.changed({"r_mbytes_per_sec": 0}).any
    assert limits.as_dict() == dict(zip(qos.LIMIT_NAMES, (0, 0, 4, 0), strict=True))


@pytest.mark.parametrize("iops", [1000, 2000, 4000, 100_000])
def test_iops_over_time_is_the_limit(iops: int) -> None:
    view = state(QosLimits(rw_ios_per_sec=iops))
    n = admitted_in(view, 10.0)
    burst = iops * TOLERANCE_NS // S
    assert 10 * iops <= n <= 10 * iops + burst + 1


def test_bandwidth_over_time_is_the_limit() -> None:
    view = state(QosLimits(rw_mbytes_per_sec=4))
    n = admitted_in(view, 10.0, nbytes=128 << 10)
    assert n * (128 << 10) == pytest.approx(40 * MIB, rel=0.01)


def test_read_and_write_limits_count_their_own_direction() -> None:
    view = state(QosLimits(r_mbytes_per_sec=1, w_mbytes_per_sec=2))
    reads = admitted_in(view, 10.0, is_read=True, nbytes=4096)
    view = state(QosLimits(r_mbytes_per_sec=1, w_mbytes_per_sec=2))
    writes = admitted_in(view, 10.0, is_read=False, nbytes=4096)
    # Ten seconds' worth and the first burst (TOLERANCE_NS of the limit).
    assert reads * 4096 == pytest.approx(10.05 * MIB, rel=0.001)
    assert writes * 4096 == pytest.approx(20.1 * MIB, rel=0.001)
    # A write limit alone never holds a read back.
    view = state(QosLimits(w_mbytes_per_sec=1))
    assert all(admit(view, True, 1 << 20, 0) == 0 for _ in range(100))


def test_a_waiter_woken_late_loses_no_rate_but_makes_up_no_more_than_max_late() -> None:
    """A busy machine wakes the waiting command 80 ms after it was due, every time:
    charged from when it was due, the rate holds; charged from when it woke, a third of
    it is lost. A waiter stopped for a second makes up MAX_LATE_NS of it, no more."""

    def late_run(made_up: bool) -> int:
        view = state(QosLimits(rw_ios_per_sec=1000))
        now, n, due_at = 0, 0, 0
        while now < 10 * S:
            wait = admit(view, True, 4096, now, due_at if made_up else 0)
            if wait:
                due_at = now + wait
                now = due_at + 80_000_000
            else:
                n += 1
        return n

    assert late_run(True) == pytest.approx(10_000, rel=0.01)
    assert late_run(False) < 0.8 * 10_000
    view = state(QosLimits(rw_ios_per_sec=1000))
    now = S
    n = 0
    while not admit(view, True, 4096, now, due_at=1):
        n += 1
    assert n == (qos.MAX_LATE_NS + TOLERANCE_NS) // 1_000_000


def test_a_command_larger_than_the_tolerance_overruns_and_the_next_waits_it_out() -> None:
    view = state(QosLimits(rw_mbytes_per_sec=1))
    assert admit(view, False, 1 * MIB, 0) == 0  # a second's worth, at once
    wait = admit(view, False, 4096, 0)
    assert wait == S - TOLERANCE_NS + 1


def test_a_refused_command_charges_no_limit() -> None:
    # The IOPS limit has room, the bandwidth one has not: neither is charged.
    view = state(QosLimits(rw_ios_per_sec=100_000, rw_mbytes_per_sec=1))
    assert admit(view, True, 1 * MIB, 0) == 0
    before = list(view)
    assert admit(view, True, 4096, 0) > 0
    assert list(view) == before


def test_changing_a_rate_forgets_that_limits_backlog_only() -> None:
    view = state(QosLimits(rw_ios_per_sec=1000, rw_mbytes_per_sec=1))
    while not admit(view, True, 4096, 0):
        pass
    set_rates(view, QosLimits(rw_ios_per_sec=2000, rw_mbytes_per_sec=1))
    assert view[qos.LIMITS + qos.RW_IOS] == 0
    assert view[qos.LIMITS + qos.RW_BYTES] > 0


async def test_gate_admits_waiters_in_order_at_the_rate() -> None:
    gate = QosGate.create(QosLimits(rw_ios_per_sec=1000))
    try:
        order: list[int] = []
        burst = 1000 * TOLERANCE_NS // S
        start = time.monotonic()
        admitted_now = 0
        waits = []
        for i in range(burst + 20):
            if gate.try_admit(True, 4096):
                admitted_now += 1
            else:
                fut = gate.wait(True, 4096)
                fut.add_done_callback(lambda _f, i=i: order.append(i))
                waits.append(fut)
        # A burst of the tolerance's worth at once (a little more if the clock moved on
        # meanwhile); once one waits, every later one queues behind it.
        assert burst <= admitted_now <= burst + 5
        await asyncio.gather(*waits)
        # The rest at 1 ms each: not sooner.
        assert time.monotonic() - start >= (len(waits) - 1) / 1000
        assert order == list(range(admitted_now, burst + 20))
    finally:
        gate.close()


async def test_closing_the_gate_lets_every_waiter_go() -> None:
    gate = QosGate.create(QosLimits(rw_mbytes_per_sec=1))
    assert gate.try_admit(False, 10 * MIB)  # ten seconds' worth
    waits = [gate.wait(False, 4096) for _ in range(5)]
    assert not any(f.done() for f in waits)
    gate.close()
    assert all(f.done() for f in waits)
    assert gate.try_admit(False, 4096)  # closed: unlimited


def test_processes_sharing_the_state_share_the_limit() -> None:
    """Two processes admitting against one state over the same second admit the limit
    between them (the state in a memfd, each admission under the shared semaphore; the
    clock, CLOCK_MONOTONIC, is the same in both)."""
    rate = 20_000
    gate = QosGate.create(QosLimits(rw_ios_per_sec=rate), RangeLocks.create(1))
    code = (
        "import sys, time\n"
        "from pynvmf.target.qos_gate import QosGate\n"
        "gate = QosGate.open(int(sys.argv[1]), sys.argv[2])\n"
        "start, end = float(sys.argv[3]), float(sys.argv[4])\n"
        "time.sleep(max(0.0, start - time.monotonic()))\n"
        "n = 0\n"
        "while time.monotonic() < end:\n"
        "    n += gate.try_admit(True, 4096)\n"
        "print(n)\n"
    )
    start = time.monotonic() + 2.0  # after both interpreters started
    end = start + 1.0
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(gate.fd), gate.lock_name, str(start), str(end)],
                pass_fds=(gate.fd,),
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        counts = [int(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        gate.close()
    assert all(n > 0 for n in counts), counts
    burst = rate * TOLERANCE_NS // S
    assert rate * 0.95 <= sum(counts) <= rate + burst + 1, counts
