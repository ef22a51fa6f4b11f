"""JSON-RPC 2.0 as SPDK's rpc.py speaks it, sans-I/O.

On the stream, JSON texts follow each other with no length prefix or separator
(rpc.py puts a newline between the requests it batches, the server a newline
after each response). `JsonStream` cuts the stream into texts as bytes arrive;
`Dispatcher` turns one text (a request, or a batch of them) into the text of its
response, if any. Requests on one connection are answered in order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# JSON-RPC 2.0 error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

MAX_MESSAGE = 16 << 20  # a request larger than this is refused and its connection closed

_WHITESPACE = b" \t\r\n"


class RpcError(Exception):
    """An error response: a JSON-RPC code and a message (naming the parameter at fault)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class MalformedStream(Exception):
    """The stream holds something that is not JSON (or too much of it): the connection
    gets a parse error response and is closed."""


class JsonStream:
    """Cuts a byte stream into complete top-level JSON objects or arrays.

    Only the structure is tracked (nesting outside strings); json.loads parses each
    complete text. UTF-8's multi-byte sequences never hold ASCII bytes, so scanning
    bytes is safe. A top-level value that is not an object or an array cannot be a
    request and is malformed here.
    """

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._limit = limit
        self._pos = 0  # where scanning resumes
        self._start = -1  # where the current text starts, -1 before it does
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, data: bytes) -> list[bytes]:
        """Add `data`; the complete texts it finished (raises MalformedStream)."""
        self._buf += data
        texts = []
        buf = self._buf
        i = self._pos
        n = len(buf)
        while i < n:
            c = buf[i]
            if self._start < 0:
                if c in _WHITESPACE:
                    i += 1
                    continue
                if c not in b"{[":
                    raise MalformedStream(f"unexpected {bytes([c])!r} where a request starts")
                self._start = i
                self._depth = 1
                i += 1
                continue
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == 0x5C:  # backslash
                    self._escape = True
                elif c == 0x22:  # quote
                    self._in_string = False
                i += 1
                continue
            if c == 0x22:
                self._in_string = True
            elif c in b"{[":
                self._depth += 1
            elif c in b"}]":
                self._depth -= 1
                if self._depth == 0:
                    texts.append(bytes(buf[self._start : i + 1]))
                    self._start = -1
            i += 1
        # Drop what was consumed, keep the unfinished text.
        keep = self._start if self._start >= 0 else n
        if keep:
            del buf[:keep]
            if self._start >= 0:
                self._start = 0
        self._pos = len(buf)
        if len(buf) > self._limit:
            raise MalformedStream(f"a request of more than {self._limit} bytes")
        return texts


def parse(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedStream(str(exc)) from exc


Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


@dataclass
class Dispatcher:
    """Calls `handler(method, params)` for each request of a text, in order."""

    handler: Handler

    async def respond(self, message: Any) -> bytes | None:
        """The response text (newline terminated) to a parsed message, or None when
        there is nothing to send (notifications only)."""
        if isinstance(message, list):
            if not message:
                return _dump(_error(None, RpcError(INVALID_REQUEST, "empty batch")))
            responses = [r for r in [await self._one(m) for m in message] if r is not None]
            return _dump(responses) if responses else None
        response = await self._one(message)
        return None if response is None else _dump(response)

    async def _one(self, request: Any) -> dict[str, Any] | None:
        if not isinstance(request, dict):
            return _error(None, RpcError(INVALID_REQUEST, "a request is a JSON object"))
        rid = request.get("id")
        notification = "id" not in request
        if not isinstance(rid, str | int | float | type(None)) or isinstance(rid, bool):
            return _error(None, RpcError(INVALID_REQUEST, "id: must be a string or a number"))
        try:
            version = request.get("jsonrpc", "2.0")
            if version != "2.0":
                raise RpcError(INVALID_REQUEST, 'jsonrpc: must be "2.0"')
            method = request.get("method")
            if not isinstance(method, str):
                raise RpcError(INVALID_REQUEST, "method: must be a string")
            params = request.get("params", {})
            if params is None:
                params = {}
            if isinstance(params, list):
                raise RpcError(INVALID_PARAMS, "params: by name only (an object)")
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params: must be an object")
            result = await self.handler(method, params)
        except RpcError as exc:
            return None if notification else _error(rid, exc)
        except Exception as exc:
            log.exception("RPC method failed")
            return None if notification else _error(rid, RpcError(INTERNAL_ERROR, str(exc)))
        if notification:
            return None
        return {"jsonrpc": "2.0", "id": rid, "result": result}


def parse_error_response(reason: str) -> bytes:
    return _dump(_error(None, RpcError(PARSE_ERROR, f"parse error: {reason}")))


def _error(rid: Any, exc: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": exc.to_json()}


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"
