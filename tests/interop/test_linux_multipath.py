"""Two pynvmf gateways, one subsystem, the Linux host's native multipath as the judge.

Two `pynvmf target` processes on different ports serve the same subsystem (NQN, serial,
NSID, NGUID, UUID, EUI-64) from one shared file, with disjoint controller ID ranges and
ANA group 1 optimized on gateway A and inaccessible on gateway B; each lists the other's
listener in its discovery log. The guest (nvme_core.multipath=Y) finds both paths with
`nvme connect-all`, sees their ANA states (sysfs, `nvme list-subsys`, `nvme ana-log`),
and runs fio with verification while (a) the states are flipped through the RPC every
few seconds and (b) the optimized gateway is killed with SIGKILL and the other made
optimized through the RPC (what a lease holder would do): fio sees no I/O error and
verification passes. The failover time (the longest stall of I/O completions across the
kill) is printed and recorded in docs/ana.md.

Runs on the Linux 6.1 and 7 peers (one guest boot and one pair of gateways per peer).
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pynvmf.rpc.client import RpcClient
from tests.support.guest import OLDEST_AND_NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = OLDEST_AND_NEWEST.mark()

NQN = "nqn.2024-11.dev.pynvmf:ha"
SERIAL = "PYNVMFHA0001"
NS_UUID = "3c1e6a52-7d1b-4c55-9b0e-2f4b8a6c9d01"
NGUID = "3c1e6a527d1b4c559b0e2f4b8a6c9d01"
EUI64 = "0025385a1b2c3d4e"
MIB = 1 << 20
SIZE = 64 * MIB
RANGES = {"A": (1, 2040), "B": (2041, 4080)}  # ceph-nvmeof's 2040-wide ranges

# One line per path of NQN's subsystem: controller, trsvcid, cntlid, state, ANA state;
# then "head <disk>" for the multipath disk of namespace 1.
PATHS = r"""#!/bin/sh
for s in /sys/class/nvme-subsystem/nvme-subsys*; do
  [ "$(cat "$s/subsysnqn")" = "$1" ] || continue
  for c in "$s"/nvme*; do
    name=$(basename "$c")
    case "$name" in
      nvme*n*) echo "head $name" ;;
      *)
        svc=$(sed -E 's/.*trsvcid=([0-9]+).*/\1/' "$c/address")
        ana=$(cat "$c"/nvme*c*n1/ana_state 2>/dev/null || echo none)
        echo "path $name $svc $(cat "$c/cntlid") $(cat "$c/state") $ana" ;;
    esac
  done
done
"""


@dataclass
class Gateway:
    name: str
    process: TargetProcess
    io_port: int
    disc_port: int
    rpc_port: int

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        with RpcClient(f"127.0.0.1:{self.rpc_port}", timeout=10) as client:
            return client.call(method, params)

    def set_state(self, state: str) -> None:
        self.rpc(
            "nvmf_subsystem_listener_set_ana_state",
            {
                "nqn": NQN,
                "listen_address": {
                    "trtype": "tcp",
                    "adrfam": "ipv4",
                    "traddr": "127.0.0.1",
                    "trsvcid": str(self.io_port),
                },
                "ana_state": state,
                "anagrpid": 1,
            },
        )


def _config(
    name: str, io_port: int, disc_port: int, peer_port: int, backing: Path, state: str
) -> dict[str, Any]:
    low, high = RANGES[name]
    return {
        # The guest reaches the machine's 127.0.0.1 as 10.0.2.2 (QEMU user networking):
        # the discovery log says so, or connect-all would dial the guest's own loopback.
        "ports": [{"address": "127.0.0.1", "port": io_port, "advertise": "10.0.2.2"}],
        "discovery_ports": [{"address": "127.0.0.1", "port": disc_port, "advertise": "10.0.2.2"}],
        "subsystems": [
            {
                "nqn": NQN,
                "serial": SERIAL,
                "cntlid_min": low,
                "cntlid_max": high,
                "ana_groups": [{"grpid": 1, "state": state}],
                "peer_listeners": [{"address": "10.0.2.2", "port": peer_port}],
                "namespaces": [
                    {
                        "nsid": 1,
                        "file": str(backing),
                        "size": SIZE,
                        "uuid": NS_UUID,
                        "nguid": NGUID,
                        "eui64": EUI64,
                        "ptpl_file": None,
                    }
                ],
            }
        ],
    }


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer) -> Iterator[list[Gateway]]:
    workdir = tmp_path_factory.mktemp(f"multipath-{linux_peer.name}")
    backing = workdir / "shared.img"
    backing.write_bytes(b"")
    ports = {n: (free_tcp_port(), free_tcp_port(), free_tcp_port()) for n in ("A", "B")}
    made = []
    try:
        for name, peer, state in (("A", "B", "optimized"), ("B", "A", "inaccessible")):
            io_port, disc_port, rpc_port = ports[name]
            gw_dir = workdir / name
            gw_dir.mkdir()
            config = _config(name, io_port, disc_port, ports[peer][0], backing, state)
            # Two worker processes each: the host's I/O queues, and so every ANA flip and
            # the failover, are served by the workers (docs/cores.md).
            args = ["--cores", "2", "--rpc-listen", f"127.0.0.1:{rpc_port}"]
            proc = TargetProcess(config, gw_dir, args)
            proc.start()
            made.append(Gateway(name, proc, io_port, disc_port, rpc_port))
        yield made
    finally:
        for gw in made:
            if gw.process.alive:
                gw.process.stop(expect=None)


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


@dataclass
class Path_:
    ctrl: str
    trsvcid: int
    cntlid: int
    state: str
    ana: str


def paths(guest: Guest) -> tuple[list[Path_], str]:
    out = guest.run(f"sh /usr/local/bin/paths {NQN}").output
    found, head = [], ""
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] == "path":
            found.append(Path_(fields[1], int(fields[2]), int(fields[3]), fields[4], fields[5]))
        elif fields and fields[0] == "head":
            head = fields[1]
    return sorted(found, key=lambda p: p.trsvcid), head


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    """Poll the guest until `check` holds: the host follows an ANA change on its own time
    (an event, then a log read), which the test can only observe."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def ana_states(guest: Guest) -> dict[int, str]:
    return {p.trsvcid: p.ana for p in paths(guest)[0]}


