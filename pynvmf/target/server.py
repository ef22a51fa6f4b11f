"""The target: ports listening for NVMe/TCP, the subsystems behind them, discovery.

`Target` is an object that changes while it runs: one method per change (add or
remove a block device, subsystem, namespace, host, port, listener). Each method
validates the whole change before it applies any of it, so a refused change (a
ChangeError naming the argument at fault) leaves the target as it was; and each
decides what connected hosts see: controllers torn down, Changed Namespace List
entries and Namespace Attribute Changed events, a new discovery log generation
and Discovery Log Page Change events. The configuration loaders and the RPC
methods only translate their formats into these calls.

The asyncio glue here is deliberately thin: the protocol object moves bytes
between the socket and the sans-I/O TargetConnection and nothing else.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pynvmf.auth.controller import ALL_DHGROUPS, ALL_HASHES, HostAuthConfig
from pynvmf.auth.keys import DhchapKey, KeyFormatError, load_key_file
from pynvmf.block.memory import MemoryDevice
from pynvmf.malloc import trim
from pynvmf.spec import logpages as L
from pynvmf.spec.auth import DhGroupId, HashId
from pynvmf.spec.command import COPY_CDFE_FORMATS
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.nqn import nqn_problem
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.target.budget import (
    SWEEP_INTERVAL_S,
    WRITE_HIGH_WATER,
    WRITE_LOW_WATER,
    ConnectionBudget,
    ConnectionLimits,
    MemoryPool,
    default_max_memory,
)
from pynvmf.target.devices import NamedDevice
from pynvmf.target.generated_psks import GeneratedPsks
from pynvmf.target.queue import TargetQueue
from pynvmf.target.subsystem import (
    CNTLID_MAX,
    CNTLID_MIN,
    DEFAULT_VERSION,
    Namespace,
    Subsystem,
)
from pynvmf.tcp.psk import ConfiguredPsk, PskError, TlsPsk, tls_psks
from pynvmf.tcp.target import TargetConnection, TransportConfig
from pynvmf.tls.channel import KTLS_POLICIES, SecureChannel, TlsCounters, kernel_record_error
from pynvmf.tls.engine import TlsEngine
from pynvmf.tls.wire import CT_HANDSHAKE

if TYPE_CHECKING:
    from pynvmf.target.workers import WorkerPool

log = logging.getLogger(__name__)

NVME_TCP_PORT = 4420
DISCOVERY_PORT = 8009
NSID_MAX = 0xFFFFFFFE  # FFFFFFFFh means every namespace
MAX_SUBSYSTEMS = 1024  # SPDK's default, and plenty for one process
# How long a namespace removal waits for the commands in flight on its subsystem before
# it tears down the controllers still holding some (a host that never sends the data
# of a write it started would otherwise hold the removal, and every RPC after it).
DRAIN_TIMEOUT = 10.0
SERIAL_MAX = 20  # Identify Controller SN, MN and FR: ASCII, space padded
MODEL_MAX = 40
FIRMWARE_MAX = 8
INLINE_DATA_MAX = 1 << 20
MIN_H2C_DATA = 4096  # NVMe/TCP: MAXH2CDATA is at least 4 KiB
# A listener's secure channel (nvmet's addr_tsas and addr_treq): "none" (plain NVMe/TCP
# only), "required" (TLS 1.3 only) or "optional" (TLS 1.3 or plain, told apart by the
# connection's first byte, as nvmet does with treq "not required").
SECURE_CHANNELS = ("none", "required", "optional")
_TREQ = {
    "none": L.Treq.NOT_SPECIFIED,
    "required": L.Treq.REQUIRED,
    "optional": L.Treq.NOT_REQUIRED,
}


class ChangeError(ValueError):
    """A change the target refused; nothing changed. `field` names the argument at fault
    (nqn, hostnqn, nsid, device, address, ...), so that a caller can name its own."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


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
    # Asked for as a listener of the discovery subsystem: when the last subsystem leaves
    # an I/O port with a list of subsystems, the port stays as a discovery-only port
    # rather than closing.
    discovery_listener: bool = False
    # The address the discovery log gives for this port, when hosts reach it by another
    # than the one it listens on (NAT, a VM's user-mode network): "" means its own.
    advertise: str = ""
    secure_channel: str = "none"
    # Whether a TLS connection's record layer may move into the kernel ("auto") or stays
    # in user space ("off", for measurements and for kernels whose kTLS misbehaves).
    ktls: str = "auto"
    connections: set[TargetProtocol] = field(default_factory=set, repr=False, compare=False)
    server: asyncio.base_events.Server | None = field(default=None, repr=False, compare=False)

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
        return self.port == port and _normal_address(self.address) == _normal_address(address)

    def __str__(self) -> str:
        host = f"[{self.address}]" if self.is_ipv6 else self.address
        return f"{host}:{self.port}"


def _normal_address(address: str) -> str:
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address


@dataclass(frozen=True)
class KeyringEntry:
    """A named secret and the file it came from; outputs show the name and path only."""

    name: str
    path: str
    key: DhchapKey | ConfiguredPsk = field(repr=False)


@dataclass
class TargetCounters:
    """Cumulative counts for statistics (SPDK's nvmf_get_stats)."""

    admin_queues: int = 0
    io_queues: int = 0


