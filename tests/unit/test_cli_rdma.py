"""`-t rdma` on the host commands (pynvmf discover, list, id-ctrl, id-ns, read, write,
bench): the option's parsing and defaults, the one-line errors where rdma cannot be used,
and the commands themselves over the loopback of both RDMA adapters' interfaces
(tests/unit/test_rdma_host_queue.py) against pynvmf's own NVMe/RDMA target queue."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from pynvmf.cli import build_parser
from pynvmf.cli.common import resolve_target
from pynvmf.cli.host import run_host_command
from tests.unit.test_rdma_host_queue import NQN, LoopbackFabric, loopback_target

NO_PYVERBS = importlib.util.find_spec("pyverbs") is None


def parsed(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    resolve_target(args)
    return args


@pytest.mark.parametrize(
    ("argv", "transport", "port"),
    [
        (["discover", "-a", "10.0.0.1"], "tcp", 8009),
        (["discover", "-t", "rdma", "-a", "10.0.0.1"], "rdma", 4420),
        (["discover", "-t", "rdma", "-a", "10.0.0.1", "-s", "4421"], "rdma", 4421),
        (["id-ctrl", "-t", "tcp", "-a", "10.0.0.1", "--nqn", NQN], "tcp", 4420),
        (["id-ctrl", "--transport", "rdma", "-a", "10.0.0.1", "--nqn", NQN], "rdma", 4420),
        (["bench", "-t", "rdma", "-a", "10.0.0.1", "--nqn", NQN], "rdma", 4420),
    ],
)
def test_the_transport_and_its_default_port(argv: list[str], transport: str, port: int) -> None:
    args = parsed(*argv)
    assert (args.transport, args.trsvcid) == (transport, port)


def test_a_transport_pynvmf_does_not_speak_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["discover", "-t", "fc", "-a", "10.0.0.1"])
    assert exc.value.code == 2
    assert "invalid choice: 'fc'" in capsys.readouterr().err


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.skipif(not NO_PYVERBS, reason="pyverbs is installed here")
@pytest.mark.parametrize("command", ["discover", "id-ctrl"])
def test_rdma_without_pyverbs_is_one_line_naming_the_package(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "-t", "rdma", "-a", "127.0.0.1"]
    if command != "discover":
        argv += ["--nqn", NQN]
    assert run_host_command(build_parser().parse_args(argv)) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"pynvmf {command}: 127.0.0.1 port 4420: trtype rdma needs"), err
    assert "python3-pyverbs" in err


def test_rdma_with_tls_or_digests_is_refused_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["id-ctrl", "-t", "rdma", "-a", "127.0.0.1", "--nqn", NQN, "-g"]
    assert run_host_command(build_parser().parse_args(argv)) == 1
    assert "TLS, secure channel concatenation and digests are TCP's" in one_line(
        capsys.readouterr().err
    )


# -- the commands over the loopback of the RDMA adapters ------------------------------------


@pytest.fixture
def fabric(monkeypatch: pytest.MonkeyPatch) -> LoopbackFabric:
    return loopback_target(monkeypatch)


def test_discover_t_rdma_reads_the_log_over_rdma(
    fabric: LoopbackFabric, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_host_command(parsed("discover", "-t", "rdma", "-a", "127.0.0.1", "-o", "json")) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert {r["trtype"] for r in records} == {"rdma"}
    assert [r["subnqn"] for r in records if r["subtype"] == "nvme subsystem"] == [NQN]
    assert fabric.queues and all(q.closed for q, _ in fabric.queues)


def test_write_and_read_t_rdma(
    fabric: LoopbackFabric, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytes(range(256)) * 32  # 8 KiB: in the capsule at the target's 16 KiB
    source = tmp_path / "in"
    source.write_bytes(data)
    back = tmp_path / "out"
    where = ["-t", "rdma", "-a", "127.0.0.1", "--nqn", NQN]
    assert run_host_command(parsed("write", *where, "-d", str(source))) == 0
    assert run_host_command(parsed("read", *where, "-z", "8K", "-d", str(back))) == 0
    assert back.read_bytes() == data
    # Every queue of both commands went over the rdma adapter: admin and I/O, twice.
    assert len(fabric.queues) == 4
