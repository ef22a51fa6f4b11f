"""The RPC method layer: SPDK's methods and parameters, pynvmf's own, and the SPDK and
pynvmf configuration formats, against a Target that is not started (no sockets)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import apply_config, config_of, metrics_listen_of
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, RpcError
from pynvmf.rpc.methods import ControlPlane
from pynvmf.rpc.server import control_plane
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.target import Target

NQN = "nqn.2016-06.io.spdk:cnode1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-000000000001"
UUID = "5b1a7c2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"


def listen(port: int = 14420, address: str = "127.0.0.1", **extra: str) -> dict[str, str]:
    return {"trtype": "tcp", "adrfam": "ipv4", "traddr": address, "trsvcid": str(port), **extra}


@pytest.fixture
def cp() -> ControlPlane:
    return control_plane(Target())


async def build(cp: ControlPlane, tmp_path: Path) -> None:
    """What SPDK's own nvmf tests set up with rpc.py."""
    image = tmp_path / "aio.img"
    image.write_bytes(bytes(1 << 20))
    await cp.call("nvmf_create_transport", {"trtype": "TCP", "in_capsule_data_size": 8192})
    assert await cp.call("bdev_malloc_create", {"num_blocks": 2048, "block_size": 512}) == "Malloc0"
    await cp.call("bdev_aio_create", {"name": "Aio0", "filename": str(image), "block_size": 4096})
    await cp.call(
        "nvmf_create_subsystem",
        {"nqn": NQN, "serial_number": "SPDK00000000000001", "max_namespaces": 32},
    )
    assert (
        await cp.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": "Malloc0"}})
        == 1
    )
    nsid = await cp.call(
        "nvmf_subsystem_add_ns",
        {"nqn": NQN, "namespace": {"bdev_name": "Aio0", "nsid": 5, "uuid": UUID}},
    )
    assert nsid == 5
    await cp.call("nvmf_subsystem_add_host", {"nqn": NQN, "host": HOST})
    await cp.call("nvmf_subsystem_add_listener", {"nqn": NQN, "listen_address": listen()})
    await cp.call(
        "nvmf_subsystem_add_listener", {"nqn": DISCOVERY_NQN, "listen_address": listen(18009)}
    )


