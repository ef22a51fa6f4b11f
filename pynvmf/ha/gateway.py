"""A gateway: a Target whose ANA groups are optimized exactly while it holds their leases.

The lease manager (pynvmf.ha.lease) settles which gateway owns each ANA group; this
module turns its answer into ANA states, in one place: `_apply(group)` computes the
state a group has on this gateway's listeners and hands it to Target.set_ana_state,
which decides what that means for the connected hosts (which controllers get the ANA
Change event). A group is optimized here only while

- the lease manager says this gateway owns it (`on_change(group, True)`, after it has
  fenced the previous owner), and
- every RBD image in it answers (its device's state is OK): an image whose cluster
  does not answer makes the group inaccessible until it answers again;

otherwise it is inaccessible. A gateway whose RADOS client was blocklisted (fenced: a
standby took over while this one was frozen or cut off) can never use its devices
again, so it withdraws for good: every group inaccessible, the lease manager stopped,
until the gateway is restarted.

Each gateway has its own controller ID range (`index` x 2040, as ceph-nvmeof does), so
a host that connects to several gateways of one subsystem never sees a CNTLID twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynvmf.block.rbd import ClusterSpec, DeviceState, RbdDevice
from pynvmf.config.native import ConfigError, Reader
from pynvmf.ha.lease import LeaseConfig, LeaseManager
from pynvmf.ha.shared import SharedConfig, SharedConfigOptions
from pynvmf.spec.logpages import AnaState
from pynvmf.target.ana import ANAGRPMAX
from pynvmf.target.subsystem import CNTLID_MIN
from pynvmf.target.target import Target

log = logging.getLogger(__name__)

CNTLID_RANGE = 2040  # controller IDs per gateway (ceph-nvmeof's width)
GATEWAY_KEYS = {
    "id",
    "index",
    "pool",
    "ceph_conf",
    "client",
    "options",
    "groups",
    "preferred",
    "lease",
    "failback",
    "shared_config",
}


@dataclass
class GatewayConfig:
    gateway_id: str
    groups: list[int]
    pool: str = "rbd"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    preferred: list[int] = field(default_factory=list)
    index: int | None = None  # None: the subsystems' own controller ID ranges
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    # The gateway group's shared configuration (pynvmf.ha.shared); None: this file's.
    shared: SharedConfigOptions | None = None

    @classmethod
    def parse(cls, spec: Any, where: str = "gateway") -> GatewayConfig:
        """The configuration file's "gateway" section."""
        r = Reader(spec, where, GATEWAY_KEYS)
        gateway_id = r.get("id", str)
        if not gateway_id:
            raise ConfigError(f"{r.path('id')}: a gateway needs an id (unique in its pool)")
        groups = _group_list(r.get("groups", list, []), r.path("groups"))
        if not groups:
            raise ConfigError(f"{r.path('groups')}: a gateway needs the ANA groups it serves")
        preferred = _group_list(r.get("preferred", list, []), r.path("preferred"))
        if set(preferred) - set(groups):
            raise ConfigError(f"{r.path('preferred')}: {preferred} are not all in groups")
        index = r.get("index", int)
        if index is not None and not 0 <= index < 0xFFEF // CNTLID_RANGE:
            raise ConfigError(f"{r.path('index')}: {index} is not a gateway index (0..31)")
        pool = r.get("pool", str, "rbd")
        if not pool:
            raise ConfigError(f"{r.path('pool')}: an empty pool name")
        options = r.get("options", dict, {})
        lease = r.get("lease", int, 10)
        try:
            lease_config = LeaseConfig(lease_seconds=lease, failback=r.get("failback", bool, True))
        except ValueError as exc:
            raise ConfigError(f"{r.path('lease')}: {exc}") from None
        shared = None
        if "shared_config" in spec:
            shared = SharedConfigOptions.parse(spec["shared_config"], r.path("shared_config"))
        return cls(
            gateway_id=gateway_id,
            groups=groups,
            pool=pool,
            cluster=ClusterSpec.of(
                r.get("ceph_conf", str),
                r.get("client", str),
                {k: str(v) for k, v in options.items()},
            ),
            preferred=preferred,
            index=index,
            lease=lease_config,
            shared=shared,
        )

    @property
    def cntlid_range(self) -> tuple[int, int] | None:
        if self.index is None:
            return None
        low = CNTLID_MIN + self.index * CNTLID_RANGE
        return low, low + CNTLID_RANGE - 1


