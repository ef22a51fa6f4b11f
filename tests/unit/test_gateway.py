"""The gateway's configuration section and the one place that decides ANA states from
leases (pynvmf.ha.gateway), on a target not started and with no cluster: the lease
manager's callbacks are made by hand. tests/ceph/test_gateway.py runs it on leases."""

from __future__ import annotations

from typing import Any

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.config.native import ConfigError, apply_config
from pynvmf.ha.gateway import Gateway, GatewayConfig
from pynvmf.spec.logpages import AnaState as S
from pynvmf.target.devices import NamedDevice
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:gw"


def _gateway(**extra: Any) -> dict[str, Any]:
    return {"id": "gw-a", "groups": [1, 2], **extra}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"groups": [1]}, "gateway.id: a gateway needs an id"),
        ({"id": "a"}, "gateway.groups: a gateway needs the ANA groups"),
        (_gateway(groups=[0]), "gateway.groups: [0] are not ANA group IDs"),
        (_gateway(groups=["1"]), "gateway.groups: not a list of ANA group IDs"),
        (_gateway(preferred=[3]), "gateway.preferred: [3] are not all in groups"),
        (_gateway(index=32), "gateway.index: 32 is not a gateway index"),
        (_gateway(lease=0), "gateway.lease: lease_seconds must be at least 1"),
        (_gateway(pool=""), "gateway.pool: an empty pool name"),
        (_gateway(leases=3), "leases"),
        (_gateway(shared_config={}), "gateway.shared_config: name a gateway group"),
        (
            _gateway(shared_config={"group": "g", "object": "o"}),
            "gateway.shared_config: name a gateway group",
        ),
        (_gateway(shared_config={"group": ""}), "gateway.shared_config: an empty name"),
        (_gateway(shared_config={"group": "g", "poll": 1}), "gateway.shared_config.poll"),
        (
            _gateway(shared_config={"group": "g", "poll_interval": 0}),
            "gateway.shared_config.poll_interval: 0 is not",
        ),
    ],
)
def test_bad_gateway_sections_name_the_key(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        GatewayConfig.parse(spec)
    assert message in str(info.value)


def test_the_section_with_its_defaults() -> None:
    cfg = GatewayConfig.parse(_gateway(index=2, preferred=[2], ceph_conf="/c.conf", lease=3))
    assert (cfg.gateway_id, cfg.groups, cfg.preferred, cfg.pool) == ("gw-a", [1, 2], [2], "rbd")
    assert cfg.cntlid_range == (4081, 6120)
    assert cfg.cluster.conf == "/c.conf" and cfg.lease.lease_seconds == 3
    assert cfg.lease.failback
    assert GatewayConfig.parse(_gateway()).cntlid_range is None
    assert cfg.shared is None  # each gateway serves its own file's subsystems
    shared = GatewayConfig.parse(_gateway(shared_config={"group": "prod"})).shared
    assert shared is not None and shared.object_name == "pynvmf.gateway-group.prod"
    assert shared.poll_interval == 10.0
    named = GatewayConfig.parse(_gateway(shared_config={"object": "x", "poll_interval": 2}))
    assert named.shared is not None and named.shared.object_name == "x"


async def test_a_namespace_added_while_running_gets_its_groups_state() -> None:
    """The gateway learns subsystems and namespaces added after setup() (through the RPC
    or the group's shared configuration) from the Target's change listener."""
    target = await _target()
    gw = Gateway(target, GatewayConfig.parse(_gateway(index=1)))
    gw.setup()
    gw._lease_changed(1, True)
    target.add_subsystem("nqn.2024-11.dev.pynvmf:later")
    later = target.subsystems["nqn.2024-11.dev.pynvmf:later"]
    assert (later.cntlid_min, later.cntlid_max) == (2041, 4080)
    entry = NamedDevice.wrap("m", MemoryDevice(1 << 20, 512), owned=True)
    target.add_namespace(later.nqn, entry, anagrpid=2)  # made optimized by add_namespace
    assert later.ana.groups[2].state is S.INACCESSIBLE  # group 2 is not owned here
    assert later.nqn in gw._members[2]
    entry = NamedDevice.wrap("n", MemoryDevice(1 << 20, 512), owned=True)
    target.add_namespace(later.nqn, entry, nsid=2, anagrpid=1)
    assert later.ana.groups[1].state is S.OPTIMIZED
    await target.remove_subsystem(later.nqn)
    assert all(later.nqn not in m for m in gw._members.values())
    await gw.stop()
    await target.stop()


async def _target() -> Target:
    target = Target()
    await apply_config(
        target,
        {
            "ports": [{"address": "127.0.0.1", "port": 14430}],
            "discovery_ports": [],
            "subsystems": [
                {
                    "nqn": NQN,
                    "namespaces": [
                        {"memory": "1M", "anagrpid": 1},
                        {"memory": "1M", "anagrpid": 2},
                        {"memory": "1M", "anagrpid": 3},
                    ],
                }
            ],
        },
    )
    return target


def _states(target: Target) -> dict[int, S]:
    return {g: group.state for g, group in target.subsystems[NQN].ana.groups.items()}


async def test_groups_are_optimized_only_while_owned() -> None:
    target = await _target()
    said: list[tuple[int, S]] = []
    gw = Gateway(
        target, GatewayConfig.parse(_gateway(index=1)), announce=lambda g, s: said.append((g, s))
    )
    gw.setup()
    subsystem = target.subsystems[NQN]
    assert (subsystem.cntlid_min, subsystem.cntlid_max) == (2041, 4080)
    # Before any lease: the gateway's groups inaccessible; group 3 is not the gateway's.
    assert _states(target) == {1: S.INACCESSIBLE, 2: S.INACCESSIBLE, 3: S.OPTIMIZED}
    gw._lease_changed(2, True)
    assert _states(target) == {1: S.INACCESSIBLE, 2: S.OPTIMIZED, 3: S.OPTIMIZED}
    gw._lease_changed(2, True)  # a repeat changes nothing and says nothing
    gw._lease_changed(2, False)
    assert _states(target)[2] is S.INACCESSIBLE
    assert said == [(1, S.INACCESSIBLE), (2, S.INACCESSIBLE), (2, S.OPTIMIZED), (2, S.INACCESSIBLE)]
    await target.stop()


async def test_a_gateway_needs_its_groups_in_some_subsystem() -> None:
    target = await _target()
    with pytest.raises(ConfigError, match=r"no subsystem has ANA groups \[9\]"):
        Gateway(target, GatewayConfig.parse({"id": "a", "groups": [1, 9]})).setup()
    await target.stop()
