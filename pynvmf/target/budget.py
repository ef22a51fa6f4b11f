"""What hosts may make the target hold, and for how long: the one place that decides.

Connections are counted here (in all, and per remote address) before a connection gets
anything, and the deadlines for input a host has started and not finished live next to
those counts. The values are the target's policy; docs/limits.md explains each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections import Counter, deque
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A host connects and sends ICReq at once, and Connect right after ICResp: a connection
# not bound to a controller after this long is a stalled or hostile one.
CONNECT_DEADLINE_S = 10.0
# A PDU that has started to arrive must be complete within this long. The Linux host
# gives an I/O 30 s (nvme_core.io_timeout) before it resets the controller, so a PDU
# still incomplete after that is one nobody is waiting for.
PDU_DEADLINE_S = 30.0
# The deadlines are checked this often (one timer for the whole target).
SWEEP_INTERVAL_S = 1.0

# Keep alive: KATO 0 on a controller would mean no host ever has to prove it is alive;
# such controllers (the Linux host's non-persistent discovery controllers use it) get
# this timeout, traffic based, as nvmet gives discovery controllers. Larger values are
# capped at KATO_MAX_MS.
KATO_DEFAULT_MS = 120_000
KATO_MAX_MS = 3_600_000
# Controllers look for traffic every KATO / 8 (at most every 500 ms): a silent host is
# noticed after KATO and before KATO + 2 such intervals (KATO + min(KATO / 4, 1 s)).
KATO_CHECK_SHARE = 8
KATO_CHECK_MAX_MS = 500

# Data buffers one connection may hold at once (read data, R2T buffers, Copy staging):
# enough for 32 commands of MDTS (1 MiB), or 256 of 128 KiB, in flight on one queue.
DEFAULT_CONNECTION_DATA = 32 << 20
# Reads up to this size are not charged: SQSIZE bounds them (1024 entries x 16 KiB = 16 MiB
# per queue at most), and the small reads that make up most I/O skip the accounting.
UNCHARGED_READ = 16 << 10
# A Read larger than this is read and sent in pieces of this size, each charged only
# until the socket has taken it: a command holds about one piece, not MDTS.
READ_CHUNK = 128 << 10
# Above this much data queued for sending and not yet taken by the kernel, a connection
# stops starting commands (and reading the host's) until the host has read some.
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = 256 << 10

# File descriptors kept for files, the RPC socket and listeners beyond connections.
_FD_RESERVE = 256
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 4096


def effective_kato_ms(kato_ms: int) -> int:
    """The keep-alive timeout a controller runs with for the KATO a host asked for."""
    if kato_ms == 0:
        return KATO_DEFAULT_MS
    return min(kato_ms, KATO_MAX_MS)


def keep_alive_check_ms(kato_ms: int) -> int:
    """How often a controller looks for traffic: the slack of its expiry."""
    return max(1, min(kato_ms // KATO_CHECK_SHARE, KATO_CHECK_MAX_MS))


def raise_open_file_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open file limit from %d to %d: %s", soft, hard, exc)
    return soft


def default_max_connections() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, soft - _FD_RESERVE)


@dataclass
class ConnectionLimits:
    max_connections: int = 0  # 0: derived from the open file limit when the target starts
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    connect_deadline_s: float = CONNECT_DEADLINE_S
    pdu_deadline_s: float = PDU_DEADLINE_S
    max_memory: int = 0  # data buffers in all; 0: half of the machine's memory
    connection_data: int = DEFAULT_CONNECTION_DATA  # data buffers of one connection


class ConnectionBudget:
    """Counts the target's connections, in all and per remote address."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_address: Counter[str] = Counter()
        self.refused = 0

    @property
    def max_connections(self) -> int:
        return self.limits.max_connections or default_max_connections()

    def admit(self, address: str) -> bool:
        """Count a new connection from `address`; False (logged) if a limit forbids it."""
        if self.total >= self.max_connections:
            self._refuse(address, f"the target has {self.total} connections, its limit")
            return False
        if self.per_address[address] >= self.limits.max_connections_per_address:
            count = self.per_address[address]
            self._refuse(address, f"{address} has {count} connections, the per-address limit")
            return False
        self.total += 1
        self.per_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.total -= 1
        self.per_address[address] -= 1
        if not self.per_address[address]:
            del self.per_address[address]

    def _refuse(self, address: str, why: str) -> None:
        self.refused += 1
        log.warning("connection from %s refused: %s", address, why)


