"""The discovery log: what a host's discovery controller tells it about where the
target's subsystems are reached (every I/O port that exposes a subsystem the host may
use, the listeners other gateways told the target of, the referrals to other discovery
controllers, and the discovery subsystem answering), and how each port's secure channel
is described in it."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.port import Port, SecureChannelPolicy
from pynvmf.target.referrals import Referral

if TYPE_CHECKING:
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.target import Target

# A port's secure channel (port.py) as the log's TREQ says it.
_TREQ = {
    SecureChannelPolicy.NONE: L.Treq.NOT_SPECIFIED,
    SecureChannelPolicy.REQUIRED: L.Treq.REQUIRED,
    SecureChannelPolicy.OPTIONAL: L.Treq.NOT_REQUIRED,
}


def discovery_log(target: Target, hostnqn: str, queue: TargetQueue) -> bytes:
    """Every subsystem the host may use on every I/O port, the referrals (every host
    gets them, as SPDK gives them), then the discovery subsystem answering this
    request."""
    entries = []
    for port in target.ports:
        if port.discovery_only:
            continue
        for subsystem in target.subsystems.values():
            if port.exposes(subsystem.nqn) and subsystem.host_allowed(hostnqn):
                entries.append(_entry(port, subsystem.nqn, L.SubType.NVME, queue))
    for subsystem in target.subsystems.values():
        if subsystem.host_allowed(hostnqn):
            for address, port_number, portid in subsystem.peer_listeners:
                peer = Port(address, port_number, portid=portid)
                entries.append(_entry(peer, subsystem.nqn, L.SubType.NVME, queue))
    entries.extend(_referral_entry(r) for r in target.referrals)
    entries.append(_entry(queue.port, DISCOVERY_NQN, L.SubType.CURRENT_DISCOVERY, queue))
    return L.discovery_log(target.genctr, entries)


def _entry(port: Port, nqn: str, subtype: int, queue: TargetQueue) -> L.DiscoveryLogEntry:
    address = port.advertise or port.address
    if not address or ipaddress.ip_address(address).is_unspecified:
        # A wildcard listener: tell the host the address it reached us on.
        address = queue.local_address
    rdma = port.trtype == "rdma"
    return L.DiscoveryLogEntry(
        trtype=L.TrType.RDMA if rdma else L.TrType.TCP,
        adrfam=L.AdrFam.IPV6 if ":" in address else L.AdrFam.IPV4,
        subtype=subtype,
        # As nvmet reports a port: secure channel "not specified" (nvmet's default) where
        # there is no TLS, not "not required": libnvme 1.3 (nvme-cli 2.3) reads "not
        # required" as TLS being possible and has connect-all ask Linux 6.1 for TLS,
        # which that kernel refuses; "required" when only TLS is accepted, "not
        # required" when either is; SECTYPE TLS 1.3 in the TSAS whenever TLS is.
        treq=_TREQ[port.secure_channel] | L.Treq.DISABLE_SQFLOW,
        # An RDMA port's TSAS is the RDMA transport's (queue pair type, provider, CM).
        tsas=L.RDMA_TSAS
        if rdma
        else bytes([L.TcpSecType.TLS13 if port.offers_tls else L.TcpSecType.NONE]),
        portid=port.portid,
        cntlid=0xFFFF,
        asqsz=32,
        trsvcid=str(port.port),
        subnqn=nqn,
        traddr=address,
    )


def _referral_entry(referral: Referral) -> L.DiscoveryLogEntry:
    return L.DiscoveryLogEntry(
        trtype=L.TrType.TCP,
        adrfam=L.AdrFam.IPV6 if ":" in referral.address else L.AdrFam.IPV4,
        subtype=L.SubType.DISCOVERY if referral.is_discovery else L.SubType.NVME,
        # "Not specified" rather than SPDK's "not required" without a secure channel,
        # for the reason _entry gives (libnvme 1.3 would ask for TLS).
        treq=L.Treq.REQUIRED if referral.secure_channel else L.Treq.NOT_SPECIFIED,
        tsas=bytes([L.TcpSecType.TLS13 if referral.secure_channel else L.TcpSecType.NONE]),
        portid=0,  # the port's ID on the other system is not known here (SPDK: 0 too)
        cntlid=0xFFFF,
        asqsz=32,
        trsvcid=str(referral.port),
        subnqn=referral.subnqn,
        traddr=referral.address,
    )
