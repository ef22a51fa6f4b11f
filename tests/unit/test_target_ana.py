"""ANA: the log page's layout, and ANA groups through every configuration format (pynvmf's
file, SPDK's RPC methods and configuration, nvmetcli's JSON) on a target not started."""

from __future__ import annotations

import copy
import struct
from pathlib import Path

import pytest

from pynvmf.config.native import ConfigError, apply_config, config_of
from pynvmf.config.nvmetcli import load_nvmetcli, nvmetcli_config
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.rpc.methods import ControlPlane
from pynvmf.rpc.server import control_plane
from pynvmf.spec.logpages import ANA_DESC_SIZE, ANA_HEADER_SIZE, AnaGroupDescriptor, AnaLog
from pynvmf.spec.logpages import AnaState as S
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:ana"


def test_the_ana_log_layout_is_the_specifications() -> None:
    log = AnaLog(
        chgcnt=0x1122334455667788,
        groups=[AnaGroupDescriptor(1, S.OPTIMIZED, 5, [1, 2]), AnaGroupDescriptor(7, S.CHANGE, 9)],
    )
    raw = log.pack()
    assert ANA_HEADER_SIZE == 16 and ANA_DESC_SIZE == 32
    assert struct.unpack_from("<QH", raw, 0) == (0x1122334455667788, 2)
    assert raw[10:16] == bytes(6)
    # grpid, nnsids, chgcnt, state, 15 reserved bytes, then the NSIDs.
    assert struct.unpack_from("<IIQB", raw, 16) == (1, 2, 5, 0x01)
    assert raw[33:48] == bytes(15)
    assert struct.unpack_from("<II", raw, 48) == (1, 2)
    assert struct.unpack_from("<IIQB", raw, 56) == (7, 0, 9, 0x0F)
    assert len(raw) == 16 + 32 + 8 + 32
    assert AnaLog.unpack(raw) == log
    rgo = log.pack(groups_only=True)
    assert len(rgo) == 16 + 2 * 32 and AnaLog.unpack(rgo).groups[0].nsids == []


async def test_ana_groups_round_trip_through_pynvmfs_config(tmp_path: Path) -> None:
    config = {
        "subsystems": [
            {
                "nqn": NQN,
                "ana_groups": [
                    {"grpid": 1, "state": "non_optimized"},
                    {
                        "grpid": 2,
                        "state": "inaccessible",
                        "listeners": [
                            {"address": "127.0.0.1", "port": 14421, "state": "optimized"}
                        ],
                    },
                ],
                "peer_listeners": [{"address": "127.0.0.2", "port": 14422, "portid": 2}],
                "namespaces": [{"memory": "1M"}, {"memory": "1M", "anagrpid": 2}],
            }
        ],
        "ports": [
            {"address": "127.0.0.1", "port": 14420},
            {"address": "127.0.0.1", "port": 14421},
        ],
        "discovery_ports": [],
    }
    target = Target()
    await apply_config(target, copy.deepcopy(config))
    subsystem = target.subsystems[NQN]
    port_a, port_b = target.ports
    group2 = subsystem.ana.groups[2]
    assert (group2.state_on(port_a), group2.state_on(port_b)) == (S.INACCESSIBLE, S.OPTIMIZED)
    assert subsystem.ana.groups[1].state_on(port_b) == S.NON_OPTIMIZED
    assert subsystem.namespaces[2].anagrpid == 2
    assert subsystem.peer_listeners == [("127.0.0.2", 14422, 2)]
    written = config_of(target)
    again = Target()
    await apply_config(again, copy.deepcopy(written))
    assert config_of(again) == written
    for t in (target, again):
        await t.stop()


