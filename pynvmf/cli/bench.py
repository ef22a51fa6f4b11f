"""`pynvmf bench`: a fio-like load generator against a namespace of any NVMe/TCP target.

    pynvmf bench -a 10.0.0.1 -s 4420 --nqn NQN --rw randread --bs 4k --iodepth 32 \\
        --numjobs 2 --runtime 10 [--size 1G] [--rwmixread 70] [--verify] \\
        [--inline-data-size BYTES] [-o json] [--group-reporting] \\
        [--bwavgtime MS] [--iopsavgtime MS] [--status-interval S] [--write_bw_log NAME]
    pynvmf bench ... --rw copy --bs 64k --copy-ranges 4 --copy-mode offload|emulate|auto

This module is the command: its options, the connection, the report on stdout and the
exit status (docs/bench.md). The run and what goes beside it (progress line, status
reports, log files, Ctrl-C) are pynvmf.bench.run's; the jobs pynvmf.bench.jobs'; the
report's formats, fio's, pynvmf.bench.fio_report's and pynvmf.bench.fio_logs'.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from pynvmf.aio import uvloop_factory
from pynvmf.bench.fio_logs import DEFAULT_LOG_AVG_MSEC, LogNames
from pynvmf.bench.fio_report import fio_json, human_report, job_options
from pynvmf.bench.job_result import JobResult
from pynvmf.bench.jobs import AVG_TIME_MS, JobError, Plan
from pynvmf.bench.run import StatusReports, run_jobs
from pynvmf.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CommandError,
    active_namespace,
    connect_arguments,
    connection_options,
    error_text,
    host_identity,
    int_at_least,
    namespace_option,
    output_option,
    resolve_target,
    size,
)
from pynvmf.cli.failures import Attempt, connect_failure
from pynvmf.cli.identity import CommandIdentity
from pynvmf.host import NvmeError, connect
from pynvmf.spec.ports import NVME_TCP_PORT

BENCH_RW_MODES = ("randread", "randwrite", "read", "write", "randrw", "copy")
COPY_MODES = ("auto", "offload", "emulate")

# -- argument parsing --------------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number of seconds")
    return value


def _percent(text: str) -> int:
    value = int_at_least(0)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"{value} is not a percentage (0-100)")
    return value


def add_bench_command(subparsers: Any) -> None:
    """Register `bench` on the `pynvmf` parser."""
    p = subparsers.add_parser(
        "bench",
        help="fio-like load generator against a remote namespace",
        description="Keep --iodepth I/Os in flight on each of --numjobs I/O queues for "
        "--runtime seconds and report IOPS, bandwidth and latency like fio. The workload "
        "options are fio's, with fio's meaning and defaults unless said otherwise.",
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    namespace_option(p)
    output_option(p)
    p.add_argument("--rw", choices=BENCH_RW_MODES, default="randread", help="I/O pattern")
    p.add_argument("--bs", type=size(), default=4096, metavar="SIZE", help="block size")
    p.add_argument(
        "--iodepth", type=int_at_least(1), default=1, metavar="N", help="I/Os in flight per job"
    )
    p.add_argument(
        "--numjobs", type=int_at_least(1), default=1, metavar="N", help="jobs (one I/O queue each)"
    )
    p.add_argument(
        "--runtime", type=_seconds, default=10.0, metavar="SECONDS", help="measured time"
    )
    p.add_argument(
        "--ramp-time", type=_seconds, default=0.0, metavar="SECONDS", help="unmeasured warm-up"
    )
    p.add_argument(
        "--size",
        type=size(),
        metavar="SIZE",
        help="region size (default: to the end of the namespace)",
    )
    p.add_argument("--offset", type=size(0), default=0, metavar="SIZE", help="region start")
    p.add_argument(
        "--rwmixread", type=_percent, default=50, metavar="PCT", help="reads in percent (randrw)"
    )
    p.add_argument("--verify", action="store_true", help="write patterns and check every read")
    p.add_argument(
        "--inline-data-size",
        type=int_at_least(0),
        metavar="BYTES",
        help="most write data the host sends in-capsule (default: what the target's IOCCSZ allows)",
    )
    p.add_argument(
        "--copy-ranges",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="source ranges of --bs each per copy (--rw copy)",
    )
    p.add_argument(
        "--copy-mode",
        choices=COPY_MODES,
        default="auto",
        help="offload: NVMe Copy; emulate: read and write through this host; auto: as the "
        "copy planner decides (--rw copy)",
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed of the offsets and patterns"
    )
    p.add_argument(
        "--group-reporting", action="store_true", help="report all jobs as one, as fio's"
    )
    for option, what in (("--bwavgtime", "bandwidth"), ("--iopsavgtime", "IOPS")):
        p.add_argument(
            option,
            type=int_at_least(1),
            default=AVG_TIME_MS,
            metavar="MS",
            help=f"{what} sampling interval",
        )
    p.add_argument(
        "--status-interval",
        type=_seconds,
        metavar="SECONDS",
        help="print the report so far every SECONDS, as fio's (the figures since the "
        "measurement started; no per-interval bw/iops lines until the end)",
    )
    for kind, what in (("bw", "bandwidth"), ("iops", "IOPS"), ("lat", "latency")):
        p.add_argument(
            f"--write_{kind}_log",
            f"--write-{kind}-log",
            metavar="NAME",
            help=f"log the {what} of each --log_avg_msec window to NAME_{kind}.N.log"
            + (" and NAME_clat.N.log" if kind == "lat" else "")
            + ", fio's format (pynvmf.bench.fio_logs)",
        )
    p.add_argument(
        "--log_avg_msec",
        "--log-avg-msec",
        type=int_at_least(1),
        default=DEFAULT_LOG_AVG_MSEC,
        metavar="MS",
        help="the window of the --write_*_log lines (fio's default, 0: every I/O, is not offered)",
    )


def run_bench_command(args: argparse.Namespace) -> int:
    """Run `pynvmf bench`; the exit status (1 for any failure, verify included; 130 when
    interrupted, with or without a report)."""
    try:
        identity = host_identity(args)
        with asyncio.Runner(loop_factory=uvloop_factory()) as runner:
            return runner.run(_bench(args, identity, sys.stdout, sys.stderr))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (CommandError, JobError, NvmeError, OSError, ValueError) as exc:
        print(f"pynvmf bench: {error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE


# -- running -----------------------------------------------------------------------------------


def _plan(args: argparse.Namespace) -> Plan:
    if args.runtime <= 0:
        raise CommandError("--runtime must be positive")
    if args.rw == "copy" and args.verify:
        raise CommandError("--verify is not supported with --rw copy")
    if args.rw != "copy" and (args.copy_ranges != 1 or args.copy_mode != "auto"):
        raise CommandError("--copy-ranges and --copy-mode apply to --rw copy only")
    return Plan(
        rw=args.rw,
        bs=args.bs,
        iodepth=args.iodepth,
        runtime=args.runtime,
        ramp_time=args.ramp_time,
        rwmixread=args.rwmixread,
        offset=args.offset,
        size=args.size,
        seed=args.seed,
        copy_ranges=args.copy_ranges,
        copy_mode=args.copy_mode,
        verify=args.verify,
        bw_avg_time=args.bwavgtime / 1000,
        iops_avg_time=args.iopsavgtime / 1000,
    )


async def _bench(
    args: argparse.Namespace, identity: CommandIdentity, out: TextIO, err: TextIO
) -> int:
    resolve_target(args)
    plan = _plan(args)
    depth = plan.iodepth * (plan.copy_ranges + 1 if plan.rw == "copy" else 1)
    try:
        ctrl = await connect(
            args.traddr,
            args.trsvcid,
            args.nqn,
            queues=args.numjobs,
            queue_depth=depth,
            trtype=args.transport,
            **connect_arguments(args, identity),
        )
    except NvmeError as exc:
        raise connect_failure(
            Attempt(args.traddr, args.trsvcid, identity, args.transport), exc
        ) from exc
    render = _renderer(args, plan)
    async with ctrl:
        ns = active_namespace(ctrl, args)
        if args.inline_data_size is not None:
            ctrl.limit_inline_data(args.inline_data_size)
        if len(ctrl.io_queues) < args.numjobs:
            print(
                f"pynvmf bench: the target granted {len(ctrl.io_queues)} I/O queues for "
                f"{args.numjobs} jobs; jobs share them",
                file=err,
            )
        status = StatusReports(args.status_interval, render, out) if args.status_interval else None
        outcome = await run_jobs(
            ctrl,
            ns,
            plan,
            args.numjobs,
            err=err,
            progress=err.isatty(),
            status=status,
            logs=LogNames(args.write_bw_log, args.write_iops_log, args.write_lat_log),
            log_avg_msec=args.log_avg_msec,
        )
    out.write(render(outcome.results))
    failed = [r for r in outcome.results if r.error]
    if failed:
        print(f"pynvmf bench: {failed[0].name}: {failed[0].error}", file=err)
        return EXIT_FAILURE
    return EXIT_INTERRUPTED if outcome.interrupted else 0


def _renderer(args: argparse.Namespace, plan: Plan) -> Callable[[Sequence[JobResult]], str]:
    """The report as -o asks, of the final figures or of --status-interval's."""
    if args.output_format != "json":
        return functools.partial(human_report, plan=plan)
    options = job_options(args)

    def render(results: Sequence[JobResult]) -> str:
        return json.dumps(fio_json(results, options, group=args.group_reporting), indent=2) + "\n"

    return render
