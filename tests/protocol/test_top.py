"""`pynvmf top` as a user runs it, over the RPC.

Two kinds of test:
- the command's glue (the plain tables, --subsystem, --iterations, the live view in a
  terminal with its keys, the error of a target without the method, and no rich needed
  for the plain tables), against pynvmf's own RPC server with a stand-in
  pynvmf_get_host_stats that answers literal answers in the agreed shape;
- END TO END, against `pynvmf target --latency-tracking` after a known workload of the
  host library.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import select
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.cli.top_view import HEADERS, STAGES, Snapshot, rows, snapshot, view
from pynvmf.host import connect
from pynvmf.host.errors import NvmeStatusError
from pynvmf.rpc.client import RpcClient
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.server import RpcServer
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.target import Target
from tests.support.target_process import TargetProcess

SUB = "nqn.2024-11.dev.pynvmf:top"
OTHER_SUB = "nqn.2024-11.dev.pynvmf:other"
READER = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a001"
WRITER = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a002"
BOUNDS = [1e-05, 2.5e-05, 5e-05, 0.0001]
SECOND = 1_000_000_000


# -- the glue, against a stand-in method --------------------------------------------------


def _answer(poll: int, subsystem: str | None, extra_host: str | None = None) -> dict[str, Any]:
    """The stand-in's answer to its `poll`th call: the reader reads 1000 blocks of 4 KiB a
    second (all in (10us, 25us]; their device stage in (50us, 100us]), the writer writes 10
    a second (their data stage in (10us, 25us]), the other subsystem's host nothing,
    `extra_host` (if any) nothing; one second of the target's clock between calls."""
    reads = 1000 * poll
    writes = 10 * poll

    def stages(slow: str, bucket: int, n: int) -> dict[str, Any]:
        # `n` commands: in (0, 10us] in every stage but `slow`, there in `bucket`.
        result = {}
        for stage in STAGES:
            buckets = [0] * (len(BOUNDS) + 1)
            buckets[bucket if stage == slow else 0] = n
            result[stage] = {"count": n, "sum": 0.0, "buckets": buckets}
        return result

    hosts = [
        {
            "subsystem": SUB,
            "host": READER,
            "connected": True,
            "namespaces": [
                {
                    "nsid": 1,
                    "commands": {"read": reads},
                    "bytes": {"read": reads * 4096},
                    "errors": 0,
                    "latency": {
                        "read": {"count": reads, "sum": 0.0, "buckets": [0, reads, 0, 0, 0]}
                    },
                }
            ],
            "stages": stages("device", 3, reads),
        },
        {
            "subsystem": SUB,
            "host": WRITER,
            "connected": True,
            "namespaces": [
                {
                    "nsid": 2,
                    "commands": {"write": writes},
                    "bytes": {"write": writes * 512},
                    "errors": poll,
                    "latency": {
                        "write": {"count": writes, "sum": 0.0, "buckets": [0, 0, 0, writes, 0]}
                    },
                }
            ],
            "stages": stages("data", 1, writes),
        },
        {"subsystem": OTHER_SUB, "host": READER, "connected": False, "namespaces": []},
    ]
    if extra_host is not None:
        idle = {"nsid": 1, "commands": {}, "bytes": {}, "errors": 0, "latency": {}}
        hosts.append(
            {"subsystem": SUB, "host": extra_host, "connected": True, "namespaces": [idle]}
        )
    return {
        "tick_rate": SECOND,
        "ticks": 5 * SECOND + poll * SECOND,
        "latency_tracking": True,
        "buckets": BOUNDS,
        "hosts": [h for h in hosts if subsystem in (None, h["subsystem"])],
    }


