"""`pynvmf target --log-format json`, as a log collector reads it: every line of stderr
one JSON object, and the records about a connection carry its peer, local port, host,
subsystem and queue, in the main process and in the worker processes of --cores."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import connect
from pynvmf.host.errors import NvmeConnectRejected
from tests.support.target_process import TargetProcess

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6c1b3f1e-0b8e-4c5a-9d5e-3f1c2a7b9e10"
# Refused (not in --allow-host), and made to break a line-oriented log: quotes, a
# backslash, a newline, an escape sequence, a line separator.
HOSTILE_NQN = 'nqn.2014-08.org.evil:"},\n{"level": "CRITICAL"}\\\x1b[2J\u2028'
PEER = re.compile(r"127\.0\.0\.1:\d+")


def _records(proc: TargetProcess) -> list[dict[str, Any]]:
    lines = proc.stderr().splitlines()
    assert lines
    return [json.loads(line) for line in lines]  # each line, or the test fails here


@pytest.mark.parametrize("cores", [1, 2])
def test_connection_records_carry_the_connection_host_subsystem_and_queue(
    tmp_path: Path, cores: int
) -> None:
    proc = TargetProcess(
        None,
        tmp_path,
        [
            *("--listen", "127.0.0.1:0", "--discovery-port", "0"),
            *("--allow-host", HOSTNQN, "--cores", str(cores), "--log-format", "json"),
        ],
    )
    proc.start()
    try:

        async def use_and_close() -> None:
            async with await connect(
                proc.address, proc.port, DEFAULT_NQN, hostnqn=HOSTNQN, queues=2
            ) as ctrl:
                await ctrl.namespace(1).read(0, memoryview(bytearray(4096)))
            with pytest.raises(NvmeConnectRejected):
                await connect(proc.address, proc.port, DEFAULT_NQN, hostnqn=HOSTILE_NQN)

        asyncio.run(use_and_close())
        # The end of each connection: the admin queue's, both I/O queues' (in the
        # workers, with --cores 2), the refused host's.
        proc.wait_log(r"connection closed: [^\"]* reason=(?!handed to worker)", 4)
        proc.wait_log(r"is not allowed on", 1)
    finally:
        proc.stop()
    records = _records(proc)
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
        assert record["time"].endswith("Z")

    def about(qid: int, message: str, but: str = "") -> dict[str, Any]:
        found = [
            r
            for r in records
            if r.get("qid") == qid and message in r["message"] and not (but and but in r["message"])
        ]
        assert len(found) == 1, (message, qid, records)
        return found[0]

    for qid in (0, 1, 2):
        connected = about(qid, f"queue {qid} of controller")
        # The host closes its queues at once: an I/O queue's may end by the host or as its
        # controller goes with the admin queue.
        closed = about(qid, "connection closed: ", but="handed to worker")
        for record in (connected, closed):
            assert record["host"] == HOSTNQN
            assert record["subsystem"] == DEFAULT_NQN
            assert record["local_port"] == proc.port
            assert PEER.fullmatch(record["peer"])
            assert record["cntlid"] == connected["cntlid"]
        assert closed["peer"] == connected["peer"]  # the same connection, at both ends
        # With workers, an I/O queue's connection ends in the worker that served it.
        assert ("worker" in closed) == (cores > 1 and qid > 0)
        assert "worker" not in connected  # Connect is validated in the main process
    destroyed = next(r for r in records if "destroyed" in r["message"])
    assert (destroyed["host"], destroyed["subsystem"]) == (HOSTNQN, DEFAULT_NQN)
    (refused,) = [r for r in records if "is not allowed on" in r["message"]]
    assert refused["host"] == HOSTILE_NQN  # escaped on the way out, intact on the way in
    assert refused["subsystem"] == DEFAULT_NQN and refused["level"] == "INFO"
    assert "qid" not in refused  # the queue was never bound
