"""The HTTP side of the Prometheus endpoint: `/metrics` on the target's event loop.

Why asyncio and not prometheus-client's threaded server: the collector reads the
target's dictionaries (controllers, ports, queues) that the event loop changes; read
from another thread, a scrape could see a change half made or fail on a dictionary
that changed size. Answering on the loop, between two callbacks, a scrape sees one
state and needs no lock on the hot path. prometheus-client still writes the exposition
(`generate_latest`); this module only answers HTTP/1.1 requests, one per connection.

A scraper gets at most MAX_CLIENTS connections at once and REQUEST_DEADLINE_S to send its
request head (at most MAX_HEAD bytes): a client that holds a connection open or sends
without end costs the target nothing lasting.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from pynvmf.metrics.labels import DEFAULT_HOST_LIMIT

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from pynvmf.metrics.collector import TargetCollector
    from pynvmf.target.target import Target

log = logging.getLogger(__name__)

PATH = "/metrics"
MAX_HEAD = 8192
MAX_CLIENTS = 16
REQUEST_DEADLINE_S = 10.0


class MetricsListenError(OSError):
    """The endpoint could not listen where it was asked to (the address, and why)."""

    def __str__(self) -> str:
        return str(self.strerror)


class MetricsEndpoint:
    """Serves a Target's metrics at `/metrics` once `listen` is called; `close` stops."""

    def __init__(self, target: Target, *, host_limit: int = DEFAULT_HOST_LIMIT) -> None:
        self.target = target
        self.host_limit = host_limit
        # Made by the first scrape (_collecting): prometheus-client is imported only by a
        # target that serves metrics, so one that does not runs on a Python without it
        # (the test guests' Debian Python runs `pynvmf target` from the tree).
        self._registry: tuple[CollectorRegistry, TargetCollector] | None = None
        self._server: asyncio.base_events.Server | None = None
        # Each scraper's connection, by the task that answers it.
        self._clients: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        # Where it listens (the port a request for port 0 got); None: it does not.
        self.address: tuple[str, int] | None = None

    async def listen(self, address: str, port: int) -> tuple[str, int]:
        """Listen on address:port (instead of where it listened before, which it stops
        only once the new one is open: a refused move leaves the old one serving)."""
        try:
            server = await asyncio.start_server(
                self._client, address, port, limit=MAX_HEAD, reuse_address=True
            )
        except OSError as exc:
            where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
            # asyncio's strerror repeats the address: the system's words are enough.
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise MetricsListenError(exc.errno, f"metrics endpoint {where}: {why}") from exc
        old, self._server = self._server, server
        if old is not None:
            old.close()
            await old.wait_closed()
        bound = server.sockets[0].getsockname()
        self.address = (bound[0], bound[1])
        log.info("metrics at http://%s:%d%s", address, self.address[1], PATH)
        return self.address

    async def close(self) -> None:
        server, self._server = self._server, None
        self.address = None
        if server is not None:
            server.close()
        # Their connections end (a cancelled task would be logged as an error by the
        # stream machinery); each task then finishes as with a scraper that went away.
        for writer in self._clients.values():
            writer.transport.abort()
        if self._clients:
            await asyncio.gather(*self._clients, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    @property
    def clients(self) -> int:
        """Scrapers connected now."""
        return len(self._clients)

    @property
    def collector(self) -> TargetCollector:
        """What reads the target for a scrape."""
        return self._collecting()[1]

    def _collecting(self) -> tuple[CollectorRegistry, TargetCollector]:
        if self._registry is None:
            from prometheus_client.registry import CollectorRegistry

            from pynvmf.metrics.collector import TargetCollector

            registry = CollectorRegistry(auto_describe=False)
            collector = TargetCollector(self.target, host_limit=self.host_limit)
            registry.register(collector)
            self._registry = (registry, collector)
        return self._registry

    def exposition(self) -> bytes:
        """The text exposition, as a scrape gets it."""
        from prometheus_client import generate_latest

        return generate_latest(self._collecting()[0])

    def answer(self, head: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for a request head."""
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "text/plain", b"bad request\n"
        method, target = parts[0], parts[1]
        if target.split("?", 1)[0] != PATH:
            return 404, "text/plain", b"not found: the metrics are at /metrics\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        try:
            body = self.exposition()
        except Exception:  # a collector's fault: the scrape fails, never the target
            log.exception("collecting the metrics failed")
            return 500, "text/plain", b"collecting the metrics failed\n"
        from prometheus_client import CONTENT_TYPE_LATEST

        return 200, CONTENT_TYPE_LATEST, b"" if method == "HEAD" else body

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._clients) >= MAX_CLIENTS or task is None:
            writer.close()
            return
        self._clients[task] = writer
        try:
            async with asyncio.timeout(REQUEST_DEADLINE_S):
                head = await reader.readuntil(b"\r\n\r\n")
                status, content_type, body = self.answer(head)
                writer.write(
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                    f"Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n".encode("ascii")
                )
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass  # a client that went away or sent too much: nothing to answer
        finally:
            self._clients.pop(task, None)
            writer.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}
