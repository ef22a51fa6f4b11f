"""nvmetcli's JSON (/etc/nvmet/config.json, what `nvmetcli save` writes) to and from a Target.

nvmetcli dumps the Linux target's configfs: `hosts`; `ports` with `addr`, `param`,
`subsystems`, `referrals` and `ana_groups`; `subsystems` with `attr`,
`allowed_hosts` and `namespaces` (`device`, `enable`, `ana_grpid`). Attribute values
are the configfs files' text. Loading builds the target through the Target's change
methods; ANA groups keep nvmet's meaning (a state per port and group; a group other
than 1 is inaccessible on a port that does not list it). A key pynvmf cannot honour
(a transport other than TCP, TLS, a referral,
protection information, a disabled namespace, ...) is refused with the key's path,
never dropped. Writing describes what nvmet can hold; an in-memory namespace cannot
be one of them and is refused.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import uuid
from typing import Any

from pynvmf.auth.controller import ALL_DHGROUPS, ALL_HASHES, HostAuthConfig
from pynvmf.auth.keys import DhchapKey, KeyFormatError
from pynvmf.block.file import FileDevice
from pynvmf.config.native import REDACTED_KEY, format_version, parse_version
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.spec.auth import dhgroup_from_name, hash_from_name
from pynvmf.spec.logpages import AnaState
from pynvmf.target import ana
from pynvmf.target import devices as D
from pynvmf.target.changes import ChangeError
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port, SecureChannelPolicy
from pynvmf.target.subsystem import CNTLID_MAX, CNTLID_MIN
from pynvmf.target.target import Target
from pynvmf.tcp.target import TransportConfig

DEFAULT_BLOCK_SIZE = 512
BLKSSZGET = 0x1268  # linux/fs.h: _IO(0x12, 104), the logical block size


class NvmetcliError(RpcError):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(INVALID_PARAMS, f"{where}: {reason}")
        self.where = where


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NvmetcliError(where, "not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise NvmetcliError(where, "not a list")
    return value


def _known(obj: dict[str, Any], where: str, keys: set[str]) -> None:
    unknown = sorted(set(obj) - keys)
    if unknown:
        raise NvmetcliError(f"{where}.{unknown[0]}", "pynvmf cannot honour this key")


def _text(value: Any) -> str:
    return str(value).strip()


def _int(value: Any, where: str) -> int:
    try:
        return int(_text(value), 0)
    except ValueError:
        raise NvmetcliError(where, f"{value!r} is not a number") from None


def _only(value: Any, allowed: tuple[str, ...], where: str, why: str) -> None:
    if _text(value).lower() not in allowed:
        raise NvmetcliError(where, f"{value!r}: {why}")


async def load_nvmetcli(target: Target, config: Any, where: str = "config") -> None:
    """Build what an nvmetcli configuration describes on `target` (subsystems first:
    ports name them)."""
    config = _obj(config, where)
    _known(config, where, {"hosts", "ports", "subsystems"})
    auths: dict[str, HostAuthConfig] = {}
    for i, host in enumerate(_list(config.get("hosts"), f"{where}.hosts")):
        h_where = f"{where}.hosts[{i}]"
        host = _obj(host, h_where)
        # nvmet's host attributes dhchap_key, dhchap_ctrl_key, dhchap_hash, dhchap_dhgroup:
        # nvmetcli's "dhchap" attribute group, or written out flat.
        _known(host, h_where, {"nqn", "dhchap", *(f"dhchap_{a}" for a in _DHCHAP_ATTRS)})
        nqn = host.get("nqn")
        if not isinstance(nqn, str):
            raise NvmetcliError(f"{h_where}.nqn", "a host needs an NQN")
        auth = _host_auth(host, h_where)
        if auth is not None:
            auths[nqn] = auth
    for i, spec in enumerate(_list(config.get("subsystems"), f"{where}.subsystems")):
        _subsystem(target, _obj(spec, f"{where}.subsystems[{i}]"), f"{where}.subsystems[{i}]")
    # nvmet keys a host's secrets per host: every subsystem that allows it asks for them.
    for subsystem in target.subsystems.values():
        for hostnqn in subsystem.allowed_hosts:
            if hostnqn in auths:
                target.set_host_keys(subsystem.nqn, hostnqn, auths[hostnqn])
    for i, spec in enumerate(_list(config.get("ports"), f"{where}.ports")):
        await _port(target, _obj(spec, f"{where}.ports[{i}]"), f"{where}.ports[{i}]")


_DHCHAP_ATTRS = ("key", "ctrl_key", "hash", "dhgroup")


def _host_auth(host: dict[str, Any], where: str) -> HostAuthConfig | None:
    """A host's DH-HMAC-CHAP from its nvmet attributes; None without a key. nvmet prefers
    its dhchap_hash and dhchap_dhgroup and falls back to what the host offers: the
    configured one comes first, the others after."""
    group = host.get("dhchap")
    attrs: dict[str, Any] = {}
    prefix = f"{where}.dhchap"
    if group is not None:
        attrs = _obj(group, prefix)
        _known(attrs, prefix, set(_DHCHAP_ATTRS))
        prefix += "."
    else:
        prefix = f"{where}.dhchap_"
    for name in _DHCHAP_ATTRS:
        if f"dhchap_{name}" in host:
            attrs[name] = host[f"dhchap_{name}"]
    key_text = _text(attrs.get("key", "")).strip()
    ctrl_text = _text(attrs.get("ctrl_key", "")).strip()
    if not key_text:
        if ctrl_text:
            raise NvmetcliError(f"{prefix}ctrl_key", "a controller key needs a host key")
        return None
    keys = []
    for name, text in (("key", key_text), ("ctrl_key", ctrl_text)):
        if not text:
            keys.append(None)
            continue
        try:
            keys.append(DhchapKey.parse(text))
        except KeyFormatError as exc:
            raise NvmetcliError(f"{prefix}{name}", str(exc)) from None
    hashes, groups = ALL_HASHES, ALL_DHGROUPS
    try:
        if _text(attrs.get("hash", "")).strip():
            first = hash_from_name(_text(attrs["hash"]))
            hashes = (first, *(h for h in ALL_HASHES if h != first))
    except ValueError as exc:
        raise NvmetcliError(f"{prefix}hash", str(exc)) from None
    try:
        if _text(attrs.get("dhgroup", "")).strip():
            first_group = dhgroup_from_name(_text(attrs["dhgroup"]))
            groups = (first_group, *(g for g in ALL_DHGROUPS if g != first_group))
    except ValueError as exc:
        raise NvmetcliError(f"{prefix}dhgroup", str(exc)) from None
    return HostAuthConfig(keys[0], keys[1], hashes, groups)  # type: ignore[arg-type]


_SUBSYSTEM_ATTRS = {
    "allow_any_host",
    "serial",
    "model",
    "version",
    "cntlid_min",
    "cntlid_max",
    "qid_max",
    "firmware",
    "ieee_oui",
    "pi_enable",
}


def _subsystem(target: Target, spec: dict[str, Any], where: str) -> None:
    _known(spec, where, {"nqn", "attr", "allowed_hosts", "namespaces", "passthru"})
    for k, passthru in enumerate(_list(spec.get("passthru"), f"{where}.passthru")):
        # Kernels with passthru support dump it for every subsystem; disabled, it is nothing.
        p_where = f"{where}.passthru[{k}]"
        if _text(_obj(passthru, p_where).get("enable", 0)) != "0":
            raise NvmetcliError(f"{p_where}.enable", "pynvmf passes no commands through")
    nqn = spec.get("nqn")
    if not isinstance(nqn, str):
        raise NvmetcliError(f"{where}.nqn", "a subsystem needs an NQN")
    attr = _obj(spec.get("attr", {}), f"{where}.attr")
    _known(attr, f"{where}.attr", _SUBSYSTEM_ATTRS)
    a = f"{where}.attr"
    if "pi_enable" in attr:
        _only(attr["pi_enable"], ("0",), f"{a}.pi_enable", "pynvmf has no protection information")
    hosts = _list(spec.get("allowed_hosts"), f"{where}.allowed_hosts")
    kwargs: dict[str, Any] = {
        "allow_any_host": _text(attr.get("allow_any_host", "0" if hosts else "1")) == "1",
        "hosts": hosts,
        "serial": _text(attr.get("serial", "")),
        "model": _text(attr.get("model", "pynvmf")),
        "cntlid_min": _int(attr.get("cntlid_min", CNTLID_MIN), f"{a}.cntlid_min"),
        "cntlid_max": _int(attr.get("cntlid_max", CNTLID_MAX), f"{a}.cntlid_max"),
        "firmware": _text(attr.get("firmware", "")),
        "ieee_oui": _int(attr.get("ieee_oui", 0), f"{a}.ieee_oui"),
    }
    if "qid_max" in attr:
        kwargs["max_io_queues"] = _int(attr["qid_max"], f"{a}.qid_max")
    if "version" in attr:
        try:
            kwargs["version"] = parse_version(_text(attr["version"]))
        except ValueError as exc:
            raise NvmetcliError(f"{a}.version", str(exc)) from None
    names = {
        "nqn": f"{where}.nqn",
        "hostnqn": f"{where}.allowed_hosts",
        "max_io_queues": f"{a}.qid_max",
        "version": f"{a}.version",
    }
    _change(lambda: target.add_subsystem(nqn, **kwargs), where, names, prefix=a)
    for j, ns in enumerate(_list(spec.get("namespaces"), f"{where}.namespaces")):
        _namespace(target, nqn, _obj(ns, f"{where}.namespaces[{j}]"), f"{where}.namespaces[{j}]")


def _namespace(target: Target, nqn: str, spec: dict[str, Any], where: str) -> None:
    _known(spec, where, {"nsid", "enable", "device", "ana_grpid", "ana", "resv"})
    if "nsid" not in spec:
        raise NvmetcliError(f"{where}.nsid", "a namespace needs an NSID")
    nsid = _int(spec["nsid"], f"{where}.nsid")
    if _text(spec.get("enable", 1)) != "1":
        raise NvmetcliError(f"{where}.enable", "pynvmf has no disabled namespaces")
    # Older nvmetcli writes ana_grpid, newer {"ana": {"grpid"}}.
    grpid = _int(spec.get("ana_grpid", 1), f"{where}.ana_grpid")
    ana_spec = _obj(spec.get("ana", {}), f"{where}.ana")
    _known(ana_spec, f"{where}.ana", {"grpid"})
    if "grpid" in ana_spec:
        grpid = _int(ana_spec["grpid"], f"{where}.ana.grpid")
    grpid_where = f"{where}.ana.grpid" if "grpid" in ana_spec else f"{where}.ana_grpid"
    if grpid != 1 and target.subsystems.get(nqn) is not None:
        subsystem = target.subsystems[nqn]
        if subsystem.ana.group(grpid) is None:
            # nvmet's groups other than 1 are inaccessible on a port that does not
            # configure them; the ports' ana_groups then say where they are not.
            _change(
                lambda: target.add_ana_group(nqn, grpid, AnaState.INACCESSIBLE),
                where,
                {"anagrpid": grpid_where},
            )
    resv = _obj(spec.get("resv", {}), f"{where}.resv")
    _known(resv, f"{where}.resv", {"enable"})
    if "enable" in resv:
        _only(resv["enable"], ("0",), f"{where}.resv.enable", "pynvmf has no reservations")
    device = _obj(spec.get("device", {}), f"{where}.device")
    d = f"{where}.device"
    _known(device, d, {"path", "uuid", "nguid", "eui64", "p2pmem"})
    if "p2pmem" in device:
        _only(device["p2pmem"], ("0", "n", "none", ""), f"{d}.p2pmem", "pynvmf has no P2P memory")
    path = device.get("path")
    if not isinstance(path, str) or not path:
        raise NvmetcliError(f"{d}.path", "a namespace needs a device path")
    ns_uuid = _uuid(device.get("uuid"), f"{d}.uuid")
    # What nvmet reports and no more: an NGUID only if set, an EUI-64 only if the kernel
    # has the attribute and it is set (pynvmf would otherwise derive both).
    nguid = _hex(device.get("nguid"), 16, f"{d}.nguid") or bytes(16)
    eui64 = _hex(device.get("eui64"), 8, f"{d}.eui64") or bytes(8)
    try:
        opened = FileDevice(path, _nvmet_block_size(path))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise NvmetcliError(f"{d}.path", f"{path}: {reason}") from exc
    entry = NamedDevice.wrap(f"{nqn}/{nsid}", opened, owned=True)
    names = {"nsid": f"{where}.nsid", "device": f"{d}.path", "uuid": f"{d}.uuid"}
    names.update(nguid=f"{d}.nguid", eui64=f"{d}.eui64", anagrpid=grpid_where)
    try:
        _change(
            lambda: target.add_namespace(
                nqn, entry, nsid=nsid, ns_uuid=ns_uuid, nguid=nguid, eui64=eui64, anagrpid=grpid
            ),
            where,
            names,
        )
    except NvmetcliError:
        opened.close_sync()
        raise


def _nvmet_block_size(path: str) -> int:
    """The logical block size nvmet gives a namespace on `path`: a block device's own,
    a file's file system block size up to 4 KiB."""
    try:
        st = os.stat(path)
    except OSError:
        return DEFAULT_BLOCK_SIZE  # FileDevice reports the error
    if stat.S_ISBLK(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return DEFAULT_BLOCK_SIZE
        try:
            buf = bytearray(4)
            fcntl.ioctl(fd, BLKSSZGET, buf)
            return int.from_bytes(buf, sys.byteorder) or DEFAULT_BLOCK_SIZE
        except OSError:
            return DEFAULT_BLOCK_SIZE
        finally:
            os.close(fd)
    size = st.st_blksize or DEFAULT_BLOCK_SIZE
    return (
        max(DEFAULT_BLOCK_SIZE, min(size, 4096))
        if st.st_size % min(size, 4096) == 0
        else (DEFAULT_BLOCK_SIZE)
    )


def _uuid(value: Any, where: str) -> uuid.UUID | None:
    if value in (None, ""):
        return None
    try:
        return uuid.UUID(_text(value))
    except ValueError:
        raise NvmetcliError(where, f"{value!r} is not a UUID") from None


def _hex(value: Any, size: int, where: str) -> bytes | None:
    if value in (None, ""):
        return None
    try:
        raw = bytes.fromhex(_text(value).replace("-", ""))
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise NvmetcliError(where, f"{value!r} is not {size} bytes in hex")
    return raw  # zeros included: nvmet shows an NGUID it does not report as zeros


_ADDR_KEYS = {"trtype", "adrfam", "traddr", "trsvcid", "treq", "tsas"}
_PARAM_KEYS = {"inline_data_size", "pi_enable", "max_queue_size"}
# addr_treq for a port's secure channel, as nvmet writes it.
_TREQ = {
    SecureChannelPolicy.NONE: "not specified",
    SecureChannelPolicy.REQUIRED: "required",
    SecureChannelPolicy.OPTIONAL: "not required",
}


async def _port(target: Target, spec: dict[str, Any], where: str) -> None:
    _known(spec, where, {"portid", "addr", "param", "subsystems", "referrals", "ana_groups"})
    portid = _int(spec.get("portid", 0), f"{where}.portid")
    addr = _obj(spec.get("addr", {}), f"{where}.addr")
    a = f"{where}.addr"
    _known(addr, a, _ADDR_KEYS)
    _only(addr.get("trtype", ""), ("tcp",), f"{a}.trtype", "pynvmf serves NVMe/TCP only")
    adrfam = _text(addr.get("adrfam", "ipv4")).lower()
    if adrfam not in ("ipv4", "ipv6"):
        raise NvmetcliError(f"{a}.adrfam", f"{adrfam!r}: pynvmf serves IPv4 and IPv6")
    # The secure channel: addr_tsas "tls1.3" offers TLS (nvmet then defaults addr_treq to
    # "required"); addr_treq "not required" also takes plain NVMe/TCP. The hosts' PSKs live
    # in the kernel's keyring, not in nvmetcli's JSON: give them in pynvmf's configuration
    # or over RPC.
    tsas = _text(addr.get("tsas", "none")) or "none"
    _only(tsas, ("none", "tls1.3"), f"{a}.tsas", "pynvmf's secure channel is TLS 1.3")
    treq = _text(addr.get("treq", "not specified"))
    if tsas == "none":
        _only(
            treq,
            ("not specified", "not required"),
            f"{a}.treq",
            "a port requires a secure channel only with addr_tsas tls1.3",
        )
        secure_channel = SecureChannelPolicy.NONE
    else:
        _only(treq, ("not specified", "required", "not required"), f"{a}.treq", "")
        secure_channel = (
            SecureChannelPolicy.OPTIONAL if treq == "not required" else SecureChannelPolicy.REQUIRED
        )
    traddr = _text(addr.get("traddr", ""))
    trsvcid = _int(addr.get("trsvcid", 4420), f"{a}.trsvcid")
    if (":" in traddr) != (adrfam == "ipv6"):
        raise NvmetcliError(f"{a}.adrfam", f"{adrfam} does not match {traddr!r}")
    param = _obj(spec.get("param", {}), f"{where}.param")
    _known(param, f"{where}.param", _PARAM_KEYS)
    if "pi_enable" in param:
        _only(
            param["pi_enable"],
            ("0",),
            f"{where}.param.pi_enable",
            "pynvmf has no protection information",
        )
    if "max_queue_size" in param:
        # nvmet's -1 (or its own maximum) is "whatever the controller supports".
        _only(
            param["max_queue_size"],
            ("-1", "1024"),
            f"{where}.param.max_queue_size",
            "pynvmf's queues hold 1024 entries",
        )
    transport = target.transport
    if "inline_data_size" in param:
        inline = _int(param["inline_data_size"], f"{where}.param.inline_data_size")
        if inline < 0:
            inline = transport.inline_data_size  # nvmet's -1: the transport's default
        transport = TransportConfig(
            inline_data_size=inline,
            max_h2c_data=transport.max_h2c_data,
            allow_header_digest=transport.allow_header_digest,
            allow_data_digest=transport.allow_data_digest,
            cpda=transport.cpda,
        )
    if _list(spec.get("referrals"), f"{where}.referrals"):
        raise NvmetcliError(f"{where}.referrals", "pynvmf's discovery log has no referrals")
    groups: list[tuple[str, int, AnaState]] = []
    for k, group in enumerate(_list(spec.get("ana_groups"), f"{where}.ana_groups")):
        g = f"{where}.ana_groups[{k}]"
        group = _obj(group, g)
        _known(group, g, {"grpid", "ana"})
        grpid = _int(group.get("grpid", 1), f"{g}.grpid")
        state_spec = _obj(group.get("ana", {}), f"{g}.ana")
        _known(state_spec, f"{g}.ana", {"state"})
        # nvmet's configfs names: optimized, non-optimized, inaccessible,
        # persistent-loss, change.
        state = ana.parse_state(_text(state_spec.get("state", "optimized")))
        if state is None:
            raise NvmetcliError(f"{g}.ana.state", f"{state_spec['state']!r} is not an ANA state")
        groups.append((g, grpid, state))
    subsystems = _list(spec.get("subsystems"), f"{where}.subsystems")
    for k, nqn in enumerate(subsystems):
        if not isinstance(nqn, str) or nqn not in target.subsystems:
            raise NvmetcliError(f"{where}.subsystems[{k}]", f"no subsystem {nqn!r}")
    # nvmet answers discovery on every port; a port linked to no subsystem is pynvmf's
    # discovery-only port (nvmet would not enable it).
    port = Port(
        traddr,
        trsvcid,
        portid=portid,
        subsystems=None if not subsystems else list(subsystems),
        discovery_only=not subsystems,
        discovery_listener=not subsystems,
        transport=transport,
        secure_channel=secure_channel,
    )
    names = {
        "address": f"{a}.traddr",
        "port": f"{a}.trsvcid",
        "inline_data_size": f"{where}.param.inline_data_size",
    }
    try:
        await target.add_port(port)
    except ChangeError as exc:
        raise NvmetcliError(names.get(exc.field, f"{where}.{exc.field}"), exc.reason) from exc
    # nvmet keeps ANA states per port and group, for every subsystem linked to the port.
    for g, grpid, state in groups:
        for nqn in subsystems:
            subsystem = target.subsystems[nqn]
            if subsystem.ana.group(grpid) is None:
                _change(
                    lambda n=nqn, i=grpid: target.add_ana_group(n, i, AnaState.INACCESSIBLE),
                    g,
                    {"anagrpid": f"{g}.grpid"},
                )
            _change(
                lambda n=nqn, i=grpid, st=state: target.set_ana_state(
                    n, i, st, port.address, port.port
                ),
                g,
                {"anagrpid": f"{g}.grpid"},
            )


def _change(apply: Any, where: str, names: dict[str, str], prefix: str | None = None) -> Any:
    try:
        return apply()
    except ChangeError as exc:
        default = f"{prefix or where}.{exc.field}"
        raise NvmetcliError(names.get(exc.field, default), exc.reason) from exc


# -- writing ----------------------------------------------------------------------------------


def _device_json(nguid: bytes, eui64: bytes, path: str, ns_uuid: str) -> dict[str, str]:
    device = {"nguid": str(uuid.UUID(bytes=nguid)), "path": path, "uuid": ns_uuid}
    if any(eui64):
        # Only newer kernels have device_eui64; an older one refuses the key, and says so.
        device["eui64"] = eui64.hex()
    return device


def nvmetcli_config(target: Target) -> dict[str, Any]:
    """The target as nvmetcli's JSON: what `nvmetcli restore` sets up on a Linux target."""
    hosts = sorted({h for s in target.subsystems.values() for h in s.allowed_hosts})
    subsystems = []
    for subsystem in target.subsystems.values():
        namespaces = []
        for nsid, ns in sorted(subsystem.namespaces.items()):
            entry = target.block_devices.get(ns.device_name)
            if not ns.auto_visible:
                raise RpcError(
                    INVALID_PARAMS,
                    f"format: namespace {nsid} of {subsystem.nqn} is visible to some hosts "
                    "only, which nvmet cannot hold",
                )
            if entry is None or entry.kind != D.FILE:
                raise RpcError(
                    INVALID_PARAMS,
                    f"format: namespace {nsid} of {subsystem.nqn} is not on a file or block "
                    "device, which is all nvmet serves",
                )
            namespaces.append(
                {
                    "device": _device_json(ns.nguid, ns.eui64, entry.path, str(ns.uuid)),
                    "enable": 1,
                    "nsid": nsid,
                    "ana_grpid": ns.anagrpid,
                }
            )
        attr = {
            "allow_any_host": "1" if subsystem.allow_any_host else "0",
            "cntlid_max": str(subsystem.cntlid_max),
            "cntlid_min": str(subsystem.cntlid_min),
            "model": subsystem.model,
            "serial": subsystem.serial,
            "version": format_version(subsystem.version),
        }
        if subsystem.max_io_queues is not None:
            attr["qid_max"] = str(subsystem.max_io_queues)
        if subsystem.firmware:
            attr["firmware"] = subsystem.firmware
        if subsystem.ieee_oui:
            attr["ieee_oui"] = f"0x{subsystem.ieee_oui:06x}"
        subsystems.append(
            {
                "allowed_hosts": sorted(subsystem.allowed_hosts),
                "attr": attr,
                "namespaces": namespaces,
                "nqn": subsystem.nqn,
            }
        )
    ports = []
    for port in target.ports:
        if port.discovery_only:
            linked: list[str] = []
        elif port.subsystems is None:
            linked = list(target.subsystems)
        else:
            linked = list(port.subsystems)
        ports.append(
            {
                "addr": {
                    "adrfam": "ipv6" if port.is_ipv6 else "ipv4",
                    "traddr": port.address,
                    "treq": _TREQ[port.secure_channel],
                    "trsvcid": str(port.port),
                    "trtype": "tcp",
                    # Only where there is TLS: Linux 6.1 refuses writes to addr_tsas.
                    **({"tsas": "tls1.3"} if port.offers_tls else {}),
                },
                "ana_groups": _port_ana_groups(target, port, linked),
                "param": {"inline_data_size": str(port.transport.inline_data_size)},
                "portid": port.portid,
                "referrals": [],
                "subsystems": linked,
            }
        )
    auths: dict[str, HostAuthConfig] = {}
    for subsystem in target.subsystems.values():
        auths.update(subsystem.host_auth)
    return {
        "hosts": [_host_json(h, auths.get(h)) for h in hosts],
        "ports": ports,
        "subsystems": subsystems,
    }


def _host_json(hostnqn: str, auth: HostAuthConfig | None) -> dict[str, Any]:
    """A host, with its DH-HMAC-CHAP attributes when it has a key, as nvmetcli's
    attribute-group convention names them ("dhchap": {"key", ...}; upstream nvmetcli saves
    none). The keys themselves are never written: REDACTED_KEY, which nvmet's configfs
    refuses if it is written there, and which pynvmf refuses to load."""
    out: dict[str, Any] = {"nqn": hostnqn}
    if auth is not None:
        out["dhchap"] = {
            "key": REDACTED_KEY,
            "ctrl_key": REDACTED_KEY if auth.ctrl_key is not None else "",
            "hash": auth.hashes[0].hmac_name,
            "dhgroup": auth.dhgroups[0].text,
        }
    return out


def _port_ana_groups(target: Target, port: Port, linked: list[str]) -> list[dict[str, Any]]:
    """nvmet's per-port ANA groups: the states on `port` of its subsystems' groups, which
    must agree (nvmet has one state per port and group, whatever the subsystem)."""
    states: dict[int, tuple[str, AnaState]] = {1: ("", AnaState.OPTIMIZED)}
    for nqn in linked:
        for grpid, group in target.subsystems[nqn].ana.groups.items():
            state = group.state_on(port)
            seen = states.get(grpid)
            if seen is not None and seen[0] and seen[1] != state:
                raise RpcError(
                    INVALID_PARAMS,
                    f"format: ANA group {grpid} is {ana.NAMES[seen[1]]} for {seen[0]} and "
                    f"{ana.NAMES[state]} for {nqn} on port {port}, which nvmet cannot hold",
                )
            states[grpid] = (nqn, state)
    return [
        {"ana": {"state": _NVMET_STATE[state]}, "grpid": grpid}
        for grpid, (_nqn, state) in sorted(states.items())
    ]


_NVMET_STATE = {state: name.replace("_", "-") for state, name in ana.NAMES.items()}