class StandIn:
    """pynvmf's RPC server on a Unix socket, answering pynvmf_get_host_stats (if `has_method`)
    from _answer and recording the parameters it was called with."""

    def __init__(self, path: str, has_method: bool = True, extra_host: str | None = None) -> None:
        self.path = path
        self.extra_host = extra_host
        self.calls: list[dict[str, Any]] = []
        table = MethodTable()
        if has_method:
            table.register("pynvmf_get_host_stats")(self._host_stats)
        self.server = RpcServer(ControlPlane(Target(), table))

    async def _host_stats(self, cp: ControlPlane, p: Params) -> dict[str, Any]:
        subsystem = p.string("subsystem", None)
        p.done()
        self.calls.append({"subsystem": subsystem} if subsystem else {})
        return _answer(len(self.calls), subsystem, self.extra_host)


@contextlib.asynccontextmanager
async def stand_in(
    tmp_path: Path, has_method: bool = True, extra_host: str | None = None
) -> AsyncIterator[StandIn]:
    server = StandIn(str(tmp_path / "rpc.sock"), has_method, extra_host)
    await server.server.listen_unix(server.path)
    try:
        yield server
    finally:
        await server.server.close()


async def _top(*args: str, prelude: str = "") -> tuple[int, str, str]:
    """`pynvmf top ARGS` in a process of its own (`prelude`: Python run before it); its exit
    status, stdout and stderr."""
    code = f"import sys\n{prelude}\nfrom pynvmf.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        "top",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _table(text: str) -> list[list[str]]:
    header, *lines = text.strip("\n").split("\n")
    assert header.split()[:3] == list(HEADERS[:3])
    return [line.split() for line in lines]


async def test_once_prints_one_table_of_rates_sorted_as_asked(tmp_path: Path) -> None:
    async with stand_in(tmp_path) as server:
        status, out, err = await _top(
            "--server", server.path, "--once", "--interval", "0.01", "--sort", "errors"
        )
    assert status == 0, err
    writer, reader = _table(out)
    assert writer == [SUB, WRITER, "2", "10", "0.00", "0.01", "75.0us", "99.5us", "1.0"]
    assert reader == [SUB, READER, "1", "1,000", "4.10", "0.00", "17.5us", "24.9us", "0.0"]
    assert server.calls == [{}, {}]


async def test_subsystem_and_iterations(tmp_path: Path) -> None:
    async with stand_in(tmp_path) as server:
        status, out, err = await _top(
            "--server", server.path, "--iterations", "3", "--interval", "0.01", "--subsystem", SUB
        )
    assert status == 0, err
    tables = out.strip("\n").split("\n\n")
    assert len(tables) == 3
    for table in tables:
        assert [line[:4] for line in _table(table)] == [
            [SUB, READER, "1", "1,000"],
            [SUB, WRITER, "2", "10"],
        ]
    assert server.calls == [{"subsystem": SUB}] * 4


async def test_stages_show_where_each_hosts_time_goes(tmp_path: Path) -> None:
    async with stand_in(tmp_path) as server:
        status, out, err = await _top(
            "--server", server.path, "--once", "--interval", "0.01", "--stages"
        )
    assert status == 0, err
    header, *lines = out.strip("\n").split("\n")
    assert header.split() == [
        "SUBSYSTEM", "HOST",
        "RECEIVE", "P99", "DATA", "P99", "BUDGET", "P99", "DEVICE", "P99", "SEND", "P99",
    ]  # fmt: skip
    # The slowest stage first: the reader's device, then the writer's data; the other
    # subsystem's host, with nothing, last.
    assert [line.split() for line in lines] == [
        [SUB, READER, "9.90us", "9.90us", "9.90us", "99.5us", "9.90us"],
        [SUB, WRITER, "9.90us", "24.9us", "9.90us", "9.90us", "9.90us"],
        [OTHER_SUB, READER, "-", "-", "-", "-", "-"],
    ]


async def test_plain_tables_need_no_rich(tmp_path: Path) -> None:
    # The guests' Debian Python has no rich: the plain tables must not import it.
    async with stand_in(tmp_path) as server:
        status, out, err = await _top(
            *("--server", server.path, "--once", "--interval", "0.01"),
            prelude="sys.modules['rich'] = None",
        )
    assert status == 0, err
    assert len(_table(out)) == 2