class BusyPoller:
    """Poll mode: after input, the event loop keeps polling its sockets (a callback always
    ready, so it never sleeps in epoll_wait) for `window_s` seconds, and goes back to
    sleeping once no input came for that long. A host that sends its next command within
    the window gets it read without the wake-up of a sleeping thread (tens of
    microseconds on an idle core), at the price of a core kept busy while I/O goes on."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last_input = 0.0
        self.spinning = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def input(self) -> None:
        """Input arrived: poll for the window from now."""
        self.last_input = time.monotonic()
        if not self.spinning:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self.spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        loop = self._loop
        if loop is not None and time.monotonic() - self.last_input < self.window_s:
            loop.call_soon(self._spin)
        else:
            self.spinning = False


ChangeListener = Callable[[str], None]


class Target:
    def __init__(
        self,
        subsystems: Iterable[Subsystem] = (),
        ports: Iterable[Port] = (),
        *,
        transport: TransportConfig | None = None,
        limits: ConnectionLimits | None = None,
        busy_poll_us: int = 0,
    ) -> None:
        self.subsystems: dict[str, Subsystem] = {}
        # DH-HMAC-CHAP secrets by name (SPDK's keyring), and the hashes and DH groups a
        # host's authentication allows unless its own configuration says otherwise.
        self.keyring: dict[str, KeyringEntry] = {}
        self.dhchap_hashes: tuple[HashId, ...] = ALL_HASHES
        self.dhchap_dhgroups: tuple[DhGroupId, ...] = ALL_DHGROUPS
        self.block_devices: dict[str, NamedDevice] = {}
        self.discovery = Subsystem(DISCOVERY_NQN, model="pynvmf discovery")
        self.ports: list[Port] = []
        # The transport options of listeners added with add_listener (SPDK creates a
        # transport once and every listener has its options).
        self.transport = transport or TransportConfig()
        self.max_subsystems = MAX_SUBSYSTEMS
        self.genctr = 1
        self.started = time.monotonic()
        self.counters = TargetCounters()
        # Secure-channel decisions (handshakes, kTLS or user space per direction).
        self.tls_counters = TlsCounters()
        # TLS PSKs that secure channel concatenation generated (generated_psks.py).
        self.generated_psks = GeneratedPsks()
        self.connection_budget = ConnectionBudget(limits or ConnectionLimits())
        limits = self.connection_budget.limits
        self.memory_pool = MemoryPool(limits.max_memory or default_max_memory())
        if busy_poll_us < 0:
            raise ChangeError("busy_poll_us", f"{busy_poll_us} is not a number of microseconds")
        self.busy_poll_us = busy_poll_us
        self.poller = BusyPoller(busy_poll_us / 1e6) if busy_poll_us else None
        self._sweeper: asyncio.TimerHandle | None = None
        # The worker processes that serve I/O queues (pynvmf target --cores N, workers.py);
        # None: every queue is served here.
        self.workers: WorkerPool | None = None
        # Told the NQN of every subsystem whose configuration changed (see _changed).
        self._change_listeners: list[ChangeListener] = []
        self._running = False
        self._stopped = False
        for subsystem in subsystems:
            self._adopt(subsystem)
        for port in ports:
            self._check_port(port)
            self._place_port(port)

    # -- running -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            for port in self.ports:
                await self._listen(port)
        except BaseException:
            await self.stop()
            raise
        self._running = True
        self.started = time.monotonic()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections that hold the target waiting on input a host never finishes."""
        now = time.monotonic()
        for protocol in [p for port in self.ports for p in port.connections]:
            reason = protocol.overdue(now)
            if reason:
                log.warning(
                    "closing the connection from %s on %s: %s",
                    protocol.peer_address,
                    protocol.port,
                    reason,
                )
                protocol.abort(reason)
        if self.memory_pool.should_trim():
            trim()
        if not self._stopped:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        if self._sweeper is not None:
            self._sweeper.cancel()
        servers = [port.server for port in self.ports if port.server is not None]
        for server in servers:
            server.close()
        for subsystem in [*self.subsystems.values(), self.discovery]:
            for ctrl in list(subsystem.controllers.values()):
                ctrl.destroy("target shutting down")
        for port in self.ports:
            for proto in list(port.connections):
                proto.close("target shutting down")
        for server in servers:
            await server.wait_closed()
        for port in self.ports:
            port.server = None
        closed: set[int] = set()
        for entry in self.block_devices.values():
            if id(entry.device) not in closed:  # one device may back several namespaces
                closed.add(id(entry.device))
                # A device whose flush fails (storage gone) is still closed, and so are
                # the ones after it.
                await _close_device(entry)

    def find_subsystem(self, nqn: str, port: Port) -> Subsystem | None:
        if not port.exposes(nqn) or not any(p is port for p in self.ports):
            return None
        if nqn == DISCOVERY_NQN:
            return self.discovery
        return self.subsystems.get(nqn)

    def memory_device(self, size_bytes: int, block_size: int) -> MemoryDevice:
        """A new memory device for the configuration or the RPC to serve: private memory,
        or shared memory the worker processes map when they serve the I/O queues."""
        return MemoryDevice(size_bytes, block_size)

    def set_transport(self, config: TransportConfig) -> None:
        """The transport options of the listeners add_listener opens from now on."""
        _check_transport(config)
        self.transport = config

    # -- block devices ------------------------------------------------------------------

    def add_block_device(self, entry: NamedDevice) -> NamedDevice:
        """Make `entry` available to add_namespace under its name."""
        if not entry.name or not isinstance(entry.name, str):
            raise ChangeError("name", "a block device needs a name")
        if entry.name in self.block_devices:
            raise ChangeError("name", f"a block device named {entry.name!r} exists")
        if entry.uuid is not None:
            for other in self.block_devices.values():
                if other.uuid == entry.uuid:
                    raise ChangeError("uuid", f"{entry.uuid} is block device {other.name!r}'s")
        self.block_devices[entry.name] = entry
        return entry

    def device_users(self, name: str) -> list[tuple[Subsystem, Namespace]]:
        return [
            (subsystem, ns)
            for subsystem in self.subsystems.values()
            for ns in subsystem.namespaces.values()
            if ns.device_name == name
        ]

    async def remove_block_device(self, name: str) -> None:
        """Remove a block device; the namespaces on it are removed first (hot removal:
        their hosts see them go), then it is flushed and closed."""
        entry = self._block_device(name)
        for subsystem, ns in self.device_users(name):
            await self.remove_namespace(subsystem.nqn, ns.nsid)
        if self.block_devices.get(name) is entry:
            del self.block_devices[name]
            await _close_device(entry)

    def _block_device(self, name: str, field: str = "name") -> NamedDevice:
        entry = self.block_devices.get(name)
        if entry is None:
            raise ChangeError(field, f"no block device named {name!r}")
        return entry

    # -- changes ------------------------------------------------------------------------

    def add_change_listener(self, listener: ChangeListener) -> None:
        """Call `listener(nqn)` after every change of subsystem `nqn`'s configuration
        (added, removed, its namespaces, hosts, listeners), whoever made it: the one
        place a gateway learns what changed (to share it, or to give a new namespace its
        ANA state). Called on the event loop's thread once the change is complete."""
        self._change_listeners.append(listener)

    def remove_change_listener(self, listener: ChangeListener) -> None:
        if listener in self._change_listeners:
            self._change_listeners.remove(listener)

    def _changed(self, nqn: str) -> None:
        for listener in list(self._change_listeners):
            try:
                listener(nqn)
            except Exception:  # a listener's fault must not undo or fail the change
                log.exception("change listener %r failed for %s", listener, nqn)

    # -- subsystems ---------------------------------------------------------------------

    def add_subsystem(
        self,
        nqn: str,
        *,
        serial: str = "",
        model: str = "pynvmf",
        allow_any_host: bool = True,
        hosts: Iterable[str] = (),
        max_namespaces: int = 0,
        cntlid_min: int = CNTLID_MIN,
        cntlid_max: int = CNTLID_MAX,
        max_io_queues: int | None = None,
        version: int = DEFAULT_VERSION,
        firmware: str = "",
        ieee_oui: int = 0,
        copy_formats: int = 0,
    ) -> Subsystem:
        """A new subsystem, with no namespaces, on the ports that expose every subsystem."""
        subsystem = Subsystem(
            nqn,
            allow_any_host=allow_any_host,
            allowed_hosts=set(hosts),
            serial=serial,
            model=model,
            max_namespaces=max_namespaces,
            cntlid_min=cntlid_min,
            cntlid_max=cntlid_max,
            max_io_queues=max_io_queues,
            version=version,
            firmware=firmware,
            ieee_oui=ieee_oui,
            copy_formats=copy_formats,
        )
        self._check_subsystem(subsystem)
        self.subsystems[nqn] = subsystem
        log.info("subsystem %s added", nqn)
        self._discovery_changed()
        self._changed(nqn)
        return subsystem

    def _check_subsystem(self, subsystem: Subsystem) -> None:
        nqn = subsystem.nqn
        problem = nqn_problem(nqn)
        if problem:
            raise ChangeError("nqn", f"{nqn!r} is not a valid NQN: {problem}")
        if nqn == DISCOVERY_NQN:
            raise ChangeError("nqn", "the discovery subsystem's NQN is reserved")
        if nqn in self.subsystems:
            raise ChangeError("nqn", f"subsystem {nqn} exists")
        if len(self.subsystems) >= self.max_subsystems:
            raise ChangeError("nqn", f"the target has its maximum of {self.max_subsystems}")
        for hostnqn in subsystem.allowed_hosts:
            _check_hostnqn(hostnqn)
        _check_text("serial", subsystem.serial, SERIAL_MAX)
        _check_text("model", subsystem.model, MODEL_MAX)
        _check_text("firmware", subsystem.firmware, FIRMWARE_MAX)
        if not CNTLID_MIN <= subsystem.cntlid_min <= subsystem.cntlid_max <= CNTLID_MAX:
            raise ChangeError(
                "cntlid_min",
                f"controller IDs {subsystem.cntlid_min}..{subsystem.cntlid_max} are not a "
                f"range within {CNTLID_MIN}..{CNTLID_MAX}",
            )
        if not 0 <= subsystem.max_namespaces <= NSID_MAX:
            raise ChangeError("max_namespaces", f"{subsystem.max_namespaces} not in 0..{NSID_MAX}")
        if subsystem.max_io_queues is not None and not 1 <= subsystem.max_io_queues <= 0xFFFF:
            raise ChangeError("max_io_queues", f"{subsystem.max_io_queues} not in 1..65535")
        if not 0 < subsystem.version <= 0xFFFFFFFF:
            raise ChangeError("version", f"{subsystem.version:#x} is not an NVMe version")
        if not 0 <= subsystem.ieee_oui < 1 << 24:
            raise ChangeError("ieee_oui", f"{subsystem.ieee_oui:#x} is not a 24-bit OUI")
        if subsystem.copy_formats & ~COPY_CDFE_FORMATS:
            raise ChangeError("copy_formats", "only Copy formats 2 and 3 need enabling")
        for ns in subsystem.namespaces.values():
            self._check_nsid(subsystem, ns.nsid)

    def _adopt(self, subsystem: Subsystem) -> None:
        """Take a Subsystem built by the caller, with its namespaces, whose devices
        become block devices of its own (owned: they go with their namespaces)."""
        self._check_subsystem(subsystem)
        entries = []
        for ns in subsystem.namespaces.values():
            name = ns.device_name or f"{subsystem.nqn}/{ns.nsid}"
            if name in self.block_devices or any(e.name == name for e in entries):
                raise ChangeError("name", f"a block device named {name!r} exists")
            entries.append(NamedDevice.wrap(name, ns.device, owned=True))
            ns.device_name = name
        for entry in entries:
            self.block_devices[entry.name] = entry
        self.subsystems[subsystem.nqn] = subsystem

    def _subsystem(self, nqn: str, field: str = "nqn") -> Subsystem:
        subsystem = self.subsystems.get(nqn)
        if subsystem is None:
            raise ChangeError(field, f"no subsystem {nqn!r}")
        return subsystem

    async def remove_subsystem(self, nqn: str) -> None:
        """Remove a subsystem: new Connects to it fail at once, its controllers are torn
        down (their connections closed), its listeners go; once the commands that were in
        flight have finished, its namespaces' devices are flushed (and closed if owned)."""
        subsystem = self._subsystem(nqn)
        waiting = self._commands_waiting(subsystem)
        del self.subsystems[nqn]
        self.generated_psks.forget(subnqn=nqn)
        log.info("subsystem %s removed", nqn)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.destroy("subsystem removed")
        emptied = []
        for port in self.ports:
            if port.subsystems is not None and nqn in port.subsystems:
                port.subsystems.remove(nqn)
                if not port.subsystems and not port.discovery_only:
                    emptied.append(port)
        for port in emptied:
            await self._emptied(port)
        self._discovery_changed()
        await _drain(waiting)
        for ns in subsystem.namespaces.values():
            await self._release(ns)
        self._changed(nqn)

    # -- namespaces ---------------------------------------------------------------------

    def add_namespace(
        self,
        nqn: str,
        device: str | NamedDevice,
        *,
        nsid: int | None = None,
        ns_uuid: uuid.UUID | None = None,
        nguid: bytes | None = None,
        eui64: bytes | None = None,
        ptpl_file: Path | None = None,
        anagrpid: int | None = None,
    ) -> Namespace:
        """Serve a block device, by name, as namespace `nsid` (default: the lowest free)
        of subsystem `nqn`; or a new one (a NamedDevice, added with the namespace: it
        must be `owned` then, to go away with it). Its controllers' hosts are told
        (Changed Namespace List, Namespace Attribute Changed): a Linux host adds it
        without reconnecting.

        Identities the caller does not give are the device's UUID (if it has one) or
        derived from the NQN, NSID and what backs the device, so stable across restarts.
        With `ptpl_file` its reservations can persist through power loss; a state saved
        there is restored (a damaged one is refused: the hosts it fences would get in).
        The namespace is in ANA group `anagrpid` (default 1), which is created (optimized
        on every listener) if the subsystem has no such group yet.
        """
        subsystem = self._subsystem(nqn)
        grpid = ana.DEFAULT_GROUP if anagrpid is None else anagrpid
        _check_grpid(grpid)
        if isinstance(device, NamedDevice):
            entry = device
            if entry.name in self.block_devices:
                raise ChangeError("device", f"a block device named {entry.name!r} exists")
            if not entry.owned:
                raise ChangeError("device", "a device added with its namespace is owned by it")
        else:
            entry = self._block_device(device, "device")
        device_name = entry.name
        users = self.device_users(device_name)
        if users:
            other, used = users[0]
            raise ChangeError(
                "device", f"{device_name!r} is in use by namespace {used.nsid} of {other.nqn}"
            )
        if nsid is None:
            nsid = self._free_nsid(subsystem)
        self._check_nsid(subsystem, nsid)
        if nsid in subsystem.namespaces:
            raise ChangeError("nsid", f"NSID {nsid} of {nqn} is in use")
        if nguid is not None and len(nguid) != 16:
            raise ChangeError("nguid", "an NGUID is 16 bytes")
        if eui64 is not None and len(eui64) != 8:
            raise ChangeError("eui64", "an EUI-64 is 8 bytes")
        if ns_uuid is None:
            ns_uuid = entry.uuid
        if nguid is None and entry.uuid is not None:
            nguid = entry.uuid.bytes
        try:
            ns = Namespace.create(
                nqn,
                nsid,
                entry.device,
                entry.identity_key,
                ns_uuid,
                nguid=nguid,
                eui64=eui64,
                device_name=device_name,
                ptpl_file=ptpl_file,
                anagrpid=grpid,
            )
        except (OSError, ValueError) as exc:
            raise ChangeError("ptpl_file", str(exc)) from exc
        for other in subsystem.namespaces.values():
            for what, mine, theirs in (
                ("uuid", ns.uuid.bytes, other.uuid.bytes),
                ("nguid", ns.nguid, other.nguid),
                ("eui64", ns.eui64, other.eui64),
            ):
                if mine == theirs and any(mine):
                    raise ChangeError(what, f"namespace {other.nsid} of {nqn} has it")
        if isinstance(device, NamedDevice):
            self.block_devices[device_name] = entry
        subsystem.namespaces[nsid] = ns
        ns.reservation.attach(subsystem.registered, nsid)
        log.info("namespace %d of %s added on %s", nsid, nqn, device_name)
        group = subsystem.ana.add(grpid)
        subsystem.ana.changed([group])  # its NSID list grew
        for ctrl in list(subsystem.controllers.values()):
            ctrl.namespace_changed(nsid)
            ctrl.ana_changed()
        self._changed(nqn)
        return ns

    def _free_nsid(self, subsystem: Subsystem) -> int:
        limit = subsystem.max_namespaces or NSID_MAX
        nsid = 1
        while nsid in subsystem.namespaces:
            nsid += 1
        if nsid > limit:
            raise ChangeError("nsid", f"{subsystem.nqn} has no free NSID (at most {limit})")
        return nsid

    @staticmethod
    def _check_nsid(subsystem: Subsystem, nsid: int) -> None:
        limit = subsystem.max_namespaces or NSID_MAX
        if not isinstance(nsid, int) or not 1 <= nsid <= limit:
            raise ChangeError("nsid", f"{nsid!r} not in 1..{limit}")

    async def remove_namespace(self, nqn: str, nsid: int) -> Namespace:
        """Stop serving namespace `nsid`: new commands to it fail with Invalid Namespace at
        once, hosts are told, and the commands in flight finish (each with a status)
        before its device is flushed, and closed if it was opened for it."""
        subsystem = self._subsystem(nqn)
        ns = subsystem.namespaces.get(nsid)
        if ns is None:
            raise ChangeError("nsid", f"{nqn} has no namespace {nsid!r}")
        waiting = self._commands_waiting(subsystem)
        del subsystem.namespaces[nsid]
        ns.reservation.detach()
        log.info("namespace %d of %s removed", nsid, nqn)
        group = subsystem.ana.group(ns.anagrpid)
        subsystem.ana.changed([group] if group is not None else [])
        for ctrl in list(subsystem.controllers.values()):
            ctrl.namespace_changed(nsid)
            ctrl.ana_changed()
        await _drain(waiting, subsystem)
        await self._release(ns)
        self._changed(nqn)
        return ns

    def _commands_waiting(self, subsystem: Subsystem) -> set[asyncio.Task[None]]:
        """The commands on the subsystem's queues that are waiting for something; any of
        them may be using any of its namespaces (a Copy reads from several)."""
        return {
            task
            for ctrl in subsystem.controllers.values()
            for queue in ctrl.queues.values()
            for task in queue.commands_waiting
        }

    async def _release(self, ns: Namespace) -> None:
        entry = self.block_devices.get(ns.device_name)
        if entry is None or entry.device is not ns.device:
            return
        if entry.owned:
            del self.block_devices[entry.name]
            shared = any(e.device is entry.device for e in self.block_devices.values())
            if not shared:
                await _close_device(entry)
        else:
            try:
                await entry.device.flush()
            except OSError as exc:
                log.error("flushing %s failed: %s", entry.name, exc)

    # -- keys ---------------------------------------------------------------------------

    def add_key(self, name: str, path: str) -> KeyringEntry:
        """Add a DH-HMAC-CHAP secret or a TLS PSK (NVMeTLSkey-1) from a key file (mode
        0600) to the keyring under `name` (SPDK's keyring_file_add_key); hosts refer to
        keys by name."""
        self._check_key_name(name)
        key: DhchapKey | ConfiguredPsk
        if _holds_tls_psk(path):
            key = read_psk_file(path)
        else:
            try:
                key = load_key_file(path)
            except KeyFormatError as e:
                raise ChangeError("path", str(e)) from None
        entry = KeyringEntry(name, path, key)
        self.keyring[name] = entry
        log.info("key %s added from %s", name, path)
        return entry

    def add_key_text(self, name: str, text: str) -> KeyringEntry:
        """Add a DH-HMAC-CHAP secret (DHHC-1) or a TLS PSK (NVMeTLSkey-1) given as text,
        for a controller that has no access to the target's files (blktests' control
        script runs on the host under test). Its entry has no path: outputs show the name
        alone, and a saved configuration names no file to restore it from."""
        self._check_key_name(name)
        if not isinstance(text, str):
            raise ChangeError("key", "a DHHC-1 secret or an NVMeTLSkey-1 PSK, as text")
        key: DhchapKey | ConfiguredPsk
        try:
            if text.lstrip().startswith("NVMeTLSkey-"):
                key = ConfiguredPsk.parse(text)
            else:
                key = DhchapKey.parse(text)
        except (PskError, KeyFormatError) as e:
            raise ChangeError("key", str(e)) from None
        entry = KeyringEntry(name, "", key)
        self.keyring[name] = entry
        log.info("key %s added (given over the control plane)", name)
        return entry

    def _check_key_name(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ChangeError("name", "a key needs a name")
        if name in self.keyring:
            raise ChangeError("name", f"key {name!r} exists")

    def remove_key(self, name: str) -> None:
        if name not in self.keyring:
            raise ChangeError("name", f"no key named {name!r}")
        for subsystem in self.subsystems.values():
            users = [
                h
                for h, c in subsystem.host_auth.items()
                if name in (c.host_key_name, c.ctrl_key_name)
            ]
            users += [h for h, used in subsystem.host_psk_names.items() if used == name]
            for hostnqn in users:
                raise ChangeError("name", f"key {name!r} is in use by {hostnqn} on {subsystem.nqn}")
        del self.keyring[name]
        log.info("key %s removed", name)

    def auth_config(
        self,
        dhchap_key: str | DhchapKey,
        dhchap_ctrl_key: str | DhchapKey | None = None,
        *,
        hashes: Iterable[HashId] | None = None,
        dhgroups: Iterable[DhGroupId] | None = None,
    ) -> HostAuthConfig:
        """A host's authentication from keyring names (or keys), with the target's
        hashes and DH groups unless given."""

        def resolve(ref: str | DhchapKey, field: str) -> tuple[DhchapKey, str]:
            if isinstance(ref, DhchapKey):
                return ref, ""
            entry = self.keyring.get(ref)
            if entry is None:
                raise ChangeError(field, f"no key named {ref!r} in the keyring")
            if not isinstance(entry.key, DhchapKey):
                raise ChangeError(field, f"key {ref!r} is a TLS PSK, not a DH-HMAC-CHAP secret")
            return entry.key, entry.name

        host_key, host_name = resolve(dhchap_key, "dhchap_key")
        ctrl_key, ctrl_name = (
            resolve(dhchap_ctrl_key, "dhchap_ctrlr_key")
            if dhchap_ctrl_key is not None
            else (None, "")
        )
        hash_list = tuple(hashes) if hashes is not None else self.dhchap_hashes
        group_list = tuple(dhgroups) if dhgroups is not None else self.dhchap_dhgroups
        if not hash_list:
            raise ChangeError("dhchap_hash", "at least one hash")
        if not group_list:
            raise ChangeError("dhchap_dhgroup", "at least one DH group")
        return HostAuthConfig(host_key, ctrl_key, hash_list, group_list, host_name, ctrl_name)

    # -- hosts --------------------------------------------------------------------------

    def add_host(
        self,
        nqn: str,
        hostnqn: str,
        *,
        auth: HostAuthConfig | None = None,
        psk: str | ConfiguredPsk | None = None,
    ) -> None:
        """Allow `hostnqn` to connect to `nqn` (when it does not allow any host); with
        `auth`, the host must authenticate with DH-HMAC-CHAP; with `psk` (a keyring name
        or a key), it connects only over TLS with that PSK."""
        subsystem = self._subsystem(nqn)
        _check_hostnqn(hostnqn)
        if hostnqn in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn} is already allowed on {nqn}")
        key = self._resolve_psk(psk) if psk is not None else None
        subsystem.allowed_hosts.add(hostnqn)
        if auth is not None:
            subsystem.host_auth[hostnqn] = auth
        if key is not None:
            subsystem.host_psks[hostnqn] = key[1]
            subsystem.host_psk_names[hostnqn] = key[0]
        self._discovery_changed()
        self._changed(nqn)

    def set_host_keys(self, nqn: str, hostnqn: str, auth: HostAuthConfig | None) -> None:
        """Change (or, with None, remove) the DH-HMAC-CHAP keys of a host on `nqn`.

        Queues already authenticated stay so; every authentication from now on (a new
        queue, or the host re-authenticating) uses the new keys, as with nvmet. A host
        that must rotate its key re-authenticates with it (Linux: writing the new secret
        to /sys/class/nvme/nvmeX/dhchap_secret)."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts and hostnqn not in subsystem.host_auth:
            raise ChangeError("host", f"{hostnqn!r} is not a host of {nqn}")
        if auth is None:
            subsystem.host_auth.pop(hostnqn, None)
            # What it authenticated for goes with the key; new keys leave it, as they leave
            # the queues that already authenticated.
            self.generated_psks.forget(hostnqn=hostnqn, subnqn=nqn)
        else:
            subsystem.host_auth[hostnqn] = auth
        log.info("DH-HMAC-CHAP keys of %s on %s %s", hostnqn, nqn, "changed" if auth else "removed")
        self._changed(nqn)

    def set_host_psk(self, nqn: str, hostnqn: str, psk: str | ConfiguredPsk | None) -> None:
        """Give a host of `nqn` a TLS PSK (a keyring name or a key), or take it away
        (None). Connections already made stay; the next handshake uses the new key."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn!r} is not a host of {nqn}")
        if psk is None:
            subsystem.host_psks.pop(hostnqn, None)
            subsystem.host_psk_names.pop(hostnqn, None)
        else:
            name, key = self._resolve_psk(psk)
            subsystem.host_psks[hostnqn] = key
            subsystem.host_psk_names[hostnqn] = name
        self._changed(nqn)

    def _resolve_psk(self, psk: str | ConfiguredPsk) -> tuple[str, ConfiguredPsk]:
        if isinstance(psk, ConfiguredPsk):
            return "", psk
        if not isinstance(psk, str):
            raise ChangeError("psk", "a keyring name or a PSK in the interchange format")
        entry = self.keyring.get(psk)
        if entry is not None:
            if not isinstance(entry.key, ConfiguredPsk):
                raise ChangeError("psk", f"key {psk!r} is not a TLS PSK")
            return psk, entry.key
        try:
            return "", ConfiguredPsk.parse(psk)
        except PskError as exc:
            if psk.startswith("NVMeTLSkey-1:"):
                raise ChangeError("psk", str(exc)) from None
            raise ChangeError("psk", f"no key named {psk!r} in the keyring") from None

    def tls_lookup(self, port: Port) -> Callable[[bytes], list[TlsPsk]]:
        """The PSK for a TLS identity a host offers on `port`: the identity names the host
        and the subsystem (NVMe0R0x <hostnqn> <subnqn>, NVMe1R0x ... <digest>, and NVMe1G0x
        ... <digest> for a PSK secure channel concatenation generated)."""

        def lookup(identity: bytes) -> list[TlsPsk]:
            try:
                words = identity.decode("ascii").split(" ")
            except UnicodeDecodeError:
                return []
            if len(words) not in (3, 4) or not words[0].startswith("NVMe"):
                return []
            hostnqn, subnqn = words[1], words[2]
            subsystem = self.subsystems.get(subnqn)
            if subsystem is None or not port.exposes(subnqn):
                return []
            if words[0][5:6] == "G":
                if not subsystem.host_allowed(hostnqn) or hostnqn not in subsystem.host_auth:
                    return []
                return self.generated_psks.find(identity)
            configured = subsystem.host_psks.get(hostnqn)
            if configured is None or not subsystem.host_allowed(hostnqn):
                return []
            # The RFC 8446 derivation, and libnvme < 1.14's (nvme-cli 2.13 put keys so
            # derived in Debian 13's keyrings): the binder tells which the host used.
            return [
                psk
                for compat in (False, True)
                for psk in tls_psks(configured, hostnqn, subnqn, compat=compat)
                if psk.identity == identity
            ]

        return lookup

    def remove_host(self, nqn: str, hostnqn: str) -> None:
        """Take `hostnqn` off the subsystem's hosts; its controllers there are torn down."""
        subsystem = self._subsystem(nqn)
        if hostnqn not in subsystem.allowed_hosts:
            raise ChangeError("hostnqn", f"{hostnqn!r} is not a host of {nqn}")
        subsystem.allowed_hosts.discard(hostnqn)
        subsystem.host_auth.pop(hostnqn, None)
        self.generated_psks.forget(hostnqn=hostnqn, subnqn=nqn)
        subsystem.host_psks.pop(hostnqn, None)
        subsystem.host_psk_names.pop(hostnqn, None)
        for ctrl in list(subsystem.controllers.values()):
            if ctrl.hostnqn == hostnqn:
                ctrl.destroy("host removed from the subsystem")
        self._discovery_changed()
        self._changed(nqn)

    def set_allow_any_host(self, nqn: str, allow: bool) -> None:
        """Let any host connect, or only the subsystem's hosts: the controllers of hosts
        that may no longer connect are torn down."""
        subsystem = self._subsystem(nqn)
        if not isinstance(allow, bool):
            raise ChangeError("allow_any_host", "not a boolean")
        if subsystem.allow_any_host == allow:
            return
        subsystem.allow_any_host = allow
        for ctrl in list(subsystem.controllers.values()):
            if not subsystem.host_allowed(ctrl.hostnqn):
                ctrl.destroy("host no longer allowed on the subsystem")
        self._discovery_changed()
        self._changed(nqn)

    # -- ports and listeners ------------------------------------------------------------

    def find_port(self, address: str, port: int) -> Port | None:
        for candidate in self.ports:
            if candidate.same_address(address, port):
                return candidate
        return None

    async def add_port(self, port: Port) -> Port:
        """Listen on a new port (at once, if the target is running)."""
        self._check_port(port)
        if self._running:
            await self._listen(port)
        self._place_port(port)
        self._discovery_changed()
        return port

    def _check_port(self, port: Port) -> None:
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
        if port.port and self.find_port(port.address, port.port) is not None:
            raise ChangeError("port", f"the target already listens on {port}")
        if port.subsystems is not None:
            port.subsystems = list(dict.fromkeys(port.subsystems))
        if port.secure_channel not in SECURE_CHANNELS:
            raise ChangeError(
                "secure_channel", f"{port.secure_channel!r} is not one of {SECURE_CHANNELS}"
            )
        if port.ktls not in KTLS_POLICIES:
            raise ChangeError("ktls", f"{port.ktls!r} is not one of {KTLS_POLICIES}")
        _check_transport(port.transport)

    def _place_port(self, port: Port) -> None:
        used = {p.portid for p in self.ports}
        if not port.portid or port.portid in used:
            port.portid = next(i for i in range(1, len(used) + 2) if i not in used)
        self.ports.append(port)

    async def _listen(self, port: Port) -> None:
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: TargetProtocol(self, port),
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

    async def remove_port(self, port: Port) -> None:
        """Stop listening on `port`: every controller with a queue through it is torn
        down and every connection through it closed."""
        if not any(p is port for p in self.ports):
            raise ChangeError("port", f"the target does not listen on {port}")
        self.ports = [p for p in self.ports if p is not port]
        for subsystem in self.subsystems.values():
            subsystem.ana.forget_port(port)
        for subsystem in [*self.subsystems.values(), self.discovery]:
            for ctrl in list(subsystem.controllers.values()):
                if any(queue.port is port for queue in ctrl.queues.values()):
                    ctrl.destroy(f"port {port} removed")
        for proto in list(port.connections):
            proto.close(f"port {port} removed")
        server, port.server = port.server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        log.info("stopped listening on %s", port)
        self._discovery_changed()

    async def add_listener(
        self, nqn: str, address: str, port_number: int, *, secure_channel: str | None = None
    ) -> Port:
        """Let subsystem `nqn` (or the discovery subsystem) be reached on address:port,
        opening the port if the target does not listen there yet. `secure_channel` sets a
        new port's TLS requirement; on a port that exists it must match."""
        if nqn != DISCOVERY_NQN:
            self._subsystem(nqn)
        if secure_channel is not None and secure_channel not in SECURE_CHANNELS:
            raise ChangeError(
                "secure_channel", f"{secure_channel!r} is not one of {SECURE_CHANNELS}"
            )
        port = self.find_port(address, port_number) if port_number else None
        if port is None:
            if nqn == DISCOVERY_NQN:
                new = Port(address, port_number, discovery_only=True, discovery_listener=True)
            else:
                new = Port(address, port_number, subsystems=[nqn])
            new.transport = self.transport
            new.secure_channel = secure_channel or "none"
            await self.add_port(new)
            if nqn != DISCOVERY_NQN:
                self._changed(nqn)
            return new
        if secure_channel is not None and secure_channel != port.secure_channel:
            raise ChangeError(
                "secure_channel",
                f"{port} already listens with secure channel {port.secure_channel!r}",
            )
        if nqn == DISCOVERY_NQN:
            port.discovery_listener = True
            return port
        if port.discovery_only:
            port.discovery_only = False
            port.subsystems = [nqn]
        elif port.subsystems is None:
            return port  # it exposes every subsystem: this one already listens there
        elif nqn in port.subsystems:
            raise ChangeError("address", f"{nqn} already listens on {port}")
        else:
            port.subsystems.append(nqn)
        self._discovery_changed()
        self._changed(nqn)
        return port

    async def remove_listener(self, nqn: str, address: str, port_number: int) -> None:
        """Subsystem `nqn` is no longer reached on address:port: its controllers with a
        queue through the port are torn down; a port left with nothing to serve closes."""
        port = self.find_port(address, port_number)
        if port is None:
            raise ChangeError("address", f"the target does not listen on {address} {port_number}")
        if nqn == DISCOVERY_NQN:
            if port.discovery_only:
                await self.remove_port(port)
            else:
                port.discovery_listener = False
            return
        subsystem = self._subsystem(nqn)
        if not port.exposes(nqn):
            raise ChangeError("address", f"{nqn} does not listen on {port}")
        if port.subsystems is None:
            port.subsystems = [other for other in self.subsystems if other != nqn]
        else:
            port.subsystems.remove(nqn)
        subsystem.ana.forget_port(port)
        for ctrl in list(subsystem.controllers.values()):
            if any(queue.port is port for queue in ctrl.queues.values()):
                ctrl.destroy(f"listener {port} removed")
        if not port.subsystems:
            await self._emptied(port)
        self._discovery_changed()
        self._changed(nqn)

    async def _emptied(self, port: Port) -> None:
        """An I/O port whose last subsystem left: discovery-only if asked for, else gone."""
        if port.discovery_listener:
            port.discovery_only = True
        elif any(p is port for p in self.ports):
            await self.remove_port(port)

    # -- ANA ----------------------------------------------------------------------------

    def listener(self, nqn: str, address: str, port_number: int) -> Port:
        """The port through which subsystem `nqn` is reached on address:port."""
        self._subsystem(nqn)
        port = self.find_port(address, port_number)
        if port is None or port.discovery_only or not port.exposes(nqn):
            raise ChangeError("address", f"{nqn} does not listen on {address} {port_number}")
        return port

    def add_ana_group(
        self, nqn: str, grpid: int, state: AnaState | str = AnaState.OPTIMIZED
    ) -> ana.AnaGroup:
        """A new ANA group of subsystem `nqn`, in `state` on every listener, with no
        namespaces yet (they name it when they are added)."""
        subsystem = self._subsystem(nqn)
        _check_grpid(grpid)
        new_state = _check_state(state)
        if subsystem.ana.group(grpid) is not None:
            raise ChangeError("anagrpid", f"{nqn} has ANA group {grpid}")
        group = subsystem.ana.add(grpid, new_state)
        for ctrl in list(subsystem.controllers.values()):
            ctrl.ana_changed()
        return group

    def set_ana_state(
        self,
        nqn: str,
        anagrpid: int | None,
        state: AnaState | str,
        address: str | None = None,
        port_number: int | None = None,
    ) -> int:
        """Put ANA group `anagrpid` of subsystem `nqn` (every group of it if None) in
        `state` on the listener address:port_number, or, without an address, on every
        listener of the subsystem (and on those added later). The controllers whose ANA
        log says something new, and only they, get an ANA Change event; the log's change
        count moves on. Returns the number of controllers told."""
        subsystem = self._subsystem(nqn)
        new_state = _check_state(state)
        if anagrpid is None:
            groups = list(subsystem.ana.groups.values())
        else:
            _check_grpid(anagrpid)
            group = subsystem.ana.group(anagrpid)
            if group is None:
                raise ChangeError(
                    "anagrpid",
                    f"{nqn} has no ANA group {anagrpid} (groups: "
                    f"{', '.join(map(str, sorted(subsystem.ana.groups)))})",
                )
            groups = [group]
        port = None if address is None else self.listener(nqn, address, port_number or 0)
        controllers = list(subsystem.controllers.values())
        ports = {ctrl.port for ctrl in controllers}
        if port is not None:
            ports.add(port)
        before = {(g.grpid, p): g.state_on(p) for g in groups for p in ports}
        changed = []
        for g in groups:
            old = (g.state, dict(g.on_port))
            if port is None:
                g.state = new_state
                g.on_port.clear()
            else:
                g.on_port[port] = new_state
            if (g.state, g.on_port) != old:
                changed.append(g)
        if not changed:
            return 0
        subsystem.ana.changed(changed)
        groups_now = subsystem.ana.groups
        moved = {p for (grpid, p), was in before.items() if groups_now[grpid].state_on(p) != was}
        log.info(
            "ANA group%s %s of %s %s on %s",
            "" if len(changed) == 1 else "s",
            ",".join(str(g.grpid) for g in changed),
            nqn,
            ana.NAMES[new_state],
            port if port is not None else "every listener",
        )
        told = 0
        for ctrl in controllers:
            if ctrl.port in moved:
                ctrl.ana_changed()
                told += 1
        return told

    # -- gateways ------------------------------------------------------------------------

    def add_peer_listener(self, nqn: str, address: str, port_number: int, portid: int = 0) -> None:
        """Another gateway serves subsystem `nqn` on address:port_number: the discovery log
        lists it, so a host that discovers through this target finds that path too."""
        subsystem = self._subsystem(nqn)
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ChangeError("address", f"{address!r} is not an IP address") from None
        if not isinstance(port_number, int) or not 1 <= port_number <= 0xFFFF:
            raise ChangeError("port", f"{port_number!r} is not a TCP port")
        if not isinstance(portid, int) or not 0 <= portid <= 0xFFFF:
            raise ChangeError("portid", f"{portid!r} is not a port ID")
        for peer_address, peer_port, _ in subsystem.peer_listeners:
            if peer_port == port_number and _normal_address(peer_address) == _normal_address(
                address
            ):
                raise ChangeError("address", f"{address} {port_number} is a peer of {nqn}")
        subsystem.peer_listeners.append((address, port_number, portid or port_number))
        self._discovery_changed()

    def remove_peer_listener(self, nqn: str, address: str, port_number: int) -> None:
        subsystem = self._subsystem(nqn)
        for entry in subsystem.peer_listeners:
            if entry[1] == port_number and _normal_address(entry[0]) == _normal_address(address):
                subsystem.peer_listeners.remove(entry)
                self._discovery_changed()
                return
        raise ChangeError("address", f"{address} {port_number} is not a peer listener of {nqn}")

    # -- discovery ------------------------------------------------------------------------

    def _discovery_changed(self) -> None:
        """What some host's discovery log holds may have changed: a new generation, and
        an event to every discovery controller that asked for one."""
        self.genctr += 1
        for ctrl in list(self.discovery.controllers.values()):
            ctrl.discovery_changed()

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
        for subsystem in self.subsystems.values():
            if subsystem.host_allowed(hostnqn):
                for address, port_number, portid in subsystem.peer_listeners:
                    peer = Port(address, port_number, portid=portid)
                    entries.append(self._entry(peer, subsystem.nqn, L.SubType.NVME, queue))
        entries.append(self._entry(queue.port, DISCOVERY_NQN, L.SubType.CURRENT_DISCOVERY, queue))
        return L.discovery_log(self.genctr, entries)

    def _entry(self, port: Port, nqn: str, subtype: int, queue: TargetQueue) -> L.DiscoveryLogEntry:
        address = port.advertise or port.address
        if not address or ipaddress.ip_address(address).is_unspecified:
            # A wildcard listener: tell the host the address it reached us on.
            address = queue.local_address
        return L.DiscoveryLogEntry(
            trtype=L.TrType.TCP,
            adrfam=L.AdrFam.IPV6 if ":" in address else L.AdrFam.IPV4,
            subtype=subtype,
            # As nvmet reports a port: secure channel "not specified" (nvmet's default) where
            # there is no TLS, not "not required": libnvme 1.3 (nvme-cli 2.3) reads "not
            # required" as TLS being possible and has connect-all ask Linux 6.1 for TLS,
            # which that kernel refuses; "required" when only TLS is accepted, "not
            # required" when either is; SECTYPE TLS 1.3 in the TSAS whenever TLS is.
            treq=_TREQ[port.secure_channel] | L.Treq.DISABLE_SQFLOW,
            tsas=bytes(
                [L.TcpSecType.TLS13 if port.secure_channel != "none" else L.TcpSecType.NONE]
            ),
            portid=port.portid,
            cntlid=0xFFFF,
            asqsz=32,
            trsvcid=str(port.port),
            subnqn=nqn,
            traddr=address,
        )


