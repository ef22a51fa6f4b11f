"""Which CRC32C package should compute NVMe/TCP digests?

Times every candidate that imports (the others are listed as not installed) on
the sizes that matter to NVMe/TCP: 24 bytes (a PDU header: header digests cost
one call per PDU, so per-call overhead matters as much as GB/s), 512 B to 1 MiB
(data digests), and checks each one's results and the buffer types pynvmf passes
(writable memoryview slices of its receive buffer). Medians of --repeat timed
loops per cell.

Install the candidates into a throwaway venv for the measurement only:

    python3 -m venv /tmp/crcvenv
    /tmp/crcvenv/bin/pip install crc32c google-crc32c anycrc fastcrc crc32c-rs
    PYTHONPATH=. /tmp/crcvenv/bin/python benchmarks/crc32c_libs.py --cpu 1
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pynvmf.bench import microbench, report
from pynvmf.tcp import digest

Buffer = bytes | bytearray | memoryview
CrcFunction = Callable[[Buffer], int]

KiB = 1024
MiB = 1024 * KiB
SIZES = (512, 4 * KiB, 128 * KiB, 1 * MiB)
HEADER = 24
CHECK = 0xE3069283  # CRC-32/ISCSI of b"123456789" (the CRC catalogue's check value)


def _crc32c() -> CrcFunction:
    import crc32c

    return crc32c.crc32c


def _google() -> CrcFunction:
    import google_crc32c

    if google_crc32c.implementation != "c":
        raise ImportError("google-crc32c without its C extension")
    return google_crc32c.value


def _anycrc() -> CrcFunction:
    import anycrc

    return anycrc.Model("CRC32C").calc


def _fastcrc() -> CrcFunction:
    from fastcrc import crc32

    return crc32.iscsi


def _crc32c_rs() -> CrcFunction:
    import crc32c_rs

    return crc32c_rs.crc32c


def _bytewise(data: Buffer) -> int:
    """A byte-at-a-time table loop: pynvmf's fallback before this benchmark."""
    table = digest._T0
    crc = 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass(frozen=True)
class Candidate:
    name: str
    distribution: str | None  # the PyPI distribution, None for code in this repository
    load: Callable[[], CrcFunction]


CANDIDATES = [
    Candidate("crc32c", "crc32c", _crc32c),
    Candidate("google-crc32c", "google-crc32c", _google),
    Candidate("anycrc", "anycrc", _anycrc),
    Candidate("fastcrc", "fastcrc", _fastcrc),
    Candidate("crc32c-rs", "crc32c-rs", _crc32c_rs),
    Candidate("pynvmf fallback", None, lambda: digest.crc32c_software),
    Candidate("byte-at-a-time loop", None, lambda: _bytewise),
]


@dataclass
class Loaded:
    candidate: Candidate
    fn: CrcFunction
    version: str
    writable_ok: bool  # accepts a writable memoryview (what pynvmf passes)
    note: str


@dataclass
class Measured:
    loaded: Loaded
    header_ns: float  # 24 bytes as bytes
    header_view_ns: float | None  # 24 bytes as a slice of a bytearray; None if refused
    gbps: dict[int, float]


def check(fn: CrcFunction) -> tuple[bool, str]:
    """(accepts writable memoryview slices, problems found)."""
    problems = []
    if fn(b"123456789") != CHECK:
        problems.append("wrong check value")
    data = os.urandom(4096 + 3)
    expected = digest.crc32c_software(data[3:])
    if fn(data[3:]) != expected:
        problems.append("wrong result on random data")
    try:
        writable_ok = fn(memoryview(bytearray(data))[3:]) == expected
    except TypeError:
        writable_ok = False
    return writable_ok, "; ".join(problems)


