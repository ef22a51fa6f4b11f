"""`pynvmf top [--server S] [--sort KEY] [--subsystem NQN] [--interval S] [--once]`: a live
view of a running target's hosts over its RPC, as spdk_top and nvme top show theirs.

    pynvmf top                                  # live, every second; q quits
    pynvmf top --sort p99 --subsystem nqn.2024-11.dev.pynvmf:a
    pynvmf top --once --interval 2              # one plain table after 2 s, for scripts
    pynvmf top --iterations 10                  # ten tables, one a second

One row per subsystem, host and namespace: commands a second (IOPS), MB/s read and
written (10**6 bytes), the median and 99th percentile latency of the commands completed in
the interval (capsule received to completion sent, interpolated within the target's
histogram buckets; "-" when the target does not track latency or nothing completed), and
errors a second. The figures are differences between two answers of
pynvmf_get_host_stats, over the target's own clock. In the live view a key sorts: i(ops),
r(ead), w(rite), 5 (p50), 9 (p99), e(rrors), h(ost), s(ubsystem), n(sid); t switches to
the hosts' stages and back (--stages starts there): the 99th percentile of the time each
host's commands spent being received, waiting for their data, for a budget, on the device
and being sent; q quits. With --once, --iterations, or an output that is not a terminal, it
prints plain tables.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

from pynvmf.cli.common import (
    EXIT_FAILURE,
    CommandError,
    int_at_least,
    positive_seconds,
    verbose_option,
)
from pynvmf.cli.parser import RawDescriptionFormatter
from pynvmf.cli.rpc import add_server_options
from pynvmf.cli.top_view import (
    DEFAULT_SORT,
    QUIT_LETTERS,
    SORT_KEYS,
    SORT_LETTERS,
    STAGES_LETTER,
    Snapshot,
    StatsError,
    Table,
    empty_view,
    plain_text,
    snapshot,
    view,
)
from pynvmf.rpc.client import RpcClient, RpcClientError
from pynvmf.rpc.jsonrpc import METHOD_NOT_FOUND

METHOD = "pynvmf_get_host_stats"


def add_top_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "top",
        help="a live view of a running target's hosts: IOPS, MB/s, latency, errors",
        description=__doc__,
        formatter_class=RawDescriptionFormatter,
    )
    add_server_options(p)
    p.add_argument(
        "--sort", choices=SORT_KEYS, default=DEFAULT_SORT, help="the column rows are sorted by"
    )
    p.add_argument("--subsystem", metavar="NQN", help="only this subsystem's hosts")
    p.add_argument(
        "--stages",
        action="store_true",
        help="show where each host's time goes (p99 of each stage) instead of its namespaces",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="the time between two answers, over which rates are taken (default 1)",
    )
    once = p.add_mutually_exclusive_group()
    once.add_argument("--once", action="store_true", help="print one table and exit")
    once.add_argument(
        "--iterations",
        type=int_at_least(1),
        metavar="N",
        help="print N tables, one an interval, and exit",
    )
    verbose_option(p)


def _poller(client: RpcClient, subsystem: str | None) -> Callable[[], Snapshot]:
    params = {"subsystem": subsystem} if subsystem is not None else {}

    def poll() -> Snapshot:
        try:
            return snapshot(client.call(METHOD, params))
        except StatsError as exc:
            raise CommandError(f"{METHOD}'s answer: {exc}") from None

    return poll


def run_top_command(args: argparse.Namespace) -> int:
    try:
        with RpcClient(args.server, timeout=args.timeout) as client:
            poll = _poller(client, args.subsystem)
            if args.once or args.iterations or not sys.stdout.isatty():
                return _print_tables(poll, args, 1 if args.once else args.iterations)
            return _live(poll, args)
    except RpcClientError as exc:
        if exc.code == METHOD_NOT_FOUND:
            print(f"pynvmf top: {args.server}: the target has no {METHOD}", file=sys.stderr)
        else:
            code = f" (code {exc.code})" if exc.code is not None else ""
            print(f"pynvmf top: {args.server}: {exc.message}{code}", file=sys.stderr)
        return EXIT_FAILURE
    except CommandError as exc:
        print(f"pynvmf top: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 0


def _print_tables(poll: Callable[[], Snapshot], args: argparse.Namespace, count: int | None) -> int:
    """`count` plain tables (None: until interrupted), each over one interval."""
    earlier = poll()
    shown = 0
    while count is None or shown < count:
        time.sleep(args.interval)  # the interval the rates are taken over, not a wait on state
        later = poll()
        if shown:
            print()
        print(plain_text(view(earlier, later, args.sort, args.stages)), flush=True)
        earlier = later
        shown += 1
    return 0


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A function that waits up to its argument's seconds for a key and returns it ("" for
    none), with the terminal's keys read one at a time (not echoed) meanwhile."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def wait(timeout: float) -> str:
            time.sleep(max(timeout, 0))
            return ""

        yield wait
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:

        def read(timeout: float) -> str:
            ready, _, _ = select.select([fd], [], [], max(timeout, 0))
            return os.read(fd, 1).decode(errors="replace") if ready else ""

        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live(poll: Callable[[], Snapshot], args: argparse.Namespace) -> int:
    # rich only here: the guests run the tree on Debian's Python, which lacks it.
    from rich.live import Live

    sort: str = args.sort
    stages: bool = args.stages
    earlier = poll()
    pair: tuple[Snapshot, Snapshot] | None = None  # the last interval's two answers
    title = f"pynvmf top: {args.server}" + (f", {args.subsystem}" if args.subsystem else "")

    def render() -> Any:
        table = view(*pair, sort, stages) if pair is not None else None
        return _rich_table(title, table, sort, stages, args.interval)

    with _keys() as key, Live(render(), auto_refresh=False) as live:
        due = time.monotonic() + args.interval
        while True:
            pressed = key(due - time.monotonic())
            if pressed in QUIT_LETTERS:
                return 0
            if pressed in SORT_LETTERS:
                sort = SORT_LETTERS[pressed]
            elif pressed == STAGES_LETTER:
                stages = not stages
            elif time.monotonic() >= due:
                later = poll()
                pair, earlier = (earlier, later), later
                due += args.interval
                if due < time.monotonic():  # a slow answer: the next interval from now
                    due = time.monotonic() + args.interval
            else:
                continue
            live.update(render(), refresh=True)


def _rich_table(title: str, table: Table | None, sort: str, stages: bool, interval: float) -> Any:
    from rich.table import Table as RichTable
    from rich.text import Text

    if table is None:  # before the first interval: the columns, no rows yet
        table = empty_view(stages)
    shown = "stages (p99)" if stages else "namespaces"
    order = f", sorted by {table.sorted_by}" if table.sorted_by else ""
    caption = (
        f"{shown}, every {interval:g} s{order}; keys: i r w 5 9 e h s n sort, t stages, q quits"
    )
    out = RichTable(title=title, caption=caption, expand=False)
    for i, header in enumerate(table.headers):
        out.add_column(
            header,
            justify="right" if i in table.numeric else "left",
            header_style="bold reverse" if i == table.sorted_column else "bold",
            overflow="fold",
        )
    for line, connected in zip(table.lines, table.connected, strict=True):
        # Text, not markup: a host NQN may hold "[/]" or "[link=...]".
        out.add_row(*(Text(c) for c in line), style=None if connected else "dim")
    return out
