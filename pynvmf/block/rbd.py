"""RbdDevice: a block device on a Ceph RBD image, through librbd's asynchronous API.

The `rados` and `rbd` modules are Debian's C extensions (python3-rados, python3-rbd;
there are no PyPI wheels; `make setup` links them into the venv): this module imports
them when a device is opened, so the rest of pynvmf never needs them.

I/O: every command is one librbd aio request (aio_read, aio_write, aio_flush,
aio_write_zeroes), so any number of commands are in flight at once. librbd calls the
completion from one of its own threads; the callback only hands the result to the
event loop (`loop.call_soon_threadsafe`), where the waiting command resumes.

- FUA: librbd has no per-write FUA, so a FUA write is the write followed by aio_flush
  (which makes every completed write durable, this one included). With librbd's
  cache off (`rbd_cache = false`) a completed write is already on the OSDs: the device
  then reports no volatile write cache and a FUA write costs nothing more.
- Write Zeroes and deallocate are both `aio_write_zeroes` without the thick-provision
  flag: librbd discards whole objects and zeroes partial ones, so a deallocated range
  reads back as zeroes (plain `aio_discard` skips the parts of a discard that are not
  aligned to `rbd_discard_granularity_bytes`, which would leave old data readable).
- Copy: librbd copies only whole images (copy, deep_copy, clones); a range of an
  image cannot be copied without the data passing through the client. The device
  offers no native copy, so the copy planner emulates it (read + write through the
  gateway's memory); docs/rbd.md has the measured rate.

Faults: a request that fails with ESHUTDOWN (this client is on the OSD blocklist: it
was fenced, for good) or does not complete within `io_timeout` seconds (the cluster
does not answer: monitors or OSDs down, network gone) raises StorageUnavailable,
which the target answers with a path-related status (never a crash). The device's
`state` says what it last saw (OK, UNREACHABLE, FENCED, CLOSED) and listeners added
with `add_state_listener` hear every change: that is how a gateway learns that its
storage is gone and turns its paths inaccessible (ANA). A timed-out request is left
to librbd (its buffers stay referenced until it completes); it is not cancelled,
since a write that reached an OSD may still land: fencing (the blocklist), not the
timeout, is what makes such a write harmless to another gateway.
Other librbd errors are OSErrors with librbd's errno (the target's media-error
statuses).

Size: `grow` resizes the image (never smaller: SPDK's bdev_rbd_resize refuses that too),
`shrink` cuts it (librbd's allow_shrink; the target asks only when forced, its I/O
quiesced), `rescan` takes the size the image's header holds (one another client cut:
StorageShrank, which the target follows as a forced shrink without cutting). Another
client's resize (`rbd resize`, another gateway) is heard through a watch on the image's
header object (rbd_header.<id>), the object librbd's own update_watch listens on
(Debian's python3-rbd 16.2 has no update_watch): every notify on it (a header update, a
lock changing hands) calls the size listeners (block.device.GrowsOutside), and the
target rescans: it reads the size from the header itself (cls_rbd get_size), then has
the open image refresh to it (its aio requests never refresh it), which librbd's own
watch lets it do a moment later.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import struct
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from pynvmf.block.device import (
    Buffer,
    Capabilities,
    Medium,
    SizeListener,
    StorageShrank,
    StorageUnavailable,
    block_shift,
    check_range,
)

log = logging.getLogger(__name__)

DEFAULT_IO_TIMEOUT = 30.0  # seconds a request may take before the storage counts as gone
DEFAULT_CONNECT_TIMEOUT = 20  # seconds (rados connect takes an int)
DEFAULT_POOL = "rbd"
# cls_rbd's get_size takes a snapshot id: the image itself (CEPH_NOSNAP); it answers the
# object order (u8) and the size (u64), little-endian.
_GET_SIZE_OF_HEAD = struct.pack("<Q", (1 << 64) - 2)
_GET_SIZE_ANSWER = struct.Struct("<BQ")


class RbdUnavailable(ImportError):
    """The `rados`/`rbd` bindings are not installed (Debian: python3-rados python3-rbd)."""


_modules: tuple[Any, Any] | None = None


def bindings() -> tuple[Any, Any]:
    """(rados, rbd), imported on first use."""
    global _modules
    if _modules is not None:
        return _modules
    try:
        import rados
        import rbd
    except ImportError as exc:
        raise RbdUnavailable(
            "the RBD backend needs the Ceph bindings: apt-get install python3-rados "
            "python3-rbd, then `make setup` (scripts/link-ceph-bindings.py) links them "
            "into the venv"
        ) from exc
    _modules = rados, rbd
    return _modules


class DeviceState(Enum):
    OK = "ok"
    UNREACHABLE = "unreachable"  # requests time out: the cluster does not answer (may recover)
    FENCED = "fenced"  # this client is blocklisted: its connection never works again
    CLOSED = "closed"


StateListener = Callable[["RbdDevice", DeviceState], None]


# -- cluster connections -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """How to reach a cluster: a ceph.conf (None: librados' default search, which is
    $CEPH_CONF, then /etc/ceph/ceph.conf; "": no file at all, everything is in
    `options`), a client id ("admin" for client.admin) and configuration options set
    after the file is read (key -> value, as rados_conf_set: mon_host, keyring, key...)."""

    conf: str | None = None
    client: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls, conf: str | None = None, client: str | None = None, options: Mapping[str, str] = {}
    ) -> ClusterSpec:
        if client is not None and client.startswith("client."):
            client = client.removeprefix("client.")
        return cls(conf, client, tuple(sorted((str(k), str(v)) for k, v in options.items())))


class RadosConnection:
    """One connected librados client (one address on the cluster, one entry to blocklist),
    shared by every device and lease opened with the same ClusterSpec in this process:
    fencing a gateway must stop all its I/O, so all of it should come from one client.
    Reference counted: `release()` shuts it down when its last user lets go."""

    _shared: dict[ClusterSpec, RadosConnection] = {}
    _lock = threading.Lock()

    def __init__(self, spec: ClusterSpec, cluster: Any) -> None:
        self.spec = spec
        self.cluster = cluster
        self.users = 0
        # Set once a request saw ESHUTDOWN: new users get a new client (a new address).
        self.fenced = False
        self._ioctxs: dict[str, Any] = {}
        # The devices on this client: fencing it fences them all at once.
        self.devices: weakref.WeakSet[RbdDevice] = weakref.WeakSet()
        # Watches librados cannot end (lost by a fenced client: an unwatch then makes
        # librados abort the process), held until the client is shut down, so that no
        # finalizer tries before (after, it finds the client gone and does nothing).
        self._unended_watches: list[Any] = []

    @classmethod
    def get(cls, spec: ClusterSpec, *, timeout: int = DEFAULT_CONNECT_TIMEOUT) -> RadosConnection:
        """The shared connection for `spec`, connected (blocking) if there is none yet
        or the one there was fenced. Raises OSError on failure."""
        with cls._lock:
            conn = cls._shared.get(spec)
            if conn is not None and conn.fenced:
                del cls._shared[spec]  # its users keep it; new ones get a new client
                conn = None
            if conn is None:
                conn = cls(spec, _connect(spec, timeout))
                cls._shared[spec] = conn
            conn.users += 1
            return conn

    def mark_fenced(self) -> None:
        """This client is blocklisted (a request or a lease saw ESHUTDOWN): every device
        on it goes FENCED now, not at its own next request, so that a gateway hears of
        all of them at once. On the event loop's thread."""
        self.fenced = True
        for device in list(self.devices):
            device._set_state(DeviceState.FENCED)

    def ioctx(self, pool: str) -> Any:
        io = self._ioctxs.get(pool)
        if io is None:
            rados, _ = bindings()
            try:
                io = self.cluster.open_ioctx(pool)
            except rados.Error as exc:
                raise _os_error(exc, f"pool {pool!r}") from None
            self._ioctxs[pool] = io
        return io

    def hold_watch(self, watch: Any) -> None:
        """Keep a watch that cannot be ended until this client is shut down."""
        self._unended_watches.append(watch)

    @property
    def address(self) -> str:
        """This client's address as `osd blocklist add` takes it."""
        return str(self.cluster.get_addrs())

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            if self._shared.get(self.spec) is self:
                del self._shared[self.spec]
        for io in self._ioctxs.values():
            with contextlib.suppress(Exception):
                io.close()
        self._ioctxs.clear()
        with contextlib.suppress(Exception):
            self.cluster.shutdown()
        self._unended_watches.clear()


