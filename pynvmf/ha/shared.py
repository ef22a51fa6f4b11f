"""The gateway group's shared configuration: omap keys of one RADOS object in the pool.

Every gateway of a group serves the same subsystems. Rather than operators keeping
each gateway's file in agreement by hand, the gateways keep the subsystems in one
RADOS object (`pynvmf.gateway-group.<group>` by default) as omap keys, one per thing
that changes on its own, with pynvmf's own configuration format as JSON values:

    subsystem <nqn>                    the subsystem's settings (serial, model,
                                       allow_any_host, ...: no hosts, no namespaces)
    namespace <nqn> <nsid>             one namespace (RBD inline, UUID/NGUID/EUI-64,
                                       its ANA group, auto_visible)
    namespace_host <nqn> <nsid> <hostnqn>   a namespace without auto_visible is
                                       attached to that host (nvmf_ns_add_host)
    host <nqn> <hostnqn>               one allowed host (keys by keyring name)
    listener <gateway> <nqn> <addr> <port>   where gateway <gateway> serves <nqn>
    version                            a counter, bumped by every write

(NQNs hold no spaces, so a space separates a key's fields.) What only one gateway
decides stays out: its controller ID range and ANA states (pynvmf.ha.gateway), its
ports (its file; each gateway records its own listeners so that every gateway's
discovery log lists the others' as peer listeners) and its discovery referrals (a
referral points this gateway's hosts elsewhere, most often to the other gateways: the
same list on every gateway would point each at itself; the other gateways' paths are
in every discovery log already, as peer listeners, which is how ceph-nvmeof's
discovery service lists them too).

A namespace's ANA group is part of its key, and a change of that alone is applied in
place (nvmf_subsystem_set_ns_ana_group), as ceph-nvmeof's state update does: the
namespace is not removed and added again, so its hosts keep their I/O and
reservations. The hosts a namespace is attached to are keys of their own, so that two
gateways attaching two hosts at once both keep theirs; each is applied with
nvmf_ns_add_host / nvmf_ns_remove_host, so that on every gateway only that host's
controllers are told. (A namespace key with a "hosts" list, as gateways wrote them
before the namespace_host keys, is read as those keys and written back as them.)

One key per namespace and host, and a write that changes only the keys that changed
here, is what lets two gateways change the same subsystem at once without losing
either change: every write is one RADOS write operation that compares `version` with
the one this gateway read (`omap_cmp`), sets and removes its keys and bumps it; a
gateway that lost the race reads again, applies what the other one changed, and
writes its own change again. A key both changed is the later writer's.

Keeping a running target and the object in step is a three-way comparison per key:
`_known` is what the object held when this gateway last read it, `_synced` what this
gateway's own target serialised to at that time. A key whose local serialisation
differs from `_synced` was changed here (through the RPC, on any path into the
Target): it is written. A key whose object value differs from `_known` was changed
elsewhere: it is applied to the target through its change methods (the Target
decides what that means for connected hosts; pynvmf.ha.gateway gives new namespaces
their ANA state). A key that cannot be applied (invalid JSON, an unknown key, an
image that does not exist) is logged with its name and left: the gateway goes on
serving what it runs, and does not write the key back either.

Changes are learned three ways: the Target's change listener (this gateway), a RADOS
watch on the object (another gateway notifies after each write), and a poll of the
version every `poll_interval` seconds in case a watch was lost.

At start, the first gateway finds the object empty and seeds it from its file's
subsystems; a later one finds it populated and serves what it holds: a subsystem of
its file that the object lacks or describes otherwise is removed (logged, key by
key) before the object's is added, while no host is connected yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynvmf.block.rbd import ClusterSpec, RadosConnection, bindings, weakly
from pynvmf.config.native import (
    ConfigError,
    Reader,
    add_namespace_spec,
    add_subsystem_spec,
    device_spec_of,
    host_of_spec,
    subsystem_spec_of,
)
from pynvmf.target import devices as D
from pynvmf.target.ana import DEFAULT_GROUP
from pynvmf.target.changes import ChangeError
from pynvmf.target.target import Target

log = logging.getLogger(__name__)

OBJECT_PREFIX = "pynvmf.gateway-group."
VERSION_KEY = "version"
SHARED_CONFIG_KEYS = {"group", "object", "poll_interval"}
# What subsystem_spec_of writes that is one gateway's own, not the group's.
_LOCAL_SUBSYSTEM_KEYS = ("hosts", "namespaces", "ana_groups", "peer_listeners")
_GATEWAY_SUBSYSTEM_KEYS = ("cntlid_min", "cntlid_max")
# Settings of a subsystem a change of which the Target can apply while it runs.
_RUNTIME_SUBSYSTEM_KEYS = {"allow_any_host"}
_UNSPECIFIED = {"0.0.0.0", "::", ""}
_ORDER = {"subsystem": 0, "namespace": 1, "namespace_host": 2, "host": 3, "listener": 4}
_FIELDS = {"subsystem": 1, "namespace": 2, "namespace_host": 3, "host": 2, "listener": 4}
_PAGE = 1000  # omap entries per read (the OSD caps one read's entries)


@dataclass
class SharedConfigOptions:
    """The gateway section's "shared_config": {"group": NAME} or {"object": OBJECT}."""

    object_name: str
    poll_interval: float = 10.0

    @classmethod
    def parse(cls, spec: Any, where: str) -> SharedConfigOptions:
        r = Reader(spec, where, SHARED_CONFIG_KEYS)
        group = r.get("group", str)
        obj = r.get("object", str)
        if (group is None) == (obj is None):
            raise ConfigError(f"{where}: name a gateway group ('group') or an object ('object')")
        name = obj if obj is not None else OBJECT_PREFIX + group
        if not name or (group is not None and not group):
            raise ConfigError(f"{where}: an empty name")
        poll = r.get("poll_interval", (int, float), 10.0)
        if not 0 < poll <= 3600:
            raise ConfigError(f"{r.path('poll_interval')}: {poll!r} is not 0 < seconds <= 3600")
        return cls(object_name=name, poll_interval=float(poll))


