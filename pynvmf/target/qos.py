"""Rate limits of a block device (SPDK's bdev QoS): the rules, with no I/O and no clock.

SPDK's `bdev_set_qos_limit` sets four limits on a bdev, shared by every host, queue and
namespace on it: rw_ios_per_sec (Read and Write commands), rw_mbytes_per_sec (their
data), r_mbytes_per_sec (Read data) and w_mbytes_per_sec (Write data); 0 removes a
limit, and a limit left out keeps its value. SPDK counts only Read and Write (and the
reads and writes it emulates Copy or Write Zeroes with on a bdev that cannot do them):
Copy, Write Zeroes, Dataset Management, Flush, Compare and Verify pass unlimited on a
device that does them itself, as pynvmf's devices do (docs/qos.md).

SPDK takes an IOPS limit in multiples of 1,000 (its quota is counted per millisecond)
and rounds any other value up to the next multiple, with an error in its log but not in
the answer; a bandwidth limit is whole MiB/s. `normalized` applies the same rules.

The pacing is the generic cell rate algorithm, as SPDK's timeslices amount to: each
limit keeps one number, the time at which what was admitted so far has been paid for
(`due`, ns). A command is admitted while that time is less than TOLERANCE_NS ahead of
now (a command may overrun what is left, as in SPDK: a command larger than the
tolerance's worth still passes, and the next ones wait it out), and it moves `due` on
by its cost at the limit's rate. The state is eight integers (the four rates and the
four `due` times) in a buffer that may be shared memory: `pynvmf target --cores N`
workers pace against one state (docs/qos.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

# SPDK's limits, in its order (the order of assigned_rate_limits and of the state).
LIMIT_NAMES: Final = ("rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec")
RW_IOS: Final = 0
RW_BYTES: Final = 1
R_BYTES: Final = 2
W_BYTES: Final = 3
LIMITS: Final = 4
# The state: rates (per second: commands, then bytes), then the `due` times (ns).
STATE_LENGTH: Final = 2 * LIMITS
STATE_BYTES: Final = STATE_LENGTH * 8

# SPDK: an IOPS limit is a multiple of this; a bandwidth limit is whole MiB/s.
IOS_PER_SEC_STEP: Final = 1000
MIB: Final = 1 << 20
# SPDK caps a bandwidth limit so that it fits 64 bits in bytes; the state holds signed
# 64-bit integers, so here one bit less (8 EiB/s: no limit in effect, either way).
MAX_MBYTES_PER_SEC: Final = ((1 << 63) - 1) // MIB
# How far ahead of now what was admitted may be paid for: the burst a limit allows. SPDK
# admits one 1 ms timeslice's worth at once, and loses the quota of a timeslice in which
# no command was there to use it; its commands come back from the host within that.
# Here, a host's next command comes back through an event loop, the kernel and the host
# on a machine that may be busy: measured with two spdk_nvme_perf hosts on a loaded
# 2-CPU machine, a 10 ms tolerance delivered 64% of a 2,000 IOPS limit (the commands
# were between target and host, not waiting, when their turn came), 50 ms the limit.
# 50 ms: a burst of at most 5% of a second's limit.
TOLERANCE_NS: Final = 50_000_000
# A command that waited and was woken late is charged from when it was due, up to this
# long ago (admit's `due_at`).
MAX_LATE_NS: Final = 100_000_000
_NS_PER_S: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class QosLimits:
    """A bdev's limits as SPDK's RPC shows them: per second, 0 for none."""

    rw_ios_per_sec: int = 0
    rw_mbytes_per_sec: int = 0
    r_mbytes_per_sec: int = 0
    w_mbytes_per_sec: int = 0

    @property
    def any(self) -> bool:
        return any(self.as_tuple())

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (
            self.rw_ios_per_sec,
            self.rw_mbytes_per_sec,
            self.r_mbytes_per_sec,
            self.w_mbytes_per_sec,
        )

    def as_dict(self) -> dict[str, int]:
        """assigned_rate_limits: every limit, 0 for none."""
        return dict(zip(LIMIT_NAMES, self.as_tuple(), strict=True))

    def rates(self) -> tuple[int, int, int, int]:
        """Per second: commands, then bytes (what the state holds)."""
        ios, rw, r, w = self.as_tuple()
        return ios, rw * MIB, r * MIB, w * MIB

    def changed(self, given: dict[str, int]) -> QosLimits:
        """These limits with `given` ones (SPDK's names) replaced, normalized; the
        others keep their values, as SPDK keeps a limit its call leaves out."""
        values = self.as_dict()
        values.update(given)
        return normalized(QosLimits(**values))


def normalized(limits: QosLimits) -> QosLimits:
    """`limits` as SPDK applies them: IOPS rounded up to a multiple of 1,000, bandwidth
    capped at what 64 bits of bytes per second hold."""
    ios = -(-limits.rw_ios_per_sec // IOS_PER_SEC_STEP) * IOS_PER_SEC_STEP
    mbytes = [min(getattr(limits, f.name), MAX_MBYTES_PER_SEC) for f in fields(limits)[1:]]
    return QosLimits(ios, *mbytes)


def set_rates(state: memoryview, limits: QosLimits) -> None:
    """Write `limits` into `state` (STATE_LENGTH int64s); a limit removed forgets its
    backlog, one added starts with none."""
    for i, rate in enumerate(limits.rates()):
        if rate != state[i]:
            state[i] = rate
            state[LIMITS + i] = 0


def admit(state: memoryview, is_read: bool, nbytes: int, now: int, due_at: int = 0) -> int:
    """Admit one Read (`is_read`) or Write of `nbytes` at `now` (ns, a clock every
    process shares: CLOCK_MONOTONIC): 0, having charged it to every limit it counts
    against; or how many ns from now it may be admitted, having changed nothing.

    `due_at`: when a command that waited was to be admitted (what an earlier call
    said). A waiter woken late by a busy machine is charged from then, not from now,
    so that its lateness costs no rate: what the limit allowed since then was unused
    only because this process was not running, while the command waited. At most
    MAX_LATE_NS is made up (a process stopped for long gets no burst for all of it), and
    never time another process's commands used (their charges moved the limit past it)."""
    since = max(due_at, now - MAX_LATE_NS) if due_at else now
    wait = 0
    for i in range(LIMITS):
        if state[i] and _counts(i, is_read):
            ahead = state[LIMITS + i] - now
            if ahead >= TOLERANCE_NS:
                wait = max(wait, ahead - TOLERANCE_NS + 1)
    if wait:
        return wait
    for i in range(LIMITS):
        rate = state[i]
        if rate and _counts(i, is_read):
            cost = 1 if i == RW_IOS else nbytes
            # Rounded up: the rate is never exceeded by rounding.
            state[LIMITS + i] = max(state[LIMITS + i], since) + -(-cost * _NS_PER_S // rate)
    return 0


def _counts(limit: int, is_read: bool) -> bool:
    """Whether a Read (`is_read`) or Write counts against `limit`."""
    if limit == R_BYTES:
        return is_read
    if limit == W_BYTES:
        return not is_read
    return True