# -- memory ------------------------------------------------------------------------------


def default_max_memory() -> int:
    """Half of the machine's memory: what the target's data buffers may use in all."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 << 30
    return max(256 << 20, pages * page // 2)


# Once the data buffers in use fall below a quarter of their peak, and the peak was more
# than this above them, the freed memory goes back to the kernel (malloc.trim): the
# malloc tuning keeps freed buffers for reuse, which must not mean keeping a burst's peak
# for ever.
TRIM_AFTER = 32 << 20


class MemoryPool:
    """The target's data buffers in all (`--max-memory`). Connections take from it
    through their own budgets; a connection whose next request does not fit here waits in
    line, and is served as others give back."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        # Requests that could not be granted at once and waited (DataBudget.take).
        self.waits = 0
        self._waiting: deque[DataBudget] = deque()

    def fits(self, n: int) -> bool:
        # A request larger than the whole pool is granted once nothing else is held, so
        # that nothing waits for ever.
        return self.used + n <= self.capacity or self.used == 0

    def charge(self, n: int) -> None:
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def give(self, n: int) -> None:
        self.used -= n
        self.serve_waiting()

    def serve_waiting(self) -> None:
        while self._waiting and self._waiting[0].serve():
            self._waiting.popleft()

    def should_trim(self) -> bool:
        """True (and the peak starts again from now) when memory is worth giving back."""
        if self.peak - self.used > TRIM_AFTER and self.used < self.peak // 4:
            self.peak = self.used
            return True
        return False

    def enlist(self, budget: DataBudget) -> None:
        if budget not in self._waiting:
            self._waiting.append(budget)

    def withdraw(self, budget: DataBudget) -> None:
        if budget in self._waiting:
            self._waiting.remove(budget)


class DataBudget:
    """The data buffers one connection holds: at most `capacity` bytes (and what the pool
    has), granted in the order asked; a request that does not fit waits holding nothing."""

    def __init__(self, pool: MemoryPool, capacity: int = DEFAULT_CONNECTION_DATA) -> None:
        self.pool = pool
        self.capacity = capacity
        self.used = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.closed = False

    def _fits(self, n: int) -> bool:
        return self.used + n <= self.capacity or self.used == 0

    def try_take(self, n: int) -> bool:
        """Take `n` bytes at once if they fit and nobody is waiting (the hot path: every
        Read comes here, so the checks are inline)."""
        used = self.used + n
        pool = self.pool
        pool_used = pool.used + n
        if (
            (used > self.capacity and self.used)
            or (pool_used > pool.capacity and pool.used)
            or self._queue
            or self.closed
        ):
            return False
        self.used = used
        pool.used = pool_used
        if pool_used > pool.peak:
            pool.peak = pool_used
        return True

    async def take(self, n: int) -> None:
        """Take `n` bytes, waiting until they fit."""
        if self.try_take(n):
            return
        if self.closed:
            raise ConnectionError("the connection is closed")
        self.pool.waits += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((n, fut))
        self.serve()
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.give(n)  # granted as the waiter was cancelled: hand it back
            raise
        finally:
            del fut  # a cancelled future's traceback would hold this frame

    def give(self, n: int) -> None:
        self.used -= n
        pool = self.pool
        pool.used -= n
        if pool._waiting:
            pool.serve_waiting()
        if self._queue:
            self.serve()

    def serve(self) -> bool:
        """Grant what now fits, in order; True once nobody here waits for the pool."""
        if self.closed:
            return True
        queue = self._queue
        while queue:
            n, fut = queue[0]
            if fut.done():  # cancelled
                queue.popleft()
                continue
            if not self._fits(n):
                break
            if not self.pool.fits(n):
                self.pool.enlist(self)
                return False
            queue.popleft()
            self.used += n
            self.pool.charge(n)
            fut.set_result(None)
        return True

    def close(self) -> None:
        """The connection is gone: its waiters will never be served, and it asks no more."""
        self.closed = True
        self.pool.withdraw(self)
        for _n, fut in self._queue:
            if not fut.done():
                fut.cancel()
        self._queue.clear()
