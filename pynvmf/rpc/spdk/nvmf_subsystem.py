"""SPDK's NVMe-oF subsystem methods: subsystems, their listeners and ANA states, their
namespaces and their hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pynvmf.config.native import REDACTED_KEY
from pynvmf.config.spdk import (
    listeners_of,
    rdma_transport,
    trid,
)
from pynvmf.rpc.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.calls import apply_change, change_now, listen_trid, no_target_name
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.target.changes import ChangeError
from pynvmf.target.port import SecureChannelPolicy
from pynvmf.target.subsystem import CNTLID_MAX, CNTLID_MIN, Subsystem
from pynvmf.target.target import Target

table = MethodTable()
method = table.register

# The namespaces of a subsystem nvmf_create_subsystem makes without max_namespaces (or
# with 0): SPDK's NVMF_SUBSYSTEM_DEFAULT_NAMESPACES, so NN is 32 and NSIDs 1..32 are
# valid, as on SPDK. (pynvmf's own configuration and CLI set no limit.)
DEFAULT_MAX_NAMESPACES = 32


@method("nvmf_create_subsystem")
async def nvmf_create_subsystem(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    no_target_name(p)
    serial = p.string("serial_number", "")
    model = p.string("model_number", "pynvmf")
    max_namespaces = p.integer("max_namespaces", 0, high=0xFFFFFFFF) or DEFAULT_MAX_NAMESPACES
    allow_any_host = p.boolean("allow_any_host", False)
    # pynvmf's subsystems always report ANA (as nvmet's do): with one group, optimized
    # on every listener, a host sees what it would without.
    p.boolean("ana_reporting", False)
    min_cntlid = p.integer("min_cntlid", CNTLID_MIN, high=0xFFFF)
    max_cntlid = p.integer("max_cntlid", CNTLID_MAX, high=0xFFFF)
    p.refuse_unless("max_discard_size_kib", (0,), "pynvmf limits no discard size")
    p.refuse_unless("max_write_zeroes_size_kib", (0,), "pynvmf has its own Write Zeroes limit")
    p.refuse_unless("passthrough", (False,), "pynvmf passes no commands through")
    p.refuse_unless("enable_nssr", (False,), "pynvmf has no NVM subsystem reset")
    p.done()
    change_now(
        lambda: cp.target.add_subsystem(
            nqn,
            serial=serial,
            model=model,
            allow_any_host=allow_any_host,
            max_namespaces=max_namespaces,
            cntlid_min=min_cntlid,
            cntlid_max=max_cntlid,
        ),
        {"serial": "serial_number", "model": "model_number", "cntlid_min": "min_cntlid"},
    )
    return True


@method("nvmf_delete_subsystem")
async def nvmf_delete_subsystem(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    no_target_name(p)
    p.done()
    await apply_change(cp.target.remove_subsystem(nqn), {})
    return True


def _host_json(subsystem: Subsystem, hostnqn: str) -> dict[str, Any]:
    """A host as SPDK lists it: its NQN and its keys' keyring names (never the keys)."""
    out: dict[str, Any] = {"nqn": hostnqn}
    auth = subsystem.host_auth.get(hostnqn)
    if auth is not None:
        out["dhchap_key"] = auth.host_key_name or REDACTED_KEY
        if auth.ctrl_key is not None:
            out["dhchap_ctrlr_key"] = auth.ctrl_key_name or REDACTED_KEY
    if hostnqn in subsystem.host_psks:
        out["psk"] = subsystem.host_psk_names.get(hostnqn) or REDACTED_KEY
    return out


def _subsystem_json(target: Target, subsystem: Subsystem) -> dict[str, Any]:
    discovery = subsystem.nqn == DISCOVERY_NQN
    out: dict[str, Any] = {
        "nqn": subsystem.nqn,
        "subtype": "Discovery" if discovery else "NVMe",
        "listen_addresses": [trid(port) for port in listeners_of(target, subsystem.nqn)],
        "allow_any_host": subsystem.allow_any_host,
        "hosts": [_host_json(subsystem, h) for h in sorted(subsystem.allowed_hosts)],
    }
    if discovery:
        return out
    out["serial_number"] = subsystem.serial
    out["model_number"] = subsystem.model
    if subsystem.max_namespaces:
        out["max_namespaces"] = subsystem.max_namespaces
    out["min_cntlid"] = subsystem.cntlid_min
    out["max_cntlid"] = subsystem.cntlid_max
    out["namespaces"] = [
        {
            "nsid": ns.nsid,
            "bdev_name": ns.device_name,
            "name": ns.device_name,
            "nguid": ns.nguid.hex().upper(),
            "eui64": ns.eui64.hex().upper(),
            "uuid": str(ns.uuid),
            "anagrpid": ns.anagrpid,
            "no_auto_visible": not ns.auto_visible,
            **({} if ns.auto_visible else {"hosts": [{"nqn": h} for h in sorted(ns.hosts)]}),
        }
        for _, ns in sorted(subsystem.namespaces.items())
    ]
    return out