def path_for(gateways: list[Gateway], guest: Guest) -> dict[str, Path_]:
    by_port = {p.trsvcid: p for p in paths(guest)[0]}
    return {gw.name: by_port[gw.io_port] for gw in gateways if gw.io_port in by_port}


def test_connect_all_finds_both_gateways_and_their_ana_states(
    guest: Guest, gateways: list[Gateway]
) -> None:
    a, b = gateways
    assert guest.run("cat /sys/module/nvme_core/parameters/multipath").output.strip() == "Y"
    # Each gateway's discovery log lists both paths.
    for gw in gateways:
        out = guest.run(f"nvme discover -t tcp -a {Guest.host_address} -s {gw.disc_port}").output
        listed = set(re.findall(rf"trsvcid:\s+(\d+)\s*\nsubnqn:\s+{re.escape(NQN)}", out))
        assert listed == {str(a.io_port), str(b.io_port)}, out
    guest.run(f"nvme connect-all -t tcp -a {Guest.host_address} -s {a.disc_port}", timeout=120)
    wait_for("two live paths", lambda: len([p for p in paths(guest)[0] if p.state == "live"]) == 2)
    wait_for(
        "the paths' ANA states",
        lambda: ana_states(guest) == {a.io_port: "optimized", b.io_port: "inaccessible"},
    )
    found, head = paths(guest)
    by_gw = path_for(gateways, guest)
    for name, (low, high) in RANGES.items():
        assert low <= by_gw[name].cntlid <= high
    # Each gateway handed the host's I/O queues to its workers.
    for gw in gateways:
        assert handed(gw), gw.process.stderr()[-3000:]
    # One multipath disk for the namespace both gateways serve (same NQN and identifiers).
    assert re.fullmatch(r"nvme\d+n1", head), found
    assert guest.run(f"ls /dev/{head}").ok
    blocks = guest.run("ls /sys/block").output.split()
    assert [d for d in blocks if re.fullmatch(r"nvme\d+n\d+", d)] == [head]
    # Given the namespace, list-subsys shows each path's ANA state.
    text = guest.run(f"nvme list-subsys /dev/{head}").output
    assert re.search(rf"trsvcid={a.io_port}\S*\s.*live optimized", text), text
    assert re.search(rf"trsvcid={b.io_port}\S*\s.*live inaccessible", text), text
    # `nvme ana-log` through each controller agrees with what sysfs says.
    for gw, state in ((a, "optimized"), (b, "inaccessible")):
        ctrl = by_gw[gw.name].ctrl
        log = _keys(json.loads(guest.run(f"nvme ana-log /dev/{ctrl} -o json").output))
        (desc,) = log["ana desc list"]
        assert int(desc.get("grpid", desc.get("ana group id"))) == 1, log
        assert int(desc.get("nnsids", desc.get("number of nsids"))) == 1, log
        nsids = desc.get("nsids", desc.get("nsid"))
        assert [int(n["nsid"]) if isinstance(n, dict) else int(n) for n in nsids] == [1], log
        assert _state_name(desc.get("state", desc.get("ana state"))) == state, log
        id_ctrl = json.loads(guest.run(f"nvme id-ctrl /dev/{ctrl} -o json").output)
        assert id_ctrl["cmic"] & 0b1011 == 0b1011
        assert id_ctrl["sn"].strip() == SERIAL
        assert 0 < id_ctrl["mnan"] <= id_ctrl["nn"]
        id_ns = json.loads(guest.run(f"nvme id-ns /dev/{head} -o json").output)
        assert id_ns["anagrpid"] == 1 and id_ns["nmic"] & 1
        assert id_ns["nguid"] == NGUID and id_ns["eui64"] == EUI64
    assert uuid.UUID(guest.run(f"cat /sys/block/{head}/uuid").output.strip()) == uuid.UUID(NS_UUID)