async def test_a_target_without_the_method_is_one_line_and_status_1(tmp_path: Path) -> None:
    async with stand_in(tmp_path, has_method=False) as server:
        status, out, err = await _top("--server", server.path, "--once")
    assert (status, out) == (1, "")
    assert err == f"pynvmf top: {server.path}: the target has no pynvmf_get_host_stats\n"
    status, out, err = await _top("--server", str(tmp_path / "nothing.sock"), "--once")
    assert status == 1 and "cannot connect" in err


class Terminal:
    """A process on a pseudo-terminal: what it has shown, and keys typed to it."""

    def __init__(self, args: list[str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, its stdin and stdout the terminal
            os.environ["COLUMNS"], os.environ["LINES"] = "200", "40"
            os.execv(sys.executable, [sys.executable, "-m", "pynvmf", *args])
        self.shown = ""

    def frame(self, caption: str, holding: tuple[str, ...], timeout: float = 30) -> str:
        """The first frame (the table from its title to its caption) with `caption` that
        shows every text of `holding`, once drawn."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            while (end := self.shown.find(caption, seen)) >= 0:
                start = self.shown.rfind("pynvmf top:", 0, end)
                frame = self.shown[start:end]
                if start >= 0 and all(text in frame for text in holding):
                    return frame
                seen = end + 1
            left = deadline - time.monotonic()
            assert left > 0, f"no frame {caption!r} with {holding} in {timeout} s: {self.shown!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                self.shown += os.read(self.fd, 65536).decode(errors="replace")

    def type(self, key: str) -> None:
        os.write(self.fd, key.encode())

    def exit_status(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.read(self.fd, 65536)  # drain, so the child never blocks on a full terminal
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            select.select([self.fd], [], [], 0.1)
        raise AssertionError("pynvmf top did not exit on q")


@contextlib.contextmanager
def _terminal(args: list[str]) -> Iterator[Terminal]:
    term = Terminal(args)
    try:
        yield term
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(term.pid, 9)
            os.waitpid(term.pid, 0)


async def test_live_view_shows_rows_sorts_on_a_key_and_quits_on_q(tmp_path: Path) -> None:
    # A host whose NQN is rich markup and an escape sequence: shown as text, made printable.
    hostile = "nqn.2014-08.org.evil:[/][bold]x\x1b[2J"
    async with stand_in(tmp_path, extra_host=hostile) as server:
        # The terminal is read with blocking calls: in a thread, while this loop serves.
        def use() -> int:
            with _terminal(["top", "--server", server.path, "--interval", "0.05"]) as term:
                frame = term.frame("sorted by iops", (READER, WRITER, "evil:[/][bold]x?[2J"))
                # By IOPS, the reader (1000/s) above the writer (10/s).
                assert frame.index(READER) < frame.index(WRITER)
                term.type("e")
                frame = term.frame("sorted by errors", (READER, WRITER))
                # By errors a second, the writer (1/s) above the reader (none).
                assert frame.index(WRITER) < frame.index(READER)
                term.type("t")
                frame = term.frame("sorted by the slowest stage", ("DEVICE P99", "99.5us"))
                assert frame.index(READER) < frame.index(WRITER)
                term.type("q")
                return term.exit_status()

        assert await asyncio.to_thread(use) == 0


# -- end to end: pynvmf target and pynvmf_get_host_stats ----------------------------------


def _host_stats(rpc: RpcClient) -> Snapshot:
    return snapshot(rpc.call("pynvmf_get_host_stats"))


async def _reads(proc: TargetProcess, count: int | None, stop: asyncio.Event | None = None) -> int:
    """`count` reads of 4 KiB by READER (None: until `stop` is set); how many it did."""
    done = 0
    async with await connect(proc.address, proc.port, SUB, hostnqn=READER) as ctrl:
        ns = ctrl.namespace(1)
        while (count is None or done < count) and not (stop is not None and stop.is_set()):
            await ns.read(done % 64 * 8, memoryview(bytearray(4096)))
            done += 1
    return done


async def _writes_and_errors(proc: TargetProcess, writes: int, errors: int) -> None:
    async with await connect(proc.address, proc.port, SUB, hostnqn=WRITER) as ctrl:
        ns = ctrl.namespace(1)
        for i in range(writes):
            await ns.write(i * 8, bytes(4096))
        for _ in range(errors):
            with pytest.raises(NvmeStatusError):  # past the end of the namespace (2048 blocks)
                await ctrl.io_command(IoOpcode.READ, 1, 2048, 0, 0, into=memoryview(bytearray(512)))


@contextlib.contextmanager
def _target(tmp_path: Path, cores: int) -> Iterator[tuple[TargetProcess, str]]:
    socket_path = str(tmp_path / "rpc.sock")
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "subsystems": [{"nqn": SUB, "namespaces": [{"nsid": 1, "memory": 1 << 20}]}],
    }
    proc = TargetProcess(
        config,
        tmp_path,
        [
            *("--discovery-port", "0", "--rpc-socket", socket_path, "--cores", str(cores)),
            "--latency-tracking",
        ],
    )
    proc.start()
    try:
        yield proc, socket_path
    finally:
        proc.stop()


def _commands(stats: Snapshot) -> dict[str, int]:
    return {host: totals.commands for (_sub, host, _ns), totals in stats.namespaces.items()}


@pytest.mark.parametrize("cores", [1, 2])
async def test_end_to_end_rates_match_a_known_workload(tmp_path: Path, cores: int) -> None:
    with _target(tmp_path, cores) as (proc, socket_path), RpcClient(socket_path) as rpc:
        earlier = _host_stats(rpc)
        await _reads(proc, 200)
        await _writes_and_errors(proc, 100, 3)
        # With --cores 2 the workers report their counts every half second at most: ask
        # until both hosts' are in (a deadline, not a guess).
        async with asyncio.timeout(30):
            while _commands(later := _host_stats(rpc)) != {READER: 200, WRITER: 103}:
                await asyncio.sleep(0.05)
    elapsed = later.seconds - earlier.seconds
    by_host = {(r.subsystem, r.host, r.nsid): r for r in rows(earlier, later)}
    reader = by_host[SUB, READER, 1]
    writer = by_host[SUB, WRITER, 1]
    assert round(reader.iops * elapsed) == 200
    assert round(reader.read_mbs * 1e6 * elapsed) == 200 * 4096
    assert reader.write_mbs == 0 and reader.errors == 0
    assert round(writer.iops * elapsed) == 103
    assert round(writer.write_mbs * 1e6 * elapsed) == 100 * 4096
    assert round(writer.errors * elapsed) == 3
    assert later.latency_tracking
    for row in (reader, writer):
        assert row.p50 is not None and row.p99 is not None
        assert 0 < row.p50 <= row.p99
    # Each host's commands passed through the stages: some stage has a p99.
    stages = {line[1]: line[2:] for line in view(earlier, later, "host", True).lines}
    for host in (READER, WRITER):
        assert any(cell != "-" for cell in stages[host]), stages


async def test_end_to_end_once_shows_the_busy_host_first(tmp_path: Path) -> None:
    # One process: the counts are the main process's as commands complete (workers would
    # report theirs every half second, a lag as long as the interval).
    with _target(tmp_path, 1) as (proc, socket_path):
        with RpcClient(socket_path) as rpc:
            _host_stats(rpc)
        await _writes_and_errors(proc, 10, 0)
        stop = asyncio.Event()
        reading = asyncio.create_task(_reads(proc, None, stop))
        try:
            status, out, err = await _top("--server", socket_path, "--once", "--interval", "0.5")
        finally:
            stop.set()
        assert await reading > 0
    assert status == 0, err
    first, second = _table(out)
    assert first[:3] == [SUB, READER, "1"]
    assert int(first[3].replace(",", "")) > 0 and float(first[4]) > 0
    assert second[:4] == [SUB, WRITER, "1", "0"]
    # Latency tracked: the reader's p50 and p99 have units.
    assert all(cell.endswith(("us", "ms", "s")) for cell in first[6:8]), first
