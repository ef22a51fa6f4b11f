"""What the SPDK-compatible methods do alike: refuse a target name (pynvmf has one
target), check a transport type, and make a change of the Target, naming its error in
the method's own parameter names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from pynvmf.config.spdk import SPDK_TRTYPES
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


def check_trtype(p: Params, key: str = "trtype", served: tuple[str, ...] = ("tcp", "rdma")) -> str:
    """The transport type `key` names, as a Port.trtype; the error names the field when it
    is not one of `served`."""
    trtype = p.string(key)
    ours = SPDK_TRTYPES.get(trtype.upper())
    if ours not in served:
        names = " and ".join(name for name, t in SPDK_TRTYPES.items() if t in served)
        raise RpcError(INVALID_PARAMS, f"{p.name(key)}: {trtype!r}: pynvmf serves {names} only")
    return ours


def listen_trid(
    p: Params, key: str, served: tuple[str, ...] = ("tcp", "rdma")
) -> tuple[str, str, int]:
    """A transport ID object (SPDK's listen_address) as a Port.trtype, an IP address and a
    port number."""
    a = p.nested(key)
    assert a is not None
    trtype = check_trtype(a, served=served)
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
        raise RpcError(INVALID_PARAMS, f"{a.name('trsvcid')}: {trsvcid!r} is not a port number")
    return trtype, traddr, int(trsvcid)


def listen_address(p: Params, key: str) -> tuple[str, int]:
    """An NVMe/TCP transport ID object (a referral's address) as an IP address and a TCP
    port."""
    _, traddr, trsvcid = listen_trid(p, key, served=("tcp",))
    return traddr, trsvcid
