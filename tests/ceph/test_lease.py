"""ANA group ownership through RADOS leases (pynvmf.ha.lease): two lease holders in two
processes (tests/ceph/lease_process.py) against the test cluster."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ceph_cluster import CephCluster

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3  # seconds: renewals every second, an owner's margin 1 s (LeaseConfig defaults)

Event = dict[str, Any]


class Holder:
    """One lease_process.py; its events arrive on a queue (a reader thread), so waiting
    for one is a blocking get, not a poll."""

    def __init__(self, cluster: CephCluster, gateway: str, *args: str) -> None:
        self.gateway = gateway
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.ceph.lease_process",
                "--conf",
                str(cluster.conf),
                "--gateway",
                gateway,
                "--lease",
                str(LEASE),
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.address = self.wait("start")["address"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(json.loads(line))
        self._queue.put(None)

    def wait(self, event: str, timeout: float = 30.0, **match: Any) -> Event:
        """The next event named `event` (with `match`'s fields); earlier ones are kept."""
        for e in self.events:
            if e.get("_seen") is None and e["event"] == event and _matches(e, match):
                e["_seen"] = True
                return e
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.gateway}: no {event} {match} in {timeout} s")
            try:
                e = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if e is None:
                raise AssertionError(f"{self.gateway} exited waiting for {event}: {self.events}")
            self.events.append(e)
            if e["event"] == event and _matches(e, match):
                e["_seen"] = True
                return e

    def drain(self) -> list[Event]:
        while True:
            try:
                e = self._queue.get_nowait()
            except queue.Empty:
                return self.events
            if e is None:
                return self.events
            self.events.append(e)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


def _matches(e: Event, match: dict[str, Any]) -> bool:
    return all(e.get(k) == v for k, v in match.items())


@pytest.fixture
def holders(ceph_cluster: CephCluster) -> Iterator[Callable[..., Holder]]:
    made: list[Holder] = []

    def start(gateway: str, *args: str) -> Holder:
        h = Holder(ceph_cluster, gateway, *args)
        made.append(h)
        return h

    yield start
    for h in made:
        h.stop()


_pools = iter(range(1, 1000))


def _groups() -> str:
    """Group ids of their own for each test: the lock objects outlive a test."""
    return str(next(_pools) * 10 + 1)


def _blocklisted(cluster: CephCluster) -> str:
    return cluster.mon_command({"prefix": "osd blocklist ls", "format": "json"})


def test_takeover_after_the_owner_is_killed(
    ceph_cluster: CephCluster, holders: Callable[..., Holder]
) -> None:
    g = _groups()
    a = holders("A", "--groups", g, "--preferred", g)
    a.wait("owned", group=int(g))
    standby = holders("B", "--groups", g)  # a standby: A is owner
    a.signal(signal.SIGKILL)
    killed = time.monotonic()
    taken = standby.wait("owned", group=int(g), timeout=4 * LEASE)
    takeover = taken["t"] - killed

    # The lease had to run out (one lease after A's last renewal, up to a renewal
    # interval before the kill), B's next attempt to come, then B fenced A.
    assert 0 < takeover < 3 * LEASE, takeover
    assert a.address.split("/")[0] in _blocklisted(ceph_cluster) or a.address in _blocklisted(
        ceph_cluster
    )
    print(f"takeover {takeover:.2f} s after SIGKILL (lease {LEASE} s)")


def test_a_frozen_owner_is_fenced_and_its_writes_fail(
    ceph_cluster: CephCluster,
    holders: Callable[..., Holder],
    rbd_image: Callable[[int], str],
) -> None:
    """A frozen owner (SIGSTOP, as a hung gateway) loses the group; when it wakes, its
    next writes fail (its client is blocklisted) and never overwrite the new owner's."""
    import rbd

    image = rbd_image(1 << 20)
    g = _groups()
    a = holders("A", "--groups", g, "--preferred", g, "--image", image)
    a.wait("owned", group=int(g))
    a.wait("write")
    b = holders("B", "--groups", g, "--image", image, "--no-failback")
    a.signal(signal.SIGSTOP)
    b.wait("owned", group=int(g), timeout=4 * LEASE)
    b.wait("write")
    a.signal(signal.SIGCONT)
    lost = a.wait("lost", group=int(g))
    # Whatever A still tried (it may have had a write queued when it froze) failed.
    writes_after = [e for e in a.drain() if e["event"] == "write" and e["t"] > lost["t"]]
    assert writes_after == []
    b_last = b.wait("write")
    with ceph_cluster.admin().open_ioctx("rbd") as io, rbd.Image(io, image) as img:
        block = json.loads(img.read(0, 512).rstrip())
    assert block["gateway"] == "B" and block["seq"] >= b_last["seq"]
    failed = [e for e in a.drain() if e["event"] == "write_failed"]
    # It woke up past its deadline: it did not even try, or it tried and was refused.
    assert all(e["errno"] == 108 for e in failed), failed


def test_delayed_renewal_never_gives_two_owners(
    ceph_cluster: CephCluster, holders: Callable[..., Holder]
) -> None:
    """A's renewals start taking 2 leases (a slow cluster path) while A runs on, and A
    waits for a RADOS call up to 3 leases: A still stops owning at its own deadline,
    not when the call gives up, and so before B can take the lock. The two ownerships
    never overlap on the machine's one monotonic clock."""
    g = _groups()
    a = holders(
        "A",
        "--groups",
        g,
        "--preferred",
        g,
        "--delay-renewals-after",
        "3",
        "--delay",
        str(2 * LEASE),
        "--call-timeout",
        str(3 * LEASE),
    )
    owned_a = a.wait("owned", group=int(g))
    b = holders("B", "--groups", g, "--no-failback")
    owned_b = b.wait("owned", group=int(g), timeout=5 * LEASE)
    lost_a = a.wait("lost", group=int(g))
    assert owned_a["t"] < lost_a["t"] < owned_b["t"], (owned_a, lost_a, owned_b)
    gap = owned_b["t"] - lost_a["t"]
    print(f"A lost at +{lost_a['t'] - owned_a['t']:.2f} s, B owned {gap:.2f} s later")


def test_failback_to_the_preferred_gateway(
    ceph_cluster: CephCluster, holders: Callable[..., Holder]
) -> None:
    """B serves A's group while A is away; when A comes back, B hands it over cleanly
    (B loses it before A owns it, and nobody is fenced)."""
    g = _groups()
    b = holders("B", "--groups", g)
    owned_b = b.wait("owned", group=int(g), timeout=4 * LEASE)
    before = _blocklisted(ceph_cluster)
    a = holders("A", "--groups", g, "--preferred", g)
    owned_a = a.wait("owned", group=int(g), timeout=4 * LEASE)
    lost_b = b.wait("lost", group=int(g))
    assert owned_b["t"] < lost_b["t"] < owned_a["t"]
    assert b.address not in _blocklisted(ceph_cluster) or b.address in before