def _holds_tls_psk(path: str) -> bool:
    """Whether a key file holds a TLS PSK (else a DH-HMAC-CHAP secret, or an error)."""
    try:
        with open(path, "rb") as f:
            return f.read(16).lstrip().startswith(b"NVMeTLSkey-")
    except OSError:
        return False


def read_psk_file(path: str) -> ConfiguredPsk:
    """A TLS PSK from a file in the interchange format; the file must not be readable by
    group or others (SPDK's rule for key files). Errors never show the key."""
    import os

    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise ChangeError(
                "path", f"key file {path} is accessible by group or others (it must be 0600)"
            )
        with open(path, encoding="ascii") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError) as exc:
        raise ChangeError("path", f"cannot read key file {path}: {exc}") from None
    try:
        return ConfiguredPsk.parse(text)
    except PskError as exc:
        raise ChangeError("path", f"key file {path}: {exc}") from None


def _check_hostnqn(hostnqn: str) -> None:
    problem = nqn_problem(hostnqn)
    if problem:
        raise ChangeError("hostnqn", f"{hostnqn!r} is not a valid NQN: {problem}")
    if hostnqn == DISCOVERY_NQN:
        raise ChangeError("hostnqn", "the discovery NQN is not a host's")


def _check_grpid(grpid: object) -> None:
    if not isinstance(grpid, int) or isinstance(grpid, bool) or not 1 <= grpid <= ana.ANAGRPMAX:
        raise ChangeError("anagrpid", f"{grpid!r} is not an ANA group ID (1..{ana.ANAGRPMAX})")


