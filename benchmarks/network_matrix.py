"""The same NVMe/TCP workload over IPv4, IPv6 and every VXLAN outer/inner combination.

Mirrors a public table of NVMe/TCP over tunnels (where two rows once failed to
connect and one ran at 0.69 Mb/s): 128 KiB sequential read at QD8 and 4 KiB
random read at QD32, over

- plain IPv4 and plain IPv6 on the underlay, and
- VXLAN v4-in-v4, v6-in-v4, v4-in-v6 and v6-in-v6 (inner-in-outer), each with
  and without outer UDP checksums.

The underlay is two network namespaces made by this script, joined by a veth
pair carrying 198.18.0.1/30 - 198.18.0.2/30 and fd00:198:18::1/64 - ::2
(benchmarking and ULA space: nothing leaves the machine). For a tunnel row each
namespace gets a vxlan device `vxl0` (VNI per row, dstport 4789, `dev` the veth,
so the kernel sizes its MTU for the outer headers) carrying 198.19.0.1/24 -
198.19.0.2/24 and fd00:198:19::1/64 - ::2. The target (`python -m pynvmf
target`, 1 GiB memory namespace, pinned to CPU 0 with taskset) runs in one
namespace, listening on the row's address; the host side is this script
re-executed as a worker in the other namespace, pinned to CPU 1, which prints
JSON. A row that fails is reported with its status, not raised. Every namespace
(and with it every link) is deleted at the end, on error too. Needs root.

    sudo python3 benchmarks/network_matrix.py           # writes docs/network-matrix.{md,png}
    sudo python3 benchmarks/network_matrix.py --quick   # smoke run (1 s), prints only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pynvmf.aio import install_uvloop  # noqa: E402
from pynvmf.bench import plot  # noqa: E402
from pynvmf.bench.loadgen import ConnectOptions, Workload, remote_namespace, run_workload  # noqa: E402
from pynvmf.bench.report import (  # noqa: E402
    environment_lines,
    markdown_table,
    text_table,
    write_results,
)
from pynvmf.bench.target_process import (  # noqa: E402
    busy_cpu_seconds,
    process_cpu_seconds,
)

NQN = "nqn.2024-11.dev.pynvmf:network-matrix"
KiB, MiB = 1024, 1024 * 1024
PORT = 4420
TARGET_CPU, HOST_CPU = 0, 1
TARGET_NS, HOST_NS = "pynvmf-nm-t", "pynvmf-nm-h"
TARGET_VETH, HOST_VETH = "pynvmf-nmt", "pynvmf-nmh"
VXLAN_DEV = "vxl0"
VXLAN_PORT = 4789
# Underlay (veth) and inner (vxlan) addresses: target first, host second.
UNDERLAY = {"v4": ("198.18.0.1", "198.18.0.2", 30), "v6": ("fd00:198:18::1", "fd00:198:18::2", 64)}
INNER = {"v4": ("198.19.0.1", "198.19.0.2", 24), "v6": ("fd00:198:19::1", "fd00:198:19::2", 64)}
# Reads go to the first REGION bytes of the namespace, written once first (over the
# network) so that they copy real pages rather than the shared zero page.
REGION = 128 * MiB
WORKLOADS = {
    "seq": Workload("read", 128 * KiB, iodepth=8),
    "rand": Workload("randread", 4 * KiB, iodepth=32),
}
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Row:
    name: str
    inner: str  # "v4" | "v6": the address family NVMe/TCP runs over
    outer: str | None = None  # the tunnel's outer family; None: no tunnel
    csum: bool = False  # outer UDP checksums (tunnel rows)
    vni: int = 0

    @property
    def target_address(self) -> str:
        return (INNER if self.outer else UNDERLAY)[self.inner][0]


def rows() -> list[Row]:
    out = [Row("plain IPv4", "v4"), Row("plain IPv6", "v6")]
    vni = 100
    for outer in ("v4", "v6"):
        for inner in ("v4", "v6"):
            for csum in (True, False):
                vni += 1
                name = f"VXLAN {inner}-in-{outer}, UDP csum {'on' if csum else 'off'}"
                out.append(Row(name, inner, outer, csum, vni))
    return out


@dataclass
class RowResult:
    row: Row
    status: str = "ok"
    mtu: int | None = None  # of the device NVMe/TCP traffic goes through
    csum_flags: str = ""  # the checksum settings as the kernel reports them
    # Per workload ("seq", "rand"): medians of iops, mbps, host_cpu, target_cpu, system_cpu.
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    runs: int = 0


# -- the host side (runs in the host namespace) --------------------------------------------


async def _worker(address: str, target_pid: int, runtime: float, ramp: float) -> dict[str, Any]:
    """Connect, write the region once, run both workloads; never raises."""
    os.sched_setaffinity(0, {HOST_CPU})
    out: dict[str, Any] = {"status": "ok", "results": {}}
    connected = False
    try:
        options = ConnectOptions(queues=1, queue_depth=32, timeout=CONNECT_TIMEOUT)
        async with remote_namespace(address, PORT, NQN, options=options, iodepth=32) as ns:
            connected = True
            await _write_region(ns)
            for key, w in WORKLOADS.items():
                w = replace(w, runtime=runtime, ramp_time=ramp, size=REGION)
                res = await run_workload(
                    ns,
                    w,
                    target_cpu_clock=lambda: process_cpu_seconds(target_pid),
                    system_cpu_clock=lambda: busy_cpu_seconds((TARGET_CPU, HOST_CPU)),
                )
                if res.error or not res.total.ios:
                    out["status"] = f"error: {w.describe()}: {res.error or 'no I/O completed'}"
                    return out
                out["results"][key] = {
                    "iops": res.iops,
                    "mbps": res.mbps,
                    "host_cpu": res.host_cpu,
                    "target_cpu": res.target_cpu,
                    "system_cpu": res.system_cpu,
                }
    except Exception as exc:
        what = "error" if connected else "failed to connect"
        out["status"] = f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")
    return out


async def _write_region(ns: Any) -> None:
    block = ns.capabilities.block_size
    data = memoryview(os.urandom(MiB))
    lbas = iter(range(0, REGION // block, MiB // block))

    async def writer() -> None:
        for lba in lbas:
            await ns.write(lba, data)

    await asyncio.gather(*(writer() for _ in range(4)))


# -- set-up ---------------------------------------------------------------------------------


def _sh(cmd: str) -> str:
    return subprocess.run(shlex.split(cmd), check=True, capture_output=True, text=True).stdout


def _teardown() -> None:
    for ns in (TARGET_NS, HOST_NS):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    # Normally gone with its namespace; left over only if moving it failed.
    subprocess.run(["ip", "link", "del", TARGET_VETH], capture_output=True, check=False)


@contextlib.contextmanager
def underlay(rate: str | None) -> Iterator[None]:
    """Two namespaces joined by a veth pair with IPv4 and IPv6 addresses."""
    _teardown()
    try:
        _sh(f"ip netns add {TARGET_NS}")
        _sh(f"ip netns add {HOST_NS}")
        _sh(f"ip link add {TARGET_VETH} type veth peer name {HOST_VETH}")
        for i, (ns, dev) in enumerate(((TARGET_NS, TARGET_VETH), (HOST_NS, HOST_VETH))):
            _sh(f"ip link set {dev} netns {ns}")
            _sh(f"ip -n {ns} link set lo up")
            for fam, (a, b, plen) in UNDERLAY.items():
                extra = " nodad" if fam == "v6" else ""
                _sh(f"ip -n {ns} addr add {(a, b)[i]}/{plen} dev {dev}{extra}")
            _sh(f"ip -n {ns} link set {dev} up")
            if rate:
                _sh(
                    f"ip netns exec {ns} tc qdisc add dev {dev} root tbf rate {rate} "
                    "burst 128kb latency 400ms"
                )
        yield
    finally:
        _teardown()


@contextlib.contextmanager
def tunnel(row: Row) -> Iterator[None]:
    """vxl0 in both namespaces for a tunnel row (nothing for a plain row)."""
    if row.outer is None:
        yield
        return
    try:
        outer = UNDERLAY[row.outer]
        for i, (ns, dev) in enumerate(((TARGET_NS, TARGET_VETH), (HOST_NS, HOST_VETH))):
            local, remote = outer[i], outer[1 - i]
            if row.outer == "v4":
                csum = "udpcsum" if row.csum else "noudpcsum"
            else:
                # IPv6 UDP checksums are mandatory unless zero checksums are allowed
                # explicitly, for sending (tx) and for accepting (rx).
                csum = (
                    "udpcsum noudp6zerocsumtx noudp6zerocsumrx"
                    if row.csum
                    else "noudpcsum udp6zerocsumtx udp6zerocsumrx"
                )
            _sh(
                f"ip -n {ns} link add {VXLAN_DEV} type vxlan id {row.vni} local {local} "
                f"remote {remote} dev {dev} dstport {VXLAN_PORT} {csum}"
            )
            for fam, (a, b, plen) in INNER.items():
                extra = " nodad" if fam == "v6" else ""
                _sh(f"ip -n {ns} addr add {(a, b)[i]}/{plen} dev {VXLAN_DEV}{extra}")
            _sh(f"ip -n {ns} link set {VXLAN_DEV} up")
        yield
    finally:
        for ns in (TARGET_NS, HOST_NS):
            subprocess.run(
                ["ip", "-n", ns, "link", "del", VXLAN_DEV], capture_output=True, check=False
            )


def _link_info(row: Row) -> tuple[int | None, str]:
    """MTU of the device the row's traffic uses, and the kernel's checksum flags."""
    dev = VXLAN_DEV if row.outer else TARGET_VETH
    try:
        info = json.loads(_sh(f"ip -n {TARGET_NS} -d -j link show {dev}"))[0]
    except (subprocess.CalledProcessError, json.JSONDecodeError, IndexError):
        return None, ""
    data = info.get("linkinfo", {}).get("info_data", {})
    flags = [k for k in ("udp_csum", "udp_zero_csum6_tx", "udp_zero_csum6_rx") if data.get(k)]
    return info.get("mtu"), " ".join(flags) if row.outer else ""


@contextlib.contextmanager
def target(address: str) -> Iterator[int]:
    """The target in the target namespace, pinned to CPU 0; yields its PID (ip netns
    exec and taskset both exec, so the PID is the Python process's)."""
    listen = f"[{address}]:{PORT}" if ":" in address else f"{address}:{PORT}"
    cmd = [
        "ip", "netns", "exec", TARGET_NS, "taskset", "-c", str(TARGET_CPU),
        sys.executable, "-m", "pynvmf", "target", "--listen", listen,
        "--discovery-port", "0", "--nqn", NQN, "--memory", "1G",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "pynvmf target ready":
                break
        else:
            err = proc.stderr.read().strip() if proc.stderr else ""
            raise RuntimeError(f"target exited before it was ready: {err}")
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_row(row: Row, runtime: float, ramp: float) -> dict[str, Any]:
    """One measurement of a row: the worker's JSON, or a status saying what failed."""
    try:
        with tunnel(row), target(row.target_address) as pid:
            mtu, flags = _link_info(row)
            cmd = [
                "ip", "netns", "exec", HOST_NS, sys.executable, __file__, "--worker",
                row.target_address, str(pid), str(runtime), str(ramp),
            ]  # fmt: skip
            limit = 2 * CONNECT_TIMEOUT + 60 + len(WORKLOADS) * (runtime + ramp) * 2
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=limit)
            except subprocess.TimeoutExpired:
                return {"status": f"error: worker timed out after {limit:.0f} s", "results": {}}
            if proc.returncode:
                tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
                return {"status": f"error: worker exit {proc.returncode}: {tail[0]}", "results": {}}
            out: dict[str, Any] = json.loads(proc.stdout)
            out["mtu"], out["csum_flags"] = mtu, flags
            return out
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        return {"status": f"error: set-up: {str(detail).strip()}", "results": {}}


# -- the report -----------------------------------------------------------------------------


def _cpu(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def table(results: list[RowResult]) -> tuple[list[str], list[list[str]]]:
    header = [
        "network", "MTU", "128 KiB seq read QD8 MB/s", "target CPU", "host CPU",
        "4 KiB rand read QD32 IOPS", "target CPU", "host CPU", "CPUs 0+1 busy", "status",
    ]  # fmt: skip
    out = []
    for r in results:
        seq, rnd = r.figures.get("seq"), r.figures.get("rand")
        cells = [r.row.name, str(r.mtu or "-")]
        for f, fmt in ((seq, "{:,.1f}"), (rnd, "{:,.0f}")):
            if f:
                cells += [
                    fmt.format(f["mbps"] if f is seq else f["iops"]),
                    _cpu(f["target_cpu"]),
                    _cpu(f["host_cpu"]),
                ]
            else:
                cells += ["-", "-", "-"]
        busy = [f["system_cpu"] for f in (seq, rnd) if f and f.get("system_cpu") is not None]
        cells.append(" / ".join(f"{100 * b:.0f}%" for b in busy) or "-")
        cells.append(r.status)
        out.append(cells)
    return header, out


def chart(results: list[RowResult], path: Path, caption: str) -> None:
    plt = plot.pyplot()

    names = [r.row.name for r in results]
    seq = [r.figures.get("seq", {}).get("mbps", 0.0) for r in results]
    rnd = [r.figures.get("rand", {}).get("iops", 0.0) / 1000 for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(13, 6), sharey=True)
    ys = list(range(len(names)))
    for ax, values, title, color in (
        (axes[0], seq, "128 KiB sequential read, QD8 (MB/s)", "tab:blue"),
        (axes[1], rnd, "4 KiB random read, QD32 (kIOPS)", "tab:orange"),
    ):
        ax.barh(ys, values, color=color)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
        top = max(values) if any(values) else 1.0
        for y, v, r in zip(ys, values, results, strict=True):
            label = f"{v:,.0f}" if r.status == "ok" else r.status.split(":")[0].upper()
            ax.text(v + top * 0.01, y, label, va="center", fontsize=8)
        ax.set_xlim(0, top * 1.18)
    axes[0].set_yticks(ys, names)
    axes[0].invert_yaxis()
    plot.save(
        fig,
        path,
        caption,
        title="pynvmf NVMe/TCP over IPv4, IPv6 and VXLAN (two network namespaces)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--ramp", type=float, default=0.5, help="unmeasured seconds first")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (median)")
    parser.add_argument("--rate", help="shape the veth with tbf to this rate (default: none)")
    parser.add_argument("--quick", action="store_true", help="1 s per measurement, no docs")
    parser.add_argument("--only", help="run only rows whose name contains this")
    parser.add_argument("--docs", type=Path, default=REPO / "docs", help="where to write")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        address, pid, runtime, ramp = args.worker
        install_uvloop()
        print(json.dumps(asyncio.run(_worker(address, int(pid), float(runtime), float(ramp)))))
        return
    if os.geteuid() != 0:
        parser.error("needs root (ip netns, ip link)")
    if args.quick:
        args.runtime, args.ramp, args.repeat = 1.0, 0.25, 1
    env = environment_lines()
    selected = [r for r in rows() if not args.only or args.only in r.name]
    results: list[RowResult] = []
    started = time.perf_counter()
    with underlay(args.rate):
        for row in selected:
            res = RowResult(row)
            runs: list[dict[str, Any]] = []
            for _ in range(args.repeat):
                out = run_row(row, args.runtime, args.ramp)
                res.mtu, res.csum_flags = out.get("mtu"), out.get("csum_flags", "")
                if out["status"] != "ok":
                    res.status = out["status"]
                    break
                runs.append(out["results"])
            if res.status == "ok":
                res.runs = len(runs)
                res.figures = {
                    key: {
                        k: statistics.median(run[key][k] for run in runs)
                        for k in runs[0][key]
                        if all(run[key][k] is not None for run in runs)
                    }
                    for key in WORKLOADS
                }
            results.append(res)
            seq = res.figures.get("seq", {}).get("mbps", 0.0)
            rnd = res.figures.get("rand", {}).get("iops", 0.0)
            print(
                f"{row.name:<32} {seq:>9.1f} MB/s {rnd:>9.0f} IOPS  {res.status}",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - started

    failed = [r for r in results if r.status != "ok"]
    header, body = table(results)
    runs_text = (
        "1 run per row (not a median: single measurements)"
        if args.repeat == 1
        else f"median of {args.repeat} runs per row"
    )
    setup = (
        f"Two network namespaces joined by a veth pair "
        f"({'shaped with tbf to ' + args.rate if args.rate else 'not shaped'}); "
        f"target (`python -m pynvmf target --memory 1G`, 512-byte blocks) in one, pinned to "
        f"CPU {TARGET_CPU}; host worker (pynvmf.bench.loadgen) in the other, pinned to CPU "
        f"{HOST_CPU}; one I/O queue, no digests. Each workload: {args.ramp:g} s unmeasured, "
        f"then {args.runtime:g} s measured, over the first {REGION // MiB} MiB of the namespace "
        f"(written once first); {runs_text}."
    )
    notes = [
        "MB/s is 10^6 bytes per second. Target / host CPU: CPU time of the target process "
        "and of the host worker over the measured window (100% = one core, from /proc and "
        "the worker's process_time). CPUs 0+1 busy: all busy time on both cores "
        "(seq / rand, 200% = both full), which includes the softirq work of veth and vxlan "
        "that no process is charged for.",
        "MTU: of the device NVMe/TCP runs over (vxl0 for tunnels, sized by the kernel from "
        "the veth's 1500 minus the outer headers: 50 bytes over IPv4, 70 over IPv6).",
        "Outer UDP checksum flags as `ip -d -j link show` reports them: "
        + "; ".join(
            f"{r.row.name.removeprefix('VXLAN ')}: {r.csum_flags or 'none set'}"
            for r in results
            if r.row.outer
        )
        + ".",
        "Failed rows: "
        + ("; ".join(f"{r.row.name}: {r.status}" for r in failed) if failed else "none")
        + f". Whole run: {elapsed:.0f} s.",
    ]
    lines = [
        *(f"- {line}" for line in env),
        "",
        setup,
        "",
        markdown_table(header, body),
        "",
        *(f"- {n}" for n in notes),
        "",
        "![throughput per row](network-matrix.png)",
    ]
    text = "\n".join(lines)
    print("\n".join(env))
    print(setup)
    print()
    print(text_table(header, body))
    print()
    print("\n".join(notes))
    if not args.quick:
        write_results(
            args.docs / "network-matrix.md",
            "NVMe/TCP over IPv4, IPv6 and VXLAN",
            "benchmarks/network_matrix.py",
            text,
        )
        chart(
            results,
            args.docs / "network-matrix.png",
            f"{runs_text}; {args.runtime:g} s per measurement; target CPU {TARGET_CPU}, "
            f"host CPU {HOST_CPU}; {env[1].removeprefix('machine: ')}",
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
