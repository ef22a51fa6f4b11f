"""Discovery referrals with the Linux kernel's NVMe/TCP host (under QEMU) and nvme-cli:
one pynvmf target's discovery log refers to a second pynvmf target's discovery
subsystem; `nvme discover` lists the referral and `nvme connect-all` follows it to the
second target's subsystem (nvme-cli follows referrals when it connects).

Two target processes (from configuration files; the referral added over RPC, as
SPDK's users add it) and one guest serve the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pynvmf.rpc.client import RpcClient
from tests.support.guest import OLDEST_AND_NEWEST, Guest, Peer, require_guest_prerequisites
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

# Following referrals is nvme-cli's (libnvme's): the oldest (2.3) and newest (2.16).
pytestmark = OLDEST_AND_NEWEST.mark()

REFERRED_NQN = "nqn.2024-11.dev.pynvmf:referred"


@dataclass
class Served:
    process: TargetProcess
    socket: str
    disc_port: int

    def rpc(self) -> RpcClient:
        return RpcClient(self.socket)


def _address(address: str, port: int) -> dict[str, str]:
    return {"trtype": "tcp", "adrfam": "ipv4", "traddr": address, "trsvcid": str(port)}


def _serve(workdir: Path, config: dict[str, Any], disc_port: int) -> Served:
    workdir.mkdir()
    socket_path = str(workdir / "rpc.sock")
    path = workdir / "target.json"
    path.write_text(json.dumps(config))
    proc = TargetProcess(None, workdir, ["--config", str(path), "--rpc-socket", socket_path])
    proc.start()
    return Served(proc, socket_path, disc_port)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Served]]:
    """The first target, for the test to refer hosts to the second, which serves
    REFERRED_NQN."""
    workdir = tmp_path_factory.mktemp("referrals")
    first_disc, second_disc = free_tcp_port(), free_tcp_port()
    first = _serve(
        workdir / "first",
        {"ports": [], "discovery_ports": [{"address": "127.0.0.1", "port": first_disc}]},
        first_disc,
    )
    try:
        # The guest reaches the machine's 127.0.0.1 as Guest.host_address: the second
        # target's log must give the host that address for its subsystem.
        second = _serve(
            workdir / "second",
            {
                "subsystems": [
                    {"nqn": REFERRED_NQN, "allow_any_host": True, "namespaces": [{"memory": "1M"}]}
                ],
                "ports": [
                    {
                        "address": "127.0.0.1",
                        "port": free_tcp_port(),
                        "advertise": Guest.host_address,
                    }
                ],
                "discovery_ports": [{"address": "127.0.0.1", "port": second_disc}],
            },
            second_disc,
        )
    except BaseException:
        first.process.stop()
        raise
    try:
        yield first, second
    finally:
        first.process.stop()
        second.process.stop()


@pytest.fixture(scope="module")
def guest(targets: tuple[Served, Served], linux_peer: Peer) -> Iterator[Guest]:
    require_guest_prerequisites(linux_peer)
    g = Guest(peer=linux_peer)
    g.start()
    yield g
    g.stop()


def test_nvme_cli_lists_the_referral_and_connect_all_follows_it(
    guest: Guest, targets: tuple[Served, Served]
) -> None:
    first, second = targets
    # Referred to over RPC, as SPDK's users do (removed at the end: the targets serve
    # every peer's run).
    with first.rpc() as rpc:
        rpc.call(
            "nvmf_discovery_add_referral", address=_address(Guest.host_address, second.disc_port)
        )
    out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {first.disc_port}").output
    assert REFERRED_NQN not in out  # the first target does not serve it
    assert (
        f"trsvcid: {second.disc_port}" in out and "subtype: discovery subsystem referral" in out
    ), out
    # nvme-cli follows the referral to the second target's discovery controller, and
    # connects to what that one lists.
    guest.run(f"nvme connect-all -t tcp -a {Guest.host_address} -s {first.disc_port}")
    connected = guest.run("cat /sys/class/nvme/nvme*/subsysnqn").output.split()
    assert REFERRED_NQN in connected, connected
    guest.run(f"nvme disconnect -n {REFERRED_NQN}")
    # Removed: the referral is gone from what the host discovers.
    with first.rpc() as rpc:
        rpc.call(
            "nvmf_discovery_remove_referral",
            address=_address(Guest.host_address, second.disc_port),
        )
    out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {first.disc_port}").output
    assert f"trsvcid: {second.disc_port}" not in out, out
