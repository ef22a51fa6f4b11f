"""Discovery referrals on a target not started: what may be referred to, the discovery
log's entries for them, and the referrals through pynvmf's and SPDK's configurations.
Also the SPDK methods Ceph's gateway calls beside them (log_*, set_ns_ana_group)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pynvmf.config.native import ConfigError, apply_config, config_of
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.spec import logpages as L
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.discovery import discovery_log
from pynvmf.target.port import Port
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:referrals"
ELSEWHERE = {"trtype": "TCP", "adrfam": "IPv4", "traddr": "192.0.2.7", "trsvcid": "4420"}


def _log_of(target: Target) -> L.DiscoveryLogPage:
    queue: Any = SimpleNamespace(port=target.ports[0], local_address="127.0.0.1")
    return L.DiscoveryLogPage.unpack(discovery_log(target, "nqn.host", queue))


async def test_referrals_round_trip_through_pynvmfs_config_and_are_in_the_log() -> None:
    config = {
        "ports": [],
        "discovery_ports": [{"address": "127.0.0.1", "port": 18009}],
        "referrals": [
            {"address": "192.0.2.7", "port": 8009},
            {"address": "2001:db8::7", "port": 4420, "subnqn": NQN, "secure_channel": True},
        ],
    }
    target = Target()
    await apply_config(target, copy.deepcopy(config))
    page = _log_of(target)
    referral, nvme, current = page.entries
    assert (referral.subtype, referral.traddr, referral.trsvcid, referral.subnqn) == (
        L.SubType.DISCOVERY,
        "192.0.2.7",
        "8009",
        DISCOVERY_NQN,
    )
    assert referral.adrfam == L.AdrFam.IPV4 and referral.cntlid == 0xFFFF
    assert referral.treq & L.Treq.SECURE_CHANNEL_MASK == L.Treq.NOT_SPECIFIED
    assert (nvme.subtype, nvme.adrfam, nvme.subnqn) == (L.SubType.NVME, L.AdrFam.IPV6, NQN)
    assert nvme.treq & L.Treq.SECURE_CHANNEL_MASK == L.Treq.REQUIRED
    assert current.subtype == L.SubType.CURRENT_DISCOVERY
    written = config_of(target)
    assert written["referrals"][0] == {
        "address": "192.0.2.7",
        "port": 8009,
        "subnqn": DISCOVERY_NQN,
        "secure_channel": False,
    }
    again = Target()
    await apply_config(again, copy.deepcopy(written))
    assert config_of(again) == written
    for t in (target, again):
        await t.stop()


@pytest.mark.parametrize(
    ("referral", "error"),
    [
        ({"address": "127.0.0.1", "port": 18009}, "referrals[0].address: "),
        ({"address": "127.0.0.1", "port": 18010}, "referrals[0].address: "),  # wildcard's
        ({"address": "0.0.0.0", "port": 8009}, "referrals[0].address: "),
        ({"address": "192.0.2.7", "port": 70000}, "referrals[0].port: "),
        ({"address": "192.0.2.7", "subnqn": "no spaces"}, "referrals[0].subnqn: "),
        ({"address": "192.0.2.7", "colour": "red"}, "referrals[0].colour: unknown key"),
    ],
)
async def test_a_referral_a_host_could_not_follow_is_refused(
    referral: dict[str, Any], error: str
) -> None:
    config = {
        "ports": [],
        "discovery_ports": [
            {"address": "127.0.0.1", "port": 18009},
            {"address": "0.0.0.0", "port": 18010},
        ],
        "referrals": [referral],
    }
    target = Target()
    with pytest.raises(ConfigError) as caught:
        await apply_config(target, config)
    assert str(caught.value).startswith(error)
    assert target.referrals == []
    await target.stop()


async def test_spdk_referral_methods_and_save_config() -> None:
    cp = control_plane(Target())
    await cp.target.add_port(Port("127.0.0.1", 18011, discovery_only=True))
    genctr = cp.target.genctr
    assert await cp.call("nvmf_discovery_add_referral", {"address": ELSEWHERE}) is True
    assert await cp.call("nvmf_discovery_add_referral", {"address": ELSEWHERE}) is True
    assert cp.target.genctr == genctr + 1  # the same referral again changes nothing
    own = {**ELSEWHERE, "traddr": "127.0.0.1", "trsvcid": "18011"}
    with pytest.raises(RpcError, match=r"^address.traddr: .*own listener"):
        await cp.call("nvmf_discovery_add_referral", {"address": own})
    with pytest.raises(RpcError, match=r"^address.adrfam: "):
        await cp.call("nvmf_discovery_add_referral", {"address": {**ELSEWHERE, "adrfam": "IPv6"}})
    with pytest.raises(RpcError, match=r"^subnqn: "):
        await cp.call("nvmf_discovery_add_referral", {"address": ELSEWHERE, "subnqn": "a b"})
    with pytest.raises(RpcError, match=r"^Unable to remove a referral\.$"):
        await cp.call("nvmf_discovery_remove_referral", {"address": {**ELSEWHERE, "trsvcid": "1"}})
    assert cp.target.genctr == genctr + 1 and len(cp.target.referrals) == 1
    saved = spdk_config(cp.target)
    (call,) = [c for c in saved["subsystems"][2]["config"] if "referral" in c["method"]]
    assert call == {
        "method": "nvmf_discovery_add_referral",
        "params": {"address": ELSEWHERE, "secure_channel": False, "subnqn": DISCOVERY_NQN},
    }
    again = control_plane(Target())
    await load_spdk_config(again, copy.deepcopy(saved))
    assert spdk_config(again.target) == saved
    assert await cp.call("nvmf_discovery_remove_referral", {"address": ELSEWHERE}) is True
    assert await cp.call("nvmf_discovery_get_referrals", {}) == []
    for t in (cp.target, again.target):
        await t.stop()


async def test_log_methods_map_spdks_levels_and_flags_onto_python_logging() -> None:
    cp = control_plane(Target())
    pynvmf_log, tcp_log = logging.getLogger("pynvmf"), logging.getLogger("pynvmf.tcp")
    saved = pynvmf_log.level, tcp_log.level
    try:
        await cp.call("log_set_level", {"level": "notice"})
        assert await cp.call("log_get_level", {}) == "NOTICE"
        assert logging.INFO < pynvmf_log.level < logging.WARNING
        await cp.call("log_set_level", {"level": "ERROR"})
        assert await cp.call("log_get_level", {}) == "ERROR"
        await cp.call("log_set_flag", {"flag": "nvmf_tcp"})
        assert tcp_log.isEnabledFor(logging.DEBUG)
        assert (await cp.call("log_get_flags", {}))["nvmf_tcp"] is True
        await cp.call("log_clear_flag", {"flag": "nvmf_tcp"})
        assert not tcp_log.isEnabledFor(logging.WARNING)  # it follows the level again
        with pytest.raises(RpcError, match="invalid log flag") as caught:
            await cp.call("log_set_flag", {"flag": "nvme_pcie"})
        assert caught.value.code == -32602
        with pytest.raises(RpcError, match="invalid log level"):
            await cp.call("log_set_print_level", {"level": "LOUD"})
    finally:
        pynvmf_log.setLevel(saved[0])
        tcp_log.setLevel(saved[1])
    await cp.target.stop()


async def test_set_ns_ana_group_moves_a_namespace_and_save_config_keeps_it() -> None:
    cp = control_plane(Target())
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    await cp.call("bdev_malloc_create", {"name": "M0", "num_blocks": 64, "block_size": 512})
    await cp.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "M0"}})
    chgcnt = cp.target.subsystems[NQN].ana.chgcnt
    await cp.call("nvmf_subsystem_set_ns_ana_group", {"nqn": NQN, "nsid": 1, "anagrpid": 4})
    subsystem = cp.target.subsystems[NQN]
    assert subsystem.namespaces[1].anagrpid == 4 and subsystem.ana.chgcnt > chgcnt
    assert subsystem.ana_members() == {4: [1]}
    with pytest.raises(RpcError, match=r"^nsid: "):
        await cp.call("nvmf_subsystem_set_ns_ana_group", {"nqn": NQN, "nsid": 2, "anagrpid": 4})
    with pytest.raises(RpcError, match=r"^anagrpid: "):
        await cp.call("nvmf_subsystem_set_ns_ana_group", {"nqn": NQN, "nsid": 1, "anagrpid": 0})
    saved = spdk_config(cp.target)
    (add_ns,) = [
        c for c in saved["subsystems"][2]["config"] if c["method"] == "nvmf_subsystem_add_ns"
    ]
    assert add_ns["params"]["namespace"]["anagrpid"] == 4
    await cp.target.stop()


async def test_save_config_keeps_a_namespaces_ptpl_file(tmp_path: Path) -> None:
    cp = control_plane(Target())
    ptpl = str(tmp_path / "m0.ptpl.json")
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    await cp.call("bdev_malloc_create", {"name": "M0", "num_blocks": 64, "block_size": 512})
    await cp.call(
        "nvmf_subsystem_add_ns",
        {"nqn": NQN, "namespace": {"bdev_name": "M0", "ptpl_file": ptpl}},
    )
    saved = spdk_config(cp.target)
    (add_ns,) = [
        c for c in saved["subsystems"][2]["config"] if c["method"] == "nvmf_subsystem_add_ns"
    ]
    assert add_ns["params"]["namespace"]["ptpl_file"] == ptpl
    again = control_plane(Target())
    await load_spdk_config(again, copy.deepcopy(saved))
    assert again.target.subsystems[NQN].namespaces[1].reservation.ptpl_capable
    assert spdk_config(again.target) == saved
    for t in (cp.target, again.target):
        await t.stop()
