"""Configuration: listen addresses, JSON files, and the zero-argument defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.config.native import (
    DEFAULT_NQN,
    ConfigError,
    build_target,
    config_from_options,
    config_of,
    load_config,
    metrics_listen_of,
    parse_listen,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4420", ("127.0.0.1", 4420)),
        ("0.0.0.0", ("0.0.0.0", 4420)),
        ("[::1]:5000", ("::1", 5000)),
        ("[fe80::1]", ("fe80::1", 4420)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


def test_parse_listen_needs_brackets_for_ipv6() -> None:
    with pytest.raises(ConfigError):
        parse_listen("::1:4420")


def _defaults() -> dict:
    return config_from_options(
        listen=[],
        memory=[],
        files=[],
        nqn=DEFAULT_NQN,
        allow_hosts=[],
        block_size=512,
        inline_data_size=16384,
        discovery_port=8009,
    )


async def test_zero_argument_target_is_one_gib_in_memory_on_4420_with_discovery_on_8009() -> None:
    target = await build_target(_defaults())
    io = [p for p in target.ports if not p.discovery_only]
    disc = [p for p in target.ports if p.discovery_only]
    assert [(p.address, p.port) for p in io] == [("127.0.0.1", 4420)]
    assert [(p.address, p.port) for p in disc] == [("127.0.0.1", 8009)]
    (subsystem,) = target.subsystems.values()
    assert subsystem.nqn == DEFAULT_NQN
    assert subsystem.allow_any_host
    (ns,) = subsystem.namespaces.values()
    assert isinstance(ns.device, MemoryDevice)
    assert ns.device.capabilities.size == 1 << 30
    assert ns.device.capabilities.block_size == 512


async def test_options_make_one_namespace_per_memory_and_file(tmp_path: Path) -> None:
    path = tmp_path / "disk.img"
    path.write_bytes(bytes(1 << 20))
    config = config_from_options(
        listen=["[::1]:4421", "127.0.0.2:4422"],
        memory=["2M"],
        files=[str(path)],
        nqn="nqn.2024-11.dev.pynvmf:t",
        allow_hosts=["nqn.h"],
        block_size=4096,
        inline_data_size=4096,
        discovery_port=0,
    )
    target = await build_target(config)
    assert all(not p.discovery_only for p in target.ports)
    assert [str(p) for p in target.ports] == ["[::1]:4421", "127.0.0.2:4422"]
    assert target.ports[0].transport.inline_data_size == 4096
    subsystem = target.subsystems["nqn.2024-11.dev.pynvmf:t"]
    assert not subsystem.allow_any_host and subsystem.allowed_hosts == {"nqn.h"}
    assert isinstance(subsystem.namespaces[1].device, MemoryDevice)
    assert isinstance(subsystem.namespaces[2].device, FileDevice)
    assert subsystem.namespaces[2].device.capabilities.num_blocks == 256


async def test_json_config_round_trip(tmp_path: Path) -> None:
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0, "subsystems": ["nqn.a:1"]}],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": "nqn.a:1",
                "hosts": ["nqn.host:1"],
                "serial": "SER1",
                "namespaces": [
                    {"nsid": 7, "memory": "1M", "uuid": "5b1a7c2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"},
                    {"nsid": 9, "file": str(tmp_path / "n.img"), "size": "1M"},
                ],
            },
            {"nqn": "nqn.a:2", "namespaces": [{"memory": "1M", "block_size": 4096}]},
        ],
    }
    path = tmp_path / "target.json"
    path.write_text(json.dumps(config))
    target = await build_target(load_config(path))
    sub1 = target.subsystems["nqn.a:1"]
    assert sorted(sub1.namespaces) == [7, 9]
    assert str(sub1.namespaces[7].uuid) == "5b1a7c2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"
    assert (tmp_path / "n.img").stat().st_size == 1 << 20
    assert sub1.serial == "SER1"
    assert target.ports[0].exposes("nqn.a:1") and not target.ports[0].exposes("nqn.a:2")
    assert target.subsystems["nqn.a:2"].namespaces[1].block_size == 4096


async def test_namespace_identifiers_are_stable_across_builds() -> None:
    a = (await build_target(_defaults())).subsystems[DEFAULT_NQN].namespaces[1]
    b = (await build_target(_defaults())).subsystems[DEFAULT_NQN].namespaces[1]
    assert (a.uuid, a.nguid, a.eui64) == (b.uuid, b.nguid, b.eui64)


@pytest.mark.parametrize(
    "config",
    [
        {"subsystems": [{"nqn": "nqn.a:1", "namespaces": [{"memory": "1M"}]}], "ports": []},
        {"ports": [{"port": 1}], "subsystems": [{"namespaces": []}]},
        {"ports": [{"port": 1}], "subsystems": [{"nqn": "n", "namespaces": [{"nsid": 1}]}]},
        {"ports": [{"port": 1, "inline_data_size": 100}]},
        {
            "ports": [{"port": 1}],
            "subsystems": [{"nqn": "n", "namespaces": [{"memory": "1000"}]}],
        },
    ],
)
async def test_invalid_configs_are_refused_with_a_clear_error(config: dict) -> None:
    with pytest.raises((ConfigError, ValueError)):
        await build_target(config)


@pytest.mark.parametrize("size", ["1X", True])
async def test_a_size_that_is_not_one_is_refused_naming_its_key(size: object) -> None:
    config = {"devices": [{"name": "d", "memory": size}]}
    with pytest.raises(ConfigError, match=r"devices\[0\]\.memory: not a size"):
        await build_target(config)


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{ports: ]")
    with pytest.raises(ConfigError, match=r"bad\.json"):
        load_config(path)


def _one_subsystem(*namespaces: dict) -> dict:
    return {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [{"nqn": "nqn.a:ptpl", "namespaces": list(namespaces)}],
    }


async def test_reservations_persist_beside_a_file_and_nowhere_for_memory(tmp_path: Path) -> None:
    image = tmp_path / "n.img"
    elsewhere = tmp_path / "state" / "mem.json"
    config = _one_subsystem(
        {"nsid": 1, "file": str(image), "size": "1M"},
        {"nsid": 2, "memory": "1M"},
        {"nsid": 3, "memory": "1M", "ptpl_file": str(elsewhere)},
        {"nsid": 4, "file": str(tmp_path / "m.img"), "size": "1M", "ptpl_file": None},
    )
    target = await build_target(config)
    namespaces = target.subsystems["nqn.a:ptpl"].namespaces
    assert namespaces[1].reservation.ptpl_file == tmp_path / "n.img.ptpl.json"
    assert namespaces[2].reservation.ptpl_file is None
    assert namespaces[3].reservation.ptpl_file == elsewhere
    assert namespaces[4].reservation.ptpl_file is None
    # Nothing is written until a host asks for persistence.
    assert not (tmp_path / "n.img.ptpl.json").exists()
    # The saved configuration keeps what is not the default, and the default stays so.
    saved = {ns["nsid"]: ns for ns in config_of(target)["subsystems"][0]["namespaces"]}
    assert "ptpl_file" not in saved[1] and "ptpl_file" not in saved[2]
    assert saved[3]["ptpl_file"] == str(elsewhere) and saved[4]["ptpl_file"] is None
    await target.stop()


async def test_a_persistence_file_that_cannot_be_restored_stops_the_target(
    tmp_path: Path,
) -> None:
    state = tmp_path / "bad.json"
    state.write_text('{"format": 1, "ptpl": true}')
    config = _one_subsystem({"nsid": 1, "memory": "1M", "ptpl_file": str(state)})
    with pytest.raises(ConfigError, match=r"ptpl_file: .*bad\.json"):
        await build_target(config)


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"listen": "127.0.0.1:9464"}, ("127.0.0.1", 9464)),
        ({"listen": "[::1]:0"}, ("::1", 0)),
        ({}, None),
    ],
)
def test_metrics_listen_of_the_configuration(
    metrics: dict[str, str], expected: tuple[str, int] | None
) -> None:
    assert metrics_listen_of({"metrics": metrics}) == expected
    assert metrics_listen_of({}) is None


@pytest.mark.parametrize(
    ("metrics", "error"),
    [
        ({"listen": "127.0.0.1"}, "config.metrics.listen: .* needs a port"),
        ({"listen": "localhost:9464"}, "config.metrics.listen: .* not an IP address"),
        ({"listen": 9464}, "config.metrics.listen: 9464 has the wrong type"),
        ({"port": 9464}, "config.metrics.port: unknown key"),
    ],
)
def test_metrics_listen_of_a_wrong_configuration_names_the_key(
    metrics: dict[str, object], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        metrics_listen_of({"metrics": metrics})


async def test_rate_limits_of_devices_and_namespaces_round_trip() -> None:
    """`qos` on a named device and on a namespace's own device: applied (SPDK's rounding
    included), written back by config_of, and refused naming the key when wrong."""
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "devices": [{"name": "D0", "memory": "1M", "qos": {"rw_ios_per_sec": 1500}}],
        "subsystems": [
            {
                "nqn": "nqn.a:1",
                "namespaces": [
                    {"nsid": 1, "device": "D0"},
                    {"nsid": 2, "memory": "1M", "qos": {"w_mbytes_per_sec": 8}},
                    {"nsid": 3, "memory": "1M"},
                ],
            }
        ],
    }
    target = await build_target(config)
    try:
        namespaces = target.subsystems["nqn.a:1"].namespaces
        assert namespaces[1].qos is not None and namespaces[2].qos is not None
        assert namespaces[1].qos.limits.rw_ios_per_sec == 2000
        assert namespaces[2].qos.limits.w_mbytes_per_sec == 8
        assert namespaces[3].qos is None
        saved = config_of(target)
        assert saved["devices"][0]["qos"] == {"rw_ios_per_sec": 2000}
        saved_ns = {ns["nsid"]: ns for ns in saved["subsystems"][0]["namespaces"]}
        assert saved_ns[2]["qos"] == {"w_mbytes_per_sec": 8}
        assert "qos" not in saved_ns[3]
    finally:
        await target.stop()
    for qos, key in [
        ({"iops": 1000}, "devices[0].qos.iops"),
        ({"rw_ios_per_sec": -1}, "devices[0].qos.rw_ios_per_sec"),
        ("fast", "devices[0].qos"),
    ]:
        bad = {**config, "devices": [{"name": "D0", "memory": "1M", "qos": qos}]}
        with pytest.raises(ConfigError) as raised:
            await build_target(bad)
        assert str(raised.value).startswith(key + ":"), raised.value
