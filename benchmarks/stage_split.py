"""The stage histograms explaining two slow hosts (docs/metrics.md): one whose reads wait
on a slow file namespace, one whose writes wait on the network.

An in-process target with latency tracking on serves two namespaces: NSID 1 in memory,
NSID 2 a file (on --dir) whose every read takes --delay-ms longer, a stand-in for a slow
disk. Host A reads 4 KiB blocks of NSID 2 over a direct connection; host B writes
128 KiB (more than in-capsule data: R2T) to NSID 1 through a TCP relay that passes its
bytes to the target at --rate-mbs MB/s, a stand-in for a slow network. Prints each
host's commands, mean latency and stage split from pynvmf_get_host_stats's answer.

    python benchmarks/stage_split.py [--dir /tmp] [--delay-ms 2] [--rate-mbs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.metrics.host_stats import host_stats
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:stage-split"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000b"


class SlowFileDevice(FileDevice):
    """A file whose every read takes `delay` seconds longer (a slow disk)."""

    __slots__ = ("delay",)

    def __init__(self, path: str, delay: float, size_bytes: int) -> None:
        super().__init__(path, 512, size_bytes=size_bytes, create=True)
        self.delay = delay

    async def read(self, lba: int, buf: memoryview) -> None:
        await asyncio.sleep(self.delay)
        await super().read(lba, buf)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float) -> None:
    """Copy reader to writer; at most `rate` bytes a second (0: as fast as it comes)."""
    try:
        while data := await reader.read(16384):
            writer.write(data)
            await writer.drain()
            if rate:
                await asyncio.sleep(len(data) / rate)
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def relay(target_port: int, rate: float) -> asyncio.Server:
    """A TCP relay to the target passing the host's bytes on at `rate` bytes a second."""

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        t_reader, t_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(_pipe(reader, t_writer, rate), _pipe(t_reader, writer, 0))

    return await asyncio.start_server(client, "127.0.0.1", 0)


def summary(stats: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for host in stats["hosts"]:
        count = sum(h["count"] for ns in host["namespaces"] for h in ns.get("latency", {}).values())
        total = sum(h["sum"] for ns in host["namespaces"] for h in ns.get("latency", {}).values())
        rows.append(
            {
                "host": host["host"][-1:],
                "commands": {
                    f"nsid {ns['nsid']} {op}": n
                    for ns in host["namespaces"]
                    for op, n in ns["commands"].items()
                },
                "mean_latency_ms": round(total / count * 1e3, 3),
                "stages_ms_per_command": {
                    stage: round(h["sum"] / count * 1e3, 3)
                    for stage, h in host["stages"].items()
                    if h["count"]
                },
            }
        )
    return rows


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        subsystem = Subsystem(NQN)
        memory = MemoryDevice(64 << 20, 512)
        subsystem.add_namespace(Namespace.create(NQN, 1, memory, "memory:1"))
        slow = SlowFileDevice(str(Path(tmp) / "slow.img"), args.delay_ms / 1e3, 64 << 20)
        subsystem.add_namespace(Namespace.create(NQN, 2, slow, "slow-file:2"))
        port = Port("127.0.0.1", 0)
        target = Target([subsystem], [port])
        target.set_latency_tracking(True)
        await target.start()
        server = await relay(port.port, args.rate_mbs * 1e6)
        relay_port = server.sockets[0].getsockname()[1]
        try:
            a = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A)
            b = await connect("127.0.0.1", relay_port, NQN, hostnqn=HOST_B)
            try:

                async def reads() -> None:
                    for i in range(args.commands):
                        await a.namespace(2).read(i * 8, memoryview(bytearray(4096)))

                async def writes() -> None:
                    for i in range(args.commands):
                        await b.namespace(1).write(i * 256, bytes(128 << 10))

                await asyncio.gather(reads(), writes())
            finally:
                await a.close()
                await b.close()
            print(json.dumps(summary(host_stats(target)), indent=2))
        finally:
            server.close()
            await target.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where the slow namespace's file goes")
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--rate-mbs", type=float, default=20.0)
    parser.add_argument("--commands", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
