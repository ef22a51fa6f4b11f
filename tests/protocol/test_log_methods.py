"""SPDK's log methods on `pynvmf target --cores 2`: what the RPC changes, the worker
processes log by the time it answers (their records about the I/O queues they serve
appear, or stop, as the main process's do)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import connect
from pynvmf.rpc.client import RpcClient
from tests.support.target_process import TargetProcess

pytestmark = pytest.mark.timeout(120)

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6c1b3f1e-0b8e-4c5a-9d5e-3f1c2a7b9e11"
# A worker's record of an I/O queue's end (JSON: the worker's index after the message).
WORKER_CLOSED = r'"message": "connection closed: [^"]*qid=[12] [^"]*", "worker": \d'


def _worker_closes(proc: TargetProcess) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in proc.stderr().splitlines()]
    return [
        r
        for r in records
        if "worker" in r and r["message"].startswith("connection closed: ") and r.get("qid")
    ]


def test_log_level_and_flag_reach_the_worker_processes(tmp_path: Path) -> None:
    socket_path = str(tmp_path / "rpc.sock")
    proc = TargetProcess(
        None,
        tmp_path,
        [
            *("--listen", "127.0.0.1:0", "--discovery-port", "0", "--rpc-socket", socket_path),
            *("--allow-host", HOSTNQN, "--cores", "2", "--log-format", "json"),
        ],
        verbose=False,  # WARNING: an I/O queue's end (INFO) is not logged
    )

    def rpc(method: str, **params: Any) -> Any:
        with RpcClient(socket_path) as client:
            return client.call(method, params)

    async def use_and_close() -> None:
        async with await connect(
            proc.address, proc.port, DEFAULT_NQN, hostnqn=HOSTNQN, queues=2
        ) as ctrl:
            await ctrl.namespace(1).read(0, memoryview(bytearray(4096)))
        # The workers log a queue's end before they tell the main process it is gone: once
        # no queue is left, each end was logged (or not) at the level in force, and a
        # change of level that follows cannot decide it instead.
        deadline = time.monotonic() + 30
        while rpc("nvmf_subsystem_get_qpairs", nqn=DEFAULT_NQN):
            assert time.monotonic() < deadline, "the queues never went"
            await asyncio.sleep(0.05)  # the next poll of the condition above

    proc.start()
    try:
        asyncio.run(use_and_close())
        assert rpc("log_set_level", level="INFO") is True
        asyncio.run(use_and_close())
        # Both I/O queues' ends, logged in the workers that served them.
        proc.wait_log(WORKER_CLOSED, 2)
        # The level back, and the flag of the part that logs it (nvmf: pynvmf.target).
        assert rpc("log_set_level", level="WARNING") is True
        assert rpc("log_set_flag", flag="nvmf") is True
        assert rpc("log_get_flags")["nvmf"] is True
        asyncio.run(use_and_close())
        proc.wait_log(WORKER_CLOSED, 4)
    finally:
        proc.stop()
    closes = _worker_closes(proc)
    assert len(closes) == 4
    assert {r["worker"] for r in closes} <= {0, 1}
