"""The channel between the target's main process and one worker process.

One SOCK_SEQPACKET Unix socket pair per worker: every message is one packet (the
kernel keeps the boundaries, so no framing of our own), and a packet may carry
file descriptors (SCM_RIGHTS): a host's TCP connection, a memory namespace's memfd.
A message is a pickled (kind, id, args) tuple. Pickle is safe here because both
ends are this program and the socket pair is reachable by no one else (it is
created by the main process and inherited by the worker it spawns, never bound to
an address).

A message with an id > 0 is a request: the other end answers it with a "reply"
message carrying the id and (error, value). The channel never blocks its event
loop: output that the socket cannot take now waits in a queue for writability.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import pickle
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

# One message at most (a namespace snapshot with a reservation state of 1024
# registrants is well under it); the socket buffers are raised to match.
MAX_MESSAGE = 1 << 20
MAX_FDS = 16
REPLY = "reply"

Handler = Callable[[str, tuple[Any, ...], list[int]], Any]


class RemoteError(RuntimeError):
    """The other end failed a request (the text is its exception)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(main end, worker end), both close-on-exec; the worker end is made inheritable
    by whoever passes it to the worker."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_MESSAGE)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * MAX_MESSAGE)
    return a, b


class Channel:
    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        on_closed: Callable[[], None],
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._handler = handler
        self._on_closed = on_closed
        self._out: deque[tuple[bytes, list[int]]] = deque()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 1
        self._writing = False
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop.add_reader(sock.fileno(), self._readable)

    # -- output ----------------------------------------------------------------------

    def send(self, kind: str, *args: Any, fds: list[int] | None = None) -> None:
        """A message that wants no answer. The channel owns `fds` (closes them once sent);
        a message to a closed channel is dropped."""
        self._queue(pickle.dumps((kind, 0, args), pickle.HIGHEST_PROTOCOL), fds or [])

    def request(self, kind: str, *args: Any, fds: list[int] | None = None) -> asyncio.Future[Any]:
        """A message whose answer the returned future gets (ConnectionError if the other
        end goes away first, RemoteError if it failed the request)."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self.closed:
            for fd in fds or []:
                os.close(fd)
            fut.set_exception(ConnectionError("worker channel closed"))
            return fut
        ident = self._next_id
        self._next_id += 1
        self._pending[ident] = fut
        self._queue(pickle.dumps((kind, ident, args), pickle.HIGHEST_PROTOCOL), fds or [])
        return fut

    def _queue(self, data: bytes, fds: list[int]) -> None:
        if self.closed:
            for fd in fds:
                os.close(fd)
            return
        if len(data) > MAX_MESSAGE:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a message of {len(data)} bytes is more than {MAX_MESSAGE}")
        self._out.append((data, fds))
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        out = self._out
        while out:
            data, fds = out[0]
            try:
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    self.sock.sendmsg([data], anc)
                else:
                    self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError as exc:
                log.debug("worker channel: send failed: %s", exc)
                self.close()
                return
            out.popleft()
            for fd in fds:
                os.close(fd)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    # -- input -----------------------------------------------------------------------

    def _readable(self) -> None:
        space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        while not self.closed:
            try:
                data, anc, flags, _addr = self.sock.recvmsg(MAX_MESSAGE, space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("worker channel: receive failed: %s", exc)
                self.close()
                return
            fds: list[int] = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
                    fds.extend(arr)
            if not data:
                for fd in fds:
                    os.close(fd)
                self.close()
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for fd in fds:
                    os.close(fd)
                log.error("worker channel: a truncated message; closing the channel")
                self.close()
                return
            self._dispatch(data, fds)

    def _dispatch(self, data: bytes, fds: list[int]) -> None:
        kind, ident, args = pickle.loads(data)
        if kind == REPLY:
            fut = self._pending.pop(ident, None)
            if fut is not None and not fut.done():
                error, value = args
                if error is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(RemoteError(error))
            return
        try:
            result = self._handler(kind, args, fds)
        except Exception as exc:
            log.exception("worker channel: %s failed", kind)
            if ident:
                self._reply(ident, exc, None)
            return
        if isinstance(result, Awaitable):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._finished(t, ident))
        elif ident:
            self._reply(ident, None, result)

    def _finished(self, task: asyncio.Task[Any], ident: int) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            error: BaseException | None = ConnectionError("cancelled")
            value = None
        else:
            error = task.exception()
            value = None if error is not None else task.result()
            if error is not None and not isinstance(error, ConnectionError):
                log.error("worker channel: a request failed: %r", error)
        if ident:
            self._reply(ident, error, value)

    def _reply(self, ident: int, error: BaseException | None, value: Any) -> None:
        self._queue(
            pickle.dumps(
                (REPLY, ident, (None if error is None else repr(error), value)),
                pickle.HIGHEST_PROTOCOL,
            ),
            [],
        )

    # -- teardown ----------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fileno = self.sock.fileno()
        if fileno >= 0:
            self._loop.remove_reader(fileno)
            if self._writing:
                self._loop.remove_writer(fileno)
        for _data, fds in self._out:
            for fd in fds:
                os.close(fd)
        self._out.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("worker channel closed"))
        self._pending.clear()
        self.sock.close()
        self._on_closed()


async def wait_all(futures: list[asyncio.Future[Any]]) -> None:
    """Until every answer came or its channel closed (a worker that died has nothing
    left to be consistent with)."""
    for fut in futures:
        with contextlib.suppress(ConnectionError):
            await fut
