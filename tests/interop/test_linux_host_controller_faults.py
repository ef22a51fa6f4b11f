"""Controller-level fault rules (docs/faults.md) against the Linux kernel's NVMe/TCP host
under QEMU, native multipath on (nvme_core.multipath=Y), the target on two cores (the I/O
queues on its workers):

- keep-alive starvation: one Keep Alive dropped; the host's keep-alive times out, it
  resets and reconnects, and fio's verify pass on the namespace matches afterwards;
- a failed controller (CSTS.CFS, nothing answered) under fio: the host's keep alive goes
  unanswered, it resets, the new controller is healthy and fio verifies with no error;
- an ANA group flapping every 2 s between optimized and inaccessible on one of two
  paths (two listeners of one target, as test_linux_multipath.py's two gateways are two
  paths) while fio writes and verifies through the multipath disk: no I/O error.

Rules are added over the RPC while the host is connected, as a host developer would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pynvmf.rpc.client import RpcClient
from tests.interop.test_linux_host import DEV_FOR
from tests.interop.test_linux_multipath import (
    PATHS,
    finish_fio,
    start_fio,
    wait_for,
    writes_done,
)
from tests.support.guest import LINUX_6_1, LINUX_6_12, LINUX_7, Guest, PeerSet
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = PeerSet((LINUX_7,), others=(LINUX_6_1, LINUX_6_12)).mark()

MIB = 1 << 20
STARVED = "nqn.2024-11.dev.pynvmf:faults-keep-alive"
FAILED = "nqn.2024-11.dev.pynvmf:faults-cfs"
FLAP = "nqn.2024-11.dev.pynvmf:faults-ana-flap"
# The host's keep-alive timeout (seconds): how soon it notices a silent controller.
KATO_S = 2
FLAP_MS = 2000


@dataclass
class Served:
    process: TargetProcess
    socket: str
    ports: tuple[int, int]

    def call(self, method: str, **params: Any) -> Any:
        with RpcClient(self.socket) as rpc:
            return rpc.call(method, params)

    def hits(self, rule_id: int) -> int:
        (rule,) = [r for r in self.call("pynvmf_fault_list") if r["id"] == rule_id]
        return int(rule["hits"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("linux-host-controller-faults")
    ports = (free_tcp_port(), free_tcp_port())
    config = {
        "ports": [{"address": "127.0.0.1", "port": port} for port in ports],
        "discovery_ports": [],
        "subsystems": [
            {"nqn": nqn, "namespaces": [{"nsid": 1, "memory": 64 * MIB}]}
            for nqn in (STARVED, FAILED, FLAP)
        ],
    }
    socket_path = str(workdir / "rpc.sock")
    proc = TargetProcess(config, workdir, ["--cores", "2", "--rpc-socket", socket_path])
    proc.start()
    yield Served(proc, socket_path, ports)
    proc.stop()


@pytest.fixture(scope="module")
def guest(served: Served, linux_peer: Any) -> Iterator[Guest]:
    g = Guest(
        extra_files={"/usr/local/bin/dev-for": DEV_FOR, "/usr/local/bin/paths": PATHS},
        kernel_args=["nvme_core.multipath=Y"],
        peer=linux_peer,
    )
    g.start()
    yield g
    g.stop()


def _connect(guest: Guest, served: Served, nqn: str, port: int) -> None:
    # A reconnect a second after a failure (not the default 10): the tests wait for it.
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {nqn} "
        f"--keep-alive-tmo={KATO_S} --reconnect-delay=1 --ctrl-loss-tmo=120"
    )


def _disk(guest: Guest, nqn: str) -> str:
    return guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip().removeprefix("/dev/")


def _paths(guest: Guest, nqn: str) -> list[tuple[str, int, str, str]]:
    """(controller, trsvcid, state, ANA state) of each path of `nqn`."""
    out = guest.run(f"sh /usr/local/bin/paths {nqn}").output
    found = []
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] == "path":
            found.append((fields[1], int(fields[2]), fields[4], fields[5]))
    return sorted(found, key=lambda p: p[1])


def _live(guest: Guest, nqn: str, count: int = 1) -> bool:
    return [p[2] for p in _paths(guest, nqn)] == ["live"] * count


def _kernel_lines(guest: Guest) -> int:
    return len(guest.run("dmesg").output.splitlines())


def _new_kernel_lines(guest: Guest, since: int) -> str:
    return "\n".join(guest.run("dmesg").output.splitlines()[since:])


def _disconnect(guest: Guest, nqn: str) -> None:
    guest.run(f"nvme disconnect -n {nqn}", check=False, timeout=60)


def test_keep_alive_starvation_the_host_reconnects_and_io_goes_on(
    guest: Guest, served: Served
) -> None:
    _connect(guest, served, STARVED, served.ports[0])
    disk = _disk(guest, STARVED)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add", action="drop", subsystem=STARVED, opcode="keep_alive", limit=1
    )
    try:
        # Idle, the host sends a Keep Alive every KATO/2 or so: one is dropped.
        wait_for("a Keep Alive dropped", lambda: served.hits(rule) == 1, timeout=60)
        wait_for(
            "the host to reconnect",
            lambda: (
                "reconnect" in _new_kernel_lines(guest, since).lower() and _live(guest, STARVED)
            ),
            timeout=120,
        )
        start_fio(guest, disk, runtime=6)
        finish_fio(guest, timeout=180)
        assert served.hits(rule) == 1
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, STARVED)


def test_a_failed_controller_is_reset_and_fio_verifies(guest: Guest, served: Served) -> None:
    _connect(guest, served, FAILED, served.ports[0])
    disk = _disk(guest, FAILED)
    ((before, *_),) = _paths(guest, FAILED)
    cntlid = guest.run(f"cat /sys/class/nvme/{before}/cntlid").output.strip()
    since = _kernel_lines(guest)
    start_fio(guest, disk, runtime=14)
    began = writes_done(guest, disk)
    wait_for("fio to be under way", lambda: writes_done(guest, disk) > began + 500)
    rule = served.call("pynvmf_fault_add", action="fail_controller", subsystem=FAILED)
    try:
        assert served.hits(rule) == 1
        job = finish_fio(guest, timeout=240)
        assert job["error"] == 0
        kernel = _new_kernel_lines(guest, since)
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
        wait_for("the path live again", lambda: _live(guest, FAILED), timeout=60)
        # A new association: another controller, healthy.
        now = guest.run(f"cat /sys/class/nvme/{before}/cntlid").output.strip()
        assert now != cntlid, kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, FAILED)


def test_fio_verify_passes_while_one_path_flaps(guest: Guest, served: Served) -> None:
    steady, flapping = served.ports
    for port in served.ports:
        _connect(guest, served, FLAP, port)
    wait_for("two live paths", lambda: _live(guest, FLAP, 2))
    disk = _disk(guest, FLAP)
    controllers = [p[0] for p in _paths(guest, FLAP)]
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="ana_flap",
        subsystem=FLAP,
        anagrpid=1,
        ana_states=["inaccessible", "optimized"],
        traddr="127.0.0.1",
        trsvcid=flapping,
        period_ms=FLAP_MS,
    )
    try:
        wait_for(
            "the flapping path inaccessible",
            lambda: (
                dict((p[1], p[3]) for p in _paths(guest, FLAP))
                == {steady: "optimized", flapping: "inaccessible"}
            ),
        )
        start_fio(guest, disk, runtime=14)
        job = finish_fio(guest, timeout=240)
        assert job["error"] == 0
        flaps = served.hits(rule)
        assert flaps >= 5, flaps  # every 2 s across fio's 14 s and more
        # No flap tore a path down: the same controllers, both live.
        assert [p[0] for p in _paths(guest, FLAP)] == controllers
        assert _live(guest, FLAP, 2), _new_kernel_lines(guest, since)
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, FLAP)
    print(f"\nANA flaps: {flaps}, fio wrote {job['write']['io_bytes'] >> 20} MiB, no errors")
