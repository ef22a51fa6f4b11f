"""`pynvmf bench`: a fio-like load generator against a namespace of any NVMe/TCP target.

    pynvmf bench -a 10.0.0.1 -s 4420 --nqn NQN --rw randread --bs 4k --iodepth 32 \\
        --numjobs 2 --runtime 10 [--size 1G] [--rwmixread 70] [--verify] \\
        [--inline-data-size BYTES] [-o json] [--group-reporting] \\
        [--bwavgtime MS] [--iopsavgtime MS]
    pynvmf bench ... --rw copy --bs 64k --copy-ranges 4 --copy-mode offload|emulate|auto

Each of the `--numjobs` jobs owns one I/O queue of the connection and keeps
`--iodepth` I/Os in flight on it; the jobs run concurrently in one event loop and
their results are reported per job (fio's default) or as one entry with
`--group-reporting` (fio's semantics: I/Os and bandwidth add up, the runtime is
the longest job's). Read/write workloads run on the load generator engine
(pynvmf.bench.loadgen); `--rw copy` issues copies through the copy planner
(pynvmf.block.copy), one copy of `--copy-ranges` ranges of `--bs` each per I/O. This
module is the command (its options, the run, progress and Ctrl-C); the jobs and the
report are pynvmf.bench's (jobs, job_device, verify, job_result, fio_report).

`--output-format json` follows the key names of fio 3.x's JSON output for what
it reports; lat_ns and clat_ns are the same figure (submission to completion as
the host library's caller sees it, there is no separate submission latency), and
stddev is computed from the latency histogram, so it is approximate like the
percentiles (within half a bucket, 0.4%). The cpu figures (usr_cpu, sys_cpu, ctx,
majf, minf) are the whole process's over each job's measured time: all jobs run in
one thread, so every job reports (nearly) the same process-wide usage.

Bandwidth and IOPS are sampled per job every --bwavgtime / --iopsavgtime ms (500,
fio's default) of the measured time and reported per direction as fio does: in JSON
bw_min, bw_max, bw_agg (the job's mean bandwidth in percent of the group's aggregate
bandwidth, at most 100), bw_mean, bw_dev, bw_samples (KiB/s), iops_min, iops_max,
iops_mean, iops_stddev, iops_samples; in the human report the `   bw (  KiB/s):` and
`   iops        :` lines after the latency lines (none for a direction without
samples; MiB/s above 1 GiB/s). As fio's: a sample is what completed since the
previous one over the time actually elapsed, truncated to a whole number; an
interval in which a direction completed nothing gives that direction no sample (a
stall shows as fewer samples, not as a zero); standard deviations divide by n - 1;
a run shorter than one interval has no samples and reports zeros; and the group
entry (--group-reporting, and the human report's "all jobs") adds the jobs'
statistics up: its mean is the group's, but its min and max are the sums of the
jobs' minima and maxima and its samples the jobs' total, fio's arithmetic rather
than a sum per interval. What differs from fio: samples fall on a grid from the
start of the measurement, taken by the coroutine that waits for its end, so they
all lie wholly within it (the ramp and the last, unfinished interval give none) and
a run stopped by Ctrl-C keeps the whole intervals it measured; copy mode samples
its copies in the write direction (bw: bytes copied, iops: copies), as it reports
them.

Ctrl-C during the measurement stops the jobs as the end of --runtime does and
reports the time measured so far (exit status 130); a second Ctrl-C aborts at once.

On a terminal, stderr shows a progress line: the percentage of --ramp-time + --runtime
gone, the time left, and the IOPS and MB/s of the last quarter second.
--status-interval prints the report so far, as fio's, from each job's live histograms
(loadgen.Measurement; the per-interval bw/iops lines only come with the final report).
--write_bw_log, --write_iops_log and --write_lat_log write fio's log files
(pynvmf.bench.fio_logs).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, TextIO

from pynvmf.aio import uvloop_factory
from pynvmf.bench.fio_logs import DEFAULT_LOG_AVG_MSEC, IntervalLogs, LogNames
from pynvmf.bench.fio_report import fio_json, human_report, job_options
from pynvmf.bench.job_device import Counter, JobDevice, job_namespace
from pynvmf.bench.job_result import JobResult
from pynvmf.bench.jobs import (
    AVG_TIME_MS,
    JobError,
    Plan,
    copy_job,
    prefill,
    region,
    rw_job,
    set_inline_limit,
    snapshot,
)
from pynvmf.bench.loadgen import (
    Measurement,
    describe,
)
from pynvmf.bench.verify import Verifier
from pynvmf.block.device import BlockDevice
from pynvmf.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CommandError,
    active_namespace,
    connect_arguments,
    connection_options,
    host_identity,
    int_at_least,
    namespace_option,
    output_option,
    size,
)
from pynvmf.cli.failures import Attempt, connect_failure
from pynvmf.cli.identity import CommandIdentity
from pynvmf.host import NvmeError, connect
from pynvmf.spec.ports import NVME_TCP_PORT

BENCH_RW_MODES = ("randread", "randwrite", "read", "write", "randrw", "copy")
COPY_MODES = ("auto", "offload", "emulate")
_PROGRESS_INTERVAL = 0.25  # at most 4 refreshes a second

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
    p.add_argument(
        "--bwavgtime",
        type=int_at_least(1),
        default=AVG_TIME_MS,
        metavar="MS",
        help="bandwidth sampling interval",
    )
    p.add_argument(
        "--iopsavgtime",
        type=int_at_least(1),
        default=AVG_TIME_MS,
        metavar="MS",
        help="IOPS sampling interval",
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
    except OSError as exc:
        print(f"pynvmf bench: {_os_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except (CommandError, JobError, NvmeError, ValueError) as exc:
        print(f"pynvmf bench: {describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _os_error_text(exc: OSError) -> str:
    if exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"  # not "[Errno 2] ..." with a repr
    return describe(exc)


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
    plan = _plan(args)
    depth = plan.iodepth * (plan.copy_ranges + 1 if plan.rw == "copy" else 1)
    try:
        ctrl = await connect(
            args.traddr,
            args.trsvcid,
            args.nqn,
            queues=args.numjobs,
            queue_depth=depth,
            **connect_arguments(args, identity),
        )
    except NvmeError as exc:
        raise connect_failure(Attempt(args.traddr, args.trsvcid, identity), exc) from exc
    async with ctrl:
        ns = active_namespace(ctrl, args)
        if args.inline_data_size is not None:
            set_inline_limit(ctrl, args.inline_data_size)
        queues = ctrl.io_queues
        if len(queues) < args.numjobs:
            print(
                f"pynvmf bench: the target granted {len(queues)} I/O queues for "
                f"{args.numjobs} jobs; jobs share them",
                file=err,
            )
        region(plan, ns.capabilities)  # refuse a bad region before anything is written
        show_progress = err.isatty()
        verifier = Verifier(ns.capabilities.block_size, plan.seed) if plan.verify else None
        if verifier is not None and plan.rw in ("read", "randread"):
            first, end = region(plan, ns.capabilities)
            await prefill(JobDevice(ns, None, verifier), first, end, verifier.block_size)
        jobs: list[Callable[[], Awaitable[JobResult]]] = []
        counters: list[Counter] = []
        live: list[Measurement | None] = [None] * args.numjobs
        stop = asyncio.Event()
        for j in range(args.numjobs):
            queue = queues[j % len(queues)]
            job_ns = job_namespace(ctrl, ns, queue)
            counter = Counter() if show_progress else None
            if counter is not None:
                counters.append(counter)
            name = f"job{j}"
            if plan.rw == "copy":
                jobs.append(
                    functools.partial(copy_job, name, job_ns, queue, plan, j, counter, stop, live)
                )
                continue
            # The wrapper costs a coroutine per I/O: only when something needs it.
            wrapped = counter is not None or verifier is not None
            device: BlockDevice = JobDevice(job_ns, counter, verifier) if wrapped else job_ns
            jobs.append(functools.partial(rw_job, name, device, plan, j, stop, live))

        helpers: list[asyncio.Task[None]] = []
        logs = _interval_logs(args, plan)
        if logs is not None:
            helpers.append(asyncio.create_task(logs.run(live, plan.runtime, stop)))
        if args.status_interval:
            helpers.append(
                asyncio.create_task(_status_reports(args, plan, live, out, args.status_interval))
            )
        if show_progress and counters:
            helpers.append(asyncio.create_task(_progress(counters, err, plan)))
        interrupt = _Interrupt(stop, err, show_progress)
        try:
            interrupt.install()
            results: list[JobResult] = await asyncio.gather(*(job() for job in jobs))
        finally:
            interrupt.uninstall()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if logs is not None:
                logs.close()
            if show_progress and counters:
                err.write("\r\x1b[K")
                err.flush()

    if verifier is not None and verifier.failure is not None:
        for r in results:
            if r.error and verifier.failure in r.error:
                r.verify_failed = True
                r.error = verifier.failure
    options = job_options(args)
    if args.output_format == "json":
        print(
            json.dumps(fio_json(results, options, group=args.group_reporting), indent=2), file=out
        )
    else:
        out.write(human_report(results, plan))
    failed = [r for r in results if r.error]
    if failed:
        print(f"pynvmf bench: {failed[0].name}: {failed[0].error}", file=err)
        return EXIT_FAILURE
    return EXIT_INTERRUPTED if interrupt.interrupted else 0


def _interval_logs(args: argparse.Namespace, plan: Plan) -> IntervalLogs | None:
    names = LogNames(args.write_bw_log, args.write_iops_log, args.write_lat_log)
    if not names.any():
        return None
    per_io = (0, plan.copy_ranges * plan.bs) if plan.rw == "copy" else (plan.bs, plan.bs)
    return IntervalLogs(names, args.numjobs, per_io, args.log_avg_msec)


async def _status_reports(
    args: argparse.Namespace,
    plan: Plan,
    live: Sequence[Measurement | None],
    out: TextIO,
    interval: float,
) -> None:
    """fio's --status-interval: the report so far, every `interval` seconds."""
    options = job_options(args)
    while True:
        await asyncio.sleep(interval)
        now = time.perf_counter()
        results = [snapshot(f"job{j}", m, plan, now) for j, m in enumerate(live) if m]
        if not results:
            continue  # still ramping up
        if args.output_format == "json":
            text = json.dumps(fio_json(results, options, group=args.group_reporting), indent=2)
            out.write(text + "\n")
        else:
            out.write(human_report(results, plan))
        out.flush()