def _keys(value: Any) -> Any:
    """nvme-cli's JSON with its keys lower-cased and stripped (versions spell them
    differently: "ANA DESC LIST " in 2.13)."""
    if isinstance(value, dict):
        return {k.strip().lower(): _keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_keys(v) for v in value]
    return value


def _state_name(value: Any) -> str:
    # nvme-cli 2.3 prints the state's name; later ones may print the number.
    names = {1: "optimized", 2: "non-optimized", 3: "inaccessible", 4: "persistent-loss"}
    if isinstance(value, int) or str(value).isdigit():
        return names[int(value)]
    return str(value).strip().lower()


FIO = (
    "fio --name=ha --filename={dev} --ioengine=libaio --direct=1 --rw=randwrite --bs=4k "
    "--iodepth=16 --size=32m --time_based --runtime={runtime} --verify=crc32c "
    "--verify_backlog=256 --verify_fatal=1 --do_verify=1 --output-format=json {extra}"
)


def start_fio(guest: Guest, head: str, runtime: int, extra: str = "") -> None:
    cmd = FIO.format(dev=f"/dev/{head}", runtime=runtime, extra=extra)
    guest.run("rm -f /tmp/fio.json /tmp/fio.rc /tmp/ha_clat*")
    guest.run(f"( {cmd} > /tmp/fio.json 2>&1; echo $? > /tmp/fio.rc ) > /dev/null 2>&1 &")


def finish_fio(guest: Guest, timeout: float) -> dict[str, Any]:
    polls = int(timeout * 5)
    guest.run(
        f"i=0; while [ ! -s /tmp/fio.rc ] && [ $i -lt {polls} ]; do sleep 0.2; i=$((i+1)); done",
        timeout=timeout + 30,
    )
    rc = guest.run("cat /tmp/fio.rc", check=False).output.strip()
    output = guest.run("cat /tmp/fio.json").output
    assert rc == "0", f"fio exited with {rc!r}:\n{output[-3000:]}"
    report = json.loads(output[output.index("{") :])
    (job,) = report["jobs"]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] > 0 and job["read"]["io_bytes"] > 0  # verify reads
    return job


def writes_done(guest: Guest, head: str) -> int:
    """Writes completed on the head disk and its paths (Linux 6.1 counts none on the
    head): a count that grows while I/O makes progress."""
    out = guest.run(
        "cat /sys/block/nvme*/stat /sys/class/nvme/nvme*/nvme*c*n*/stat 2>/dev/null"
    ).output
    return sum(int(line.split()[4]) for line in out.splitlines() if line.strip())


def handed(gw: Gateway) -> set[int]:
    """The workers of `gw` that I/O queues were handed to (its log)."""
    return {int(w) for w in re.findall(r"reason=handed to worker (\d+)", gw.process.stderr())}


