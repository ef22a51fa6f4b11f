"""One `pynvmf bench` run on a connected controller: --numjobs jobs, each on one I/O queue
(shared round robin when the target granted fewer), run concurrently in one event loop,
and what runs beside them while they measure: the progress line (pynvmf.bench.progress),
--status-interval's reports, fio's log files (pynvmf.bench.fio_logs) and Ctrl-C
(pynvmf.bench.interrupt).

Read/write jobs run on the load generator engine (pynvmf.bench.loadgen); `--rw copy` jobs
issue copies through the copy planner (pynvmf.block.copy), one copy of --copy-ranges ranges
of --bs each per I/O (pynvmf.bench.jobs). A read workload with --verify first writes the
whole region (the prefill), outside the measurement: it shows in no figure, CPU time
included.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from pynvmf.bench.fio_logs import DEFAULT_LOG_AVG_MSEC, IntervalLogs, LogNames
from pynvmf.bench.interrupt import Interrupt
from pynvmf.bench.job_device import Counter, JobDevice, job_namespace
from pynvmf.bench.job_result import JobResult
from pynvmf.bench.jobs import Plan, copy_job, prefill, region, rw_job, snapshot
from pynvmf.bench.loadgen import Measurement
from pynvmf.bench.progress import CLEAR_LINE, show_progress
from pynvmf.bench.verify import Verifier
from pynvmf.block.device import BlockDevice
from pynvmf.host import Controller, RemoteNamespace


@dataclass(frozen=True, slots=True)
class StatusReports:
    """fio's --status-interval: every `interval` seconds, the report so far (`render` of
    each job's figures since its measurement started, pynvmf.bench.jobs.snapshot) on
    `out`."""

    interval: float
    render: Callable[[Sequence[JobResult]], str]
    out: TextIO


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the jobs measured, in job order, and whether Ctrl-C ended the measurement."""

    results: list[JobResult]
    interrupted: bool


async def run_jobs(
    ctrl: Controller,
    ns: RemoteNamespace,
    plan: Plan,
    numjobs: int,
    *,
    err: TextIO,
    progress: bool,
    status: StatusReports | None = None,
    logs: LogNames | None = None,
    log_avg_msec: int = DEFAULT_LOG_AVG_MSEC,
) -> Outcome:
    """Run `plan` on `numjobs` jobs over `ctrl`'s I/O queues to namespace `ns`. `progress`
    shows the progress line on `err`; `logs` names fio's log files, of `log_avg_msec`
    windows. A job's failure is its result's error, not an exception."""
    region(plan, ns.capabilities)  # refuse a bad region before anything is written
    verifier = Verifier(ns.capabilities.block_size, plan.seed) if plan.verify else None
    if verifier is not None and plan.rw in ("read", "randread"):
        first, end = region(plan, ns.capabilities)
        await prefill(JobDevice(ns, None, verifier), first, end, verifier.block_size)
    queues = ctrl.io_queues
    jobs: list[Callable[[], Awaitable[JobResult]]] = []
    counters: list[Counter] = []
    live: list[Measurement | None] = [None] * numjobs
    stop = asyncio.Event()
    for j in range(numjobs):
        queue = queues[j % len(queues)]
        job_ns = job_namespace(ctrl, ns, queue)
        counter = Counter() if progress else None
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
    interval_logs = _interval_logs(logs, plan, numjobs, log_avg_msec)
    if interval_logs is not None:
        helpers.append(asyncio.create_task(interval_logs.run(live, plan.runtime, stop)))
    if status is not None:
        helpers.append(asyncio.create_task(_status_reports(status, plan, live)))
    if progress and counters:
        total = plan.ramp_time + plan.runtime
        helpers.append(asyncio.create_task(show_progress(counters, err, total)))
    interrupt = Interrupt(stop, err, progress)
    try:
        interrupt.install()
        results: list[JobResult] = await asyncio.gather(*(job() for job in jobs))
    finally:
        interrupt.uninstall()
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if interval_logs is not None:
            interval_logs.close()
        if progress and counters:
            err.write(CLEAR_LINE)
            err.flush()

    if verifier is not None and verifier.failure is not None:
        for r in results:
            if r.error and verifier.failure in r.error:
                r.verify_failed = True
                r.error = verifier.failure
    return Outcome(results, interrupt.interrupted)


def _interval_logs(
    names: LogNames | None, plan: Plan, numjobs: int, avg_msec: int
) -> IntervalLogs | None:
    if names is None or not names.any():
        return None
    # Copy mode logs its copies in the write direction, as it reports them.
    per_io = (0, plan.copy_ranges * plan.bs) if plan.rw == "copy" else (plan.bs, plan.bs)
    return IntervalLogs(names, numjobs, per_io, avg_msec)


async def _status_reports(
    status: StatusReports, plan: Plan, live: Sequence[Measurement | None]
) -> None:
    while True:
        await asyncio.sleep(status.interval)
        now = time.perf_counter()
        results = [snapshot(f"job{j}", m, plan, now) for j, m in enumerate(live) if m]
        if not results:
            continue  # still ramping up
        status.out.write(status.render(results))
        status.out.flush()
