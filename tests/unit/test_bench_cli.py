"""`pynvmf bench` (pynvmf.cli.bench): fio's cpu figures and per-interval bandwidth and IOPS
statistics, and Ctrl-C reporting what was measured.

The live tests run the command's coroutine on the test's event loop against an
in-process target; Ctrl-C is simulated by calling the handler the command gives
`loop.add_signal_handler` (tests/protocol/test_bench_interrupt.py sends real signals).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pynvmf.bench import fio_report
from pynvmf.bench import run as bench_run
from pynvmf.bench.fio_report import fio_json, human_report
from pynvmf.bench.job_result import JobResult
from pynvmf.bench.loadgen import CpuUsage, LatencyHistogram, SampleStats
from pynvmf.block.device import Buffer
from pynvmf.block.memory import MemoryDevice
from pynvmf.cli import bench as bench_cli
from pynvmf.cli import build_parser
from pynvmf.cli.common import EXIT_INTERRUPTED, host_identity
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

pytestmark = pytest.mark.timeout(120)

NQN = "nqn.2024-01.io.pynvmf.test:bench-cli-unit"
MiB = 1024 * 1024
CPU_LINE = re.compile(
    r"^  cpu          : usr=(\d+\.\d\d)%, sys=(\d+\.\d\d)%, ctx=(\d+), majf=(\d+), minf=(\d+)$",
    re.MULTILINE,
)
# The keys a job had before the cpu figures: none may go.
JOB_KEYS = {"jobname", "groupid", "error", "elapsed", "job options", "read", "write", "trim"}
CPU_KEYS = ("usr_cpu", "sys_cpu", "ctx", "majf", "minf")
# Ceiling for a process's CPU percentages: every CPU of the machine busy.
MAX_PERCENT = 100.0 * (os.cpu_count() or 1)
# fio's per-direction figures of the per-interval samples, and their JSON types.
RATE_KEYS: dict[str, type] = {
    "bw_min": int,
    "bw_max": int,
    "bw_agg": float,
    "bw_mean": float,
    "bw_dev": float,
    "bw_samples": int,
    "iops_min": int,
    "iops_max": int,
    "iops_mean": float,
    "iops_stddev": float,
    "iops_samples": int,
}
# fio's lines of them in the human report (stat.c, show_ddir_status).
BW_LINE = re.compile(
    r"^   bw \(  [KM]iB/s\): min= *(\d+), max= *(\d+), per=(\d+\.\d\d)%, "
    r"avg= *(\d+\.\d\d), stdev= *(\d+\.\d\d), samples=(\d+)$",
    re.MULTILINE,
)
IOPS_LINE = re.compile(
    r"^   iops        : min= *(\d+), max= *(\d+), avg= *(\d+\.\d\d), "
    r"stdev= *(\d+\.\d\d), samples=(\d+)$",
    re.MULTILINE,
)


class CountingDevice(MemoryDevice):
    """A MemoryDevice counting the I/Os (copies included) it serves; `busy` is set once
    `threshold` of them are done."""

    def __init__(self, size: int, threshold: int) -> None:
        super().__init__(size, 512)
        self.ios = 0
        self.threshold = threshold
        self.busy = asyncio.Event()

    def _count(self) -> None:
        self.ios += 1
        if self.ios >= self.threshold:
            self.busy.set()

    async def read(self, lba: int, buf: memoryview) -> None:
        await super().read(lba, buf)
        self._count()

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await super().write(lba, data, fua=fua)
        self._count()

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        await super().copy_within(src_lba, dst_lba, nblocks, fua=fua)
        self._count()


@dataclass
class Served:
    target: Target
    device: CountingDevice

    @property
    def port(self) -> int:
        return self.target.ports[0].port


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    device = CountingDevice(16 * MiB, threshold=2000)
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "counting:1"))
    target = Target([subsystem], [Port("127.0.0.1", 0)])
    await target.start()
    yield Served(target, device)
    await target.stop()


class FakeSignals:
    """The loop's add/remove_signal_handler, recording instead of touching signals."""

    def __init__(self, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
        self.handlers: dict[int, Callable[[], object]] = {}
        self.added: list[int] = []
        self.removed: list[int] = []
        monkeypatch.setattr(loop, "add_signal_handler", self._add)
        monkeypatch.setattr(loop, "remove_signal_handler", self._remove)

    def _add(self, sig: int, callback: Callable[..., object], *args: object) -> None:
        self.added.append(sig)
        self.handlers[sig] = lambda: callback(*args)

    def _remove(self, sig: int) -> bool:
        self.removed.append(sig)
        return self.handlers.pop(sig, None) is not None


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """SIGINT as Python sets it up when it starts with SIGINT not ignored (the test runner
    may have been started with SIGINT ignored, as background jobs of a script are)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def bench_args(served: Served, *extra: str) -> list[str]:
    return ["-a", "127.0.0.1", "-s", str(served.port), "--nqn", NQN, *extra]


async def bench(served: Served, *extra: str) -> tuple[int, str, str]:
    """`pynvmf bench` against `served`: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    args = parse(*bench_args(served, *extra))
    status = await bench_cli._bench(args, host_identity(args), out, err)
    return status, out.getvalue(), err.getvalue()


def check_cpu_keys(job: dict[str, Any]) -> None:
    for key in ("usr_cpu", "sys_cpu"):
        assert isinstance(job[key], float), (key, job[key])
        assert 0.0 <= job[key] <= MAX_PERCENT, (key, job[key])
    # The load generator keeps this process busy: some CPU time must show.
    assert job["usr_cpu"] + job["sys_cpu"] > 0
    for key in ("ctx", "majf", "minf"):
        assert isinstance(job[key], int) and job[key] >= 0, (key, job[key])


def check_rate_keys(direction: dict[str, Any]) -> None:
    """fio's per-interval keys, of fio's types, and consistent with each other."""
    for key, kind in RATE_KEYS.items():
        assert type(direction[key]) is kind, (key, direction[key])
    for name, dev in (("bw", "bw_dev"), ("iops", "iops_stddev")):
        low, mean, high = (
            direction[f"{name}_min"],
            direction[f"{name}_mean"],
            direction[f"{name}_max"],
        )
        if direction[f"{name}_samples"]:
            assert 0 < low <= mean <= high, (name, low, mean, high)
        else:
            assert low == high == mean == direction[dev] == 0  # as fio prints no samples
        assert direction[dev] >= 0
    assert 0.0 <= direction["bw_agg"] <= 100.0


# -- cpu usage, live ---------------------------------------------------------------------------


@pytest.mark.parametrize("group", [False, True])
async def test_json_jobs_report_cpu_usage(served: Served, group: bool) -> None:
    extra = ("--group-reporting",) if group else ()
    status, out, err = await bench(
        served, "--runtime", "0.3", "--numjobs", "2", "--iodepth", "2", "-o", "json", *extra
    )
    assert status == 0, err
    jobs = json.loads(out)["jobs"]
    assert len(jobs) == (1 if group else 2)
    for job in jobs:
        assert set(job) >= JOB_KEYS | {"job_runtime", *CPU_KEYS}
        check_cpu_keys(job)


async def test_human_report_has_fio_cpu_lines(served: Served) -> None:
    status, out, err = await bench(served, "--runtime", "0.3", "--numjobs", "2", "--rw", "randrw")
    assert status == 0, err
    lines = CPU_LINE.findall(out)
    assert len(lines) == 3  # job0, job1 and all jobs
    for usr, sys_, *_ in lines:
        assert 0 < float(usr) + float(sys_) <= MAX_PERCENT
    # fio's order: a job's cpu line follows its I/O figures.
    all_jobs = out.index("all jobs:")
    assert all_jobs < out.rindex("  cpu          :") < out.index("Run status group 0")


async def test_copy_report_has_the_cpu_figures(served: Served) -> None:
    args = ("--runtime", "0.3", "--rw", "copy", "--bs", "4k", "--copy-ranges", "2")
    status, out, err = await bench(served, *args)
    assert status == 0, err
    assert len(CPU_LINE.findall(out)) == 1
    status, out, err = await bench(served, *args, "-o", "json")
    assert status == 0, err
    check_cpu_keys(json.loads(out)["jobs"][0])


async def test_cpu_usage_excludes_the_verify_prefill(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    burned = 0.8
    real_prefill = bench_run.prefill

    async def costly_prefill(*args: Any) -> None:
        # CPU time outside the measured run: it must not show in the usage reported.
        end = time.process_time() + burned
        while time.process_time() < end:
            pass
        await real_prefill(*args)

    monkeypatch.setattr(bench_run, "prefill", costly_prefill)
    status, out, err = await bench(
        served, "--runtime", "0.2", "--rw", "randread", "--verify", "--size", "64k", "-o", "json"
    )
    assert status == 0, err
    [job] = json.loads(out)["jobs"]
    check_cpu_keys(job)
    cpu_seconds = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    assert cpu_seconds < burned / 2


# -- per-interval samples, live ----------------------------------------------------------------


@pytest.mark.parametrize("group", [False, True])
async def test_json_reports_per_interval_samples(served: Served, group: bool) -> None:
    extra = ("--group-reporting",) if group else ()
    status, out, err = await bench(
        served,
        *("--runtime", "0.6", "--numjobs", "2", "--iodepth", "2", "--rw", "randrw"),
        *("--bwavgtime", "200", "--iopsavgtime", "150", "-o", "json", *extra),
    )
    assert status == 0, err
    jobs = json.loads(out)["jobs"]
    assert len(jobs) == (1 if group else 2)
    per_job = 2 if group else 1  # fio's group sums the jobs' sample counts
    for job in jobs:
        assert job["job options"]["bwavgtime"] == "200"
        for which in ("read", "write"):
            d = job[which]
            check_rate_keys(d)
            # 0.6 s measured: 3 bandwidth and 4 IOPS intervals end within it; a stall of
            # the event loop longer than an interval (a busy machine) merges them, down to
            # one. The rates' arithmetic is checked exactly, on a clock the test drives,
            # in test_bench_loadgen's sampler tests; here: that the samples are there and
            # fio's keys agree with each other (check_rate_keys: min <= mean <= max).
            assert 1 * per_job <= d["bw_samples"] <= 3 * per_job, d
            assert 1 * per_job <= d["iops_samples"] <= 4 * per_job, d
            if group:
                assert d["bw_agg"] == pytest.approx(100.0, abs=30)
        check_rate_keys(job["trim"])
        assert job["trim"]["bw_samples"] == job["trim"]["iops_samples"] == 0
    if not group:
        # Two jobs of a group of two: each had a share of the bandwidth (fio's bw_agg is a
        # job's mean over the group's; stalls that merge intervals move the means, so the
        # shares need not sum to 100 on a busy machine).
        shares = [job["read"]["bw_agg"] for job in jobs]
        assert all(0 < share < 100 for share in shares), shares


async def test_human_report_has_fios_bw_and_iops_lines(served: Served) -> None:
    status, out, err = await bench(
        served, "--runtime", "0.6", "--numjobs", "2", "--rw", "randrw", "--bwavgtime", "200"
    )
    assert status == 0, err
    bw_lines, iops_lines = BW_LINE.findall(out), IOPS_LINE.findall(out)
    # Reads and writes of job0, job1 and all jobs.
    assert len(bw_lines) == len(iops_lines) == 6
    # job0's read and write, job1's, all jobs': 0.6 s holds 3 intervals of 200 ms (fewer
    # if stalls merged them), 1 of 500; fio's group counts the jobs' samples together.
    bw_counts = [int(line[-1]) for line in bw_lines]
    assert all(1 <= n <= 3 for n in bw_counts[:4]), bw_counts
    assert bw_counts[4:] == [bw_counts[0] + bw_counts[2], bw_counts[1] + bw_counts[3]]
    assert [int(line[-1]) for line in iops_lines] == [1, 1, 1, 1, 2, 2]
    for low, high, _, avg, stdev, _ in bw_lines:
        assert int(low) <= float(avg) <= int(high) and float(stdev) >= 0
    # fio's order: a direction's lines follow its latency lines, before the next direction.
    block = out[out.index("all jobs:") :]
    assert (
        block.index("  read: IOPS=")
        < block.index("99.90th=[")
        < block.index("   bw (")
        < block.index("   iops        :")
        < block.index("  write: IOPS=")
        < block.rindex("   iops        :")
        < block.index("  cpu          :")
    )


async def test_copy_samples_its_copies_as_writes(served: Served) -> None:
    args = ("--runtime", "0.6", "--rw", "copy", "--bs", "4k", "--copy-ranges", "2")
    status, out, err = await bench(served, *args, "--iopsavgtime", "200", "-o", "json")
    assert status == 0, err
    [job] = json.loads(out)["jobs"]
    write = job["write"]
    check_rate_keys(write)
    check_rate_keys(job["read"])
    assert job["read"]["bw_samples"] == job["read"]["iops_samples"] == 0
    # 0.6 s: one 500 ms bandwidth interval and up to three 200 ms IOPS intervals (fewer
    # if a stall of a busy machine merged them). A copy counts as one write of 8 KiB.
    assert write["bw_samples"] == 1 and 1 <= write["iops_samples"] <= 3
    assert write["total_ios"] > 0 and write["io_bytes"] == 8192 * write["total_ios"]
    status, out, err = await bench(served, *args, "--iopsavgtime", "200")
    assert status == 0, err
    assert len(BW_LINE.findall(out)) == 1
    assert [int(line[-1]) for line in IOPS_LINE.findall(out)] in ([1], [2], [3])
    assert out.index("lat (usec):") < out.index("   bw (") < out.index("    planner:")


# -- cpu usage, formatting ---------------------------------------------------------------------


def _job(name: str, elapsed: float, cpu: CpuUsage) -> JobResult:
    reads = LatencyHistogram()
    for ns in (50_000, 60_000, 70_000):
        reads.record(ns)
    return JobResult(
        name=name,
        elapsed=elapsed,
        read_bytes_per_io=4096,
        write_bytes_per_io=4096,
        read_hist=reads,
        write_hist=LatencyHistogram(),
        cpu=cpu,
    )


JOB0 = _job("job0", 1.0, CpuUsage(wall=1.0, user=0.25, system=0.05, ctx=100, majf=1, minf=7))
JOB1 = _job("job1", 2.0, CpuUsage(wall=2.0, user=1.0, system=0.2, ctx=300, majf=0, minf=9))


def test_fio_json_puts_cpu_figures_at_fio_keys() -> None:
    jobs = fio_json([JOB0, JOB1], {"rw": "randread"}, group=False)["jobs"]
    got = [{key: job[key] for key in CPU_KEYS} for job in jobs]
    assert got == [
        {"usr_cpu": 25.0, "sys_cpu": 5.0, "ctx": 100, "majf": 1, "minf": 7},
        {"usr_cpu": 50.0, "sys_cpu": 10.0, "ctx": 300, "majf": 0, "minf": 9},
    ]
    for job in jobs:
        assert set(job) >= JOB_KEYS


def test_group_reports_the_longest_jobs_cpu_usage_not_a_sum() -> None:
    # Each job's figures are already the whole process's: adding them up would count the
    # same CPU time twice.
    [job] = fio_json([JOB0, JOB1], {"rw": "randread"}, group=True)["jobs"]
    assert {key: job[key] for key in CPU_KEYS} == {
        "usr_cpu": 50.0,
        "sys_cpu": 10.0,
        "ctx": 300,
        "majf": 0,
        "minf": 9,
    }
    assert job["job_runtime"] == 2000


def test_human_report_cpu_line_is_fios() -> None:
    plan = bench_cli._plan(parse("-a", "127.0.0.1", "--nqn", NQN))
    out = human_report([JOB0, JOB1], plan)
    assert "  cpu          : usr=25.00%, sys=5.00%, ctx=100, majf=1, minf=7\n" in out
    assert out.count("  cpu          : usr=50.00%, sys=10.00%, ctx=300, majf=0, minf=9\n") == 2
    assert out.index("job1:") < out.index("usr=50.00%") < out.index("all jobs:")


# -- per-interval samples, formatting ----------------------------------------------------------

# JOB0 moved 12 KiB in 1 s, JOB1 12 KiB in 2 s: the group, 24 KiB over the longest 2 s.
RATED0 = dataclasses.replace(
    JOB0, read_bw=SampleStats.of([2, 4, 6]), read_iops=SampleStats.of([1, 1, 4])
)
RATED1 = dataclasses.replace(JOB1, read_bw=SampleStats.of([1, 2, 3]), read_iops=SampleStats.of([3]))


def test_fio_json_has_fios_per_interval_keys() -> None:
    jobs = fio_json([RATED0, RATED1], {"rw": "randread"}, group=False)["jobs"]
    for job in jobs:
        for which in ("read", "write", "trim"):
            check_rate_keys(job[which])
    read = jobs[0]["read"]
    assert {k: read[k] for k in RATE_KEYS} == {
        "bw_min": 2,
        "bw_max": 6,
        "bw_agg": pytest.approx(4 / 12 * 100),  # its mean over the group's 12 KiB/s
        "bw_mean": 4.0,
        "bw_dev": 2.0,
        "bw_samples": 3,
        "iops_min": 1,
        "iops_max": 4,
        "iops_mean": 2.0,
        "iops_stddev": pytest.approx(3**0.5),
        "iops_samples": 3,
    }
    assert jobs[1]["read"]["bw_agg"] == pytest.approx(2 / 12 * 100)
    assert jobs[1]["read"]["iops_stddev"] == 0.0  # one sample: no deviation, as fio
    assert jobs[1]["write"]["bw_samples"] == 0 and jobs[1]["write"]["bw_agg"] == 0.0


def test_group_adds_the_jobs_rates_up_as_fio() -> None:
    [job] = fio_json([RATED0, RATED1], {"rw": "randread"}, group=True)["jobs"]
    read = job["read"]
    assert (read["bw_min"], read["bw_max"], read["bw_mean"], read["bw_samples"]) == (3, 9, 6.0, 6)
    assert read["bw_dev"] == pytest.approx(((8 + 2) / 5) ** 0.5)  # fio: sqrt(sum S / (n - 1))
    assert read["bw_agg"] == pytest.approx(50.0)
    assert (read["iops_min"], read["iops_max"], read["iops_mean"]) == (4, 7, 5.0)
    assert read["iops_samples"] == 4
    # A job without samples adds nothing: fio's group of one job with samples is that job.
    [alone] = fio_json([RATED0, JOB1], {"rw": "randread"}, group=True)["jobs"]
    assert (alone["read"]["bw_min"], alone["read"]["bw_samples"]) == (2, 3)


def test_human_report_rate_lines_are_fios() -> None:
    plan = bench_cli._plan(parse("-a", "127.0.0.1", "--nqn", NQN))
    out = human_report([RATED0, RATED1], plan)
    assert (
        "   bw (  KiB/s): min=    2, max=    6, per=33.33%, avg= 4.00, stdev= 2.00, samples=3\n"
        "   iops        : min=    1, max=    4, avg= 2.00, stdev= 1.73, samples=3\n"
        "  cpu          : usr=25.00%"
    ) in out
    assert (
        "   bw (  KiB/s): min=    3, max=    9, per=50.00%, avg= 6.00, stdev= 1.41, samples=6\n"
    ) in out
    assert "   iops        : min=    3, max=    3, avg= 3.00, stdev= 0.00, samples=1\n" in out
    # No samples (JOB0, JOB1 without any): no lines, as fio prints none.
    assert "   bw (" not in human_report([JOB0, JOB1], plan)
    assert "   iops " not in human_report([JOB0, JOB1], plan)


def test_human_report_shows_mib_above_a_gib_per_second() -> None:
    lines = fio_report.rate_lines(SampleStats.of([2_000_000, 2_200_000]), SampleStats(), 100.0)
    assert lines == [
        "   bw (  MiB/s): min= 1953, max= 2148, per=100.00%, avg=2050.78, stdev=138.11, samples=2"
    ]


def test_sampling_intervals_are_fios_options() -> None:
    plan = bench_cli._plan(parse("-a", "127.0.0.1", "--nqn", NQN))
    assert (plan.bw_avg_time, plan.iops_avg_time) == (0.5, 0.5)  # fio's 500 ms
    args = parse("-a", "127.0.0.1", "--nqn", NQN, "--bwavgtime", "250", "--iopsavgtime", "1000")
    plan = bench_cli._plan(args)
    assert (plan.bw_avg_time, plan.iops_avg_time) == (0.25, 1.0)
    options = fio_report.job_options(args)
    assert (options["bwavgtime"], options["iopsavgtime"]) == ("250", "1000")
    assert "bwavgtime" not in fio_report.job_options(parse("-a", "127.0.0.1", "--nqn", NQN))
    for bad in ("0", "-5", "0.5"):
        with pytest.raises(SystemExit):
            parse("-a", "127.0.0.1", "--nqn", NQN, "--bwavgtime", bad)


# -- Ctrl-C ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize(
    ("rw", "output"), [("randread", "json"), ("randrw", "normal"), ("copy", "json")]
)
async def test_ctrl_c_reports_the_time_measured(
    served: Served, monkeypatch: pytest.MonkeyPatch, rw: str, output: str
) -> None:
    signals = FakeSignals(asyncio.get_running_loop(), monkeypatch)
    before = signal.getsignal(signal.SIGINT)

    async def press_ctrl_c() -> None:
        # The target serves I/O only once the measurement runs, handler installed.
        await served.device.busy.wait()
        signals.handlers[signal.SIGINT]()

    extra = ["--rw", rw, "--numjobs", "2", "--iodepth", "4", "--runtime", "600", "-o", output]
    if rw == "copy":
        extra += ["--bs", "4k"]
    presser = asyncio.create_task(press_ctrl_c())
    status, out, err = await asyncio.wait_for(bench(served, *extra), timeout=60)
    await presser
    assert status == EXIT_INTERRUPTED == 130
    assert "interrupted" in err and err.count("\n") == 1
    # The handler was installed for the run and is gone; SIGINT is as it was.
    assert signals.added == [signal.SIGINT] and signals.removed == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before

    if output == "json":
        jobs = json.loads(out)["jobs"]
        assert [j["jobname"] for j in jobs] == ["job0", "job1"]
        for job in jobs:
            assert job["error"] == 0
            assert 0 < job["job_runtime"] < 60_000  # far below the 600 s asked for
            check_cpu_keys(job)
            ios = job["read"]["total_ios"] + job["write"]["total_ios"]
            iops = job["read"]["iops"] + job["write"]["iops"]
            assert ios > 0 and iops > 0
            # The rates are over the time measured, not over the runtime asked for.
            assert iops == pytest.approx(ios / (job["job_runtime"] / 1000), rel=0.05)
            # Per-interval samples: whole 500 ms intervals of the time measured only.
            for which in ("read", "write"):
                check_rate_keys(job[which])
                for key in ("bw_samples", "iops_samples"):
                    assert job[which][key] * 500 <= job["job_runtime"] + 2
    else:
        assert "Run status group 0 (all jobs):" in out
        runs = [int(ms) for ms in re.findall(r"run=(\d+)-\d+msec", out)]
        assert runs and all(0 < ms < 60_000 for ms in runs)
        assert re.search(r"all jobs: .*\n  read: IOPS=[1-9]", out)
        assert len(CPU_LINE.findall(out)) == 3


@pytest.mark.usefixtures("sigint_default")
async def test_no_ctrl_c_no_note_and_exit_0(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = FakeSignals(asyncio.get_running_loop(), monkeypatch)
    status, _, err = await bench(served, "--runtime", "0.2")
    assert status == 0 and "interrupted" not in err
    assert signals.added == signals.removed == [signal.SIGINT]


async def test_an_ignored_sigint_stays_ignored(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = FakeSignals(asyncio.get_running_loop(), monkeypatch)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status, _, err = await bench(served, "--runtime", "0.2")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == 0, err
    assert signals.added == []


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("sigint_default")
async def test_ctrl_c_note_clears_the_progress_line(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = FakeSignals(asyncio.get_running_loop(), monkeypatch)

    async def press_ctrl_c() -> None:
        await served.device.busy.wait()
        signals.handlers[signal.SIGINT]()

    out, err = io.StringIO(), _Tty()
    args = parse(*bench_args(served, "--runtime", "600"))
    presser = asyncio.create_task(press_ctrl_c())
    status = await asyncio.wait_for(
        bench_cli._bench(args, host_identity(args), out, err), timeout=60
    )
    await presser
    assert status == EXIT_INTERRUPTED
    # The note starts on a cleared line rather than after a progress frame.
    assert "\r\x1b[Kpynvmf bench: interrupted" in err.getvalue()
    assert "Run status group 0" in out.getvalue()
