"""`pynvmf target --metrics-listen` as a user runs it: scraped over HTTP after a known
workload (with worker processes too), a port it cannot have, the configuration file's
metrics.listen, and the RPC that moves the endpoint."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import connect
from pynvmf.host.errors import NvmeStatusError
from pynvmf.rpc.client import RpcClient, RpcClientError
from pynvmf.spec import command as C
from pynvmf.spec.opcodes import IoOpcode
from tests.support.ports import free_tcp_port
from tests.support.raw import RawQueue
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


def test_a_saved_configuration_restores_the_endpoint(tmp_path: Path) -> None:
    # Set over the RPC (not by the file or an option), saved, and the target started again
    # from what was saved: it serves its metrics where the first one did.
    socket_path = str(tmp_path / "rpc.sock")
    saved_path = tmp_path / "saved.json"
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "subsystems": [{"nqn": DEFAULT_NQN, "namespaces": [{"nsid": 1, "memory": 1 << 20}]}],
    }
    first = TargetProcess(config, tmp_path, ["--rpc-socket", socket_path])
    first.start()
    try:
        with RpcClient(socket_path) as rpc:
            where = rpc.call("pynvmf_metrics_listen", address="127.0.0.1", port=0)
            assert rpc.call("pynvmf_save_config", path=str(saved_path)) is True
    finally:
        first.stop()
    saved = json.loads(saved_path.read_text())
    assert saved["metrics"] == {"listen": f"127.0.0.1:{where['port']}"}
    again_dir = tmp_path / "again"
    again_dir.mkdir()
    again = TargetProcess(saved, again_dir)
    again.start()
    try:
        assert _metrics_address(again) == ("127.0.0.1", where["port"])
        m = asyncio.run(scrape("127.0.0.1", where["port"]))
        assert value(m, "pynvmf_namespaces", subsystem=DEFAULT_NQN) == 1
    finally:
        again.stop()


HOST_2 = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000c2"
_COMMAND_FAMILIES = (
    "pynvmf_commands_total",
    "pynvmf_command_bytes_total",
    "pynvmf_command_errors_total",
)
Want = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _want(host: str, nsid: int, n: float, name: str = "commands", **labels: str) -> Want:
    key = {"subsystem": DEFAULT_NQN, "nsid": str(nsid), "host": host, **labels}
    return {(f"pynvmf_{name}_total", frozenset(key.items())): n}


async def _scrape_commands_until(address: tuple[str, int], want: Want) -> None:
    """Scrape until the per-command series are exactly `want` (the workers report every
    half second at most); on the way, no series goes backwards. Fails past a deadline."""
    seen: Want = {}
    async with asyncio.timeout(30):
        while True:
            m = await scrape(*address)
            now = {key: n for key, n in m.items() if key[0] in _COMMAND_FAMILIES}
            for key, n in seen.items():
                assert now.get(key, 0) >= n, key
            seen = now
            if now == want:
                return
            await asyncio.sleep(0.05)


async def _two_hosts(proc: TargetProcess) -> None:
    a = await connect(proc.address, proc.port, DEFAULT_NQN, hostnqn=HOST, queues=2)
    b = await connect(proc.address, proc.port, DEFAULT_NQN, hostnqn=HOST_2, queues=2)
    try:
        for i in range(6):
            await a.namespace(1).write(i * 8, bytes(4096))
        for _ in range(4):
            await a.namespace(2).read(0, memoryview(bytearray(4096)))
        for _ in range(3):
            await b.namespace(2).read(8, memoryview(bytearray(512)))
        await b.namespace(1).flush()
        with pytest.raises(NvmeStatusError):  # past the end of namespace 1
            await b.io_command(IoOpcode.READ, 1, 2048, 0, 0, into=memoryview(bytearray(512)))
    finally:
        await a.close()
        await b.close()


async def _one_write(proc: TargetProcess) -> None:
    async with await connect(proc.address, proc.port, DEFAULT_NQN, hostnqn=HOST) as a:
        await a.namespace(1).write(0, bytes(512))


def test_command_counts_of_two_hosts_on_worker_processes_are_exact_and_survive_the_subsystem(
    tmp_path: Path,
) -> None:
    socket_path = str(tmp_path / "rpc.sock")
    memory = {"memory": 1 << 20}
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "subsystems": [
            {"nqn": DEFAULT_NQN, "namespaces": [{"nsid": 1, **memory}, {"nsid": 2, **memory}]}
        ],
        "metrics": {"listen": "127.0.0.1:0"},
    }
    proc = TargetProcess(
        config, tmp_path, ["--cores", "2", "--rpc-socket", socket_path, "--latency-tracking"]
    )
    proc.start()
    try:
        address = _metrics_address(proc)
        asyncio.run(_two_hosts(proc))
        want = {
            **_want(HOST, 1, 6, opcode="write"),
            **_want(HOST, 2, 4, opcode="read"),
            **_want(HOST_2, 2, 3, opcode="read"),
            **_want(HOST_2, 1, 1, opcode="flush"),
            **_want(HOST_2, 1, 1, opcode="read"),
            **_want(HOST, 1, 6 * 4096, "command_bytes", direction="write"),
            **_want(HOST, 2, 4 * 4096, "command_bytes", direction="read"),
            **_want(HOST_2, 2, 3 * 512, "command_bytes", direction="read"),
            **_want(HOST_2, 1, 1, "command_errors", opcode="read", status="lba_out_of_range"),
        }
        asyncio.run(_scrape_commands_until(address, want))
        with RpcClient(socket_path) as rpc:
            stats = rpc.call("pynvmf_get_host_stats")
        # The workers' latency histograms came with their counts: one sample a command.
        assert stats["latency_tracking"] is True
        timed = {
            (h["host"], ns["nsid"]): {op: hist["count"] for op, hist in ns["latency"].items()}
            for h in stats["hosts"]
            for ns in h["namespaces"]
        }
        assert timed == {
            (HOST, 1): {"write": 6},
            (HOST, 2): {"read": 4},
            (HOST_2, 1): {"flush": 1, "read": 1},
            (HOST_2, 2): {"read": 3},
        }
        stages = {h["host"]: h["stages"]["device"]["count"] for h in stats["hosts"]}
        assert stages == {HOST: 10, HOST_2: 5}
        # The subsystem deleted and created again: its hosts' counts go on from where
        # they were.
        with RpcClient(socket_path) as rpc:
            assert rpc.call("nvmf_delete_subsystem", nqn=DEFAULT_NQN) is True
            rpc.call("nvmf_create_subsystem", nqn=DEFAULT_NQN, allow_any_host=True)
            rpc.call("bdev_malloc_create", name="Again", num_blocks=2048, block_size=512)
            rpc.call(
                "nvmf_subsystem_add_ns",
                nqn=DEFAULT_NQN,
                namespace={"bdev_name": "Again", "nsid": 1},
            )
        asyncio.run(_one_write(proc))
        want.update(_want(HOST, 1, 7, opcode="write"))
        want.update(_want(HOST, 1, 6 * 4096 + 512, "command_bytes", direction="write"))
        asyncio.run(_scrape_commands_until(address, want))
    finally:
        proc.stop()


async def _in_flight_until(address: tuple[str, int], want: float) -> None:
    """Scrape until the subsystem's commands in flight are `want` (a worker's come with
    its report, every half second at most). Fails past a deadline."""
    async with asyncio.timeout(30):
        while (
            value(await scrape(*address), "pynvmf_commands_in_flight", subsystem=DEFAULT_NQN)
            != want
        ):
            await asyncio.sleep(0.05)


def _fused(opcode: int, cid: int, fuse: int) -> bytes:
    return C.build_sqe(
        opcode, cid, 1, cdw10=8, sgl_type=C.SGL_DATA_BLOCK_OFFSET, sgl_length=512,
        flags=0x40 | fuse,
    )  # fmt: skip


def test_a_command_held_on_a_worker_is_in_flight_until_it_completes(tmp_path: Path) -> None:
    """The first of a fused pair waits on its worker for the second: the worker's report
    says it is in flight, and its next one that it is not any more."""
    config = {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "subsystems": [{"nqn": DEFAULT_NQN, "namespaces": [{"nsid": 1, "memory": 1 << 20}]}],
        "metrics": {"listen": "127.0.0.1:0"},
    }
    proc = TargetProcess(config, tmp_path, ["--cores", "2"])
    proc.start()

    async def run(address: tuple[str, int]) -> None:
        admin = await RawQueue.open(proc.address, proc.port)
        io = await RawQueue.open(proc.address, proc.port)
        try:
            assert (await admin.connect(DEFAULT_NQN, hostnqn=HOST)).status == 0
            await admin.enable()
            done = await io.connect(DEFAULT_NQN, hostnqn=HOST, qid=1, cntlid=admin.cntlid)
            assert done.status == 0
            first = io.submit_nowait(_fused(IoOpcode.COMPARE, 1, 1), bytes(512))
            await _in_flight_until(address, 1)
            second = io.submit_nowait(_fused(IoOpcode.WRITE, 2, 2), bytes(512))
            assert (await first).status == 0 and (await second).status == 0
            await _in_flight_until(address, 0)
        finally:
            await io.close()
            await admin.close()

    try:
        asyncio.run(run(_metrics_address(proc)))
    finally:
        proc.stop()
