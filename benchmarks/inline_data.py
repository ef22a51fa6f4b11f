"""In-capsule data: a target offering 16 KiB of in-capsule data versus one offering 4 KiB.

Two targets run in child processes pinned to the same CPU (--target-cpu), each
with a 1 GiB memory namespace filled with random data, identical but for the
in-capsule size (IOCCSZ) they advertise; this process, pinned to another CPU,
holds one connection to each. The host library puts a write's data in the
command capsule when it fits the target's in-capsule size and otherwise waits
for an R2T, so against the 4 KiB target writes of 8 KiB and more take the extra
round trip. For each block size and workload (random write, and a 70/30
random read/write mix), at queue depth 32, both targets are measured in turn:
each run gives each target --runtime seconds in --slices slices (each after
--warmup seconds), alternating slice by slice and starting with the other
target from row to row and repeat to repeat, so that noise from the rest of the
machine falls on both sides alike. Each cell is the median of --repeat runs.

    python3 benchmarks/inline_data.py [--runtime 3] [--repeat 3] [--quick]

A full run rewrites the results section of docs/inline-data.md and draws
docs/inline-data.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from pynvmf.aio import install_uvloop
from pynvmf.bench import (
    BenchResult,
    ConnectOptions,
    Workload,
    busy_cpu_seconds,
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
from pynvmf.tcp.target import TransportConfig

KiB = 1024
GiB = 1024**3
BLOCK_SIZES = (512, 1 * KiB, 2 * KiB, 4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB)
INLINE_SIZES = (16 * KiB, 4 * KiB)  # the side of interest first: ratios are first / second
QD = 32
MIXES = (("randwrite", 0), ("randrw", 70))

Row = tuple[str, int, int]  # (rw, rwmixread, block size)
# results[row][in-capsule size]: one (result, R2Ts the host received) per repeat
Results = dict[Row, dict[int, list[tuple[BenchResult, int]]]]


@dataclass
class Side:
    inline: int
    target: TargetProcess
    ns: RemoteNamespace | None = None

    @property
    def label(self) -> str:
        return f"{self.inline // KiB} KiB"

    def r2t_received(self) -> int:
        assert self.ns is not None
        return sum(q.conn.stats.r2t_received for q in self.ns.controller.io_queues)


def row_label(rw: str, mix: int) -> str:
    return "random write" if rw == "randwrite" else f"random {mix}/{100 - mix} read/write"


async def measure(args: argparse.Namespace, sides: list[Side]) -> Results:
    results: Results = {}
    rows = [(rw, mix, bs) for rw, mix in MIXES for bs in BLOCK_SIZES]
    cpus = {args.target_cpu, args.host_cpu}
    async with contextlib.AsyncExitStack() as stack:
        for side in sides:
            side.ns = await stack.enter_async_context(
                remote_namespace(
                    "127.0.0.1",
                    side.target.port,
                    side.target.nqn,
                    options=ConnectOptions(),
                    iodepth=QD,
                )
            )
        namespaces = [side.ns for side in sides if side.ns is not None]
        for repeat in range(args.repeat):
            for n, (rw, mix, bs) in enumerate(rows):
                w = Workload(
                    rw, bs, QD, rwmixread=mix, runtime=args.runtime, ramp_time=args.warmup, seed=n
                )
                r2t0 = [side.r2t_received() for side in sides]
                merged = await run_interleaved(
                    namespaces,
                    w,
                    slices=args.slices,
                    first=n + repeat,
                    target_cpu_clocks=[side.target.cpu_seconds for side in sides],
                    system_cpu_clock=lambda: busy_cpu_seconds(cpus),
                )
                for side, res, before in zip(sides, merged, r2t0, strict=True):
                    if res.error:
                        raise SystemExit(f"{w.describe()} against {side.label}: {res.error}")
                    r2ts = side.r2t_received() - before
                    results.setdefault((rw, mix, bs), {}).setdefault(side.inline, []).append(
                        (res, r2ts)
                    )
                    lat = res.total.latency
                    print(
                        f"run {repeat + 1}/{args.repeat} {w.describe():<22} in-capsule "
                        f"{side.label:>6}: {res.iops:>8.0f} IOPS {lat.mean_us:>7.1f} us mean "
                        f"{lat.p99_us:>7.1f} us p99, R2Ts {r2ts}, other load "
                        f"{res.other_cpu or 0:.2f} CPU",
                        file=sys.stderr,
                    )
    return results


def paired_ratio(a: list[BenchResult], b: list[BenchResult], metric: str) -> float:
    """Median over repeats of a/b, each repeat's two sides measured together."""
    values = [
        getattr(x.total.latency, metric) / getattr(y.total.latency, metric)
        if metric.endswith("_us")
        else getattr(x, metric) / getattr(y, metric)
        for x, y in zip(a, b, strict=True)
    ]
    return statistics.median(values)


