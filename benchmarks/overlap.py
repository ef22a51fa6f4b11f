"""Reads and Writes of the same blocks at once, on a busy machine: does any Read's data
fail its data digest, or any block of a Read arrive torn (part of one Write, part of
another)?

    python benchmarks/overlap.py [--seconds 60] [--size 16M] [--cores 1,2] [--busy 2]
        [--spdk DIR] [--tree LABEL=DIR]... [--io-size 4K] [--out FILE]

For each tree (this checkout by default; `--tree` adds others, e.g. a copy in which
`make compiled` built the hot modules) and each `--cores` value, a `pynvmf target
--memory SIZE` is started, `--busy` CPU-bound loops run beside it, and:

- SPDK's perf tool, when `--spdk` names its build (the folder holding bin/), runs
  `spdk_nvme_perf -q 128 -o IO_SIZE -w randrw -M 50 -H -I -P 4 -t SECONDS` (header and
  data digests, four queues, every block of the namespace in play); its log lines naming
  a data digest error are counted;
- a verifying client (pynvmf's host library, digests on) runs as many seconds: four
  controllers with 32 commands in flight each, half Writes of `--io-size` (4 KiB by
  default) whose every 512-byte
  block is one 16-byte stamp (writer, sequence) repeated, half Reads of that size that check
  each block is one stamp throughout. A Read of a block that a Write was changing must
  return it wholly old or wholly new (AWUN 0: one block is atomic).

Prints one row per (tree, cores): perf's IOPS and digest errors, the client's Reads,
Writes, torn blocks and failed commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynvmf.host import connect  # noqa: E402
from pynvmf.host.errors import NvmeError  # noqa: E402
from pynvmf.units import parse_size  # noqa: E402
from tests.support.ports import free_tcp_port  # noqa: E402

NQN = "nqn.2024-11.dev.pynvmf:overlap"
BLOCK = 512
IO = 4096
READ = IO
STAMP = struct.Struct("<QQ")
_DIGEST_ERROR = re.compile(r"data digest error", re.I)
_TOTAL = re.compile(r"^Total\s*:\s*([\d.]+)", re.M)


@contextlib.contextmanager
def target(tree: Path, size: int, cores: int, port: int) -> Iterator[None]:
    """`pynvmf target` from `tree` (its code is the one imported: PYTHONPATH and cwd)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "pynvmf", "target", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--discovery-port", "0", "--nqn", NQN, "--memory", str(size), "--cores", str(cores)]
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "pynvmf target ready":
            break
    else:
        raise RuntimeError(f"target did not start: {proc.stderr.read() if proc.stderr else ''}")
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(60)


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """`n` processes that keep a CPU busy (the machine the defect showed on was loaded)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_perf(spdk: Path, port: int, seconds: float) -> tuple[float, int, str]:
    """spdk_nvme_perf randrw with digests: (IOPS, data digest errors logged, tail)."""
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    cmd = [str(spdk / "bin/spdk_nvme_perf"), "-q", "128", "-o", str(IO), "-w", "randrw"]
    cmd += ["-M", "50", "-H", "-I", "-P", "4", "-t", f"{seconds:g}", "-r", trid]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    text = out.stdout + out.stderr
    m = _TOTAL.search(out.stdout)
    errors = sum(1 for line in text.splitlines() if _DIGEST_ERROR.search(line))
    return (float(m.group(1)) if m else 0.0), errors, text[-2000:]


@dataclass
class Verified:
    reads: int = 0
    writes: int = 0
    torn: int = 0
    failed: int = 0
    examples: list[str] = field(default_factory=list)


def _stamped(writer: int, seq: int) -> bytes:
    return STAMP.pack(writer, seq) * (IO // STAMP.size)


async def verify(port: int, size: int, seconds: float, controllers: int, depth: int) -> Verified:
    result = Verified()
    blocks = size // BLOCK
    deadline = time.monotonic() + seconds
    seq = itertools.count(1)
    ctrls = [
        await connect("127.0.0.1", port, NQN, header_digest=True, data_digest=True)
        for _ in range(controllers)
    ]
    try:

        async def worker(ns_index: int, slot: int) -> None:
            ns = ctrls[ns_index].namespace(1)
            rng = random.Random(ns_index * 1000 + slot)
            buf = bytearray(READ)
            writer = ns_index * 1000 + slot + 1
            while time.monotonic() < deadline:
                lba = rng.randrange(0, blocks - max(IO, READ) // BLOCK + 1)
                try:
                    if rng.random() < 0.5:
                        await ns.write(lba, _stamped(writer, next(seq)))
                        result.writes += 1
                        continue
                    await ns.read(lba, memoryview(buf))
                except (NvmeError, OSError) as exc:
                    result.failed += 1
                    if len(result.examples) < 5:
                        result.examples.append(f"LBA {lba}: {exc!r}")
                    continue
                result.reads += 1
                for i in range(0, READ, BLOCK):
                    block = buf[i : i + BLOCK]
                    if block != block[: STAMP.size] * (BLOCK // STAMP.size):
                        result.torn += 1
                        if len(result.examples) < 5:
                            result.examples.append(f"torn block at LBA {lba + i // BLOCK}")

        await asyncio.gather(*(worker(c, s) for c in range(controllers) for s in range(depth)))
    finally:
        for ctrl in ctrls:
            await ctrl.close()
    return result


def main() -> int:
    global IO, READ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", type=parse_size, default=16 << 20)
    parser.add_argument("--cores", default="1,2", help="comma-separated --cores values")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound loops beside")
    parser.add_argument("--spdk", type=Path, help="SPDK's build folder (holding bin/)")
    parser.add_argument("--tree", action="append", default=[], help="LABEL=DIR")
    parser.add_argument("--controllers", type=int, default=4)
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument(
        "--io-size",
        type=parse_size,
        default=IO,
        help="bytes per Read and Write (above 16K, Reads are lent views: block/inplace.py)",
    )
    parser.add_argument(
        "--read-size",
        type=parse_size,
        default=0,
        help="the client's Reads only (default --io-size): large Reads beside in-capsule "
        "Writes meet them in one batch",
    )
    args = parser.parse_args()
    IO = args.io_size
    READ = args.read_size or IO
    trees = [("this tree", REPO)] + [
        (label, Path(where)) for label, _, where in (t.partition("=") for t in args.tree)
    ]
    rows = [
        "| tree | --cores | perf IOPS | perf digest errors | client reads | client writes "
        "| torn blocks | failed commands |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bad = False
    for label, tree in trees:
        for cores in (int(c) for c in args.cores.split(",")):
            port = free_tcp_port()
            with target(tree, args.size, cores, port), busy_loops(args.busy):
                iops, errors, tail = 0.0, -1, ""
                if args.spdk is not None:
                    iops, errors, tail = run_perf(args.spdk, port, args.seconds)
                checked = asyncio.run(
                    verify(port, args.size, args.seconds, args.controllers, args.depth)
                )
            perf = (f"{iops:,.0f}", str(errors)) if args.spdk is not None else ("-", "-")
            rows.append(
                f"| {label} | {cores} | {perf[0]} | {perf[1]} | {checked.reads:,} | "
                f"{checked.writes:,} | {checked.torn} | {checked.failed} |"
            )
            print(rows[-1], flush=True)
            for example in checked.examples:
                print(f"    {example}", flush=True)
            if errors > 0 or checked.torn or checked.failed or (args.spdk and not iops):
                bad = True
                if tail:
                    print(tail, flush=True)
    table = "\n".join(rows)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
