"""What the SPDK-compatible methods do alike: refuse a target name (pynvmf has one
target), check a transport type, and make a change of the Target, naming its error in
the method's own parameter names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import Params, change_error
from pynvmf.target.changes import ChangeError


def no_target_name(p: Params) -> None:
    p.refuse_unless("tgt_name", (), "pynvmf has one target, and it has no name")


async def apply_change(change: Awaitable[Any], names: dict[str, str]) -> Any:
    try:
        return await change
    except ChangeError as exc:
        raise change_error(exc, names) from exc


def change_now(call: Callable[[], Any], names: dict[str, str]) -> Any:
    try:
        return call()
    except ChangeError as exc:
        raise change_error(exc, names) from exc


def check_trtype(p: Params, key: str = "trtype") -> None:
    trtype = p.string(key)
    if trtype.upper() != "TCP":
        raise RpcError(INVALID_PARAMS, f"{p.name(key)}: {trtype!r}: pynvmf serves NVMe/TCP only")
