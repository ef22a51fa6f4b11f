"""Discovery: ask a discovery controller which subsystems a host may connect to."""

from __future__ import annotations

from pynvmf.host.controller import connect
from pynvmf.host.errors import NvmeError
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN

# The log changed under us this many times in a row: give up rather than loop.
_GENCTR_RETRIES = 10


async def discover(
    address: str,
    port: int,
    *,
    hostnqn: str | None = None,
    hostid: bytes | None = None,
    timeout: float = 10.0,
) -> list[L.DiscoveryLogEntry]:
    """Connect to the discovery subsystem at address:port (IPv4 or IPv6), read the
    whole Discovery log page and disconnect; its entries."""
    page = await read_discovery_log(address, port, hostnqn=hostnqn, hostid=hostid, timeout=timeout)
    return page.entries


async def read_discovery_log(
    address: str,
    port: int,
    *,
    hostnqn: str | None = None,
    hostid: bytes | None = None,
    timeout: float = 10.0,
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
