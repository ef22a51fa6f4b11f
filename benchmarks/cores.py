"""`pynvmf target --cores 2` against `--cores 1`: how the I/O queues' workers scale.

Each round starts `pynvmf target --cores N` (a 1 GiB memory namespace) as a user
would, drives it with a client for --seconds, and stops it; the rounds alternate
1, 2, 2, 1, 1, 2, ... so that the load of a shared machine falls on both alike, and
the table shows medians with the spread. The client is SPDK's `spdk_nvme_perf`
(`--spdk DIR`, several I/O qpairs on one core: `-c 0x1 -P 4`) and pynvmf's own
host benchmark (`pynvmf bench --numjobs 4`), both sharing the machine's cores with
the target. The target's CPU time (main process and workers) per command is the
per-command cost; a round trip over the workers' channel is what a command
forwarded to the main process costs; a memcpy's bandwidth bounds the data path.

    python benchmarks/cores.py [--spdk /work/spdk/build/bin] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NQN = "nqn.2024-11.dev.pynvmf:default"
READY = "pynvmf target ready"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of `pid` (the main process) and of its live children (the workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    main = workers = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(entry) == pid:
            main += seconds
        elif int(fields[1]) == pid:
            workers += seconds
    return main, workers


class Target:
    def __init__(self, cores: int) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pynvmf",
                "target",
                "--cores",
                str(cores),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--discovery-port",
                "0",
                "--memory",
                "1G",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == READY:
                break
        else:
            raise RuntimeError("the target did not start")

    def cpu(self) -> tuple[float, float]:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _children_cpu() -> float:
    """CPU seconds of this process's children that have been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spdk_perf(spdk: Path, port: int, workload: str, seconds: float, *, idle: bool = False) -> float:
    """4 I/O queues at QD32: on CPU 0 as the field runs it (its reactor polls, so it
    holds CPU 0 whatever the target does), or with `idle` one reactor on each CPU with 2
    queues each under SCHED_IDLE, where it runs only when no target process wants the
    CPU: its polling then takes nothing from the target's workers, only its work does."""
    rw, bs = {"4k randread": ("randread", 4096), "4k randwrite": ("randwrite", 4096)}[workload]
    trid = f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    out = subprocess.run(
        [
            *(("chrt", "--idle", "0") if idle else ()),
            str(spdk / "spdk_nvme_perf"),
            "-r",
            trid,
            "-q",
            "32",
            "-o",
            str(bs),
            "-w",
            rw,
            "-t",
            str(int(seconds)),
            "-c",
            "0x3" if idle else "0x1",
            "-P",
            "2" if idle else "4",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    ).stdout
    m = re.search(r"^Total\s*:\s*([\d.]+)", out, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"spdk_nvme_perf printed no total:\n{out}")
    return float(m.group(1))


def pynvmf_bench(port: int, workload: str, seconds: float) -> float:
    rw = workload.split()[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pynvmf",
            "bench",
            "-a",
            "127.0.0.1",
            "-s",
            str(port),
            "--nqn",
            NQN,
            "--rw",
            rw,
            "--bs",
            "4k",
            "--iodepth",
            "32",
            "--numjobs",
            "4",
            "--runtime",
            str(seconds),
            "--group-reporting",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        cwd=REPO,
    ).stdout
    doc = json.loads(out[out.index("{") :])
    job = doc["jobs"][0]
    return float(job["read"]["iops"] + job["write"]["iops"])


CONNECTS = 20
SPDK = "spdk_nvme_perf"
SPDK_IDLE = "spdk_nvme_perf, SCHED_IDLE on both CPUs"


def connect_ms(port: int, n: int = CONNECTS, queues: int = 4) -> float:
    """Median ms to bring up a controller with `queues` I/O queues and close it: with
    workers, each I/O queue is handed over (descriptor passing and replay)."""
    sys.path.insert(0, str(REPO))
    from pynvmf.host import connect

    async def run() -> float:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            ctrl = await connect("127.0.0.1", port, NQN, queues=queues)
            times.append(time.perf_counter() - start)
            await ctrl.close()
        return statistics.median(times) * 1e3

    return asyncio.run(run())


def round_trip_us(n: int = 20000) -> float:
    """Mean µs of one request and its reply over a worker channel (ipc.Channel) to
    another process: what forwarding a command to the main process adds."""
    code = (
        "import asyncio, socket, sys\n"
        "from pynvmf.target.cores.ipc import Channel\n"
        "async def main():\n"
        "    done = asyncio.Event()\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=int(sys.argv[1]))\n"
        "    Channel(s, lambda kind, args, fds: args, done.set)\n"
        "    await done.wait()\n"
        "asyncio.run(main())\n"
    )
    from pynvmf.target.cores.ipc import Channel, socket_pair

    async def run() -> float:
        mine, theirs = socket_pair()
        os.set_inheritable(theirs.fileno(), True)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            cwd=REPO,
        )
        theirs.close()
        channel = Channel(mine, lambda kind, args, fds: None, lambda: None)
        await channel.request("echo", 0)
        start = time.perf_counter()
        for i in range(n):
            await channel.request("echo", i)
        elapsed = time.perf_counter() - start
        channel.close()
        proc.wait(10)
        return elapsed / n * 1e6

    return asyncio.run(run())


