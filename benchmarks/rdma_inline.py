"""The seed's table on its own transport: 16 KiB against 4 KiB of in-capsule data on
NVMe/RDMA, pynvmf's target and the Linux nvme-rdma host over soft-RoCE in one guest.

The seed (a patch to nvmet-rdma) measured 8 KiB random writes with 16 KiB of inline data
instead of 4 KiB: 1.84x IOPS, half the latency, no more CPU at the same IOPS. Here both
sides run in the RDMA guest (tests/support/guest_rdma.py): pynvmf's target on the guest's
Debian Python with python3-pyverbs, two rdma ports on the soft-RoCE device, one with 16 KiB
and one with 4 KiB in-capsule data, each serving a subsystem of its own (one memory
namespace each, so the host's multipath keeps them apart). With 16 KiB an 8 KiB write
travels in the command's SEND; with 4 KiB the target fetches it with an RDMA READ, one more
round trip. The host is the guest kernel's nvme-rdma with fio (libaio, O_DIRECT, one I/O
queue per controller).

Each round runs every workload on both ports in turn (which goes first alternates), free
running, then at a fixed rate (--rate, IOPS; 0: 60% of the slower side's free-running
median) for the target's CPU per I/O at the same IOPS; cells are medians over --repeat
rounds, ratios the medians of the rounds' pairs. The guest runs under QEMU's TCG on a
shared 2-CPU machine: the absolute figures are the emulator's; the ratios are the point.

    python3 benchmarks/rdma_inline.py [--runtime 5] [--repeat 3] [--output docs/rdma.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynvmf.bench import report as R  # noqa: E402
from tests.support import guest_pynvmf, guest_rdma  # noqa: E402
from tests.support.guest import LINUX_7, Guest  # noqa: E402

ADDRESS = "10.0.2.15"
# Side: (port, in-capsule data bytes, subsystem NQN).
SIDES: dict[str, tuple[int, int, str]] = {
    "16 KiB": (4420, 16384, "nqn.2014-08.org.pynvmf:rdma-inline-16k"),
    "4 KiB": (4421, 4096, "nqn.2014-08.org.pynvmf:rdma-inline-4k"),
}
WORKLOADS = {
    "8 KiB random write, QD32": "--rw=randwrite --bs=8k --iodepth=32",
    "8 KiB random 70/30 read/write, QD32": "--rw=randrw --rwmixread=70 --bs=8k --iodepth=32",
}
# One fio run: IOPS, mean completion latency (µs), the target's CPU µs per I/O.
Run = tuple[float, float, float]
# The target's CPU time, user + system ticks (USER_HZ 100), from /proc.
STAT = "cut -d' ' -f14,15 /proc/$(cat /tmp/target.pid)/stat"


def config() -> dict[str, object]:
    return {
        "ports": [
            {
                "trtype": "rdma",
                "address": ADDRESS,
                "port": port,
                "inline_data_size": inline,
                "subsystems": [nqn],
            }
            for port, inline, nqn in SIDES.values()
        ],
        "discovery_ports": [],
        "subsystems": [
            {"nqn": nqn, "allow_any_host": True, "namespaces": [{"nsid": 1, "memory": "256M"}]}
            for _port, _inline, nqn in SIDES.values()
        ],
    }


def connect(g: Guest, port: int, nqn: str) -> str:
    """``nvme connect`` with one I/O queue; the namespace's block device."""
    g.run(
        f"nvme connect -t rdma -a {ADDRESS} -s {port} -n {nqn} --nr-io-queues 1",
        timeout=150,
    )
    return g.run(
        "for i in $(seq 200); do for c in /sys/class/nvme/nvme*; do"
        f' [ "$(cat $c/subsysnqn 2>/dev/null)" = {nqn} ] && for n in $c/nvme*n*; do'
        ' d=/dev/$(basename $n | sed -E "s/c[0-9]+n/n/"); [ -b $d ] && { echo $d; exit 0; };'
        " done; done; sleep 0.1; done; exit 1"
    ).output.strip()


