"""Ports: the addresses the target listens on for NVMe/TCP, what each exposes, and
opening one.

A port's secure channel follows nvmet's addr_tsas and addr_treq: "none" (plain
NVMe/TCP only), "required" (TLS 1.3 only) or "optional" (TLS 1.3 or plain, told apart
by the connection's first byte, as nvmet does with treq "not required").
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.changes import ChangeError, check_transport
from pynvmf.tcp.target import TransportConfig
from pynvmf.tls.channel import KTLS_POLICIES

if TYPE_CHECKING:
    from pynvmf.target.protocol import TargetProtocol

log = logging.getLogger(__name__)


class SecureChannelPolicy(enum.StrEnum):
    """Whether a port's connections run over TLS 1.3. Its values are the names the
    configuration formats and RPCs use."""

    NONE = "none"
    REQUIRED = "required"
    OPTIONAL = "optional"


SECURE_CHANNELS = tuple(policy.value for policy in SecureChannelPolicy)
# The transports a port may listen on.
TRTYPES = ("tcp", "rdma")


class Listener(Protocol):
    """What the target asks of an open port's listener when the port closes."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


@dataclass(eq=False)
class Port:
    """A listener. An I/O port exposes subsystems (all of them, or the NQNs listed); a
    discovery-only port answers the discovery subsystem alone. Compared by identity:
    two Port objects are two listeners."""

    address: str
    port: int
    portid: int = 0
    subsystems: list[str] | None = None
    discovery_only: bool = False
    transport: TransportConfig = field(default_factory=TransportConfig)
    # The transport hosts reach it by: "tcp" (NVMe/TCP) or "rdma" (NVMe/RDMA over the RDMA
    # CM, pynvmf/rdma/; needs rdma-core's pyverbs and an RDMA device: docs/rdma.md).
    trtype: str = "tcp"
    # Asked for as a listener of the discovery subsystem: when the last subsystem leaves
    # an I/O port with a list of subsystems, the port stays as a discovery-only port
    # rather than closing.
    discovery_listener: bool = False
    # The address the discovery log gives for this port, when hosts reach it by another
    # than the one it listens on (NAT, a VM's user-mode network): "" means its own.
    advertise: str = ""
    # Configurations and RPCs give its name: check_port makes it the policy.
    secure_channel: SecureChannelPolicy = SecureChannelPolicy.NONE
    # Whether a TLS connection's record layer may move into the kernel ("auto") or stays
    # in user space ("off", for measurements and for kernels whose kTLS misbehaves).
    ktls: str = "auto"
    connections: set[TargetProtocol] = field(default_factory=set, repr=False, compare=False)
    # What listens: a TCP port's asyncio Server, an rdma port's RDMA CM listener.
    server: Listener | None = field(default=None, repr=False, compare=False)

    @property
    def offers_tls(self) -> bool:
        return self.secure_channel != SecureChannelPolicy.NONE

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.address

    def exposes(self, nqn: str) -> bool:
        if nqn == DISCOVERY_NQN:
            return True
        if self.discovery_only:
            return False
        return self.subsystems is None or nqn in self.subsystems

    def same_address(self, address: str, port: int) -> bool:
        return self.port == port and normal_address(self.address) == normal_address(address)

    def __str__(self) -> str:
        where = endpoint(self.address, self.port)
        return where if self.trtype == "tcp" else f"{self.trtype}:{where}"


def endpoint(address: str, port: int) -> str:
    """ "address:port", an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def normal_address(address: str) -> str:
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address


def check_port(port: Port, existing: Iterable[Port]) -> None:
    """Whether `port` can be opened beside the `existing` ones; its list of subsystems
    loses repeated NQNs."""
    try:
        ip = ipaddress.ip_address(port.address)
    except ValueError:
        raise ChangeError("address", f"{port.address!r} is not an IP address") from None
    if (":" in port.address) != (ip.version == 6):
        raise ChangeError("address", f"{port.address!r} is not an IP address")
    if port.advertise:
        try:
            ipaddress.ip_address(port.advertise)
        except ValueError:
            raise ChangeError("advertise", f"{port.advertise!r} is not an IP address") from None
    if not isinstance(port.port, int) or not 0 <= port.port <= 0xFFFF:
        raise ChangeError("port", f"{port.port!r} is not a TCP port")
    if port.trtype not in TRTYPES:
        raise ChangeError("trtype", f"{port.trtype!r} is not one of {TRTYPES}")
    if port.port and any(
        other.trtype == port.trtype and other.same_address(port.address, port.port)
        for other in existing
    ):
        raise ChangeError("port", f"the target already listens on {port}")
    if port.subsystems is not None:
        port.subsystems = list(dict.fromkeys(port.subsystems))
    port.secure_channel = secure_channel_policy(port.secure_channel)
    if port.trtype != "tcp" and port.offers_tls:
        raise ChangeError("secure_channel", "TLS is NVMe/TCP's: an rdma port has none")
    if port.ktls not in KTLS_POLICIES:
        raise ChangeError("ktls", f"{port.ktls!r} is not one of {KTLS_POLICIES}")
    check_transport(port.transport)


def secure_channel_policy(name: str) -> SecureChannelPolicy:
    """The policy `name` names (a ChangeError if none does)."""
    try:
        return SecureChannelPolicy(name)
    except ValueError:
        raise ChangeError("secure_channel", f"{name!r} is not one of {SECURE_CHANNELS}") from None


async def listen(port: Port, protocol: Callable[[], asyncio.BaseProtocol]) -> None:
    """Open `port` (its number becomes the one bound, for port 0), each connection
    served by a new `protocol()`; an rdma port by the RDMA CM (pynvmf/rdma/verbs.py)."""
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(
            protocol,
            host=port.address,
            port=port.port,
            reuse_address=True,
            family=socket.AF_INET6 if port.is_ipv6 else socket.AF_INET,
        )
    except OSError as exc:
        raise ChangeError("address", f"cannot listen on {port}: {exc.strerror or exc}") from exc
    port.port = server.sockets[0].getsockname()[1]
    port.server = server
    log.info("listening on %s%s", port, " (discovery)" if port.discovery_only else "")
