"""`pynvmf copy` (pynvmf.cli.copy) against an in-process target.

The target runs on its own event loop in a background thread, so the command runs
exactly as the CLI runs it: parse the arguments, then `run_copy_command`, which
starts and ends its own event loop in the test's thread. The target's namespaces
are memory devices that count how they are used, so a test can tell an offloaded
copy (the target copies within itself, nothing is read over the network) from an
emulated one.
"""

from __future__ import annotations

import asyncio
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
from pynvmf.cli.copy import (
    EndpointError,
    LocalEndpoint,
    RemoteEndpoint,
    format_progress,
    parse_amount,
    parse_endpoint,
    run_copy_command,
)
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target

NQN = "nqn.2024-01.org.pynvmf:copy-cli"
OTHER_NQN = "nqn.2024-01.org.pynvmf:copy-cli-other"
MiB = 1024 * 1024
NS_SIZE = 8 * MiB


class CountingMemory(MemoryDevice):
    """A MemoryDevice that counts what the target asks of it."""

    def __init__(self, size_bytes: int, block_size: int = 512) -> None:
        super().__init__(size_bytes, block_size)
        self.reads = 0
        self.writes = 0
        self.copies = 0

    async def read(self, lba: int, buf: memoryview) -> None:
        self.reads += 1
        await super().read(lba, buf)

    async def write(self, lba: int, data: Any, *, fua: bool = False) -> None:
        self.writes += 1
        await super().write(lba, data, fua=fua)

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        self.copies += 1
        await super().copy_within(src_lba, dst_lba, nblocks, fua=fua)


class BackgroundTarget:
    """A started Target on an event loop of its own, in a daemon thread.

    NQN: namespaces 1 and 2 (512-byte blocks), 3 (4096-byte blocks);
    OTHER_NQN: namespace 1 (512-byte blocks)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.devices: dict[tuple[str, int], CountingMemory] = {}
        self.target: Target = self.call(self._start())
        self.port = self.target.ports[0].port

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> Target:
        subsystems = []
        for nqn, layout in ((NQN, ((1, 512), (2, 512), (3, 4096))), (OTHER_NQN, ((1, 512),))):
            subsystem = Subsystem(nqn)
            for nsid, block in layout:
                device = CountingMemory(NS_SIZE, block)
                self.devices[nqn, nsid] = device
                subsystem.add_namespace(Namespace.create(nqn, nsid, device, f"memory:{nsid}"))
            subsystems.append(subsystem)
        target = Target(subsystems, [Port("127.0.0.1", 0)])
        await target.start()
        return target

    def device(self, nsid: int, nqn: str = NQN) -> CountingMemory:
        return self.devices[nqn, nsid]

    # fill and contents bypass the counters: they are the test's own I/O.
    def fill(self, nsid: int, lba: int, data: bytes, nqn: str = NQN) -> None:
        self.call(MemoryDevice.write(self.device(nsid, nqn), lba, data))

    def contents(self, nsid: int, lba: int, nbytes: int, nqn: str = NQN) -> bytes:
        buf = bytearray(nbytes)
        self.call(MemoryDevice.read(self.device(nsid, nqn), lba, memoryview(buf)))
        return bytes(buf)

    def reset_counters(self) -> None:
        for device in self.devices.values():
            device.reads = device.writes = device.copies = 0

    def url(self, nsid: int, suffix: str = "", nqn: str = NQN) -> str:
        return f"nvme://127.0.0.1:{self.port}/{nqn}/{nsid}{suffix}"

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
    """`pynvmf copy ARGV...` as pynvmf.cli runs it."""
    return run_copy_command(build_parser().parse_args(["copy", *argv]))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert run(*argv, "-o", "json") == 0, capsys.readouterr().err
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed + i // 4096) & 0xFF for i in range(n))


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pynvmf copy: ")
    return lines[0]


def closed_port() -> int:
    """A port nothing listens on: bound, then released, so a connect is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- remote to remote ----------------------------------------------------------------------


