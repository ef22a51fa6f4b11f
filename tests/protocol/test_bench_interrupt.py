"""`pynvmf bench` run as a command and interrupted with a real SIGINT, as Ctrl-C does.

The target runs in the test's process (raw_target_factory) on a device that counts
the I/Os it serves: the signal goes out once the measurement has demonstrably begun,
whatever the speed of the machine.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys

import pytest

from pynvmf.block.device import Buffer
from pynvmf.block.memory import MemoryDevice
from pynvmf.cli.common import EXIT_INTERRUPTED
from pynvmf.target.subsystem import Namespace, Subsystem
from tests.protocol.conftest import RawTargetFactory

pytestmark = pytest.mark.timeout(180)

NQN = "nqn.2024-01.io.pynvmf.test:bench-interrupt"
REQUESTED_S = 600
WAIT_S = 60


class GatedDevice(MemoryDevice):
    """16 MiB of memory counting the I/Os it serves: `served` is set after `threshold`
    of them; with `hang`, every later I/O waits for `gate` (a target that stopped
    answering)."""

    def __init__(self, threshold: int, *, hang: bool = False) -> None:
        super().__init__(16 * 1024 * 1024, 512)
        self.threshold = threshold
        self.hang = hang
        self.ios = 0
        self.served = asyncio.Event()
        self.gate = asyncio.Event()

    async def _enter(self) -> None:
        if self.hang and self.served.is_set():
            await self.gate.wait()

    def _count(self) -> None:
        self.ios += 1
        if self.ios >= self.threshold:
            self.served.set()

    async def read(self, lba: int, buf: memoryview) -> None:
        await self._enter()
        await super().read(lba, buf)
        self._count()

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self._enter()
        await super().write(lba, data, fua=fua)
        self._count()


async def serve(factory: RawTargetFactory, device: GatedDevice) -> int:
    """Start a target with `device` as namespace 1 of NQN; its port."""
    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "gated:1"))
    raw = await factory([subsystem])
    return raw.port.port


def _sigint_as_at_a_terminal() -> None:
    # A command started from a script in the background inherits SIGINT ignored (and
    # pynvmf bench then leaves it so); the test runner may be such a command.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_bench(port: int, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pynvmf",
        "bench",
        "-a",
        "127.0.0.1",
        "-s",
        str(port),
        "--nqn",
        NQN,
        "--runtime",
        str(REQUESTED_S),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_sigint_as_at_a_terminal,
    )


async def finish(proc: asyncio.subprocess.Process) -> tuple[str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    return out.decode(), err.decode()


async def kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("output", ["json", "normal"])
async def test_sigint_reports_what_was_measured(
    raw_target_factory: RawTargetFactory, output: str
) -> None:
    device = GatedDevice(threshold=3000)
    port = await serve(raw_target_factory, device)
    proc = await start_bench(port, "--rw", "randrw", "--iodepth", "4", "-o", output)
    try:
        await asyncio.wait_for(device.served.wait(), WAIT_S)
        proc.send_signal(signal.SIGINT)
        out, err = await finish(proc)
    finally:
        await kill(proc)

    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "interrupted" in err and "Traceback" not in err
    if output == "json":
        [job] = json.loads(out)["jobs"]
        assert job["error"] == 0
        ios = job["read"]["total_ios"] + job["write"]["total_ios"]
        assert ios > 0 and job["read"]["iops"] > 0 and job["write"]["iops"] > 0
        assert 0 < job["job_runtime"] < REQUESTED_S * 1000 / 10
        for key in ("usr_cpu", "sys_cpu", "ctx", "majf", "minf"):
            assert job[key] >= 0
    else:
        [run] = re.findall(r"READ: bw=.*, run=(\d+)-\d+msec", out)
        assert 0 < int(run) < REQUESTED_S * 1000 / 10
        assert re.search(r"  read: IOPS=[1-9]", out) and re.search(r"  write: IOPS=[1-9]", out)
        assert re.search(r"  cpu          : usr=\d+\.\d\d%, sys=\d+\.\d\d%, ctx=\d+", out)


async def test_a_second_sigint_aborts(raw_target_factory: RawTargetFactory) -> None:
    # The target stops answering: after the first SIGINT the jobs wait for their I/Os
    # in flight, and only a second SIGINT ends the command.
    device = GatedDevice(threshold=500, hang=True)
    port = await serve(raw_target_factory, device)
    proc = await start_bench(port, "--rw", "randread", "--iodepth", "4", "-o", "json")
    try:
        await asyncio.wait_for(device.served.wait(), WAIT_S)
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        # The note says that the first SIGINT was handled (and the next one aborts).
        note = await asyncio.wait_for(proc.stderr.readline(), WAIT_S)
        assert b"interrupted" in note
        assert proc.returncode is None
        proc.send_signal(signal.SIGINT)
        out, err = await finish(proc)
    finally:
        await kill(proc)
        device.gate.set()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert out == ""  # aborted: no report
