"""What the SPDK-compatible methods do alike: refuse a target name (pynvmf has one
target), check a transport type, and make a change of the Target, naming its error in
the method's own parameter names.
"""

from __future__ import annotations

import ipaddress
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


def listen_address(p: Params, key: str) -> tuple[str, int]:
    """A transport ID object (SPDK's listen_address, a referral's address) as an IP
    address and a TCP port."""
    a = p.nested(key)
    assert a is not None
    check_trtype(a)
    adrfam = a.string("adrfam", "ipv4")
    traddr = a.string("traddr")
    trsvcid = a.string("trsvcid")
    a.done()
    try:
        ip = ipaddress.ip_address(traddr)
    except ValueError:
        raise RpcError(
            INVALID_PARAMS, f"{a.name('traddr')}: {traddr!r} is not an IP address"
        ) from None
    if adrfam.lower() not in ("ipv4", "ipv6"):
        raise RpcError(
            INVALID_PARAMS, f"{a.name('adrfam')}: {adrfam!r}: pynvmf serves IPv4 and IPv6"
        )
    if adrfam.lower() != f"ipv{ip.version}":
        raise RpcError(INVALID_PARAMS, f"{a.name('adrfam')}: {adrfam} does not match {traddr}")
    if not trsvcid.isdigit() or not 1 <= int(trsvcid) <= 0xFFFF:
        raise RpcError(INVALID_PARAMS, f"{a.name('trsvcid')}: {trsvcid!r} is not a TCP port")
    return traddr, int(trsvcid)