@method("nvmf_get_subsystems")
async def nvmf_get_subsystems(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    nqn = p.string("nqn", None)
    no_target_name(p)
    p.done()
    target = cp.target
    subsystems = [target.discovery, *target.subsystems.values()]
    if nqn is not None:
        subsystems = [s for s in subsystems if s.nqn == nqn]
        if not subsystems:
            raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    return [_subsystem_json(target, s) for s in subsystems]


# -- listeners -----------------------------------------------------------------------------


_LISTENER_NAMES = {
    "address": "listen_address.traddr",
    "port": "listen_address.trsvcid",
    # An rdma port that cannot open (no pyverbs, no RDMA device on the address).
    "trtype": "listen_address.trtype",
}


@method("nvmf_subsystem_add_listener")
async def nvmf_subsystem_add_listener(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    trtype, address, port = listen_trid(p, "listen_address")
    no_target_name(p)
    secure = p.boolean("secure_channel", False)
    ana_state = p.string("ana_state", None)
    p.refuse_unless("sock_impl", ("posix",), "pynvmf listens with the kernel's sockets")
    p.done()
    state = _ana_state(p, ana_state) if ana_state is not None else None
    subsystem = cp.target.subsystems.get(nqn)
    if secure and subsystem is not None and subsystem.allow_any_host:
        # SPDK's rule: a TLS listener serves hosts that have PSKs, so not "any host".
        raise RpcError(
            INTERNAL_ERROR, "Cannot establish secure channel, when 'allow_any_host' is set"
        )
    transport = None
    if trtype == "rdma":
        # SPDK's rule: a listener's transport exists first (nvmf_create_transport).
        transport = rdma_transport(cp.target, cp.rdma_transport)
        if transport is None:
            raise RpcError(
                INVALID_PARAMS,
                "listen_address.trtype: no RDMA transport (nvmf_create_transport -t RDMA first)",
            )
    await apply_change(
        cp.target.add_listener(
            nqn,
            address,
            port,
            secure_channel=SecureChannelPolicy.REQUIRED if secure else None,
            trtype=trtype,
            transport=transport,
        ),
        {**_LISTENER_NAMES, "secure_channel": "secure_channel"},
    )
    if state is not None and nqn != DISCOVERY_NQN:
        # SPDK's listener option: the state of every ANA group on this listener.
        change_now(
            lambda: cp.target.set_ana_state(nqn, None, state, address, port, trtype),
            _LISTENER_NAMES,
        )
    return True


def _ana_state(p: Params, name: str) -> AnaState:
    state = ana.parse_state(name)
    if state is None:
        raise RpcError(
            INVALID_PARAMS,
            f"{p.name('ana_state')}: {name!r} is not an ANA state ({', '.join(ana.STATE_NAMES)})",
        )
    return state


@method("nvmf_subsystem_listener_set_ana_state")
async def nvmf_subsystem_listener_set_ana_state(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    trtype, address, port = listen_trid(p, "listen_address")
    name = p.string("ana_state")
    anagrpid = p.integer("anagrpid", 0, high=0xFFFFFFFF)
    no_target_name(p)
    p.done()
    state = _ana_state(p, name)
    change_now(
        lambda: cp.target.set_ana_state(nqn, anagrpid or None, state, address, port, trtype),
        _LISTENER_NAMES,
    )
    return True


@method("nvmf_subsystem_remove_listener")
async def nvmf_subsystem_remove_listener(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    trtype, address, port = listen_trid(p, "listen_address")
    no_target_name(p)
    p.ignore("secure_channel", "ana_state", "sock_impl")  # SPDK's decoder takes them here too
    p.done()
    await apply_change(cp.target.remove_listener(nqn, address, port, trtype), _LISTENER_NAMES)
    return True


@method("nvmf_subsystem_get_listeners")
async def nvmf_subsystem_get_listeners(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    nqn = p.string("nqn")
    no_target_name(p)
    p.done()
    if nqn != DISCOVERY_NQN and nqn not in cp.target.subsystems:
        raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    if nqn == DISCOVERY_NQN:
        return [{"address": trid(port)} for port in listeners_of(cp.target, nqn)]
    groups = cp.target.subsystems[nqn].ana.groups
    return [
        {
            "address": trid(port),
            "ana_states": [
                {"ana_group": grpid, "ana_state": ana.NAMES[group.state_on(port)]}
                for grpid, group in sorted(groups.items())
            ],
        }
        for port in listeners_of(cp.target, nqn)
    ]


# -- namespaces ----------------------------------------------------------------------------


_NS_NAMES = {
    "nsid": "namespace.nsid",
    "device": "namespace.bdev_name",
    "uuid": "namespace.uuid",
    "nguid": "namespace.nguid",
    "eui64": "namespace.eui64",
    "ptpl_file": "namespace.ptpl_file",
    "anagrpid": "namespace.anagrpid",
}


@method("nvmf_subsystem_add_ns")
async def nvmf_subsystem_add_ns(cp: ControlPlane, p: Params) -> int:
    nqn = p.string("nqn")
    no_target_name(p)
    ns = p.nested("namespace")
    assert ns is not None
    bdev_name = ns.string("bdev_name")
    nsid = ns.integer("nsid", 0, high=0xFFFFFFFF)
    ns_uuid = ns.uuid_value("uuid")
    nguid = ns.hex_bytes("nguid", 16)
    eui64 = ns.hex_bytes("eui64", 8)
    ptpl_file = ns.string("ptpl_file", None)
    anagrpid = ns.integer("anagrpid", 0, high=0xFFFFFFFF)
    no_auto_visible = ns.boolean("no_auto_visible", False)
    ns.ignore("hide_metadata")  # pynvmf's namespaces have no metadata to hide
    ns.done()
    p.done()
    added = change_now(
        lambda: cp.target.add_namespace(
            nqn,
            bdev_name,
            nsid=nsid or None,
            ns_uuid=ns_uuid,
            nguid=nguid,
            eui64=eui64,
            ptpl_file=None if ptpl_file is None else Path(ptpl_file),
            anagrpid=anagrpid or None,
            auto_visible=not no_auto_visible,
        ),
        _NS_NAMES,
    )
    return added.nsid


@method("nvmf_ns_add_host")
async def nvmf_ns_add_host(cp: ControlPlane, p: Params) -> bool:
    """Attach a namespace added with no_auto_visible to a host's controllers."""
    nqn, nsid, host = _ns_host_params(p)
    await apply_change(cp.target.ns_add_host(nqn, nsid, host), {"hostnqn": "host"})
    return True


@method("nvmf_ns_remove_host")
async def nvmf_ns_remove_host(cp: ControlPlane, p: Params) -> bool:
    """Detach it from that host's controllers (answered once their commands finished)."""
    nqn, nsid, host = _ns_host_params(p)
    await apply_change(cp.target.ns_remove_host(nqn, nsid, host), {"hostnqn": "host"})
    return True


def _ns_host_params(p: Params) -> tuple[str, int, str]:
    nqn = p.string("nqn")
    nsid = p.integer("nsid", low=1, high=0xFFFFFFFE)
    host = p.string("host")
    no_target_name(p)
    p.done()
    return nqn, nsid, host


@method("nvmf_subsystem_remove_ns")
async def nvmf_subsystem_remove_ns(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    nsid = p.integer("nsid", high=0xFFFFFFFF)
    no_target_name(p)
    p.done()
    await apply_change(cp.target.remove_namespace(nqn, nsid), {})
    return True


@method("nvmf_subsystem_set_ns_ana_group")
async def nvmf_subsystem_set_ns_ana_group(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    nsid = p.integer("nsid", high=0xFFFFFFFF)
    anagrpid = p.integer("anagrpid", high=0xFFFFFFFF)
    no_target_name(p)
    p.done()
    change_now(lambda: cp.target.set_namespace_ana_group(nqn, nsid, anagrpid), {})
    return True


# -- hosts ---------------------------------------------------------------------------------


@method("nvmf_subsystem_add_host")
async def nvmf_subsystem_add_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    host = p.string("host")
    no_target_name(p)
    psk = p.string("psk", None)
    key = p.string("dhchap_key", None)
    ctrl_key = p.string("dhchap_ctrlr_key", None)
    p.done()
    target = cp.target
    if psk is not None and psk not in target.keyring:
        # SPDK takes keyring names only (keyring_file_add_key first): a key or a path here
        # would end up in logs and saved configurations.
        raise RpcError(INVALID_PARAMS, f"psk: no key named {psk!r} in the keyring")

    def change() -> None:
        auth = target.auth_config(key, ctrl_key) if key is not None else None
        if auth is None and ctrl_key is not None:
            raise ChangeError("dhchap_key", "a controller key needs a host key")
        target.add_host(nqn, host, auth=auth, psk=psk)

    change_now(change, {"hostnqn": "host"})
    return True


@method("nvmf_subsystem_set_keys")
async def nvmf_subsystem_set_keys(cp: ControlPlane, p: Params) -> bool:
    """New DH-HMAC-CHAP keys for a host (none: it no longer authenticates); queues already
    authenticated stay so, the next (re-)authentication uses them."""
    nqn = p.string("nqn")
    host = p.string("host")
    no_target_name(p)
    key = p.string("dhchap_key", None)
    ctrl_key = p.string("dhchap_ctrlr_key", None)
    p.done()
    target = cp.target

    def change() -> None:
        if key is None and ctrl_key is not None:
            raise ChangeError("dhchap_key", "a controller key needs a host key")
        auth = target.auth_config(key, ctrl_key) if key is not None else None
        target.set_host_keys(nqn, host, auth)

    change_now(change, {})
    return True


@method("nvmf_subsystem_remove_host")
async def nvmf_subsystem_remove_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    host = p.string("host")
    no_target_name(p)
    p.done()
    change_now(lambda: cp.target.remove_host(nqn, host), {"hostnqn": "host"})
    return True


@method("nvmf_subsystem_allow_any_host")
async def nvmf_subsystem_allow_any_host(cp: ControlPlane, p: Params) -> bool:
    nqn = p.string("nqn")
    allow = p.boolean("allow_any_host")
    no_target_name(p)
    p.done()
    change_now(lambda: cp.target.set_allow_any_host(nqn, allow), {})
    return True