async def test_an_spdk_style_setup_reads_back_as_spdk_shows_it(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await build(cp, tmp_path)
    discovery, sub = await cp.call("nvmf_get_subsystems", {})
    assert discovery["nqn"] == DISCOVERY_NQN and discovery["subtype"] == "Discovery"
    assert sub["subtype"] == "NVMe" and sub["nqn"] == NQN
    assert not sub["allow_any_host"]  # SPDK's default
    assert sub["hosts"] == [{"nqn": HOST}]
    assert sub["listen_addresses"] == [
        {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "14420"}
    ]
    assert sub["serial_number"] == "SPDK00000000000001" and sub["max_namespaces"] == 32
    ns1, ns5 = sub["namespaces"]
    assert ns1["nsid"] == 1 and ns1["bdev_name"] == "Malloc0"
    # SPDK: a namespace without identities takes its bdev's UUID, as UUID and as NGUID.
    (malloc,) = await cp.call("bdev_get_bdevs", {"name": "Malloc0"})
    assert ns1["uuid"] == malloc["uuid"] == malloc["aliases"][0]
    assert ns1["nguid"] == malloc["uuid"].replace("-", "").upper()
    assert ns5["uuid"] == UUID and malloc["claimed"]
    (transport,) = await cp.call("nvmf_get_transports", {})
    assert transport["trtype"] == "TCP" and transport["in_capsule_data_size"] == 8192
    assert cp.target.ports[-1].transport.inline_data_size == 8192
    listeners = await cp.call("nvmf_subsystem_get_listeners", {"nqn": NQN})
    assert listeners == [
        {
            "address": sub["listen_addresses"][0],
            "ana_states": [{"ana_group": 1, "ana_state": "optimized"}],
        }
    ]


async def test_save_config_loads_back_into_the_same_target(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await build(cp, tmp_path)
    saved = spdk_config(cp.target)
    methods = [c["method"] for s in saved["subsystems"] for c in s["config"]]
    assert methods[:2] == ["bdev_malloc_create", "bdev_aio_create"]
    assert methods.index("nvmf_create_transport") < methods.index("nvmf_create_subsystem")
    again = control_plane(Target())
    await load_spdk_config(again, copy.deepcopy(saved))
    assert spdk_config(again.target) == saved
    for t in (cp.target, again.target):
        await t.stop()


async def test_pynvmf_format_loads_back_into_the_same_target(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await build(cp, tmp_path)
    written = config_of(cp.target)
    again = Target()
    await apply_config(again, copy.deepcopy(written))
    assert config_of(again) == written
    assert await cp.call("pynvmf_get_config", {}) == written
    for t in (cp.target, again):
        await t.stop()


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
async def test_the_saved_configuration_names_where_the_metrics_endpoint_listens(
    tmp_path: Path, address: str
) -> None:
    target = Target()
    metrics = MetricsEndpoint(target)
    cp = control_plane(target, metrics=metrics)
    assert "metrics" not in await cp.call("pynvmf_get_config", {})  # not listening
    _, port = await metrics.listen(address, 0)
    try:
        path = tmp_path / "saved.json"
        assert await cp.call("pynvmf_save_config", {"path": str(path)}) is True
        saved = json.loads(path.read_text())
        where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        assert saved["metrics"] == {"listen": where}
        assert metrics_listen_of(saved) == (address, port)
        # SPDK's and nvmetcli's formats have no place for it.
        assert "metrics" not in json.dumps(await cp.call("pynvmf_get_config", {"format": "spdk"}))
    finally:
        await metrics.close()
        await target.stop()
    assert "metrics" not in await cp.call("pynvmf_get_config", {})


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("nvmf_create_subsystem", {}, "nqn: missing"),
        ("nvmf_create_subsystem", {"nqn": 5}, "nqn: 5 is not a string"),
        ("nvmf_create_subsystem", {"nqn": "bad nqn"}, "nqn: 'bad nqn' is not a valid NQN"),
        ("nvmf_create_subsystem", {"nqn": NQN, "bogus": 1}, "bogus: unknown parameter"),
        ("nvmf_create_subsystem", {"nqn": NQN, "ana_reporting": 1}, "ana_reporting: 1 is not a"),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN, "listen_address": listen(), "ana_state": "optimized", "anagrpid": 7},
            "anagrpid: nqn.2016-06.io.spdk:cnode1 has no ANA group 7 (groups: 1)",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN, "listen_address": listen(), "ana_state": "optimized", "anagrpid": 999},
            "anagrpid: 999 is not an ANA group ID (1..128)",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN, "listen_address": listen(), "ana_state": "sleepy"},
            "ana_state: 'sleepy' is not an ANA state (optimized, non_optimized, inaccessible,",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN, "listen_address": listen(14999), "ana_state": "inaccessible"},
            "listen_address.traddr: nqn.2016-06.io.spdk:cnode1 does not listen on 127.0.0.1 14999",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN + "x", "listen_address": listen(), "ana_state": "inaccessible"},
            "nqn: no subsystem 'nqn.2016-06.io.spdk:cnode1x'",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            {"nqn": NQN, "listen_address": listen()},
            "ana_state: missing",
        ),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "anagrpid": 129}},
            "namespace.anagrpid: 129 is not an ANA group ID (1..128)",
        ),
        (
            "pynvmf_subsystem_add_peer_listener",
            {"nqn": NQN, "traddr": "gw2.example", "trsvcid": "4420"},
            "traddr: 'gw2.example' is not an IP address",
        ),
        ("nvmf_create_subsystem", {"nqn": NQN, "tgt_name": "x"}, "tgt_name: 'x'"),
        ("nvmf_create_subsystem", {"nqn": NQN + "x", "serial_number": "S" * 21}, "serial_number: "),
        (
            "nvmf_create_subsystem",
            {"nqn": NQN + "x", "min_cntlid": 9, "max_cntlid": 3},
            "min_cntlid: ",
        ),
        ("nvmf_subsystem_add_ns", {"nqn": NQN}, "namespace: missing"),
        ("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {}}, "namespace.bdev_name: missing"),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": "Malloc9"}},
            "namespace.bdev_name: no block device named 'Malloc9'",
        ),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": "1"}},
            "namespace.nsid: '1' is not an integer",
        ),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nguid": "12"}},
            "namespace.nguid: '12' is not 16 bytes in hex",
        ),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "ptpl_file": 5}},
            "namespace.ptpl_file: 5 is not a string",
        ),
        (
            "nvmf_subsystem_add_ns",
            {"nqn": "nqn.2016-06.io.spdk:none", "namespace": {"bdev_name": "Malloc0"}},
            "nqn: no subsystem",
        ),
        (
            "nvmf_subsystem_add_listener",
            {"nqn": NQN, "listen_address": listen(trtype="fc")},
            "listen_address.trtype: 'fc': pynvmf serves TCP and RDMA only",
        ),
        (
            # SPDK's rule: the transport first.
            "nvmf_subsystem_add_listener",
            {"nqn": NQN, "listen_address": listen(trtype="RDMA")},
            "listen_address.trtype: no RDMA transport (nvmf_create_transport -t RDMA first)",
        ),
        (
            "nvmf_subsystem_add_listener",
            {"nqn": NQN, "listen_address": listen(adrfam="ipv6")},
            "listen_address.adrfam: ipv6 does not match 127.0.0.1",
        ),
        (
            "nvmf_subsystem_add_listener",
            {"nqn": NQN, "listen_address": listen(address="host.example")},
            "listen_address.traddr: 'host.example' is not an IP address",
        ),
        (
            "nvmf_subsystem_add_listener",
            {"nqn": NQN, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1"}},
            "listen_address.trsvcid: missing",
        ),
        (
            "nvmf_subsystem_add_host",
            {
                "nqn": NQN,
                "host": "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001",
                "psk": "key9",
            },
            "psk: no key named 'key9' in the keyring",
        ),
        ("nvmf_subsystem_add_host", {"nqn": NQN, "host": "h h"}, "host: 'h h' is not a valid NQN"),
        (
            "nvmf_subsystem_add_host",
            {"nqn": NQN, "host": HOST, "dhchap_key": "key0"},
            "dhchap_key: no key named 'key0' in the keyring",
        ),
        (
            "nvmf_subsystem_remove_ns",
            {"nqn": NQN, "nsid": 9},
            "nsid: nqn.2016-06.io.spdk:cnode1 has no namespace 9",
        ),
        ("bdev_malloc_create", {"num_blocks": 8, "block_size": 512, "md_size": 8}, "md_size: 8: "),
        ("bdev_malloc_create", {"num_blocks": 8, "block_size": 513}, "block_size: "),
        (
            "bdev_malloc_create",
            {"name": "Malloc0", "num_blocks": 8, "block_size": 512},
            "name: a bdev named 'Malloc0' exists",
        ),
        (
            "bdev_aio_create",
            {"name": "A", "filename": "/nonexistent/x"},
            "filename: /nonexistent/x: ",
        ),
        ("bdev_malloc_delete", {"name": "Aio0"}, "name: no malloc bdev named 'Aio0'"),
        (
            "nvmf_create_transport",
            {"trtype": "FC"},
            "trtype: 'FC': pynvmf serves TCP and RDMA only",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "RDMA", "max_queue_depth": 256},
            "max_queue_depth: 256: pynvmf's RDMA transport has 128",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "RDMA", "dif_insert_or_strip": True},
            "dif_insert_or_strip: True: pynvmf inserts and strips no protection information",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "rdma", "in_capsule_data_size": 100},
            "in_capsule_data_size: 100 is not a multiple of 16",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "TCP", "in_capsule_data_size": 100},
            "in_capsule_data_size: ",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "TCP", "max_queue_deep": 4},
            "max_queue_deep: unknown parameter",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "TCP", "max_queue_depth": "128"},
            "max_queue_depth: '128' is not an integer",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "TCP", "zcopy": 1},
            "zcopy: 1 is not a boolean",
        ),
        (
            "nvmf_create_transport",
            {"trtype": "TCP", "io_unit_size": -1},
            "io_unit_size: -1 not in 0..",
        ),
        (
            "framework_get_config",
            {"name": "iscsi"},
            "name: pynvmf has no configuration subsystem 'iscsi'",
        ),
        ("pynvmf_get_config", {"format": "yaml"}, "format: 'yaml' is not one of"),
    ],
)
async def test_bad_parameters_are_refused_naming_them_and_nothing_changes(
    cp: ControlPlane, tmp_path: Path, method: str, params: dict[str, Any], message: str
) -> None:
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    await cp.call("bdev_malloc_create", {"num_blocks": 2048, "block_size": 512})
    image = tmp_path / "aio.img"
    image.write_bytes(bytes(1 << 20))
    await cp.call("bdev_aio_create", {"name": "Aio0", "filename": str(image)})
    before = spdk_config(cp.target)
    with pytest.raises(RpcError) as info:
        await cp.call(method, params)
    assert info.value.code == INVALID_PARAMS
    assert info.value.message.startswith(message), info.value.message
    assert spdk_config(cp.target) == before
    await cp.target.stop()