class _Interrupt:
    """Ctrl-C during the measurement: the first sets `stop`, which ends the jobs as the
    end of --runtime does (the report then covers the time measured); a second one does
    what the handler before ours does (asyncio.Runner's cancels the main task: the run
    aborts without a report). The second is handled in the loop too, not by handing
    SIGINT back to a Python-level handler: that one runs only when the main thread next
    runs bytecode, and a loop waiting on a target that stopped answering, with the
    transport compiled (make compiled), may not do so for a long time."""

    def __init__(self, stop: asyncio.Event, err: TextIO, progress_line: bool) -> None:
        self._stop = stop
        self._err = err
        self._progress_line = progress_line
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self.interrupted = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            # Started with Ctrl-C ignored (a background job of a script, nohup): keep it so.
            return
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread (or no signals here): Ctrl-C keeps aborting the run.
            return
        self._loop, self._previous = loop, previous

    def uninstall(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.remove_signal_handler(signal.SIGINT)
        # remove_signal_handler installs Python's default handler; the one before ours
        # (asyncio.Runner's, which cancels the main task) lets the run clean up.
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self) -> None:
        if self.interrupted:
            previous = self._previous
            self.uninstall()
            if callable(previous):
                previous(signal.SIGINT, None)
                return
            raise KeyboardInterrupt
        self.interrupted = True
        self._stop.set()
        # Said now rather than after the report: the jobs may take a while to drain
        # their I/Os, and the user should know that a second Ctrl-C is what aborts.
        clear = "\r\x1b[K" if self._progress_line else ""
        self._err.write(
            f"{clear}pynvmf bench: interrupted, reporting the time measured so far "
            "(Ctrl-C again to abort)\n"
        )
        self._err.flush()


async def _progress(counters: Sequence[Counter], err: TextIO, plan: Plan) -> None:
    start = last_t = time.perf_counter()
    last_ios = last_bytes = 0
    total = plan.ramp_time + plan.runtime
    while True:
        await asyncio.sleep(_PROGRESS_INTERVAL)
        now = time.perf_counter()
        ios = sum(c.ios for c in counters)
        nbytes = sum(c.bytes for c in counters)
        span = now - last_t
        iops, rate = (ios - last_ios) / span, (nbytes - last_bytes) / span
        err.write("\r" + format_progress(now - start, total, iops, rate))
        err.flush()
        last_t, last_ios, last_bytes = now, ios, nbytes


def format_progress(elapsed: float, total: float, iops: float, bytes_per_second: float) -> str:
    """One progress line: how far into --ramp-time + --runtime, the time left, and the
    rates of the last refresh."""
    fraction = min(1.0, elapsed / total) if total > 0 else 1.0
    left = max(0.0, total - elapsed)
    return (
        f"[{fraction:6.1%}] {elapsed:6.1f}s ETA {left:5.1f}s {iops:10.0f} IOPS  "
        f"{bytes_per_second / 1e6:9.1f} MB/s"
    )
