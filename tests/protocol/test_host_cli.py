"""The nvme-cli style host commands (pynvmf.cli.host) against an in-process target.

The target runs on its own event loop in a background thread, so each command can
run exactly as the CLI runs it: parse the arguments, then `run_host_command`, which
starts and ends its own event loop in the test's thread.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.cli import build_parser
from pynvmf.cli.host import run_host_command
from pynvmf.host.controller import DEFAULT_MAX_TRANSFER
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

NQN = "nqn.2024-01.org.pynvmf:host-cli"
PRIVATE_NQN = "nqn.2024-01.org.pynvmf:host-cli-private"
ALLOWED_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:7c6b1c1e-0000-4000-8000-00000000c11a"
MiB = 1024 * 1024
NS1_SIZE, NS1_BLOCK = 32 * MiB, 512
NS2_SIZE, NS2_BLOCK = 8 * MiB, 4096


class BackgroundTarget:
    """A started Target on an event loop of its own, in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.target: Target = self.call(self._start())
        self.port = self.target.ports[0].port

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> Target:
        # Built on the target's loop: nothing of it should belong to the test's thread.
        public = Subsystem(NQN)
        for nsid, size, block in ((1, NS1_SIZE, NS1_BLOCK), (2, NS2_SIZE, NS2_BLOCK)):
            device = MemoryDevice(size, block)
            public.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
        private = Subsystem(PRIVATE_NQN, allow_any_host=False, allowed_hosts={ALLOWED_HOSTNQN})
        private.add_namespace(
            Namespace.create(PRIVATE_NQN, 1, MemoryDevice(MiB, 512), "memory:private")
        )
        target = Target([public, private], [Port("127.0.0.1", 0)])
        await target.start()
        return target

    def stop(self) -> None:
        try:
            self.call(self.target.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()


@pytest.fixture
def target() -> Iterator[BackgroundTarget]:
    started = BackgroundTarget()
    yield started
    started.stop()


def run(*argv: str) -> int:
    """`pynvmf ARGV...` as pynvmf.cli runs a host command."""
    return run_host_command(build_parser().parse_args(list(argv)))


def io_args(target: BackgroundTarget, *extra: str) -> list[str]:
    return ["-a", "127.0.0.1", "-s", str(target.port), "--nqn", NQN, *extra]


def closed_port() -> int:
    """A port nothing listens on: bound, then released, so a connect is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed + i // 4096) & 0xFF for i in range(n))


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- discover ------------------------------------------------------------------------------


def test_discover_lists_the_subsystem(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    # The discovery subsystem answers on every I/O port too.
    assert run("discover", "-a", "127.0.0.1", "-s", str(target.port)) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Discovery Log Number of Records 2, Generation counter \d+$", out, re.M)
    assert "=====Discovery Log Entry 0======\n" in out
    assert f"subnqn:  {NQN}\n" in out
    assert f"subnqn:  {PRIVATE_NQN}\n" not in out  # this host is not allowed there
    assert f"trsvcid: {target.port}\n" in out
    assert "traddr:  127.0.0.1\n" in out
    assert "trtype:  tcp\n" in out
    assert "adrfam:  ipv4\n" in out
    assert "subtype: nvme subsystem\n" in out
    assert "subtype: current discovery subsystem\n" in out


def test_discover_json(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["discover", "-a", "127.0.0.1", "-s", str(target.port), "-o", "json"]
    assert run(*argv, "-q", ALLOWED_HOSTNQN) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    by_nqn = {r["subnqn"]: r for r in records}
    assert set(by_nqn) == {NQN, PRIVATE_NQN, DISCOVERY_NQN}
    assert by_nqn[NQN]["trsvcid"] == str(target.port)
    assert by_nqn[NQN]["subtype"] == "nvme subsystem"
    assert by_nqn[NQN]["sectype"] == "none"


# -- list, id-ctrl, id-ns --------------------------------------------------------------------


def test_list_shows_size_and_block_size(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("list", *io_args(target)) == 0
    out = capsys.readouterr().out
    assert NQN in out
    lines = out.splitlines()
    row1 = next(line for line in lines if line.startswith("1 "))
    row2 = next(line for line in lines if line.startswith("2 "))
    assert f"{NS1_SIZE} B (32.00 MiB)" in row1
    assert "512 B + 0 B" in row1
    assert f"{NS2_SIZE} B (8.00 MiB)" in row2
    assert "4096 B + 0 B" in row2
    assert "pynvmf" in row1  # the model number


def test_list_json(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("list", *io_args(target, "-o", "json")) == 0
    devices = json.loads(capsys.readouterr().out)["Devices"]
    assert [d["NameSpace"] for d in devices] == [1, 2]
    ns1, ns2 = devices
    assert ns1["PhysicalSize"] == NS1_SIZE and ns1["SectorSize"] == NS1_BLOCK
    assert ns2["PhysicalSize"] == NS2_SIZE and ns2["SectorSize"] == NS2_BLOCK
    assert ns1["MaximumLBA"] == NS1_SIZE // NS1_BLOCK
    assert ns1["ModelNumber"] == "pynvmf"
    assert ns1["SerialNumber"] == target.target.subsystems[NQN].serial
    assert ns1["Firmware"]


def test_id_ctrl_normal(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("id-ctrl", *io_args(target)) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVME Identify Controller:\n")
    assert f"subnqn    : {NQN}\n" in out
    assert "mn        : pynvmf\n" in out
    assert re.search(r"^mdts      : \d+$", out, re.MULTILINE)
    assert "npss      : 0\n" in out
    assert "ps      0 : mp:" in out


def test_id_ctrl_json(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("id-ctrl", *io_args(target, "-o", "json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["subnqn"] == NQN
    assert data["mn"] == "pynvmf"
    assert data["fguid"] == "00" * 16  # bytes as hex
    assert data["npss"] == len(data["psd"]) - 1
    assert set(data["psd"][0]) >= {"max_power", "entry_lat", "exit_lat"}


def test_id_ns_json_has_nsze(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("id-ns", *io_args(target, "--namespace-id", "2", "-o", "json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nsze"] == NS2_SIZE // NS2_BLOCK
    assert data["lbaf"][data["flbas"] & 0xF]["lbads"] == 12
    assert isinstance(data["nguid"], str) and len(data["nguid"]) == 32


def test_id_ns_normal(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("id-ns", *io_args(target)) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVME Identify Namespace 1:\n")
    assert f"nsze    : {NS1_SIZE // NS1_BLOCK:#x}\n" in out
    assert "lbads:9  rp:0 (in use)\n" in out


def test_id_ns_of_an_inactive_namespace_fails(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("id-ns", *io_args(target, "--namespace-id", "7")) == 1
    assert "namespace 7 is not active" in one_line_error(capsys.readouterr().err)


# -- read, write -----------------------------------------------------------------------------


def test_write_then_read_through_files(target: BackgroundTarget, tmp_path: Path) -> None:
    # Larger than one command may carry (the host's own cap, whatever MDTS says), so
    # the library has to split both ways.
    data = pattern(3 * DEFAULT_MAX_TRANSFER + 4 * NS1_BLOCK)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    assert run("write", *io_args(target, "--start-block", "100", "--data", str(src))) == 0
    count = len(data) // NS1_BLOCK
    # 0's based, as nvme-cli's.
    read_args = ["--start-block", "100", "--block-count", str(count - 1), "--data", str(dst)]
    assert run("read", *io_args(target, *read_args)) == 0
    assert dst.read_bytes() == data


def test_write_then_read_through_stdin_and_stdout(
    target: BackgroundTarget,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    data = pattern(16 * NS2_BLOCK, seed=3)
    # A stdin with a file descriptor, as a shell gives it, so the command reads the fd.
    (tmp_path / "stdin").write_bytes(data)
    ns2 = ["--namespace-id", "2", "--start-block", "0x10"]
    with (tmp_path / "stdin").open() as stdin:
        monkeypatch.setattr("sys.stdin", stdin)
        assert run("write", *io_args(target, *ns2, "--fua")) == 0
    assert capfdbinary.readouterr().out == b""  # stdout stays clean for data
    assert run("read", *io_args(target, *ns2, "--data-size", str(16 * NS2_BLOCK))) == 0
    captured = capfdbinary.readouterr()
    assert captured.out == data
    assert b"read: Success" in captured.err


def test_write_block_count_takes_only_that_much_input(
    target: BackgroundTarget,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\x5a" * 10 * NS1_BLOCK)))
    assert run("write", *io_args(target, "--start-block", "40", "--block-count", "2")) == 0
    dst = tmp_path / "back.bin"
    read_args = ["--start-block", "40", "--block-count", "3", "--data", str(dst)]
    assert run("read", *io_args(target, *read_args)) == 0
    assert dst.read_bytes() == b"\x5a" * 3 * NS1_BLOCK + bytes(NS1_BLOCK)
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\x5a" * NS1_BLOCK)))
    assert run("write", *io_args(target, "-c", "2")) == 1
    assert "3 blocks of 512 bytes need 1536" in one_line_error(capsys.readouterr().err)


def test_write_of_a_partial_block_fails_without_pad(
    target: BackgroundTarget, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "odd.bin"
    src.write_bytes(b"\xab" * (NS1_BLOCK + 10))
    args = io_args(target, "--start-block", "5", "--data", str(src))
    assert run("write", *args) == 1
    err = one_line_error(capsys.readouterr().err)
    assert "not a whole number of 512-byte blocks" in err
    assert "--pad" in err

    assert run("write", *args, "--pad") == 0
    dst = tmp_path / "back.bin"
    read_args = ["--start-block", "5", "--block-count", "1", "--data", str(dst)]
    assert run("read", *io_args(target, *read_args)) == 0
    assert dst.read_bytes() == b"\xab" * (NS1_BLOCK + 10) + bytes(NS1_BLOCK - 10)


def test_write_of_an_empty_input_fails(
    target: BackgroundTarget, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert run("write", *io_args(target)) == 1
    assert "input is empty" in one_line_error(capsys.readouterr().err)


def test_out_of_range_read_fails_with_lba_in_the_message(
    target: BackgroundTarget, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "never.bin"
    last = NS1_SIZE // NS1_BLOCK - 1
    args = ["--start-block", str(last), "--block-count", "2", "--data", str(dst)]
    assert run("read", *io_args(target, *args)) == 1
    assert "LBA" in one_line_error(capsys.readouterr().err)
    assert not dst.exists()


def test_out_of_range_write_fails_with_lba_in_the_message(
    target: BackgroundTarget, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(bytes(2 * NS2_BLOCK))
    args = ["--namespace-id", "2", "--start-block", str(NS2_SIZE // NS2_BLOCK - 1)]
    assert run("write", *io_args(target, *args, "--data", str(src))) == 1
    assert "LBA" in one_line_error(capsys.readouterr().err)


# -- connection failures ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["discover", "list", "id-ctrl", "read"])
def test_a_closed_port_fails_with_a_clear_message(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    argv = [command, "-a", "127.0.0.1", "-s", str(port)]
    if command != "discover":
        argv += ["--nqn", NQN]
    if command == "read":
        argv += ["--block-count", "1"]
    assert run(*argv) == 1
    err = one_line_error(capsys.readouterr().err)
    expected = f"pynvmf {command}: cannot connect to 127.0.0.1 port {port}: Connection refused"
    if command == "read":  # nvme read's -s is the first block: said where it matters
        expected += " (-s is the TCP port; the first block is --start-block)"
    assert err == expected


def test_a_refused_host_fails_with_the_status_name(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["-a", "127.0.0.1", "-s", str(target.port), "--nqn", PRIVATE_NQN]
    assert run("id-ctrl", *argv) == 1
    err = one_line_error(capsys.readouterr().err)
    assert f"is not allowed on subsystem '{PRIVATE_NQN}' at 127.0.0.1:{target.port}" in err
    assert run("id-ctrl", *argv, "-q", ALLOWED_HOSTNQN) == 0


def test_an_unknown_namespace_fails(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("read", *io_args(target, "--namespace-id", "9", "--block-count", "1")) == 1
    err = one_line_error(capsys.readouterr().err)
    assert "namespace 9 is not active" in err
    assert "active: 1, 2" in err


# -- DH-HMAC-CHAP ----------------------------------------------------------------------------


def test_dhchap_secret_options_authenticate_and_a_bad_one_fails_in_one_line(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    from pynvmf.auth import DhchapKey, HostAuthConfig

    key, ctrl_key = DhchapKey.generate(32), DhchapKey.generate(48)
    target.target.set_host_keys(PRIVATE_NQN, ALLOWED_HOSTNQN, HostAuthConfig(key, ctrl_key))
    base = ["-a", "127.0.0.1", "-s", str(target.port), "--nqn", PRIVATE_NQN, "-q", ALLOWED_HOSTNQN]
    args = [*base, "--dhchap-secret", key.representation(), "-C", ctrl_key.representation()]
    assert run("id-ctrl", *args, "-o", "json") == 0
    assert json.loads(capsys.readouterr().out)["subnqn"] == PRIVATE_NQN
    # No secret: the controller's demand is the error.
    assert run("id-ctrl", *base) == 1
    assert "requires DH-HMAC-CHAP" in one_line_error(capsys.readouterr().err)
    # A wrong secret: refused by the controller, reason named.
    assert run("id-ctrl", *base, "-S", DhchapKey.generate(32).representation()) == 1
    assert "FAILED" in one_line_error(capsys.readouterr().err)
    # A secret copied wrongly: the CRC, not the secret, in the message.
    text = key.representation()
    body = text.split(":")[2]
    bad = text.replace(body, ("B" if body[0] == "A" else "A") + body[1:])
    assert run("id-ctrl", *base, "-S", bad) == 1
    err = one_line_error(capsys.readouterr().err)
    assert "CRC" in err and body[1:12] not in err
