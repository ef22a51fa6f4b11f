"""nvmetcli's JSON: a Linux target's saved configuration loads into pynvmf (what cannot
be honoured is refused, naming the key) and pynvmf's target is written back in it."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import apply_config
from pynvmf.config.nvmetcli import load_nvmetcli, nvmetcli_config
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.target.subsystem import DEFAULT_VERSION
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:nvmet"
OPEN = "testnqn"  # nvmet takes any name
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349"
NS_UUID = "91fdba0d-f87b-4c25-b80f-db7be1418b9e"
NGUID = "ef90689c-6c46-d44c-89c1-4067801309a8"


def saved(image: Path) -> dict[str, Any]:
    """As `nvmetcli save` writes it on Linux 6.1 (attribute values are configfs text)."""
    return {
        "hosts": [{"nqn": HOST}],
        "ports": [
            {
                "addr": {
                    "adrfam": "ipv4",
                    "traddr": "127.0.0.1",
                    "treq": "not specified",
                    "trsvcid": "14420",
                    "trtype": "tcp",
                    "tsas": "none",
                },
                "ana_groups": [{"ana": {"state": "optimized"}, "grpid": 1}],
                "param": {"inline_data_size": "16384", "pi_enable": "0"},
                "portid": 1,
                "referrals": [],
                "subsystems": [NQN, OPEN],
            }
        ],
        "subsystems": [
            {
                "allowed_hosts": [HOST],
                "attr": {
                    "allow_any_host": "0",
                    "cntlid_max": "65519",
                    "cntlid_min": "1",
                    "firmware": "6.1.0-2",
                    "ieee_oui": "0x000000",
                    "model": "Linux",
                    "pi_enable": "0",
                    "qid_max": "128",
                    "serial": "8c5a76e24dd4e5b1f0a4",
                    "version": "1.3",
                },
                "namespaces": [
                    {
                        "ana": {"grpid": "1"},
                        "ana_grpid": 1,
                        "device": {"nguid": NGUID, "path": str(image), "uuid": NS_UUID},
                        "enable": 1,
                        "nsid": 1,
                    }
                ],
                "nqn": NQN,
            },
            {"allowed_hosts": [], "attr": {"allow_any_host": "1"}, "namespaces": [], "nqn": OPEN},
        ],
    }


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "ns.img"
    path.write_bytes(bytes(1 << 20))
    return path


async def test_a_linux_targets_configuration_loads(image: Path) -> None:
    target = Target()
    await load_nvmetcli(target, saved(image))
    sub = target.subsystems[NQN]
    assert not sub.allow_any_host and sub.allowed_hosts == {HOST}
    assert (sub.model, sub.serial, sub.firmware) == ("Linux", "8c5a76e24dd4e5b1f0a4", "6.1.0-2")
    assert sub.version == 0x10300 and sub.max_io_queues == 128
    ns = sub.namespaces[1]
    assert str(ns.uuid) == NS_UUID and ns.nguid == uuid.UUID(NGUID).bytes
    assert ns.eui64 == bytes(8)  # nvmet reports none, so neither does pynvmf
    assert target.block_devices[ns.device_name].path == str(image.resolve())
    assert target.subsystems[OPEN].allow_any_host
    (port,) = target.ports
    assert (port.address, port.port, port.portid) == ("127.0.0.1", 14420, 1)
    assert port.subsystems == [NQN, OPEN] and port.transport.inline_data_size == 16384
    await target.stop()


async def test_it_is_written_back_as_it_was_read(image: Path) -> None:
    target = Target()
    await load_nvmetcli(target, saved(image))
    written = nvmetcli_config(target)
    again = Target()
    await load_nvmetcli(again, copy.deepcopy(written))
    assert nvmetcli_config(again) == written
    sub = written["subsystems"][0]
    assert sub["attr"]["version"] == "1.3" and sub["attr"]["qid_max"] == "128"
    assert sub["namespaces"][0]["device"] == {
        "nguid": NGUID,
        "path": str(image.resolve()),
        "uuid": NS_UUID,
    }
    assert written["hosts"] == [{"nqn": HOST}]
    for t in (target, again):
        await t.stop()


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    node: Any = config
    *parents, leaf = path.split(".")
    for name in parents:
        node = node[int(name)] if name.isdigit() else node[name]
    node[int(leaf) if leaf.isdigit() else leaf] = value


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("ports.0.addr.trtype", "rdma", "config.ports[0].addr.trtype"),
        ("ports.0.addr.treq", "required", "config.ports[0].addr.treq"),
        ("ports.0.addr.tsas", "tls1.2", "config.ports[0].addr.tsas"),
        ("ports.0.param.pi_enable", "1", "config.ports[0].param.pi_enable"),
        ("ports.0.param.inline_data_size", "100", "config.ports[0].param.inline_data_size"),
        (
            "ports.0.referrals",
            [{"name": "r", "addr": {"trtype": "tcp"}}],
            "config.ports[0].referrals",
        ),
        ("ports.0.ana_groups", [{"grpid": 200}], "config.ports[0].ana_groups[0].grpid"),
        (
            "ports.0.ana_groups",
            [{"grpid": 1, "ana": {"state": "asleep"}}],
            "config.ports[0].ana_groups[0].ana.state",
        ),
        ("ports.0.subsystems", ["nqn.none"], "config.ports[0].subsystems[0]"),
        ("ports.0.bogus", 1, "config.ports[0].bogus"),
        ("subsystems.0.attr.pi_enable", "1", "config.subsystems[0].attr.pi_enable"),
        ("subsystems.0.attr.offload", "1", "config.subsystems[0].attr.offload"),
        ("subsystems.0.attr.serial", "S" * 21, "config.subsystems[0].attr.serial"),
        (
            "subsystems.0.passthru",
            [{"device": {"path": "/dev/nvme0"}, "enable": 1}],
            "config.subsystems[0].passthru[0].enable",
        ),
        ("subsystems.0.namespaces.0.enable", 0, "config.subsystems[0].namespaces[0].enable"),
        (
            "subsystems.0.namespaces.0.ana",
            {"grpid": "129"},
            "config.subsystems[0].namespaces[0].ana.grpid",
        ),
        (
            "subsystems.0.namespaces.0.resv",
            {"enable": "1"},
            "config.subsystems[0].namespaces[0].resv.enable",
        ),
        (
            "subsystems.0.namespaces.0.device.path",
            "/nonexistent",
            "config.subsystems[0].namespaces[0].device.path",
        ),
        (
            "subsystems.0.namespaces.0.device.uuid",
            "zz",
            "config.subsystems[0].namespaces[0].device.uuid",
        ),
        ("hosts.0.dhchap_key", "DHHC-1:00:xyz", "config.hosts[0].dhchap_key"),
    ],
)
async def test_what_pynvmf_cannot_honour_is_refused_naming_the_key(
    image: Path, path: str, value: Any, named: str
) -> None:
    config = saved(image)
    _set(config, path, value)
    target = Target()
    with pytest.raises(RpcError) as info:
        await load_nvmetcli(target, config)
    assert info.value.message.startswith(f"{named}: "), info.value.message
    await target.stop()


async def test_a_disabled_passthru_is_nothing_to_honour(image: Path) -> None:
    config = saved(image)
    passthru = {"device": {"path": ""}, "enable": 0, "admin_timeout": 0, "io_timeout": 0}
    config["subsystems"][0]["passthru"] = [passthru]
    target = Target()
    await load_nvmetcli(target, config)
    assert NQN in target.subsystems
    await target.stop()


async def test_memory_namespaces_cannot_be_written_for_nvmet() -> None:
    target = Target()
    await apply_config(
        target, {"subsystems": [{"nqn": NQN, "namespaces": [{"memory": "1M"}]}], "ports": []}
    )
    with pytest.raises(RpcError, match=r"namespace 1 of .* is not on a file or block device"):
        nvmetcli_config(target)
    assert target.subsystems[NQN].version == DEFAULT_VERSION


@pytest.mark.parametrize(
    ("tsas", "treq", "secure_channel", "written_treq"),
    [
        ("tls1.3", "required", "required", "required"),
        # nvmet makes a tls1.3 port's treq "required" unless told otherwise.
        ("tls1.3", "not specified", "required", "required"),
        ("tls1.3", "not required", "optional", "not required"),
        ("none", "not specified", "none", "not specified"),
    ],
)
async def test_a_tls_port_loads_and_is_written_back(
    image: Path, tsas: str, treq: str, secure_channel: str, written_treq: str
) -> None:
    config = saved(image)
    _set(config, "ports.0.addr.tsas", tsas)
    _set(config, "ports.0.addr.treq", treq)
    target = Target()
    await load_nvmetcli(target, config)
    (port,) = target.ports
    assert port.secure_channel == secure_channel
    addr = nvmetcli_config(target)["ports"][0]["addr"]
    assert (addr.get("tsas", "none"), addr["treq"]) == (tsas, written_treq)
    await target.stop()
