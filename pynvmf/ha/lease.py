"""Ownership of ANA groups across gateways: a RADOS exclusive lock with a lease, and
fencing of the previous owner before a new one serves.

Debian's Ceph 16 has no NVMe-oF gateway monitor (NVMeofGwMon came with Ceph 19), so
gateways settle among themselves through RADOS, the one thing they all share. Each ANA
group has an object, ``pynvmf.ana_group.<id>`` in the pool; its owner holds an
exclusive lock on it with a duration (the lease) and renews it every
`renew_interval`. The OSD lets another client take the lock only once the lease has
run out without a renewal.

A standby tries to take the lock of every group it may serve; when it succeeds (the
owner's lease expired: the owner died, hung, or lost the cluster), before it calls
itself owner it

1. reads the previous owner's record (an xattr ``owner`` of the object: its gateway id
   and its RADOS client addresses) and, unless that owner released the group cleanly,
   **blocklists** those addresses (``osd blocklist add``: a fenced client's requests,
   including any still in flight, are refused by every OSD);
2. waits for the latest OSD map (``wait_for_latest_osdmap``), so that the blocklist is
   in force on this client's side too;
3. writes its own record and then calls ``on_change(group_id, True)``.

An owner stops owning, and calls ``on_change(group_id, False)`` at once, when a
renewal fails (EBUSY: someone else holds the lock; ESHUTDOWN: this client is
blocklisted; any other error), and also when a renewal has not *succeeded* by its
deadline: ``deadline = send time of the last successful renewal + lease - margin``.
The OSD counts the lease from when it processed that renewal, which is later than
when the owner sent it, so the owner's deadline passes before any standby can take
the lock (clocks tick at the same rate; `margin` covers the difference). Together:
two owners of one group never overlap, even when a renewal is delayed, and an owner
frozen past its deadline (SIGSTOP, a long pause) cannot write when it wakes: it has
been blocklisted.

A gateway that was blocklisted cannot use its RADOS client again: its RBD devices
are FENCED (pynvmf.block.rbd) and the manager connects a new client to go on as a
standby; the devices must be reopened (a restart of the gateway does both).

Failback: with ``preferred`` groups and ``failback=True``, a gateway that comes back
asks the current owner for its preferred group (an xattr ``failback``); the owner
gives it up cleanly at its next renewal (``on_change(group, False)``, its record
cleared, the lock released), and the preferred gateway takes it without fencing
anyone. Without failback, a group stays where it is until its owner goes away. At
start, a gateway leaves the groups it does not prefer to their preferred gateway for
one lease before competing for them.

The callback interface is all an ANA layer needs::

    def on_change(group_id: int, owned: bool) -> None: ...
        # owned: make this gateway's listeners optimized for the group (and send the
        # ANA change AEN); not owned: inaccessible.

It is called on the event loop's thread, in order, and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pynvmf.block.rbd import ClusterSpec, RadosConnection, bindings

log = logging.getLogger(__name__)

LOCK_NAME = "pynvmf-ana-owner"
OBJECT_PREFIX = "pynvmf.ana_group."
OWNER_XATTR = "owner"
FAILBACK_XATTR = "failback"
_LOCK_FLAG_MAY_RENEW = 1  # LIBRADOS_LOCK_FLAG_MAY_RENEW

OnChange = Callable[[int, bool], None]


@dataclass
class _Group:
    gid: int
    owned: bool = False
    deadline: float = 0.0  # monotonic: owned only before this
    timer: asyncio.TimerHandle | None = None  # ends the ownership at the deadline
    pending: asyncio.Future[Any] | None = None  # a lock call still running in its thread
    asked_failback: bool = False


@dataclass
class LeaseConfig:
    lease_seconds: int = 10  # the lock's duration (RADOS takes whole seconds)
    renew_interval: float = 0.0  # 0: a third of the lease
    margin: float = 0.0  # 0: a fifth of the lease, at least 0.5 s
    failback: bool = True
    call_timeout: float = 0.0  # 0: the lease (a RADOS call that takes longer failed)

    def __post_init__(self) -> None:
        if self.lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        if not self.renew_interval:
            self.renew_interval = self.lease_seconds / 3
        if not self.margin:
            self.margin = max(0.5, self.lease_seconds / 5)
        if not self.call_timeout:
            self.call_timeout = float(self.lease_seconds)
        if self.renew_interval + self.margin >= self.lease_seconds:
            raise ValueError("renew_interval + margin must be shorter than the lease")


@dataclass
class LeaseManager:
    """Owns (or stands by for) `groups` in `pool` as gateway `gateway_id`.

    `await start()` begins; `await stop()` releases what it owns (cleanly: no one is
    fenced) and stops. `owns(group)` is the current answer, deadline included."""

    spec: ClusterSpec
    pool: str
    gateway_id: str
    groups: Iterable[int]
    on_change: OnChange
    preferred: Iterable[int] = ()
    config: LeaseConfig = field(default_factory=LeaseConfig)

    def __post_init__(self) -> None:
        self._groups = {int(g): _Group(int(g)) for g in self.groups}
        self._preferred = {int(g) for g in self.preferred}
        unknown = self._preferred - set(self._groups)
        if unknown:
            raise ValueError(f"preferred groups {sorted(unknown)} are not among the groups")
        self._cookie = ""
        self._conn: RadosConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._wake = asyncio.Event()

    # -- public -------------------------------------------------------------------------------

    def owns(self, group: int) -> bool:
        g = self._groups[group]
        return g.owned and time.monotonic() < g.deadline

    @property
    def owned_groups(self) -> list[int]:
        return sorted(gid for gid in self._groups if self.owns(gid))

    @property
    def address(self) -> str:
        """This gateway's RADOS client address (what a takeover blocklists)."""
        return self._conn.address if self._conn is not None else ""

    async def start(self) -> None:
        await self._connect()
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"lease-{self.gateway_id}")

    async def stop(self) -> None:
        """Give up every owned group cleanly (record cleared, lock released), then stop."""
        for g in self._groups.values():
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for g in self._groups.values():
            if g.owned:
                await self._release(g)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.to_thread(conn.release)

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self.config
        while True:
            for g in self._groups.values():
                if g.pending is not None:
                    continue  # a call still hangs in its thread: one at a time per group
                if g.owned:
                    await self._renew(g)
                elif self._may_compete(g):
                    await self._try_take(g)
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
            # (stop()) that arrives as the event is set, and stop() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(cfg.renew_interval):
                    await self._wake.wait()
            self._wake.clear()

    def _may_compete(self, g: _Group) -> bool:
        if g.gid in self._preferred:
            return True
        # Leave a group to its preferred gateway (if any) for the first lease after start.
        return time.monotonic() - self._started > self.config.lease_seconds

    def _own_until(self, g: _Group, deadline: float) -> None:
        """Owned until `deadline`: a timer of its own ends it then, whatever the loop is
        awaiting (a renewal that hangs in its thread must not hold the loss back)."""
        g.deadline = deadline
        if g.timer is not None:
            g.timer.cancel()
        delay = max(0.0, deadline - time.monotonic())
        g.timer = asyncio.get_running_loop().call_later(delay, self._deadline_passed, g)

    def _deadline_passed(self, g: _Group) -> None:
        g.timer = None
        if g.owned:
            log.warning("group %d: lease not renewed by its deadline", g.gid)
            self._lose(g)

    def _lose(self, g: _Group) -> None:
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        if not g.owned:
            return
        g.owned = False
        g.deadline = 0.0
        self._notify(g.gid, False)

    def _notify(self, gid: int, owned: bool) -> None:
        log.info("gateway %s: group %d %s", self.gateway_id, gid, "owned" if owned else "lost")
        try:
            self.on_change(gid, owned)
        except Exception:
            log.exception("on_change(%d, %s) failed", gid, owned)

    # -- RADOS calls (blocking: in threads, bounded by call_timeout) --------------------------

    async def _call(self, g: _Group | None, fn: Callable[[], Any]) -> Any:
        """fn() in a thread. A call that overruns `call_timeout` counts as failed
        (TimeoutError); its thread is remembered in `g.pending` until it ends, so that no
        second call on the group piles up behind it."""
        fut = asyncio.ensure_future(asyncio.to_thread(fn))
        overran = False
        if g is not None:
            g.pending = fut

            def clear(_f: asyncio.Future[Any], g: _Group = g) -> None:
                if g.pending is _f:
                    g.pending = None
                    # Only a call given up on wakes the loop early (its group may go on);
                    # waking after every call made the owner renew back to back.
                    if overran:
                        self._wake.set()

            fut.add_done_callback(clear)
        done, _ = await asyncio.wait([fut], timeout=self.config.call_timeout)
        if not done:
            overran = True
            raise TimeoutError("RADOS call did not complete in time")
        return fut.result()

    def _ioctx(self) -> Any:
        assert self._conn is not None
        return self._conn.ioctx(self.pool)

    def _lock(self, g: _Group) -> Any:
        """Take or renew the group's lock: MAY_RENEW, so that a lock this client still
        holds (a takeover that ran past its deadline) is renewed, not refused (EEXIST);
        another holder's live lease is EBUSY either way."""
        io = self._ioctx()
        cfg = self.config
        return lambda: io.lock_exclusive(
            OBJECT_PREFIX + str(g.gid),
            LOCK_NAME,
            self._cookie,
            desc=f"pynvmf gateway {self.gateway_id}",
            duration=cfg.lease_seconds,
            flags=_LOCK_FLAG_MAY_RENEW,
        )

    async def _renew(self, g: _Group) -> None:
        sent = time.monotonic()
        try:
            await self._call(g, self._renew_hook(self._lock(g)))
        except Exception as exc:
            log.warning("group %d: renewal failed: %s", g.gid, exc)
            self._lose(g)
            await self._after_failure(exc)
            return
        if not g.owned:
            # It succeeded after the deadline had ended the ownership: the OSD now holds
            # the lock for a gateway that serves nothing (MAY_RENEW takes a lock that ran
            # out). Let it go at once, or a standby could take over only in the moments
            # between the lease running out and a late renewal. The owner record stays:
            # the next owner still fences this gateway.
            io = self._ioctx()
            obj = OBJECT_PREFIX + str(g.gid)
            with contextlib.suppress(Exception):
                await self._call(None, lambda: io.unlock(obj, LOCK_NAME, self._cookie))
            return
        self._own_until(g, sent + self.config.lease_seconds - self.config.margin)
        if self.config.failback and g.gid not in self._preferred:
            await self._maybe_hand_back(g)

    def _renew_hook(self, call: Callable[[], Any]) -> Callable[[], Any]:
        """The renewal call; tests wrap it to delay renewals."""
        return call

    async def _maybe_hand_back(self, g: _Group) -> None:
        io = self._ioctx()
        obj = OBJECT_PREFIX + str(g.gid)
        try:
            wanted = await self._call(None, lambda: _xattr(io, obj, FAILBACK_XATTR))
        except Exception:
            return
        if wanted and wanted != self.gateway_id:
            log.info("group %d: handing back to its preferred gateway %s", g.gid, wanted)
            await self._release(g)

    async def _release(self, g: _Group) -> None:
        """Give the group up cleanly: not owned first, then the record, then the lock."""
        self._lose(g)
        io = self._ioctx() if self._conn is not None else None
        if io is None:
            return
        obj = OBJECT_PREFIX + str(g.gid)
        with contextlib.suppress(Exception):
            await self._call(None, lambda: io.set_xattr(obj, OWNER_XATTR, b""))
            await self._call(None, lambda: io.unlock(obj, LOCK_NAME, self._cookie))

    async def _try_take(self, g: _Group) -> None:
        rados, _ = bindings()
        io = self._ioctx()
        obj = OBJECT_PREFIX + str(g.gid)
        if self.config.failback and g.gid in self._preferred and not g.asked_failback:
            with contextlib.suppress(Exception):
                await self._call(
                    None, lambda: io.set_xattr(obj, FAILBACK_XATTR, self.gateway_id.encode())
                )
                g.asked_failback = True
        sent = time.monotonic()
        try:
            await self._call(g, self._lock(g))
        except rados.ObjectBusy:
            return  # owned by a live lease
        except Exception as exc:
            log.warning("group %d: taking the lock failed: %s", g.gid, exc)
            await self._after_failure(exc)
            return
        # The lock is ours: fence whoever held it before, unless it let go cleanly.
        try:
            previous = await self._call(None, lambda: _xattr(io, obj, OWNER_XATTR))
            record = json.loads(previous) if previous else None
            if record and record.get("cookie") != self._cookie:
                for addr in record.get("addrs", []):
                    await self._call(None, lambda addr=addr: self._blocklist(addr))
                log.warning(
                    "group %d: fenced gateway %s (%s)",
                    g.gid,
                    record.get("gateway"),
                    ", ".join(record.get("addrs", [])),
                )
            assert self._conn is not None
            await self._call(None, self._conn.cluster.wait_for_latest_osdmap)
            mine = json.dumps(
                {"gateway": self.gateway_id, "cookie": self._cookie, "addrs": [self.address]}
            ).encode()
            await self._call(None, lambda: io.set_xattr(obj, OWNER_XATTR, mine))
            wanted = await self._call(None, lambda: _xattr(io, obj, FAILBACK_XATTR))
            if g.asked_failback or wanted == self.gateway_id:
                await self._call(None, lambda: io.set_xattr(obj, FAILBACK_XATTR, b""))
                g.asked_failback = False
        except Exception as exc:
            # Not fenced, so not ours to serve: let the lock go and try again later.
            log.error("group %d: taking over failed: %s", g.gid, exc)
            with contextlib.suppress(Exception):
                await self._call(None, lambda: io.unlock(obj, LOCK_NAME, self._cookie))
            await self._after_failure(exc)
            return
        deadline = sent + self.config.lease_seconds - self.config.margin
        if time.monotonic() >= deadline:
            return  # fencing took the whole lease: the lock may be gone; try again
        g.owned = True
        self._own_until(g, deadline)
        self._notify(g.gid, True)

    def _blocklist(self, addr: str) -> None:
        assert self._conn is not None
        cmd = {"prefix": "osd blocklist", "blocklistop": "add", "addr": addr}
        ret, _out, err = self._conn.cluster.mon_command(json.dumps(cmd), b"")
        if ret != 0:
            raise OSError(-ret, f"osd blocklist add {addr}: {err}")

    async def _after_failure(self, exc: Exception) -> None:
        """After ESHUTDOWN this client is blocklisted for good: lose every group and
        connect a new client, to go on as a standby."""
        if getattr(exc, "errno", None) not in (errno.ESHUTDOWN, -errno.ESHUTDOWN):
            return
        log.error("gateway %s: this RADOS client is blocklisted", self.gateway_id)
        for g in self._groups.values():
            self._lose(g)
        if self._conn is not None:
            self._conn.mark_fenced()  # the gateway's RBD devices on this client too
            conn, self._conn = self._conn, None
            await asyncio.to_thread(conn.release)
        await self._connect()

    async def _connect(self) -> None:
        # A new cookie with every client: a lock taken by a fenced client is not ours.
        self._cookie = uuid.uuid4().hex
        self._conn = await asyncio.to_thread(RadosConnection.get, self.spec)


def _xattr(io: Any, obj: str, name: str) -> str:
    rados, _ = bindings()
    try:
        return bytes(io.get_xattr(obj, name)).decode()
    except (rados.ObjectNotFound, rados.NoData):
        return ""
