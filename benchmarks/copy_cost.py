"""What one small Copy costs next to one 4 KiB Read, on the host and on the target.

The target runs in its own process pinned to CPU 0, the host in this one pinned to
CPU 1 (over loopback). For each workload the host keeps `--depth` commands in flight
for `--seconds` and the CPU time each side used is divided by the commands done:
CPU time per command is much less sensitive to other load on the machine than a rate.
Workloads are alternated `--repeat` times and medians printed.

    python3 benchmarks/copy_cost.py                     # memory namespace
    python3 benchmarks/copy_cost.py --file /var/tmp/x   # a file namespace
    python3 benchmarks/copy_cost.py --callgrind target  # target instructions per command
    python3 benchmarks/copy_cost.py --callgrind host    # host instructions per command

With `--callgrind` one side runs under valgrind's callgrind and the figure is the
instructions it executed per command: deterministic, so it decides where timings are
too noisy (a run of a few commands is subtracted, which leaves the per-command cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pynvmf.aio import install_uvloop  # noqa: E402
from pynvmf.block.copy import SourceRange, copy  # noqa: E402
from pynvmf.host import connect  # noqa: E402
from tests.support.target_process import TargetProcess  # noqa: E402

NQN = "nqn.2024-11.dev.pynvmf:copy-cost"
BLOCK = 4096
WORKLOADS = ("read 4 KiB", "copy 8 KiB x 1", "copy 8 KiB x 1 (planner)")


@contextmanager
def _target(workdir: Path, backend: list[str], callgrind: str | None) -> Iterator[TargetProcess]:
    """The target on CPU 0 (under callgrind, writing to `callgrind`), on a port it picks."""
    wrapper = ["taskset", "-c", "0"]
    if callgrind:
        wrapper += ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}"]
    args = ["--listen", "127.0.0.1:0", "--discovery-port", "0", "--nqn", NQN]
    target = TargetProcess(
        None,
        workdir,
        [*args, "--block-size", str(BLOCK), *backend],
        wrapper=wrapper,
        verbose=False,
    )
    target.start(timeout=600)  # valgrind takes its time
    try:
        yield target
    finally:
        target.stop(timeout=120, expect=None)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(
    port: int, pid: int | None, workload: str, seconds: float, depth: int, count: int | None
) -> dict[str, float]:
    async with await connect("127.0.0.1", port, NQN, queues=1, queue_depth=128) as ctrl:
        ns = ctrl.namespace(1)
        half = ns.capabilities.num_blocks // 2
        bufs = [memoryview(bytearray(BLOCK)) for _ in range(depth)]
        # Every workload works on the same blocks: the Reads and the Copies' sources span the
        # first `depth` x 128 blocks, the Copies' destinations as many from `half`. They hold
        # data, so that the target copies real pages: an untouched memory namespace maps
        # every page to the kernel's one zero page, which a Read would send from the cache.
        span = depth * 128
        chunk = random.Random(0).randbytes(32 * BLOCK)
        for base in (0, half):
            for lba in range(base, base + span, 32):
                await ns.write(lba, chunk)

        def op(slot: int) -> Callable[[int], Awaitable[None]]:
            buf = bufs[slot]
            if workload == "read 4 KiB":
                return lambda i: ns.read(slot * 128 + i % 128, buf)
            if workload == "copy 8 KiB x 1":
                return lambda i: ns.copy_offload(
                    [(ns, slot * 128 + (i % 32) * 2, 2)], half + slot * 128 + (i % 32) * 2
                )
            src = SourceRange
            return lambda i: copy(
                [src(ns, slot * 128 + (i % 32) * 2, 2)], ns, half + slot * 128 + (i % 32) * 2
            )

        done = [0]

        async def slot(s: int, deadline: float, limit: int | None) -> None:
            run = op(s)
            i = 0
            while (time.perf_counter() < deadline) if limit is None else i < limit:
                await run(i)
                i += 1
            done[0] += i

        # Warm-up: by count when counting instructions (a time would not be deterministic).
        warm = None if count is None else 4
        await asyncio.gather(*(slot(s, time.perf_counter() + 0.2, warm) for s in range(depth)))
        done[0] = 0
        t0 = _cpu_seconds(pid) if pid else 0.0
        h0 = time.process_time()
        w0 = time.perf_counter()
        per_slot = None if count is None else count // depth
        await asyncio.gather(*(slot(s, w0 + seconds, per_slot) for s in range(depth)))
        wall = time.perf_counter() - w0
        host = time.process_time() - h0
        target = (_cpu_seconds(pid) - t0) if pid else 0.0
        n = done[0]
        return {
            "commands": n,
            "per_s": n / wall,
            "host_us": host / n * 1e6,
            "target_us": target / n * 1e6,
        }


def _host(args: list[str]) -> None:
    os.sched_setaffinity(0, {1})
    install_uvloop()  # as the pynvmf CLI's host and target run
    port, pid, workload, seconds, depth, count = args
    print(
        json.dumps(
            asyncio.run(
                _run(
                    int(port),
                    int(pid) or None,
                    workload,
                    float(seconds),
                    int(depth),
                    int(count) or None,
                )
            )
        )
    )


def _host_run(
    port: int,
    pid: int,
    workload: str,
    seconds: float,
    depth: int,
    count: int = 0,
    callgrind: str | None = None,
) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--host", str(port), str(pid), workload]
    cmd += [str(seconds), str(depth), str(count)]
    if callgrind:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def _instructions(path: str) -> int:
    text = Path(path).read_text(errors="replace")
    m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    assert m, "no callgrind summary"
    return int(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--file", help="a file namespace at this path (created, 1 GiB)")
    parser.add_argument("--callgrind", choices=("target", "host"))
    parser.add_argument("--quick", action="store_true", help="1 s, 1 repeat")
    parser.add_argument("--count", type=int, default=20000, help="commands, with --callgrind")
    parser.add_argument("--keep", help="with --callgrind: keep the profiles in this directory")
    parser.add_argument(
        "--workload", action="append", choices=WORKLOADS, help="only these (repeatable)"
    )
    parser.add_argument("--host", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        _host(args.host)
        return
    if args.quick:
        args.seconds, args.repeat = 1.0, 1
    backend = ["--memory", "1G"]
    if args.file:
        with open(args.file, "ab") as f:
            f.truncate(1 << 30)
        backend = ["--file", args.file]
    if args.callgrind:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or scratch
            os.makedirs(tmp, exist_ok=True)
            base: dict[str, int] = {}
            for workload in args.workload or WORKLOADS:
                for count in (0, args.count):
                    out = f"{tmp}/cg.{len(base)}"
                    on_target = out if args.callgrind == "target" else None
                    on_host = out if args.callgrind == "host" else None
                    with _target(Path(scratch), backend, on_target) as target:
                        _host_run(
                            target.port,
                            0,
                            workload,
                            0,
                            args.depth,
                            count or args.depth,
                            callgrind=on_host,
                        )
                    base[f"{workload}:{count}"] = _instructions(out)
                per = (base[f"{workload}:{args.count}"] - base[f"{workload}:0"]) / (
                    args.count - args.depth
                )
                print(f"{workload:28s} {args.callgrind} instructions per command: {per:,.0f}")
        return
    results: dict[str, list[dict[str, float]]] = {w: [] for w in args.workload or WORKLOADS}
    with tempfile.TemporaryDirectory() as scratch, _target(Path(scratch), backend, None) as target:
        for _ in range(args.repeat):
            for workload in results:
                run = _host_run(target.port, target.pid, workload, args.seconds, args.depth)
                results[workload].append(run)
    print(f"{'workload':28s} {'commands/s':>11s} {'host µs/cmd':>12s} {'target µs/cmd':>14s}")
    for workload, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"{workload:28s} {med['per_s']:11,.0f} {med['host_us']:12.1f} {med['target_us']:14.1f}"
        )
        print(json.dumps({"workload": workload, **med}))


if __name__ == "__main__":
    main()
