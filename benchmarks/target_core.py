"""How fast is the pynvmf target on one core?

The target runs in a child process pinned to one CPU with a 1 GiB in-memory
namespace; this process, pinned to another CPU, drives it over loopback TCP
with the pynvmf host library, keeping a fixed number of I/Os in flight with one
asyncio task per slot. Each workload runs for --runtime seconds (after a short
warm-up), the whole set is repeated --repeat times, and the table shows medians.

    python benchmarks/target_core.py [--runtime 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace

from pynvmf.aio import install_uvloop
from pynvmf.bench import BENCH_NQN, ConnectOptions, Workload, remote_namespace, start_target
from pynvmf.bench import loadgen as L
from pynvmf.bench.report import cpu_model
from pynvmf.bench.target_process import process_cpu_seconds
from pynvmf.host import RemoteNamespace
from pynvmf.tcp import digest
from pynvmf.tcp.target import TransportConfig

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

WORKLOADS = {
    "4k randread QD1": Workload("randread", 4 * KiB, iodepth=1),
    "4k randread QD32": Workload("randread", 4 * KiB, iodepth=32),
    "4k randwrite QD32": Workload("randwrite", 4 * KiB, iodepth=32),
    "128k seqread QD8": Workload("read", 128 * KiB, iodepth=8),
}


@dataclass
class Result:
    iops: float
    mbps: float
    lat_us: float
    target_cpu: float  # fraction of one CPU
    host_cpu: float


async def drive(args: argparse.Namespace, port: int, target_pid: int) -> dict[str, list[Result]]:
    results: dict[str, list[Result]] = {name: [] for name in WORKLOADS}
    options = ConnectOptions(
        queues=args.queues,
        queue_depth=64,
        header_digest=args.digests,
        data_digest=args.digests,
        disable_sqflow=args.disable_sqflow,
    )
    async with remote_namespace("127.0.0.1", port, BENCH_NQN, options=options) as ns:
        if not args.no_prefill:
            await timed_prefill(ns)
        for r in range(args.repeat):
            for seed, (name, w) in enumerate(WORKLOADS.items()):
                w = replace(w, runtime=args.runtime, ramp_time=args.warmup, seed=seed)
                res = await L.run_workload(
                    ns, w, target_cpu_clock=lambda: process_cpu_seconds(target_pid)
                )
                if res.error:
                    raise SystemExit(f"{name}: {res.error}")
                assert res.target_cpu is not None
                results[name].append(
                    Result(
                        res.iops, res.mbps, res.total.latency.mean_us, res.target_cpu, res.host_cpu
                    )
                )
                print(
                    f"run {r + 1}/{args.repeat} {name:<18} {res.iops:>10.0f} IOPS "
                    f"{res.mbps:>8.1f} MB/s {res.total.latency.mean_us:>8.1f} us "
                    f"target CPU {res.target_cpu:>4.0%}",
                    file=sys.stderr,
                )
    return results


async def timed_prefill(ns: RemoteNamespace) -> None:
    """Write every block once, so reads touch real pages rather than the zero page."""
    t = time.perf_counter()
    await L.prefill(ns)
    print(
        f"prefill: {ns.capabilities.size / GiB:.1f} GiB written in {time.perf_counter() - t:.1f} s",
        file=sys.stderr,
    )


def report(
    args: argparse.Namespace,
    results: dict[str, list[Result]],
    uvloop: tuple[bool, bool],
    cpus: tuple[int, int],
) -> None:
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: nproc {os.cpu_count()}, {cpu_model()}, {platform.system()} {platform.release()}"
    )
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"uvloop target {'on' if uvloop[0] else 'off'} / host {'on' if uvloop[1] else 'off'}, "
        f"crc32c: {digest.IMPLEMENTATION}"
    )
    print(
        f"target on CPU {cpus[0]}, host on CPU {cpus[1]}; 1 GiB memory namespace, "
        f"{args.queues} I/O queue(s), in-capsule {args.inline} B, "
        f"digests {'on' if args.digests else 'off'}, "
        f"SQ flow control {'off' if args.disable_sqflow else 'on'}"
    )
    print(
        f"{args.runtime:g} s per run after {args.warmup:g} s warm-up, median of {args.repeat} runs"
    )
    print()
    header = (
        f"{'workload':<20}{'IOPS':>10}{'MB/s':>10}{'mean lat us':>13}"
        f"{'target CPU':>12}{'host CPU':>10}"
    )
    print(header)
    print("-" * len(header))
    medians: dict[str, Result] = {}
    for name, runs in results.items():
        m = Result(
            *(
                statistics.median(getattr(r, f) for r in runs)
                for f in ("iops", "mbps", "lat_us", "target_cpu", "host_cpu")
            )
        )
        medians[name] = m
        print(
            f"{name:<20}{m.iops:>10.0f}{m.mbps:>10.1f}{m.lat_us:>13.1f}"
            f"{m.target_cpu:>12.0%}{m.host_cpu:>10.0%}"
        )
    qd1 = medians["4k randread QD1"].iops
    qd32 = medians["4k randread QD32"].iops
    print()
    print(f"4k randread QD32 / QD1 IOPS: {qd32 / qd1:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--queues", type=int, default=1, help="I/O queues (connections)")
    parser.add_argument("--inline", type=int, default=16 * KiB, help="in-capsule data size")
    parser.add_argument("--digests", action="store_true", help="header and data digests")
    parser.add_argument(
        "--disable-sqflow",
        action="store_true",
        help="ask for SQ flow control off (reads complete on C2HData)",
    )
    parser.add_argument("--no-prefill", action="store_true", help="skip writing 1 GiB first")
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    args = parser.parse_args()

    available = os.sched_getaffinity(0)
    if args.target_cpu not in available or args.host_cpu not in available:
        parser.error(f"CPUs {args.target_cpu} and {args.host_cpu} must be in {sorted(available)}")
    if args.target_cpu == args.host_cpu:
        print("warning: target and host share a CPU", file=sys.stderr)

    target = start_target(
        cpu=args.target_cpu, size=1 * GiB, transport=TransportConfig(inline_data_size=args.inline)
    )
    try:
        os.sched_setaffinity(0, {args.host_cpu})
        host_uvloop = install_uvloop()
        results = asyncio.run(drive(args, target.port, target.pid))
    finally:
        target.stop()
    report(args, results, (target.uvloop, host_uvloop), (args.target_cpu, args.host_cpu))


if __name__ == "__main__":
    main()
