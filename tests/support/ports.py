"""Free TCP ports on 127.0.0.1 for test servers, targets and guests' hostfwd."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_tcp_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (for hostfwd and test servers).

    Chosen below the kernel's ephemeral range: a port the kernel hands out for bind(0) is
    also what it gives outgoing connections, so one picked that way can be taken by a
    client socket (a Ceph client opens many) before the test server binds it. Each port
    is handed out once per process."""
    low, _high = _ephemeral_range()
    first = max(1024, low - 12000)
    for _ in range(1000):
        port = random.randrange(first, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
