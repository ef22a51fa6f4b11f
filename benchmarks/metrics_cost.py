"""What the metrics endpoint costs a target's I/O: 4 KiB random reads by spdk_nvme_perf
from a `pynvmf target` with `--metrics-listen` (latency tracking on) and without
(off), alternated; median IOPS of each and their ratio.

    python benchmarks/metrics_cost.py [--repeats 5] [--runtime 10] [--qd 32]
        [--resident] [--target-cpu 0] [--host-cpu 1] [--spdk /work/spdk/build]

By default each run has a fresh target. With --resident both targets start once, on the
same CPU (a target with no connection waits in epoll and costs nothing), and the runs
alternate between them: starting a target costs seconds, so many short pairs fit where a
few long ones did, and on a shared machine it is the number of pairs that narrows the
median (a drift of the machine hits the two runs of a pair alike). Half the pairs run with
the endpoint's target started second, half with it started first (see resident()). The
first pair of each half warms the targets and is not counted. It prints the pairs' on/off
ratios, their median, and the range of the median over 2,000 bootstrap resamples of the
pairs (a 95% interval).
--control runs the second target without the endpoint too: what the method reads where
there is no difference (two processes on one CPU need not run alike).

The target runs this checkout's code, compiled if `make compiled` was run (the first
line says which). docs/metrics.md records the results.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NQN = "nqn.2024-11.dev.pynvmf:metrics-cost"
_TOTAL = re.compile(r"^Total\s*:\s*([\d.]+)", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the target exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the target did not listen")


@contextlib.contextmanager
def target(args: argparse.Namespace, metrics: bool) -> Iterator[int]:
    """A `pynvmf target` on --target-cpu, with or without the endpoint; yields its port."""
    port = free_port()
    cmd = [
        *("taskset", "-c", str(args.target_cpu), sys.executable, "-m", "pynvmf", "target"),
        *("--listen", f"127.0.0.1:{port}", "--discovery-port", "0", "--nqn", NQN),
        *("--memory", "256M"),
        *(("--metrics-listen", "127.0.0.1:0") if metrics else ()),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def perf(args: argparse.Namespace, port: int) -> float:
    """IOPS of one spdk_nvme_perf run against the target on `port`."""
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    cmd = [
        str(Path(args.spdk) / "bin/spdk_nvme_perf"),
        *("-c", hex(1 << args.host_cpu), "-i", str(os.getpid() % 1000)),
        *("-q", str(args.qd), "-o", "4096", "-w", "randread", "-t", str(args.runtime)),
        *("-r", trid),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.runtime + 60)
    m = _TOTAL.search(out.stdout)
    if out.returncode or not m:
        raise RuntimeError(f"spdk_nvme_perf failed:\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def one(args: argparse.Namespace, metrics: bool) -> float:
    """IOPS of one spdk_nvme_perf run against a fresh target."""
    with target(args, metrics) as port:
        return perf(args, port)


def bootstrap_median(ratios: list[float], rounds: int = 2000) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the median of `ratios` resampled."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(rounds * 0.025)], medians[int(rounds * 0.975) - 1]


def fresh(args: argparse.Namespace) -> dict[bool, list[float]]:
    """A fresh target for every run, with and without the endpoint in turn."""
    results: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.repeats):
        # Alternated, the order swapped every repeat: a drift of the machine hits both.
        for metrics in (False, True) if rep % 2 == 0 else (True, False):
            iops = one(args, metrics)
            results[metrics].append(iops)
            print(
                f"repeat {rep} metrics {'on ' if metrics else 'off'}: {iops:,.0f} IOPS", flush=True
            )
    return results


def resident(args: argparse.Namespace) -> dict[bool, list[float]]:
    """Both targets up at once, the runs alternated between them; then both started again
    in the other order for as many pairs. Two processes on one CPU need not run alike (the
    one started second ran 1.5-3% faster in --control runs), so each setting takes each
    place for half the pairs, and the ratios of the two halves cancel the place's share."""
    results: dict[bool, list[float]] = {False: [], True: []}
    halves = (args.repeats + 1) // 2, args.repeats // 2
    for half, pairs in enumerate(halves):
        first = half == 1  # which setting is started first: off, then on
        with (
            target(args, first and not args.control) as a,
            target(args, not first and not args.control) as b,
        ):
            ports = {first: a, not first: b}
            for rep in range(pairs + 1):
                pair: dict[bool, float] = {}
                for metrics in (False, True) if rep % 2 == 0 else (True, False):
                    pair[metrics] = perf(args, ports[metrics])
                if rep == 0:
                    continue  # warm-up
                for metrics, iops in pair.items():
                    results[metrics].append(iops)
                print(
                    f"half {half + 1} pair {rep}: off {pair[False]:,.0f} on {pair[True]:,.0f}"
                    f" IOPS, on/off {pair[True] / pair[False]:.3f}",
                    flush=True,
                )
        ratios = [b / a for a, b in zip(results[False], results[True], strict=True)][-pairs:]
        print(
            f"half {half + 1} ({'on' if first else 'off'} started first): pairs' on/off median"
            f" {statistics.median(ratios):.3f}",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runtime", type=int, default=10)
    parser.add_argument("--qd", type=int, default=32)
    parser.add_argument(
        "--resident", action="store_true", help="both targets up at once, runs alternated"
    )
    parser.add_argument(
        "--control", action="store_true", help="--resident with the endpoint off in both"
    )
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    parser.add_argument("--spdk", default=os.environ.get("SPDK_DIR", "/work/spdk/build"))
    args = parser.parse_args()
    from pynvmf.compiled import compiled_modules

    print("hot modules:", "compiled (mypyc)" if compiled_modules() else "pure Python")
    report(resident(args) if args.resident else fresh(args))


def report(results: dict[bool, list[float]]) -> None:
    off, on = statistics.median(results[False]), statistics.median(results[True])
    print(f"median IOPS off {off:,.0f}, on {on:,.0f}: on/off {on / off:.3f}")
    ratios = [b / a for a, b in zip(results[False], results[True], strict=True)]
    low, high = bootstrap_median(ratios)
    print(
        f"pairs' on/off: {min(ratios):.3f}-{max(ratios):.3f}, median"
        f" {statistics.median(ratios):.3f} (95% bootstrap interval {low:.3f}-{high:.3f})"
    )


if __name__ == "__main__":
    main()