def test_copy_within_one_namespace_is_offloaded(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    data = pattern(MiB, seed=1)
    target.fill(1, 0, data)
    target.reset_counters()
    summary = run_json(capsys, target.url(1, "@0+1M"), target.url(1, "@4096"), "--chunk", "256K")
    assert summary["status"] == "completed"
    assert summary["blocks"] == summary["total_blocks"] == 2048
    assert summary["offloaded_blocks"] == 2048
    assert summary["emulated_blocks"] == 0
    assert summary["commands"] == 4  # one Copy command per 256 KiB chunk
    assert target.contents(1, 4096, MiB) == data
    device = target.device(1)
    # The target copied within the device, and no Read or Write command reached it.
    assert device.copies > 0
    assert device.reads == 0 and device.writes == 0


def test_copy_between_namespaces_of_one_subsystem_is_offloaded(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    data = pattern(512 * 1024, seed=2)
    target.fill(1, 100, data)
    target.reset_counters()
    summary = run_json(capsys, target.url(1, "@100+1024"), target.url(2, "@7"))
    assert summary["offloaded_blocks"] == 1024 and summary["emulated_blocks"] == 0
    # Cross-namespace Copy commands (TP 4130): the target moved the data itself (by
    # reading and writing its two devices: they are different devices).
    assert target.contents(2, 7, len(data)) == data


def test_copy_between_subsystems_is_emulated(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    data = pattern(64 * 1024, seed=3)
    target.fill(1, 0, data, nqn=OTHER_NQN)
    summary = run_json(capsys, target.url(1, "@0+64K", nqn=OTHER_NQN), target.url(2, "@0"))
    assert summary["emulated_blocks"] == 128 and summary["offloaded_blocks"] == 0
    assert summary["bytes"] == 64 * 1024
    assert target.contents(2, 0, len(data)) == data


def test_overlapping_copy_within_a_namespace_is_memmove(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    data = pattern(256 * 512, seed=4)
    target.fill(1, 1000, data)
    summary = run_json(
        capsys, target.url(1, "@1000"), target.url(1, "@1010"), "--count", "256", "--chunk", "16"
    )
    assert summary["status"] == "completed"
    assert target.contents(1, 1010, len(data)) == data


def test_normal_output_is_one_summary_line(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(target.url(1, "@0+64K"), target.url(2, "@0")) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"copied 65536 bytes \(64\.0 KiB\) in \d+\.\d\d s, \d+\.\d MB/s; "
        r"blocks: 128 offloaded, 0 native, 0 emulated\n",
        out,
    ), out


def test_quiet_prints_nothing(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    target.fill(1, 0, pattern(4096, seed=5))
    assert run("--quiet", target.url(1, "@0+8"), target.url(2, "@0")) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert target.contents(2, 0, 4096) == pattern(4096, seed=5)


def test_json_summary_fields(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    source, destination = target.url(1, "@8+16"), target.url(2, "@32")
    summary = run_json(capsys, source, destination, "--fua")
    assert summary["source"] == source and summary["destination"] == destination
    assert summary["source_lba"] == 8 and summary["destination_lba"] == 32
    assert summary["block_size"] == 512
    assert summary["bytes"] == 16 * 512
    assert summary["seconds"] >= 0 and summary["bytes_per_second"] >= 0
    assert summary["error"] is None
    for field in ("offloaded_blocks", "native_blocks", "emulated_blocks", "staged_blocks"):
        assert isinstance(summary[field], int)


# -- local files ---------------------------------------------------------------------------


def test_file_to_remote(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = pattern(300 * 512, seed=6)
    src = tmp_path / "in.img"
    src.write_bytes(data)
    summary = run_json(capsys, str(src), target.url(2, "@100"))
    assert summary["blocks"] == 300 and summary["emulated_blocks"] == 300
    assert target.contents(2, 100, len(data)) == data


def test_file_range_to_remote(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = pattern(64 * 512, seed=7)
    src = tmp_path / "in.img"
    src.write_bytes(data)
    summary = run_json(capsys, f"file:{src}@16+8K", target.url(2, "@0"))
    assert summary["blocks"] == 16
    assert target.contents(2, 0, 16 * 512) == data[16 * 512 : 32 * 512]


def test_remote_to_new_file(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = pattern(256 * 1024, seed=8)
    target.fill(1, 64, data)
    out = tmp_path / "out.img"
    summary = run_json(capsys, target.url(1, "@64+256K"), f"file://{out}@4")
    assert summary["emulated_blocks"] == 512
    written = out.read_bytes()
    assert len(written) == 4 * 512 + len(data)  # created just large enough
    assert written[: 4 * 512] == bytes(4 * 512)
    assert written[4 * 512 :] == data


def test_remote_4k_namespace_to_file_uses_its_block_size(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = pattern(8 * 4096, seed=9)
    target.fill(3, 0, data)
    out = tmp_path / "out.img"
    summary = run_json(capsys, target.url(3, "+8"), str(out))
    assert summary["block_size"] == 4096 and summary["bytes"] == len(data)
    assert out.read_bytes() == data


def test_file_to_file_within_one_file_is_native(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = pattern(64 * 512, seed=10)
    img = tmp_path / "disk.img"
    img.write_bytes(data)
    summary = run_json(capsys, f"file:{img}@0+16", f"file:{img}@32")
    assert summary["native_blocks"] == 16 and summary["emulated_blocks"] == 0
    result = img.read_bytes()
    assert result[32 * 512 : 48 * 512] == data[: 16 * 512]
    assert result[: 32 * 512] == data[: 32 * 512]


def test_file_to_file_with_block_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = pattern(4 * 4096, seed=11)
    src, dst = tmp_path / "a.img", tmp_path / "b.img"
    src.write_bytes(data)
    summary = run_json(capsys, f"file:{src}@1", f"file:{dst}", "--block-size", "4096")
    assert summary["blocks"] == 3 and summary["block_size"] == 4096
    assert dst.read_bytes() == data[4096:]


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("nvme://127.0.0.1:4420/1", "expected NQN/NSID"),
        ("nvme://127.0.0.1:4420", "expected nvme://HOST[:PORT]/NQN/NSID"),
        ("nvme://127.0.0.1:99999/nqn.x/1", "port '99999' is not in 1..65535"),
        ("nvme://::1/nqn.x/1", "an IPv6 address goes in brackets"),
        ("nvme://[::1/nqn.x/1", "'[' without ']'"),
        ("nvme://[nothost]:4420/nqn.x/1", "is not an IPv6 address"),
        ("nvme://127.0.0.1/nqn.x/one", "'one' is not NSID[@LBA][+COUNT]"),
        ("nvme://127.0.0.1/nqn.x/0", "namespace ID 0"),
        ("nvme://127.0.0.1/nqn.x/1+64XB", "is neither a number of blocks nor a size"),
        ("nvme://127.0.0.1/nqn.x/1+0", "must be at least one block"),
        ("tcp://127.0.0.1/nqn.x/1", "unknown scheme 'tcp'"),
        ("nvme:127.0.0.1/nqn.x/1", "a remote namespace is nvme://"),
        ("file://host/x.img", "a file URL has no host"),
        ("-", "standard input and output"),
    ],
)
def test_bad_endpoint_syntax(
    endpoint: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = tmp_path / "other.img"
    other.write_bytes(bytes(4096))
    assert run(endpoint, str(other)) == 1
    line = one_line_error(capsys)
    assert "bad endpoint" in line and message in line, line


def test_a_count_of_part_of_a_block(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "in.img"
    src.write_bytes(bytes(8192))
    assert run(str(src), str(tmp_path / "out.img"), "--count", "1000B") == 1
    assert "--count 1000B is not a whole number of 512-byte blocks" in one_line_error(capsys)
    assert not (tmp_path / "out.img").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--count", "lots"], "argument --count: --count 'lots' is neither a number of blocks"),
        (["--depth", "0"], "argument --depth: 0 is less than 1"),
        (["--block-size", "1000"], "argument --block-size: 1000 is not a power of two"),
        (["--block-size", "256"], "argument --block-size: 256 is less than 512"),
        (["--hostid", "nope"], "argument -I/--hostid: host ID 'nope' is not a UUID"),
    ],
)
def test_bad_options_are_usage_errors(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = tmp_path / "in.img"
    src.write_bytes(bytes(8192))
    with pytest.raises(SystemExit) as exc:
        run(str(src), str(tmp_path / "out.img"), *options)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: pynvmf copy ") and message in err, err
    assert not (tmp_path / "out.img").exists()


def test_missing_source_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.img"
    assert run(str(missing), str(tmp_path / "out.img")) == 1
    assert one_line_error(capsys) == f"pynvmf copy: {missing}: No such file or directory"


def test_counts_that_disagree(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "in.img"
    src.write_bytes(bytes(64 * 512))
    assert run(f"file:{src}+8", f"file:{tmp_path / 'out.img'}+16") == 1
    line = one_line_error(capsys)
    assert "counts disagree: the source's +8 is 8 blocks, the destination's +16 is 16" in line
    assert not (tmp_path / "out.img").exists()


def test_source_range_outside_writes_nothing(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.img"
    blocks = NS_SIZE // 512
    assert run(target.url(1, f"@{blocks - 4}+8"), str(out)) == 1
    line = one_line_error(capsys)
    assert f"source range LBA {blocks - 4}..{blocks + 3} is outside" in line
    assert f"(LBAs 0..{blocks - 1})" in line
    assert not out.exists()


def test_destination_range_outside_writes_nothing(
    target: BackgroundTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    target.reset_counters()
    blocks = NS_SIZE // 512
    assert run(target.url(1, "@0+16"), target.url(2, f"@{blocks - 8}")) == 1
    assert "destination range LBA" in one_line_error(capsys)
    assert target.device(2).writes == 0 and target.device(2).copies == 0


def test_block_sizes_differ(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(target.url(1, "+8"), target.url(3)) == 1
    assert "block sizes differ: source 512, destination 4096" in one_line_error(capsys)


def test_namespace_not_active(target: BackgroundTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(target.url(9), target.url(1)) == 1
    assert f"namespace 9 is not active on {NQN} (active: 1, 2, 3)" in one_line_error(capsys)


def test_connection_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = closed_port()
    assert run(f"nvme://127.0.0.1:{port}/{NQN}/1", str(tmp_path / "out.img")) == 1
    line = one_line_error(capsys)
    assert f"cannot connect to 127.0.0.1 port {port}: Connection refused" in line
    assert not (tmp_path / "out.img").exists()


# -- syntax and display, without a target ---------------------------------------------------


def test_parse_remote_endpoints() -> None:
    assert parse_endpoint("nvme://10.0.0.1/nqn.2024-01.x:y/3") == RemoteEndpoint(
        "10.0.0.1", 4420, "nqn.2024-01.x:y", 3, 0, None, "nvme://10.0.0.1/nqn.2024-01.x:y/3"
    )
    ep = parse_endpoint("NVME://[fe80::1%eth0]:4421/nqn.a/b:c/2@0x800+64M")
    assert isinstance(ep, RemoteEndpoint)
    assert (ep.host, ep.port, ep.nqn, ep.nsid, ep.lba) == (
        "fe80::1%eth0",
        4421,
        "nqn.a/b:c",
        2,
        2048,
    )
    assert ep.count is not None and ep.count.blocks(512, "x") == 131072


def test_parse_local_endpoints() -> None:
    assert parse_endpoint("disk@1.img") == LocalEndpoint("disk@1.img", 0, None, "disk@1.img")
    ep = parse_endpoint("file:///tmp/a+b.img@16+4K")
    assert isinstance(ep, LocalEndpoint)
    assert (ep.path, ep.lba) == ("/tmp/a+b.img", 16)
    assert ep.count is not None and (ep.count.value, ep.count.in_bytes) == (4096, True)
    # A name whose end does not parse as a count stays whole.
    ep = parse_endpoint("file:/tmp/a+b.img")
    assert isinstance(ep, LocalEndpoint) and (ep.path, ep.count) == ("/tmp/a+b.img", None)


@pytest.mark.parametrize(
    ("text", "value", "in_bytes"),
    [("8", 8, False), ("4096B", 4096, True), ("64k", 65536, True), ("2GiB", 2 << 30, True)],
)
def test_parse_amount(text: str, value: int, in_bytes: bool) -> None:
    amount = parse_amount(text)
    assert (amount.value, amount.in_bytes) == (value, in_bytes)


def test_parse_amount_takes_the_units_of_every_size() -> None:
    # pynvmf.units: 1MB is 1 MiB here as in `target --memory` and `bench --size`.
    for text in ("10MB", "10MiB", "10M", "10mb"):
        amount = parse_amount(text)
        assert (amount.value, amount.in_bytes) == (10 * MiB, True)
    with pytest.raises(EndpointError, match="neither a number of blocks nor a size"):
        parse_amount("10XB")


def test_progress_line() -> None:
    line = format_progress(256 * MiB, 1024 * MiB, 128e6)
    assert line.startswith("[" + "#" * 6 + "." * 18 + "] 256.0 MiB / 1.0 GiB  25%")
    assert "   128.0 MB/s" in line
    assert line.endswith("ETA 0:00:06")  # 768 MiB at 128 MB/s
    assert format_progress(0, 100, 0.0).endswith("ETA -:--:--")