def test_fio_verify_passes_while_ana_states_flip(guest: Guest, gateways: list[Gateway]) -> None:
    a, b = gateways
    _, head = paths(guest)
    controllers = {name: (p.ctrl, p.cntlid) for name, p in path_for(gateways, guest).items()}
    start_fio(guest, head, runtime=14)
    wait_for("fio to start writing", lambda: writes_done(guest, head) > 200)
    owner, other = a, b
    flips = 0
    deadline = time.monotonic() + 9
    while time.monotonic() < deadline:
        # The old owner gives up first, so the two are never optimized at once: through
        # "change" (ANA Transition for what reaches it meanwhile) to inaccessible.
        owner.set_state("change")
        other.set_state("optimized")
        time.sleep(0.5)  # the flips' shape: half a second in transition
        owner.set_state("inaccessible")
        owner, other = other, owner
        flips += 1
        time.sleep(1.5)  # the pace of the flips (the load's shape), not a synchronisation
    job = finish_fio(guest, timeout=120)
    assert flips >= 4
    wait_for(
        "the paths to follow the last flip",
        lambda: ana_states(guest) == {owner.io_port: "optimized", other.io_port: "inaccessible"},
    )
    # The same controllers throughout: no flip tore a path down, its queues stayed on the
    # workers, which answered with the states the RPC set.
    assert {n: (p.ctrl, p.cntlid) for n, p in path_for(gateways, guest).items()} == controllers
    # Writes went through both gateways: each one's subsystem counted some.
    for gw in gateways:
        ctrl = path_for(gateways, guest)[gw.name].ctrl
        smart = json.loads(guest.run(f"nvme smart-log /dev/{ctrl} -o json").output)
        assert int(smart["host_write_commands"]) > 0, (gw.name, smart)
    # How many commands met a path-related status on their way (informational: the race
    # between a flip and commands already sent need not happen).
    refused = 0
    for p in paths(guest)[0]:
        log = guest.run(f"nvme error-log /dev/{p.ctrl} -e 64", check=False).output
        refused += len(re.findall(r"status_field\s*:\s*0x30[123]", log, re.IGNORECASE))
    print(f"\ncommands that met a path status: {refused}")
    print(f"\nANA flips: {flips}, fio wrote {job['write']['io_bytes'] >> 20} MiB, verified "
          f"{job['read']['io_bytes'] >> 20} MiB, no errors")  # fmt: skip
    # Leave A the owner, as the next test expects.
    if owner is not a:
        b.set_state("inaccessible")
        a.set_state("optimized")
    wait_for(
        "A optimized again",
        lambda: ana_states(guest) == {a.io_port: "optimized", b.io_port: "inaccessible"},
    )


def test_fio_verify_survives_sigkill_of_the_optimized_gateway(
    guest: Guest, gateways: list[Gateway], linux_peer: Peer
) -> None:
    a, b = gateways
    _, head = paths(guest)
    start_fio(guest, head, runtime=14, extra="--write_lat_log=/tmp/ha --log_avg_msec=0")
    before = writes_done(guest, head)
    wait_for("fio to be well under way", lambda: writes_done(guest, head) > before + 2000)
    a.process.stop(sig=signal.SIGKILL, expect=-signal.SIGKILL)
    killed = time.monotonic()
    # What the standby's lease holder does once it owns the group: turn its path optimized.
    b.set_state("optimized")
    told = time.monotonic() - killed
    progress = writes_done(guest, head)
    wait_for("I/O to resume on gateway B", lambda: writes_done(guest, head) > progress + 100)
    resumed = time.monotonic() - killed
    job = finish_fio(guest, timeout=120)
    # The longest stall between two I/O completions, and the longest I/O, from fio's own
    # per-I/O log (completion time in ms, latency in ns).
    gap_ms = int(
        guest.run(
            "cut -d, -f1 /tmp/ha_clat.1.log | sort -n | "
            "awk 'NR > 1 { g = $1 - p; if (g > m) m = g } { p = $1 } END { print m + 0 }'"
        ).output.strip()
    )
    max_clat_ms = (
        int(guest.run("awk -F, '$2 > m { m = $2 } END { print m + 0 }' /tmp/ha_clat.1.log").output)
        / 1e6
    )
    states = path_for(gateways, guest)
    assert states["B"].ana == "optimized"
    assert states["A"].state != "live"
    result = {
        "peer": linux_peer.name,
        "rpc_after_kill_s": round(told, 3),
        "io_resumed_after_kill_s": round(resumed, 3),
        "longest_completion_gap_ms": gap_ms,
        "longest_io_ms": round(max_clat_ms, 1),
        "fio_write_mib": job["write"]["io_bytes"] >> 20,
        "fio_verify_mib": job["read"]["io_bytes"] >> 20,
    }
    print("\nfailover:", json.dumps(result))
    # A stall this long would mean the host waited for something other than the ANA
    # change (a reconnect delay, ANATT), which the mechanism must not need.
    assert gap_ms < 10_000, result
