"""`pynvmf bench`'s report in fio's shapes: fio 3.x's JSON (`--output-format json`) and its
human-readable text.

Results are per job (fio's default) or one entry with --group-reporting (fio's semantics:
I/Os and bandwidth add up, the runtime is the longest job's); the human report always
ends with the "all jobs" entry. Copy mode (--rw copy) reports its copies in the write
direction (bw: bytes copied, iops: copies) and what the copy planner did.

The JSON follows the key names of fio 3.x's JSON output for what it reports; lat_ns and
clat_ns are the same figure (submission to completion as the host library's caller sees
it, there is no separate submission latency), and stddev is computed from the latency
histogram, so it is approximate like the percentiles (within half a bucket, 0.4%). The
cpu figures (usr_cpu, sys_cpu, ctx, majf, minf) are the whole process's over each job's
measured time: all jobs run in one thread, so every job reports (nearly) the same
process-wide usage.

Bandwidth and IOPS are sampled per job every --bwavgtime / --iopsavgtime ms (500, fio's
default) of the measured time (pynvmf.bench.loadgen.RateSampler) and reported per
direction as fio does: in JSON bw_min, bw_max, bw_agg (the job's mean bandwidth in
percent of the group's aggregate bandwidth, at most 100), bw_mean, bw_dev, bw_samples
(KiB/s), iops_min, iops_max, iops_mean, iops_stddev, iops_samples; in the human report
the `   bw (  KiB/s):` and `   iops        :` lines after the latency lines (none for a
direction without samples; MiB/s above 1 GiB/s). As fio's: a sample is what completed
since the previous one over the time actually elapsed, truncated to a whole number; an
interval in which a direction completed nothing gives that direction no sample (a stall
shows as fewer samples, not as a zero); standard deviations divide by n - 1; a run
shorter than one interval has no samples and reports zeros; and the group entry
(--group-reporting, and the human report's "all jobs") adds the jobs' statistics up: its
mean is the group's, but its min and max are the sums of the jobs' minima and maxima and
its samples the jobs' total, fio's arithmetic rather than a sum per interval. What
differs from fio: samples fall on a grid from the start of the measurement, taken by the
coroutine that waits for its end, so they all lie wholly within it (the ramp and the
last, unfinished interval give none) and a run stopped by Ctrl-C keeps the whole
intervals it measured.

--status-interval's reports (pynvmf.bench.run) are these reports of the figures so far,
from each job's live histograms (loadgen.Measurement): without the per-interval bw/iops
lines, which only come with the final report.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from pynvmf import __version__
from pynvmf.bench.job_result import JobResult, aggregate, stddev_ns
from pynvmf.bench.jobs import AVG_TIME_MS, Plan
from pynvmf.bench.loadgen import (
    PERCENTILES,
    CpuUsage,
    LatencyHistogram,
    LatencyStats,
    SampleStats,
)

FIO_VERSION = f"pynvmf-bench {__version__}"


# fio's error field is an errno: EILSEQ for a verify failure, EIO for anything else.
_EILSEQ = 84


_EIO = 5


def job_options(args: argparse.Namespace) -> dict[str, str]:
    """fio's "job options": the options as given, all strings."""
    options = {
        "rw": args.rw,
        "bs": str(args.bs),
        "iodepth": str(args.iodepth),
        "numjobs": str(args.numjobs),
        "runtime": f"{args.runtime:g}",
        "ramp_time": f"{args.ramp_time:g}",
        "offset": str(args.offset),
        "rwmixread": str(args.rwmixread),
        "randseed": str(args.seed),
        "ioengine": "pynvmf-tcp",
        "filename": f"nvme-tcp://{args.traddr}:{args.trsvcid}/{args.nqn}/{args.namespace_id}",
    }
    if args.size is not None:
        options["size"] = str(args.size)
    if args.verify:
        options["verify"] = "pattern"
    if args.rw == "copy":
        options["copy_ranges"] = str(args.copy_ranges)
        options["copy_mode"] = args.copy_mode
    for name in ("bwavgtime", "iopsavgtime"):
        if getattr(args, name) != AVG_TIME_MS:
            options[name] = str(getattr(args, name))
    return options


