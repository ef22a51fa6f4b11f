"""A namespace held to a rate limit, measured by two SPDK `spdk_nvme_perf` processes at
once (two hosts), against `pynvmf target --cores N` (docs/qos.md).

The target starts from a pynvmf configuration whose device has a `qos` (2,000 IOPS);
each round sets the limit at run time with SPDK's rpc.py (`bdev_set_qos_limit`), then
both perf processes run together (4 KiB random reads for IOPS, 128 KiB random writes
for bandwidth, a few queues each, both on CPU 0; with --idle under SCHED_IDLE), and
their totals are added. The first round, unlimited, shows the load exceeds the limit.

    python benchmarks/qos.py --spdk /work/spdk/build/bin --cores 1 2
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

VERBOSE = False  # print perf's own output too
IDLE = False  # perf under SCHED_IDLE (--idle)
REPO = Path(__file__).resolve().parent.parent
NQN = "nqn.2024-11.dev.pynvmf:qos"
READY = "pynvmf target ready"
SPDK_RPC = Path(sys.executable).parent / "spdk-rpc"
# (what is limited, its rpc.py options, perf's workload, I/O size, queue depth and
# queues, the limit). The bandwidth round keeps few commands in flight: perf counts the
# ones that complete after its time is up, which at 32 commands a second would add a
# second's worth.
Round = tuple[str, list[str], str, int, int, int, int]
ROUNDS: list[Round] = [
    # Unlimited first: the same load goes faster than the limit below.
    ("IOPS", ["--rw-ios-per-sec", "0", "--rw-mbytes-per-sec", "0"], "randread", 4096, 16, 2, 0),
    ("IOPS", ["--rw-ios-per-sec", "2000"], "randread", 4096, 16, 2, 2000),
    ("MiB/s", ["--rw-ios-per-sec", "0", "--rw-mbytes-per-sec", "4"], "randwrite", 131072, 2, 1, 4),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perf(spdk: Path, port: int, round_: Round, seconds: int, group: int) -> subprocess.Popen[str]:
    """One host: perf on CPU 0 (both hosts alike, so that the scheduler favours
    neither; with IDLE under SCHED_IDLE, so that the target's processes go first), with
    its own DPDK shared memory group."""
    _what, _options, workload, size, depth, queues, _limit = round_
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    return subprocess.Popen(
        [
            *(("chrt", "--idle", "0") if IDLE else ()),
            str(spdk / "spdk_nvme_perf"),
            "-r", trid,
            "-q", str(depth), "-o", str(size), "-w", workload,
            "-t", str(seconds), "-a", "2",
            "-c", "0x1", "-P", str(queues),
            "-i", str(group),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def total(out: str) -> tuple[float, float]:
    """perf's Total line: (IOPS, MiB/s)."""
    m = re.search(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)", out, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"spdk_nvme_perf printed no total:\n{out}")
    return float(m.group(1)), float(m.group(2))


def run(spdk: Path, cores: int, seconds: int) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        rpc_socket = f"{tmp}/rpc.sock"
        config = {
            "devices": [{"name": "Qos0", "memory": 256 << 20, "qos": {"rw_ios_per_sec": 2000}}],
            "subsystems": [{"nqn": NQN, "namespaces": [{"nsid": 1, "device": "Qos0"}]}],
            "ports": [{"address": "127.0.0.1", "port": port}],
            "discovery_ports": [],
        }
        Path(f"{tmp}/config.json").write_text(json.dumps(config))
        target = subprocess.Popen(
            [sys.executable, "-m", "pynvmf", "target", "--cores", str(cores),
             "--config", f"{tmp}/config.json", "--rpc-socket", rpc_socket],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
        )  # fmt: skip
        try:
            assert target.stdout is not None
            for line in target.stdout:
                if line.strip() == READY:
                    break
            else:
                raise RuntimeError("the target did not start")
            for round_ in ROUNDS:
                what, options, limit = round_[0], round_[1], round_[-1]
                subprocess.run(
                    [str(SPDK_RPC), "-s", rpc_socket, "bdev_set_qos_limit", "Qos0", *options],
                    check=True,
                )
                procs = [perf(spdk, port, round_, seconds, g) for g in (1, 2)]
                outs = [p.communicate(timeout=seconds + 120)[0] for p in procs]
                if VERBOSE:
                    print(*outs, sep="\n")
                each = [total(out) for out in outs]
                index = 0 if what == "IOPS" else 1
                measured = [e[index] for e in each]
                off = f" ({sum(measured) / limit - 1:+.1%})" if limit else ""
                print(
                    f"--cores {cores}: {what} limit {limit or 'none'}: measured "
                    f"{sum(measured):.1f}{off}; per host "
                    + ", ".join(f"{m:.1f}" for m in measured),
                    flush=True,
                )
        finally:
            target.terminate()
            target.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spdk", type=Path, required=True, help="SPDK's build/bin")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--idle", action="store_true", help="perf under SCHED_IDLE")
    args = parser.parse_args()
    global IDLE
    IDLE = args.idle
    for cores in args.cores:
        run(args.spdk, cores, args.seconds)


if __name__ == "__main__":
    main()