def tables(results: Results) -> tuple[list[str], list[list[str]]]:
    a, b = INLINE_SIZES
    la, lb = R.size_label(a), R.size_label(b)
    headers = [
        "workload (QD32)",
        "block",
        f"IOPS {la}",
        f"IOPS {lb}",
        f"IOPS {la}/{lb}",
        f"mean µs {la}",
        f"mean µs {lb}",
        f"mean {la}/{lb}",
        f"p99 µs {la}",
        f"p99 µs {lb}",
        f"writes via R2T {la} / {lb}",
        "other load (CPUs)",
    ]
    rows = []
    for (rw, mix, bs), by_side in results.items():
        ra = [r for r, _ in by_side[a]]
        rb = [r for r, _ in by_side[b]]
        sa, sb = summarize(ra), summarize(rb)
        r2t = ["yes" if any(n for _, n in by_side[s]) else "no" for s in (a, b)]
        others = [r.other_cpu for r in ra + rb if r.other_cpu is not None]
        rows.append(
            [
                row_label(rw, mix),
                R.size_label(bs),
                f"{sa.iops:,.0f}",
                f"{sb.iops:,.0f}",
                f"{paired_ratio(ra, rb, 'iops'):.2f}",
                f"{sa.mean_us:.0f}",
                f"{sb.mean_us:.0f}",
                f"{paired_ratio(ra, rb, 'mean_us'):.2f}",
                f"{sa.p99_us:.0f}",
                f"{sb.p99_us:.0f}",
                " / ".join(r2t),
                f"{statistics.median(others):.2f}" if others else "-",
            ]
        )
    return headers, rows


def chart(results: Results, path: Path, caption: str) -> None:
    """IOPS (top) and mean latency (bottom) per block size, one column per workload."""
    plt = plot.pyplot()
    a, b = INLINE_SIZES
    mixes = list(dict.fromkeys((rw, mix) for rw, mix, _ in results))
    fig, axes = plt.subplots(2, len(mixes), figsize=(7 * len(mixes), 9), squeeze=False)
    for col, (rw, mix) in enumerate(mixes):
        rows = [(bs, by_side) for (r, m, bs), by_side in results.items() if (r, m) == (rw, mix)]
        sizes = [R.size_label(bs) for bs, _ in rows]
        sides = {
            side: [summarize([res for res, _ in by_side[side]]) for _, by_side in rows]
            for side in (a, b)
        }
        names = {side: f"in-capsule {R.size_label(side)}" for side in (a, b)}
        iops_ratio = [
            paired_ratio([r for r, _ in s[a]], [r for r, _ in s[b]], "iops") for _, s in rows
        ]
        lat_ratio = [
            paired_ratio([r for r, _ in s[a]], [r for r, _ in s[b]], "mean_us") for _, s in rows
        ]
        plot.grouped_bars(
            axes[0][col],
            sizes,
            {names[side]: [x.iops / 1000 for x in sides[side]] for side in (a, b)},
            ylabel="kIOPS",
            title=f"{row_label(rw, mix)}, QD{QD}: IOPS",
            value_label=lambda v: f"{v:.0f}",
            group_notes=[f"{r:.2f}x" for r in iops_ratio],
        )
        plot.grouped_bars(
            axes[1][col],
            sizes,
            {names[side]: [x.mean_us for x in sides[side]] for side in (a, b)},
            ylabel="mean latency (µs)",
            title=f"{row_label(rw, mix)}, QD{QD}: mean latency",
            value_label=lambda v: f"{v:.0f}",
            group_notes=[f"{r:.2f}x" for r in lat_ratio],
        )
    plot.save(
        fig,
        path,
        caption,
        title=f"pynvmf target with {R.size_label(a)} vs {R.size_label(b)} of in-capsule data"
        " (ratios: first / second)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_interleaved_options(parser, "the targets alternating", "docs/inline-data.md")
    args = parser.parse_args()
    output = resolve_interleaved_options(parser, args)

    env = R.environment_lines()
    sides: list[Side] = []
    try:
        for inline in INLINE_SIZES:
            target = start_target(
                cpu=args.target_cpu,
                size=1 * GiB,
                transport=TransportConfig(inline_data_size=inline),
                fill=True,
            )
            sides.append(Side(inline, target))
        os.sched_setaffinity(0, {args.host_cpu})
        host_uvloop = install_uvloop()
        results = asyncio.run(measure(args, sides))
    finally:
        for side in sides:
            side.target.stop()

    setup = (
        f"targets on CPU {args.target_cpu} (uvloop {'on' if sides[0].target.uvloop else 'off'}), "
        f"host on CPU {args.host_cpu} (uvloop {'on' if host_uvloop else 'off'}); "
        "1 GiB memory namespace (512 B blocks) filled with random data; one I/O queue, "
        f"QD{QD}, no digests; each run measures {args.runtime:g} s per target in "
        f"{args.slices} slices (each after {args.warmup:g} s warm-up), the two targets "
        f"alternating slice by slice; cells are medians of {args.repeat} runs, ratios the "
        "median of the per-run ratios; 'other load' is the CPU time on the two benchmark "
        "CPUs used by neither the host nor the targets (other work on the machine)"
    )
    setup += f"; load average at end {R.load_line()}"
    headers, rows = tables(results)
    print("\n".join(env))
    print(setup)
    print()
    print(R.text_table(headers, rows))
    if output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in env),
                f"- setup: {setup}",
                "",
                R.markdown_table(headers, rows),
                "",
                "![IOPS and latency per block size](inline-data.png)",
            ]
        )
        R.write_results(
            Path(output), "In-capsule data: 16 KiB vs 4 KiB", "benchmarks/inline_data.py", body
        )
        chart(
            results,
            Path(output).with_suffix(".png"),
            f"{env[0]}; medians of {args.repeat} runs; {env[1]}".replace("`", ""),
        )
        print(f"\nwrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
