"""The target's cost per command with no socket: 4 KiB reads fed to one connection and I/O
queue of an in-memory namespace (the unit tests' rig), median ns per read over 7 runs.

    python benchmarks/command_cost.py [--runs 7] [--batch 16]

Run it in two checkouts, alternating, to compare them (docs/limits.md does so for the
memory budget); pin it to one CPU (taskset -c 0) on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pynvmf.spec.opcodes import IoOpcode
from tests.support.raw import capsule, rw_sqe
from tests.unit.test_target_fused import Rig


async def measure(runs: int, batch: int, rounds: int) -> list[float]:
    rig = Rig()
    blob = b"".join(capsule(rw_sqe(IoOpcode.READ, cid, 1, 0, 8, 4096)) for cid in range(batch))
    conn = rig.conn
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(rounds):
            conn.feed(blob)
            conn.take_output()
            conn.output_drained()
        results.append((time.perf_counter() - start) / (rounds * batch) * 1e9)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16, help="reads fed at once (<= 32)")
    parser.add_argument("--rounds", type=int, default=4000)
    args = parser.parse_args()
    results = asyncio.run(measure(args.runs, args.batch, args.rounds))
    print(f"{statistics.median(results):.0f} ns per 4 KiB read (median of {args.runs})")


if __name__ == "__main__":
    main()