def _lat_json(hist: LatencyHistogram, *, with_percentiles: bool = True) -> dict[str, Any]:
    n = hist.count
    if not n:
        out: dict[str, Any] = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
    else:
        out = {
            "min": hist.min_ns,
            "max": hist.max_ns,
            "mean": hist.total_ns / n,
            "stddev": stddev_ns(hist),
            "N": n,
        }
    if with_percentiles and n:
        values = hist.percentiles(PERCENTILES)
        out["percentile"] = {f"{q:f}": round(v) for q, v in zip(PERCENTILES, values, strict=True)}
    return out


_EMPTY_LAT = {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}


def group_bandwidth(results: Sequence[JobResult], which: str) -> float:
    """fio's aggregate bandwidth of a group in `which` direction (bytes/s): all its jobs'
    bytes over the longest runtime of those that moved any."""
    ops = [(r.op(which), r.elapsed) for r in results]
    longest = max((elapsed for op, elapsed in ops if op.ios), default=0.0)
    return sum(op.bytes for op, _ in ops) / longest if longest > 0 else 0.0


def bw_share(bw: SampleStats, group_bytes_per_s: float) -> float:
    """fio's bw_agg (the human report's per=): a job's mean sampled bandwidth in percent
    of its group's aggregate bandwidth, at most 100; 0 without samples."""
    if not bw.samples:
        return 0.0
    if group_bytes_per_s <= 1024:  # fio's threshold: no meaningful share of (next to) nothing
        return 100.0
    return min(100.0, bw.mean * 100 / (group_bytes_per_s / 1024))


def _rates_json(bw: SampleStats, iops: SampleStats, group_bytes_per_s: float) -> dict[str, Any]:
    return {
        "bw_min": bw.min_val,
        "bw_max": bw.max_val,
        "bw_agg": bw_share(bw, group_bytes_per_s),
        "bw_mean": float(bw.mean),
        "bw_dev": bw.stddev,
        "bw_samples": bw.samples,
        "iops_min": iops.min_val,
        "iops_max": iops.max_val,
        "iops_mean": float(iops.mean),
        "iops_stddev": iops.stddev,
        "iops_samples": iops.samples,
    }


def _dir_json(r: JobResult, which: str, group_bytes_per_s: float) -> dict[str, Any]:
    op = r.op(which)
    hist = r.read_hist if which == "read" else r.write_hist
    bw_bytes = op.bytes / r.elapsed if r.elapsed else 0.0
    lat = _lat_json(hist)
    return {
        "io_bytes": op.bytes,
        "io_kbytes": op.bytes // 1024,
        "bw_bytes": round(bw_bytes),
        "bw": round(bw_bytes / 1024),
        "iops": op.iops,
        "runtime": round(r.elapsed * 1000) if op.ios else 0,
        "total_ios": op.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": dict(_EMPTY_LAT),
        "clat_ns": lat,
        "lat_ns": dict(lat),
        **_rates_json(*r.rates(which), group_bytes_per_s),
    }


def _empty_dir() -> dict[str, Any]:
    return {
        "io_bytes": 0,
        "io_kbytes": 0,
        "bw_bytes": 0,
        "bw": 0,
        "iops": 0.0,
        "runtime": 0,
        "total_ios": 0,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": dict(_EMPTY_LAT),
        "clat_ns": dict(_EMPTY_LAT),
        "lat_ns": dict(_EMPTY_LAT),
        **_rates_json(SampleStats(), SampleStats(), 0.0),
    }


