"""An RBD namespace against a memory namespace, over loopback, on one machine.

Starts the tests' throwaway Ceph cluster (tests/support/ceph_cluster.py: one monitor, one
memstore OSD, so the storage is RAM on the OSD's side too), one `pynvmf target` with
namespace 1 in memory and namespace 2 on an RBD image, and runs `pynvmf bench`
against each in turn (A/B alternated, medians of --reps runs):

- 4 KiB random read and write at QD32, 128 KiB sequential read and write at QD32;
- copy: `--rw copy` of 1 MiB x 4 ranges, offloaded (NVMe Copy: the target's copy
  planner emulates it inside the gateway, since librbd cannot copy a range without
  the data passing through its client) against host read + write (--copy-mode
  emulate: the data crosses the NVMe/TCP connection twice).

    .venv/bin/python benchmarks/rbd_backend.py [--runtime 5] [--reps 3]

Prints a markdown table (docs/rbd.md has the numbers of one run).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.ceph_cluster import CephCluster  # noqa: E402
from tests.support.ports import free_tcp_port  # noqa: E402
from tests.support.target_process import TargetProcess  # noqa: E402

NQN = "nqn.2024-11.dev.pynvmf:rbd-bench"
# `pynvmf target` numbers --memory namespaces before --rbd ones.
MEMORY_NSID, RBD_NSID = 1, 2
REGION = "256M"
CASES: list[tuple[str, list[str]]] = [
    ("4 KiB randread QD32", ["--rw", "randread", "--bs", "4k", "--iodepth", "32"]),
    ("4 KiB randwrite QD32", ["--rw", "randwrite", "--bs", "4k", "--iodepth", "32"]),
    ("128 KiB read QD32", ["--rw", "read", "--bs", "128k", "--iodepth", "32"]),
    ("128 KiB write QD32", ["--rw", "write", "--bs", "128k", "--iodepth", "32"]),
    ("128 KiB randwrite QD32", ["--rw", "randwrite", "--bs", "128k", "--iodepth", "32"]),
    (
        "copy 1 MiB x 4, offloaded (emulated in the target)",
        [
            "--rw",
            "copy",
            "--bs",
            "1m",
            "--copy-ranges",
            "4",
            "--iodepth",
            "4",
            "--copy-mode",
            "offload",
        ],
    ),
    (
        "copy 1 MiB x 4, host read + write",
        [
            "--rw",
            "copy",
            "--bs",
            "1m",
            "--copy-ranges",
            "4",
            "--iodepth",
            "4",
            "--copy-mode",
            "emulate",
        ],
    ),
]


def bench(port: int, nsid: int, args: list[str], runtime: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "pynvmf",
        "bench",
        "-a",
        "127.0.0.1",
        "-s",
        str(port),
        "--nqn",
        NQN,
        "--namespace-id",
        str(nsid),
        "--size",
        REGION,
        "--runtime",
        str(runtime),
        "--ramp-time",
        "1",
        "-o",
        "json",
        "--group-reporting",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    (job,) = json.loads(out)["jobs"]
    return job


def summary(job: dict[str, Any]) -> tuple[float, float]:
    """(IOPS, MiB/s) of the direction that moved data."""
    side = job["read"] if job["read"]["io_bytes"] else job["write"]
    return side["iops"], side["bw_bytes"] / (1 << 20)


def main() -> None:
    # SIGTERM unwinds like ^C, so that the cluster and the target are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with CephCluster() as cluster, tempfile.TemporaryDirectory() as work:
        cluster.create_image("bench", 512 << 20)
        port = free_tcp_port()
        target = TargetProcess(
            None,
            Path(work),
            [
                "--rbd",
                "rbd/bench",
                "--memory",
                "512M",
                "--ceph-conf",
                str(cluster.conf),
                "--listen",
                f"127.0.0.1:{port}",
                "--discovery-port",
                "0",
                "--nqn",
                NQN,
            ],
        )
        target.start()
        try:
            # Fill the region: RBD reads of objects never written cost the OSD nothing.
            for nsid in (RBD_NSID, MEMORY_NSID):
                bench(port, nsid, ["--rw", "write", "--bs", "1m", "--iodepth", "8"], 3)
            rows = []
            for name, case in CASES:
                results: dict[int, list[tuple[float, float]]] = {RBD_NSID: [], MEMORY_NSID: []}
                for rep in range(args.reps):
                    # Alternate which goes first: the machine's load drifts.
                    order = (RBD_NSID, MEMORY_NSID) if rep % 2 == 0 else (MEMORY_NSID, RBD_NSID)
                    for nsid in order:
                        results[nsid].append(summary(bench(port, nsid, case, args.runtime)))
                med = {
                    n: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
                    for n, rs in results.items()
                }
                rbd, mem = med[RBD_NSID], med[MEMORY_NSID]
                rows.append((name, rbd, mem))
                samples = {n: [round(r[1], 1) for r in rs] for n, rs in results.items()}
                print(
                    f"{name}: rbd {rbd[0]:.0f} IOPS {rbd[1]:.1f} MiB/s; "
                    f"memory {mem[0]:.0f} IOPS {mem[1]:.1f} MiB/s "
                    f"(MiB/s runs: rbd {samples[RBD_NSID]}, memory {samples[MEMORY_NSID]})",
                    flush=True,
                )
        finally:
            target.stop(expect=None)
    print()
    print("| case | RBD (memstore) IOPS | RBD MiB/s | memory IOPS | memory MiB/s | RBD / memory |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rbd, mem in rows:
        print(
            f"| {name} | {rbd[0]:,.0f} | {rbd[1]:,.1f} | {mem[0]:,.0f} | {mem[1]:,.1f} | "
            f"{rbd[1] / mem[1]:.2f} |"
        )


if __name__ == "__main__":
    main()
