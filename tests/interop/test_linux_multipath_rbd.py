"""Two pynvmf gateways on one Ceph RBD image, leases deciding which one serves, the Linux
host's native multipath as the judge.

Two `pynvmf target --config` processes with a "gateway" section (pynvmf.ha.gateway)
serve the same subsystem from one RBD image on the session's test cluster
(tests/support/ceph_cluster.py); their RADOS leases (pynvmf.ha.lease, 3 s) decide which one has
ANA group 1 optimized, with no RPC from the test: A prefers the group and takes it at
start, B stands by. The guest (nvme_core.multipath=Y) connects to both through
discovery and runs fio with verification while

1. the optimized gateway is killed with SIGKILL: the standby's lease takes over once
   the dead owner's lease has expired (it blocklists the dead owner's RADOS client,
   waits for the latest OSD map, turns its path optimized and sends the ANA change
   event); fio sees no error, verification passes, and the failover time is measured
   (docs/ana.md);
2. split brain: the owner is frozen (SIGSTOP) past its lease, the standby takes over
   and fences it, the owner is resumed (SIGCONT): it finds itself fenced, withdraws
   (its path inaccessible for good, whatever it still had queued refused by the OSDs),
   and fio's verification passes.

The killed gateway is restarted between the two and rejoins as a standby, without
taking the group back (failback off). Only A's configuration file has the subsystem: B
serves it from the gateway group's shared object (pynvmf.ha.shared), and each lists the
other's listener in its discovery log from there. One guest boot and one pair of
gateways per peer.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.ha.lease import OBJECT_PREFIX
from tests.interop.test_linux_multipath import (
    EUI64,
    NGUID,
    NQN,
    NS_UUID,
    PATHS,
    SERIAL,
    Gateway,
    finish_fio,
    path_for,
    paths,
    start_fio,
    wait_for,
    writes_done,
)
from tests.support.ceph_cluster import CephCluster
from tests.support.guest import NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = NEWEST.mark()

MIB = 1 << 20
SIZE = 64 * MIB
LEASE = 3  # seconds: renewals every second, an owner gives up 0.6 s before its lease ends
GROUP = 1
OPTIMIZED = f"ana group {GROUP} optimized"  # what a gateway prints when it serves


def _config(
    name: str,
    index: int,
    io_port: int,
    disc_port: int,
    cluster: CephCluster,
    image: str,
    group_object: str,
) -> dict[str, Any]:
    # Only A's file has the subsystem: B gets it from the group's shared object, and each
    # gets the other's listener (for its discovery log) from there too.
    subsystems = (
        []
        if name == "B"
        else [
            {
                "nqn": NQN,
                "serial": SERIAL,
                "namespaces": [
                    {
                        "nsid": 1,
                        "rbd": {"pool": cluster.pool, "image": image, "conf": str(cluster.conf)},
                        "uuid": NS_UUID,
                        "nguid": NGUID,
                        "eui64": EUI64,
                        "anagrpid": GROUP,
                    }
                ],
            }
        ]
    )
    return {
        # The guest reaches the machine's 127.0.0.1 as 10.0.2.2 (QEMU user networking).
        "ports": [{"address": "127.0.0.1", "port": io_port, "advertise": "10.0.2.2"}],
        "discovery_ports": [{"address": "127.0.0.1", "port": disc_port, "advertise": "10.0.2.2"}],
        "subsystems": subsystems,
        "gateway": {
            "id": f"gw-{name}",
            "index": index,
            "pool": cluster.pool,
            "ceph_conf": str(cluster.conf),
            "groups": [GROUP],
            "preferred": [GROUP] if name == "A" else [],
            "lease": LEASE,
            "failback": False,
            "shared_config": {"object": group_object},
        },
    }


def _image(cluster: CephCluster, name: str, group_object: str) -> None:
    """A shared image without exclusive-lock: with it, librbd would hand the image's lock
    from client to client on writes and, with the holder dead, wait for its watch to time
    out (30 s) before breaking it; ownership is the leases' business here."""
    import rbd

    with cluster.admin().open_ioctx(cluster.pool) as io:
        rbd.RBD().create(io, name, SIZE, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        # Leases left by an earlier module's gateways (one killed) start nothing stale here.
        for stale in (OBJECT_PREFIX + str(GROUP), group_object):
            with contextlib.suppress(Exception):
                io.remove_object(stale)


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer, ceph_cluster: CephCluster
) -> Iterator[list[Gateway]]:
    workdir = tmp_path_factory.mktemp(f"multipath-rbd-{linux_peer.name}")
    image = f"ha-{linux_peer.name.replace('.', '-')}"
    group_object = f"pynvmf.gateway-group.{image}"
    _image(ceph_cluster, image, group_object)
    ports = {n: (free_tcp_port(), free_tcp_port(), free_tcp_port()) for n in ("A", "B")}
    made: list[Gateway] = []
    try:
        for index, name in enumerate(("A", "B")):
            io_port, disc_port, rpc_port = ports[name]
            gw_dir = workdir / name
            gw_dir.mkdir()
            config = _config(name, index, io_port, disc_port, ceph_cluster, image, group_object)
            proc = TargetProcess(config, gw_dir, ["--rpc-listen", f"127.0.0.1:{rpc_port}"])
            proc.start()
            made.append(Gateway(name, proc, io_port, disc_port, rpc_port))
        yield made
    finally:
        for gw in made:
            if gw.process.alive:
                with contextlib.suppress(Exception):
                    gw.process.stop()