def _dump(value: Any) -> str:
    # One spelling per value: keys compare as strings.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _fields(key: str) -> tuple[str, list[str]]:
    """A key's kind and fields, or ConfigError for a key this version does not know."""
    kind, _, rest = key.partition(" ")
    words = rest.split(" ")
    wanted = _FIELDS.get(kind)
    if wanted is None or len(words) != wanted or not all(words):
        raise ConfigError(f"{key!r}: unknown key")
    return kind, words


def _nqn_of(key: str) -> str | None:
    try:
        kind, words = _fields(key)
    except ConfigError:
        return None
    return words[1] if kind == "listener" else words[0]


def shared_keys(target: Target, gateway_id: str) -> dict[str, str]:
    """The running target as the group object's keys (without `version`)."""
    out: dict[str, str] = {}
    for nqn, subsystem in target.subsystems.items():
        if subsystem.is_discovery:
            continue
        try:
            spec = subsystem_spec_of(target, subsystem)
        except ConfigError as exc:  # a device that cannot be described
            log.error("shared configuration: %s cannot be shared: %s", nqn, exc)
            continue
        hosts = spec.get("hosts", [])
        namespaces = spec.get("namespaces", [])
        for key in _LOCAL_SUBSYSTEM_KEYS + _GATEWAY_SUBSYSTEM_KEYS:
            spec.pop(key, None)
        spec.pop("nqn", None)
        spec["allow_any_host"] = subsystem.allow_any_host  # its default needs the hosts
        out[f"subsystem {nqn}"] = _dump(spec)
        for ns in namespaces:
            entry = target.block_devices.get(ns.get("device", ""))
            if entry is not None and entry.kind == D.RBD:
                # A bdev of this gateway's (bdev_rbd_create): the others open the image
                # themselves, so the key describes it.
                del ns["device"]
                ns.update(device_spec_of(entry, with_name=False))
                # Rate limits are each gateway's own (bdev_set_qos_limit on it): a change
                # of them is no change of the namespace the others serve.
                ns.pop("qos", None)
            for hostnqn in ns.pop("hosts", []):
                out[f"namespace_host {nqn} {ns['nsid']} {hostnqn}"] = _dump({})
            out[f"namespace {nqn} {ns['nsid']}"] = _dump(ns)
        for host in hosts:
            hostnqn = host if isinstance(host, str) else host["nqn"]
            out[f"host {nqn} {hostnqn}"] = _dump(host)
        for port in target.ports:
            address = port.advertise or port.address
            if not port.exposes(nqn) or port.discovery_only:
                continue
            if address in _UNSPECIFIED or not port.port:
                continue  # no address another gateway's hosts could use (yet)
            out[f"listener {gateway_id} {nqn} {address} {port.port}"] = _dump(
                {"address": address, "port": port.port}
            )
    return out