def load(c: Candidate) -> Loaded | str:
    try:
        fn = c.load()
    except ImportError as exc:
        return f"not installed ({exc})"
    ver = "this repository"
    if c.distribution is not None:
        try:
            ver = version(c.distribution)
        except PackageNotFoundError:
            ver = "?"
    writable_ok, problems = check(fn)
    note = problems or ("" if writable_ok else "rejects writable buffers (TypeError)")
    return Loaded(c, fn, ver, writable_ok, note)


def measure_all(
    loaded: list[Loaded], repeats: int, min_time: float
) -> tuple[list[Measured], float]:
    """Every cell timed in interleaved rounds (microbench.interleaved_times), so a burst of
    noise hits all candidates. Returns the results and the call floor (ns per `len`)."""
    header = os.urandom(HEADER)
    keys: list[tuple[int, str | int]] = [(-1, "floor")]
    cells: list[tuple[Callable[[Buffer], object], Buffer]] = [(len, header)]
    for i, item in enumerate(loaded):
        keys.append((i, "header"))
        cells.append((item.fn, header))
        if item.writable_ok:
            keys.append((i, "view"))
            cells.append((item.fn, memoryview(bytearray(header + b"pad!"))[:HEADER]))
        for size in SIZES:
            keys.append((i, size))
            cells.append((item.fn, os.urandom(size)))
    times = microbench.interleaved_times(cells, repeats=repeats, min_time=min_time)
    med = dict(zip(keys, times, strict=True))
    results = [
        Measured(
            item,
            med[i, "header"],
            med.get((i, "view")),
            {size: microbench.throughput_gbps(size, med[i, size]) for size in SIZES},
        )
        for i, item in enumerate(loaded)
    ]
    return results, med[-1, "floor"]


def gb(value: float) -> str:
    return f"{value:.2f}" if value >= 0.1 else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed loops per cell")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per timed loop")
    parser.add_argument("--cpu", type=int, help="pin to this CPU")
    parser.add_argument("--quick", action="store_true", help="1 loop of 0.02 s per cell")
    parser.add_argument(
        "--output",
        help="Markdown file whose results section to rewrite "
        "(default docs/crc32c.md, none with --quick); '-' for none",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.min_time = 1, 0.02
    output = args.output or ("-" if args.quick else "docs/crc32c.md")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    env = report.environment_lines()
    loaded: list[Loaded] = []
    missing: list[str] = []
    for c in CANDIDATES:
        item = load(c)
        if isinstance(item, str):
            missing.append(f"{c.name}: {item}")
        else:
            loaded.append(item)
    measured, floor = measure_all(loaded, args.repeat, args.min_time)

    headers = [
        "implementation",
        "version",
        "24 B ns/call",
        "24 B view ns/call",
        *(f"{report.size_label(s)} GB/s" for s in SIZES),
        "note",
    ]
    rows = [
        [
            m.loaded.candidate.name,
            m.loaded.version,
            f"{m.header_ns:.0f}",
            "-" if m.header_view_ns is None else f"{m.header_view_ns:.0f}",
            *(gb(m.gbps[s]) for s in SIZES),
            m.loaded.note,
        ]
        for m in measured
    ]
    cpu = f"pinned to CPU {args.cpu}" if args.cpu is not None else "not pinned"
    method = (
        f"median of {args.repeat} timed loops of ~{args.min_time:g} s per cell, the cells "
        f"interleaved (each round times every cell once), {cpu}; "
        f"ns/call includes the Python loop and call (a call to `len()` costs {floor:.0f} ns "
        "the same way); '24 B view' is a memoryview slice of a bytearray, as pynvmf passes "
        "received PDUs; GB/s = 10^9 bytes/s"
    )
    print("\n".join(env))
    print(method)
    print()
    print(report.text_table(headers, rows))
    for line in missing:
        print(line)

    if output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in env),
                f"- method: {method}",
                "",
                report.markdown_table(headers, rows),
                *([""] + [f"- {line}" for line in missing] if missing else []),
            ]
        )
        report.write_results(
            Path(output), "CRC32C implementations", "benchmarks/crc32c_libs.py", body
        )
        print(f"\nwrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
