"""An NVMe/RDMA port on a target not started: `--listen rdma:ADDR:PORT`, the configuration's
"trtype", the checks a port passes, and the discovery log's entries for an rdma port
(TRTYPE rdma, the RDMA TSAS as nvmet fills it)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from pynvmf.config.native import (
    ConfigError,
    apply_config,
    config_from_options,
    config_of,
    parse_transport_listen,
)
from pynvmf.spec import logpages as L
from pynvmf.target.changes import ChangeError
from pynvmf.target.discovery import discovery_log
from pynvmf.target.port import Port, check_port
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:rdma-port"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rdma:10.0.2.15:4420", ("rdma", "10.0.2.15", 4420)),
        ("rdma:[::1]:4421", ("rdma", "::1", 4421)),
        ("tcp:127.0.0.1:4420", ("tcp", "127.0.0.1", 4420)),
        ("127.0.0.1:4420", ("tcp", "127.0.0.1", 4420)),
        ("[::1]:4420", ("tcp", "::1", 4420)),
        ("rdma:10.0.2.15", ("rdma", "10.0.2.15", 4420)),
    ],
)
def test_listen_names_the_transport_or_means_tcp(text: str, expected: tuple[str, str, int]) -> None:
    assert parse_transport_listen(text) == expected


@pytest.mark.parametrize("text", ["rdma:nowhere:4420", "ib:10.0.2.15:4420", "rdma:10.0.2.15:99999"])
def test_a_bad_listen_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_transport_listen(text)


def test_options_make_an_rdma_port_without_a_tcp_discovery_port() -> None:
    config = config_from_options(
        listen=["rdma:10.0.2.15:4420"],
        memory=["64M"],
        files=[],
        nqn=NQN,
        allow_hosts=[],
        block_size=512,
        inline_data_size=16384,
        discovery_port=8009,
    )
    assert config["ports"] == [
        {"address": "10.0.2.15", "port": 4420, "trtype": "rdma", "inline_data_size": 16384}
    ]
    assert config["discovery_ports"] == []


def test_an_rdma_port_takes_no_tls_and_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ChangeError) as caught:
        check_port(Port("10.0.2.15", 4420, trtype="rdma", secure_channel="required"), [])  # type: ignore[arg-type]
    assert caught.value.field == "secure_channel"
    with pytest.raises(ChangeError) as caught:
        check_port(Port("10.0.2.15", 4420, trtype="fc"), [])
    assert caught.value.field == "trtype"


def test_tcp_and_rdma_may_share_an_address_and_port() -> None:
    tcp = Port("10.0.2.15", 4420)
    check_port(Port("10.0.2.15", 4420, trtype="rdma"), [tcp])
    with pytest.raises(ChangeError):
        check_port(Port("10.0.2.15", 4420), [tcp])


async def test_the_discovery_log_says_rdma_for_an_rdma_port_and_the_config_keeps_it() -> None:
    config: dict[str, Any] = {
        "ports": [
            {"address": "10.0.2.15", "port": 4420, "trtype": "rdma"},
            {"address": "10.0.2.15", "port": 4421},
        ],
        "discovery_ports": [],
        "subsystems": [{"nqn": NQN, "namespaces": [{"nsid": 1, "memory": "1M"}]}],
    }
    target = Target()
    await apply_config(target, copy.deepcopy(config))
    queue: Any = SimpleNamespace(port=target.ports[0], local_address="10.0.2.15")
    page = L.DiscoveryLogPage.unpack(discovery_log(target, "nqn.host", queue))
    rdma, tcp, current = page.entries
    assert (rdma.trtype, rdma.trsvcid, rdma.subnqn) == (L.TrType.RDMA, "4420", NQN)
    # QPTYPE reliable connected, PRTYPE not specified, CMS RDMA CM; the rest zero.
    assert rdma.tsas == bytes([1, 1, 1]).ljust(256, b"\x00")
    assert (tcp.trtype, tcp.tsas[0]) == (L.TrType.TCP, L.TcpSecType.NONE)
    assert current.trtype == L.TrType.RDMA  # the discovery controller answering, on rdma
    written = config_of(target)
    assert [p.get("trtype", "tcp") for p in written["ports"]] == ["rdma", "tcp"]
