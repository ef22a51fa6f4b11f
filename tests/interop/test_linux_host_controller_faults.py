"""Controller-level fault rules (docs/faults.md) against the Linux kernel's NVMe/TCP host
under QEMU, native multipath on (nvme_core.multipath=Y), the target on two cores (the I/O
queues on its workers):

- keep-alive starvation: one Keep Alive dropped; the host's keep-alive times out, it
  resets and reconnects, and fio's verify pass on the namespace matches afterwards;
- a failed controller (CSTS.CFS, nothing answered) under fio: the host's keep alive goes
  unanswered, it resets, the new controller is healthy and fio verifies with no error;
- an ANA group flapping every 2 s between optimized and inaccessible on one of two
  paths (two listeners of one target, as test_linux_multipath.py's two gateways are two
  paths) while fio writes and verifies through the multipath disk: no I/O error;
- a namespace not ready for 2 s under fio: the host retries each command that completed
  with Namespace Not Ready (DNR clear) CRDT1 later (it enabled ACRE), fails none, and fio
  verifies;
- an AEN storm (Namespace Attribute Changed every period) under fio: the host re-arms its
  AER and reads the Changed Namespace List after each event, at most one event a period
  reaches it, and fio verifies.

Rules are added over the RPC while the host is connected, as a host developer would."""

from __future__ import annotations

import re
import time
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
from tests.support.guest import NEWEST, Guest
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = NEWEST.mark()

MIB = 1 << 20
STARVED = "nqn.2024-11.dev.pynvmf:faults-keep-alive"
FAILED = "nqn.2024-11.dev.pynvmf:faults-cfs"
FLAP = "nqn.2024-11.dev.pynvmf:faults-ana-flap"
NOT_READY = "nqn.2024-11.dev.pynvmf:faults-not-ready"
STORM = "nqn.2024-11.dev.pynvmf:faults-aen-storm"
# CRDT1 in 100 ms units: how long the host waits before it retries a command completed
# with CRD 1 (the Linux host retries at most nvme_core.max_retries = 5 times: 1 s apart,
# a 2 s window is covered).
CRDT1 = 10
NOT_READY_MS = 2000
STORM_PERIOD_MS = 200
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
        "crdt": [CRDT1, 0, 0],
        "subsystems": [
            {"nqn": nqn, "namespaces": [{"nsid": 1, "memory": 64 * MIB}]}
            for nqn in (STARVED, FAILED, FLAP, NOT_READY, STORM)
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


def _rule(served: Served, rule_id: int) -> dict[str, Any] | None:
    found = [r for r in served.call("pynvmf_fault_list") if r["id"] == rule_id]
    return found[0] if found else None


def test_a_namespace_not_ready_for_2_s_is_retried_and_fio_verifies(
    guest: Guest, served: Served
) -> None:
    _connect(guest, served, NOT_READY, served.ports[0])
    disk = _disk(guest, NOT_READY)
    since = _kernel_lines(guest)
    start_fio(guest, disk, runtime=8)
    began = writes_done(guest, disk)
    wait_for("fio to be under way", lambda: writes_done(guest, disk) > began + 200)
    rule = served.call(
        "pynvmf_fault_add",
        action="not_ready",
        subsystem=NOT_READY,
        nsid=1,
        crd=1,
        for_ms=NOT_READY_MS,
    )
    # The rule removes itself after NOT_READY_MS; its hits (counted on the worker serving
    # the I/O queue, reported to the main process twice a second at most) as last listed.
    hits = 0
    while (listed := _rule(served, rule)) is not None:
        hits = int(listed["hits"])
        time.sleep(0.1)
    try:
        job = finish_fio(guest, timeout=120)
        assert hits > 0
        assert job["error"] == 0
        # Held back CRDT1 before their retry: fio saw completions that late.
        slowest = max(job[d]["clat_ns"]["max"] for d in ("read", "write"))
        assert slowest >= CRDT1 * 100_000_000, slowest
        # No command failed up to the block layer (the host logs those, with the status).
        kernel = _new_kernel_lines(guest, since)
        assert "Not Ready" not in kernel, kernel
        assert _live(guest, NOT_READY), kernel
    finally:
        _disconnect(guest, NOT_READY)
    print(f"\nnot ready {NOT_READY_MS} ms: {hits} hits, slowest completion {slowest / 1e9:.2f} s")


def _async_events(guest: Guest) -> int | None:
    """The host's nvme_async_event trace events so far (None: no tracefs in the guest)."""
    out = guest.run(
        "cat /sys/kernel/tracing/trace 2>/dev/null | grep -c nvme_async_event", check=False
    ).output.strip()
    return int(out) if out.isdigit() else None


def test_an_aen_storm_is_bounded_and_the_host_keeps_serving_io(
    guest: Guest, served: Served
) -> None:
    _connect(guest, served, STORM, served.ports[0])
    disk = _disk(guest, STORM)
    # The host's own account of the events it got, where the guest's kernel traces them.
    traced = (
        guest.run(
            "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing; "
            "echo > /sys/kernel/tracing/trace && "
            "echo 1 > /sys/kernel/tracing/events/nvme/nvme_async_event/enable",
            check=False,
        ).rc
        == 0
    )
    since = _kernel_lines(guest)
    start_fio(guest, disk, runtime=8)
    began = writes_done(guest, disk)
    wait_for("fio to be under way", lambda: writes_done(guest, disk) > began + 200)
    added = time.monotonic()
    rule = served.call(
        "pynvmf_fault_add",
        action="aen_storm",
        event="ns_attr",
        subsystem=STORM,
        nsid=1,
        period_ms=STORM_PERIOD_MS,
    )
    try:
        # An event needs an AER outstanding and the last one's log read: five events
        # show the host re-armed its AER (and read the Changed Namespace List) each time.
        wait_for("five events", lambda: served.hits(rule) >= 5, timeout=60)
        (listed,) = [r for r in served.call("pynvmf_fault_list") if r["id"] == rule]
        elapsed = time.monotonic() - added
        early, ticks = int(listed["hits"]), int(listed["matches"])
        # At most one event a period (one controller selected): the storm is bounded.
        assert early <= elapsed * 1000 / STORM_PERIOD_MS + 1, (early, elapsed)
        assert early <= ticks
        progress = writes_done(guest, disk)
        wait_for("I/O during the storm", lambda: writes_done(guest, disk) > progress + 100)
        # What was sent until now; one more event at most before the rule goes.
        sent = served.hits(rule)
    finally:
        served.call("pynvmf_fault_remove", id=rule)
    try:
        job = finish_fio(guest, timeout=120)
        assert job["error"] == 0
        got = _async_events(guest) if traced else None
        if got is not None:
            # Each event the target sent reached the host, and nothing else did.
            assert sent <= got <= sent + 1, (got, sent)
        kernel = _new_kernel_lines(guest, since)
        assert _live(guest, STORM), kernel
        assert not re.search(r"I/O error|reset|reconnect", kernel, re.IGNORECASE), kernel
    finally:
        if traced:
            guest.run(
                "echo 0 > /sys/kernel/tracing/events/nvme/nvme_async_event/enable", check=False
            )
        _disconnect(guest, STORM)
    print(
        f"\naen storm: {early} events in {elapsed:.1f} s ({ticks} ticks), {sent} in all, "
        f"host traced {got}"
    )