def fio(g: Guest, dev: str, job: str, runtime: float, rate: int) -> Run:
    """IOPS (reads and writes), mean completion latency (µs, I/Os weighted) and the
    target's CPU µs per I/O over one fio run."""
    limit = f" --rate_iops={rate}" if rate else ""
    out = g.run(
        f"{STAT}; fio --name=b --filename={dev} {job}{limit} --ioengine=libaio --direct=1"
        f" --time_based --runtime={runtime:g} --ramp_time=1 --output-format=json"
        f" > /tmp/fio.json; {STAT}; cat /tmp/fio.json",
        timeout=runtime * 4 + 120,
    ).output
    lines = out.splitlines()
    before = sum(int(x) for x in lines[0].split())
    after = sum(int(x) for x in lines[1].split())
    job_out = json.loads(out[out.index("{") :])["jobs"][0]
    ios = iops = lat = 0.0
    for side in ("read", "write"):
        d = job_out[side]
        iops += d["iops"]
        lat += d["clat_ns"]["mean"] * d["total_ios"]
        ios += d["total_ios"]
    cpu_us = (after - before) / 100 * 1e6 / max(iops * (runtime + 1), 1)
    return iops, lat / max(ios, 1) / 1000, cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=0, help="fixed IOPS for the CPU rows")
    parser.add_argument("--output", default="docs/rdma.md", help="markdown file (or -)")
    args = parser.parse_args()
    # free[workload][side] and fixed[...]: (IOPS, latency µs, CPU µs/IO) per round.
    free: dict[str, dict[str, list[Run]]] = {w: {s: [] for s in SIDES} for w in WORKLOADS}
    fixed: dict[str, dict[str, list[Run]]] = {w: {s: [] for s in SIDES} for w in WORKLOADS}
    with guest_rdma.rdma_guest(LINUX_7) as g:
        guest_pynvmf.install(g, check_import="pyverbs.cmid")
        g.write_file("/tmp/target.json", json.dumps(config()))
        g.run(
            "cd /tmp && (PYTHONPATH=/opt/pynvmf python3 -m pynvmf target -v --cores 1"
            " --config /tmp/target.json > /tmp/target.out 2> /tmp/target.err &"
            " echo $! > /tmp/target.pid)\n"
            "for i in $(seq 300); do grep -q ready /tmp/target.out && exit 0; sleep 0.2; done;"
            " cat /tmp/target.err; exit 1",
            timeout=120,
        )
        g.run("modprobe nvme-rdma")
        devices = {side: connect(g, port, nqn) for side, (port, _i, nqn) in SIDES.items()}
        for dev in devices.values():
            g.run(f"dd if=/dev/urandom of={dev} bs=1M count=256 oflag=direct status=none", 600)
        for r in range(args.repeat):
            for w, (workload, job) in enumerate(WORKLOADS.items()):
                order = list(SIDES) if (r + w) % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    free[workload][side].append(fio(g, devices[side], job, args.runtime, 0))
                    print(f"round {r + 1} {workload} {side}: {free[workload][side][-1]}")
        rates = {
            w: args.rate
            or int(0.6 * min(statistics.median(x[0] for x in runs) for runs in by.values()))
            for w, by in free.items()
        }
        for r in range(args.repeat):
            for w, (workload, job) in enumerate(WORKLOADS.items()):
                order = list(SIDES) if (r + w) % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    fixed[workload][side].append(
                        fio(g, devices[side], job, args.runtime, rates[workload])
                    )
                    print(f"round {r + 1} {workload} {side} fixed: {fixed[workload][side][-1]}")
        for _port, _inline, nqn in SIDES.values():
            g.run(f"nvme disconnect -n {nqn}", timeout=120)
        # What each side's 8 KiB writes did, as the target counts them when a queue closes.
        closed = g.run(
            "for i in $(seq 100); do n=$(grep -c 'rdma queue 0 .* closed' /tmp/target.err);"
            ' [ "$n" -ge 2 ] && break; sleep 0.1; done; grep "rdma queue" /tmp/target.err'
        ).output
        kernel = g.run("uname -r").output.strip()
    paths = transfers(closed)
    headers = [
        "workload",
        "in-capsule",
        "IOPS",
        "vs 4 KiB",
        "latency µs",
        "vs 4 KiB",
        "fixed IOPS",
        "target CPU µs/IO",
        "vs 4 KiB",
    ]
    rows = []
    for workload in WORKLOADS:
        base, base_fixed = free[workload]["4 KiB"], fixed[workload]["4 KiB"]
        for side in SIDES:
            runs, runs_fixed = free[workload][side], fixed[workload][side]
            rows.append(
                [
                    workload,
                    side,
                    f"{statistics.median(x[0] for x in runs):,.0f}",
                    f"{ratio(runs, base, 0):.2f}",
                    f"{statistics.median(x[1] for x in runs):,.0f}",
                    f"{ratio(runs, base, 1):.2f}",
                    f"{statistics.median(x[0] for x in runs_fixed):,.0f}",
                    f"{statistics.median(x[2] for x in runs_fixed):,.0f}",
                    f"{ratio(runs_fixed, base_fixed, 2):.2f}",
                ]
            )
    setup = (
        f"Linux {kernel} guest under QEMU (TCG), pynvmf's target and the kernel's nvme-rdma "
        "host in it over soft-RoCE (rxe0 on the guest's virtio network device), one I/O "
        "queue per controller, fio libaio O_DIRECT, "
        f"{args.runtime:g} s per cell after 1 s ramp, which side first alternating; medians of "
        f"{args.repeat} rounds; fixed rate {', '.join(f'{v:,}' for v in rates.values())} IOPS; "
        f"load average at end {R.load_line()}"
    )
    print(setup)
    print(R.text_table(headers, rows))
    print(paths)
    if args.output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in R.environment_lines()),
                f"- setup: {setup}",
                f"- the target's own counts, all runs: {paths}",
                "",
                R.markdown_table(headers, rows),
            ]
        )
        R.write_results(Path(args.output), "NVMe/RDMA", "benchmarks/rdma_inline.py", body)


def ratio(a: list[Run], b: list[Run], i: int) -> float:
    """The median of the rounds' ratios of field `i`, side `a` over side `b`."""
    return statistics.median(x[i] / y[i] for x, y in zip(a, b, strict=True))


def transfers(closed: str) -> str:
    """Per side, how the I/O queues' write data came: bytes in capsules and RDMA READs."""
    parts = []
    for side, (port, _inline, _nqn) in SIDES.items():
        queues = re.findall(
            rf"rdma queue [1-9]\d* .*:{port}.* (\d+) commands, (\d+) bytes in capsules,"
            r" (\d+) RDMA READs, (\d+) RDMA WRITEs",
            closed,
        )
        totals = [sum(int(q[i]) for q in queues) for i in range(4)]
        parts.append(
            f"{side}: {totals[0]:,} commands, {totals[1]:,} bytes in capsules,"
            f" {totals[2]:,} RDMA READs, {totals[3]:,} RDMA WRITEs"
        )
    return "; ".join(parts)


if __name__ == "__main__":
    os.environ.setdefault("PYNVMF_GUEST_PEERS", "linux-7")
    main()
