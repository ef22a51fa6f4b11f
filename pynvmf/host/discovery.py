"""Discovery: ask a discovery controller which subsystems a host may connect to."""

from __future__ import annotations

from typing import Any

from pynvmf.host.controller import Controller, connect
from pynvmf.host.errors import NvmeError
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN

# The log changed under us this many times in a row: give up rather than loop.
_GENCTR_RETRIES = 10

# A log entry's TRTYPE as connect()'s `trtype`: the transports the host library speaks.
_ENTRY_TRTYPES: dict[int, str] = {L.TrType.TCP: "tcp", L.TrType.RDMA: "rdma"}


def entry_trtype(entry: L.DiscoveryLogEntry) -> str:
    """The `trtype` connect() takes for what `entry` lists ("tcp" or "rdma"); ValueError
    for a transport the host library does not speak (FC, loop)."""
    trtype = _ENTRY_TRTYPES.get(entry.trtype)
    if trtype is None:
        raise ValueError(f"trtype: the host library cannot connect to TRTYPE {entry.trtype}")
    return trtype


async def connect_entry(entry: L.DiscoveryLogEntry, **options: Any) -> Controller:
    """connect() to the subsystem a discovery log entry lists, over the transport it names
    (its TRTYPE, TRADDR, TRSVCID and SUBNQN); `options` are connect()'s others."""
    trtype = entry_trtype(entry)
    try:
        port = int(entry.trsvcid)
    except ValueError:
        raise ValueError(f"trsvcid: {entry.trsvcid!r} is not a port number") from None
    return await connect(entry.traddr, port, entry.subnqn, trtype=trtype, **options)


async def discover(
    address: str,
    port: int,
    *,
    hostnqn: str | None = None,
    hostid: bytes | None = None,
    timeout: float = 10.0,
    trtype: str = "tcp",
) -> list[L.DiscoveryLogEntry]:
    """Connect to the discovery subsystem at address:port (IPv4 or IPv6) over `trtype`
    ("tcp" or "rdma", as connect()), read the whole Discovery log page and disconnect;
    its entries."""
    page = await read_discovery_log(
        address, port, hostnqn=hostnqn, hostid=hostid, timeout=timeout, trtype=trtype
    )
    return page.entries


async def read_discovery_log(
    address: str,
    port: int,
    *,
    hostnqn: str | None = None,
    hostid: bytes | None = None,
    timeout: float = 10.0,
    trtype: str = "tcp",
) -> L.DiscoveryLogPage:
    """As discover(), the whole page: its entries and its generation counter."""
    ctrl = await connect(
        address,
        port,
        DISCOVERY_NQN,
        hostnqn=hostnqn,
        hostid=hostid,
        queues=0,
        kato_ms=0,
        timeout=timeout,
        trtype=trtype,
    )
    async with ctrl:
        for _ in range(_GENCTR_RETRIES):
            header = L.DiscoveryLogHeader.unpack(
                await ctrl.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE, rae=True)
            )
            size = L.DISC_HEADER_SIZE + header.numrec * L.DISC_ENTRY_SIZE
            page = L.DiscoveryLogPage.unpack(
                await ctrl.get_log_page(L.LogPageId.DISCOVERY, size, rae=True)
            )
            # The page is read in pieces; an unchanged GENCTR says they belong together.
            if page.genctr == header.genctr:
                return page
    raise NvmeError(f"discovery log at {address} port {port} kept changing while read")