async def test_spdk_methods_set_listener_states_and_the_config_keeps_them() -> None:
    cp: ControlPlane = control_plane(Target())
    listen = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "14430"}
    await cp.call("nvmf_create_subsystem", {"nqn": NQN, "ana_reporting": True})
    await cp.call("bdev_malloc_create", {"name": "M0", "num_blocks": 64, "block_size": 512})
    await cp.call("bdev_malloc_create", {"name": "M1", "num_blocks": 64, "block_size": 512})
    await cp.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "M0"}})
    await cp.call(
        "nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "M1", "anagrpid": 3}}
    )
    await cp.call(
        "nvmf_subsystem_add_listener",
        {"nqn": NQN, "listen_address": listen, "ana_state": "non_optimized"},
    )
    await cp.call(
        "nvmf_subsystem_listener_set_ana_state",
        {"nqn": NQN, "listen_address": listen, "ana_state": "inaccessible", "anagrpid": 3},
    )
    (listener,) = await cp.call("nvmf_subsystem_get_listeners", {"nqn": NQN})
    assert listener["ana_states"] == [
        {"ana_group": 1, "ana_state": "non_optimized"},
        {"ana_group": 3, "ana_state": "inaccessible"},
    ]
    (sub,) = await cp.call("nvmf_get_subsystems", {"nqn": NQN})
    assert [ns["anagrpid"] for ns in sub["namespaces"]] == [1, 3]
    saved = spdk_config(cp.target)
    again = control_plane(Target())
    await load_spdk_config(again, copy.deepcopy(saved))
    assert spdk_config(again.target) == saved
    (listener,) = await again.call("nvmf_subsystem_get_listeners", {"nqn": NQN})
    assert listener["ana_states"][1] == {"ana_group": 3, "ana_state": "inaccessible"}
    await cp.call(
        "pynvmf_subsystem_add_peer_listener", {"nqn": NQN, "traddr": "10.0.0.2", "trsvcid": "4420"}
    )
    assert await cp.call("pynvmf_subsystem_get_peer_listeners", {"nqn": NQN}) == [
        {"traddr": "10.0.0.2", "trsvcid": "4420", "portid": 4420}
    ]
    for t in (cp.target, again.target):
        await t.stop()


async def test_nvmetcli_ana_groups_load_with_nvmets_meaning_and_write_back(tmp_path: Path) -> None:
    image = tmp_path / "ns.img"
    image.write_bytes(bytes(1 << 20))

    def port(portid: int, trsvcid: str, groups: list[dict[str, object]]) -> dict[str, object]:
        return {
            "addr": {"adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": trsvcid, "trtype": "tcp"},
            "ana_groups": groups,
            "param": {"inline_data_size": "16384"},
            "portid": portid,
            "referrals": [],
            "subsystems": [NQN],
        }

    config = {
        "hosts": [],
        "ports": [
            port(
                1,
                "14440",
                [
                    {"ana": {"state": "optimized"}, "grpid": 1},
                    {"ana": {"state": "non-optimized"}, "grpid": 2},
                ],
            ),
            # Group 2 is not configured here: nvmet reports it inaccessible on this port.
            port(2, "14441", [{"ana": {"state": "persistent-loss"}, "grpid": 1}]),
        ],
        "subsystems": [
            {
                "allowed_hosts": [],
                "attr": {"allow_any_host": "1"},
                "namespaces": [
                    {"ana": {"grpid": "2"}, "device": {"path": str(image)}, "enable": 1, "nsid": 1}
                ],
                "nqn": NQN,
            }
        ],
    }
    target = Target()
    await load_nvmetcli(target, copy.deepcopy(config))
    subsystem = target.subsystems[NQN]
    p1, p2 = target.ports
    assert subsystem.namespaces[1].anagrpid == 2
    g1, g2 = subsystem.ana.groups[1], subsystem.ana.groups[2]
    assert (g1.state_on(p1), g2.state_on(p1)) == (S.OPTIMIZED, S.NON_OPTIMIZED)
    assert (g1.state_on(p2), g2.state_on(p2)) == (S.PERSISTENT_LOSS, S.INACCESSIBLE)
    written = nvmetcli_config(target)
    assert written["subsystems"][0]["namespaces"][0]["ana_grpid"] == 2
    assert written["ports"][1]["ana_groups"] == [
        {"ana": {"state": "persistent-loss"}, "grpid": 1},
        {"ana": {"state": "inaccessible"}, "grpid": 2},
    ]
    again = Target()
    await load_nvmetcli(again, copy.deepcopy(written))
    assert nvmetcli_config(again) == written
    for t in (target, again):
        await t.stop()


@pytest.mark.parametrize(
    ("group", "named"),
    [
        ({"grpid": 2, "state": "sleepy"}, "subsystems[0].ana_groups[0]"),
        ({"state": "optimized"}, "subsystems[0].ana_groups[0].grpid"),
        ({"grpid": 300}, "subsystems[0].ana_groups[0]"),
        (
            {"grpid": 1, "listeners": [{"address": "127.0.0.1", "port": 14999, "state": "change"}]},
            "subsystems[0].ana_groups[0].listeners[0]",
        ),
        ({"grpid": 1, "listeners": [{"port": 14450}]}, "subsystems[0].ana_groups[0].listeners[0]"),
    ],
)
async def test_bad_ana_groups_in_the_config_are_refused_naming_them(
    group: dict[str, object], named: str
) -> None:
    config = {
        "subsystems": [{"nqn": NQN, "ana_groups": [group]}],
        "ports": [{"address": "127.0.0.1", "port": 14450}],
        "discovery_ports": [],
    }
    target = Target()
    with pytest.raises(ConfigError) as info:
        await apply_config(target, config)
    assert str(info.value).startswith(named), info.value
    await target.stop()
