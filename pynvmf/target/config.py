"""Target configuration: the JSON file format and the objects it builds.

The CLI's options build the same dictionary a JSON file holds, so there is
one path from configuration to a running target.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from pynvmf.block.device import BlockDevice
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.target.server import DISCOVERY_PORT, NVME_TCP_PORT, Port, Target
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.tcp.target import TransportConfig

DEFAULT_NQN = "nqn.2024-11.dev.pynvmf:default"
DEFAULT_MEMORY = 1 << 30

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ConfigError(ValueError):
    pass


def parse_size(text: str | int) -> int:
    """'1G', '512M', '64KiB', '4096' -> bytes (binary units)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"not a size: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:4420', '[::1]:4420', '0.0.0.0' -> (address, port)."""
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\](?::(\d+))?", text)
    if m:
        return m.group(1), int(m.group(2) or NVME_TCP_PORT)
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, NVME_TCP_PORT
    if ":" in host:
        raise ConfigError(f"IPv6 addresses need brackets: {text!r}")
    return host, int(port)


def _transport(spec: dict[str, Any]) -> TransportConfig:
    inline = parse_size(spec.get("inline_data_size", 16384))
    if inline % 16 or inline < 0 or inline > 1 << 20:
        raise ConfigError("inline_data_size must be a multiple of 16 between 0 and 1 MiB")
    return TransportConfig(
        inline_data_size=inline,
        max_h2c_data=parse_size(spec.get("max_h2c_data", 128 * 1024)),
        allow_header_digest=bool(spec.get("header_digest", True)),
        allow_data_digest=bool(spec.get("data_digest", True)),
    )


def _device(spec: dict[str, Any], where: str) -> tuple[BlockDevice, str]:
    block_size = int(spec.get("block_size", 512))
    if "memory" in spec:
        return MemoryDevice(parse_size(spec["memory"]), block_size), "memory"
    if "file" in spec:
        path = Path(spec["file"])
        size = parse_size(spec["size"]) if "size" in spec else None
        create = bool(spec.get("create", size is not None and not path.exists()))
        device = FileDevice(path, block_size, size_bytes=size, create=create)
        return device, f"file:{path.resolve()}"
    raise ConfigError(f"{where}: a namespace needs 'memory' or 'file'")


def build_target(config: dict[str, Any]) -> Target:
    """Build (but do not start) a Target from a configuration dictionary."""
    try:
        subsystems = []
        for i, sub in enumerate(config.get("subsystems", [])):
            nqn = sub["nqn"]
            hosts = set(sub.get("hosts", []))
            subsystem = Subsystem(
                nqn,
                allow_any_host=bool(sub.get("allow_any_host", not hosts)),
                allowed_hosts=hosts,
                serial=sub.get("serial", ""),
                model=sub.get("model", "pynvmf"),
            )
            for j, ns_spec in enumerate(sub.get("namespaces", [])):
                device, backing = _device(ns_spec, f"subsystems[{i}].namespaces[{j}]")
                ns_uuid = uuid.UUID(ns_spec["uuid"]) if "uuid" in ns_spec else None
                nsid = int(ns_spec.get("nsid", j + 1))
                subsystem.add_namespace(Namespace.create(nqn, nsid, device, backing, ns_uuid))
            subsystems.append(subsystem)
        ports = []
        for spec in config.get("ports", []):
            ports.append(
                Port(
                    address=spec.get("address", "127.0.0.1"),
                    port=int(spec.get("port", NVME_TCP_PORT)),
                    subsystems=spec.get("subsystems"),
                    transport=_transport(spec),
                )
            )
        if "discovery_ports" in config:
            discovery = config["discovery_ports"]
        else:
            discovery = [
                {"address": a, "port": DISCOVERY_PORT}
                for a in dict.fromkeys(p.address for p in ports)
            ]
        for spec in discovery:
            ports.append(
                Port(
                    address=spec.get("address", "127.0.0.1"),
                    port=int(spec.get("port", DISCOVERY_PORT)),
                    discovery_only=True,
                    transport=_transport(spec),
                )
            )
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: {exc!r}") from exc
    if not ports:
        raise ConfigError("the configuration has no ports")
    return Target(subsystems, ports)


def load_config(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    return data


def config_from_options(
    *,
    listen: list[str],
    memory: list[str],
    files: list[str],
    nqn: str,
    allow_hosts: list[str],
    block_size: int,
    inline_data_size: int,
    discovery_port: int,
) -> dict[str, Any]:
    namespaces: list[dict[str, Any]] = [
        {"memory": size, "block_size": block_size} for size in memory
    ]
    namespaces += [{"file": path, "block_size": block_size} for path in files]
    if not namespaces:
        namespaces = [{"memory": DEFAULT_MEMORY, "block_size": block_size}]
    for nsid, ns in enumerate(namespaces, start=1):
        ns["nsid"] = nsid
    ports = []
    for text in listen or ["127.0.0.1:4420"]:
        address, port = parse_listen(text)
        ports.append({"address": address, "port": port, "inline_data_size": inline_data_size})
    config: dict[str, Any] = {
        "ports": ports,
        "subsystems": [{"nqn": nqn, "hosts": allow_hosts, "namespaces": namespaces}],
    }
    if discovery_port == 0:
        config["discovery_ports"] = []
    else:
        addresses = dict.fromkeys(p["address"] for p in ports)
        config["discovery_ports"] = [{"address": a, "port": discovery_port} for a in addresses]
    return config
