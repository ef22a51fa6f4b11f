"""Copy offload versus host read + write, over a 1 Gb/s link and over loopback.

Reproduces the shape of the public table that started the project: the NVMe
Copy command (target-side copy) against the host reading and writing the data
itself, for 8 KiB x 1 range and 2 MiB x 16 ranges, reporting MiB/s copied and
the bytes that crossed the network.

The 1 Gb/s link is two network namespaces made by this script, joined by a veth
pair shaped with a tbf qdisc in both directions (netem is not available here).
The target runs in one namespace pinned to CPU 0, the host in the other pinned to
CPU 1. The loopback run has no shaping. Needs root (ip netns, tc, mount).

Each case runs on two backends: a 1 GiB memory namespace, and a 1 GiB file
namespace on a loop-mounted XFS image made by this script (reflink=1, so the
target's copy_file_range is a reflink: the seed's "between storage devices" row),
its source blocks filled with data first. Every JSON line names its backend.

Both modes go through the same copy planner: "offload" hands it the remote
namespace (which advertises Copy), "emulate" hands it the same namespace behind a
plain BlockDevice that does not offer CopyOffload, so the planner emulates.

    sudo python3 benchmarks/copy_offload.py            # full run, writes docs/copy-offload.{md,png}
    sudo python3 benchmarks/copy_offload.py --quick    # smoke run, prints only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pynvmf.aio import install_uvloop  # noqa: E402
from pynvmf.bench import plot  # noqa: E402
from pynvmf.bench.report import load_line, markdown_table, write_results  # noqa: E402
from pynvmf.block.copy import SourceRange, copy  # noqa: E402
from pynvmf.block.device import Buffer, Capabilities  # noqa: E402
from pynvmf.host import connect  # noqa: E402

NQN = "nqn.2024-11.dev.pynvmf:copy-bench"
MIB = 1 << 20
BLOCK = 4096
# 198.18.0.0/15 is reserved for network benchmarking; these addresses live only in
# the two namespaces this script creates.
TARGET_NS, HOST_NS = "pynvmf-copy-t", "pynvmf-copy-h"
TARGET_IP, HOST_IP = "198.18.0.1", "198.18.0.2"
# (name, bytes per range, ranges, copies in flight): small copies need many in flight
# for the command rate to show (each costs a round trip); large ones do not.
CASES = [("8 KiB x 1", 8 * 1024, 1, 64), ("2 MiB x 16", 2 * MIB, 16, 8)]
NS_BYTES = 1 << 30
XFS_IMAGE = Path("/var/tmp/pynvmf-copy-bench-xfs.img")
XFS_MOUNT = Path("/var/tmp/pynvmf-copy-bench-xfs")


class EmulateOnly:
    """The same remote namespace, offered to the planner without CopyOffload."""

    def __init__(self, device: object) -> None:
        self._d = device

    @property
    def capabilities(self) -> Capabilities:
        return self._d.capabilities  # type: ignore[attr-defined,no-any-return]

    async def read(self, lba: int, buf: memoryview) -> None:
        await self._d.read(lba, buf)  # type: ignore[attr-defined]

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self._d.write(lba, data, fua=fua)  # type: ignore[attr-defined]

    async def flush(self) -> None:
        await self._d.flush()  # type: ignore[attr-defined]

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._d.write_zeroes(lba, nblocks, fua=fua)  # type: ignore[attr-defined]

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._d.deallocate(lba, nblocks)  # type: ignore[attr-defined]

    async def close(self) -> None:
        pass


@dataclass
class Measurement:
    network: str
    backend: str  # "memory" | "file"
    case: str
    mode: str
    mib_per_s: float
    wire_bytes_per_copy: float
    wire_ratio: float  # wire bytes / copied bytes
    link_use: float | None  # fraction of the shaped link's capacity, both directions


# -- the host side (runs in the host namespace, or in the root one for loopback) -----------


async def _worker(
    address: str, port: int, seconds: float, depth_arg: int
) -> list[dict[str, object]]:
    os.sched_setaffinity(0, {1})
    out = []
    most = max(depth_arg or d for _c, _s, _n, d in CASES)
    async with await connect(address, port, NQN, queues=1, queue_depth=max(128, most + 1)) as ctrl:
        ns = ctrl.namespace(1)
        for case, size, nranges, case_depth in CASES:
            depth = depth_arg or case_depth
            nb = size // BLOCK
            copied = size * nranges
            for mode in ("emulate", "offload"):
                device = ns if mode == "offload" else EmulateOnly(ns)

                # Each slot copies its own ranges, to its own destination, over and over:
                # built once, so that what is timed is the copy, not the bookkeeping.
                dst_base = ns.capabilities.num_blocks // 2
                jobs = [
                    (
                        [
                            SourceRange(device, s * nb * nranges * 2 + 2 * i * nb, nb)
                            for i in range(nranges)
                        ],
                        dst_base + s * nb * nranges,
                    )
                    for s in range(depth)
                ]

                async def one(slot: int, jobs: list = jobs, device: object = device) -> None:
                    sources, dst = jobs[slot]
                    await copy(sources, device, dst)

                await asyncio.gather(*(one(s) for s in range(depth)))  # warm up
                sent0, recv0 = ctrl.bytes_sent, ctrl.bytes_received
                done = [0]
                started = time.perf_counter()
                deadline = started + seconds

                async def slot(
                    s: int,
                    jobs: list = jobs,
                    device: object = device,
                    deadline: float = deadline,
                    done: list[int] = done,
                ) -> None:
                    # Each slot starts its next copy as soon as its last one ends (like
                    # fio's iodepth): waves of copies started together would keep them
                    # in lockstep, all reading and then all writing.
                    sources, dst = jobs[s]
                    n = 0
                    while time.perf_counter() < deadline:
                        await copy(sources, device, dst)  # type: ignore[arg-type]
                        n += 1
                    done[0] += n

                await asyncio.gather(*(slot(s) for s in range(depth)))
                elapsed = time.perf_counter() - started
                wire = ctrl.bytes_sent - sent0 + ctrl.bytes_received - recv0
                copies = done[0]
                out.append(
                    {
                        "case": case,
                        "mode": mode,
                        "depth": depth,
                        "mib_per_s": copied * copies / elapsed / MIB,
                        "wire_bytes_per_copy": wire / copies,
                        "wire_ratio": wire / (copied * copies),
                        "wire_bits_per_s": wire * 8 / elapsed,
                    }
                )
    return out


# -- set-up ---------------------------------------------------------------------------------


def _sh(cmd: str) -> None:
    subprocess.run(shlex.split(cmd), check=True)


@contextlib.contextmanager
def _link(rate: str) -> Iterator[None]:
    """Two namespaces joined by a veth pair, shaped to `rate` in both directions."""
    _teardown()
    try:
        _sh(f"ip netns add {TARGET_NS}")
        _sh(f"ip netns add {HOST_NS}")
        _sh("ip link add pynvmf-vt type veth peer name pynvmf-vh")
        for ns, dev, ip in ((TARGET_NS, "pynvmf-vt", TARGET_IP), (HOST_NS, "pynvmf-vh", HOST_IP)):
            _sh(f"ip link set {dev} netns {ns}")
            _sh(f"ip -n {ns} addr add {ip}/30 dev {dev}")
            _sh(f"ip -n {ns} link set {dev} up")
            _sh(f"ip -n {ns} link set lo up")
            _sh(
                f"ip netns exec {ns} tc qdisc add dev {dev} root tbf rate {rate} "
                "burst 128kb latency 50ms"
            )
        yield
    finally:
        _teardown()


def _teardown() -> None:
    for ns in (TARGET_NS, HOST_NS):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextlib.contextmanager
def _xfs() -> Iterator[Path]:
    """A loop-mounted XFS image with reflink, holding the file namespace's 1 GiB file
    with data in the blocks the copies read (a reflink of holes would prove little)."""
    subprocess.run(["umount", str(XFS_MOUNT)], capture_output=True, check=False)
    XFS_MOUNT.mkdir(exist_ok=True)
    with XFS_IMAGE.open("wb") as f:
        f.truncate(NS_BYTES + (512 << 20))
    _sh(f"mkfs.xfs -q -f -m reflink=1 {XFS_IMAGE}")
    _sh(f"mount -o loop {XFS_IMAGE} {XFS_MOUNT}")
    try:
        path = XFS_MOUNT / "ns1.img"
        chunk = os.urandom(MIB)
        with path.open("wb") as f:
            f.truncate(NS_BYTES)
            for _ in range(NS_BYTES // 2 // MIB):  # every source block (the lower half)
                f.write(chunk)
        yield path
    finally:
        subprocess.run(["umount", str(XFS_MOUNT)], check=False)
        XFS_IMAGE.unlink(missing_ok=True)


@contextlib.contextmanager
def _target(netns: str | None, address: str, port: int, backend: list[str]) -> Iterator[None]:
    cmd = [
        "taskset",
        "-c",
        "0",
        sys.executable,
        "-m",
        "pynvmf",
        "target",
        "--listen",
        f"{address}:{port}",
        "--discovery-port",
        "0",
        "--nqn",
        NQN,
        *backend,
        "--block-size",
        str(BLOCK),
    ]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "pynvmf target ready":
                break
        else:
            raise RuntimeError("target exited before it was ready")
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def _run_worker(netns: str | None, address: str, port: int, seconds: float, depth: int) -> list:
    cmd = [sys.executable, __file__, "--worker", address, str(port), str(seconds), str(depth)]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"the host side failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chart(results: list[Measurement], path: Path, caption: str) -> None:
    """MiB/s and wire bytes per copy, host read + write next to Copy, per network and case."""
    plt = plot.pyplot()
    groups = list(dict.fromkeys((m.network, m.backend, m.case) for m in results))

    def pick(mode: str, attr: str) -> list[float]:
        by_key = {(m.network, m.backend, m.case): m for m in results if m.mode == mode}
        return [float(getattr(by_key[g], attr)) for g in groups]

    labels = [f"{case}\n{backend}\n{network}" for network, backend, case in groups]
    speed = pick("offload", "mib_per_s")
    base = pick("emulate", "mib_per_s")
    fig, (left, right) = plt.subplots(1, 2, figsize=(18, 6))
    plot.grouped_bars(
        left,
        labels,
        {"host read + write": base, "Copy offload": speed},
        ylabel="MiB/s copied (log)",
        title="copy bandwidth",
        log=True,
        value_label=lambda v: f"{v:,.1f}" if v < 100 else f"{v:,.0f}",
        group_notes=[f"Copy: {o / e:,.2f}x" for o, e in zip(speed, base, strict=True)],
    )
    plot.grouped_bars(
        right,
        labels,
        {
            "host read + write": pick("emulate", "wire_bytes_per_copy"),
            "Copy offload": pick("offload", "wire_bytes_per_copy"),
        },
        ylabel="bytes on the wire per copy (log)",
        title="network traffic per copy (both directions)",
        log=True,
    )
    plot.save(fig, path, caption, title="pynvmf: NVMe Copy vs host read + write")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--depth", type=int, default=0, help="copies in flight (default: 64 for 8 KiB, 8 for 2 MiB)"
    )
    parser.add_argument(
        "--backend", choices=("memory", "file", "both"), default="both", help="namespace kind"
    )
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--quick", action="store_true", help="1 s, 1 repeat, no docs")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        address, port, seconds, depth = args.worker
        install_uvloop()  # the host side runs on the loop the pynvmf CLI uses
        print(json.dumps(asyncio.run(_worker(address, int(port), float(seconds), int(depth)))))
        return
    if args.quick:
        args.seconds, args.repeat = 1.0, 1
    rate_bits = {"k": 1e3, "m": 1e6, "g": 1e9}[args.rate.lower().rstrip("bit")[-1]] * float(
        args.rate.lower().rstrip("bit")[:-1]
    )
    load_at_start = load_line()
    runs: dict[tuple[str, str, str, str], list[dict[str, float]]] = {}
    backends = ["memory", "file"] if args.backend == "both" else [args.backend]
    with contextlib.ExitStack() as stack:
        options = {"memory": ["--memory", "1G"]}
        if "file" in backends:
            options["file"] = ["--file", str(stack.enter_context(_xfs()))]
        # Repeats alternate everything (backends, networks, and within a run the two
        # methods), so that a slow moment on the machine does not land on one side only.
        for _ in range(args.repeat):
            for backend in backends:
                port = _free_port()
                with _target(None, "127.0.0.1", port, options[backend]):
                    for r in _run_worker(None, "127.0.0.1", port, args.seconds, args.depth):
                        runs.setdefault(("loopback", backend, r["case"], r["mode"]), []).append(r)
                with _link(args.rate), _target(TARGET_NS, TARGET_IP, 4420, options[backend]):
                    for r in _run_worker(HOST_NS, TARGET_IP, 4420, args.seconds, args.depth):
                        key = (f"{args.rate} link", backend, r["case"], r["mode"])
                        runs.setdefault(key, []).append(r)
    results = []
    for (network, backend, case, mode), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("case", "mode")}
        use = med["wire_bits_per_s"] / (2 * rate_bits) if network != "loopback" else None
        results.append(
            Measurement(
                network,
                backend,
                case,
                mode,
                med["mib_per_s"],
                med["wire_bytes_per_copy"],
                med["wire_ratio"],
                use,
            )
        )
    rows = []
    groups = list(dict.fromkeys((m.network, m.backend) for m in results))
    for network, backend in groups:
        for case, _size, _n, _depth in CASES:
            pair = {
                m.mode: m
                for m in results
                if (m.network, m.backend, m.case) == (network, backend, case)
            }
            em, off = pair["emulate"], pair["offload"]
            for m in (em, off):
                rows.append(
                    [
                        network,
                        backend,
                        case,
                        "host read + write" if m.mode == "emulate" else "Copy offload",
                        f"{m.mib_per_s:,.1f}",
                        f"{m.wire_bytes_per_copy:,.0f}",
                        f"{100 * m.wire_ratio:.2f}%",
                        "-" if m.link_use is None else f"{100 * m.link_use:.1f}%",
                        "" if m is em else f"{off.mib_per_s / em.mib_per_s:.2f}x",
                    ]
                )
    header = [
        "network",
        "backend",
        "copy",
        "method",
        "MiB/s",
        "wire bytes per copy",
        "wire / copied",
        "link use",
        "speed-up",
    ]
    command = "sudo python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    depths = ", ".join(f"{args.depth or d} for {case}" for case, _s, _n, d in CASES)
    lines = [
        f"Command: `{command}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}; target on CPU 0, host on CPU 1; "
        f"copies in flight: {depths}; one I/O queue; "
        f"median of {args.repeat} runs of {args.seconds:g} s; "
        f"1 GiB namespaces of {BLOCK}-byte blocks: memory, and a file on a loop-mounted "
        "XFS image (reflink=1).",
        f"Load average at start {load_at_start}, at the end {load_line()} (other work on "
        "this shared machine: the 8 KiB rows are CPU-bound on both ends, so they fall with it).",
        "",
        markdown_table(header, rows),
        "",
        "![copy bandwidth and wire bytes](copy-offload.png)",
    ]
    text = "\n".join(lines)
    print(text)
    for m in results:
        print(json.dumps(asdict(m)))
    if not args.quick:
        write_results(
            REPO / "docs" / "copy-offload.md", "Copy offload", "benchmarks/copy_offload.py", text
        )
        chart(
            results,
            REPO / "docs" / "copy-offload.png",
            f"{command}; median of {args.repeat} runs of {args.seconds:g} s; "
            f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        )


if __name__ == "__main__":
    main()