def _group_list(value: list[Any], where: str) -> list[int]:
    if not all(isinstance(g, int) and not isinstance(g, bool) for g in value):
        raise ConfigError(f"{where}: not a list of ANA group IDs")
    bad = [g for g in value if not 1 <= g <= ANAGRPMAX]
    if bad:
        raise ConfigError(f"{where}: {bad} are not ANA group IDs (1..{ANAGRPMAX})")
    return sorted(set(value))


Announce = Callable[[int, AnaState], None]


class Gateway:
    """Runs `config`'s lease manager for `target` and keeps its ANA states in step.

    `setup()` (before the target listens) checks the configuration against the target,
    sets the controller ID ranges and makes every group inaccessible; `await start()`
    connects to the cluster and begins competing; `await stop()` gives up what it owns
    cleanly (no one needs to fence it)."""

    def __init__(
        self, target: Target, config: GatewayConfig, announce: Announce | None = None
    ) -> None:
        self.target = target
        self.config = config
        self._announce = announce
        self._owned: set[int] = set()
        self._withdrawn = False
        self._states: dict[int, AnaState] = {}
        self._members: dict[int, list[str]] = {}  # group -> the NQNs that have it
        self._devices: dict[int, list[RbdDevice]] = {}  # group -> its RBD images
        self._manager: LeaseManager | None = None
        self._withdrawal: asyncio.Task[None] | None = None
        self.shared: SharedConfig | None = None

    # -- set up -------------------------------------------------------------------------------

    async def share(self) -> SharedConfig | None:
        """With a "shared_config", seed the group object or take its subsystems (before
        setup(), which needs them; before the target listens, so that no host sees a
        subsystem of the file that the group does not have)."""
        cfg = self.config
        if cfg.shared is None:
            return None
        self.shared = SharedConfig(
            target=self.target,
            spec=cfg.cluster,
            pool=cfg.pool,
            gateway_id=cfg.gateway_id,
            object_name=cfg.shared.object_name,
            poll_interval=cfg.shared.poll_interval,
        )
        try:
            await self.shared.start()
        except OSError as exc:
            self.shared = None
            raise ConfigError(f"gateway.shared_config: {cfg.shared.object_name}: {exc}") from exc
        return self.shared

    def setup(self) -> None:
        cfg = self.config
        for nqn in self.target.subsystems:
            self._learn(nqn, strict=True)
        missing = [g for g in cfg.groups if g not in self._members]
        if missing:
            raise ConfigError(f"gateway.groups: no subsystem has ANA groups {missing}")
        for grpid in cfg.groups:
            self._apply(grpid)
        # From now on, whoever changes a subsystem (the RPC, the group's shared
        # configuration), this gateway learns its ANA groups' new members here.
        self.target.add_change_listener(self._subsystem_changed)

    def _learn(self, nqn: str, *, strict: bool) -> list[int]:
        """Take subsystem `nqn`'s ANA groups and RBD images into `_members` and
        `_devices` (after forgetting what it had); the groups it touched."""
        cfg = self.config
        touched = set()
        for grpid, members in self._members.items():
            if nqn in members:
                members.remove(nqn)
                touched.add(grpid)
        subsystem = self.target.subsystems.get(nqn)
        if subsystem is not None and not subsystem.is_discovery:
            span = cfg.cntlid_range
            if span is not None and not subsystem.controllers:
                subsystem.cntlid_min, subsystem.cntlid_max = span
            for grpid in cfg.groups:
                if subsystem.ana.group(grpid) is not None:
                    self._members.setdefault(grpid, []).append(nqn)
                    touched.add(grpid)
        in_use: dict[int, list[RbdDevice]] = {}
        for other_nqn, other in self.target.subsystems.items():
            if other.is_discovery:
                continue
            for ns in other.namespaces.values():
                if ns.anagrpid not in cfg.groups or not isinstance(ns.device, RbdDevice):
                    continue
                device = ns.device
                if device.cluster_spec != cfg.cluster:
                    # Fencing this gateway blocklists its lease's RADOS client; a device
                    # on another client would go on writing after a takeover.
                    message = (
                        f"{other_nqn} namespace {ns.nsid}: RBD image {device.pool}/"
                        f"{device.image_name} is not reached with the gateway's ceph_conf, "
                        "client and options (one client, or fencing would miss it)"
                    )
                    if strict:
                        raise ConfigError(message)
                    if other_nqn == nqn:
                        log.error("gateway %s: %s", cfg.gateway_id, message)
                    continue
                members = in_use.setdefault(ns.anagrpid, [])
                if device not in members:
                    members.append(device)
        for grpid in set(in_use) | set(self._devices):
            old, new = self._devices.get(grpid, []), in_use.get(grpid, [])
            if old != new:
                touched.add(grpid)
            for device in old:
                if device not in new:
                    device.remove_state_listener(self._device_changed)
            for device in new:
                if device not in old:
                    device.add_state_listener(self._device_changed)
        self._devices = in_use
        self._members = {g: m for g, m in self._members.items() if m}
        return sorted(touched)

    def _subsystem_changed(self, nqn: str) -> None:
        """A subsystem changed while running: a namespace added in one of this gateway's
        groups gets the group's state here at once (add_namespace made a new group
        optimized), a new RBD image is watched, and the group's state follows."""
        for grpid in self._learn(nqn, strict=False):
            state = self.state_of(grpid)
            if self._states.get(grpid) is not state:
                self._apply(grpid)
                continue
            subsystem = self.target.subsystems.get(nqn)
            group = subsystem.ana.group(grpid) if subsystem is not None else None
            if group is not None and (group.state is not state or group.on_port):
                try:
                    self.target.set_ana_state(nqn, grpid, state)
                except Exception:
                    log.exception("ANA group %d of %s: could not become %s", grpid, nqn, state)

    async def start(self) -> None:
        cfg = self.config
        self._manager = LeaseManager(
            spec=cfg.cluster,
            pool=cfg.pool,
            gateway_id=cfg.gateway_id,
            groups=cfg.groups,
            on_change=self._lease_changed,
            preferred=cfg.preferred,
            config=cfg.lease,
        )
        await self._manager.start()
        log.info(
            "gateway %s: competing for ANA groups %s in pool %s (lease %d s)",
            cfg.gateway_id,
            cfg.groups,
            cfg.pool,
            cfg.lease.lease_seconds,
        )

    async def stop(self) -> None:
        self.target.remove_change_listener(self._subsystem_changed)
        shared, self.shared = self.shared, None
        if shared is not None:
            await shared.stop()
        if self._withdrawal is not None:
            await self._withdrawal
        manager, self._manager = self._manager, None
        if manager is not None:
            await manager.stop()  # on_change(group, False) for each owned group first
        for devices in self._devices.values():
            for device in devices:
                device.remove_state_listener(self._device_changed)

    # -- the one place that decides ------------------------------------------------------------

    def state_of(self, grpid: int) -> AnaState:
        if self._withdrawn or grpid not in self._owned:
            return AnaState.INACCESSIBLE
        if any(d.state is not DeviceState.OK for d in self._devices.get(grpid, [])):
            return AnaState.INACCESSIBLE
        return AnaState.OPTIMIZED

    def _apply(self, grpid: int) -> None:
        state = self.state_of(grpid)
        if self._states.get(grpid) is state:
            return
        self._states[grpid] = state
        for nqn in self._members.get(grpid, []):
            try:
                self.target.set_ana_state(nqn, grpid, state)
            except Exception:
                log.exception("ANA group %d of %s: could not become %s", grpid, nqn, state)
        if self._announce is not None:
            self._announce(grpid, state)

    # -- what changes it -----------------------------------------------------------------------

    def _lease_changed(self, grpid: int, owned: bool) -> None:
        if owned:
            self._owned.add(grpid)
        else:
            self._owned.discard(grpid)
        self._apply(grpid)

    def _device_changed(self, device: RbdDevice, state: DeviceState) -> None:
        for grpid, devices in self._devices.items():
            if device in devices:
                self._apply(grpid)
        if state is DeviceState.FENCED and not self._withdrawn:
            self._withdraw(device)

    def _withdraw(self, device: RbdDevice) -> None:
        """This gateway's client is blocklisted: its devices never work again, so it must
        not take any group back (it would be optimized with storage that refuses it)."""
        log.error(
            "gateway %s: fenced (RBD image %s/%s refused this client); withdrawing from "
            "every ANA group until restarted",
            self.config.gateway_id,
            device.pool,
            device.image_name,
        )
        self._withdrawn = True
        for grpid in self.config.groups:
            self._apply(grpid)
        manager, self._manager = self._manager, None
        if manager is not None:
            self._withdrawal = asyncio.get_running_loop().create_task(manager.stop())