@pytest.fixture(scope="module")
def guest(gateways: list[Gateway], linux_peer: Peer) -> Iterator[Guest]:
    g = Guest(
        extra_files={"/usr/local/bin/paths": PATHS},
        kernel_args=["nvme_core.multipath=Y"],
        peer=linux_peer,
    )
    g.start()
    yield g
    g.run(f"nvme disconnect -n {NQN}", check=False, timeout=60)
    g.stop()


def _states(guest: Guest, gateways: list[Gateway]) -> dict[str, tuple[str, str]]:
    return {name: (p.state, p.ana) for name, p in path_for(gateways, guest).items()}


def _longest_gap_ms(guest: Guest) -> int:
    """The longest stall between two I/O completions in fio's per-I/O log (ms)."""
    return int(
        guest.run(
            "cut -d, -f1 /tmp/ha_clat.1.log | sort -n | "
            "awk 'NR > 1 { g = $1 - p; if (g > m) m = g } { p = $1 } END { print m + 0 }'"
        ).output.strip()
    )


def test_the_lease_holder_is_the_optimized_path(guest: Guest, gateways: list[Gateway]) -> None:
    a, b = gateways
    # A prefers the group: its lease makes it optimized; B stays inaccessible.
    a.process.wait_stdout(OPTIMIZED, timeout=30)
    assert OPTIMIZED not in "".join(b.process.stdout_lines)
    for gw in gateways:
        out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {gw.disc_port}").output
        listed = set(re.findall(rf"trsvcid:\s+(\d+)\s*\nsubnqn:\s+{re.escape(NQN)}", out))
        assert listed == {str(a.io_port), str(b.io_port)}, out
    guest.run(f"nvme connect-all -t tcp -a {Guest.host_address} -s {b.disc_port}", timeout=120)
    wait_for(
        "A optimized, B inaccessible",
        lambda: (
            _states(guest, gateways) == {"A": ("live", "optimized"), "B": ("live", "inaccessible")}
        ),
    )
    by_gw = path_for(gateways, guest)
    # Controller IDs from each gateway's own range (index x 2040).
    assert 1 <= by_gw["A"].cntlid <= 2040 and 2041 <= by_gw["B"].cntlid <= 4080, by_gw
    _, head = paths(guest)
    assert re.fullmatch(r"nvme\d+n1", head)