def _check_state(state: object) -> AnaState:
    parsed = ana.parse_state(state)
    if parsed is None:
        raise ChangeError(
            "ana_state", f"{state!r} is not an ANA state ({', '.join(ana.STATE_NAMES)})"
        )
    return parsed


def _check_text(field: str, text: str, limit: int) -> None:
    if not isinstance(text, str) or len(text) > limit or not all(" " <= c <= "~" for c in text):
        raise ChangeError(field, f"{text!r} is not printable ASCII of at most {limit} characters")


def _check_transport(config: TransportConfig) -> None:
    inline = config.inline_data_size
    if not isinstance(inline, int) or inline % 16 or not 0 <= inline <= INLINE_DATA_MAX:
        raise ChangeError(
            "inline_data_size", f"{inline!r} is not a multiple of 16 between 0 and 1 MiB"
        )
    h2c = config.max_h2c_data
    if not isinstance(h2c, int) or h2c < MIN_H2C_DATA or h2c % 4:
        raise ChangeError("max_h2c_data", f"{h2c!r} is not a multiple of 4 of at least 4096")


async def _drain(waiting: set[asyncio.Task[None]], subsystem: Subsystem | None = None) -> None:
    """Wait for the commands that were in flight. If some do not finish in time, tear
    down the controllers holding them (their hosts retry elsewhere or later), whose
    commands then end as their connections close."""
    if not waiting:
        return
    _done, pending = await asyncio.wait(waiting, timeout=DRAIN_TIMEOUT)
    if not pending:
        return
    if subsystem is not None:
        for ctrl in list(subsystem.controllers.values()):
            if any(
                task in queue.commands_waiting for queue in ctrl.queues.values() for task in pending
            ):
                log.warning(
                    "controller %d of %s: commands did not finish in %.0f s, tearing it down",
                    ctrl.cntlid,
                    subsystem.nqn,
                    DRAIN_TIMEOUT,
                )
                ctrl.destroy("commands in flight did not finish")
    _done, pending = await asyncio.wait(pending, timeout=DRAIN_TIMEOUT)
    if pending:
        log.error("%d commands still in flight after their controllers went away", len(pending))


