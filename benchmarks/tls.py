"""What the NVMe/TCP secure channel costs: plain NVMe/TCP, TLS 1.3 with the record layer
in user space, and TLS 1.3 with the record layer in the kernel (kTLS) where the kernel has it.

One target runs in a child process pinned to --target-cpu with a 1 GiB memory namespace
filled with random data, listening on three ports: plain, TLS with kTLS allowed, TLS with
kTLS off. This process, pinned to --host-cpu, holds one connection per mode with pynvmf's
host library (TLS_AES_128_GCM_SHA256, psk_dhe_ke x25519); the host decides kTLS for its
side the same way, so "kTLS" means both ends' records go through their kernels. Where the
kernel has no kTLS (no ``tls`` module) that mode falls back to user space and its row says
so. Each workload, 4 KiB random read at QD32 (IOPS) and 128 KiB sequential read at QD8
(MB/s), gives each connection --runtime seconds per run in --slices slices, the modes
taking turns slice by slice so that noise from the rest of the machine falls on all alike.
Cells are medians of --repeat runs.

Then the handshake's cost: full TLS 1.3 PSK handshakes per second in one process (both
ends, sans-I/O), per cipher suite.

    python3 benchmarks/tls.py [--runtime 3] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pynvmf.aio import install_uvloop
from pynvmf.bench import (
    BenchResult,
    ConnectOptions,
    Workload,
    busy_cpu_seconds,
    remote_namespace,
    run_interleaved,
    start_target,
    summarize,
)
from pynvmf.bench import report as R
from pynvmf.bench.options import add_interleaved_options, resolve_interleaved_options
from pynvmf.bench.target_process import TargetProcess
from pynvmf.host import RemoteNamespace
from pynvmf.tcp.psk import HASH_SHA256, HASH_SHA384, ConfiguredPsk, tls_psk
from pynvmf.tls import engine as E
from pynvmf.tls import records as RC
from pynvmf.tls import wire as W

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000b7e5"
KEY = ConfiguredPsk(HASH_SHA256, bytes(range(32))).encode()


@dataclass(frozen=True)
class Mode:
    name: str
    port: str  # "plain", or the TLS port's kTLS policy
    ktls: str = "auto"


MODES = (
    Mode("plain", "plain"),
    Mode("TLS, user space", "off", "off"),
    Mode("TLS, kTLS", "auto", "auto"),
)
WORKLOADS = {
    "4 KiB random read, QD32": Workload("randread", 4 * KiB, 32),
    "128 KiB sequential read, QD8": Workload("read", 128 * KiB, 8),
}

# results[workload name][mode name]: one result per repeat
Results = dict[str, dict[str, list[BenchResult]]]


async def measure(
    args: argparse.Namespace, target: TargetProcess
) -> tuple[Results, dict[str, str]]:
    results: Results = {name: {m.name: [] for m in MODES} for name in WORKLOADS}
    offloads: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        namespaces: dict[str, RemoteNamespace] = {}
        for mode in MODES:
            if mode.port == "plain":
                port, options = target.port, ConnectOptions()
            else:
                port = target.tls_ports[mode.port]
                options = ConnectOptions(hostnqn=HOSTNQN, tls_psk=KEY, ktls=mode.ktls)
            ns = await stack.enter_async_context(
                remote_namespace("127.0.0.1", port, target.nqn, options=options, iodepth=32)
            )
            tls = ns.controller.io_queues[0].tls
            offloads[mode.name] = "-" if tls is None else tls.offload
            if tls is not None and tls.offload != "ktls" and mode.ktls == "auto":
                offloads[mode.name] += " (no kTLS in this kernel)"
            namespaces[mode.name] = ns
        cpus = {args.target_cpu, args.host_cpu}
        for repeat in range(args.repeat):
            for n, (name, w) in enumerate(WORKLOADS.items()):
                run = replace(w, runtime=args.runtime, ramp_time=args.warmup, seed=n)
                merged = await run_interleaved(
                    [namespaces[m.name] for m in MODES],
                    run,
                    slices=args.slices,
                    first=n + repeat,
                    target_cpu_clocks=[target.cpu_seconds] * len(MODES),
                    system_cpu_clock=lambda: busy_cpu_seconds(cpus),
                )
                for mode, res in zip(MODES, merged, strict=True):
                    if res.error:
                        raise SystemExit(f"{name}, {mode.name}: {res.error}")
                    results[name][mode.name].append(res)
                    print(
                        f"run {repeat + 1}/{args.repeat} {name:<29} {mode.name:<16}"
                        f"{res.iops:>9.0f} IOPS {res.mbps:>8.1f} MB/s "
                        f"{res.total.latency.mean_us:>7.1f} us mean, other load "
                        f"{res.other_cpu or 0:.2f} CPU",
                        file=sys.stderr,
                    )
    return results, offloads


def io_table(results: Results, offloads: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "workload",
        "mode",
        "records by",
        "IOPS",
        "MB/s",
        "vs plain",
        "mean µs",
        "p99 µs",
        "target CPU",
        "other load (CPUs)",
    ]
    rows = []
    for name, by_mode in results.items():
        base = by_mode[MODES[0].name]
        for mode in MODES:
            runs = by_mode[mode.name]
            s = summarize(runs)
            ratio = statistics.median(r.iops / b.iops for r, b in zip(runs, base, strict=True))
            rows.append(
                [
                    name,
                    mode.name,
                    offloads[mode.name],
                    f"{s.iops:,.0f}",
                    f"{s.mbps:,.1f}",
                    f"{ratio:.2f}",
                    f"{s.mean_us:.0f}",
                    f"{s.p99_us:.0f}",
                    "-" if s.target_cpu is None else f"{s.target_cpu:.0%}",
                    "-" if s.other_cpu is None else f"{s.other_cpu:.2f}",
                ]
            )
    return headers, rows


def handshake_table(repeats: int, count: int) -> tuple[list[str], list[list[str]]]:
    """Full handshakes (client and server engines in this process) per second."""
    rows = []
    for hash_id, size in ((HASH_SHA256, 32), (HASH_SHA384, 48)):
        configured = ConfiguredPsk(hash_id, os.urandom(size))
        psk = tls_psk(configured, HOSTNQN, "nqn.2014-08.org.pynvmf:bench")
        for modes, label in (((W.PSK_DHE_KE,), "psk_dhe_ke x25519"), ((W.PSK_KE,), "psk_ke")):
            rates = []
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(count):
                    client = E.TlsEngine.client(psk, modes=modes)
                    server = E.TlsEngine.server(lambda i, p=psk: [p] if i == p.identity else [])
                    client.start()
                    for record in client.take_output():
                        server.feed(record)
                    for record in server.take_output():
                        client.feed(record)
                    for record in client.take_output():
                        server.feed(record)
                    assert client.established and server.established
                rates.append(count / (time.perf_counter() - started))
            suite = W.SUITE_FOR_HASH[hash_id].name
            rows.append([suite, label, f"{statistics.median(rates):,.0f}"])
    return ["cipher suite", "key exchange", "handshakes/s (both ends)"], rows


def record_table(repeats: int, min_time: float) -> tuple[list[str], list[list[str]]]:
    """The user-space record layer alone: seal (encrypt) and open (decrypt) of one I/O's
    data, in records of at most 16 KiB, per cipher suite."""
    rows = []
    for suite in (W.TLS_AES_128_GCM_SHA256, W.TLS_AES_256_GCM_SHA384):
        row = [suite.name]
        for size in (4 * KiB, 128 * KiB):
            data = os.urandom(size)
            rates = []
            for _ in range(repeats):
                tx, rx = RC.RecordCipher(suite, bytes(48)), RC.RecordCipher(suite, bytes(48))
                n = 0
                started = time.perf_counter()
                while time.perf_counter() - started < min_time:
                    out = tx.seal_many([data])
                    for k in range(0, len(out), 2):
                        rx.open(out[k], out[k + 1])
                    n += 1
                rates.append(n * size / (time.perf_counter() - started) / 1e6)
            row.append(f"{statistics.median(rates):,.0f}")
        rows.append(row)
    return ["cipher suite", "4 KiB seal+open MB/s", "128 KiB seal+open MB/s"], rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_interleaved_options(parser, "the modes rotating", "docs/tls.md")
    args = parser.parse_args()
    output = resolve_interleaved_options(parser, args)

    env = R.environment_lines()
    target = start_target(cpu=args.target_cpu, size=1 * GiB, fill=True, tls_psks={HOSTNQN: KEY})
    try:
        os.sched_setaffinity(0, {args.host_cpu})
        host_uvloop = install_uvloop()
        results, offloads = asyncio.run(measure(args, target))
    finally:
        target.stop()
    hs_repeats, hs_count = (1, 20) if args.quick else (max(args.repeat, 5), 200)
    hs_headers, hs_rows = handshake_table(hs_repeats, hs_count)
    rec_headers, rec_rows = record_table(hs_repeats, 0.05 if args.quick else 0.3)

    setup = (
        f"target on CPU {args.target_cpu} (uvloop {'on' if target.uvloop else 'off'}), host on "
        f"CPU {args.host_cpu} (uvloop {'on' if host_uvloop else 'off'}); 1 GiB memory "
        "namespace filled with random data; one I/O queue per connection, in-capsule 16 KiB; "
        "TLS_AES_128_GCM_SHA256 with psk_dhe_ke (x25519); "
        f"each run measures {args.runtime:g} s per mode in {args.slices} slices (each after "
        f"{args.warmup:g} s warm-up), the modes rotating slice by slice; cells are medians of "
        f"{args.repeat} runs, 'vs plain' the median of the per-run ratios; 'records by' is "
        "what carried the TLS records on the host's side (the target decided the same way); "
        "'other load' is the CPU time on the two benchmark CPUs used by neither host nor target"
    )
    setup += f"; load average at end {R.load_line()}"
    hs_method = (
        f"handshakes: median of {hs_repeats} loops of {hs_count} handshakes, client and "
        f"server engines in one process on CPU {args.host_cpu}"
    )
    headers, rows = io_table(results, offloads)
    print("\n".join(env))
    print(setup)
    print()
    print(R.text_table(headers, rows))
    print()
    print(hs_method)
    print(R.text_table(hs_headers, hs_rows))
    print()
    print(R.text_table(rec_headers, rec_rows))
    if output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in env),
                f"- setup: {setup}",
                "",
                R.markdown_table(headers, rows),
                "",
                f"- {hs_method}",
                "",
                R.markdown_table(hs_headers, hs_rows),
                "",
                "- the user-space record layer alone (one process, both directions, median of"
                f" {hs_repeats} timed loops): what a kTLS offload takes off the CPU",
                "",
                R.markdown_table(rec_headers, rec_rows),
            ]
        )
        R.write_results(Path(output), "NVMe/TCP over TLS 1.3", "benchmarks/tls.py", body)
        print(f"\nwrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