def test_sigkill_of_the_owner_fails_over_by_lease(
    guest: Guest, gateways: list[Gateway], linux_peer: Peer
) -> None:
    a, b = gateways
    _, head = paths(guest)
    start_fio(guest, head, runtime=20, extra="--write_lat_log=/tmp/ha --log_avg_msec=0")
    before = writes_done(guest, head)
    wait_for("fio to be well under way", lambda: writes_done(guest, head) > before + 2000)
    a.process.stop(sig=signal.SIGKILL, expect=-signal.SIGKILL)
    killed = time.monotonic()
    # B's lease takes over by itself once A's has run out: fence, optimized, AEN.
    b.process.wait_stdout(OPTIMIZED, timeout=4 * LEASE)
    owned = time.monotonic() - killed
    progress = writes_done(guest, head)
    wait_for("I/O to resume on gateway B", lambda: writes_done(guest, head) > progress + 100)
    resumed = time.monotonic() - killed
    job = finish_fio(guest, timeout=120)
    gap_ms = _longest_gap_ms(guest)
    states = _states(guest, gateways)
    assert states["B"] == ("live", "optimized"), states
    assert states["A"][0] != "live", states
    assert "fenced gateway gw-A" in b.process.stderr()
    result = {
        "peer": linux_peer.name,
        "lease_s": LEASE,
        "b_optimized_after_kill_s": round(owned, 3),
        "io_resumed_after_kill_s": round(resumed, 3),
        "longest_completion_gap_ms": gap_ms,
        "fio_write_mib": job["write"]["io_bytes"] >> 20,
        "fio_verify_mib": job["read"]["io_bytes"] >> 20,
    }
    print("\nlease failover:", json.dumps(result))
    # The dead owner's lease (3 s) bounds B's wait; the host adds its ANA log read.
    assert owned < 2 * LEASE + 2, result
    assert gap_ms < 4 * LEASE * 1000, result

    # A restarted rejoins as a standby: B keeps the group (failback is off), no split brain.
    a.process = TargetProcess(None, Path(a.process.stderr_path).parent, a.process.args)
    a.process.start()
    wait_for(
        "A back as the standby",
        lambda: (
            _states(guest, gateways) == {"A": ("live", "inaccessible"), "B": ("live", "optimized")}
        ),
        timeout=90,
    )
    assert OPTIMIZED not in "".join(a.process.stdout_lines)


def test_a_frozen_owner_is_fenced_and_never_serves_again(
    guest: Guest, gateways: list[Gateway], linux_peer: Peer
) -> None:
    a, b = gateways  # B owns the group, A stands by
    _, head = paths(guest)
    start_fio(guest, head, runtime=30, extra="--write_lat_log=/tmp/ha --log_avg_msec=0")
    before = writes_done(guest, head)
    wait_for("fio to be well under way", lambda: writes_done(guest, head) > before + 2000)
    b.process.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        # B cannot renew: its lease runs out, A takes the group over and fences B.
        a.process.wait_stdout(OPTIMIZED, timeout=4 * LEASE)
        owned = time.monotonic() - frozen
        progress = writes_done(guest, head)
        wait_for(
            "I/O to resume on gateway A",
            lambda: writes_done(guest, head) > progress + 100,
            timeout=90,
        )
        resumed = time.monotonic() - frozen
    finally:
        # B wakes well past its lease, with whatever it had read before it froze.
        b.process.send_signal(signal.SIGCONT)
    assert "fenced gateway gw-B" in a.process.stderr()
    # B finds its client blocklisted and withdraws for good.
    wait_for("B to withdraw", lambda: "withdrawing from every ANA group" in b.process.stderr())
    job = finish_fio(guest, timeout=120)
    gap_ms = _longest_gap_ms(guest)
    wait_for(
        "A optimized, B inaccessible",
        lambda: (
            _states(guest, gateways) == {"A": ("live", "optimized"), "B": ("live", "inaccessible")}
        ),
        timeout=90,
    )
    # Only one gateway ever said optimized for the group at a time: B said it once (the
    # SIGKILL takeover) and never again, though it went on running.
    assert "".join(b.process.stdout_lines).count(OPTIMIZED) == 1
    result = {
        "peer": linux_peer.name,
        "a_optimized_after_freeze_s": round(owned, 3),
        "io_resumed_after_freeze_s": round(resumed, 3),
        "longest_completion_gap_ms": gap_ms,
        "fio_write_mib": job["write"]["io_bytes"] >> 20,
        "fio_verify_mib": job["read"]["io_bytes"] >> 20,
    }
    print("\nsplit brain:", json.dumps(result))
