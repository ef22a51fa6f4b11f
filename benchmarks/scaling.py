"""IOPS versus queue depth (1-128) and block size (512 B - 1 MiB), in-memory target.

The target runs in a child process pinned to CPU 0 (pynvmf.bench.target_process)
with a 1 GiB in-memory namespace of 512-byte blocks, filled with random data
first so that reads copy real pages; this process, pinned to CPU 1, drives it
over 127.0.0.1 with pynvmf's host library and load generator (one I/O queue,
128 deep, no digests). Two sweeps:

- queue depth 1, 2, 4, ..., 128 at 4 KiB random read;
- block size 512 B, 1 KiB, ..., 1 MiB at queue depth 16, random read.

    python3 benchmarks/scaling.py            # writes docs/scaling.md and docs/scaling.png
    python3 benchmarks/scaling.py --quick    # smoke run (0.5 s per point), prints only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pynvmf.aio import install_uvloop  # noqa: E402
from pynvmf.bench import plot  # noqa: E402
from pynvmf.bench.loadgen import (  # noqa: E402
    BenchResult,
    ConnectOptions,
    Summary,
    Workload,
    remote_namespace,
    run_workload,
    summarize,
)
from pynvmf.bench.report import (  # noqa: E402
    environment_lines,
    markdown_table,
    size_label,
    text_table,
    write_results,
)
from pynvmf.bench.target_process import (  # noqa: E402
    BENCH_NQN,
    GiB,
    busy_cpu_seconds,
    process_cpu_seconds,
    start_target,
)

KiB = 1024
TARGET_CPU, HOST_CPU = 0, 1
QUEUE_DEPTHS = [1, 2, 4, 8, 16, 32, 64, 128]
BLOCK_SIZES = [512 << n for n in range(12)]  # 512 B ... 1 MiB
BS_SWEEP_QD = 16


@dataclass
class Point:
    label: str
    workload: Workload
    summary: Summary | None = None
    error: str | None = None


async def sweep(points: list[Point], port: int, target_pid: int, repeat: int) -> None:
    """Run every point `repeat` times (the whole list per pass) over one connection."""
    options = ConnectOptions(queues=1, queue_depth=max(QUEUE_DEPTHS))
    runs: dict[str, list[BenchResult]] = {p.label: [] for p in points}
    async with remote_namespace("127.0.0.1", port, BENCH_NQN, options=options) as ns:
        for n in range(repeat):
            for p in points:
                if p.error:
                    continue
                res = await run_workload(
                    ns,
                    p.workload,
                    target_cpu_clock=lambda: process_cpu_seconds(target_pid),
                    system_cpu_clock=lambda: busy_cpu_seconds((TARGET_CPU, HOST_CPU)),
                )
                if res.error:
                    p.error = res.error
                    continue
                runs[p.label].append(res)
                print(
                    f"pass {n + 1}/{repeat} {p.workload.describe():<22} {res.iops:>10,.0f} IOPS "
                    f"{res.mbps:>9,.1f} MB/s  target CPU {res.target_cpu or 0:>4.0%}",
                    file=sys.stderr,
                    flush=True,
                )
    for p in points:
        if runs[p.label] and not p.error:
            p.summary = summarize(runs[p.label])


def _cpu(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def rows(points: list[Point]) -> list[list[str]]:
    out = []
    for p in points:
        s = p.summary
        if s is None:
            out.append([p.label, "-", "-", "-", "-", "-", "-", "-", f"error: {p.error}"])
            continue
        out.append(
            [
                p.label,
                f"{s.iops:,.0f}",
                f"{s.mbps:,.1f}",
                f"{s.mean_us:,.1f}",
                f"{s.p99_us:,.1f}",
                _cpu(s.target_cpu),
                _cpu(s.host_cpu),
                _cpu(s.other_cpu),
                "ok",
            ]
        )
    return out


def header(first: str) -> list[str]:
    return [
        first,
        "IOPS",
        "MB/s",
        "mean µs",
        "p99 µs",
        "target CPU",
        "host CPU",
        "other CPU",
        "status",
    ]


def chart(qd: list[Point], bs: list[Point], path: Path, caption: str) -> None:
    plt = plot.pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    ok = [p for p in qd if p.summary]
    left.plot(
        [p.workload.iodepth for p in ok],
        [p.summary.iops / 1000 for p in ok if p.summary],
        marker="o",
        color="tab:blue",
    )
    left.set_xscale("log", base=2)
    left.set_xticks(QUEUE_DEPTHS, [str(q) for q in QUEUE_DEPTHS])
    left.set_xlabel("queue depth")
    left.set_ylabel("kIOPS", color="tab:blue")
    left.set_title("4 KiB random read: IOPS and mean latency vs queue depth")
    left.grid(alpha=0.3)
    lat = left.twinx()
    lat.plot(
        [p.workload.iodepth for p in ok],
        [p.summary.mean_us for p in ok if p.summary],
        marker="s",
        linestyle="--",
        color="tab:red",
    )
    lat.set_ylabel("mean latency (µs)", color="tab:red")

    ok = [p for p in bs if p.summary]
    sizes = [p.workload.bs for p in ok]
    right.plot(sizes, [p.summary.mbps for p in ok if p.summary], marker="o", color="tab:green")
    right.set_xscale("log", base=2)
    right.set_xticks(BLOCK_SIZES, [size_label(b).replace(" ", "") for b in BLOCK_SIZES])
    right.tick_params(axis="x", labelrotation=45)
    right.set_xlabel("block size")
    right.set_ylabel("MB/s", color="tab:green")
    right.set_title(f"random read at QD{BS_SWEEP_QD}: MB/s and IOPS vs block size")
    right.grid(alpha=0.3)
    iops = right.twinx()
    iops.plot(
        sizes,
        [p.summary.iops / 1000 for p in ok if p.summary],
        marker="s",
        linestyle="--",
        color="tab:blue",
    )
    iops.set_ylabel("kIOPS", color="tab:blue")
    plot.save(
        fig, path, caption, title="pynvmf in-memory target over loopback (target CPU 0, host CPU 1)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=2.0, help="seconds measured per point")
    parser.add_argument("--ramp", type=float, default=0.5, help="unmeasured seconds first")
    parser.add_argument("--repeat", type=int, default=1, help="passes (median per point)")
    parser.add_argument("--quick", action="store_true", help="0.5 s per point, no docs")
    parser.add_argument("--docs", type=Path, default=REPO / "docs", help="where to write")
    args = parser.parse_args()
    if args.quick:
        args.runtime, args.ramp, args.repeat = 0.5, 0.2, 1
    available = os.sched_getaffinity(0)
    if not {TARGET_CPU, HOST_CPU} <= available:
        parser.error(f"needs CPUs {TARGET_CPU} and {HOST_CPU}, have {sorted(available)}")
    env = environment_lines()
    base = Workload("randread", 4 * KiB, runtime=args.runtime, ramp_time=args.ramp)
    qd = [Point(f"QD{q}", replace(base, iodepth=q, seed=q)) for q in QUEUE_DEPTHS]
    bs = [
        Point(size_label(b), replace(base, bs=b, iodepth=BS_SWEEP_QD, seed=100 + i))
        for i, b in enumerate(BLOCK_SIZES)
    ]
    started = time.perf_counter()
    target = start_target(cpu=TARGET_CPU, size=1 * GiB, block_size=512, fill=True)
    try:
        os.sched_setaffinity(0, {HOST_CPU})
        host_uvloop = install_uvloop()
        asyncio.run(sweep(qd + bs, target.port, target.pid, args.repeat))
    finally:
        target.stop()
    elapsed = time.perf_counter() - started

    runs = (
        "1 run per point (single measurements, not medians)"
        if args.repeat == 1
        else f"median of {args.repeat} runs per point"
    )
    setup = (
        f"Target in a child process pinned to CPU {TARGET_CPU} (uvloop "
        f"{'on' if target.uvloop else 'off'}), 1 GiB in-memory namespace of 512-byte blocks "
        f"filled with random data; host (this process, uvloop {'on' if host_uvloop else 'off'}) "
        f"pinned to CPU {HOST_CPU}, over 127.0.0.1, one I/O queue 128 deep, in-capsule 16 KiB, "
        f"no digests. Random reads over the whole namespace; {args.ramp:g} s unmeasured then "
        f"{args.runtime:g} s measured per point; {runs}. Whole run: {elapsed:.0f} s."
    )
    notes = (
        "MB/s is 10^6 bytes per second; latency is submission to completion as the host "
        "library's caller sees it. Target / host CPU: CPU time of each process over the "
        "measured window (100% = one core). Other CPU: busy time on CPUs 0 and 1 that was "
        "neither process (kernel softirq work for loopback TCP, and any other program that "
        "ran there, e.g. a test suite): a high figure means the point was disturbed."
    )
    qd_table = markdown_table(header("queue depth"), rows(qd))
    bs_table = markdown_table(header("block size"), rows(bs))
    text = "\n".join(
        [
            *(f"- {line}" for line in env),
            "",
            setup,
            "",
            "### Queue depth sweep: 4 KiB random read",
            "",
            qd_table,
            "",
            f"### Block size sweep: random read at QD{BS_SWEEP_QD}",
            "",
            bs_table,
            "",
            notes,
            "",
            "![IOPS vs queue depth and block size](scaling.png)",
        ]
    )
    print("\n".join(env))
    print(setup)
    print()
    print(text_table(header("queue depth"), rows(qd)))
    print()
    print(text_table(header("block size"), rows(bs)))
    failed = [p for p in qd + bs if p.summary is None]
    if not args.quick:
        write_results(
            args.docs / "scaling.md",
            "Scaling: queue depth and block size",
            "benchmarks/scaling.py",
            text,
        )
        chart(qd, bs, args.docs / "scaling.png", f"{runs}; {env[1].removeprefix('machine: ')}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
