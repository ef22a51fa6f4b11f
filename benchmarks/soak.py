"""Soak: a target under verified load with hosts connecting and disconnecting throughout,
its RSS sampled, to show that memory stays flat.

    python benchmarks/soak.py [--duration 600] [--jobs 8] [--iodepth 128] [--out docs/soak.md]

`pynvmf bench --rw randrw --verify` keeps `--jobs` queues of `--iodepth` 4 KiB I/Os on a
memory namespace for the whole run, while another host connects (admin and I/O queue),
does a write and a read, and disconnects, over and over. The target's RSS is read from
/proc every 10 s. The report gives the RSS curve, the growth from the end of the first
minute (warm-up) to the end, the connect cycles done and the bench's verify result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynvmf.host import connect  # noqa: E402
from tests.support.ports import free_tcp_port  # noqa: E402
from tests.support.target_process import TargetProcess  # noqa: E402

NQN = "nqn.2024-11.dev.pynvmf:soak"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _churn(port: int, stop: asyncio.Event) -> int:
    cycles = 0
    data = bytes(range(256)) * 16
    while not stop.is_set():
        async with await connect("127.0.0.1", port, NQN, queues=1, kato_ms=5000) as ctrl:
            ns = ctrl.namespace(1)
            await ns.write(1 << 20, data)
            back = bytearray(len(data))
            await ns.read(1 << 20, memoryview(back))
            assert back == data
        cycles += 1
    return cycles


async def _sample(pid: int, stop: asyncio.Event, every: float) -> list[tuple[float, float]]:
    start = time.monotonic()
    samples = [(0.0, _rss_mib(pid))]
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        samples.append((time.monotonic() - start, _rss_mib(pid)))
    return samples


async def soak(duration: float, jobs: int, iodepth: int, workdir: Path) -> dict[str, object]:
    port = free_tcp_port()
    proc = TargetProcess(
        None,
        workdir,
        ["--listen", f"127.0.0.1:{port}", "--discovery-port", "0", "--nqn", NQN, "--memory", "1G"],
    )
    proc.start()
    pid = proc.pid
    bench = await asyncio.create_subprocess_exec(
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
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--verify",
        "--numjobs",
        str(jobs),
        "--iodepth",
        str(iodepth),
        "--runtime",
        str(duration),
        "--size",
        "256m",
        "-o",
        "json",
        "--group-reporting",
        stdout=subprocess.PIPE,
    )
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(pid, stop, 10.0))
    churn = asyncio.create_task(_churn(port, stop))
    out, _ = await bench.communicate()
    stop.set()
    samples = await sampler
    cycles = await churn
    status = proc.stop(expect=None)
    report = json.loads(out)
    job = report["jobs"][0]
    warm = next((rss for t, rss in samples if t >= 60), samples[-1][1])
    return {
        "duration_s": duration,
        "jobs": jobs,
        "iodepth": iodepth,
        "bench_exit": bench.returncode,
        "verify_errors": job.get("error", 0),
        "read_iops": job["read"]["iops"],
        "write_iops": job["write"]["iops"],
        "connect_cycles": cycles,
        "rss_mib": samples,
        "rss_growth_after_warmup_mib": samples[-1][1] - warm,
        "target_exit": status,
    }


def _markdown(result: dict[str, object], command: str) -> str:
    samples = result["rss_mib"]
    assert isinstance(samples, list)
    lines = [
        "# Soak: RSS under verified load with connects and disconnects",
        "",
        f"Command: `{command}` (target and load on one 2-core machine).",
        "",
        f"- {result['jobs']} queues x QD {result['iodepth']} of 4 KiB randrw with verify for "
        f"{result['duration_s']:.0f} s: {result['read_iops']:.0f} read + "
        f"{result['write_iops']:.0f} write IOPS, verify errors {result['verify_errors']}, "
        f"bench exit {result['bench_exit']}",
        f"- another host connected, wrote, read back and disconnected "
        f"{result['connect_cycles']} times meanwhile",
        f"- target RSS from the end of the first minute to the end: "
        f"{result['rss_growth_after_warmup_mib']:+.1f} MiB; target exit {result['target_exit']}",
        "",
        "| t (s) | RSS (MiB) |",
        "|---:|---:|",
        *(f"| {t:.0f} | {rss:.1f} |" for t, rss in samples),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--iodepth", type=int, default=128)
    parser.add_argument("--out", type=Path, help="write the report (Markdown) here")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pynvmf-soak"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(soak(args.duration, args.jobs, args.iodepth, args.workdir))
    command = "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    text = _markdown(result, command)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
