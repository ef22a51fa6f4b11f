"""The RPC server: a Unix socket (mode 0600) and, only when asked, a TCP port.

Each connection reads JSON texts as they complete, answers them in order, and is
closed after a parse error (malformed JSON, or a text too large) without touching
any other connection. Calls from all connections are serialised by the control
plane's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from pathlib import Path

from pynvmf.rpc import pynvmf_methods, record_methods, spdk
from pynvmf.rpc.jsonrpc import Dispatcher, JsonStream, MalformedStream, parse, parse_error_response
from pynvmf.rpc.methods import ControlPlane, MethodTable
from pynvmf.target.target import Target

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/tmp/pynvmf.sock"
_READ_SIZE = 64 * 1024


def method_table() -> MethodTable:
    """Every method the server answers: SPDK's and pynvmf's own."""
    table = MethodTable()
    table.methods.update(spdk.table.methods)
    table.methods.update(pynvmf_methods.table.methods)
    table.methods.update(record_methods.table.methods)
    return table


def control_plane(target: Target, **kwargs: object) -> ControlPlane:
    return ControlPlane(target, method_table(), **kwargs)  # type: ignore[arg-type]


class RpcServer:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.dispatcher = Dispatcher(cp.call)
        self._servers: list[asyncio.base_events.Server] = []
        self._unix_path: str | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.tcp_address: tuple[str, int] | None = None

    async def listen_unix(self, path: str) -> None:
        """Listen on the Unix socket `path`, readable and writable by its owner only.

        A socket file left by a process that is gone is replaced; one that a live
        server answers on is not."""
        sock_path = Path(path)
        if sock_path.exists() or sock_path.is_symlink():
            if not stat.S_ISSOCK(sock_path.lstat().st_mode):
                raise OSError(f"{path} exists and is not a socket")
            if await _answers(path):
                raise OSError(f"{path}: another server is listening on it")
            sock_path.unlink()
        # The umask makes the socket 0600 from its creation: no window where it is not.
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._serve, path=path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._unix_path = path
        self._servers.append(server)
        log.info("RPC on %s", path)

    async def listen_tcp(self, address: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server = await asyncio.start_server(
            self._serve, host=address, port=port, family=family, reuse_address=True
        )
        self.tcp_address = server.sockets[0].getsockname()[:2]
        self._servers.append(server)
        log.info("RPC on TCP %s port %d", *self.tcp_address)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self._unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._unix_path)
            self._unix_path = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        stream = JsonStream()
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    return
                try:
                    texts = stream.feed(data)
                    for text in texts:
                        message = parse(text)
                        response = await self.dispatcher.respond(message)
                        if response is not None:
                            writer.write(response)
                            await writer.drain()
                except MalformedStream as exc:
                    log.info("RPC connection closed: %s", exc)
                    writer.write(parse_error_response(str(exc)))
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()


async def _answers(path: str) -> bool:
    try:
        _reader, writer = await asyncio.open_unix_connection(path)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
