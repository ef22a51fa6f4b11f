"""`pynvmf target --metrics-listen` as a user runs it: scraped over HTTP after a known
workload (with worker processes too), a port it cannot have, the configuration file's
metrics.listen, and the RPC that moves the endpoint."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import connect
from pynvmf.rpc.client import RpcClient, RpcClientError
from tests.support.ports import free_tcp_port
from tests.support.scrape import Samples, scrape, value
from tests.support.target_process import TargetProcess

HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000c1"
_METRICS = re.compile(r"metrics http://([\d.]+):(\d+)/metrics")


def _metrics_address(proc: TargetProcess) -> tuple[str, int]:
    for line in proc.stdout_lines:
        if found := _METRICS.match(line):
            return found.group(1), int(found.group(2))
    raise AssertionError(f"no metrics line in the banner: {proc.stdout_lines}")


async def _workload(
    proc: TargetProcess, metrics: tuple[str, int], writes: int, reads: int
) -> Samples:
    """Writes and reads on two I/O queues; what a scrape says while they are connected."""
    async with await connect(proc.address, proc.port, DEFAULT_NQN, hostnqn=HOST, queues=2) as c:
        ns = c.namespace(1)
        for i in range(writes):
            await ns.write(i * 8, bytes(4096))
        for _ in range(reads):
            await ns.read(0, memoryview(bytearray(512)))
        return await scrape(*metrics)


async def _scrape_until(address: tuple[str, int], want: dict[str, float]) -> Samples:
    """Scrape until the subsystem's command counts by opcode are `want`: each worker
    reports its counts to the main process every half second at most. On the way, no
    count goes backwards. Fails past a deadline."""
    seen = dict.fromkeys(want, 0.0)
    async with asyncio.timeout(30):
        while True:
            m = await scrape(*address)
            for opcode in want:
                n = value(
                    m, "pynvmf_subsystem_commands_total", subsystem=DEFAULT_NQN, opcode=opcode
                )
                assert n is not None and n >= seen[opcode]
                seen[opcode] = n
            if seen == want:
                return m
            await asyncio.sleep(0.05)


def test_a_scrape_after_a_workload_on_worker_processes_matches_it(tmp_path: Path) -> None:
    proc = TargetProcess(
        None,
        tmp_path,
        [
            *("--listen", "127.0.0.1:0", "--discovery-port", "0", "--cores", "2"),
            *("--metrics-listen", "127.0.0.1:0"),
        ],
    )
    proc.start()
    try:
        address = _metrics_address(proc)
        connected = asyncio.run(_workload(proc, address, writes=7, reads=5))
        m = asyncio.run(_scrape_until(address, {"read": 5, "write": 7}))
    finally:
        proc.stop()
    assert value(m, "pynvmf_subsystem_bytes_total", subsystem=DEFAULT_NQN, direction="write") == (
        7 * 4096
    )
    assert value(m, "pynvmf_subsystem_bytes_total", subsystem=DEFAULT_NQN, direction="read") == (
        5 * 512
    )
    assert value(m, "pynvmf_queues_created_total", type="io") == 2
    # The I/O queues served by the workers count among the host's connections.
    where = f"{proc.address}:{proc.port}"
    assert value(connected, "pynvmf_connections", port=where, host=HOST) == 3
    assert value(connected, "pynvmf_tcp_connections") == 3


def test_a_metrics_port_in_use_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        nvme_port = free_tcp_port()
        result = subprocess.run(
            [
                *(sys.executable, "-m", "pynvmf", "target", "--listen", f"127.0.0.1:{nvme_port}"),
                *("--discovery-port", "0", "--metrics-listen", f"127.0.0.1:{port}"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"pynvmf target: metrics endpoint 127.0.0.1:{port}: Address already in use"
    )
    assert "ready" not in result.stdout and "listening" not in result.stdout


def test_the_configuration_file_names_the_endpoint_and_the_rpc_moves_it(
    tmp_path: Path,
) -> None:
    port = free_tcp_port()
    socket_path = str(tmp_path / "rpc.sock")
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "subsystems": [{"nqn": DEFAULT_NQN, "namespaces": [{"nsid": 1, "memory": 1 << 20}]}],
        "metrics": {"listen": f"127.0.0.1:{port}"},
    }
    proc = TargetProcess(config, tmp_path, ["--rpc-socket", socket_path])
    proc.start()
    try:
        assert _metrics_address(proc) == ("127.0.0.1", port)

        with RpcClient(socket_path) as rpc:
            assert rpc.call("pynvmf_metrics_get_listen") == {"address": "127.0.0.1", "port": port}
            moved = rpc.call("pynvmf_metrics_listen", address="127.0.0.1", port=0)
            assert moved["port"] not in (0, port)
            m = asyncio.run(scrape("127.0.0.1", moved["port"]))
            assert value(m, "pynvmf_namespaces", subsystem=DEFAULT_NQN) == 1
            # The old port was given back: nothing answers there any more.
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
            with pytest.raises(RpcClientError, match=r"address: .*in use"):
                rpc.call("pynvmf_metrics_listen", address="127.0.0.1", port=proc.port)
            assert rpc.call("pynvmf_metrics_get_listen")["port"] == moved["port"]
            assert rpc.call("pynvmf_metrics_stop") is True
            assert rpc.call("pynvmf_metrics_get_listen") is None
    finally:
        proc.stop()
