"""Command-line options shared by the benchmarks that compare settings side by side
(benchmarks/inline_data.py, benchmarks/digests.py): the settings take turns in
slices of each run so that noise on the shared machine affects them equally."""

from __future__ import annotations

import argparse
import os


def add_interleaved_options(parser: argparse.ArgumentParser, rotating: str, doc: str) -> None:
    """`rotating` says what takes turns ("the targets alternating"); `doc` is the
    Markdown file whose results section a full run rewrites."""
    parser.add_argument("--runtime", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median)")
    parser.add_argument("--slices", type=int, default=6, help=f"slices per run, {rotating}")
    parser.add_argument(
        "--warmup", type=float, default=0.2, help="seconds before measuring, per slice"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 s, 1 repeat")
    parser.add_argument("--target-cpu", type=int, default=0)
    parser.add_argument("--host-cpu", type=int, default=1)
    parser.add_argument(
        "--output",
        default=None,
        help=f"Markdown file whose results section to rewrite (default {doc}, none with "
        "--quick); '-' for none",
    )
    parser.set_defaults(default_output=doc)


def resolve_interleaved_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """Apply --quick, check the CPUs, and return the output path ('-' for none)."""
    if args.quick:
        args.runtime, args.repeat, args.slices, args.warmup = 1.0, 1, 2, 0.1
    available = os.sched_getaffinity(0)
    if args.target_cpu not in available or args.host_cpu not in available:
        parser.error(f"CPUs {args.target_cpu} and {args.host_cpu} must be in {sorted(available)}")
    return str(args.output or ("-" if args.quick else args.default_output))
