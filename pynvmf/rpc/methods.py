"""The method table and parameter decoding shared by every RPC method.

`Params` reads one method's parameters with the types SPDK's decoders use and
fails with the parameter's full name (`namespace.nsid`, `listen_address.traddr`).
`ControlPlane` is what methods run against: the Target, and what the RPC layer keeps
for itself (whether SPDK's transport was created, how to stop the process).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, RpcError
from pynvmf.target.changes import ChangeError
from pynvmf.target.target import Target
from pynvmf.tcp.config import TransportConfig

_MISSING = object()


class Params:
    """One method's parameters. Every key must be read (or `ignore`d) before `done`,
    which refuses what was not: an unknown key is named, never silently dropped."""

    def __init__(self, params: Mapping[str, Any], prefix: str = "") -> None:
        if not isinstance(params, Mapping):
            raise RpcError(INVALID_PARAMS, f"{prefix.rstrip('.') or 'params'}: must be an object")
        self._params = params
        self._prefix = prefix
        self._read: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def _get(self, key: str, required: bool) -> Any:
        self._read.add(key)
        value = self._params.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                raise RpcError(INVALID_PARAMS, f"{self.name(key)}: missing")
            return _MISSING
        return value

    def string(self, key: str, default: Any = _MISSING, *, required: bool = False) -> Any:
        value = self._get(key, required or default is _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {value!r} is not a string")
        return value

    def integer(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        low: int = 0,
        high: int = (1 << 64) - 1,
    ) -> Any:
        value = self._get(key, default is _MISSING)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {value!r} is not an integer")
        if not low <= value <= high:
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {value} not in {low}..{high}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default is _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {value!r} is not a boolean")
        return value

    def uuid_value(self, key: str) -> uuid.UUID | None:
        text = self.string(key, None)
        if text is None:
            return None
        try:
            return uuid.UUID(text)
        except ValueError:
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {text!r} is not a UUID") from None

    def hex_bytes(self, key: str, size: int) -> bytes | None:
        text = self.string(key, None)
        if text is None:
            return None
        try:
            value = bytes.fromhex(text.replace("-", ""))
        except ValueError:
            value = b""
        if len(value) != size:
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {text!r} is not {size} bytes in hex")
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self._get(key, False)
        if value is _MISSING:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: not a list of strings")
        return value

    def string_map(self, key: str) -> dict[str, str] | None:
        """An object of string values (SPDK's key=value maps), or None when absent."""
        value = self._get(key, False)
        if value is _MISSING:
            return None
        if not isinstance(value, Mapping):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: must be an object")
        for k, v in value.items():
            if not isinstance(v, str):
                raise RpcError(INVALID_PARAMS, f"{self.name(key)}.{k}: {v!r} is not a string")
        return {str(k): v for k, v in value.items()}

    def value(self, key: str) -> Any:
        """A parameter of any JSON type, for a caller that checks it itself (None when
        absent)."""
        value = self._get(key, False)
        return None if value is _MISSING else value

    def nested(self, key: str, *, required: bool = True) -> Params | None:
        value = self._get(key, required)
        if value is _MISSING:
            return None
        return Params(value, f"{self.name(key)}.")

    def ignore(self, *keys: str) -> None:
        """Keys accepted for compatibility that change nothing pynvmf does."""
        self._read.update(keys)

    def refuse_unless(self, key: str, allowed: Iterable[Any], why: str) -> None:
        """Accept `key` only absent or with a value pynvmf honours (what it does anyway)."""
        self._read.add(key)
        value = self._params.get(key)
        if value is not None and value not in list(allowed):
            raise RpcError(INVALID_PARAMS, f"{self.name(key)}: {value!r}: {why}")

    def done(self) -> None:
        unknown = sorted(set(self._params) - self._read)
        if unknown:
            raise RpcError(INVALID_PARAMS, f"{self.name(unknown[0])}: unknown parameter")


Method = Callable[["ControlPlane", Params], Awaitable[Any]]


@dataclass
class MethodTable:
    methods: dict[str, Method] = field(default_factory=dict)

    def register(self, name: str) -> Callable[[Method], Method]:
        def add(method: Method) -> Method:
            self.methods[name] = method
            return method

        return add


@dataclass
class ControlPlane:
    """What RPC methods act on. Calls are serialised: one change at a time, whichever
    connection it comes from, so every change sees the one before it complete."""

    target: Target
    table: MethodTable
    # SPDK creates its transport once (nvmf_create_transport); pynvmf's exists from the
    # start, and this says whether a client has created it, as SPDK would refuse twice.
    transport_created: bool = False
    # The RDMA transport once nvmf_create_transport -t RDMA made it: the options its new
    # rdma listeners open with (None: not created; rdma ports opened otherwise, by
    # --listen or a configuration, have the target's).
    rdma_transport: TransportConfig | None = None
    # Stops the process (spdk_kill_instance); None: the method is refused.
    shutdown: Callable[[], None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # bdev_rbd_register_cluster's clusters by name: (how to reach it, the connection
    # held open for it until bdev_rbd_unregister_cluster).
    rbd_clusters: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # Awaited after every method, still in turn: a gateway's shared configuration
    # (pynvmf.ha.shared) writes what the method changed, so that the method returns once
    # its change is shared with the other gateways. None: nothing to wait for.
    settle: Callable[[], Awaitable[None]] | None = None
    # The Prometheus endpoint (pynvmf_metrics_listen); None: the methods are refused.
    metrics: MetricsEndpoint | None = None

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        handler = self.table.methods.get(method)
        if handler is None:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")
        async with self.lock:
            try:
                return await handler(self, Params(params))
            finally:
                if self.settle is not None:
                    await self.settle()


def change_error(exc: ChangeError, names: Mapping[str, str]) -> RpcError:
    """A Target's refusal as a JSON-RPC error naming the method's own parameter."""
    return RpcError(INVALID_PARAMS, f"{names.get(exc.field, exc.field)}: {exc.reason}")
