"""Subsystems and the namespaces they hold."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.block.device import BlockDevice
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.fused import WriteGate

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller

# Dynamic controller IDs: 0xFFF0 and above are reserved by the specification.
CNTLID_MIN = 1
CNTLID_MAX = 0xFFEF


@dataclass
class Namespace:
    nsid: int
    device: BlockDevice
    # Stable identifiers: derived from the subsystem NQN, the NSID and what backs the
    # namespace, so that a restarted target presents the same identities to hosts.
    uuid: uuid.UUID
    nguid: bytes
    eui64: bytes
    # Shared by every controller's queues: a fused Compare and Write excludes the others' writes.
    gate: WriteGate = field(default_factory=WriteGate, repr=False, compare=False)

    @classmethod
    def create(
        cls,
        subnqn: str,
        nsid: int,
        device: BlockDevice,
        backing: str,
        ns_uuid: uuid.UUID | None = None,
    ) -> Namespace:
        key = f"{subnqn}\0{nsid}\0{backing}"
        ident = ns_uuid or uuid.uuid5(uuid.NAMESPACE_URL, "pynvmf:" + key)
        digest = hashlib.sha256(key.encode()).digest()
        return cls(nsid=nsid, device=device, uuid=ident, nguid=ident.bytes, eui64=digest[:8])

    @property
    def block_size(self) -> int:
        return self.device.capabilities.block_size

    @property
    def num_blocks(self) -> int:
        return self.device.capabilities.num_blocks


@dataclass
class IoStats:
    """Counters for the SMART / Health log."""

    read_cmds: int = 0
    write_cmds: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    copy_cmds: int = 0
    copy_bytes: int = 0


@dataclass
class Subsystem:
    nqn: str
    namespaces: dict[int, Namespace] = field(default_factory=dict)
    allow_any_host: bool = True
    allowed_hosts: set[str] = field(default_factory=set)
    serial: str = ""
    model: str = "pynvmf"
    controllers: dict[int, Controller] = field(default_factory=dict)
    stats: IoStats = field(default_factory=IoStats)
    _next_cntlid: int = CNTLID_MIN

    def __post_init__(self) -> None:
        if not self.serial:
            self.serial = hashlib.sha256(self.nqn.encode()).hexdigest()[:20]

    @property
    def is_discovery(self) -> bool:
        return self.nqn == DISCOVERY_NQN

    def host_allowed(self, hostnqn: str) -> bool:
        return self.is_discovery or self.allow_any_host or hostnqn in self.allowed_hosts

    def add_namespace(self, ns: Namespace) -> None:
        if ns.nsid in self.namespaces or ns.nsid < 1 or ns.nsid >= 0xFFFFFFFF:
            raise ValueError(f"{self.nqn}: invalid or duplicate NSID {ns.nsid}")
        self.namespaces[ns.nsid] = ns

    def allocate_cntlid(self) -> int | None:
        for _ in range(CNTLID_MAX - CNTLID_MIN + 1):
            cntlid = self._next_cntlid
            self._next_cntlid = cntlid + 1 if cntlid < CNTLID_MAX else CNTLID_MIN
            if cntlid not in self.controllers:
                return cntlid
        return None

    @property
    def max_nsid(self) -> int:
        return max(self.namespaces, default=0)