def upgraded(keys: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`keys` with each namespace key's "hosts" list (the form before namespace_host
    keys) taken out into namespace_host keys; and the keys that differ, to write back."""
    out = dict(keys)
    rewrites: dict[str, str] = {}
    for key, text in keys.items():
        if not key.startswith("namespace "):
            continue
        try:
            _kind, (nqn, nsid) = _fields(key)
            value = json.loads(text)
        except (ConfigError, ValueError):
            continue  # refused by name when applied
        hosts = value.get("hosts") if isinstance(value, dict) else None
        if not isinstance(hosts, list) or not all(
            isinstance(h, str) and h and " " not in h for h in hosts
        ):
            continue  # none, or not a host list: applying it names what is wrong
        del value["hosts"]
        out[key] = rewrites[key] = _dump(value)
        for hostnqn in hosts:
            host_key = f"namespace_host {nqn} {nsid} {hostnqn}"
            out[host_key] = rewrites[host_key] = _dump({})
    return out, rewrites


def _moved_to(mine: str | None, value: Any) -> int | None:
    """The ANA group a namespace moved to, if its key changed in that alone."""
    if mine is None or not isinstance(value, dict):
        return None
    try:
        old = json.loads(mine)
    except ValueError:
        return None
    group = value.get("anagrpid", DEFAULT_GROUP)
    old.pop("anagrpid", None)
    rest = {k: v for k, v in value.items() if k != "anagrpid"}
    if old != rest or not isinstance(group, int) or isinstance(group, bool):
        return None
    return group


class LostRace(Exception):
    """Another gateway wrote the object since this one read it."""


@dataclass
class SharedConfig:
    """Keeps `target`'s subsystems and the group object `object_name` in `pool` in step.

    `await start()` seeds or adopts the object (before the target listens);
    `await flush()` returns once this gateway's changes so far are in the object;
    `await stop()` ends the watch and the poll."""

    target: Target
    spec: ClusterSpec
    pool: str
    gateway_id: str
    object_name: str
    poll_interval: float = 10.0
    call_timeout: float = 30.0
    # Each key that could not be applied, with why (newest last): for the operator's logs
    # and the tests.
    errors: list[str] = field(default_factory=list)
    races: int = 0  # guarded writes that lost to another gateway's (and were made again)

    def __post_init__(self) -> None:
        self._known: dict[str, str] = {}
        self._synced: dict[str, str] = {}
        self._version: str | None = None  # the object's version key; None: no object
        # Keys of the object in an earlier form, as the last read upgraded them: written
        # with the next write.
        self._upgrades: dict[str, str] = {}
        self._exists = False
        self._conn: RadosConnection | None = None
        self._watch: Any = None
        self._applying = False
        self._dirty = False
        self._stopping = False
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._synced_once = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._notifies: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        try:
            return int(self._version or 0)
        except ValueError:
            return 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._conn = await asyncio.to_thread(RadosConnection.get, self.spec)
        async with self._lock:
            remote = await self._read()
            if not remote and self._version is None:
                await self._seed()
            else:
                await self._adopt(remote)
            await self._ensure_watch()
        self.target.add_change_listener(self._local_change)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.target.remove_change_listener(self._local_change)
        task, self._task = self._task, None
        if task is not None:
            # Not task.cancel(): 3.11's wait_for swallows a cancellation that meets a
            # wake-up, and the loop would go on for ever.
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(Exception):
                await task
        if self._notifies:
            # Bounded: a notify to a cluster that stopped answering may never return, and
            # stopping must not wait for it (its thread ends when librados gives up).
            await asyncio.wait(list(self._notifies), timeout=self.call_timeout)
        await self._unwatch()
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.release)

    async def flush(self) -> None:
        """Write what changed here (the control plane calls this after each method, so
        that a method returns once its change is shared)."""
        if not self._dirty and not self._lock.locked():
            return  # nothing changed here, and no sync is writing a change right now
        try:
            async with self._lock:
                if self._dirty:
                    await self._sync()
        except Exception as exc:  # the change stands here; the poll writes it later
            log.error("shared configuration %s: not written: %s", self.object_name, exc)

    def local_changed(self) -> None:
        """Something not told by a change listener changed (a port got its number)."""
        self._local_change("")

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Until `predicate()` holds, checked after every sync (for tests and tools)."""

        async def wait() -> None:
            async with self._synced_once:
                await self._synced_once.wait_for(predicate)

        await asyncio.wait_for(wait(), timeout)

    # -- learning of changes -------------------------------------------------------------------

    def _local_change(self, _nqn: str) -> None:
        if self._applying:
            return  # the change came from the object
        self._dirty = True
        self._wake.set()

    def _notified(self, *_args: Any) -> None:  # on a librados thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def _watch_failed(self, *args: Any) -> None:  # on a librados thread: (watch id, error)
        log.warning("shared configuration %s: watch lost (%s)", self.object_name, args[-1])
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._lost_watch)

    def _lost_watch(self) -> None:
        # A lost watch is not unwatched (librados crashed unwatching for a blocklisted
        # client: block/rbd.py) but held by the connection until it shuts down.
        lost, self._watch = self._watch, None
        if lost is not None and self._conn is not None:
            self._conn.hold_watch(lost)
        self._wake.set()

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                async with self._lock:
                    if self._dirty or await self._read_version() != self._version:
                        await self._sync()
                    else:
                        await self._ensure_watch()
                        await self._tell()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cluster may come back: go on polling
                log.error("shared configuration %s: %s", self.object_name, exc)

    # -- RADOS ---------------------------------------------------------------------------------

    def _io(self) -> Any:
        assert self._conn is not None
        return self._conn.ioctx(self.pool)

    async def _call(self, fn: Callable[[], Any]) -> Any:
        # A cluster that does not answer must not hang the control plane for ever.
        return await asyncio.wait_for(asyncio.to_thread(fn), self.call_timeout)

    async def _read(self) -> dict[str, str]:
        """The object's keys (without `version`); sets `_version` and `_exists`."""
        rados, _ = bindings()
        io = self._io()

        def read() -> tuple[bool, dict[str, bytes]]:
            values: dict[str, bytes] = {}
            after = ""
            while True:
                with rados.ReadOpCtx() as op:
                    it, _rc = io.get_omap_vals(op, after, "", _PAGE)
                    try:
                        io.operate_read_op(op, self.object_name)
                    except rados.ObjectNotFound:
                        return False, {}
                    page = list(it)
                values.update((k, bytes(v)) for k, v in page)
                if len(page) < _PAGE:
                    return True, values
                after = page[-1][0]

        exists, raw = await self._call(read)
        self._exists = exists
        version = raw.pop(VERSION_KEY, None)
        self._version = None if version is None else version.decode(errors="replace")
        out: dict[str, str] = {}
        for key, value in raw.items():
            try:
                out[key] = _dump(json.loads(value))
            except (ValueError, UnicodeDecodeError):
                out[key] = value.decode(errors="replace")  # refused when applied, by name
        out, self._upgrades = upgraded(out)
        return out

    async def _read_version(self) -> str | None:
        rados, _ = bindings()
        io = self._io()

        def read() -> str | None:
            with rados.ReadOpCtx() as op:
                it, _rc = io.get_omap_vals_by_keys(op, (VERSION_KEY,))
                try:
                    io.operate_read_op(op, self.object_name)
                except rados.ObjectNotFound:
                    return None
                values = dict(it)
            value = values.get(VERSION_KEY)
            return None if value is None else bytes(value).decode(errors="replace")

        result: str | None = await self._call(read)
        return result

    async def _write(self, changes: dict[str, str | None]) -> None:
        """One guarded write: `changes` (None: remove the key) and the next version, if
        the object's version is still the one read last; LostRace if it is not."""
        rados, _ = bindings()
        io = self._io()
        try:
            following = str(int(self._version or 0) + 1)
        except ValueError:
            following = "1"
        expected, exists = self._version, self._exists
        sets = {k: v for k, v in changes.items() if v is not None}
        sets[VERSION_KEY] = following
        removes = [k for k, v in changes.items() if v is None]

        def write() -> None:
            with rados.WriteOpCtx() as op:
                if not exists:
                    op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
                else:  # a missing key compares equal to ""
                    op.omap_cmp(VERSION_KEY, expected or "", rados.LIBRADOS_CMPXATTR_OP_EQ)
                io.set_omap(op, tuple(sets), tuple(v.encode() for v in sets.values()))
                if removes:
                    io.remove_omap_keys(op, tuple(removes))
                io.operate_write_op(op, self.object_name)

        try:
            await self._call(write)
        except rados.Error as exc:
            code = abs(getattr(exc, "errno", 0) or 0)
            if code in (errno.ECANCELED, errno.EEXIST, errno.ENOENT):
                raise LostRace from None
            raise
        self._version, self._exists = following, True
        self._notify(following)

    def _notify(self, version: str) -> None:
        # Not awaited: a notify waits for every watcher's answer, and a gateway that died
        # without unwatching answers only by its watch timing out.
        io = self._io()

        def notify() -> None:
            with contextlib.suppress(Exception):
                io.notify(self.object_name, version, timeout_ms=5000)

        task = asyncio.get_running_loop().create_task(asyncio.to_thread(notify))
        self._notifies.add(task)
        task.add_done_callback(self._notifies.discard)

    async def _ensure_watch(self) -> None:
        """Watch the object if it exists and this gateway does not watch it (any more):
        checked after every read and write, so that a gateway that finds the object made
        again (removed by hand, seeded by another) watches it before it tells anyone."""
        if self._watch is None and self._exists:
            await self._watch_object()

    async def _watch_object(self) -> None:
        if not self._exists:
            return
        io = self._io()
        # The callbacks hold this object weakly: a Watch that held it would make a cycle,
        # and the garbage collector may free a cycle on any thread, librados's own
        # callback threads too, where the Watch's unwatch waits for itself for ever.
        notified, failed = weakly(self._notified), weakly(self._watch_failed)
        self._watch = await self._call(lambda: io.watch(self.object_name, notified, failed))

    async def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(Exception):
                await self._call(watch.close)

    # -- keeping in step -----------------------------------------------------------------------

    async def _seed(self) -> None:
        local = shared_keys(self.target, self.gateway_id)
        try:
            await self._write(dict(local))
        except LostRace:  # another gateway seeded it first: its content wins
            await self._adopt(await self._read())
            return
        self._known, self._synced = dict(local), dict(local)
        log.info(
            "shared configuration %s: seeded with %d subsystems",
            self.object_name,
            sum(k.startswith("subsystem ") for k in local),
        )
        await self._tell()

    async def _adopt(self, remote: dict[str, str]) -> None:
        """Serve what the object holds: a subsystem of the file that it lacks or describes
        otherwise goes (nothing is connected yet), then the object's are added."""
        local = shared_keys(self.target, self.gateway_id)
        for nqn in list(self.target.subsystems):
            if self.target.subsystems[nqn].is_discovery:
                continue
            mine = {k: v for k, v in local.items() if _nqn_of(k) == nqn and not self._own(k)}
            theirs = {
                k: v
                for k, v in remote.items()
                if _nqn_of(k) == nqn and not k.startswith("listener ")
            }
            if mine == theirs:
                continue
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    log.warning(
                        "shared configuration %s: %s: the file has %s, the group %s",
                        self.object_name,
                        key,
                        mine.get(key, "nothing"),
                        theirs.get(key, "nothing"),
                    )
            log.warning(
                "shared configuration %s: %s is served as the group object has it",
                self.object_name,
                nqn,
            )
            self._applying = True
            try:
                await self.target.remove_subsystem(nqn)
            finally:
                self._applying = False
        local = shared_keys(self.target, self.gateway_id)
        self._known = {k: v for k, v in local.items() if remote.get(k) == v}
        self._synced = dict(local)
        await self._sync(remote)

    def _own(self, key: str) -> bool:
        return key.startswith(f"listener {self.gateway_id} ")

    async def _sync(self, remote: dict[str, str] | None = None) -> None:
        """Apply what changed in the object, then write what changed here (again, after
        applying the other gateway's change, if it wrote in between)."""
        self._dirty = False
        while True:
            if remote is None:
                remote = await self._read()
            await self._ensure_watch()
            if not self._exists and self._known:
                # Removed under the running gateways (by hand): not "every subsystem
                # removed", which would take them from every host; this gateway's go back.
                log.warning(
                    "shared configuration %s: the object is gone; seeding it again",
                    self.object_name,
                )
                self._known, self._synced = {}, {}
            local = shared_keys(self.target, self.gateway_id)
            applied = await self._apply_remote(remote, local)
            if applied:
                local = shared_keys(self.target, self.gateway_id)
                for key in applied:
                    if key in local:
                        self._synced[key] = local[key]
                    else:
                        self._synced.pop(key, None)
            changes: dict[str, str | None] = {}
            for key in set(local) | set(self._synced) | set(remote):
                if self._own(key):
                    if local.get(key) != remote.get(key):
                        changes[key] = local.get(key)
                elif local.get(key) != self._synced.get(key):
                    changes[key] = local.get(key)
            if not changes and not self._upgrades:
                self._known = dict(remote)
                await self._tell()
                return
            try:
                await self._write({**self._upgrades, **changes})
            except LostRace:
                self.races += 1
                remote = None
                continue
            self._upgrades = {}
            await self._ensure_watch()  # the object may be this write's
            for key, value in changes.items():
                if value is None:
                    remote.pop(key, None)
                    self._synced.pop(key, None)
                else:
                    remote[key] = self._synced[key] = value
            self._known = dict(remote)
            await self._tell()
            return

    async def _tell(self) -> None:
        async with self._synced_once:
            self._synced_once.notify_all()

    async def _apply_remote(self, remote: dict[str, str], local: dict[str, str]) -> list[str]:
        """Apply the keys another gateway changed (and this one did not): removals first,
        the innermost first; then additions, the subsystem first. The keys handled."""
        changed = [
            key
            for key in set(remote) | set(self._known)
            if remote.get(key) != self._known.get(key)
            and not self._own(key)
            and local.get(key) == self._synced.get(key)
        ]

        def order(key: str) -> tuple[int, str]:
            return _ORDER.get(key.partition(" ")[0], 9), key

        removed = sorted((k for k in changed if k not in remote), key=order, reverse=True)
        added = sorted((k for k in changed if k in remote), key=order)
        self._applying = True
        try:
            for key in removed + added:
                try:
                    await self._apply(key, remote.get(key), local.get(key), remote)
                except (ConfigError, ChangeError, OSError, ValueError, TypeError) as exc:
                    self._refused(key, exc)
                if key in remote:
                    self._known[key] = remote[key]
                else:
                    self._known.pop(key, None)
        finally:
            self._applying = False
        return changed

    def _refused(self, key: str, exc: Exception) -> None:
        text = f"{exc.field}: {exc.reason}" if isinstance(exc, ChangeError) else str(exc)
        message = f"key {key!r}: {text}"
        log.error("shared configuration %s: %s (not applied)", self.object_name, message)
        self.errors.append(message)

    async def _apply(
        self, key: str, value_text: str | None, mine: str | None, remote: dict[str, str]
    ) -> None:
        kind, words = _fields(key)
        if value_text is not None and value_text == mine:
            return  # this gateway has it already
        value: Any = None
        if value_text is not None:
            try:
                value = json.loads(value_text)
            except ValueError:
                raise ConfigError(f"not JSON: {value_text[:80]!r}") from None
        target = self.target
        if kind == "subsystem":
            (nqn,) = words
            if value is None:
                if nqn in target.subsystems:
                    await target.remove_subsystem(nqn)
                return
            if not isinstance(value, dict):
                raise ConfigError("not an object")
            for local_key in _LOCAL_SUBSYSTEM_KEYS + _GATEWAY_SUBSYSTEM_KEYS + ("nqn",):
                if local_key in value:
                    raise ConfigError(f"{local_key}: not a key of a shared subsystem")
            if nqn not in target.subsystems:
                add_subsystem_spec(target, {**value, "nqn": nqn}, key, [])
                return
            old = json.loads(mine) if mine is not None else {}
            for setting in sorted(set(old) | set(value)):
                if old.get(setting) == value.get(setting):
                    continue
                if setting == "allow_any_host" and isinstance(value.get(setting), bool):
                    target.set_allow_any_host(nqn, value[setting])
                else:
                    self._refused(key, ConfigError(f"{setting}: cannot change while it runs"))
            return
        if kind == "namespace":
            nqn, nsid_text = words
            if not nsid_text.isdigit():
                raise ConfigError(f"{nsid_text!r} is not an NSID")
            nsid = int(nsid_text)
            subsystem = target.subsystems.get(nqn)
            if subsystem is not None and nsid in subsystem.namespaces:
                group = _moved_to(mine, value)
                if group is not None:  # the same namespace in another ANA group
                    target.set_namespace_ana_group(nqn, nsid, group)
                    return
                await target.remove_namespace(nqn, nsid)  # removed, or changed: again
            if value is None:
                return
            if subsystem is None:
                raise ConfigError(f"no subsystem {nqn}")
            if not isinstance(value, dict) or value.get("nsid", nsid) != nsid:
                raise ConfigError(f"not namespace {nsid}")
            if "hosts" in value:
                raise ConfigError("hosts: not a key of a shared namespace (namespace_host keys)")
            prefix = f"namespace_host {nqn} {nsid} "
            hosts = sorted(k[len(prefix) :] for k in remote if k.startswith(prefix))
            if hosts and value.get("auto_visible") is False:
                # Added again (it changed): attached to its hosts from the start.
                value = {**value, "hosts": hosts}
            add_namespace_spec(target, nqn, value, key, nsid)
            return
        if kind == "namespace_host":
            nqn, nsid_text, hostnqn = words
            if not nsid_text.isdigit():
                raise ConfigError(f"{nsid_text!r} is not an NSID")
            nsid = int(nsid_text)
            subsystem = target.subsystems.get(nqn)
            ns = subsystem.namespaces.get(nsid) if subsystem is not None else None
            if value is None:
                if f"namespace {nqn} {nsid_text}" not in remote:
                    return  # the namespace goes too: its removal tells the hosts once
                if ns is not None and not ns.auto_visible and hostnqn in ns.hosts:
                    await target.ns_remove_host(nqn, nsid, hostnqn)
                return
            if ns is None:
                raise ConfigError(f"no namespace {nsid} in {nqn}")
            if hostnqn not in ns.hosts:
                await target.ns_add_host(nqn, nsid, hostnqn)
            return
        if kind == "host":
            nqn, hostnqn = words
            subsystem = target.subsystems.get(nqn)
            if value is None:
                if subsystem is not None and hostnqn in subsystem.allowed_hosts:
                    target.remove_host(nqn, hostnqn)
                return
            if subsystem is None:
                raise ConfigError(f"no subsystem {nqn}")
            name, auth, psk = host_of_spec(target, value, key)
            if name != hostnqn:
                raise ConfigError(f"describes host {name!r}")
            if hostnqn not in subsystem.allowed_hosts:
                target.add_host(nqn, hostnqn, auth=auth, psk=psk)
            else:
                target.set_host_keys(nqn, hostnqn, auth)
                target.set_host_psk(nqn, hostnqn, psk)
            return
        # listener <gateway> <nqn> <address> <port>: another gateway's path, for discovery
        _gateway, nqn, address, port_text = words
        subsystem = target.subsystems.get(nqn)
        if not port_text.isdigit():
            raise ConfigError(f"{port_text!r} is not a port")
        port = int(port_text)
        known = subsystem is not None and any(
            p == port and a == address for a, p, _ in subsystem.peer_listeners
        )
        if value is None:
            if known:
                target.remove_peer_listener(nqn, address, port)
            return
        if subsystem is None:
            raise ConfigError(f"no subsystem {nqn}")
        if any(p.exposes(nqn) and p.same_address(address, port) for p in target.ports):
            return  # this gateway's own listener under another gateway's name
        if not known:
            target.add_peer_listener(nqn, address, port)