async def _close_device(entry: NamedDevice) -> None:
    try:
        await entry.device.flush()
    except OSError as exc:
        log.error("flushing %s failed: %s", entry.name, exc)
    await entry.device.close()


class TargetProtocol(asyncio.BufferedProtocol):
    def __init__(self, target: Target, port: Port) -> None:
        self.target = target
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.conn = TargetConnection(port.transport, self._no_command, self._output_wanted)
        self.queue: TargetQueue | None = None
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self.accepted = time.monotonic()
        self.peer_address = ""
        self.admitted = False
        # Why input is not being read now ("write": the host does not read what we send):
        # reading resumes when none holds. (A command waiting for data buffers does not
        # stop input: the data of transfers already granted must keep arriving, and what
        # waits holds no buffer; SQSIZE bounds how many commands can wait.)
        self._input_holds: set[str] = set()
        self._rx_charge = 0  # the receive buffer, charged to the target's memory pool
        # The secure channel on a port that offers TLS; until the first bytes arrive,
        # `_sniffing` (is this TLS or plain NVMe/TCP?).
        self.tls: SecureChannel | None = None
        self._sniffing = False

    @staticmethod
    def _no_command(_req: object) -> None:
        raise AssertionError("command before connection_made")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sockname = transport.get_extra_info("sockname")
        peer = transport.get_extra_info("peername")
        self.peer_address = peer[0] if peer else ""
        if not self.target.connection_budget.admit(self.peer_address):
            self.transport.abort()
            return
        self.admitted = True
        log.debug("connection from %s on %s", peer, self.port)
        self.queue = TargetQueue(self.target, self.port, self.conn, sockname[0])
        if peer:
            self.queue.peer_address = (peer[0], peer[1])
        self.conn.on_command = self.queue.on_command
        self.conn.flush_now = self._flush
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.port.connections.add(self)
        if self.port.secure_channel != "none":
            self.tls = SecureChannel(
                TlsEngine.server(self.target.tls_lookup(self.port)),
                self.transport,
                self.conn.feed,
                self._tls_established,
                self._tls_failed,
                ktls=self.port.ktls,
                label=f"connection from {self.peer_address} on {self.port}",
                counters=self.target.tls_counters,
            )
            self._sniffing = True

    def _tls_established(self) -> None:
        tls, queue = self.tls, self.queue
        if tls is not None and queue is not None:
            queue.tls_psk = tls.engine.psk

    def _tls_failed(self, reason: str) -> None:
        # The reason names the failure (alert, field), never a key or a secret.
        clean = self.tls is not None and self.tls.clean_close
        log.log(
            logging.INFO if clean else logging.WARNING,
            "TLS from %s on %s %s: %s",
            self.peer_address,
            self.port,
            "closed" if clean else "failed",
            reason,
        )
        self.conn.close(f"TLS: {reason}")

    def _sniff(self, tls: SecureChannel, nbytes: int) -> bool:
        """The connection's first bytes: a TLS handshake record, or plain NVMe/TCP (an
        ICReq) where the port allows it. False: the connection is refused."""
        self._sniffing = False
        first = tls.engine.peek_input(nbytes)
        if first[:1] == bytes([CT_HANDSHAKE]):
            return True
        if self.port.secure_channel == "required":
            log.warning(
                "connection from %s on %s refused: the port requires TLS, the host sent "
                "plain NVMe/TCP",
                self.peer_address,
                self.port,
            )
            self.target.tls_counters.handshake_failures += 1
            self.abort("TLS required")
            return False
        self.tls = None
        self.conn.feed(first)
        return False

    def overdue(self, now: float) -> str:
        """Why this connection has waited too long for its host, or "" if it has not."""
        queue = self.queue
        limits = self.target.connection_budget.limits
        unbound = queue is not None and queue.controller is None
        if unbound and now - self.accepted > limits.connect_deadline_s:
            return f"no Connect within {limits.connect_deadline_s:g} s of the connection"
        if queue is not None and queue.auth_deadline and now > queue.auth_deadline:
            return "the queue did not authenticate in time"
        since = self.conn.reader.partial_since
        if since and now - since > limits.pdu_deadline_s:
            return f"a PDU started {now - since:.0f} s ago is still incomplete"
        return ""

    def abort(self, reason: str) -> None:
        self.conn.close(reason)
        if self.transport is not None:
            self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        tls = self.tls
        if tls is not None and tls.rx_user:
            return tls.get_buffer(sizehint)
        return self.conn.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        poller = self.target.poller
        if poller is not None:
            poller.input()
        tls = self.tls
        if tls is not None and tls.rx_user:
            if not self._sniffing or self._sniff(tls, nbytes):
                tls.buffer_updated(nbytes)
        else:
            conn.data_received(nbytes)
        if not self._rx_charge and conn.established:
            self._charge_receive_buffer()
        self._flush()

    def _charge_receive_buffer(self) -> None:
        """The handshake sized the receive buffer: it counts against the target's memory
        like any data buffer, and a connection the pool cannot hold goes."""
        size = len(self.conn.reader._buf)
        if self.tls is not None:
            size += self.tls.engine.buffer_size
        pool = self.target.memory_pool
        if pool.used + size > pool.capacity:
            log.warning(
                "connection from %s on %s closed: the target's memory limit (%d bytes) is reached",
                self.peer_address,
                self.port,
                pool.capacity,
            )
            self.abort("memory limit")
            return
        pool.charge(size)
        self._rx_charge = size

    def _hold_input(self, reason: str, hold: bool) -> None:
        holds = self._input_holds
        transport = self.transport
        if hold:
            if not holds and transport is not None:
                transport.pause_reading()
            holds.add(reason)
        elif reason in holds:
            holds.discard(reason)
            if not holds and transport is not None and not transport.is_closing():
                transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def close(self, reason: str) -> None:
        """Close the connection (the port or target is going away)."""
        self.conn.close(reason)
        self._flush()

    def _output_wanted(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        conn = self.conn
        out = conn.take_output()
        tls = self.tls
        if out:
            if tls is not None:
                tls.write(out)
            else:
                transport.writelines(out)
            # Read data still in the socket's buffer stays charged only above the high
            # water mark: past it asyncio pauses us and resume_writing gives it back; below
            # it (the bound is the mark itself) no callback would ever come.
            if conn.undrained and transport.get_write_buffer_size() <= WRITE_HIGH_WATER:
                conn.output_drained()
        if conn.closing:
            if tls is not None:
                tls.close()
            transport.close()

    def pause_writing(self) -> None:
        # The host is not reading its completions: stop reading its commands.
        self._hold_input("write", True)

    def resume_writing(self) -> None:
        self.conn.output_drained()
        self._hold_input("write", False)

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        tls = self.tls
        if tls is not None and tls.rx_kernel and kernel_record_error(exc):
            # An alert (close_notify, or a failure) or a post-handshake message came to the
            # kernel's record layer: recv() cannot return it as data. The connection ends.
            conn.close("a TLS control record (alert) arrived")
        if conn.established:
            # One line per connection: what the transport did, for users and for tests
            # that check offload decisions (in-capsule vs R2T, digests) made with real hosts.
            s = conn.stats
            queue = self.queue
            ctrl = queue.controller if queue is not None else None
            log.info(
                "connection closed: port=%s qid=%d cntlid=%d digests=%s%s commands=%d "
                "r2t=%d h2c_data=%d c2h_data=%d in_capsule_bytes=%d data_digest_errors=%d "
                "term_reqs=%d tls=%s reason=%s",
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
                tls.offload if tls is not None else "-",
                conn.close_reason or "host closed",
            )
        if self.admitted:
            self.admitted = False
            self.target.connection_budget.release(self.peer_address)
        conn.close("connection lost")
        self.port.connections.discard(self)
        if self.queue is not None:
            self.queue.connection_lost()
        # Nothing may keep a closed connection alive until a full garbage collection:
        # its receive buffer alone is 256 KiB.
        conn.release()
        if self._rx_charge:
            self.target.memory_pool.give(self._rx_charge)
            self._rx_charge = 0
        self.queue = None
        self.transport = None
