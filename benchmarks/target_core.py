"""How fast is the pynvmf target on one core?

The target runs in a child process pinned to one CPU with a 1 GiB in-memory
namespace; this process, pinned to another CPU, drives it over loopback TCP
with the pynvmf host library, keeping a fixed number of I/Os in flight with one
asyncio task per slot. Each workload runs for --runtime seconds (after a short
warm-up), the whole set is repeated --repeat times, and the table shows medians.

    python benchmarks/target_core.py [--runtime 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import platform
import random
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pynvmf.host import RemoteNamespace, connect
from pynvmf.tcp import digest

NQN = "nqn.2024-01.org.pynvmf:bench"
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class Workload:
    name: str
    write: bool
    block: int
    qd: int
    sequential: bool


WORKLOADS = [
    Workload("4k randread QD1", False, 4 * KiB, 1, False),
    Workload("4k randread QD32", False, 4 * KiB, 32, False),
    Workload("4k randwrite QD32", True, 4 * KiB, 32, False),
    Workload("128k seqread QD8", False, 128 * KiB, 8, True),
]


@dataclass
class Result:
    iops: float
    mbps: float
    lat_us: float
    target_cpu: float  # fraction of one CPU
    host_cpu: float


# -- the target, in its own process ---------------------------------------------------------


def use_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def target_main(conn: Connection, cpu: int, size: int, inline: int) -> None:
    """Child process: serve one subsystem until the parent says stop (or goes away)."""
    os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    uvloop = use_uvloop()
    asyncio.run(_serve(conn, size, inline, uvloop))


async def _serve(conn: Connection, size: int, inline: int, uvloop: bool) -> None:
    from pynvmf.block.memory import MemoryDevice
    from pynvmf.target.server import Port, Target
    from pynvmf.target.subsystem import Namespace, Subsystem
    from pynvmf.tcp.target import TransportConfig

    subsystem = Subsystem(NQN)
    subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(size), "bench-memory"))
    port = Port("127.0.0.1", 0, transport=TransportConfig(inline_data_size=inline))
    target = Target([subsystem], [port])
    await target.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)  # any message, or EOF, means stop
    conn.send((port.port, uvloop))
    await stop.wait()
    loop.remove_reader(conn.fileno())
    await target.stop()


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the load generator -------------------------------------------------------------------


class Counter:
    __slots__ = ("ios", "latency")

    def __init__(self) -> None:
        self.ios = 0
        self.latency = 0.0


async def run_workload(
    ns: RemoteNamespace, w: Workload, runtime: float, warmup: float, target_pid: int
) -> Result:
    caps = ns.capabilities
    blocks_per_io = w.block // caps.block_size
    slots = caps.num_blocks // blocks_per_io
    stop = [False]
    counters = [Counter() for _ in range(w.qd)]
    seq = [0]
    rng = random.Random(w.name)
    # Precomputed offsets keep the random generator out of the timed loop; each
    # worker walks them from its own starting point.
    offsets = [rng.randrange(slots) * blocks_per_io for _ in range(1 << 16)]
    mask = len(offsets) - 1

    async def worker(counter: Counter, start: int) -> None:
        buf = memoryview(bytearray(rng.randbytes(w.block)))
        io: Callable[[int, memoryview], Coroutine[Any, Any, None]] = (
            ns.write if w.write else ns.read
        )
        i = start
        clock = time.perf_counter
        while not stop[0]:
            if w.sequential:
                lba = seq[0]
                nxt = lba + blocks_per_io
                seq[0] = nxt if nxt + blocks_per_io <= caps.num_blocks else 0
            else:
                lba = offsets[i & mask]
                i += 1
            t0 = clock()
            await io(lba, buf)
            counter.latency += clock() - t0
            counter.ios += 1

    stride = len(offsets) // w.qd
    tasks = [asyncio.create_task(worker(c, n * stride)) for n, c in enumerate(counters)]
    await asyncio.sleep(warmup)
    ios0 = sum(c.ios for c in counters)
    lat0 = sum(c.latency for c in counters)
    t0, host0, target0 = time.perf_counter(), time.process_time(), process_cpu_seconds(target_pid)
    await asyncio.sleep(runtime)
    ios1 = sum(c.ios for c in counters)
    lat1 = sum(c.latency for c in counters)
    t1, host1, target1 = time.perf_counter(), time.process_time(), process_cpu_seconds(target_pid)
    stop[0] = True
    await asyncio.gather(*tasks)
    elapsed = t1 - t0
    ios = ios1 - ios0
    return Result(
        iops=ios / elapsed,
        mbps=ios * w.block / elapsed / 1e6,
        lat_us=(lat1 - lat0) / max(ios, 1) * 1e6,
        target_cpu=(target1 - target0) / elapsed,
        host_cpu=(host1 - host0) / elapsed,
    )


async def prefill(ns: RemoteNamespace) -> None:
    """Write every block once, so reads touch real pages rather than the zero page."""
    caps = ns.capabilities
    chunk = 1 * MiB
    data = memoryview(random.Random(0).randbytes(chunk))
    per = chunk // caps.block_size
    positions = iter(range(0, caps.num_blocks, per))

    async def writer() -> None:
        for lba in positions:
            n = min(per, caps.num_blocks - lba)
            await ns.write(lba, data[: n * caps.block_size])

    await asyncio.gather(*(writer() for _ in range(4)))


async def drive(args: argparse.Namespace, port: int, target_pid: int) -> dict[str, list[Result]]:
    results: dict[str, list[Result]] = {w.name: [] for w in WORKLOADS}
    async with await connect(
        "127.0.0.1",
        port,
        NQN,
        queues=args.queues,
        queue_depth=64,
        header_digest=args.digests,
        data_digest=args.digests,
        disable_sqflow=args.disable_sqflow,
    ) as ctrl:
        ns = ctrl.namespace(1)
        if not args.no_prefill:
            t = time.perf_counter()
            await prefill(ns)
            print(
                f"prefill: {ns.capabilities.size / GiB:.1f} GiB written in "
                f"{time.perf_counter() - t:.1f} s",
                file=sys.stderr,
            )
        for r in range(args.repeat):
            for w in WORKLOADS:
                res = await run_workload(ns, w, args.runtime, args.warmup, target_pid)
                results[w.name].append(res)
                print(
                    f"run {r + 1}/{args.repeat} {w.name:<18} {res.iops:>10.0f} IOPS "
                    f"{res.mbps:>8.1f} MB/s {res.lat_us:>8.1f} us "
                    f"target CPU {res.target_cpu:>4.0%}",
                    file=sys.stderr,
                )
    return results


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def report(
    args: argparse.Namespace,
    results: dict[str, list[Result]],
    uvloop: tuple[bool, bool],
    cpus: tuple[int, int],
) -> None:
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: nproc {os.cpu_count()}, {cpu_model()}, {platform.system()} {platform.release()}"
    )
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"uvloop target {'on' if uvloop[0] else 'off'} / host {'on' if uvloop[1] else 'off'}, "
        f"crc32c: {digest.IMPLEMENTATION}"
    )
    print(
        f"target on CPU {cpus[0]}, host on CPU {cpus[1]}; 1 GiB memory namespace, "
        f"{args.queues} I/O queue(s), in-capsule {args.inline} B, "
        f"digests {'on' if args.digests else 'off'}, "
        f"SQ flow control {'off' if args.disable_sqflow else 'on'}"
    )
    print(
        f"{args.runtime:g} s per run after {args.warmup:g} s warm-up, median of {args.repeat} runs"
    )
    print()
    header = (
        f"{'workload':<20}{'IOPS':>10}{'MB/s':>10}{'mean lat us':>13}"
        f"{'target CPU':>12}{'host CPU':>10}"
    )
    print(header)
    print("-" * len(header))
    medians: dict[str, Result] = {}
    for name, runs in results.items():
        m = Result(
            *(
                statistics.median(getattr(r, f) for r in runs)
                for f in ("iops", "mbps", "lat_us", "target_cpu", "host_cpu")
            )
        )
        medians[name] = m
        print(
            f"{name:<20}{m.iops:>10.0f}{m.mbps:>10.1f}{m.lat_us:>13.1f}"
            f"{m.target_cpu:>12.0%}{m.host_cpu:>10.0%}"
        )
    qd1 = medians["4k randread QD1"].iops
    qd32 = medians["4k randread QD32"].iops
    print()
    print(f"4k randread QD32 / QD1 IOPS: {qd32 / qd1:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--queues", type=int, default=1, help="I/O queues (connections)")
    parser.add_argument("--inline", type=int, default=16 * KiB, help="in-capsule data size")
    parser.add_argument("--digests", action="store_true", help="header and data digests")
    parser.add_argument(
        "--disable-sqflow",
        action="store_true",
        help="ask for SQ flow control off (reads complete on C2HData)",
    )
    parser.add_argument("--no-prefill", action="store_true", help="skip writing 1 GiB first")
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    args = parser.parse_args()

    available = os.sched_getaffinity(0)
    if args.target_cpu not in available or args.host_cpu not in available:
        parser.error(f"CPUs {args.target_cpu} and {args.host_cpu} must be in {sorted(available)}")
    if args.target_cpu == args.host_cpu:
        print("warning: target and host share a CPU", file=sys.stderr)

    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(
        target=target_main,
        args=(child_end, args.target_cpu, 1 * GiB, args.inline),
        name="pynvmf-target",
    )
    child.start()
    child_end.close()
    try:
        if not parent_end.poll(30):
            raise SystemExit("target did not start")
        port, target_uvloop = parent_end.recv()
        os.sched_setaffinity(0, {args.host_cpu})
        host_uvloop = use_uvloop()
        assert child.pid is not None
        results = asyncio.run(drive(args, port, child.pid))
    finally:
        with contextlib.suppress(OSError):
            parent_end.send("stop")
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join()
    report(args, results, (target_uvloop, host_uvloop), (args.target_cpu, args.host_cpu))


if __name__ == "__main__":
    main()
