"""pynvmf's target against SPDK's nvmf_tgt, one core each, driven by spdk_nvme_perf.

The client the field uses to measure an NVMe/TCP target, SPDK's `spdk_nvme_perf`,
runs on --host-cpu; the target under test runs alone on --target-cpu (SPDK's
`nvmf_tgt` busy-polls its core, so only one target runs at a time). Both targets
serve one 256 MiB memory namespace (SPDK: a malloc bdev; pynvmf: a MemoryDevice
filled with random data, so reads copy real pages) with 16 KiB of in-capsule data,
on 127.0.0.1. Row by row the targets take turns (SPDK's, then the pynvmf trees in an
order rotated at each repeat); every cell is the median of --repeat runs and the table
prints pynvmf / SPDK ratios. pynvmf's own host library then drives both targets
the same way, so its speed is on the same page.

--baseline DIR adds a pynvmf target run from another source tree (e.g. an export of
main), alternated with the others: a before/after table measured side by side.
--tree LABEL=DIR[:USEC] adds any other tree as column LABEL, e.g. an export in which
`make compiled` built the hot modules (the target imports whatever its tree holds).

SPDK is not built here: --spdk names a build (the directory holding bin/nvmf_tgt and
bin/spdk_nvme_perf; default $SPDK_DIR/build). Without one the benchmark says so
and exits 0, so `make bench` runs everywhere. nvmf_tgt is configured through its
JSON-RPC socket directly (the same methods scripts/rpc.py sends).

    python3 benchmarks/vs_spdk.py --spdk /work/spdk/build [--runtime 5] [--repeat 3]

A full run (not --quick) appends every measurement as a JSON line to
docs/vs-spdk.jsonl, rewrites the results section of docs/vs-spdk.md and draws
docs/vs-spdk.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pynvmf.aio import install_uvloop
from pynvmf.bench import ConnectOptions, Workload, plot, run_remote
from pynvmf.bench import report as R

KiB = 1024
MiB = 1024 * KiB
HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs"
SPDK_NQN = "nqn.2016-06.io.spdk:cnode1"
NS_SIZE = 256 * MiB
HUGEPAGES_HINT = (
    "\nnvmf_tgt needs hugepages, e.g. echo 1024 > /proc/sys/vm/nr_hugepages and "
    "mount -t hugetlbfs nodev /dev/hugepages"
)
BLOCK = 512
IN_CAPSULE = 16 * KiB


@dataclass(frozen=True)
class Row:
    name: str
    rw: str  # spdk_nvme_perf -w
    bs: int
    qd: int
    metric: str  # "iops" | "mibps" | "lat" (what the table compares)
    rwmixread: int = 100
    digests: bool = False


ROWS = [
    Row("4 KiB random read, QD32", "randread", 4 * KiB, 32, "iops"),
    Row("4 KiB random write, QD32", "randwrite", 4 * KiB, 32, "iops"),
    Row("128 KiB sequential read, QD8", "read", 128 * KiB, 8, "mibps"),
    Row("128 KiB sequential write, QD8", "write", 128 * KiB, 8, "mibps"),
    Row("8 KiB random write, QD32, 16 KiB in-capsule", "randwrite", 8 * KiB, 32, "iops"),
    Row("4 KiB random read, QD1, mean latency", "randread", 4 * KiB, 1, "lat"),
    Row(
        "4 KiB 50/50 random read/write, QD32, header + data digests",
        "randrw",
        4 * KiB,
        32,
        "iops",
        rwmixread=50,
        digests=True,
    ),
]
# pynvmf's host library against both targets.
HOST_ROWS = [
    Row("pynvmf host: 4 KiB random read, QD32", "randread", 4 * KiB, 32, "iops"),
    Row("pynvmf host: 4 KiB random read, QD1, mean latency", "randread", 4 * KiB, 1, "lat"),
]


@dataclass
class Measurement:
    target: str
    row: str
    repeat: int
    iops: float
    mibps: float
    lat_us: float


# -- targets ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SpdkRpc:
    """SPDK's JSON-RPC 2.0 over its Unix socket (what scripts/rpc.py speaks)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(30)
        self.next_id = 1
        self.decoder = json.JSONDecoder()
        self.pending = ""

    def call(self, method: str, **params: object) -> object:
        request = {"jsonrpc": "2.0", "method": method, "id": self.next_id}
        if params:
            request["params"] = params
        self.next_id += 1
        self.sock.sendall(json.dumps(request).encode())
        while True:
            with contextlib.suppress(ValueError):
                reply, end = self.decoder.raw_decode(self.pending.lstrip())
                self.pending = self.pending.lstrip()[end:]
                if "error" in reply:
                    raise RuntimeError(f"SPDK RPC {method}: {reply['error']}")
                return reply.get("result")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"SPDK RPC {method}: the socket closed")
            self.pending += chunk.decode()

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def spdk_target(spdk: Path, cpu: int, shm_id: int) -> Iterator[tuple[int, str]]:
    """nvmf_tgt on `cpu` with a malloc namespace; yields (port, subnqn)."""
    workdir = Path(tempfile.mkdtemp(prefix="vs-spdk-"))
    rpc_path = str(workdir / "spdk.sock")
    log = open(workdir / "nvmf_tgt.log", "w")  # noqa: SIM115 (closed below)
    cmd = [str(spdk / "bin/nvmf_tgt"), "-m", hex(1 << cpu), "--no-pci", "-r", rpc_path]
    proc = subprocess.Popen([*cmd, "-i", str(shm_id)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(rpc_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                # The log goes with the work directory below: say what it said.
                log.flush()
                said = (workdir / "nvmf_tgt.log").read_text(errors="replace")[-2000:]
                hint = HUGEPAGES_HINT if "hugetlbfs" in said else ""
                raise RuntimeError(f"nvmf_tgt did not start:\n{said}{hint}")
            time.sleep(0.05)
        rpc = SpdkRpc(rpc_path)
        port = free_port()
        rpc.call("framework_wait_init")
        rpc.call("nvmf_create_transport", trtype="TCP", in_capsule_data_size=IN_CAPSULE)
        rpc.call("bdev_malloc_create", name="Mal0", num_blocks=NS_SIZE // BLOCK, block_size=BLOCK)
        rpc.call("nvmf_create_subsystem", nqn=SPDK_NQN, allow_any_host=True)
        rpc.call("nvmf_subsystem_add_ns", nqn=SPDK_NQN, namespace={"bdev_name": "Mal0"})
        rpc.call(
            "nvmf_subsystem_add_listener",
            nqn=SPDK_NQN,
            listen_address={
                "trtype": "tcp",
                "adrfam": "ipv4",
                "traddr": "127.0.0.1",
                "trsvcid": str(port),
            },
        )
        rpc.close()
        yield port, SPDK_NQN
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def pynvmf_target(tree: Path | None, cpu: int, busy_poll_us: int) -> Iterator[tuple[int, str]]:
    """A pynvmf target (from `tree`, or from this checkout) on `cpu`; yields (port, nqn).
    It runs in a child interpreter (this script with --serve), so that a --baseline tree's
    code is the one imported."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--target-cpu", str(cpu)]
        + (["--busy-poll", str(busy_poll_us)] if busy_poll_us else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the pynvmf target did not start")
        port, nqn = line.split()
        yield int(port), nqn
    finally:
        proc.stdin.close()  # EOF: the child stops its target
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(cpu: int, busy_poll_us: int) -> None:
    """--serve: start a pynvmf target, print "port nqn", stop at EOF on stdin."""
    from pynvmf.bench.target_process import start_target
    from pynvmf.tcp.target import TransportConfig

    target = start_target(
        cpu=cpu,
        size=NS_SIZE,
        block_size=BLOCK,
        fill=True,
        transport=TransportConfig(inline_data_size=IN_CAPSULE),
        **({"busy_poll_us": busy_poll_us} if busy_poll_us else {}),  # older trees lack it
    )
    try:
        print(target.port, target.nqn, flush=True)
        sys.stdin.read()
    finally:
        target.stop()


# -- clients -----------------------------------------------------------------------------

_TOTAL = re.compile(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.M)


def run_perf(
    spdk: Path, row: Row, port: int, nqn: str, args: argparse.Namespace, shm_id: int
) -> tuple[float, float, float]:
    """One spdk_nvme_perf run: (IOPS, MiB/s, mean latency µs) from its Total line."""
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
    cmd = [
        str(spdk / "bin/spdk_nvme_perf"),
        *("-c", hex(1 << args.host_cpu), "-i", str(shm_id)),
        *("-q", str(row.qd), "-o", str(row.bs), "-w", row.rw, "-t", f"{args.runtime:g}"),
        *(("-M", str(row.rwmixread)) if row.rw == "randrw" else ()),
        *(("-H", "-I") if row.digests else ()),
        *("-r", trid),
    ]
    for attempt in range(3):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.runtime + 60)
        m = _TOTAL.search(out.stdout)
        if not out.returncode and m:
            return float(m.group(1)), float(m.group(2)), float(m.group(3))
        # On a machine shared with other work a Connect can time out: try again.
        print(f"spdk_nvme_perf failed (attempt {attempt + 1}), retrying", file=sys.stderr)
    raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")


def run_host(row: Row, port: int, nqn: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """The same measurement with pynvmf's host library (one connection, one I/O queue)."""
    rw = {"read": "read", "write": "write"}.get(row.rw, row.rw)
    workload = Workload(
        rw,
        row.bs,
        iodepth=row.qd,
        rwmixread=row.rwmixread,
        runtime=args.runtime,
        ramp_time=0.5,
        size=NS_SIZE,
    )
    options = ConnectOptions(header_digest=row.digests, data_digest=row.digests)
    res = asyncio.run(run_remote("127.0.0.1", port, nqn, workload, options=options))
    if res.error:
        raise RuntimeError(f"{row.name}: {res.error}")
    return res.total.iops, res.total.bytes / res.elapsed / MiB, res.total.latency.mean_us


# -- the run -------------------------------------------------------------------------------


def measure(args: argparse.Namespace, spdk: Path) -> list[Measurement]:
    """Row by row, SPDK's target and then each pynvmf target run the row in turn, so that
    the figures compared see the same moment of the machine's load. SPDK's target runs
    alone (it busy-polls its core) and is started for each row; the pynvmf targets stay
    up all along (idle, they cost nothing)."""
    trees: list[tuple[str, Path | None, int]] = [("pynvmf", None, 0)]
    if args.busy_poll:
        trees.append((f"pynvmf poll {args.busy_poll} us", None, args.busy_poll))
    for spec in args.tree or ():
        label, _, where = spec.partition("=")
        where, _, poll = where.partition(":")
        if not label or not where:
            raise SystemExit(f"--tree {spec!r}: expected LABEL=DIR or LABEL=DIR:USEC")
        trees.append((label, Path(where), int(poll or 0)))
    if args.baseline:
        trees.append(("pynvmf before", Path(args.baseline), 0))
    rows = [r for r in ROWS if not args.rows or any(k in r.name for k in args.rows)]
    host_rows = [] if args.no_host else HOST_ROWS
    shm_base = 4000 + os.getpid() % 1000  # DPDK shared memory IDs of our own
    results: list[Measurement] = []

    def one(name: str, row: Row, rep: int, port: int, nqn: str, host: bool) -> None:
        if host:
            iops, mibps, lat = run_host(row, port, nqn, args)
        else:
            iops, mibps, lat = run_perf(spdk, row, port, nqn, args, shm_base + 1)
        results.append(Measurement(name, row.name, rep, iops, mibps, lat))
        print(
            f"run {rep + 1}/{args.repeat} {name:<14} {row.name:<58} "
            f"{iops:>10.0f} IOPS {mibps:>8.1f} MiB/s {lat:>8.1f} us",
            file=sys.stderr,
            flush=True,
        )

    with contextlib.ExitStack() as stack:
        pynvmf = {
            name: stack.enter_context(pynvmf_target(tree, args.target_cpu, poll))
            for name, tree, poll in trees
        }
        order = list(pynvmf)
        for rep in range(args.repeat):
            # Rotated, so that over len(order) repeats every tree runs once in every
            # position after SPDK's: a position has its own bias here (measured: the last
            # of three trees won in 3 runs of 3 whichever tree it was), and forward and
            # reversed order alone left the middle tree always in the middle.
            k = rep % len(order)
            names = order[k:] + order[:k]
            for row in [*rows, *host_rows]:
                host = row in host_rows
                with spdk_target(spdk, args.target_cpu, shm_base) as (port, nqn):
                    one("SPDK", row, rep, port, nqn, host)
                for name in names:
                    port, nqn = pynvmf[name]
                    one(name, row, rep, port, nqn, host)
    return results


def value(m: Measurement, row: Row) -> float:
    return {"iops": m.iops, "mibps": m.mibps, "lat": m.lat_us}[row.metric]


def fmt(v: float, row: Row) -> str:
    if row.metric == "lat":
        return f"{v:,.1f} µs"
    if row.metric == "mibps":
        return f"{v:,.0f} MiB/s"
    return f"{v / 1000:,.1f}K"


def paired_ratios(results: list[Measurement], row: Row, target: str) -> list[float]:
    """`target` / SPDK in each repeat of `row`."""
    by_rep: dict[tuple[str, int], float] = {
        (m.target, m.repeat): value(m, row) for m in results if m.row == row.name
    }
    return [
        v / by_rep["SPDK", rep]
        for (t, rep), v in by_rep.items()
        if t == target and by_rep.get(("SPDK", rep))
    ]


def table(results: list[Measurement]) -> tuple[list[str], list[list[str]], dict[str, dict]]:
    targets = list(dict.fromkeys(m.target for m in results))
    medians: dict[str, dict[str, float]] = {}
    headers = ["workload", *targets]
    others = [t for t in targets if t != "SPDK"]
    headers += [f"{t} / SPDK" for t in others]
    rows = []
    for row in [*ROWS, *HOST_ROWS]:
        cells = {
            t: [value(m, row) for m in results if m.target == t and m.row == row.name]
            for t in targets
        }
        if not all(cells.values()):
            continue
        med = {t: statistics.median(v) for t, v in cells.items()}
        medians[row.name] = med
        line = [row.name, *(fmt(med[t], row) for t in targets)]
        for t in others:
            ratio = f"{med[t] / med['SPDK']:.2f}" + ("x slower" if row.metric == "lat" else "")
            pairs = paired_ratios(results, row, t)
            if len(pairs) > 1:
                # Each repeat's ratio, its two runs moments apart: how far the noise
                # reaches shows here, where the medians of each side hide it.
                ratio += f" ({min(pairs):.2f}-{max(pairs):.2f})"
            line.append(ratio)
        rows.append(line)
    return headers, rows, medians


def draw(path: Path, medians: dict[str, dict[str, float]], caption: str) -> None:
    plt = plot.pyplot()
    names = [r.name for r in ROWS if r.name in medians and r.metric != "lat"]
    targets = [t for t in next(iter(medians.values())) if t != "SPDK"]
    fig, ax = plt.subplots(figsize=(11, 5))
    plot.grouped_bars(
        ax,
        [n.replace(", ", "\n", 1) for n in names],
        {t: [medians[n][t] / medians[n]["SPDK"] for n in names] for t in targets},
        ylabel="throughput / SPDK nvmf_tgt's (1.0 = as fast)",
        title="pynvmf target vs SPDK nvmf_tgt, one core each, spdk_nvme_perf as the client",
        value_label=lambda v: f"{v:.2f}",
    )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    plot.save(fig, path, caption)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spdk", help="SPDK build directory (bin/nvmf_tgt, bin/spdk_nvme_perf)")
    parser.add_argument("--runtime", type=float, default=5.0, help="seconds per run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="alternations of the targets (a multiple of the number of pynvmf trees puts "
        "each tree in each position equally often)",
    )
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat, nothing written")
    parser.add_argument("--baseline", help="a pynvmf source tree to measure alongside")
    parser.add_argument(
        "--tree",
        action="append",
        metavar="LABEL=DIR[:USEC]",
        help="another pynvmf source tree to measure alongside, as column LABEL (with "
        "--busy-poll USEC if given); e.g. an export built with `make compiled`",
    )
    parser.add_argument("--rows", nargs="*", help="only the rows whose name contains one of these")
    parser.add_argument("--no-host", action="store_true", help="skip pynvmf's host library rows")
    parser.add_argument("--no-write", action="store_true", help="write nothing to docs/")
    parser.add_argument(
        "--busy-poll",
        type=int,
        default=0,
        metavar="USEC",
        help="also measure this tree's target with --busy-poll USEC",
    )
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    parser.add_argument(
        "--replot", action="store_true", help="draw docs/vs-spdk.png from the last run in the JSONL"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.target_cpu, args.busy_poll)
        return 0
    if args.replot:
        lines = [json.loads(line) for line in (DOCS / "vs-spdk.jsonl").read_text().splitlines()]
        last = [d for d in lines if d["started"] == lines[-1]["started"]]
        fields = ("target", "row", "repeat", "iops", "mibps", "lat_us")
        _headers, _rows, medians = table([Measurement(*(d[f] for f in fields)) for d in last])
        draw(DOCS / "vs-spdk.png", medians, last[-1]["command"])
        return 0
    spdk_dir = args.spdk or (
        os.path.join(os.environ["SPDK_DIR"], "build") if os.environ.get("SPDK_DIR") else None
    )
    spdk = Path(spdk_dir) if spdk_dir else None
    if spdk is None or not (spdk / "bin/nvmf_tgt").exists():
        print(
            "vs_spdk: skipped, no SPDK build (give --spdk DIR or set SPDK_DIR; "
            "the recipe is ../shared/tools/spdk/build.sh)"
        )
        return 0
    if args.quick:
        args.runtime, args.repeat, args.no_write = 1.0, 1, True
    os.sched_setaffinity(0, {args.host_cpu})  # pynvmf's host rows run in this process
    install_uvloop()
    env = R.environment_lines()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    results = measure(args, spdk)
    headers, rows, medians = table(results)
    setup = (
        f"targets on CPU {args.target_cpu}, spdk_nvme_perf on CPU {args.host_cpu}; "
        f"{NS_SIZE // MiB} MiB memory namespace, {IN_CAPSULE // KiB} KiB in-capsule; "
        f"{args.runtime:g} s runs, medians of {args.repeat} alternations; a ratio is of the "
        "medians, in brackets the lowest and highest of the repeats' own ratios"
    )
    env.append(setup)
    print("\n".join(env))
    print()
    print(R.text_table(headers, rows))
    if args.no_write:
        return 0
    with open(DOCS / "vs-spdk.jsonl", "a") as f:
        for m in results:
            f.write(json.dumps({"started": started, "command": R.command_line(), **asdict(m)}))
            f.write("\n")
    body = "\n".join([*(f"- {line}" for line in env), "", R.markdown_table(headers, rows), ""])
    R.write_results(DOCS / "vs-spdk.md", "pynvmf vs SPDK nvmf_tgt", "benchmarks/vs_spdk.py", body)
    draw(DOCS / "vs-spdk.png", medians, R.command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
