"""What the metrics endpoint costs a target's I/O: 4 KiB random reads by spdk_nvme_perf
from a `pynvmf target` with `--metrics-listen` (latency tracking on) and without
(off), alternated, each run a fresh target; median IOPS of each and their ratio.

    python benchmarks/metrics_cost.py [--repeats 5] [--runtime 10] [--qd 32]
        [--target-cpu 0] [--host-cpu 1] [--spdk /work/spdk/build]

The target runs this checkout's code, compiled if `make compiled` was run (the first
line says which). docs/metrics.md records the results.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
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


def one(args: argparse.Namespace, metrics: bool) -> float:
    """IOPS of one spdk_nvme_perf run against a fresh target."""
    port = free_port()
    cmd = [
        *("taskset", "-c", str(args.target_cpu), sys.executable, "-m", "pynvmf", "target"),
        *("--listen", f"127.0.0.1:{port}", "--discovery-port", "0", "--nqn", NQN),
        *("--memory", "256M"),
        *(("--metrics-listen", "127.0.0.1:0") if metrics else ()),
    ]
    target = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        wait_listening(port, target)
        trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
        perf = [
            str(Path(args.spdk) / "bin/spdk_nvme_perf"),
            *("-c", hex(1 << args.host_cpu), "-i", str(os.getpid() % 1000)),
            *("-q", str(args.qd), "-o", "4096", "-w", "randread", "-t", str(args.runtime)),
            *("-r", trid),
        ]
        out = subprocess.run(perf, capture_output=True, text=True, timeout=args.runtime + 60)
        m = _TOTAL.search(out.stdout)
        if out.returncode or not m:
            raise RuntimeError(f"spdk_nvme_perf failed:\n{out.stdout}{out.stderr}")
        return float(m.group(1))
    finally:
        target.terminate()
        target.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runtime", type=int, default=10)
    parser.add_argument("--qd", type=int, default=32)
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    parser.add_argument("--spdk", default=os.environ.get("SPDK_DIR", "/work/spdk/build"))
    args = parser.parse_args()
    from pynvmf.compiled import compiled_modules

    print("hot modules:", "compiled (mypyc)" if compiled_modules() else "pure Python")
    results: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.repeats):
        # Alternated, the order swapped every repeat: a drift of the machine hits both.
        for metrics in (False, True) if rep % 2 == 0 else (True, False):
            iops = one(args, metrics)
            results[metrics].append(iops)
            print(
                f"repeat {rep} metrics {'on ' if metrics else 'off'}: {iops:,.0f} IOPS", flush=True
            )
    off, on = statistics.median(results[False]), statistics.median(results[True])
    print(f"median IOPS off {off:,.0f}, on {on:,.0f}: on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
