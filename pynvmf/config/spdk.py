"""SPDK's JSON configuration (what rpc.py save_config writes and `nvmf_tgt --json` loads)
to and from a Target.

The file is a list of SPDK "subsystems" (its word for its libraries), each a list of RPC
calls that build its part again. Writing describes a running target as those calls, in
SPDK's order; loading makes them through the SPDK-compatible RPC methods
(pynvmf.rpc.spdk), so there is one path from either to a running target. What SPDK's
configuration cannot hold (a port with transport options of its own, a key outside the
keyring) is refused, naming it, rather than dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pynvmf.rdma import cm
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane
from pynvmf.spec.logpages import AnaState
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.target import devices as D
from pynvmf.target.controller import MAX_IO_QUEUES, QUEUE_ENTRIES
from pynvmf.target.devices import NamedDevice
from pynvmf.target.limits import MAX_TRANSFER, reported_nn
from pynvmf.target.port import Port, SecureChannelPolicy
from pynvmf.target.referrals import Referral
from pynvmf.target.subsystem import Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.config import TransportConfig

# The configuration "subsystems" (SPDK's word for its libraries) pynvmf has.
CONFIG_SUBSYSTEMS = (
    {"subsystem": "keyring", "depends_on": []},
    {"subsystem": "bdev", "depends_on": []},
    {"subsystem": "nvmf", "depends_on": ["bdev", "keyring"]},
)


def bdev_config(target: Target) -> list[dict[str, Any]]:
    """framework_get_config bdev: the calls that create every block device again."""
    config = []
    clusters: dict[Any, str] = {}
    for entry in target.block_devices.values():
        caps = entry.device.capabilities
        if entry.kind == D.RBD:
            config += _rbd_config(entry, clusters)
        elif entry.kind == D.MEMORY:
            params: dict[str, Any] = {
                "name": entry.name,
                "num_blocks": caps.num_blocks,
                "block_size": caps.block_size,
            }
            if entry.uuid:
                params["uuid"] = str(entry.uuid)
            config.append({"method": "bdev_malloc_create", "params": params})
        elif entry.kind == D.FILE:
            params = {
                "name": entry.name,
                "block_size": caps.block_size,
                "filename": entry.path,
                "readonly": entry.read_only,
            }
            if entry.uuid:
                params["uuid"] = str(entry.uuid)
            config.append({"method": "bdev_aio_create", "params": params})
        else:
            raise RpcError(
                INVALID_PARAMS, f"name: bdev {entry.name!r} is neither memory nor a file"
            )
        if entry.qos is not None:
            # As SPDK writes it: right after the bdev, the limits in force only.
            limits = {k: v for k, v in entry.qos.limits.as_dict().items() if v}
            config.append(
                {"method": "bdev_set_qos_limit", "params": {"name": entry.name, **limits}}
            )
    return config


def _rbd_config(entry: NamedDevice, clusters: dict[Any, str]) -> list[dict[str, Any]]:
    """bdev_rbd_create for an RBD device, after a bdev_rbd_register_cluster for its
    cluster where it needs one (SPDK's bdev_rbd_create takes no configuration file)."""
    calls = []
    dev: Any = entry.device
    spec = dev.cluster_spec
    params: dict[str, Any] = {
        "name": entry.name,
        "pool_name": dev.pool,
        "rbd_name": dev.image_name,
        "block_size": entry.block_size,
    }
    if spec.conf is None and not spec.options:
        if spec.client is not None:
            params["user_id"] = spec.client
    elif spec.conf == "":
        if spec.client is not None:
            params["user_id"] = spec.client
        params["config"] = dict(spec.options)
    else:
        cluster = clusters.get(spec)
        if cluster is None:
            cluster = clusters[spec] = f"pynvmf_cluster{len(clusters)}"
            reg: dict[str, Any] = {"name": cluster, "config_file": spec.conf}
            if spec.client is not None:
                reg["user_id"] = spec.client
            if spec.options:
                reg["config_param"] = dict(spec.options)
            calls.append({"method": "bdev_rbd_register_cluster", "params": reg})
        params["cluster_name"] = cluster
    if entry.read_only:
        params["read_only"] = True
    if entry.uuid:
        params["uuid"] = str(entry.uuid)
    calls.append({"method": "bdev_rbd_create", "params": params})
    return calls


# What pynvmf's RDMA transport is in SPDK's options (cm.py's limits, the controller's).
RDMA_FIXED: dict[str, int] = {
    "max_queue_depth": cm.IO_QUEUE_SIZE,
    "max_io_qpairs_per_ctrlr": min(MAX_IO_QUEUES, cm.MAX_QID),
    "max_io_size": MAX_TRANSFER,
    "max_aq_depth": cm.ADMIN_QUEUE_SIZE,
}


def rdma_transport(
    target: Target, created: TransportConfig | None = None
) -> TransportConfig | None:
    """The RDMA transport's options: those nvmf_create_transport -t RDMA gave (`created`),
    else an rdma port's; None when there is neither."""
    if created is not None:
        return created
    return next((p.transport for p in target.ports if p.trtype == "rdma"), None)


def rdma_transport_json(config: TransportConfig) -> dict[str, Any]:
    """nvmf_get_transports' entry for the RDMA transport (SPDK's fields; what pynvmf has
    no equivalent of is 0 or what pynvmf does: no shared receive queue)."""
    return {
        "trtype": "RDMA",
        **RDMA_FIXED,
        "in_capsule_data_size": config.inline_data_size,
        "io_unit_size": MAX_TRANSFER,
        "num_shared_buffers": 0,
        "buf_cache_size": 0,
        "dif_insert_or_strip": False,
        "abort_timeout_sec": 0,
        "max_srq_depth": 0,
        "no_srq": True,
        "acceptor_backlog": 0,
        "no_wr_batching": True,
    }


def transport_json(target: Target) -> dict[str, Any]:
    t = target.transport
    return {
        "trtype": "TCP",
        "max_queue_depth": QUEUE_ENTRIES,
        "max_io_qpairs_per_ctrlr": MAX_IO_QUEUES,
        "in_capsule_data_size": t.inline_data_size,
        "max_io_size": MAX_TRANSFER,
        "io_unit_size": t.max_h2c_data,
        "max_aq_depth": QUEUE_ENTRIES,
        "num_shared_buffers": 0,
        "buf_cache_size": 0,
        "dif_insert_or_strip": False,
        "zcopy": False,
        "c2h_success": True,
        "sock_priority": 0,
        "abort_timeout_sec": 0,
        "ack_timeout": 0,
        "data_wr_pool_size": 0,
    }


# SPDK's transport type names (any case in its RPCs) and the Port.trtype of each.
SPDK_TRTYPES: dict[str, str] = {"TCP": "tcp", "RDMA": "rdma"}


def spdk_trtype(trtype: str) -> str:
    """SPDK's name of Port.trtype `trtype` ("TCP", "RDMA")."""
    return next(name for name, ours in SPDK_TRTYPES.items() if ours == trtype)


def trid(port: Port) -> dict[str, str]:
    return {
        "trtype": spdk_trtype(port.trtype),
        "adrfam": "IPv6" if port.is_ipv6 else "IPv4",
        "traddr": port.address,
        "trsvcid": str(port.port),
    }


def referral_json(referral: Referral) -> dict[str, Any]:
    """A referral as SPDK lists it and as its nvmf_discovery_add_referral takes it."""
    return {
        "address": {
            "trtype": "TCP",
            "adrfam": "IPv6" if ":" in referral.address else "IPv4",
            "traddr": referral.address,
            "trsvcid": str(referral.port),
        },
        "secure_channel": referral.secure_channel,
        "subnqn": referral.subnqn,
    }


def listeners_of(target: Target, nqn: str) -> list[Port]:
    if nqn == DISCOVERY_NQN:
        return list(target.ports)
    return [port for port in target.ports if not port.discovery_only and port.exposes(nqn)]


def keyring_config(target: Target) -> list[dict[str, Any]]:
    """framework_get_config keyring: the keys by name and file (their secrets stay there)."""
    return [
        {"method": "keyring_file_add_key", "params": {"name": e.name, "path": e.path}}
        for e in target.keyring.values()
    ]


def nvmf_config(target: Target) -> list[dict[str, Any]]:
    """framework_get_config nvmf: the calls that build the target's NVMe-oF side again,
    in SPDK's order (the discovery subsystem's listeners first)."""
    config: list[dict[str, Any]] = [
        {"method": "nvmf_set_max_subsystems", "params": {"max_subsystems": target.max_subsystems}},
        {"method": "nvmf_create_transport", "params": transport_json(target)},
    ]
    rdma = rdma_transport(target)
    if rdma is not None:
        config.append({"method": "nvmf_create_transport", "params": rdma_transport_json(rdma)})
    for port in target.ports:
        if port.transport != (rdma if port.trtype == "rdma" else target.transport):
            raise RpcError(
                INVALID_PARAMS,
                f"name: port {port} has transport options of its own, which SPDK's "
                "configuration cannot hold (pynvmf_get_config can)",
            )
        if port.discovery_only or port.discovery_listener:
            config.append(_listener_call(DISCOVERY_NQN, port))
    # SPDK writes the referrals after the transports, before the subsystems.
    config += [
        {"method": "nvmf_discovery_add_referral", "params": referral_json(r)}
        for r in target.referrals
    ]
    defaults = Subsystem("defaults")
    for subsystem in target.subsystems.values():
        for key in ("max_io_queues", "version", "firmware", "ieee_oui"):
            if getattr(subsystem, key) != getattr(defaults, key):
                raise RpcError(
                    INVALID_PARAMS,
                    f"name: subsystem {subsystem.nqn} sets {key}, which SPDK's configuration "
                    "cannot hold (pynvmf_get_config can)",
                )
        params: dict[str, Any] = {
            "nqn": subsystem.nqn,
            "allow_any_host": subsystem.allow_any_host,
            "serial_number": subsystem.serial,
            "model_number": subsystem.model,
        }
        # Always the limit: without it nvmf_create_subsystem makes SPDK's 32. A subsystem
        # of pynvmf's own configuration has none; the NN its hosts saw stands for it.
        params["max_namespaces"] = subsystem.max_namespaces or reported_nn(subsystem)
        params.update(
            min_cntlid=subsystem.cntlid_min, max_cntlid=subsystem.cntlid_max, ana_reporting=True
        )
        config.append({"method": "nvmf_create_subsystem", "params": params})
        for host in sorted(subsystem.allowed_hosts):
            host_params: dict[str, Any] = {"nqn": subsystem.nqn, "host": host}
            auth = subsystem.host_auth.get(host)
            if auth is not None:
                if not auth.host_key_name or (auth.ctrl_key and not auth.ctrl_key_name):
                    raise RpcError(
                        INVALID_PARAMS,
                        f"name: the keys of {host} on {subsystem.nqn} are not in the keyring,"
                        " which SPDK's configuration names them by (pynvmf_get_config can)",
                    )
                host_params["dhchap_key"] = auth.host_key_name
                if auth.ctrl_key is not None:
                    host_params["dhchap_ctrlr_key"] = auth.ctrl_key_name
            if host in subsystem.host_psks:
                name = subsystem.host_psk_names.get(host)
                if not name:
                    raise RpcError(
                        INVALID_PARAMS,
                        f"name: host {host} of {subsystem.nqn} has a PSK that is not in the "
                        "keyring, which SPDK's configuration cannot name (pynvmf_get_config can)",
                    )
                host_params["psk"] = name
            config.append({"method": "nvmf_subsystem_add_host", "params": host_params})
        for nsid, ns in sorted(subsystem.namespaces.items()):
            config.append(
                {
                    "method": "nvmf_subsystem_add_ns",
                    "params": {
                        "nqn": subsystem.nqn,
                        "namespace": {
                            "nsid": nsid,
                            "bdev_name": ns.device_name,
                            "nguid": ns.nguid.hex().upper(),
                            "eui64": ns.eui64.hex().upper(),
                            "uuid": str(ns.uuid),
                            "anagrpid": ns.anagrpid,
                            "no_auto_visible": not ns.auto_visible,
                            **_ptpl_json(ns.reservation.ptpl_file),
                        },
                    },
                }
            )
            for host in sorted(ns.hosts):
                config.append(
                    {
                        "method": "nvmf_ns_add_host",
                        "params": {"nqn": subsystem.nqn, "nsid": nsid, "host": host},
                    }
                )
        for port in listeners_of(target, subsystem.nqn):
            config.append(_listener_call(subsystem.nqn, port))
            for grpid, group in sorted(subsystem.ana.groups.items()):
                if group.state_on(port) != AnaState.OPTIMIZED:
                    config.append(
                        {
                            "method": "nvmf_subsystem_listener_set_ana_state",
                            "params": {
                                "nqn": subsystem.nqn,
                                "listen_address": trid(port),
                                "ana_state": ana.NAMES[group.state_on(port)],
                                "anagrpid": grpid,
                            },
                        }
                    )
    return config


def _ptpl_json(path: Path | None) -> dict[str, str]:
    return {} if path is None else {"ptpl_file": str(path)}


def _listener_call(nqn: str, port: Port) -> dict[str, Any]:
    return {
        "method": "nvmf_subsystem_add_listener",
        "params": {
            "nqn": nqn,
            "listen_address": trid(port),
            "secure_channel": port.secure_channel == SecureChannelPolicy.REQUIRED,
        },
    }


async def load_spdk_config(cp: ControlPlane, config: Any, where: str = "config") -> None:
    """Make the calls an SPDK JSON configuration (what save_config wrote) holds, in order,
    as `nvmf_tgt --json` does; the first that fails stops the load, naming its place."""
    if not isinstance(config, dict) or not isinstance(config.get("subsystems"), list):
        raise RpcError(INVALID_PARAMS, f"{where}: not an SPDK configuration (no subsystems list)")
    for i, subsystem in enumerate(config["subsystems"]):
        place = f"{where}.subsystems[{i}]"
        if not isinstance(subsystem, dict):
            raise RpcError(INVALID_PARAMS, f"{place}: not an object")
        calls = subsystem.get("config") or []
        if not isinstance(calls, list):
            raise RpcError(INVALID_PARAMS, f"{place}.config: not a list")
        for j, call in enumerate(calls):
            call_place = f"{place}.config[{j}]"
            if not isinstance(call, dict) or not isinstance(call.get("method"), str):
                raise RpcError(INVALID_PARAMS, f"{call_place}: not a method call")
            try:
                await cp.call(call["method"], call.get("params") or {})
            except RpcError as exc:
                raise RpcError(exc.code, f"{call_place} ({call['method']}): {exc.message}") from exc


def spdk_config(target: Target) -> dict[str, Any]:
    """What rpc.py save_config writes for this target."""
    return {
        "subsystems": [
            {"subsystem": "keyring", "config": keyring_config(target)},
            {"subsystem": "bdev", "config": bdev_config(target)},
            {"subsystem": "nvmf", "config": nvmf_config(target)},
        ]
    }
