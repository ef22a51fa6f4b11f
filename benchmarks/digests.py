"""What NVMe/TCP digests cost: no digest, header digest, header + data digest.

One target runs in a child process pinned to --target-cpu with a 1 GiB memory
namespace filled with random data; this process, pinned to --host-cpu, holds
three connections to it, one per digest setting (digests are negotiated per
connection at ICReq, so the same target serves all three). Each workload, 4 KiB
random read at QD32 (IOPS) and 128 KiB sequential read at QD8 (MB/s), gives
each connection --runtime seconds per run in --slices slices, the three taking
turns slice by slice so that noise from the rest of the machine falls on all
three alike. Cells are medians of --repeat runs.

Then the CRC32C throughput of the accelerated implementation pynvmf uses versus
its pure-Python fallback, in GB/s (benchmarks/crc32c_libs.py compares packages).

    python3 benchmarks/digests.py [--runtime 3] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from pynvmf.aio import install_uvloop
from pynvmf.bench import (
    BenchResult,
    ConnectOptions,
    Workload,
    busy_cpu_seconds,
    microbench,
    plot,
    remote_namespace,
    run_interleaved,
    start_target,
    summarize,
)
from pynvmf.bench import report as R
from pynvmf.bench.options import add_interleaved_options, resolve_interleaved_options
from pynvmf.bench.target_process import TargetProcess
from pynvmf.host import RemoteNamespace
from pynvmf.tcp import digest as D
from pynvmf.tcp.target import TransportConfig

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class Mode:
    name: str
    header: bool
    data: bool


MODES = (
    Mode("no digest", False, False),
    Mode("header digest", True, False),
    Mode("header + data digest", True, True),
)
WORKLOADS = {
    "4 KiB random read, QD32": Workload("randread", 4 * KiB, 32),
    "128 KiB sequential read, QD8": Workload("read", 128 * KiB, 8),
}
CRC_SIZES = (512, 4 * KiB, 128 * KiB, 1 * MiB)

# results[workload name][mode name]: one result per repeat
Results = dict[str, dict[str, list[BenchResult]]]


async def measure(args: argparse.Namespace, target: TargetProcess) -> Results:
    results: Results = {name: {m.name: [] for m in MODES} for name in WORKLOADS}
    async with contextlib.AsyncExitStack() as stack:
        namespaces: dict[str, RemoteNamespace] = {}
        for mode in MODES:
            options = ConnectOptions(header_digest=mode.header, data_digest=mode.data)
            ns = await stack.enter_async_context(
                remote_namespace("127.0.0.1", target.port, target.nqn, options=options, iodepth=32)
            )
            # Measure what was asked for: the target must have agreed to each digest.
            for queue in ns.controller.io_queues:
                if (queue.conn.hdgst, queue.conn.ddgst) != (mode.header, mode.data):
                    raise SystemExit(f"{mode.name}: the connection negotiated something else")
            namespaces[mode.name] = ns
        cpus = {args.target_cpu, args.host_cpu}
        for repeat in range(args.repeat):
            for n, (name, w) in enumerate(WORKLOADS.items()):
                run = replace(w, runtime=args.runtime, ramp_time=args.warmup, seed=n)
                merged = await run_interleaved(
                    [namespaces[m.name] for m in MODES],
                    run,
                    slices=args.slices,
                    first=n + repeat,
                    target_cpu_clocks=[target.cpu_seconds] * len(MODES),
                    system_cpu_clock=lambda: busy_cpu_seconds(cpus),
                )
                for mode, res in zip(MODES, merged, strict=True):
                    if res.error:
                        raise SystemExit(f"{name}, {mode.name}: {res.error}")
                    results[name][mode.name].append(res)
                    print(
                        f"run {repeat + 1}/{args.repeat} {name:<29} {mode.name:<21}"
                        f"{res.iops:>9.0f} IOPS {res.mbps:>8.1f} MB/s "
                        f"{res.total.latency.mean_us:>7.1f} us mean, other load "
                        f"{res.other_cpu or 0:.2f} CPU",
                        file=sys.stderr,
                    )
    return results


def io_table(results: Results) -> tuple[list[str], list[list[str]]]:
    headers = [
        "workload",
        "digests",
        "IOPS",
        "MB/s",
        "vs none",
        "mean µs",
        "p99 µs",
        "target CPU",
        "other load (CPUs)",
    ]
    rows = []
    for name, by_mode in results.items():
        base = by_mode[MODES[0].name]
        for mode in MODES:
            runs = by_mode[mode.name]
            s = summarize(runs)
            # Each repeat measured the three settings together: compare within a repeat.
            ratio = statistics.median(r.iops / b.iops for r, b in zip(runs, base, strict=True))
            rows.append(
                [
                    name,
                    mode.name,
                    f"{s.iops:,.0f}",
                    f"{s.mbps:,.1f}",
                    f"{ratio:.2f}",
                    f"{s.mean_us:.0f}",
                    f"{s.p99_us:.0f}",
                    "-" if s.target_cpu is None else f"{s.target_cpu:.0%}",
                    "-" if s.other_cpu is None else f"{s.other_cpu:.2f}",
                ]
            )
    return headers, rows


def crc_table(repeats: int, min_time: float) -> tuple[list[str], list[list[str]]]:
    headers = ["CRC32C", "24 B ns/call", *(f"{R.size_label(s)} GB/s" for s in CRC_SIZES)]
    impls = [(f"accelerated: {D.IMPLEMENTATION}", D.crc32c)] if D.ACCELERATED else []
    impls.append(("fallback: pure Python", D.crc32c_software))
    sizes = (24, *CRC_SIZES)
    cells = [(fn, os.urandom(size)) for _, fn in impls for size in sizes]
    times = microbench.interleaved_times(cells, repeats=repeats, min_time=min_time)
    rows = []
    for k, (label, _) in enumerate(impls):
        ns = times[k * len(sizes) : (k + 1) * len(sizes)]
        row = [label, f"{ns[0]:.0f}"]
        for size, t in zip(CRC_SIZES, ns[1:], strict=True):
            gbps = microbench.throughput_gbps(size, t)
            row.append(f"{gbps:.2f}" if gbps >= 0.1 else f"{gbps:.3f}")
        rows.append(row)
    return headers, rows


def chart(results: Results, path: Path, caption: str) -> None:
    """One panel per workload: IOPS (4 KiB) or MB/s (128 KiB) for each digest setting."""
    plt = plot.pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 5.5), squeeze=False)
    for ax, (name, by_mode) in zip(axes[0], results.items(), strict=True):
        workload = WORKLOADS[name]
        big = workload.bs >= 64 * KiB
        base = by_mode[MODES[0].name]
        values = []
        notes = []
        for mode in MODES:
            s = summarize(by_mode[mode.name])
            values.append(s.mbps if big else s.iops / 1000)
            runs = by_mode[mode.name]
            ratio = statistics.median(r.iops / b.iops for r, b in zip(runs, base, strict=True))
            notes.append(f"{ratio:.2f}x")
        for k, (value, note) in enumerate(zip(values, notes, strict=True)):
            bars = ax.bar([k], [value], 0.6, color=plot.COLORS[k])
            ax.bar_label(bars, [f"{value:,.0f}\n({note} of none)"], fontsize=8, padding=2)
        ax.set_xticks(range(len(MODES)), [m.name for m in MODES])
        ax.set_ylim(0, max(values) * 1.25)
        ax.set_ylabel("MB/s" if big else "kIOPS")
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    plot.save(fig, path, caption, title="pynvmf NVMe/TCP: cost of header and data digests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_interleaved_options(parser, "the settings rotating", "docs/digests.md")
    args = parser.parse_args()
    output = resolve_interleaved_options(parser, args)

    env = R.environment_lines()
    target = start_target(
        cpu=args.target_cpu,
        size=1 * GiB,
        transport=TransportConfig(allow_header_digest=True, allow_data_digest=True),
        fill=True,
    )
    try:
        os.sched_setaffinity(0, {args.host_cpu})
        host_uvloop = install_uvloop()
        results = asyncio.run(measure(args, target))
    finally:
        target.stop()
    crc_repeats, crc_time = (1, 0.02) if args.quick else (max(args.repeat, 5), 0.1)
    crc_headers, crc_rows = crc_table(crc_repeats, crc_time)

    setup = (
        f"target on CPU {args.target_cpu} (uvloop {'on' if target.uvloop else 'off'}), host on "
        f"CPU {args.host_cpu} (uvloop {'on' if host_uvloop else 'off'}); 1 GiB memory "
        "namespace filled with random data; one I/O queue per connection, in-capsule 16 KiB; "
        f"each run measures {args.runtime:g} s per setting in {args.slices} slices (each after "
        f"{args.warmup:g} s warm-up), the three settings rotating slice by slice; cells are "
        f"medians of {args.repeat} runs, 'vs none' the median of the per-run ratios; 'other "
        "load' is the CPU time on the two benchmark CPUs used by neither host nor target"
    )
    crc_method = (
        f"CRC32C: median of {crc_repeats} timed loops of ~{crc_time:g} s per cell, the cells "
        f"interleaved, on CPU {args.host_cpu}; ns/call includes the Python call; "
        "GB/s = 10^9 bytes/s"
    )
    setup += f"; load average at end {R.load_line()}"
    headers, rows = io_table(results)
    print("\n".join(env))
    print(setup)
    print()
    print(R.text_table(headers, rows))
    print()
    print(crc_method)
    print(R.text_table(crc_headers, crc_rows))
    if output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in env),
                f"- setup: {setup}",
                "",
                R.markdown_table(headers, rows),
                "",
                "![IOPS and MB/s per digest setting](digests.png)",
                "",
                f"- {crc_method}",
                "",
                R.markdown_table(crc_headers, crc_rows),
            ]
        )
        R.write_results(Path(output), "NVMe/TCP digests", "benchmarks/digests.py", body)
        chart(
            results,
            Path(output).with_suffix(".png"),
            f"{env[0]}; medians of {args.repeat} runs; {env[1]}".replace("`", ""),
        )
        print(f"\nwrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
