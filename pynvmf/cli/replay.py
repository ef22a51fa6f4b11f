"""`pynvmf replay FILE... --target ADDR:PORT [--timing] [--wait S]`: send the host side of
recorded connections (`pynvmf target --record DIR`) to a target and report, per PDU,
where its answers differ from the recorded ones after normalisation
(docs/record-replay.md).

    pynvmf replay rec/*.jsonl --target 127.0.0.1:4420          # as fast as answers come
    pynvmf replay rec/*.jsonl --target 10.0.0.2:4420 --timing  # with the recorded gaps

Exit status: 0 when every answer is as recorded, 1 when some differ, are missing or
were not recorded, 2 when the files cannot be read or the target cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pynvmf.cli.common import EXIT_FAILURE, positive_seconds, verbose_option
from pynvmf.cli.parser import RawDescriptionFormatter
from pynvmf.config.native import ConfigError, parse_listen
from pynvmf.record import format as F
from pynvmf.record.replay import DEFAULT_WAIT_S, replay

EXIT_UNUSABLE = 2


def add_replay_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay recorded host PDUs against a target and report where its answers differ",
        description=__doc__,
        formatter_class=RawDescriptionFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="recording files (any order)")
    p.add_argument(
        "--target", required=True, metavar="ADDR:PORT", help="the target to replay against"
    )
    p.add_argument("--timing", action="store_true", help="keep the recorded gaps between host PDUs")
    p.add_argument(
        "--wait",
        type=positive_seconds,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help=f"how long to wait for a recorded answer (default {DEFAULT_WAIT_S:g})",
    )
    verbose_option(p)


def run_replay_command(args: argparse.Namespace) -> int:
    try:
        address = parse_listen(args.target)
        recordings = [F.load(path) for path in args.files]
    except (ConfigError, F.FormatError, OSError) as exc:
        print(f"pynvmf replay: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = asyncio.run(replay(recordings, address, timing=args.timing, wait_s=args.wait))
    for line in report.lines():
        print(line)
    print(
        f"{report.associations} association(s), {report.sent} PDUs sent, "
        f"{report.matched} answers matched, {len(report.findings)} finding(s)"
    )
    return EXIT_FAILURE if report.differs else 0