def _job_json(r: JobResult, options: dict[str, str], group_bw: dict[str, float]) -> dict[str, Any]:
    error = 0 if r.error is None else (_EILSEQ if r.verify_failed else _EIO)
    job: dict[str, Any] = {
        "jobname": r.name,
        "groupid": 0,
        "error": error,
        "elapsed": round(r.elapsed),
        "job options": {"name": r.name, **options},
        "read": _dir_json(r, "read", group_bw["read"]),
        "write": _dir_json(r, "write", group_bw["write"]),
        "trim": _empty_dir(),
        "job_runtime": round(r.elapsed * 1000),
        "usr_cpu": r.cpu.usr_percent,
        "sys_cpu": r.cpu.sys_percent,
        "ctx": r.cpu.ctx,
        "majf": r.cpu.majf,
        "minf": r.cpu.minf,
    }
    if r.error is not None:
        job["pynvmf_error"] = r.error
    if r.copy is not None:
        c = r.copy
        elapsed = r.elapsed or 1e-9
        job["pynvmf_copy"] = {
            "copies": c.copies,
            "copies_per_sec": c.copies / elapsed,
            "copied_bytes": c.copied_bytes,
            "copied_bytes_per_sec": c.copied_bytes / elapsed,
            "offloaded_blocks": c.offloaded_blocks,
            "emulated_blocks": c.emulated_blocks,
            "copy_commands": c.commands,
            "wire_bytes_sent": c.wire_sent,
            "wire_bytes_received": c.wire_received,
        }
    return job


def fio_json(
    results: Sequence[JobResult], options: dict[str, str], *, group: bool
) -> dict[str, Any]:
    now = time.time()
    jobs = [aggregate(results)] if group else list(results)
    # All jobs form fio's group 0, reported jointly or not.
    group_bw = {which: group_bandwidth(results, which) for which in ("read", "write")}
    return {
        "fio version": FIO_VERSION,
        "timestamp": int(now),
        "timestamp_ms": int(now * 1000),
        "time": time.ctime(now),
        "jobs": [_job_json(r, options, group_bw) for r in jobs],
    }


def _num(value: float) -> str:
    """fio's short counts: 950, 12.3k, 1.23M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def _binary(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def _decimal(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f}{unit}"
    return f"{nbytes:.0f}B"


def _lat_lines(stats: LatencyStats, hist: LatencyHistogram) -> list[str]:
    return [
        f"    lat (usec): min={stats.min_us:.2f}, max={stats.max_us:.2f}, "
        f"avg={stats.mean_us:.2f}, stdev={stddev_ns(hist) / 1e3:.2f}",
        f"    lat percentiles (usec): 50.00th=[{stats.p50_us:.1f}], "
        f"90.00th=[{stats.p90_us:.1f}], 99.00th=[{stats.p99_us:.1f}], "
        f"99.90th=[{stats.p999_us:.1f}]",
    ]


def rate_lines(bw: SampleStats, iops: SampleStats, share: float) -> list[str]:
    """fio's per-interval lines of one direction; none for a statistic without samples."""
    lines = []
    if bw.samples:
        # fio switches to MiB/s above 1 GiB/s, min and max truncated to whole MiB/s.
        unit, scale = ("MiB", 1024) if bw.mean > 1024 * 1024 else ("KiB", 1)
        lines.append(
            f"   bw ({unit:>5}/s): min={bw.min_val // scale:5d}, max={bw.max_val // scale:5d}, "
            f"per={share:3.2f}%, avg={bw.mean / scale:5.2f}, stdev={bw.stddev / scale:5.2f}, "
            f"samples={bw.samples}"
        )
    if iops.samples:
        lines.append(
            f"   iops        : min={iops.min_val:5d}, max={iops.max_val:5d}, "
            f"avg={iops.mean:5.2f}, stdev={iops.stddev:5.2f}, samples={iops.samples}"
        )
    return lines