def weakly(method: Callable[..., None]) -> Callable[..., None]:
    """`method` as a librados callback (a watch's): called while its object lives,
    without keeping the object alive. A Watch whose callbacks held their object would be
    in a cycle with it, and the garbage collector frees a cycle on whatever thread it
    runs, librados's own callback threads too, where the Watch's unwatch then waits for
    that very thread: a deadlock that hangs every later librados call of the process."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


def _connect(spec: ClusterSpec, timeout: int) -> Any:
    rados, _ = bindings()
    try:
        # The binding reads librados' default search for conffile="" and no file for None.
        conffile = None if spec.conf == "" else (spec.conf or "")
        cluster = rados.Rados(conffile=conffile, rados_id=spec.client)
    except rados.ObjectNotFound:
        if spec.conf is None:
            raise OSError(
                errno.ENOENT,
                "no ceph.conf found ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, "
                "./ceph.conf): name one",
            ) from None
        raise OSError(errno.ENOENT, f"ceph configuration {spec.conf}: not found") from None
    except rados.Error as exc:
        raise _os_error(exc, f"ceph configuration {spec.conf or '(default search)'}") from None
    try:
        for key, value in spec.options:
            cluster.conf_set(key, value)
        cluster.connect(timeout=timeout)
    except rados.Error as exc:
        with contextlib.suppress(Exception):
            cluster.shutdown()
        raise _os_error(exc, "connecting to the ceph cluster") from None
    return cluster


def _os_error(exc: Exception, what: str) -> OSError:
    code = getattr(exc, "errno", None) or errno.EIO
    code = abs(code)
    message = f"{what}: {exc}"
    if code in (errno.ESHUTDOWN, errno.ETIMEDOUT):
        return StorageUnavailable(code, message)
    return OSError(code, message)


# -- the device -----------------------------------------------------------------------------------


class RbdDevice:
    """An open RBD image `pool`/`image` as blocks of `block_size` bytes (the image's
    size rounded down to whole blocks). Open with `RbdDevice.open` (blocking: it
    connects) or `await RbdDevice.open_async`."""

    def __init__(
        self,
        connection: RadosConnection,
        image: Any,
        *,
        pool: str,
        name: str,
        block_size: int = 512,
        read_only: bool = False,
        io_timeout: float = DEFAULT_IO_TIMEOUT,
    ) -> None:
        shift = block_shift(block_size)
        size = int(image.size())
        if size < block_size:
            raise ValueError(f"image {pool}/{name} ({size} bytes) holds no whole block")
        self._conn = connection
        self._image = image
        self._pool = pool
        self._name = name
        self._shift = shift
        self._mask = block_size - 1
        self._read_only = read_only
        self._io_timeout = io_timeout
        cache = str(connection.cluster.conf_get("rbd_cache")).lower() in ("true", "1", "yes")
        self._caps = Capabilities(
            block_size=block_size,
            num_blocks=size >> shift,
            volatile_write_cache=cache,
            write_zeroes=True,
            deallocate=True,
            deallocated_reads_zero=True,
            native_copy=False,
        )
        # The image's id names its data objects: the same image opened twice (or by two
        # gateways) is one storage, whatever it is called (a rename keeps the id).
        self._fsid = str(connection.cluster.get_fsid())
        image_id = image.id()
        self._medium = Medium((("rbd", self._fsid, pool, image_id),))
        self._header = f"rbd_header.{image_id}"
        self._watch: Any = None
        self._watch_lock = threading.Lock()
        self._watch_broken = False
        self._watch_fenced = False
        self._size_listeners: list[tuple[SizeListener, asyncio.AbstractEventLoop]] = []
        self._resizing = asyncio.Lock()
        self._state = DeviceState.OK
        self._listeners: list[StateListener] = []
        self._inflight = 0
        self._closing = False
        connection.devices.add(self)

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        pool: str,
        image: str,
        *,
        conf: str | None = None,
        client: str | None = None,
        options: Mapping[str, str] = {},
        block_size: int = 512,
        read_only: bool = False,
        io_timeout: float = DEFAULT_IO_TIMEOUT,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    ) -> RbdDevice:
        """Connect (or share this process's connection to the same cluster as the same
        client) and open the image. Blocking. Raises OSError (ENOENT: no such pool or
        image; StorageUnavailable: the cluster does not answer) or ValueError."""
        block_shift(block_size)
        if not pool or not image:
            raise ValueError("an RBD namespace needs a pool and an image name")
        if io_timeout <= 0:
            raise ValueError(f"io_timeout {io_timeout!r} is not positive")
        _, rbd = bindings()
        conn = RadosConnection.get(ClusterSpec.of(conf, client, options), timeout=connect_timeout)
        try:
            io = conn.ioctx(pool)
            try:
                img = rbd.Image(io, image, read_only=read_only)
            except rbd.ImageNotFound:
                raise OSError(errno.ENOENT, f"no RBD image {image!r} in pool {pool!r}") from None
            except rbd.Error as exc:
                raise _os_error(exc, f"opening RBD image {pool}/{image}") from None
            try:
                device = cls(
                    conn,
                    img,
                    pool=pool,
                    name=image,
                    block_size=block_size,
                    read_only=read_only,
                    io_timeout=io_timeout,
                )
            except BaseException:
                img.close()
                raise
            device._start_watch()
            return device
        except BaseException:
            conn.release()
            raise

    @classmethod
    async def open_async(cls, pool: str, image: str, **kwargs: Any) -> RbdDevice:
        """`open` in a worker thread, so that connecting does not stall the event loop."""
        return await asyncio.to_thread(lambda: cls.open(pool, image, **kwargs))

    def __repr__(self) -> str:
        c = self._caps
        return (
            f"RbdDevice({self._pool}/{self._name}, block_size={c.block_size}, size={c.size}, "
            f"{self._state.value})"
        )

    # -- what it is ---------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def medium(self) -> Medium:
        return self._medium

    @property
    def fsid(self) -> str:
        """The cluster's id."""
        return self._fsid

    @property
    def pool(self) -> str:
        return self._pool

    @property
    def image_name(self) -> str:
        return self._name

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def io_timeout(self) -> float:
        return self._io_timeout

    @property
    def connection(self) -> RadosConnection:
        """The librados client this device's I/O goes through (what fencing blocklists)."""
        return self._conn

    @property
    def cluster_spec(self) -> ClusterSpec:
        return self._conn.spec

    @property
    def closed(self) -> bool:
        return self._state is DeviceState.CLOSED

    # -- health -------------------------------------------------------------------------------

    @property
    def state(self) -> DeviceState:
        return self._state

    @property
    def healthy(self) -> bool:
        return self._state is DeviceState.OK

    def add_state_listener(self, listener: StateListener) -> None:
        """`listener(device, new_state)` is called on the event loop's thread at every
        change of `state` (not for repeats). A listener must not raise; one that does is
        logged and kept."""
        self._listeners.append(listener)

    def remove_state_listener(self, listener: StateListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def _set_state(self, state: DeviceState) -> None:
        old = self._state
        if state is old or old is DeviceState.CLOSED:
            return
        if old is DeviceState.FENCED and state is not DeviceState.CLOSED:
            return  # a blocklisted client stays fenced: only a new connection works again
        self._state = state
        log.warning("RBD image %s/%s: %s -> %s", self._pool, self._name, old.value, state.value)
        for listener in list(self._listeners):
            try:
                listener(self, state)
            except Exception:
                log.exception("RBD state listener %r failed", listener)
        if state is DeviceState.FENCED and not self._conn.fenced:
            self._conn.mark_fenced()

    # -- size ---------------------------------------------------------------------------------

    def add_size_listener(self, listener: SizeListener) -> None:
        """`listener()` is called on the running event loop's thread whenever the image's
        header changed (another client resized it, the exclusive lock moved...): the
        caller rescans (block.device.GrowsOutside). Must be called on that loop."""
        self._size_listeners.append((listener, asyncio.get_running_loop()))

    def remove_size_listener(self, listener: SizeListener) -> None:
        self._size_listeners = [e for e in self._size_listeners if e[0] is not listener]

    async def rescan(self) -> int:
        """Take the size the image has now, in whole blocks; the new number of blocks.
        StorageShrank, the size kept, if another client cut it (the target follows:
        block.device.Resizable); StorageUnavailable if the cluster does not answer."""

        def served_size() -> int:  # in a thread
            self._rewatch_if_lost()
            return self._served_size(self._stored_size())

        async with self._resizing:
            return self._take(await self._blocking("size", served_size))

    async def grow(self, size_bytes: int) -> int:
        """Resize the image to `size_bytes` (whole blocks, at least its size) and take that
        size; the new number of blocks. An image another client grew further meanwhile
        keeps its size (librbd is told never to shrink)."""
        self._writable()
        if size_bytes & self._mask or size_bytes < self._caps.size:
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of at least "
                f"{self._caps.size} bytes"
            )

        def resize() -> int:  # in a thread
            stored = self._stored_size()
            if stored >= size_bytes:  # another client grew it that far meanwhile
                return self._served_size(stored)
            self._image.resize(size_bytes, allow_shrink=False)
            return size_bytes

        async with self._resizing:
            return self._take(await self._blocking("resize", resize))

    async def serve_only(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` (whole blocks, more than none, at most its size)
        only, the image left as it is (block.device.Shrinkable)."""
        self._check_smaller(size_bytes)
        async with self._resizing:
            self._caps = replace(self._caps, num_blocks=size_bytes >> self._shift)
        return self._caps.num_blocks

    async def shrink(self, size_bytes: int) -> int:
        """Serve the first `size_bytes` only and resize the image to them (librbd told it
        may shrink: the objects past the new end are removed). If librbd refuses, the
        size served is the image's again."""
        self._writable()
        self._check_smaller(size_bytes)

        def resize() -> None:  # in a thread
            self._image.resize(size_bytes, allow_shrink=True)

        async with self._resizing:
            before = self._caps
            self._caps = replace(before, num_blocks=size_bytes >> self._shift)
            try:
                await self._blocking("resize", resize)
            except OSError:
                self._caps = before
                raise
            log.info("RBD image %s/%s: cut to %d bytes", self._pool, self._name, size_bytes)
        return self._caps.num_blocks

    def _check_smaller(self, size_bytes: int) -> None:
        if not 0 < size_bytes <= self._caps.size or size_bytes & self._mask:
            raise ValueError(
                f"{size_bytes} is not a multiple of {self._caps.block_size} of more than 0 "
                f"and at most {self._caps.size} bytes"
            )

    def _take(self, size: int) -> int:
        size -= size & self._mask
        if size < self._caps.size:
            raise StorageShrank(f"RBD image {self._pool}/{self._name}", self._caps.size, size)
        if size != self._caps.size:
            log.info("RBD image %s/%s: %d bytes", self._pool, self._name, size)
            self._caps = replace(self._caps, num_blocks=size >> self._shift)
        return self._caps.num_blocks

    def _served_size(self, stored: int) -> int:
        """The size the open image serves once it took `stored`, the header's (blocking).
        librbd's aio requests are checked against the size the image last refreshed to,
        and never refresh it (a write past the old end fails with EINVAL although the
        header says otherwise); a synchronous call (size()) refreshes it, once librbd's
        own watch on the header heard of the change. That watch hears the same notify as
        this device's, a moment apart: wait for it, as long as a request may take, and
        serve what librbd serves. A cut (smaller) is waited for too, the header read
        again each time: the librbd that carries out a cut for another client (this one,
        holding the exclusive lock) serves the smaller size before the header has it."""
        deadline = time.monotonic() + self._io_timeout
        served = int(self._image.size())
        while served != stored and time.monotonic() < deadline:
            time.sleep(0.005)
            served = int(self._image.size())
            if served > stored:
                continue  # librbd has not heard of the cut yet
            stored = self._stored_size()
        return served

    def _stored_size(self) -> int:
        """The size the image's header holds now. Blocking."""
        _ret, out = self._conn.ioctx(self._pool).execute(
            self._header, "rbd", "get_size", _GET_SIZE_OF_HEAD
        )
        _order, size = _GET_SIZE_ANSWER.unpack_from(out)
        return int(size)

    async def _blocking(self, what: str, call: Callable[[], Any]) -> Any:
        """A blocking librados/librbd call in a thread, bounded by `io_timeout` as every
        request is (a call that times out is left to finish in its thread)."""
        self._open()
        rados, rbd = bindings()
        task = asyncio.ensure_future(asyncio.to_thread(call))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._io_timeout)
        except TimeoutError:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._timed_out(fut, what)
            return await fut
        except (rados.Error, rbd.Error) as exc:
            raise self._failure(what, abs(getattr(exc, "errno", None) or errno.EIO)) from None

    def _start_watch(self) -> None:
        """Watch the image's header object (blocking). Without the watch the device still
        serves; only another client's resize goes unnoticed until a rescan."""
        rados, _ = bindings()
        with self._watch_lock:
            if self._closing:
                return
            try:
                # Weakly held (weakly() says why): no cycle through the Watch.
                self._watch = self._conn.ioctx(self._pool).watch(
                    self._header, weakly(self._header_notified), weakly(self._watch_lost)
                )
            except (rados.Error, OSError) as exc:
                log.warning(
                    "RBD image %s/%s: cannot watch its header (%s): a resize by another "
                    "client will not be seen",
                    self._pool,
                    self._name,
                    exc,
                )

    def _stop_watch(self) -> None:
        """End the watch (blocking; before the image is closed and the connection shut
        down, never at the same time: the lock). A lost watch, or any watch of a fenced
        client, is never unwatched but left to the connection (RadosConnection.hold_watch):
        an unwatch for a blocklisted client crashed librados (abort, segfault)."""
        with self._watch_lock:
            watch, self._watch = self._watch, None
            if watch is None:
                return
            if self._watch_broken or self._conn.fenced or self._state is DeviceState.FENCED:
                self._conn.hold_watch(watch)
                return
            with contextlib.suppress(Exception):
                watch.close()

    def _rewatch_if_lost(self) -> None:
        """Watch again after a transient loss (an OSD restarted, the watch timed out), in
        a rescan's thread (blocking); never for a fenced client."""
        if self._watch_broken and not self._watch_fenced and not self._conn.fenced:
            self._stop_watch()  # held, not unwatched
            self._watch_broken = False
            self._start_watch()

    def _header_notified(self, *_args: Any) -> None:  # on a librados thread
        if self._closing:  # closing the image releases its lock: a notify, not a resize
            return
        for listener, loop in list(self._size_listeners):
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(listener)

    def _watch_lost(self, *args: Any) -> None:  # on a librados thread: ([watch id,] error)
        # Nothing blocking here, nor in a thread of its own that could outlive the
        # connection: the rescan the listeners start watches again (_rewatch_if_lost).
        watch = self._watch
        if watch is None or (len(args) > 1 and args[0] != watch.get_id()):
            return  # a watch already replaced
        code = abs(args[-1]) if isinstance(args[-1], int) else 0
        log.warning("RBD image %s/%s: header watch lost (%s)", self._pool, self._name, args[-1])
        if code == errno.ESHUTDOWN:  # blocklisted: fenced, for good
            self._watch_fenced = True
        self._watch_broken = True
        self._header_notified()

    # -- I/O ----------------------------------------------------------------------------------

    async def read(self, lba: int, buf: memoryview) -> None:
        try:
            n = buf.nbytes
        except AttributeError:  # a bytearray
            n = len(buf)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        check_range(self._caps, lba, n >> self._shift)
        if n == 0:
            return
        off = lba << self._shift
        data = await self._submit("read", lambda cb: self._image.aio_read(off, n, cb), True)
        if data is None or len(data) != n:
            raise OSError(errno.EIO, f"short read of {self._pool}/{self._name} at {off}")
        try:
            buf[:] = data
        except (TypeError, ValueError):
            memoryview(buf).cast("B")[:] = data

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        n = data.nbytes if type(data) is memoryview else len(data)
        if n & self._mask:
            raise ValueError(f"buffer of {n} bytes is not a whole number of blocks")
        check_range(self._caps, lba, n >> self._shift)
        self._writable()
        if n == 0:
            return
        off = lba << self._shift
        # The binding takes bytes (or a bytearray) only; it is referenced by the closure,
        # so it stays alive until librbd completes the write, however long that takes.
        payload = data if type(data) in (bytes, bytearray) else bytes(data)
        await self._submit("write", lambda cb: self._image.aio_write(payload, off, cb))
        if fua and self._caps.volatile_write_cache:
            await self.flush()

    async def flush(self) -> None:
        self._open()
        if self._read_only:
            return
        await self._submit("flush", lambda cb: self._image.aio_flush(cb))

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        check_range(self._caps, lba, nblocks)
        self._writable()
        if nblocks:
            off, length = lba << self._shift, nblocks << self._shift
            await self._submit(
                "write_zeroes", lambda cb: self._image.aio_write_zeroes(off, length, cb)
            )
        if fua and self._caps.volatile_write_cache:
            await self.flush()

    async def deallocate(self, lba: int, nblocks: int) -> None:
        # See the module's docstring: write_zeroes deallocates and reads back as zeroes.
        await self.write_zeroes(lba, nblocks)

    async def close(self) -> None:
        """Wait for librbd to finish (flushing its cache), close the image (releasing its
        exclusive lock) and let go of the cluster connection; idempotent. If the cluster
        does not answer, closing may never finish: after `io_timeout` the device is
        closed anyway, and the image and its connection are left to librbd (a thread
        of its own still waits on them), never freed under it."""
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        def run() -> None:
            ok = self._close_image()
            with contextlib.suppress(RuntimeError):  # the loop went away meanwhile
                loop.call_soon_threadsafe(finished, ok)

        # Not asyncio.to_thread: a close that hangs must not hold the loop's executor
        # (and the interpreter's exit) with it.
        threading.Thread(target=run, name="rbd-close", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), self._io_timeout)
        except TimeoutError:
            log.error(
                "RBD image %s/%s: close did not finish in %g s; left to librbd",
                self._pool,
                self._name,
                self._io_timeout,
            )
            self._state = DeviceState.CLOSED
            return
        self._state = DeviceState.CLOSED
        self._conn.release()

    def close_sync(self) -> None:
        """close() without an event loop (blocking, without a time limit)."""
        if self._closing:
            return
        self._closing = True
        self._close_image()
        self._state = DeviceState.CLOSED
        self._conn.release()

    def _close_image(self) -> bool:
        # Also for a fenced client: librbd closes a blocklisted image at once, and an
        # image must be closed before its cluster connection is shut down.
        self._stop_watch()
        try:
            self._image.close()
        except Exception as exc:
            log.warning("RBD image %s/%s: close: %s", self._pool, self._name, exc)
            return False
        return True

    async def __aenter__(self) -> RbdDevice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closing:
            raise OSError(errno.EBADF, f"RBD image {self._pool}/{self._name} is closed")

    def _writable(self) -> None:
        self._open()
        if self._read_only:
            raise OSError(errno.EROFS, f"RBD image {self._pool}/{self._name} is read-only")

    async def _submit(
        self, what: str, start: Callable[[Callable[..., None]], Any], with_data: bool = False
    ) -> Any:
        """Start one aio request and wait for its completion (or `io_timeout`)."""
        self._open()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(rc: int, data: Any) -> None:  # on the loop's thread
            if fut.done():
                return  # timed out before: the late completion changes nothing
            if rc < 0:
                fut.set_exception(self._failure(what, -rc))
            else:
                fut.set_result(data)

        # librbd's thread: only hand over to the loop (the completion object's return
        # value is read here, while it is certainly alive).
        def hand_over(rc: int, data: Any) -> None:
            # A completion after the loop closed (a request that outlived its device's
            # target) has nobody to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, rc, data)

        if with_data:

            def done(completion: Any, data: Any) -> None:
                hand_over(completion.get_return_value(), data)
        else:

            def done(completion: Any) -> None:
                hand_over(completion.get_return_value(), None)

        rbd = bindings()[1]
        try:
            start(done)
        except rbd.Error as exc:
            raise self._failure(what, abs(getattr(exc, "errno", None) or errno.EIO)) from None
        self._inflight += 1
        timer = loop.call_later(self._io_timeout, self._timed_out, fut, what)
        try:
            result = await fut
        finally:
            self._inflight -= 1
            timer.cancel()
        if self._state is DeviceState.UNREACHABLE:
            self._set_state(DeviceState.OK)  # a request completed: the cluster answers again
        return result

    def _timed_out(self, fut: asyncio.Future[Any], what: str) -> None:
        if fut.done():
            return
        self._set_state(DeviceState.UNREACHABLE)
        fut.set_exception(
            StorageUnavailable(
                errno.ETIMEDOUT,
                f"RBD {what} on {self._pool}/{self._name}: no answer from the cluster in "
                f"{self._io_timeout:g} s",
            )
        )

    def _failure(self, what: str, code: int) -> OSError:
        message = f"RBD {what} on {self._pool}/{self._name}: {errno.errorcode.get(code, code)}"
        if code == errno.ESHUTDOWN:  # EBLOCKLISTED: this client was fenced
            self._set_state(DeviceState.FENCED)
            return StorageUnavailable(code, message + " (this client is blocklisted)")
        if code == errno.ETIMEDOUT:  # rados_osd_op_timeout, if the configuration sets one
            self._set_state(DeviceState.UNREACHABLE)
            return StorageUnavailable(code, message)
        return OSError(code, message)


def parse_image_spec(text: str) -> tuple[str, str]:
    """'POOL/IMAGE' (or 'IMAGE', in the pool 'rbd') -> (pool, image)."""
    pool, sep, image = text.partition("/")
    if not sep:
        pool, image = DEFAULT_POOL, text
    if not pool or not image or "/" in image:
        raise ValueError(f"{text!r} is not POOL/IMAGE")
    return pool, image
