"""What hosts may make the target hold, and for how long: the one place that decides.

Connections are counted here (in all, and per remote address) before a connection gets
anything, and the deadlines for input a host has started and not finished live next to
those counts. The values are the target's policy; docs/limits.md explains each.
"""

from __future__ import annotations

import logging
import resource
from collections import Counter
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
