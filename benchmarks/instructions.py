"""The target's CPU cost per command, as instructions (callgrind) or nanoseconds.

The whole per-command path of the target but the kernel's and the event loop's:
the asyncio protocol object (TargetProtocol: get_buffer, buffer_updated, the flush
that hands the output to the transport), the transport (PDU parsing, framing,
digests), the queue and the I/O handler on a memory namespace. A fake transport
takes the place of the socket and counts what it is given. Commands are fed
`--batch` at a time (32: QD32 as spdk_nvme_perf's commands pile up in the socket
between two wake-ups; 1: QD1), each batch in one buffer_updated, as uvloop would
hand them over.

    python3 benchmarks/instructions.py [--workloads read4k,write4k] [--batch 32]
        time:      median ns per command over --runs runs (pin it: taskset -c 0)
    python3 benchmarks/instructions.py --callgrind
        instructions per command under valgrind --tool=callgrind (deterministic, so
        usable on a shared machine): the count for 2N commands minus that for N,
        over N, so the setup cancels out.
    --latency-tracking: with commands timed (latency histograms), as while the metrics
        endpoint listens.

Run it in two checkouts to compare them; docs/performance.md records the results. It
measures whichever path the checkout imports: the pure-Python source, or the compiled hot
modules after `make compiled` (the first line of output says which).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynvmf.malloc import tune_for_io_buffers  # noqa: E402
from pynvmf.spec import pdu as P  # noqa: E402
from pynvmf.spec.opcodes import IoOpcode  # noqa: E402
from tests.support.raw import capsule, icreq, rw_sqe  # noqa: E402

KiB = 1024
BLOCK = 512

# name: (opcode, bytes per command, in-capsule data, digests)
WORKLOADS: dict[str, tuple[int, int, bool, bool]] = {
    "read4k": (IoOpcode.READ, 4 * KiB, False, False),
    "write4k": (IoOpcode.WRITE, 4 * KiB, True, False),
    "write8k": (IoOpcode.WRITE, 8 * KiB, True, False),
    "read4k-digests": (IoOpcode.READ, 4 * KiB, False, True),
    "write4k-digests": (IoOpcode.WRITE, 4 * KiB, True, True),
    "read128k": (IoOpcode.READ, 128 * KiB, False, False),
}


class FakeTransport:
    """What TargetProtocol uses of an asyncio transport; output is counted, not sent."""

    def __init__(self) -> None:
        self.buffers = 0
        self.bytes = 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 4420), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def writelines(self, data: list[bytes | bytearray | memoryview]) -> None:
        self.buffers += len(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.buffers += 1

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def rig(workload: str, batch: int, tracking: bool = False) -> tuple[Callable[[], None], int]:
    """A bound I/O queue behind a TargetProtocol; returns (feed one batch, commands per
    batch)."""
    from pynvmf.block.memory import MemoryDevice
    from pynvmf.target.controller import Controller
    from pynvmf.target.port import Port
    from pynvmf.target.protocol import TargetProtocol
    from pynvmf.target.subsystem import Namespace, Subsystem
    from pynvmf.target.target import Target
    from pynvmf.tcp.target import TransportConfig

    opcode, length, inline, digests = WORKLOADS[workload]
    nqn = "nqn.2024-01.org.pynvmf:instructions"
    device = MemoryDevice(64 << 20, BLOCK)
    subsystem = Subsystem(nqn)
    subsystem.add_namespace(Namespace.create(nqn, 1, device, "memory:1"))
    port = Port("127.0.0.1", 0, transport=TransportConfig(inline_data_size=16 * KiB))
    target = Target([subsystem], [port])
    target.command_counts.set_tracking(tracking)
    ctrl = Controller(
        target,
        subsystem,
        1,
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001",
        bytes(16),
        0,
        port,
    )
    subsystem.controllers[1] = ctrl
    protocol = TargetProtocol(target, port)
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]

    def deliver(blob: bytes) -> None:
        view = memoryview(blob)
        while view:
            buf = protocol.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]

    dgst = (P.DIGEST_HEADER | P.DIGEST_DATA) if digests else 0
    deliver(icreq(dgst=dgst))
    assert protocol.queue is not None
    protocol.queue.bind(ctrl, 1, 128, False)
    nlb = length // BLOCK
    data = os.urandom(length) if inline else b""
    blob = b"".join(
        capsule(
            rw_sqe(opcode, cid, 1, cid * nlb, nlb, length, inline=inline),
            data,
            hdgst=digests,
            ddgst=digests and inline,
        )
        for cid in range(batch)
    )
    conn = protocol.conn

    def feed() -> None:
        deliver(blob)
        assert not conn._inflight, "a command did not complete at once"

    return feed, batch


async def run(workload: str, batch: int, count: int, tracking: bool) -> None:
    feed, per = rig(workload, batch, tracking)
    for _ in range(count // per):
        feed()


async def timed(workload: str, batch: int, runs: int, count: int, tracking: bool) -> float:
    feed, per = rig(workload, batch, tracking)
    for _ in range(200 // per + 1):
        feed()
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(count // per):
            feed()
        results.append((time.perf_counter() - start) / (count // per * per) * 1e9)
    return statistics.median(results)


_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def callgrind(workload: str, batch: int, count: int, tracking: bool) -> float:
    def instructions(n: int) -> int:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--count",
                str(n),
                "--workloads",
                workload,
                "--batch",
                str(batch),
                *(["--latency-tracking"] if tracking else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        m = _COLLECTED.search(out.stderr)
        assert m, out.stderr
        return int(m.group(1))

    return (instructions(2 * count) - instructions(count)) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batch", type=int, default=32, help="commands per buffer_updated")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--callgrind", action="store_true", help="instructions per command")
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)  # one run, no output
    parser.add_argument("--latency-tracking", action="store_true", help="time every command")
    args = parser.parse_args()
    names = args.workloads.split(",")
    # As `pynvmf target` does at start: freed read buffers stay in the heap for the next.
    tune_for_io_buffers()
    if args.count is not None:
        asyncio.run(run(names[0], args.batch, args.count, args.latency_tracking))
        return
    from pynvmf.compiled import compiled_modules

    compiled = compiled_modules()
    print(
        f"hot modules: {'compiled (mypyc): ' + ', '.join(compiled) if compiled else 'pure Python'}"
    )
    for name in names:
        if args.callgrind:
            n = callgrind(name, args.batch, 3200, args.latency_tracking)
            print(
                f"{name:<16} batch {args.batch:>2}: {n:>9,.0f} instructions per command",
                flush=True,
            )
        else:
            ns = asyncio.run(timed(name, args.batch, args.runs, 20000, args.latency_tracking))
            print(f"{name:<16} batch {args.batch:>2}: {ns:>7.0f} ns per command", flush=True)


if __name__ == "__main__":
    main()
