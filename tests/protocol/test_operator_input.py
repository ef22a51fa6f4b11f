"""`pynvmf target` checks what its operator types as it checks what hosts send: every bad
address, port, size, NQN or file is refused before anything listens, with a message that
names it, and exit status 2 (issue 14: `--listen 127.0.0.1:99999` used to listen on 34463)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_tcp_port


def run_target(*args: str) -> subprocess.CompletedProcess[str]:
    # No discovery port unless the case is about it (an option given twice is refused).
    quiet = [] if "--discovery-port" in args else ["--discovery-port", "0"]
    return subprocess.run(
        [sys.executable, "-m", "pynvmf", "target", *quiet, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "127.0.0.1:99999"], "'99999' is not a TCP port"),
        (["--listen", "127.0.0.1:4420x"], "'4420x' is not a TCP port"),
        (["--listen", "1.2.3:4420"], "'1.2.3' is not an IP address"),
        (["--listen", "localhost:4420"], "'localhost' is not an IP address"),
        (["--listen", "::1:4420"], "IPv6 addresses need brackets"),
        (["--rpc-listen", "1.2.3:99"], "--rpc-listen: '1.2.3:99': '1.2.3' is not an IP address"),
        (["--rpc-listen", "127.0.0.1:65536"], "--rpc-listen: '127.0.0.1:65536': '65536'"),
        (["--discovery-port", "70000"], "70000 is not a TCP port"),
        (["--memory", "0"], "size 0 is not a positive multiple of the block size 512"),
        (["--memory", "1Q"], "not a size: '1Q'"),
        (["--memory", "1000T"], "cannot reserve 1099511627776000 bytes of memory"),
        (["--block-size", "4096", "--memory", "513"], "size 513 is not a positive multiple"),
        (["--block-size", "1024"], "invalid choice: 1024"),
        (["--file", "/nonexistent/disk.img"], "/nonexistent/disk.img: No such file or directory"),
        (["--file", "/"], "/ is neither a regular file nor a block device"),
        (["--nqn", "a b"], "is not a valid NQN: contains a space"),
        (["--nqn", "nqn.2014-08.org.nvmexpress.discovery"], "the discovery subsystem's NQN"),
        (["--allow-host", "nqn.2014-08.org.nvmexpress:uuid:zzz"], "'zzz' is not a UUID"),
        (["--inline-data-size", "3"], "3 is not a multiple of 16 between 0 and 1 MiB"),
        (["--max-connections", "0"], "must be 1 or more, not 0"),
        (["--max-connections", "abc"], "'abc' is not an integer"),
        (["--max-memory", "1K"], "1K is less than 1 MiB"),
        (
            ["--max-memory", "2M", "--max-connection-data", "32M"],
            "--max-connection-data 33554432 is more than --max-memory 2097152",
        ),
        (["--config", "/nonexistent.json"], "/nonexistent.json: No such file or directory"),
        (["--json", "/nonexistent.json"], "/nonexistent.json: No such file or directory"),
        (
            ["--listen", "127.0.0.1:0", "--rpc-socket", "/nonexistent/dir/rpc.sock"],
            "--rpc-socket /nonexistent/dir/rpc.sock: No such file or directory",
        ),
    ],
)
def test_bad_operator_input_is_refused_naming_it(args: list[str], message: str) -> None:
    result = run_target(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "ready" not in result.stdout
    assert "Traceback" not in result.stderr


def test_bad_config_files_are_refused_naming_the_key(tmp_path: Path) -> None:
    cases = {
        "binary": (bytes(range(256)), "codec can't decode"),
        "unknown-key": (
            b'{"subsystems": [{"nqn": "nqn.2024-01.io.x:a", "namespaces": [{"memory": "1M"}],'
            b' "typo_hosts": []}], "ports": [{"address": "127.0.0.1", "port": 0}]}',
            "subsystems[0].typo_hosts: unknown key",
        ),
        "port-wraps": (
            b'{"subsystems": [{"nqn": "nqn.2024-01.io.x:a", "namespaces": [{"memory": "1M"}]}],'
            b' "ports": [{"address": "127.0.0.1", "port": 99999}]}',
            "ports[0].port: 99999 is not a TCP port",
        ),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(content)
        result = run_target("--config", str(path))
        assert result.returncode == 2, (name, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_second_listener_that_cannot_bind_stops_the_whole_target() -> None:
    free = free_tcp_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = run_target("--listen", f"127.0.0.1:{free}", "--listen", f"127.0.0.1:{taken}")
    assert result.returncode == 2
    assert f"127.0.0.1:{taken}" in result.stderr and "address already in use" in result.stderr
    assert "ready" not in result.stdout
    # Nothing was left listening on the first address.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", free)) != 0