def _cpu_line(cpu: CpuUsage) -> str:
    return (
        f"  cpu          : usr={cpu.usr_percent:.2f}%, sys={cpu.sys_percent:.2f}%, "
        f"ctx={cpu.ctx}, majf={cpu.majf}, minf={cpu.minf}"
    )


def _job_block(r: JobResult, plan: Plan, jobs: int, group_bw: dict[str, float]) -> list[str]:
    lines = _io_lines(r, plan, jobs, group_bw)
    lines.append(_cpu_line(r.cpu))
    return lines


def _io_lines(r: JobResult, plan: Plan, jobs: int, group_bw: dict[str, float]) -> list[str]:
    err = 0 if r.error is None else (_EILSEQ if r.verify_failed else _EIO)
    lines = [f"{r.name}: (groupid=0, jobs={jobs}): err={err:2d}"]
    ms = round(r.elapsed * 1000)
    if r.copy is not None:
        c = r.copy
        per_s = c.copied_bytes / r.elapsed if r.elapsed else 0.0
        rate = c.copies / r.elapsed if r.elapsed else 0.0
        lines.append(
            f"  copy: copies/s={_num(rate)}, BW={_binary(per_s)}/s ({_decimal(per_s)}/s)"
            f"({_binary(c.copied_bytes)}/{ms}msec), {plan.copy_ranges} x {_binary(plan.bs)} "
            f"per copy, mode={plan.copy_mode}"
        )
        lines.extend(_lat_lines(r.write_hist.stats(), r.write_hist))
        bw, iops = r.rates("write")
        lines.extend(rate_lines(bw, iops, bw_share(bw, group_bw["write"])))
        wire = c.wire_sent + c.wire_received
        share = wire / c.copied_bytes * 100 if c.copied_bytes else 0.0
        lines.append(
            f"    planner: offloaded={c.offloaded_blocks} blocks in {c.commands} Copy commands,"
            f" emulated={c.emulated_blocks} blocks"
        )
        lines.append(
            f"    wire: sent={_binary(c.wire_sent)}, received={_binary(c.wire_received)} "
            f"({share:.2f}% of the bytes copied)"
        )
        return lines
    for which, hist in (("read", r.read_hist), ("write", r.write_hist)):
        op = r.op(which)
        if not op.ios:
            continue
        bw = op.bytes / r.elapsed if r.elapsed else 0.0
        lines.append(
            f"  {which}: IOPS={_num(op.iops)}, BW={_binary(bw)}/s ({_decimal(bw)}/s)"
            f"({_binary(op.bytes)}/{ms}msec)"
        )
        lines.extend(_lat_lines(op.latency, hist))
        bw, iops = r.rates(which)
        lines.extend(rate_lines(bw, iops, bw_share(bw, group_bw[which])))
    return lines


def human_report(results: Sequence[JobResult], plan: Plan) -> str:
    lines: list[str] = []
    total = aggregate(results)
    group_bw = {which: group_bandwidth(results, which) for which in ("read", "write")}
    if len(results) > 1:
        for r in results:
            lines.extend(_job_block(r, plan, 1, group_bw))
        lines.append("")
    block = _job_block(total, plan, len(results), group_bw)
    block[0] = block[0].replace(total.name, "all jobs", 1)
    lines.extend(block)
    lines.append("")
    lines.append("Run status group 0 (all jobs):")
    ms = round(total.elapsed * 1000)
    write_label = "COPY" if total.copy is not None else "WRITE"
    for which, label in (("read", "READ"), ("write", write_label)):
        op = total.op(which)
        if not op.ios:
            continue
        bw = op.bytes / total.elapsed if total.elapsed else 0.0
        lines.append(
            f"  {label:>5}: bw={_binary(bw)}/s ({_decimal(bw)}/s), io={_binary(op.bytes)} "
            f"({_decimal(op.bytes)}), run={ms}-{ms}msec"
        )
    return "\n".join(lines) + "\n"
