"""Target configuration: pynvmf's JSON file format, read into and written from a Target.

Reading builds the target through the Target's change methods (the ones the RPC
methods call), so there is one path from any configuration to a running target.
The CLI's options build the same dictionary a JSON file holds. Writing describes a
running target in the same format, so that `pynvmf target --config` starts it again.
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pynvmf import units
from pynvmf.auth.controller import ALL_DHGROUPS, ALL_HASHES, HostAuthConfig
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.block.rbd import DEFAULT_IO_TIMEOUT, RbdDevice, RbdUnavailable, parse_image_spec
from pynvmf.spec.auth import dhgroup_from_name, hash_from_name
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.spec.ports import DISCOVERY_PORT, NVME_TCP_PORT
from pynvmf.target import ana, qos
from pynvmf.target import devices as D
from pynvmf.target.changes import ChangeError
from pynvmf.target.devices import NamedDevice
from pynvmf.target.faults import parse_scenario
from pynvmf.target.port import TRTYPES, Port, endpoint
from pynvmf.target.referrals import Referral
from pynvmf.target.subsystem import CNTLID_MAX, CNTLID_MIN, DEFAULT_VERSION, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.target import TransportConfig

DEFAULT_NQN = "nqn.2024-11.dev.pynvmf:default"
DEFAULT_MEMORY = 1 << 30
DEFAULT_BLOCK_SIZE = 512

_DEFAULT_TRANSPORT = TransportConfig()

# "gateway" is read by the CLI (pynvmf.ha.gateway): leases need a running loop and a cluster.
# "metrics" too (metrics_listen_of): the endpoint is the process's, not the Target's.
_TOP_KEYS = {
    "ports",
    "discovery_ports",
    "subsystems",
    "devices",
    "transport",
    "keyring",
    "gateway",
    "metrics",
    "referrals",
    "faults",
    "crdt",
}
_METRICS_KEYS = {"listen"}
_KEY_KEYS = {"name", "path"}
# A host entry as an object: its NQN, DH-HMAC-CHAP keys (keyring names), hashes, groups,
# and its TLS PSK (a keyring name, or the key itself in the interchange format).
_HOST_KEYS = {"nqn", "dhchap_key", "dhchap_ctrl_key", "dhchap_hash", "dhchap_dhgroup", "psk"}
# What an export writes for a key that has no keyring name (one nvmetcli's format gave, or
# a PSK given inline): never the secret; loading it fails, naming the key.
REDACTED_KEY = "<redacted>"
_PORT_KEYS = {
    "trtype",
    "secure_channel",
    "ktls",
    "address",
    "port",
    "subsystems",
    "inline_data_size",
    "max_h2c_data",
    "header_digest",
    "data_digest",
    "discovery",
    "advertise",
}
_TRANSPORT_KEYS = {"inline_data_size", "max_h2c_data", "header_digest", "data_digest"}
_SUBSYSTEM_KEYS = {
    "nqn",
    "hosts",
    "allow_any_host",
    "serial",
    "model",
    "namespaces",
    "max_namespaces",
    "cntlid_min",
    "cntlid_max",
    "max_io_queues",
    "version",
    "firmware",
    "ieee_oui",
    "copy_formats",
    "ana_groups",
    "peer_listeners",
}
_ANA_GROUP_KEYS = {"grpid", "state", "listeners"}
_ANA_LISTENER_KEYS = {"address", "port", "state"}
_PEER_KEYS = {"address", "port", "portid"}
_REFERRAL_KEYS = {"address", "port", "subnqn", "secure_channel"}
_DEVICE_KEYS = {"memory", "file", "rbd", "size", "create", "block_size", "read_only", "qos"}
_RBD_KEYS = {"pool", "image", "conf", "client", "options", "io_timeout"}
_NAMESPACE_KEYS = _DEVICE_KEYS | {
    "nsid",
    "uuid",
    "nguid",
    "eui64",
    "device",
    "ptpl_file",
    "anagrpid",
    "auto_visible",
    "hosts",
}
# A file namespace's reservations persist beside its file unless told otherwise.
PTPL_SUFFIX = ".ptpl.json"


class ConfigError(ValueError):
    pass


def parse_metrics_listen(text: str) -> tuple[str, int]:
    """Where the metrics endpoint listens: parse_listen's ADDR:PORT, the port required
    (NVMe/TCP's default port is no default for HTTP)."""
    address, port = parse_listen(text)
    if not re.search(r":\d+$", text):
        raise ConfigError(f"{text!r}: the metrics endpoint needs a port (ADDR:PORT)")
    return address, port


def metrics_listen_of(config: dict[str, Any]) -> tuple[str, int] | None:
    """The configuration's "metrics": {"listen": "ADDR:PORT"}, if any."""
    if "metrics" not in config:
        return None
    r = Reader(config["metrics"], "config.metrics", _METRICS_KEYS)
    listen = r.get("listen", str)
    if listen is None:
        return None
    try:
        return parse_metrics_listen(listen)
    except ConfigError as exc:
        raise ConfigError(f"config.metrics.listen: {exc}") from None


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:4420', '[::1]:4420', '0.0.0.0' -> (address, port).

    Strict, as host input is: an address that is not an IP address, or a port outside
    0..65535, is refused here rather than wrapped or resolved by the socket layer
    ('1.2.3' would bind 1.2.0.3; port 99999 would bind 34463)."""
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\](?::([^:]*))?", text)
    if m:
        host, port_text = m.group(1), m.group(2)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, None
        elif ":" in host:
            raise ConfigError(f"IPv6 addresses need brackets: {text!r}")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{text!r}: {host!r} is not an IP address") from None
    if m is None and ip.version == 6:
        raise ConfigError(f"IPv6 addresses need brackets: {text!r}")
    if port_text is None:
        return host, NVME_TCP_PORT
    if not port_text.isdigit() or not 0 <= int(port_text) <= 0xFFFF:
        raise ConfigError(f"{text!r}: {port_text!r} is not a TCP port (0 to 65535)")
    return host, int(port_text)


def parse_transport_listen(text: str) -> tuple[str, str, int]:
    """'rdma:10.0.2.15:4420', 'tcp:[::1]:4420', '127.0.0.1:4420' -> (trtype, address, port):
    parse_listen's ADDR:PORT after an optional transport (NVMe/TCP when none is named)."""
    trtype, sep, rest = text.partition(":")
    if sep and trtype in TRTYPES:
        return trtype, *parse_listen(rest)
    return "tcp", *parse_listen(text)


def parse_version(text: str | int) -> int:
    """'1.3', '2.0', '1.2.1' (or the VS register's value) -> the VS register's value."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not m:
        raise ConfigError(f"not an NVMe version: {text!r}")
    return int(m.group(1)) << 16 | int(m.group(2)) << 8 | int(m.group(3) or 0)


def format_version(vs: int) -> str:
    tertiary = vs & 0xFF
    text = f"{vs >> 16}.{(vs >> 8) & 0xFF}"
    return f"{text}.{tertiary}" if tertiary else text


# -- reading ------------------------------------------------------------------------------


class Reader:
    """Typed access to one object of the file, with error messages that name the key."""

    def __init__(self, obj: Any, where: str, keys: set[str]) -> None:
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: not an object")
        unknown = sorted(set(obj) - keys)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key")
        self.obj = obj
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        if key not in self.obj:
            return default
        value = self.obj[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
            raise ConfigError(f"{self.path(key)}: {value!r} has the wrong type")
        return value

    def convert(self, key: str, parse: Callable[[Any], Any], default: Any = None) -> Any:
        if key not in self.obj:
            return default
        try:
            return parse(self.obj[key])
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{self.path(key)}: {exc}") from None

    def items(self, key: str) -> list[Any]:
        value = self.get(key, list, [])
        return list(value)


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def transport_of(spec: dict[str, Any], where: str, base: TransportConfig) -> TransportConfig:
    r = Reader(
        {k: v for k, v in spec.items() if k in _TRANSPORT_KEYS},
        where,
        _TRANSPORT_KEYS,
    )
    return TransportConfig(
        inline_data_size=r.convert("inline_data_size", units.parse_size, base.inline_data_size),
        max_h2c_data=r.convert("max_h2c_data", units.parse_size, base.max_h2c_data),
        allow_header_digest=r.get("header_digest", bool, base.allow_header_digest),
        allow_data_digest=r.get("data_digest", bool, base.allow_data_digest),
        cpda=base.cpda,
    )


def open_device(
    spec: dict[str, Any],
    where: str,
    name: str,
    *,
    owned: bool,
    memory: Callable[[int, int], MemoryDevice] = MemoryDevice,
) -> NamedDevice:
    """The block device a namespace or devices[] entry describes, opened; a memory
    device made by `memory` (the target's: shared memory when workers serve I/O)."""
    r = Reader(spec, where, _NAMESPACE_KEYS | {"name"})
    block_size = r.get("block_size", int, DEFAULT_BLOCK_SIZE)
    dev_uuid = None if owned else r.convert("uuid", uuid.UUID)
    try:
        if "memory" in spec:
            size = r.convert("memory", units.parse_size)
            return NamedDevice.wrap(
                name, memory(size, block_size), device_uuid=dev_uuid, owned=owned
            )
        if "file" in spec:
            path = Path(r.get("file", str))
            size = r.convert("size", units.parse_size)
            create = r.get("create", bool, size is not None and not path.exists())
            read_only = r.get("read_only", bool, False)
            device = FileDevice(
                path, block_size, size_bytes=size, create=create, read_only=read_only
            )
            return NamedDevice.wrap(name, device, device_uuid=dev_uuid, owned=owned)
        if "rbd" in spec:
            read_only = r.get("read_only", bool, False)
            device = RbdDevice.open(
                **rbd_options(spec["rbd"], r.path("rbd")),
                block_size=block_size,
                read_only=read_only,
            )
            return NamedDevice.wrap(name, device, device_uuid=dev_uuid, owned=owned)
    except RbdUnavailable as exc:
        raise ConfigError(f"{where}.rbd: {exc}") from exc
    except OSError as exc:
        what = f"{exc.filename}: " if exc.filename else ""
        raise ConfigError(f"{where}: {what}{exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    raise ConfigError(f"{where}: a namespace needs 'memory', 'file', 'rbd' or 'device'")


def rbd_options(spec: Any, where: str) -> dict[str, Any]:
    """An "rbd" entry as RbdDevice.open's keyword arguments: "POOL/IMAGE", or
    {"pool", "image", "conf", "client", "options", "io_timeout"} (pool defaults to "rbd",
    conf to librados' own search: $CEPH_CONF, /etc/ceph/ceph.conf)."""
    if isinstance(spec, str):
        try:
            pool, image = parse_image_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return {"pool": pool, "image": image}
    r = Reader(spec, where, _RBD_KEYS)
    image = r.get("image", str)
    if not image:
        raise ConfigError(f"{r.path('image')}: an RBD namespace needs an image name")
    pool = r.get("pool", str, "rbd")
    if not pool:
        raise ConfigError(f"{r.path('pool')}: an empty pool name")
    options = r.get("options", dict, {})
    for key, value in options.items():
        if not isinstance(value, (str, int, float, bool)) or isinstance(value, bool):
            raise ConfigError(f"{r.path('options')}.{key}: {value!r} is not a string or number")
    timeout = r.get("io_timeout", (int, float), DEFAULT_IO_TIMEOUT)
    if timeout <= 0:
        raise ConfigError(f"{r.path('io_timeout')}: {timeout!r} is not positive")
    return {
        "pool": pool,
        "image": image,
        "conf": r.get("conf", str),
        "client": r.get("client", str),
        "options": {str(k): str(v) for k, v in options.items()},
        "io_timeout": float(timeout),
    }


def rbd_spec_of(device: RbdDevice) -> dict[str, Any]:
    """The "rbd" entry that opens `device` again."""
    spec: dict[str, Any] = {"pool": device.pool, "image": device.image_name}
    cluster = device.cluster_spec
    if cluster.conf is not None:
        spec["conf"] = cluster.conf
    if cluster.client is not None:
        spec["client"] = cluster.client
    if cluster.options:
        spec["options"] = dict(cluster.options)
    if device.io_timeout != DEFAULT_IO_TIMEOUT:
        spec["io_timeout"] = device.io_timeout
    return spec


def _hex_bytes(size: int) -> Callable[[Any], bytes]:
    def parse(text: Any) -> bytes:
        if not isinstance(text, str):
            raise ValueError(f"{text!r} is not a hex string")
        value = bytes.fromhex(text.replace("-", ""))
        if len(value) != size:
            raise ValueError(f"{text!r} is not {size} bytes")
        return value

    return parse


async def apply_config(target: Target, config: dict[str, Any]) -> None:
    """Add what `config` describes to `target`, through its change methods.

    Each change applies completely or not at all, but a configuration is many changes:
    one that fails part way leaves the earlier ones applied (a target being started
    from it is simply not started)."""
    top = Reader(config, "config", _TOP_KEYS)
    try:
        if "transport" in config:
            transport = transport_of(
                top.get("transport", dict), top.path("transport"), target.transport
            )
            _change("transport", lambda: target.set_transport(transport))
        for i, spec in enumerate(top.items("devices")):
            where = f"devices[{i}]"
            r = Reader(spec, where, _DEVICE_KEYS | {"name", "uuid"})
            name = r.get("name", str)
            if not name:
                raise ConfigError(f"{where}.name: a device needs a name")
            entry = open_device(spec, where, name, owned=False, memory=target.memory_device)
            _change(where, lambda entry=entry: target.add_block_device(entry), entry)
            await apply_qos(target, spec, where, name)
        for i, spec in enumerate(top.items("keyring")):
            where = f"keyring[{i}]"
            r = Reader(spec, where, _KEY_KEYS)
            name, path = r.get("name", str), r.get("path", str)
            if not name or not path:
                raise ConfigError(f"{where}: a key needs a name and a path")
            _change(where, lambda name=name, path=path: target.add_key(name, path))
        listener_states: list[tuple[str, str, Callable[[], Any]]] = []
        for i, spec in enumerate(top.items("subsystems")):
            add_subsystem_spec(target, spec, f"subsystems[{i}]", listener_states)
            for j, ns_spec in enumerate(spec.get("namespaces") or []):
                # A namespace's own device is named after it (add_namespace_spec).
                name = ns_spec.get("device") or f"{spec['nqn']}/{ns_spec.get('nsid', j + 1)}"
                await apply_qos(target, ns_spec, f"subsystems[{i}].namespaces[{j}]", name)
        ports = top.items("ports")
        for i, spec in enumerate(ports):
            where = f"ports[{i}]"
            r = Reader(spec, where, _PORT_KEYS)
            subsystems = r.get("subsystems", list)
            if subsystems is not None and not all(isinstance(n, str) for n in subsystems):
                raise ConfigError(f"{where}.subsystems: not a list of NQNs")
            port = Port(
                address=r.get("address", str, "127.0.0.1"),
                port=r.get("port", int, NVME_TCP_PORT),
                subsystems=subsystems,
                transport=transport_of(spec, where, target.transport),
                discovery_listener=r.get("discovery", bool, False),
                advertise=r.get("advertise", str, ""),
                trtype=r.get("trtype", str, "tcp"),
                secure_channel=r.get("secure_channel", str, "none"),
                ktls=r.get("ktls", str, "auto"),
            )
            await _change_async(where, target.add_port(port))
        if "discovery_ports" in config:
            discovery = top.items("discovery_ports")
        else:
            # Discovery-only ports are NVMe/TCP's, beside the tcp ports.
            readers = [Reader(p, "ports[]", _PORT_KEYS) for p in ports]
            addresses = dict.fromkeys(
                r.get("address", str, "127.0.0.1")
                for r in readers
                if r.get("trtype", str, "tcp") == "tcp"
            )
            discovery = [{"address": a, "port": DISCOVERY_PORT} for a in addresses]
        for i, spec in enumerate(discovery):
            where = f"discovery_ports[{i}]"
            r = Reader(
                spec,
                where,
                _PORT_KEYS - {"subsystems", "discovery", "secure_channel", "ktls", "trtype"},
            )
            port = Port(
                address=r.get("address", str, "127.0.0.1"),
                port=r.get("port", int, DISCOVERY_PORT),
                discovery_only=True,
                discovery_listener=True,
                transport=transport_of(spec, where, target.transport),
                advertise=r.get("advertise", str, ""),
            )
            await _change_async(where, target.add_port(port))
        # ANA states of single listeners, once the listeners exist.
        for where, _nqn, apply in listener_states:
            _change(where, apply)
        # Referrals once the target's own listeners exist (none may point at them).
        for i, spec in enumerate(top.items("referrals")):
            where = f"referrals[{i}]"
            r = Reader(spec, where, _REFERRAL_KEYS)
            address = r.get("address", str)
            if address is None:
                raise ConfigError(f"{where}.address: missing")
            referral = Referral(
                address,
                r.get("port", int, DISCOVERY_PORT),
                r.get("subnqn", str, DISCOVERY_NQN),
                r.get("secure_channel", bool, False),
            )
            _change(where, lambda referral=referral: target.add_referral(referral))
        # Fault rules (docs/faults.md) once what they select exists; the retry delay
        # times their CRD names before them.
        if "crdt" in config:
            crdt = top.get("crdt", list)
            _change("config", lambda: target.set_crdt(tuple(crdt)))  # type: ignore[arg-type]
        if "faults" in config:
            _change("config", lambda: target.schedule_faults(parse_scenario(config["faults"])))
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: {exc!r}") from exc


def _copy_formats(formats: list[Any], where: str) -> int:
    """[2, 3] -> the CDFE bit mask enabling those Copy descriptor formats."""
    mask = 0
    for fmt in formats:
        if fmt not in (2, 3) or isinstance(fmt, bool):
            raise ConfigError(f"{where}: {fmt!r} is not a Copy format that needs enabling (2, 3)")
        mask |= 1 << fmt
    return mask


def _names(value: Any, parse: Callable[[str], Any], where: str) -> tuple[Any, ...] | None:
    """One name or a list of names (hashes, DH groups), in order of preference."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{where}: a name or a non-empty list of names")
    try:
        return tuple(dict.fromkeys(parse(v) for v in items))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _host_auth(
    target: Target,
    spec: Any,
    where: str,
    auths: dict[str, HostAuthConfig],
    psks: dict[str, str],
) -> str:
    r = Reader(spec, where, _HOST_KEYS)
    hostnqn = r.get("nqn", str)
    if not hostnqn:
        raise ConfigError(f"{where}.nqn: a host needs an NQN")
    psk = r.get("psk", str)
    if psk is not None:
        if psk == REDACTED_KEY:
            raise ConfigError(f"{where}.psk: the export left this key out; give it again")
        psks[hostnqn] = psk
    key = r.get("dhchap_key", str)
    ctrl_key = r.get("dhchap_ctrl_key", str)
    hashes = _names(spec.get("dhchap_hash"), hash_from_name, r.path("dhchap_hash"))
    groups = _names(spec.get("dhchap_dhgroup"), dhgroup_from_name, r.path("dhchap_dhgroup"))
    if key is None:
        if ctrl_key is not None or hashes or groups:
            raise ConfigError(f"{where}.dhchap_key: DH-HMAC-CHAP settings need a host key")
        return hostnqn
    try:
        auths[hostnqn] = target.auth_config(key, ctrl_key, hashes=hashes, dhgroups=groups)
    except ChangeError as exc:
        field = "dhchap_ctrl_key" if exc.field == "dhchap_ctrlr_key" else exc.field
        raise ConfigError(f"{where}.{field}: {exc.reason}") from None
    return hostnqn


def add_subsystem_spec(
    target: Target,
    spec: Any,
    where: str,
    listener_states: list[tuple[str, str, Callable[[], Any]]],
) -> None:
    r = Reader(spec, where, _SUBSYSTEM_KEYS)
    nqn = r.get("nqn", str)
    if nqn is None:
        raise ConfigError(f"{where}.nqn: a subsystem needs an NQN")
    host_specs = r.items("hosts")
    hosts: list[str] = []
    auths: dict[str, HostAuthConfig] = {}
    psks: dict[str, str] = {}
    for j, host in enumerate(host_specs):
        if isinstance(host, str):
            hosts.append(host)
            continue
        hosts.append(_host_auth(target, host, f"{where}.hosts[{j}]", auths, psks))
    kwargs: dict[str, Any] = dict(
        serial=r.get("serial", str, ""),
        model=r.get("model", str, "pynvmf"),
        allow_any_host=r.get("allow_any_host", bool, not hosts),
        hosts=hosts,
        max_namespaces=r.get("max_namespaces", int, 0),
        cntlid_min=r.get("cntlid_min", int, CNTLID_MIN),
        cntlid_max=r.get("cntlid_max", int, CNTLID_MAX),
        max_io_queues=r.get("max_io_queues", int),
        version=r.convert("version", parse_version, DEFAULT_VERSION),
        firmware=r.get("firmware", str, ""),
        ieee_oui=r.get("ieee_oui", int, 0),
        copy_formats=_copy_formats(r.items("copy_formats"), f"{where}.copy_formats"),
    )
    _change(where, lambda: target.add_subsystem(nqn, **kwargs))
    for hostnqn, auth in auths.items():
        _change(where, lambda hostnqn=hostnqn, auth=auth: target.set_host_keys(nqn, hostnqn, auth))
    for hostnqn, psk in psks.items():
        _change(
            f"{where}.hosts",
            lambda hostnqn=hostnqn, psk=psk: target.set_host_psk(nqn, hostnqn, psk),
        )
    for j, group_spec in enumerate(r.items("ana_groups")):
        g_where = f"{where}.ana_groups[{j}]"
        g = Reader(group_spec, g_where, _ANA_GROUP_KEYS)
        grpid = g.get("grpid", int)
        if grpid is None:
            raise ConfigError(f"{g_where}.grpid: an ANA group needs an ID")
        state = g.get("state", str, "optimized")
        if grpid == 1:  # every subsystem has group 1
            _change(g_where, lambda s=state: target.set_ana_state(nqn, 1, s))
        else:
            _change(g_where, lambda i=grpid, s=state: target.add_ana_group(nqn, i, s))
        for k, listener in enumerate(g.items("listeners")):
            l_where = f"{g_where}.listeners[{k}]"
            lr = Reader(listener, l_where, _ANA_LISTENER_KEYS)
            address = lr.get("address", str, "127.0.0.1")
            port_number = lr.get("port", int, NVME_TCP_PORT)
            l_state = lr.get("state", str)
            if l_state is None:
                raise ConfigError(f"{l_where}.state: missing")
            listener_states.append(
                (
                    l_where,
                    nqn,
                    lambda i=grpid, s=l_state, a=address, n=port_number: target.set_ana_state(
                        nqn, i, s, a, n
                    ),
                )
            )
    for j, peer_spec in enumerate(r.items("peer_listeners")):
        p_where = f"{where}.peer_listeners[{j}]"
        pr = Reader(peer_spec, p_where, _PEER_KEYS)
        address = pr.get("address", str)
        port_number = pr.get("port", int, NVME_TCP_PORT)
        portid = pr.get("portid", int, 0)
        if address is None:
            raise ConfigError(f"{p_where}.address: missing")
        _change(
            p_where,
            lambda a=address, n=port_number, i=portid: target.add_peer_listener(nqn, a, n, i),
        )
    for j, ns_spec in enumerate(r.items("namespaces")):
        add_namespace_spec(target, nqn, ns_spec, f"{where}.namespaces[{j}]", j + 1)


def add_namespace_spec(
    target: Target, nqn: str, ns_spec: Any, ns_where: str, default_nsid: int | None = None
) -> None:
    """Add the namespace one entry of a subsystem's "namespaces" describes (its device
    opened for it, unless it names one) to subsystem `nqn`."""
    ns = Reader(ns_spec, ns_where, _NAMESPACE_KEYS)
    nsid = ns.get("nsid", int, default_nsid)
    if nsid is None:
        raise ConfigError(f"{ns_where}.nsid: missing")
    ns_uuid = ns.convert("uuid", uuid.UUID)
    nguid = ns.convert("nguid", _hex_bytes(16))
    eui64 = ns.convert("eui64", _hex_bytes(8))
    name = ns.get("device", str)
    ptpl_given = "ptpl_file" in ns_spec
    ptpl = ns.get("ptpl_file", (str, type(None)))
    device: str | NamedDevice
    entry = None
    if name is None:
        device = entry = open_device(
            ns_spec, ns_where, f"{nqn}/{nsid}", owned=True, memory=target.memory_device
        )
    elif set(ns_spec) & _DEVICE_KEYS:
        key = sorted(set(ns_spec) & _DEVICE_KEYS)[0]
        raise ConfigError(f"{ns_where}.{key}: a namespace on a named device describes none")
    else:
        device = name
    ptpl_file = Path(ptpl) if ptpl is not None else None
    if not ptpl_given and entry is not None:
        ptpl_file = default_ptpl_file(entry)
    ns_kwargs = dict(
        nsid=nsid,
        ns_uuid=ns_uuid,
        nguid=nguid,
        eui64=eui64,
        ptpl_file=ptpl_file,
        anagrpid=ns.get("anagrpid", int),
        auto_visible=ns.get("auto_visible", bool, True),
        hosts=_host_list(ns.get("hosts", list, []), f"{ns_where}.hosts"),
    )
    _change(
        ns_where,
        lambda device=device, kw=ns_kwargs: target.add_namespace(nqn, device, **kw),
        entry,
    )


def _host_list(hosts: list[Any], where: str) -> list[str]:
    for i, host in enumerate(hosts):
        if not isinstance(host, str):
            raise ConfigError(f"{where}[{i}]: {host!r} is not a host NQN")
    return hosts


def host_of_spec(
    target: Target, spec: Any, where: str
) -> tuple[str, HostAuthConfig | None, str | None]:
    """One entry of a subsystem's "hosts": its NQN, DH-HMAC-CHAP configuration (its
    keys resolved in the target's keyring) and TLS PSK."""
    if isinstance(spec, str):
        return spec, None, None
    auths: dict[str, HostAuthConfig] = {}
    psks: dict[str, str] = {}
    hostnqn = _host_auth(target, spec, where, auths, psks)
    return hostnqn, auths.get(hostnqn), psks.get(hostnqn)


def default_ptpl_file(entry: NamedDevice) -> Path | None:
    """Where a namespace opened on its own file keeps its reservations: beside the file.
    Memory and block devices have no such place (a block device's directory is /dev,
    which does not survive a restart); `ptpl_file` names one for them."""
    if entry.kind == D.FILE and Path(entry.path).is_file():
        return Path(entry.path + PTPL_SUFFIX)
    return None


async def apply_qos(target: Target, spec: dict[str, Any], where: str, name: str) -> None:
    """The rate limits a device's "qos" gives (SPDK's names, target/qos.py), if any."""
    limits = spec.get("qos")
    if limits is None:
        return
    where = f"{where}.qos"
    if not isinstance(limits, dict):
        raise ConfigError(f"{where}: must be an object")
    for key, value in limits.items():
        if key not in qos.LIMIT_NAMES:
            raise ConfigError(f"{where}.{key}: unknown (known: {', '.join(qos.LIMIT_NAMES)})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}.{key}: {value!r} is not a whole number >= 0")
    await _change_async(where, target.set_qos_limits(name, limits))


def _change(where: str, apply: Callable[[], Any], opened: NamedDevice | None = None) -> Any:
    try:
        return apply()
    except ChangeError as exc:
        if opened is not None:
            _close_quietly(opened)
        raise ConfigError(f"{where}.{exc.field}: {exc.reason}") from exc


async def _change_async(where: str, change: Any) -> Any:
    try:
        return await change
    except ChangeError as exc:
        raise ConfigError(f"{where}.{exc.field}: {exc.reason}") from exc


def _close_quietly(entry: NamedDevice) -> None:
    close = getattr(entry.device, "close_sync", None)
    if close is not None:
        close()


async def build_target(config: dict[str, Any]) -> Target:
    """Build (but do not start) a Target from a configuration dictionary."""
    target = Target()
    try:
        await apply_config(target, config)
    except BaseException:
        await target.stop()
        raise
    if not target.ports:
        await target.stop()
        raise ConfigError("the configuration has no ports")
    return target


def load_config(path: str | Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    return data


def config_from_options(
    *,
    listen: list[str],
    memory: Sequence[str | int],
    files: list[str],
    nqn: str,
    rbd_images: Sequence[str] = (),
    ceph_conf: str | None = None,
    ceph_client: str | None = None,
    allow_hosts: list[str],
    block_size: int,
    inline_data_size: int,
    discovery_port: int,
) -> dict[str, Any]:
    namespaces: list[dict[str, Any]] = [
        {"memory": size, "block_size": block_size} for size in memory
    ]
    namespaces += [{"file": path, "block_size": block_size} for path in files]
    for text in rbd_images:
        try:
            pool, image = parse_image_spec(text)
        except ValueError as exc:
            raise ConfigError(f"--rbd: {exc}") from None
        rbd: dict[str, Any] = {"pool": pool, "image": image}
        if ceph_conf is not None:
            rbd["conf"] = ceph_conf
        if ceph_client is not None:
            rbd["client"] = ceph_client
        namespaces.append({"rbd": rbd, "block_size": block_size})
    if not namespaces:
        namespaces = [{"memory": DEFAULT_MEMORY, "block_size": block_size}]
    for nsid, ns in enumerate(namespaces, start=1):
        ns["nsid"] = nsid
    ports = []
    for text in listen or ["127.0.0.1:4420"]:
        trtype, address, port = parse_transport_listen(text)
        spec: dict[str, Any] = {"address": address, "port": port}
        if trtype != "tcp":
            spec["trtype"] = trtype
        spec["inline_data_size"] = inline_data_size
        ports.append(spec)
    config: dict[str, Any] = {
        "ports": ports,
        "subsystems": [{"nqn": nqn, "hosts": allow_hosts, "namespaces": namespaces}],
    }
    if discovery_port == 0:
        config["discovery_ports"] = []
    else:
        # Discovery-only ports are NVMe/TCP's; an rdma port answers discovery itself.
        addresses = dict.fromkeys(p["address"] for p in ports if "trtype" not in p)
        config["discovery_ports"] = [{"address": a, "port": discovery_port} for a in addresses]
    return config


# -- writing ------------------------------------------------------------------------------


def config_of(target: Target, *, metrics_listen: tuple[str, int] | None = None) -> dict[str, Any]:
    """The running target in this format: `apply_config` of it builds the same target, and
    with `metrics_listen` (where the process serves its metrics, which the Target does not
    hold) `metrics_listen_of` of it listens there again.

    A device that is neither memory nor a file cannot be described: ConfigError."""
    config: dict[str, Any] = {}
    if metrics_listen is not None:
        config["metrics"] = {"listen": endpoint(*metrics_listen)}
    if target.keyring:
        config["keyring"] = [{"name": e.name, "path": e.path} for e in target.keyring.values()]
    if target.transport != _DEFAULT_TRANSPORT:
        config["transport"] = _transport_dict(target.transport, _DEFAULT_TRANSPORT)
    devices = [
        device_spec_of(entry, with_name=True)
        for entry in target.block_devices.values()
        if not entry.owned
    ]
    if devices:
        config["devices"] = devices
    config["subsystems"] = [subsystem_spec_of(target, s) for s in target.subsystems.values()]
    if any(target.crdt):
        config["crdt"] = list(target.crdt)
    if target.faults:
        # The rules in force now (a scenario's timing is not the target's to keep).
        config["faults"] = [rule.spec.as_dict() for rule in target.faults.rules.values()]
    ports = []
    for port in target.ports:
        if port.discovery_only:
            continue
        spec: dict[str, Any] = {"address": port.address, "port": port.port}
        if port.trtype != "tcp":
            spec["trtype"] = port.trtype
        if port.subsystems is not None:
            spec["subsystems"] = list(port.subsystems)
        if port.discovery_listener:
            spec["discovery"] = True
        if port.advertise:
            spec["advertise"] = port.advertise
        if port.offers_tls:
            spec["secure_channel"] = port.secure_channel.value
        if port.ktls != "auto":
            spec["ktls"] = port.ktls
        spec.update(_transport_dict(port.transport, target.transport))
        ports.append(spec)
    config["ports"] = ports
    discovery = []
    for port in target.ports:
        if port.discovery_only:
            spec = {"address": port.address, "port": port.port}
            if port.advertise:
                spec["advertise"] = port.advertise
            spec.update(_transport_dict(port.transport, target.transport))
            discovery.append(spec)
    config["discovery_ports"] = discovery
    if target.referrals:
        config["referrals"] = [
            {
                "address": r.address,
                "port": r.port,
                "subnqn": r.subnqn,
                "secure_channel": r.secure_channel,
            }
            for r in target.referrals
        ]
    return config


def _transport_dict(config: TransportConfig, base: TransportConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config.inline_data_size != base.inline_data_size:
        out["inline_data_size"] = config.inline_data_size
    if config.max_h2c_data != base.max_h2c_data:
        out["max_h2c_data"] = config.max_h2c_data
    if config.allow_header_digest != base.allow_header_digest:
        out["header_digest"] = config.allow_header_digest
    if config.allow_data_digest != base.allow_data_digest:
        out["data_digest"] = config.allow_data_digest
    return out


def device_spec_of(entry: NamedDevice, *, with_name: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": entry.name} if with_name else {}
    if entry.kind == D.MEMORY:
        out["memory"] = entry.device.capabilities.size
    elif entry.kind == D.FILE:
        out["file"] = entry.path
        if entry.read_only:
            out["read_only"] = True
    elif entry.kind == D.RBD and isinstance(entry.device, RbdDevice):
        out["rbd"] = rbd_spec_of(entry.device)
        if entry.read_only:
            out["read_only"] = True
    else:
        raise ConfigError(f"block device {entry.name!r} is neither memory, a file nor RBD")
    if entry.block_size != DEFAULT_BLOCK_SIZE:
        out["block_size"] = entry.block_size
    if with_name and entry.uuid is not None:
        out["uuid"] = str(entry.uuid)
    if entry.qos is not None:
        out["qos"] = {k: v for k, v in entry.qos.limits.as_dict().items() if v}
    return out


def _host_dict(
    hostnqn: str, auth: HostAuthConfig | None, psk: str | None = None
) -> str | dict[str, Any]:
    """A host entry: its NQN, or an object with its keys' names (never the keys)."""
    if auth is None:
        return hostnqn if psk is None else {"nqn": hostnqn, "psk": psk}
    spec: dict[str, Any] = {"nqn": hostnqn, "dhchap_key": auth.host_key_name or REDACTED_KEY}
    if psk is not None:
        spec["psk"] = psk
    if auth.ctrl_key is not None:
        spec["dhchap_ctrl_key"] = auth.ctrl_key_name or REDACTED_KEY
    if auth.hashes != ALL_HASHES:
        spec["dhchap_hash"] = [h.hashlib_name for h in auth.hashes]
    if auth.dhgroups != ALL_DHGROUPS:
        spec["dhchap_dhgroup"] = [g.text for g in auth.dhgroups]
    return spec


def subsystem_spec_of(target: Target, subsystem: Subsystem) -> dict[str, Any]:
    spec: dict[str, Any] = {"nqn": subsystem.nqn}
    if subsystem.allowed_hosts:
        spec["hosts"] = [
            _host_dict(
                hostnqn,
                subsystem.host_auth.get(hostnqn),
                (subsystem.host_psk_names.get(hostnqn) or REDACTED_KEY)
                if hostnqn in subsystem.host_psks
                else None,
            )
            for hostnqn in sorted(subsystem.allowed_hosts)
        ]
    if subsystem.allow_any_host != (not subsystem.allowed_hosts):
        spec["allow_any_host"] = subsystem.allow_any_host
    spec["serial"] = subsystem.serial
    if subsystem.model != "pynvmf":
        spec["model"] = subsystem.model
    defaults = Subsystem(subsystem.nqn)
    for key in ("max_namespaces", "cntlid_min", "cntlid_max", "max_io_queues", "firmware"):
        if getattr(subsystem, key) != getattr(defaults, key):
            spec[key] = getattr(subsystem, key)
    if subsystem.ieee_oui:
        spec["ieee_oui"] = subsystem.ieee_oui
    if subsystem.copy_formats:
        spec["copy_formats"] = [f for f in (2, 3) if subsystem.copy_formats >> f & 1]
    if subsystem.version != DEFAULT_VERSION:
        spec["version"] = format_version(subsystem.version)
    groups = []
    for grpid, group in sorted(subsystem.ana.groups.items()):
        if grpid == 1 and group.state == AnaState.OPTIMIZED and not group.on_port:
            continue
        g_spec: dict[str, Any] = {"grpid": grpid, "state": ana.NAMES[group.state]}
        if group.on_port:
            g_spec["listeners"] = [
                {"address": port.address, "port": port.port, "state": ana.NAMES[state]}
                for port, state in group.on_port.items()
            ]
        groups.append(g_spec)
    if groups:
        spec["ana_groups"] = groups
    if subsystem.peer_listeners:
        spec["peer_listeners"] = [
            {"address": a, "port": n, "portid": i} for a, n, i in subsystem.peer_listeners
        ]
    namespaces = []
    for nsid, ns in sorted(subsystem.namespaces.items()):
        entry = target.block_devices.get(ns.device_name)
        ns_spec: dict[str, Any] = {"nsid": nsid}
        if entry is not None and entry.owned:
            ns_spec.update(device_spec_of(entry, with_name=False))
        else:
            ns_spec["device"] = ns.device_name
        ptpl_file = ns.reservation.ptpl_file
        default = default_ptpl_file(entry) if entry is not None and entry.owned else None
        if ptpl_file != default:
            ns_spec["ptpl_file"] = None if ptpl_file is None else str(ptpl_file)
        # Written out, so that the namespace keeps them whatever backs it next time.
        ns_spec["uuid"] = str(ns.uuid)
        ns_spec["nguid"] = ns.nguid.hex()
        ns_spec["eui64"] = ns.eui64.hex()
        if ns.anagrpid != 1:
            ns_spec["anagrpid"] = ns.anagrpid
        if not ns.auto_visible:
            ns_spec["auto_visible"] = False
            ns_spec["hosts"] = sorted(ns.hosts)
        namespaces.append(ns_spec)
    spec["namespaces"] = namespaces
    return spec


__all__ = [
    "DEFAULT_NQN",
    "DISCOVERY_NQN",
    "ConfigError",
    "apply_config",
    "build_target",
    "config_from_options",
    "config_of",
    "load_config",
    "metrics_listen_of",
    "parse_listen",
    "parse_metrics_listen",
]
