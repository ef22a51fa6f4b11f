"""`pynvmf target` as a user runs it: the banner, options, shutdown, and errors."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pynvmf import __version__
from pynvmf.compiled import build_description
from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import connect
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess


def test_banner_prints_the_commands_a_linux_host_types(tmp_path: Path) -> None:
    io_port, disc_port = free_tcp_port(), free_tcp_port()
    proc = TargetProcess(
        None, tmp_path, ["--listen", f"127.0.0.1:{io_port}", "--discovery-port", str(disc_port)]
    )
    proc.start()
    try:
        out = proc.wait_stdout(f"-n {DEFAULT_NQN}\n")
        assert out.startswith(f"build pynvmf {__version__}: {build_description()}\n"), out
        assert f"listening nvme 127.0.0.1:{io_port}" in out
        assert f"listening discovery 127.0.0.1:{disc_port}" in out
        assert f"nvme discover -t tcp -a 127.0.0.1 -s {disc_port}\n" in out
        assert f"nvme connect -t tcp -a 127.0.0.1 -s {io_port} -n {DEFAULT_NQN}\n" in out
    finally:
        proc.stop(sig=signal.SIGINT)


def test_the_banner_names_the_port_0_bound_and_the_log_follows(tmp_path: Path) -> None:
    # What tests.support.target_process relies on: the banner's "listening" lines name the
    # port bound (one the kernel chose for port 0), and the log tells of each connection.
    proc = TargetProcess(None, tmp_path, ["--listen", "127.0.0.1:0", "--discovery-port", "0"])
    proc.start()
    try:
        assert proc.address == "127.0.0.1" and proc.port > 0
        assert [listener.kind for listener in proc.listeners] == ["nvme"]

        async def connect_and_close() -> None:
            async with await connect(proc.address, proc.port, DEFAULT_NQN):
                pass

        asyncio.run(connect_and_close())
        closed = proc.wait_log(r"qid=0 .* reason=(host closed)", 1, timeout=30)
        assert closed == ["host closed"]
    finally:
        status = proc.stop(sig=signal.SIGKILL, expect=None)
    assert status == -signal.SIGKILL
    with pytest.raises(AssertionError, match=r"(?s)exited with -9, not 0:\n.*qid=0 "):
        proc.stop()  # a target that did not stop cleanly fails with its log


def test_file_namespace_data_is_flushed_on_sigterm(tmp_path: Path) -> None:
    backing = tmp_path / "disk.img"
    backing.write_bytes(bytes(4 << 20))
    io_port = free_tcp_port()
    proc = TargetProcess(
        None,
        tmp_path,
        [
            "--listen",
            f"127.0.0.1:{io_port}",
            "--discovery-port",
            "0",
            "--file",
            str(backing),
            "--block-size",
            "4096",
        ],
    )
    proc.start()
    pattern = bytes(range(256)) * 64  # 16 KiB

    async def write() -> None:
        async with await connect("127.0.0.1", io_port, DEFAULT_NQN) as ctrl:
            ns = ctrl.namespace(1)
            assert ns.capabilities.block_size == 4096
            await ns.write(10, pattern)  # no FUA, no flush: only the shutdown makes it durable

    asyncio.run(write())
    proc.stop()
    with backing.open("rb") as f:
        f.seek(10 * 4096)
        assert f.read(len(pattern)) == pattern


def test_bad_configuration_exits_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"ports": []}')
    result = subprocess.run(
        [sys.executable, "-m", "pynvmf", "target", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "no ports" in result.stderr


def test_port_in_use_exits_with_a_message(tmp_path: Path) -> None:
    io_port = free_tcp_port()
    first = TargetProcess(
        None, tmp_path, ["--listen", f"127.0.0.1:{io_port}", "--discovery-port", "0"]
    )
    first.start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pynvmf",
                "target",
                "--listen",
                f"127.0.0.1:{io_port}",
                "--discovery-port",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert "address already in use" in result.stderr.lower()
    finally:
        first.stop()
