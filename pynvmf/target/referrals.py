"""Discovery referrals: other discovery controllers (or a subsystem elsewhere) the
target's discovery log points hosts to, as SPDK's nvmf_discovery_add_referral makes
them; what may be referred to, and when two referrals are the same one."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from pynvmf.spec.nqn import nqn_problem
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.changes import ChangeError
from pynvmf.target.port import Port, endpoint, normal_address


@dataclass(frozen=True)
class Referral:
    address: str
    port: int
    # The discovery subsystem there (a referral proper, subtype 1h), or a subsystem
    # (an NVM subsystem entry, subtype 2h), as SPDK decides by the NQN.
    subnqn: str = DISCOVERY_NQN
    # The host must use a secure channel (TLS) to reach it.
    secure_channel: bool = False

    @property
    def is_discovery(self) -> bool:
        return self.subnqn == DISCOVERY_NQN

    def same(self, address: str, port: int, subnqn: str) -> bool:
        """Whether this is the referral to address:port and subnqn (SPDK compares the
        transport ID: the secure channel is not part of it)."""
        return (
            self.port == port
            and normal_address(self.address) == normal_address(address)
            and self.subnqn == subnqn
        )

    def __str__(self) -> str:
        return f"{endpoint(self.address, self.port)} {self.subnqn}"


def check_referral(referral: Referral, own_ports: Iterable[Port]) -> None:
    """Refuse a referral a host could not follow, or one that points back at this target
    (a host following it would loop back to where it started)."""
    try:
        ip = ipaddress.ip_address(referral.address)
    except ValueError:
        raise ChangeError("address", f"{referral.address!r} is not an IP address") from None
    if ip.is_unspecified:
        raise ChangeError("address", f"{referral.address} is not an address a host can reach")
    if not 1 <= referral.port <= 0xFFFF:
        raise ChangeError("port", f"{referral.port!r} is not a TCP port")
    problem = nqn_problem(referral.subnqn)
    if problem:
        raise ChangeError("subnqn", f"{referral.subnqn!r} is not a valid NQN: {problem}")
    for port in own_ports:
        if port.port != referral.port:
            continue
        wildcard = ipaddress.ip_address(port.address).is_unspecified
        # A wildcard listener is reached through every local address; the loopback ones
        # are the only ones known to be local without asking the system.
        if port.same_address(referral.address, referral.port) or (wildcard and ip.is_loopback):
            raise ChangeError(
                "address",
                f"{endpoint(referral.address, referral.port)} is this target's own listener {port}",
            )
