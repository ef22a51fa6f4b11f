"""Subsystems and the namespaces they hold."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pynvmf.block.device import BlockDevice
from pynvmf.spec.command import HOST_BEHAVIOR_SIZE, nvme_version, set_host_behavior_cdfe
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.ana import DEFAULT_GROUP, AnaGroups
from pynvmf.target.command_counts import IoStats
from pynvmf.target.fused import WriteGate
from pynvmf.target.io import FastNamespace, fast_namespace
from pynvmf.target.reservations import NamespaceReservation
from pynvmf.tcp.psk import ConfiguredPsk

if TYPE_CHECKING:
    import asyncio

    from pynvmf.auth.controller import HostAuthConfig
    from pynvmf.target.controller import Controller
    from pynvmf.target.qos_gate import QosGate

# Dynamic controller IDs: 0xFFF0 and above are reserved by the specification.
CNTLID_MIN = 1
CNTLID_MAX = 0xFFEF
DEFAULT_VERSION = nvme_version(2, 0)


@dataclass
class Namespace:
    nsid: int
    device: BlockDevice
    # Stable identifiers: derived from the subsystem NQN, the NSID and what backs the
    # namespace, so that a restarted target presents the same identities to hosts.
    uuid: uuid.UUID
    nguid: bytes
    eui64: bytes
    # The name of the target's block device behind the namespace (Target.block_devices).
    device_name: str = ""
    # The ANA group the namespace belongs to (Identify Namespace ANAGRPID); moved only by
    # Target.set_namespace_ana_group, which tells the hosts.
    anagrpid: int = DEFAULT_GROUP
    # Shared by every controller's queues: a fused Compare and Write excludes the others' writes.
    gate: WriteGate = field(default_factory=WriteGate, repr=False, compare=False)
    # Registrants and the reservation, shared by every controller of the subsystem.
    reservation: NamespaceReservation = field(
        default_factory=NamespaceReservation, repr=False, compare=False
    )
    # Attached to every controller of the subsystem (auto_visible), or only to those of
    # the hosts in `hosts`: SPDK's no_auto_visible namespace with nvmf_ns_add_host, the
    # NVMe model of a namespace attached per host. Changed only by the Target, which
    # decides what a change means for connected hosts (Subsystem.refresh_views).
    auto_visible: bool = True
    hosts: set[str] = field(default_factory=set, compare=False)
    # Its device's rate limits (qos_gate.py), the same object as the NamedDevice's; None
    # while the device has none: the I/O path's one test for an unlimited namespace.
    qos: QosGate | None = field(default=None, repr=False, compare=False)

    def visible_to(self, hostnqn: str) -> bool:
        return self.auto_visible or hostnqn in self.hosts

    @classmethod
    def create(
        cls,
        subnqn: str,
        nsid: int,
        device: BlockDevice,
        backing: str,
        ns_uuid: uuid.UUID | None = None,
        *,
        nguid: bytes | None = None,
        eui64: bytes | None = None,
        device_name: str = "",
        ptpl_file: Path | None = None,
        anagrpid: int = DEFAULT_GROUP,
        auto_visible: bool = True,
    ) -> Namespace:
        """`ptpl_file` makes the namespace's reservations able to persist through power
        loss (RESCAP.PTPLS); a state saved there is loaded now (ValueError if damaged)."""
        key = f"{subnqn}\0{nsid}\0{backing}"
        ident = ns_uuid or uuid.uuid5(uuid.NAMESPACE_URL, "pynvmf:" + key)
        digest = hashlib.sha256(key.encode()).digest()
        return cls(
            nsid=nsid,
            device=device,
            uuid=ident,
            nguid=ident.bytes if nguid is None else nguid,
            eui64=digest[:8] if eui64 is None else eui64,
            device_name=device_name,
            anagrpid=anagrpid,
            reservation=NamespaceReservation(ptpl_file),
            auto_visible=auto_visible,
        )

    @property
    def block_size(self) -> int:
        return self.device.capabilities.block_size

    @property
    def num_blocks(self) -> int:
        return self.device.capabilities.num_blocks


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
    # NSIDs 1..max_namespaces are valid, and Identify reports that many (NN); 0: no limit.
    max_namespaces: int = 0
    # Dynamic controller IDs are allocated from this range (nvmet's cntlid_min/max).
    cntlid_min: int = CNTLID_MIN
    cntlid_max: int = CNTLID_MAX
    # I/O queues a controller may have (nvmet's qid_max); None: the controller's default.
    max_io_queues: int | None = None
    # VS and Identify VER (nvmet lets a subsystem report an older version), FR, IEEE OUI.
    version: int = DEFAULT_VERSION
    firmware: str = ""
    ieee_oui: int = 0
    # Copy descriptor formats (a CDFE bit mask: 2h, 3h) enabled on every new controller
    # before its host asks (Host Behavior Support's default value), for hosts that cannot
    # enable them: Debian's Linux 6.12 refuses to pass that Set Features on. Beyond TP
    # 4130, which leaves them off until the host enables them; off unless configured.
    copy_formats: int = 0
    # The namespaces that have registrants, by NSID: while it is empty, I/O pays one test
    # for reservations. Their NamespaceReservation objects keep it up to date.
    registered: dict[int, NamespaceReservation] = field(default_factory=dict)
    # The namespaces whose I/O is quiesced (a forced shrink under way), by NSID, with the
    # event their new commands wait for: while it is empty, I/O pays one test for it.
    # Kept by quiesce.quiesced alone.
    quiesced: dict[int, asyncio.Event] = field(default_factory=dict)
    # DH-HMAC-CHAP keys by host NQN: a host listed here must authenticate every queue.
    host_auth: dict[str, HostAuthConfig] = field(default_factory=dict, repr=False)
    # ANA groups and their states on this subsystem's listeners.
    ana: AnaGroups = field(default_factory=AnaGroups)
    # Listeners of other gateways serving this same subsystem (address, TCP port, port
    # ID): the discovery log lists them beside this target's own, so that a host's
    # `nvme connect-all` finds every path.
    peer_listeners: list[tuple[str, int, int]] = field(default_factory=list)
    # TLS PSKs by host NQN (the configured PSK; pynvmf.tcp.psk derives the TLS PSKs), and
    # the keyring names they came from (what outputs show instead of the keys). A host
    # with a PSK uses it for TLS; whether it may connect in plain is the port's TREQ.
    host_psks: dict[str, ConfiguredPsk] = field(default_factory=dict, repr=False)
    host_psk_names: dict[str, str] = field(default_factory=dict)
    _next_cntlid: int = 0

    def __post_init__(self) -> None:
        if not self.serial:
            self.serial = hashlib.sha256(self.nqn.encode()).hexdigest()[:20]
        if not self._next_cntlid:
            self._next_cntlid = self.cntlid_min

    @property
    def is_discovery(self) -> bool:
        return self.nqn == DISCOVERY_NQN

    def host_allowed(self, hostnqn: str) -> bool:
        return self.is_discovery or self.allow_any_host or hostnqn in self.allowed_hosts

    def queue_counts(self) -> tuple[int, int]:
        """(admin queues, I/O queues) of its controllers now."""
        admin = io = 0
        for ctrl in self.controllers.values():
            for qid in ctrl.queues:
                if qid:
                    io += 1
                else:
                    admin += 1
        return admin, io

    def add_namespace(self, ns: Namespace) -> None:
        if ns.nsid in self.namespaces or ns.nsid < 1 or ns.nsid >= 0xFFFFFFFF:
            raise ValueError(f"{self.nqn}: invalid or duplicate NSID {ns.nsid}")
        self.namespaces[ns.nsid] = ns
        ns.reservation.attach(self.registered, ns.nsid)
        self.ana.changed([self.ana.add(ns.anagrpid)])

    def view_of(self, hostnqn: str) -> dict[int, Namespace]:
        """The namespaces attached to a controller of `hostnqn`, by NSID."""
        return {nsid: ns for nsid, ns in self.namespaces.items() if ns.visible_to(hostnqn)}

    def refresh_views(self, nsid: int) -> list[Controller]:
        """Bring every controller's view of NSID `nsid` in line with `namespaces` and the
        namespace's visibility, in place (the I/O path holds each view); the controllers
        whose view changed, the ones to tell."""
        ns = self.namespaces.get(nsid)
        changed = []
        for ctrl in self.controllers.values():
            view = ctrl.namespaces
            now = ns if ns is not None and ns.visible_to(ctrl.hostnqn) else None
            if view.get(nsid) is now:
                continue
            if now is None:
                del view[nsid]
            else:
                view[nsid] = now
            changed.append(ctrl)
        self.refresh_io_paths(nsid)
        return changed

    @staticmethod
    def io_paths_of(view: dict[int, Namespace]) -> dict[int, FastNamespace]:
        """The namespaces of a controller's `view` whose Reads, Writes and Copies may take
        the I/O fast path now (target/io.py fast_namespace), by NSID."""
        paths = {}
        for nsid, ns in view.items():
            entry = fast_namespace(ns)
            if entry is not None:
                paths[nsid] = entry
        return paths

    def refresh_io_paths(self, nsid: int) -> None:
        """Bring every controller's fast-path entry for NSID `nsid` in line with its view
        and with the namespace as it is now, in place (the I/O path holds each table).
        The Target calls it whenever what fast_namespace decides by may have changed:
        the namespace added, removed, attached or detached (refresh_views), its rate
        limits set or removed, its device resized."""
        ns = self.namespaces.get(nsid)
        entry = fast_namespace(ns) if ns is not None else None
        for ctrl in self.controllers.values():
            paths = ctrl.io_paths
            if entry is not None and ctrl.namespaces.get(nsid) is ns:
                paths[nsid] = entry
            else:
                paths.pop(nsid, None)

    def allocate_cntlid(self) -> int | None:
        low, high = self.cntlid_min, self.cntlid_max
        for _ in range(high - low + 1):
            cntlid = self._next_cntlid
            if not low <= cntlid <= high:
                cntlid = low
            self._next_cntlid = cntlid + 1 if cntlid < high else low
            if cntlid not in self.controllers:
                return cntlid
        return None

    def ana_members(self, view: dict[int, Namespace] | None = None) -> dict[int, list[int]]:
        """Each ANA group's NSIDs, ascending: of every namespace, or of a controller's
        `view` (its ANA log lists the namespaces attached to it)."""
        namespaces = self.namespaces if view is None else view
        members: dict[int, list[int]] = {}
        for nsid in sorted(namespaces):
            members.setdefault(namespaces[nsid].anagrpid, []).append(nsid)
        return members

    @property
    def max_nsid(self) -> int:
        return max(self.namespaces, default=0)

    @property
    def host_behavior_default(self) -> bytes:
        """Host Behavior Support as a new controller of this subsystem starts with."""
        data = bytearray(HOST_BEHAVIOR_SIZE)
        set_host_behavior_cdfe(data, self.copy_formats)
        return bytes(data)