def memcpy_gbps(size: int = 256 << 20) -> float:
    src = bytearray(os.urandom(1 << 20)) * (size >> 20)
    dst = bytearray(size)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        dst[:] = src
        best = max(best, size / (time.perf_counter() - start) / 1e9)
    return best


def _spread(runs: list[tuple[float, float, float]]) -> str:
    iops = [i for i, _, _ in runs]
    return f"{min(iops) / 1000:.1f}-{max(iops) / 1000:.1f}K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spdk", type=Path, default=Path("/work/spdk/build/bin"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workloads", default="4k randread,4k randwrite")
    args = parser.parse_args()
    clients = ["pynvmf bench"]
    if (args.spdk / "spdk_nvme_perf").exists():
        clients[:0] = [SPDK, SPDK_IDLE]
    else:
        print(f"no spdk_nvme_perf in {args.spdk}: pynvmf's own host only", file=sys.stderr)
    workloads = args.workloads.split(",")
    results: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    connects: dict[int, list[float]] = {1: [], 2: []}
    connect_cpu: dict[int, list[float]] = {1: [], 2: []}
    load_start = os.getloadavg()
    started = time.monotonic()
    for r in range(args.rounds):
        order = (1, 2) if r % 2 == 0 else (2, 1)
        for cores in order:
            target = Target(cores)
            try:
                for client in clients:
                    for workload in workloads:
                        main0, workers0 = target.cpu()
                        client0 = _children_cpu()
                        if client == "pynvmf bench":
                            iops = pynvmf_bench(target.port, workload, args.seconds)
                        else:
                            iops = spdk_perf(
                                args.spdk,
                                target.port,
                                workload,
                                args.seconds,
                                idle=client == SPDK_IDLE,
                            )
                        client_s = _children_cpu() - client0
                        main1, workers1 = target.cpu()
                        used = main1 - main0 + workers1 - workers0
                        commands = max(1.0, iops * args.seconds)
                        cpu_us = used / commands * 1e6
                        # The client's whole run (connect and teardown included) over the
                        # commands of its measured seconds: an upper bound, close to it.
                        client_us = client_s / commands * 1e6
                        main_share = (main1 - main0) / used if used else 0.0
                        results.setdefault((client, workload, cores), []).append(
                            (iops, cpu_us, client_us)
                        )
                        line = {"client": client, "workload": workload, "cores": cores}
                        line |= {"iops": round(iops), "cpu_us": round(cpu_us, 2)}
                        line |= {"client_cpu_us": round(client_us, 2)}
                        line |= {"main_cpu_share": round(main_share, 3)}
                        print(json.dumps(line), flush=True)
                main0, _ = target.cpu()
                connects[cores].append(connect_ms(target.port))
                main1, _ = target.cpu()
                connect_cpu[cores].append((main1 - main0) / CONNECTS * 1e3)
            finally:
                target.stop()
    load_end = os.getloadavg()
    rtt = round_trip_us()
    bw = memcpy_gbps()
    print()
    print(
        f"{args.rounds} rounds of {args.seconds:g} s, alternating; {os.cpu_count()} CPUs; "
        f"load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end; "
        f"{time.monotonic() - started:.0f} s"
    )
    print()
    print(
        "| client | workload | --cores 1 IOPS | --cores 2 IOPS | ratio "
        "| target CPU µs/cmd 1 → 2 | client CPU µs/cmd 1 → 2 | bound |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for client in clients:
        for workload in workloads:
            one = results[(client, workload, 1)]
            two = results[(client, workload, 2)]
            m1 = statistics.median(i for i, _, _ in one)
            m2 = statistics.median(i for i, _, _ in two)
            c1 = statistics.median(c for _, c, _ in one)
            c2 = statistics.median(c for _, c, _ in two)
            h1 = statistics.median(h for _, _, h in one)
            h2 = statistics.median(h for _, _, h in two)
            # What two CPUs can give when every command costs the target c2 and the
            # client h2 of CPU time, over what one worker gave.
            bound = (2 / (c2 + h2) * 1e6) / m1
            spread1 = (
                f"{min(i for i, _, _ in one) / 1000:.1f}-{max(i for i, _, _ in one) / 1000:.1f}K"
            )
            spread2 = (
                f"{min(i for i, _, _ in two) / 1000:.1f}-{max(i for i, _, _ in two) / 1000:.1f}K"
            )
            print(
                f"| {client} | {workload} QD32 x 4 queues | {m1:,.0f} ({spread1}) | "
                f"{m2:,.0f} ({spread2}) | {m2 / m1:.2f} | {c1:.1f} → {c2:.1f} | "
                f"{h1:.1f} → {h2:.1f} | {bound:.2f} |"
            )
    print()
    c1, c2 = statistics.median(connects[1]), statistics.median(connects[2])
    print(f"controller with 4 I/O queues, connect to ready: {c1:.1f} ms (1) vs {c2:.1f} ms (2)")
    m1, m2 = statistics.median(connect_cpu[1]), statistics.median(connect_cpu[2])
    print(
        f"main process CPU per controller (admin + 4 I/O queue connects, close): "
        f"{m1:.2f} ms (1) vs {m2:.2f} ms (2, handing 4 queues over)"
    )
    print(f"worker channel round trip (request + reply, another process): {rtt:.1f} µs")
    print(f"memcpy (one core, 256 MiB bytearray copy): {bw:.1f} GB/s")


if __name__ == "__main__":
    main()
