"""`pynvmf bench` (pynvmf.bench_cli): fio's cpu figures, and Ctrl-C reporting what was measured.

The live tests run the command's coroutine on the test's event loop against an
in-process target; Ctrl-C is simulated by calling the handler the command gives
`loop.add_signal_handler` (tests/protocol/test_bench_interrupt.py sends real signals).
"""

from __future__ import annotations

import argparse
import asyncio
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

from pynvmf import bench_cli
from pynvmf.bench.loadgen import CpuUsage, LatencyHistogram
from pynvmf.bench_cli import JobResult, add_bench_command, fio_json, human_report
from pynvmf.block.device import Buffer
from pynvmf.block.memory import MemoryDevice
from pynvmf.host_cli import EXIT_INTERRUPTED
from pynvmf.target.server import Port, Target
from pynvmf.target.subsystem import Namespace, Subsystem

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
    parser = argparse.ArgumentParser(prog="pynvmf")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_command(sub)
    return parser.parse_args(["bench", *argv])


def bench_args(served: Served, *extra: str) -> list[str]:
    return ["-a", "127.0.0.1", "-s", str(served.port), "-n", NQN, *extra]


async def bench(served: Served, *extra: str) -> tuple[int, str, str]:
    """`pynvmf bench` against `served`: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    status = await bench_cli._bench(parse(*bench_args(served, *extra)), out, err)
    return status, out.getvalue(), err.getvalue()


def check_cpu_keys(job: dict[str, Any]) -> None:
    for key in ("usr_cpu", "sys_cpu"):
        assert isinstance(job[key], float), (key, job[key])
        assert 0.0 <= job[key] <= MAX_PERCENT, (key, job[key])
    # The load generator keeps this process busy: some CPU time must show.
    assert job["usr_cpu"] + job["sys_cpu"] > 0
    for key in ("ctx", "majf", "minf"):
        assert isinstance(job[key], int) and job[key] >= 0, (key, job[key])


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
    real_prefill = bench_cli._prefill

    async def costly_prefill(*args: Any) -> None:
        # CPU time outside the measured run: it must not show in the usage reported.
        end = time.process_time() + burned
        while time.process_time() < end:
            pass
        await real_prefill(*args)

    monkeypatch.setattr(bench_cli, "_prefill", costly_prefill)
    status, out, err = await bench(
        served, "--runtime", "0.2", "--rw", "randread", "--verify", "--size", "64k", "-o", "json"
    )
    assert status == 0, err
    [job] = json.loads(out)["jobs"]
    check_cpu_keys(job)
    cpu_seconds = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    assert cpu_seconds < burned / 2


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
    plan = bench_cli._plan(parse("-a", "127.0.0.1", "-n", NQN))
    out = human_report([JOB0, JOB1], plan)
    assert "  cpu          : usr=25.00%, sys=5.00%, ctx=100, majf=1, minf=7\n" in out
    assert out.count("  cpu          : usr=50.00%, sys=10.00%, ctx=300, majf=0, minf=9\n") == 2
    assert out.index("job1:") < out.index("usr=50.00%") < out.index("all jobs:")


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
    status = await asyncio.wait_for(bench_cli._bench(args, out, err), timeout=60)
    await presser
    assert status == EXIT_INTERRUPTED
    # The note starts on a cleared line rather than after a progress frame.
    assert "\r\x1b[Kpynvmf bench: interrupted" in err.getvalue()
    assert "Run status group 0" in out.getvalue()
