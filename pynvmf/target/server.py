"""The target: ports listening for NVMe/TCP, the subsystems behind them, discovery.

The asyncio glue here is deliberately thin: the protocol object moves bytes
between the socket and the sans-I/O TargetConnection and nothing else.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import cast

from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import Subsystem
from pynvmf.tcp.target import TargetConnection, TransportConfig

log = logging.getLogger(__name__)

NVME_TCP_PORT = 4420
DISCOVERY_PORT = 8009


@dataclass
class Port:
    """A listener. An I/O port exposes subsystems (all of them, or the NQNs listed);
    a discovery-only port answers the discovery subsystem alone."""

    address: str
    port: int
    portid: int = 0
    subsystems: list[str] | None = None
    discovery_only: bool = False
    transport: TransportConfig = field(default_factory=TransportConfig)

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.address

    def exposes(self, nqn: str) -> bool:
        if nqn == DISCOVERY_NQN:
            return True
        if self.discovery_only:
            return False
        return self.subsystems is None or nqn in self.subsystems

    def __str__(self) -> str:
        host = f"[{self.address}]" if self.is_ipv6 else self.address
        return f"{host}:{self.port}"


class Target:
    def __init__(self, subsystems: list[Subsystem], ports: list[Port]) -> None:
        self.subsystems: dict[str, Subsystem] = {}
        for subsystem in subsystems:
            if subsystem.nqn in self.subsystems or subsystem.nqn == DISCOVERY_NQN:
                raise ValueError(f"duplicate or reserved subsystem NQN {subsystem.nqn}")
            self.subsystems[subsystem.nqn] = subsystem
        self.discovery = Subsystem(DISCOVERY_NQN, model="pynvmf discovery")
        self.ports = ports
        for i, port in enumerate(ports, start=1):
            port.portid = port.portid or i
        self.genctr = 1
        self.started = time.monotonic()
        self._stopped = False
        self._servers: list[asyncio.base_events.Server] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for port in self.ports:
                server = await loop.create_server(
                    lambda port=port: TargetProtocol(self, port),
                    host=port.address,
                    port=port.port,
                    reuse_address=True,
                    family=socket.AF_INET6 if port.is_ipv6 else socket.AF_INET,
                )
                port.port = server.sockets[0].getsockname()[1]
                self._servers.append(server)
                log.info("listening on %s%s", port, " (discovery)" if port.discovery_only else "")
        except BaseException:
            await self.stop()
            raise
        self.started = time.monotonic()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for server in self._servers:
            server.close()
        for subsystem in [*self.subsystems.values(), self.discovery]:
            for ctrl in list(subsystem.controllers.values()):
                ctrl.destroy("target shutting down")
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for subsystem in self.subsystems.values():
            for ns in subsystem.namespaces.values():
                await ns.device.flush()
                await ns.device.close()

    def find_subsystem(self, nqn: str, port: Port) -> Subsystem | None:
        if not port.exposes(nqn):
            return None
        if nqn == DISCOVERY_NQN:
            return self.discovery
        return self.subsystems.get(nqn)

    # -- discovery ------------------------------------------------------------------------

    def discovery_log(self, hostnqn: str, queue: TargetQueue) -> bytes:
        """Every subsystem the host may use on every I/O port, then the discovery
        subsystem answering this request."""
        entries = []
        for port in self.ports:
            if port.discovery_only:
                continue
            for subsystem in self.subsystems.values():
                if port.exposes(subsystem.nqn) and subsystem.host_allowed(hostnqn):
                    entries.append(self._entry(port, subsystem.nqn, L.SubType.NVME, queue))
        entries.append(self._entry(queue.port, DISCOVERY_NQN, L.SubType.CURRENT_DISCOVERY, queue))
        return L.discovery_log(self.genctr, entries)

    def _entry(self, port: Port, nqn: str, subtype: int, queue: TargetQueue) -> L.DiscoveryLogEntry:
        address = port.address
        if not address or ipaddress.ip_address(address).is_unspecified:
            # A wildcard listener: tell the host the address it reached us on.
            address = queue.local_address
        return L.DiscoveryLogEntry(
            trtype=L.TrType.TCP,
            adrfam=L.AdrFam.IPV6 if ":" in address else L.AdrFam.IPV4,
            subtype=subtype,
            treq=L.Treq.NOT_REQUIRED | L.Treq.DISABLE_SQFLOW,
            portid=port.portid,
            cntlid=0xFFFF,
            asqsz=32,
            trsvcid=str(port.port),
            subnqn=nqn,
            traddr=address,
        )


class TargetProtocol(asyncio.BufferedProtocol):
    def __init__(self, target: Target, port: Port) -> None:
        self.target = target
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.conn = TargetConnection(port.transport, self._no_command, self._output_wanted)
        self.queue: TargetQueue | None = None
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    @staticmethod
    def _no_command(_req: object) -> None:
        raise AssertionError("command before connection_made")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sockname = transport.get_extra_info("sockname")
        peer = transport.get_extra_info("peername")
        log.debug("connection from %s on %s", peer, self.port)
        self.queue = TargetQueue(self.target, self.port, self.conn, sockname[0])
        self.conn.on_command = self.queue.on_command

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.data_received(nbytes)
        self._flush()

    def eof_received(self) -> bool:
        return False

    def _output_wanted(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self.conn.take_output()
        if out:
            transport.writelines(out)
        if self.conn.closing:
            transport.close()

    def pause_writing(self) -> None:
        # The host is not reading its completions: stop reading its commands.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn.established:
            # One line per connection: what the transport did, for users and for tests
            # that check offload decisions (in-capsule vs R2T, digests) made with real hosts.
            s = conn.stats
            queue = self.queue
            ctrl = queue.controller if queue is not None else None
            log.info(
                "connection closed: port=%s qid=%d cntlid=%d digests=%s%s commands=%d "
                "r2t=%d h2c_data=%d c2h_data=%d in_capsule_bytes=%d data_digest_errors=%d "
                "term_reqs=%d reason=%s",
                self.port,
                conn.qid,
                ctrl.cntlid if ctrl else 0,
                "h" if conn.hdgst else "-",
                "d" if conn.ddgst else "-",
                s.commands,
                s.r2t_sent,
                s.h2c_data_pdus,
                s.c2h_data_pdus,
                s.in_capsule_bytes,
                s.data_digest_errors,
                s.term_reqs_sent,
                conn.close_reason or "host closed",
            )
        conn.close("connection lost")
        if self.queue is not None:
            self.queue.connection_lost()
        self.transport = None
