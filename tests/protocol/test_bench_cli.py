"""`pynvmf bench` (pynvmf.cli.bench) against an in-process target.

The target runs on its own event loop in a background thread, so the command runs
exactly as the CLI runs it: parse the arguments, then `run_bench_command`, which
starts and ends its own event loop in the test's thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import re
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from pynvmf.bench.progress import format_progress
from pynvmf.block.device import Buffer, Capabilities
from pynvmf.block.memory import MemoryDevice
from pynvmf.cli import bench as bench_cli
from pynvmf.cli import build_parser
from pynvmf.cli.bench import run_bench_command
from pynvmf.cli.common import host_identity
from pynvmf.host import Controller
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

pytestmark = pytest.mark.timeout(120)

NQN = "nqn.2024-01.org.pynvmf:bench-cli"
MiB = 1024 * 1024
BAD_LBA = 37  # namespace 2 returns a flipped byte in this block on every read
RUNTIME = "0.5"


class RottenDevice:
    """A MemoryDevice whose block BAD_LBA reads back with one byte flipped: the data
    written is intact, only what a reader sees is wrong, on every read."""

    def __init__(self, inner: MemoryDevice) -> None:
        self._inner = inner
        # No native copy: the target then copies within this device by read + write,
        # through the corrupting read like everything else.
        self._caps = dataclasses.replace(inner.capabilities, native_copy=False)

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def read(self, lba: int, buf: memoryview) -> None:
        await self._inner.read(lba, buf)
        bs = self._caps.block_size
        view = memoryview(buf).cast("B")
        if lba <= BAD_LBA < lba + view.nbytes // bs:
            at = (BAD_LBA - lba) * bs + 100
            view[at] ^= 0xFF

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self._inner.write(lba, data, fua=fua)

    async def flush(self) -> None:
        await self._inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._inner.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._inner.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self._inner.close()


class BackgroundTarget:
    """A started Target on an event loop of its own, in a daemon thread: namespace 1 is
    16 MiB of memory in 512-byte blocks, namespace 2 1 MiB with a rotten block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.target: Target = self.call(self._start())
        self.port = self.target.ports[0].port

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> Target:
        subsystem = Subsystem(NQN)
        subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(16 * MiB, 512), "memory:1"))
        rotten = RottenDevice(MemoryDevice(MiB, 512))
        subsystem.add_namespace(Namespace.create(NQN, 2, rotten, "rotten:2"))
        target = Target([subsystem], [Port("127.0.0.1", 0)])
        await target.start()
        return target

    def stop(self) -> None:
        try:
            self.call(self.target.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()


@pytest.fixture(scope="module")
def target() -> Iterator[BackgroundTarget]:
    started = BackgroundTarget()
    yield started
    started.stop()


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def run(*argv: str) -> int:
    """`pynvmf bench ARGV...` as pynvmf.cli runs it."""
    return run_bench_command(parse(*argv))


def bench_args(target: BackgroundTarget, *extra: str) -> list[str]:
    # RUNTIME unless the case gives its own (an option given twice is refused).
    runtime = [] if "--runtime" in extra else ["--runtime", RUNTIME]
    return ["-a", "127.0.0.1", "-s", str(target.port), "--nqn", NQN, *runtime, *extra]


def run_json(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    status = run(*bench_args(target, "-o", "json", *extra))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    result: dict[str, Any] = json.loads(captured.out)
    return result


# -- workloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rw", "reads", "writes"),
    [
        ("randread", True, False),
        ("read", True, False),
        ("randwrite", False, True),
        ("write", False, True),
        ("randrw", True, True),
    ],
)
def test_each_mode_runs_with_sane_counts(
    target: BackgroundTarget,
    capsys: pytest.CaptureFixture[str],
    rw: str,
    reads: bool,
    writes: bool,
) -> None:
    out = run_json(target, capsys, "--rw", rw, "--bs", "4k", "--iodepth", "4")
    [job] = out["jobs"]
    assert job["error"] == 0
    for which, expected in (("read", reads), ("write", writes)):
        d = job[which]
        assert (d["total_ios"] > 0) == expected, (which, d["total_ios"])
        if not expected:
            continue
        assert d["io_bytes"] == d["total_ios"] * 4096
        assert d["io_kbytes"] == d["total_ios"] * 4
        # iops and bandwidth agree with the counts over the runtime reported.
        assert d["iops"] == pytest.approx(d["total_ios"] / (d["runtime"] / 1000), rel=0.01)
        assert d["bw"] == pytest.approx(d["bw_bytes"] / 1024, abs=1)
        assert 400 <= d["runtime"] <= 1500
        lat = d["lat_ns"]
        assert lat["N"] == d["total_ios"]
        assert 0 < lat["min"] <= lat["mean"] <= lat["max"]
        pct = lat["percentile"]
        assert lat["min"] <= pct["50.000000"] <= pct["90.000000"] <= pct["99.000000"]
        assert pct["99.000000"] <= pct["99.900000"] <= lat["max"]
        assert d["clat_ns"] == lat
    if rw == "randrw":
        # --rwmixread defaults to 50: neither direction should dominate.
        share = job["read"]["total_ios"] / (job["read"]["total_ios"] + job["write"]["total_ios"])
        assert 0.4 < share < 0.6


def test_json_has_fio_keys(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(target, capsys, "--rw", "randrw", "--rwmixread", "70", "--iodepth", "2")
    assert out["fio version"].startswith("pynvmf-bench ")
    assert isinstance(out["timestamp"], int)
    job = out["jobs"][0]
    for key in ("jobname", "groupid", "error", "job options", "read", "write", "trim"):
        assert key in job
    assert job["job options"]["rw"] == "randrw"
    assert job["job options"]["rwmixread"] == "70"
    for key in ("io_bytes", "io_kbytes", "bw_bytes", "bw", "iops", "runtime", "total_ios"):
        assert key in job["read"]
    assert set(job["read"]["lat_ns"]) >= {"min", "max", "mean", "stddev", "N", "percentile"}
    assert isinstance(job["read"]["lat_ns"]["percentile"]["99.000000"], int)
    share = job["read"]["total_ios"] / (job["read"]["total_ios"] + job["write"]["total_ios"])
    assert 0.6 < share < 0.8


def test_human_output_has_fio_shape(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(*bench_args(target, "--rw", "randrw", "--bs", "8k")) == 0
    out = capsys.readouterr().out
    assert "  read: IOPS=" in out
    assert "  write: IOPS=" in out
    assert "lat (usec): min=" in out
    assert "99.90th=[" in out
    assert "Run status group 0 (all jobs):" in out
    assert "READ: bw=" in out and "WRITE: bw=" in out
    # fio's per-interval lines, for reads and for writes: 0.5 s holds one 500 ms interval.
    assert len(re.findall(r"^   bw \(  [KM]iB/s\): min= *\d+, max= *\d+, per=", out, re.M)) == 2
    assert len(re.findall(r"^   iops        : min= *\d+, max= *\d+, avg=", out, re.M)) == 2


def test_json_has_fios_per_interval_samples(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 s at fio's default 500 ms intervals.
    out = run_json(target, capsys, "--rw", "randread", "--iodepth", "4", "--runtime", "2")
    [job] = out["jobs"]
    read = job["read"]
    for key in ("bw_min", "bw_max", "bw_samples", "iops_min", "iops_max", "iops_samples"):
        assert isinstance(read[key], int), key
    for key in ("bw_agg", "bw_mean", "bw_dev", "iops_mean", "iops_stddev"):
        assert isinstance(read[key], float), key
    assert 3 <= read["bw_samples"] <= 4 and 3 <= read["iops_samples"] <= 4
    assert 0 < read["iops_min"] <= read["iops_mean"] <= read["iops_max"]
    assert 0 < read["bw_min"] <= read["bw_mean"] <= read["bw_max"]
    assert read["iops_stddev"] >= 0 and read["bw_dev"] >= 0
    # The intervals' mean is the run's rate.
    assert read["iops_mean"] == pytest.approx(read["iops"], rel=0.3)
    assert read["bw_mean"] == pytest.approx(read["bw"], rel=0.3)
    assert read["bw_agg"] == pytest.approx(100.0, abs=30)  # the only job: all the bandwidth
    # No writes: no write samples (zeros, as fio prints them).
    write = job["write"]
    assert write["bw_samples"] == write["iops_samples"] == 0
    assert write["bw_mean"] == write["iops_mean"] == write["bw_agg"] == 0.0


def test_numjobs_uses_one_queue_per_job(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    controllers: list[Controller] = []
    real_connect = bench_cli.connect

    async def recording_connect(*args: Any, **kwargs: Any) -> Controller:
        ctrl = await real_connect(*args, **kwargs)
        controllers.append(ctrl)
        return ctrl

    monkeypatch.setattr(bench_cli, "connect", recording_connect)
    out = run_json(target, capsys, "--rw", "randread", "--numjobs", "2", "--iodepth", "2")
    [ctrl] = controllers
    assert len(ctrl.io_queues) == 2
    # Each job's I/O went to its own queue: both carried traffic.
    assert all(q.bytes_sent > 10_000 for q in ctrl.io_queues)
    assert [j["jobname"] for j in out["jobs"]] == ["job0", "job1"]
    assert all(j["read"]["total_ios"] > 0 for j in out["jobs"])

    grouped = run_json(target, capsys, "--rw", "randread", "--numjobs", "2", "--group-reporting")
    assert len(grouped["jobs"]) == 1
    assert grouped["jobs"][0]["read"]["total_ios"] > 0


# -- copy --------------------------------------------------------------------------------------


def test_copy_offload_versus_emulate(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--rw", "copy", "--bs", "64k", "--copy-ranges", "2", "--iodepth", "2")
    ratios = {}
    for mode in ("offload", "emulate"):
        job = run_json(target, capsys, *common, "--copy-mode", mode)["jobs"][0]
        c = job["pynvmf_copy"]
        assert c["copies"] > 0
        assert c["copied_bytes"] == c["copies"] * 128 * 1024
        assert job["write"]["total_ios"] == c["copies"]
        ratios[mode] = (c["wire_bytes_sent"] + c["wire_bytes_received"]) / c["copied_bytes"]
        if mode == "offload":
            assert c["emulated_blocks"] == 0 and c["copy_commands"] >= c["copies"]
        else:
            assert c["offloaded_blocks"] == 0 and c["copy_commands"] == 0
    # Emulation reads every byte and writes it back; offload sends only the descriptors.
    assert 1.9 < ratios["emulate"] < 2.2
    assert ratios["offload"] < 0.01


def test_copy_human_output_reports_the_wire(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(*bench_args(target, "--rw", "copy", "--bs", "4k", "--copy-ranges", "4")) == 0
    out = capsys.readouterr().out
    assert "copy: copies/s=" in out
    assert "wire: sent=" in out
    assert "mode=auto" in out


# -- verify ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rw", ["randrw", "write", "randread"])
def test_verify_passes_on_good_data(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], rw: str
) -> None:
    out = run_json(
        target, capsys, "--rw", rw, "--verify", "--size", "256k", "--numjobs", "2", "--iodepth", "4"
    )
    assert all(j["error"] == 0 for j in out["jobs"])
    assert sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in out["jobs"]) > 0


@pytest.mark.parametrize("rw", ["randread", "randrw"])
def test_verify_reports_the_corrupted_lba(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], rw: str
) -> None:
    # A 16-slot region holding BAD_LBA: the random reads reach it within the run.
    args = bench_args(target, "--namespace-id", "2", "--rw", rw, "--verify", "--size", "64k")
    assert run(*args) == 1
    err = capsys.readouterr().err
    assert f"verify failed at LBA {BAD_LBA}" in err

    assert run(*args, "-o", "json") == 1
    captured = capsys.readouterr()
    job = json.loads(captured.out)["jobs"][0]
    assert job["error"] == 84  # EILSEQ, as fio reports a verify failure
    assert f"LBA {BAD_LBA}" in job["pynvmf_error"]


def test_without_verify_corruption_goes_unnoticed(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    # The control for the test above: the rotten block alone is no error.
    args = bench_args(target, "--namespace-id", "2", "--rw", "randread", "--size", "64k")
    assert run(*args) == 0


# -- progress and arguments --------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal(target: BackgroundTarget) -> None:
    out, err = io.StringIO(), _Tty()
    args = parse(*bench_args(target, "--rw", "randread"))
    status = asyncio.run(bench_cli._bench(args, host_identity(args), out, err))
    assert status == 0
    frames = [f for f in err.getvalue().split("\r") if f.startswith("[")]
    # 0.5 s at one refresh per 0.25 s: one or two frames, never a flood.
    assert 1 <= len(frames) <= 3
    assert "IOPS" in frames[0] and "MB/s" in frames[0]
    assert "Run status group 0" in out.getvalue()


def test_no_progress_line_when_not_a_terminal(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(*bench_args(target)) == 0
    assert "IOPS" not in capsys.readouterr().err


def test_format_progress_says_how_far_and_how_long_to_go() -> None:
    # 2.5 s into --ramp-time + --runtime of 10 s.
    line = format_progress(2.5, 10, 12345.4, 50.5e6)
    assert line == "[ 25.0%]    2.5s ETA   7.5s      12345 IOPS       50.5 MB/s"
    # Past the end (the jobs draining their I/Os): 100%, nothing left.
    assert format_progress(12, 10, 0, 0).startswith("[100.0%]   12.0s ETA   0.0s")


@pytest.mark.parametrize(
    "extra",
    [
        ("--rw", "trim"),
        ("--bs", "lots"),
        ("--iodepth", "0"),
        ("--rwmixread", "101"),
        ("--copy-mode", "magic"),
        ("--runtime", "-1"),
    ],
)
def test_bad_arguments_exit_2(extra: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("-a", "127.0.0.1", "--nqn", NQN, *extra)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--bs", "1000"), "not a multiple of the block size 512"),
        (("--size", "1G"), "past the namespace's"),
        (("--copy-ranges", "2"), "apply to --rw copy only"),
        (("--rw", "copy", "--verify"), "--verify is not supported with --rw copy"),
        (("--rw", "copy", "--size", "4k", "--bs", "4k"), "region too small"),
        (("--namespace-id", "9"), "namespace 9 is not active"),
        (("--runtime", "0"), "--runtime must be positive"),
    ],
)
def test_bad_values_exit_1_with_a_message(
    target: BackgroundTarget,
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    message: str,
) -> None:
    assert run(*bench_args(target, *extra)) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_inline_data_size_caps_in_capsule_data(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    controllers: list[Controller] = []
    real_connect = bench_cli.connect

    async def recording_connect(*args: Any, **kwargs: Any) -> Controller:
        ctrl = await real_connect(*args, **kwargs)
        controllers.append(ctrl)
        return ctrl

    monkeypatch.setattr(bench_cli, "connect", recording_connect)
    out = run_json(target, capsys, "--rw", "randwrite", "--inline-data-size", "0")
    assert out["jobs"][0]["write"]["total_ios"] > 0  # writes still work, via R2T
    [ctrl] = controllers
    assert ctrl.io_inline_limit == 0
    assert all(q.conn.inline_limit == 0 for q in ctrl.io_queues)
