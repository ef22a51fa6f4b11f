"""A small JSON-RPC client for pynvmf's target (and SPDK's, which frames alike).

    with RpcClient("/var/tmp/pynvmf.sock") as rpc:
        rpc.call("bdev_malloc_create", num_blocks=2048, block_size=512)
        rpc.call("nvmf_subsystem_add_ns", nqn=NQN, namespace={"bdev_name": "Malloc0"})

The address is a Unix socket path, or HOST:PORT ([v6]:PORT) for the TCP RPC.
Blocking; one request at a time on one connection.
"""

from __future__ import annotations

import itertools
import json
import socket
from types import TracebackType
from typing import Any

from pynvmf.rpc.jsonrpc import JsonStream, MalformedStream

DEFAULT_TIMEOUT = 60.0


class RpcClientError(Exception):
    """The server answered with an error (code, message), or the exchange failed."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_address(address: str) -> tuple[int, Any]:
    """(socket family, address) for a Unix path or HOST:PORT."""
    if "/" in address or ":" not in address:
        return socket.AF_UNIX, address
    if address.startswith("["):
        host, _, port = address[1:].partition("]:")
        return socket.AF_INET6, (host, int(port))
    host, _, port = address.rpartition(":")
    return socket.AF_INET, (host, int(port))


class RpcClient:
    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        family, where = parse_address(address)
        self.address = address
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(where)
        except OSError as exc:
            self._sock.close()
            raise RpcClientError(f"cannot connect to {address}: {exc.strerror or exc}") from exc
        self._stream = JsonStream()
        self._pending: list[bytes] = []
        self._ids = itertools.count(1)

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def call(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """The result of `method`; RpcClientError for an error response."""
        merged = dict(params or {}, **kwargs)
        request: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": next(self._ids)}
        if merged:
            request["params"] = merged
        response = self.exchange(request)
        if not isinstance(response, dict):
            raise RpcClientError(f"unexpected response: {response!r}")
        if "error" in response:
            error = response["error"]
            raise RpcClientError(str(error.get("message")), error.get("code"))
        return response.get("result")

    def exchange(self, message: Any) -> Any:
        """Send one request (or batch) and return the parsed response as it came."""
        self.send_raw(json.dumps(message).encode())
        return self.receive()

    def send_raw(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise RpcClientError(f"{self.address}: {exc.strerror or exc}") from exc

    def receive(self) -> Any:
        while not self._pending:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise RpcClientError(f"{self.address}: no response in time") from None
            except OSError as exc:
                raise RpcClientError(f"{self.address}: {exc.strerror or exc}") from exc
            if not data:
                raise RpcClientError(f"{self.address}: connection closed")
            try:
                self._pending += self._stream.feed(data)
            except MalformedStream as exc:
                raise RpcClientError(f"{self.address}: malformed response: {exc}") from exc
        return json.loads(self._pending.pop(0))
