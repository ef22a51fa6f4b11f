"""pynvmf's own RPC methods (prefix pynvmf_): what SPDK's set has no method for.

- pynvmf_get_config {format?}: the running target as a configuration, in pynvmf's
  format (what `pynvmf target --config` reads; the default; it names where the metrics
  endpoint listens, if it does), SPDK's (what `--json` reads) or nvmetcli's (what
  `--nvmetcli-config` and `nvmetcli restore` read).
- pynvmf_save_config {path, format?}: the same, written by the target to `path`
  atomically (a temporary file, fsync, rename), so a crash leaves the old or the new.
- pynvmf_add_port / pynvmf_remove_port: a listener with transport options of its own
  (SPDK's listeners share the transport's), or one that exposes every subsystem; its
  `secure_channel` is "none" (default), "optional" (TLS or plain: nvmet's TREQ "not
  required", which SPDK's boolean cannot say) or "required". `trtype` "tcp" (default) or
  "rdma": an NVMe/RDMA port (its transport options default to the RDMA transport's, no
  digests, TLS or discovery-only port there; pyverbs and an RDMA device needed, else the
  error names `trtype`); pynvmf_remove_port takes `trtype` too (a TCP and an rdma port
  may share an address and number).
- pynvmf_subsystem_add_peer_listener / pynvmf_subsystem_remove_peer_listener
  {nqn, traddr, trsvcid, portid?}: another gateway's listener for the same subsystem,
  which this target's discovery log lists too (so `nvme connect-all` finds all paths);
  pynvmf_subsystem_get_peer_listeners {nqn}.
- pynvmf_keyring_add_key {name, key}: a DH-HMAC-CHAP secret or TLS PSK given as text
  (SPDK's keyring reads files, which a controller on another machine cannot write: blktests'
  control script runs on the host under test). Hosts then name it as any keyring key;
  keyring_get_keys shows it with an empty path.
- pynvmf_metrics_listen {address, port}: serve the Prometheus metrics at
  http://address:port/metrics (moving the endpoint if it listens already; port 0 picks
  one); returns where it listens. pynvmf_metrics_stop {}: stop serving them.
  pynvmf_metrics_get_listen {}: where they are served, or null.
- pynvmf_bdev_resize {name, size_bytes?, force?}: grow a bdev to size_bytes: a file bdev's
  regular file, a memory bdev (its data kept), an RBD image. Without size_bytes, take
  the size its storage has now, as bdev_aio_rescan does for any bdev: grown, or cut
  outside (a truncated file, an image another client cut), which is followed as a
  forced shrink, nothing more cut. A smaller size drops the data past it: refused ("force: ...")
  unless force is true; then the I/O of its namespaces is quiesced while every process
  serving them stops serving past the new end and the file is truncated, the memory cut
  or the image resized (docs/control-plane.md, "Namespaces that are cut"). The
  namespaces on it and their hosts see the new size. Returns the number of blocks.
- pynvmf_get_host_stats {subsystem?}: every host's (or one subsystem's hosts') counts of
  commands, bytes and errors per namespace and, while latency tracking is on, their
  latency and stage histograms (docs/metrics.md, "Per-host statistics").
- pynvmf_set_latency_tracking {enable}: time commands (latency histograms) or stop;
  off unless asked (this or `pynvmf target --latency-tracking`): it costs the hot path.
- pynvmf_fault_add {action, selector and trigger fields..., for_ms?}: a fault rule
  (docs/faults.md) acting from the next command it selects (a controller-level one: from
  now), removed for_ms later if given; returns its id. pynvmf_fault_remove {id}.
  pynvmf_fault_list {}: the rules in force, each with its id, the rule as given, the
  commands it selected (matches) and those it acted on (hits).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from pynvmf.config.files import json_bytes, write_atomically
from pynvmf.config.native import ConfigError, config_of
from pynvmf.config.nvmetcli import nvmetcli_config
from pynvmf.config.spdk import rdma_transport, spdk_config
from pynvmf.metrics.endpoint import MetricsEndpoint, MetricsListenError
from pynvmf.metrics.host_stats import host_stats
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params, change_error
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import FAULT_FIELDS, parse_fault, parse_for_ms
from pynvmf.target.port import TRTYPES, Port
from pynvmf.tcp.target import TransportConfig

table = MethodTable()
method = table.register

FORMATS = ("pynvmf", "spdk", "nvmetcli")


def _config(cp: ControlPlane, fmt: str) -> Any:
    if fmt == "pynvmf":
        try:
            where = cp.metrics.address if cp.metrics is not None else None
            return config_of(cp.target, metrics_listen=where)
        except ConfigError as exc:
            raise RpcError(INVALID_PARAMS, f"format: {exc}") from exc
    if fmt == "spdk":
        return spdk_config(cp.target)
    if fmt == "nvmetcli":
        return nvmetcli_config(cp.target)
    raise RpcError(INVALID_PARAMS, f"format: {fmt!r} is not one of {', '.join(FORMATS)}")


@method("pynvmf_get_config")
async def pynvmf_get_config(cp: ControlPlane, p: Params) -> Any:
    fmt = p.string("format", "pynvmf")
    p.done()
    return _config(cp, fmt)


@method("pynvmf_save_config")
async def pynvmf_save_config(cp: ControlPlane, p: Params) -> bool:
    path = p.string("path")
    fmt = p.string("format", "pynvmf")
    p.done()
    config = _config(cp, fmt)
    try:
        write_atomically(path, json_bytes(config))
    except OSError as exc:
        raise RpcError(INVALID_PARAMS, f"path: {path}: {exc.strerror or exc}") from exc
    return True


def _trtype(p: Params) -> str:
    trtype: str = p.string("trtype", "tcp")
    if trtype not in TRTYPES:
        raise RpcError(INVALID_PARAMS, f"trtype: {trtype!r} is not one of {', '.join(TRTYPES)}")
    return trtype


@method("pynvmf_add_port")
async def pynvmf_add_port(cp: ControlPlane, p: Params) -> int:
    address = p.string("address")
    port_number = p.integer("port", high=0xFFFF)
    subsystems = p.strings("subsystems")
    discovery_only = p.boolean("discovery_only", False)
    secure_channel = p.string("secure_channel", "none")
    trtype = _trtype(p)
    rdma = trtype == "rdma"
    # An rdma port takes the RDMA transport's options (nvmf_create_transport -t RDMA's, or
    # another rdma port's) where there is one; digests are NVMe/TCP's.
    base = (rdma_transport(cp.target, cp.rdma_transport) if rdma else None) or cp.target.transport
    digests = not rdma and base.allow_header_digest, not rdma and base.allow_data_digest
    transport = TransportConfig(
        inline_data_size=p.integer("inline_data_size", base.inline_data_size, high=0xFFFFFFFF),
        max_h2c_data=p.integer("max_h2c_data", base.max_h2c_data, high=0xFFFFFFFF),
        allow_header_digest=p.boolean("header_digest", digests[0]),
        allow_data_digest=p.boolean("data_digest", digests[1]),
        cpda=base.cpda,
    )
    p.done()
    if discovery_only and subsystems:
        raise RpcError(INVALID_PARAMS, "subsystems: a discovery-only port exposes none")
    if rdma:
        if transport.allow_header_digest or transport.allow_data_digest:
            field = "header_digest" if transport.allow_header_digest else "data_digest"
            raise RpcError(
                INVALID_PARAMS, f"{field}: digests are NVMe/TCP's: an rdma port has none"
            )
        if discovery_only:
            raise RpcError(
                INVALID_PARAMS, "discovery_only: an rdma port answers the discovery NQN itself"
            )
    for i, nqn in enumerate(subsystems or []):
        if nqn not in cp.target.subsystems:
            raise RpcError(INVALID_PARAMS, f"subsystems[{i}]: no subsystem {nqn!r}")
    port = Port(
        address,
        port_number,
        subsystems=subsystems,
        discovery_only=discovery_only,
        discovery_listener=discovery_only,
        transport=transport,
        trtype=trtype,
    )
    port.secure_channel = secure_channel
    try:
        await cp.target.add_port(port)
    except ChangeError as exc:
        raise change_error(exc, {}) from exc
    return port.port


@method("pynvmf_remove_port")
async def pynvmf_remove_port(cp: ControlPlane, p: Params) -> bool:
    address = p.string("address")
    port_number = p.integer("port", high=0xFFFF)
    trtype = _trtype(p)
    p.done()
    port = cp.target.find_port(address, port_number, trtype)
    if port is None:
        raise RpcError(
            INVALID_PARAMS,
            f"port: the target does not listen on {address} {port_number} ({trtype})",
        )
    await cp.target.remove_port(port)
    return True


def _peer(p: Params) -> tuple[str, str, int]:
    nqn = p.string("nqn")
    traddr = p.string("traddr")
    trsvcid = p.string("trsvcid")
    if not trsvcid.isdigit() or not 1 <= int(trsvcid) <= 0xFFFF:
        raise RpcError(INVALID_PARAMS, f"trsvcid: {trsvcid!r} is not a TCP port")
    return nqn, traddr, int(trsvcid)


_PEER_NAMES = {"address": "traddr", "port": "trsvcid"}


@method("pynvmf_subsystem_add_peer_listener")
async def pynvmf_subsystem_add_peer_listener(cp: ControlPlane, p: Params) -> bool:
    nqn, traddr, trsvcid = _peer(p)
    portid = p.integer("portid", 0, high=0xFFFF)
    p.done()
    try:
        cp.target.add_peer_listener(nqn, traddr, trsvcid, portid)
    except ChangeError as exc:
        raise change_error(exc, _PEER_NAMES) from exc
    return True


@method("pynvmf_subsystem_remove_peer_listener")
async def pynvmf_subsystem_remove_peer_listener(cp: ControlPlane, p: Params) -> bool:
    nqn, traddr, trsvcid = _peer(p)
    p.done()
    try:
        cp.target.remove_peer_listener(nqn, traddr, trsvcid)
    except ChangeError as exc:
        raise change_error(exc, _PEER_NAMES) from exc
    return True


@method("pynvmf_subsystem_get_peer_listeners")
async def pynvmf_subsystem_get_peer_listeners(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    nqn = p.string("nqn")
    p.done()
    subsystem = cp.target.subsystems.get(nqn)
    if subsystem is None:
        raise RpcError(INVALID_PARAMS, f"nqn: no subsystem {nqn!r}")
    return [
        {"traddr": address, "trsvcid": str(port), "portid": portid}
        for address, port, portid in subsystem.peer_listeners
    ]


@method("pynvmf_keyring_add_key")
async def pynvmf_keyring_add_key(cp: ControlPlane, p: Params) -> bool:
    name = p.string("name")
    key = p.string("key")
    p.done()
    try:
        cp.target.add_key_text(name, key)
    except ChangeError as exc:
        raise change_error(exc, {}) from exc
    return True


@method("pynvmf_bdev_resize")
async def pynvmf_bdev_resize(cp: ControlPlane, p: Params) -> int:
    name = p.string("name")
    size = p.integer("size_bytes", None, low=1)  # none: rescan (the storage changed outside)
    force = p.boolean("force", False)
    p.done()
    try:
        num_blocks: int = await cp.target.resize_block_device(name, size, force=force)
    except ChangeError as exc:
        raise change_error(exc, {"size": "size_bytes"}) from exc
    return num_blocks


def _metrics(cp: ControlPlane) -> MetricsEndpoint:
    if cp.metrics is None:
        raise RpcError(INVALID_PARAMS, "this target has no metrics endpoint")
    return cp.metrics


def _listen_result(address: tuple[str, int] | None) -> dict[str, Any] | None:
    return None if address is None else {"address": address[0], "port": address[1]}


@method("pynvmf_metrics_listen")
async def pynvmf_metrics_listen(cp: ControlPlane, p: Params) -> dict[str, Any] | None:
    address = p.string("address")
    port = p.integer("port", high=0xFFFF)
    p.done()
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise RpcError(INVALID_PARAMS, f"address: {address!r} is not an IP address") from None
    try:
        return _listen_result(await _metrics(cp).listen(address, port))
    except MetricsListenError as exc:
        raise RpcError(INVALID_PARAMS, f"address: {exc.strerror}") from exc


@method("pynvmf_metrics_stop")
async def pynvmf_metrics_stop(cp: ControlPlane, p: Params) -> bool:
    p.done()
    await _metrics(cp).close()
    return True


@method("pynvmf_metrics_get_listen")
async def pynvmf_metrics_get_listen(cp: ControlPlane, p: Params) -> dict[str, Any] | None:
    p.done()
    return _listen_result(_metrics(cp).address)


@method("pynvmf_get_host_stats")
async def pynvmf_get_host_stats(cp: ControlPlane, p: Params) -> dict[str, Any]:
    subnqn = p.string("subsystem", None)
    p.done()
    if subnqn is not None and subnqn not in cp.target.subsystems:
        raise RpcError(INVALID_PARAMS, f"subsystem: no subsystem {subnqn!r}")
    return host_stats(cp.target, subnqn)


@method("pynvmf_set_latency_tracking")
async def pynvmf_set_latency_tracking(cp: ControlPlane, p: Params) -> bool:
    enable = p.boolean("enable")
    p.done()
    cp.target.set_latency_tracking(enable)
    return True


@method("pynvmf_fault_add")
async def pynvmf_fault_add(cp: ControlPlane, p: Params) -> int:
    given = {name: p.value(name) for name in FAULT_FIELDS}
    for_ms = p.value("for_ms")
    p.done()
    try:
        spec = parse_fault({k: v for k, v in given.items() if v is not None})
        rule = cp.target.add_fault(spec, parse_for_ms(for_ms))
        await cp.target.scheduled_faults.settled()
        await cp.target.faults_applied()
    except ChangeError as exc:
        raise change_error(exc, {}) from exc
    return rule.id


@method("pynvmf_fault_remove")
async def pynvmf_fault_remove(cp: ControlPlane, p: Params) -> bool:
    rule_id = p.integer("id", high=0xFFFFFFFF)
    p.done()
    try:
        cp.target.remove_fault(rule_id)
        await cp.target.faults_applied()
    except ChangeError as exc:
        raise change_error(exc, {}) from exc
    return True


@method("pynvmf_fault_list")
async def pynvmf_fault_list(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    p.done()
    return [rule.listing() for rule in cp.target.faults.rules.values()]