async def test_an_unknown_method_is_method_not_found(cp: ControlPlane) -> None:
    with pytest.raises(RpcError) as info:
        await cp.call("bdev_nvme_attach_controller", {})
    assert info.value.code == METHOD_NOT_FOUND


async def test_the_transport_is_created_once(cp: ControlPlane) -> None:
    await cp.call(
        "nvmf_create_transport", {"trtype": "tcp", "max_queue_depth": 128, "zcopy": False}
    )
    with pytest.raises(RpcError, match="already exists"):
        await cp.call("nvmf_create_transport", {"trtype": "TCP"})


async def test_transport_options_pynvmf_does_not_apply_are_named_in_a_warning(
    cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    # SPDK's save_config carries max_queue_depth 128: pynvmf's queues stay 1024 deep, and
    # the operator is told so rather than left to believe otherwise.
    await cp.call(
        "nvmf_create_transport",
        {"trtype": "tcp", "max_queue_depth": 128, "max_io_qpairs_per_ctrlr": 64, "zcopy": False},
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["nvmf_create_transport: not applied: max_queue_depth 128 (pynvmf: 1024)"]


async def test_deleting_a_bdev_removes_the_namespace_on_it(cp: ControlPlane) -> None:
    await cp.call("nvmf_create_subsystem", {"nqn": NQN, "allow_any_host": True})
    name = await cp.call("bdev_malloc_create", {"num_blocks": 64, "block_size": 4096})
    await cp.call("nvmf_subsystem_add_ns", {"nqn": NQN, "namespace": {"bdev_name": name}})
    assert await cp.call("bdev_malloc_delete", {"name": name}) is True
    (_, sub) = await cp.call("nvmf_get_subsystems", {})
    assert sub["namespaces"] == [] and await cp.call("bdev_get_bdevs", {}) == []


async def test_rpc_get_methods_lists_spdks_and_pynvmfs(cp: ControlPlane) -> None:
    methods = await cp.call("rpc_get_methods", {"current": True})
    for name in (
        "spdk_get_version",
        "bdev_malloc_create",
        "nvmf_subsystem_add_ns",
        "framework_get_config",
        "pynvmf_save_config",
    ):
        assert name in methods
    version = await cp.call("spdk_get_version", {})
    assert version["version"].startswith("pynvmf v")


async def test_save_config_writes_the_file_atomically_with_mode_0600(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await build(cp, tmp_path)
    path = tmp_path / "saved.json"
    path.write_text("old")
    assert await cp.call("pynvmf_save_config", {"path": str(path), "format": "spdk"}) is True
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == spdk_config(cp.target)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".saved")] == []
    with pytest.raises(RpcError, match="path: "):
        await cp.call("pynvmf_save_config", {"path": str(tmp_path / "no" / "dir.json")})
    await cp.target.stop()


async def test_add_ns_takes_spdks_ptpl_file(cp: ControlPlane, tmp_path: Path) -> None:
    await cp.call("nvmf_create_subsystem", {"nqn": NQN, "allow_any_host": True})
    name = await cp.call("bdev_malloc_create", {"num_blocks": 64, "block_size": 512})
    ptpl = tmp_path / "Malloc0.ptpl.json"
    nsid = await cp.call(
        "nvmf_subsystem_add_ns",
        {"nqn": NQN, "namespace": {"bdev_name": name, "ptpl_file": str(ptpl)}},
    )
    ns = cp.target.subsystems[NQN].namespaces[nsid]
    assert ns.reservation.ptpl_file == ptpl and ns.reservation.rescap & 1
    # A file that does not hold a reservation state is refused, naming the parameter.
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{}")
    other = await cp.call("bdev_malloc_create", {"num_blocks": 64, "block_size": 512})
    with pytest.raises(RpcError, match=r"namespace\.ptpl_file: .*damaged\.json"):
        await cp.call(
            "nvmf_subsystem_add_ns",
            {"nqn": NQN, "namespace": {"bdev_name": other, "ptpl_file": str(damaged)}},
        )
    assert sorted(cp.target.subsystems[NQN].namespaces) == [nsid]


async def test_the_rdma_transport_nvmf_get_transports_lists_is_taken_back() -> None:
    # What nvmf_get_transports (and save_config) says of the RDMA transport creates it again.
    first = control_plane(Target())
    await first.call("nvmf_create_transport", {"trtype": "RDMA", "in_capsule_data_size": 4096})
    (entry,) = await first.call("nvmf_get_transports", {"trtype": "RDMA"})
    again = control_plane(Target())
    await again.call("nvmf_create_transport", entry)
    assert await again.call("nvmf_get_transports", {"trtype": "RDMA"}) == [entry]
    assert entry["in_capsule_data_size"] == 4096 and entry["max_queue_depth"] == 128
