"""Record and replay (pynvmf/record, docs/record-replay.md) over real TCP: a session of
pynvmf's own host library recorded by the target, replayed against a fresh target
configured alike (no differences), and against one that answers otherwise (a fault rule's
status, other data: the differences are reported where they are)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.record import format as F
from pynvmf.record.replay import ReplayReport, queue_info, replay
from pynvmf.record.tap import Recorder
from pynvmf.spec import pdu as P
from pynvmf.spec.status import Status
from pynvmf.target.faults import FaultSpec
from pynvmf.target.port import Port, SecureChannelPolicy
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from pynvmf.tcp.psk import HASH_SHA256, ConfiguredPsk
from tests.support.target_process import TargetProcess

NQN = "nqn.2024-01.io.pynvmf.test:replay"
BLOCK = 512
BLOCKS = 2048
UNWRITTEN = 1000  # a block the session reads and never writes
PATTERN = bytes(range(256)) * 256  # 64 KiB: more than in-capsule data, so R2T and H2CData


def _target(device: MemoryDevice | None = None) -> Target:
    subsystem = Subsystem(NQN)
    device = device or MemoryDevice(BLOCK * BLOCKS, BLOCK)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "m"))
    return Target([subsystem], [Port("127.0.0.1", 0)])


async def _record(directory: Path, gap_s: float = 0.0, **host_options: object) -> list[F.Recording]:
    target = _target()
    target.record_connections(Recorder(directory))
    await target.start()
    try:
        port = target.ports[0]
        ctrl = await connect(port.address, port.port, NQN, **host_options)  # type: ignore[arg-type]
        try:
            await ctrl.identify_controller()
            if gap_s:
                await asyncio.sleep(gap_s)  # a host that pauses: the gap --timing keeps
            ns = ctrl.namespace(1)
            await ns.write(8, PATTERN)
            buf = memoryview(bytearray(len(PATTERN)))
            await ns.read(8, buf)
            assert bytes(buf) == PATTERN
            await ns.read(UNWRITTEN, buf[:BLOCK])
        finally:
            await ctrl.close()
    finally:
        await target.stop()  # closes every recording file
    return [F.load(p) for p in sorted(directory.iterdir())]


async def _replay(
    recordings: list[F.Recording], target: Target, *, timing: bool = False
) -> ReplayReport:
    await target.start()
    try:
        port = target.ports[0]
        return await replay(recordings, (port.address, port.port), wait_s=2.0, timing=timing)
    finally:
        await target.stop()


async def test_a_recording_has_every_pdu_both_ways(tmp_path: Path) -> None:
    recordings = await _record(tmp_path, header_digest=True, data_digest=True)
    assert len(recordings) == 2  # the admin queue and one I/O queue
    for rec in recordings:
        assert rec.header["format"] == F.FORMAT and rec.header["role"] == "target"
        assert rec.pdus[0].type == P.PduType.ICREQ and rec.pdus[1].type == P.PduType.ICRESP
        times = [p.ns for p in rec.pdus]
        assert times == sorted(times)
    (io,) = [r for r in recordings if queue_info(r).qid == 1]
    types = {p.type for p in io.pdus}
    assert {P.PduType.R2T, P.PduType.H2C_DATA, P.PduType.C2H_DATA} <= types
    # Recorded as they travelled: the digests negotiated are in the PDUs.
    capsule = next(p for p in io.pdus if p.type == P.PduType.CAPSULE_CMD)
    assert capsule.flags & P.FLAG_HDGST
    data = next(p for p in io.pdus if p.type == P.PduType.C2H_DATA)
    assert data.flags & P.FLAG_DDGST
    read = b"".join(p.data for p in io.pdus if p.type == P.PduType.C2H_DATA)
    assert read == PATTERN + bytes(BLOCK)


async def test_replay_against_a_target_configured_alike_finds_nothing(tmp_path: Path) -> None:
    recordings = await _record(tmp_path, header_digest=True, data_digest=True)
    report = await _replay(recordings, _target())
    assert report.findings == [], report.lines()
    assert report.associations == 1
    assert report.matched == sum(1 for r in recordings for p in r.pdus if p.direction == F.C2H)


async def test_with_timing_the_recorded_gaps_are_kept(tmp_path: Path) -> None:
    gap = 0.5
    recordings = await _record(tmp_path, gap_s=gap)
    started = time.monotonic()
    report = await _replay(recordings, _target())
    fast = time.monotonic() - started
    started = time.monotonic()
    timed = await _replay(recordings, _target(), timing=True)
    slow = time.monotonic() - started
    assert report.findings == [] and timed.findings == []
    assert fast < gap <= slow


async def test_replay_reports_a_status_the_target_now_answers(tmp_path: Path) -> None:
    recordings = await _record(tmp_path)
    target = _target()
    target.add_fault(FaultSpec("status", sc=Status.INTERNAL_ERROR, opcode="read"))
    report = await _replay(recordings, target)
    differs = [f for f in report.findings if f.kind == "differs"]
    assert len(differs) == 2  # both reads
    for finding in differs:
        assert finding.what.startswith("CapsuleResp") and finding.what.endswith("(read)")
        (difference,) = finding.differences
        assert difference.field == "status"
        assert difference.recorded == "SUCCESS" and "INTERNAL_ERROR" in str(difference.live)
    # The read's data never came: each of its recorded C2HData PDUs is missing.
    missing = [f for f in report.findings if f.kind == "missing"]
    assert missing and all(f.what.startswith("C2HData") for f in missing)


async def test_replay_reports_other_data_where_it_differs(tmp_path: Path) -> None:
    recordings = await _record(tmp_path)
    # The session read block UNWRITTEN, zeroes then; this target has data there.
    device = MemoryDevice(BLOCK * BLOCKS, BLOCK)
    await device.write(UNWRITTEN, b"\xaa" * 16 + bytes(BLOCK - 16))
    report = await _replay(recordings, _target(device))
    (finding,) = report.findings
    assert finding.kind == "differs" and finding.what.startswith("C2HData")
    (difference,) = finding.differences
    assert difference.field == "data[0:16] (16 bytes differ)"
    assert difference.recorded == bytes(16) and difference.live == b"\xaa" * 16


async def test_a_write_the_target_fails_sends_no_data_and_says_so(tmp_path: Path) -> None:
    recordings = await _record(tmp_path)
    target = _target()
    target.add_fault(FaultSpec("status", sc=Status.INTERNAL_ERROR, opcode="write"))
    report = await _replay(recordings, target)
    kinds = {(f.kind, f.what.split()[0]) for f in report.findings}
    # No R2T came, so no H2CData went (the target saw no PDU it did not ask for); the
    # read then returned what the device held before (zeroes, not the pattern).
    assert ("missing", "R2T") in kinds
    assert ("differs", "CapsuleResp") in kinds
    assert ("differs", "C2HData") in kinds
    assert not any(f.kind == "unexpected" for f in report.findings)


async def _cli_replay(files: list[Path], target: Target) -> tuple[int, str]:
    await target.start()
    try:
        port = target.ports[0]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pynvmf",
            "replay",
            *map(str, files),
            "--target",
            f"{port.address}:{port.port}",
            "--wait",
            "2",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode is not None
        return proc.returncode, out.decode()
    finally:
        await target.stop()


async def test_the_cli_says_in_its_exit_status_whether_answers_differ(tmp_path: Path) -> None:
    await _record(tmp_path)
    files = sorted(tmp_path.iterdir())
    status, out = await _cli_replay(files, _target())
    assert status == 0, out
    assert "0 finding(s)" in out
    target = _target()
    target.add_fault(FaultSpec("status", sc=Status.INTERNAL_ERROR, opcode="read"))
    status, out = await _cli_replay(files, target)
    assert status == 1, out
    assert "CapsuleResp cid" in out and "status: recorded 'SUCCESS'" in out


async def test_the_target_command_records_to_a_directory_and_refuses_many_cores(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "rec"
    proc = TargetProcess(
        None,
        tmp_path,
        [
            "--memory",
            "16M",
            "--nqn",
            NQN,
            "--listen",
            "127.0.0.1:0",
            "--discovery-port",
            "0",
            "--record",
            str(directory),
        ],
    )
    proc.start()
    try:
        ctrl = await connect(proc.address, proc.port, NQN)
        await ctrl.identify_controller()
        await ctrl.close()
    finally:
        proc.stop()  # every recording file is closed when the target stops
    recordings = [F.load(p) for p in sorted(directory.iterdir())]
    assert sorted(queue_info(r).qid for r in recordings) == [0, 1]
    assert all(r.pdus and r.end == "" for r in recordings)
    refused = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pynvmf",
        "target",
        "--cores",
        "2",
        "--record",
        str(directory),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(refused.communicate(), 60)
    assert refused.returncode == 2
    assert b"--record: recording needs a target on one core" in err


TLS_HOST = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-0000000000ec"
TLS_KEY = ConfiguredPsk(HASH_SHA256, bytes(range(32)))


def _tls_target(secure_channel: SecureChannelPolicy) -> Target:
    subsystem = Subsystem(NQN, allow_any_host=False, allowed_hosts={TLS_HOST})
    subsystem.add_namespace(Namespace.create(NQN, 1, MemoryDevice(BLOCK * BLOCKS, BLOCK), "m"))
    return Target([subsystem], [Port("127.0.0.1", 0, secure_channel=secure_channel)])


async def test_a_tls_connection_is_recorded_in_plaintext_and_replays_without_tls(
    tmp_path: Path,
) -> None:
    target = _tls_target(SecureChannelPolicy.REQUIRED)
    target.record_connections(Recorder(tmp_path))
    await target.start()
    target.set_host_psk(NQN, TLS_HOST, TLS_KEY.encode())
    try:
        port = target.ports[0]
        ctrl = await connect(
            port.address, port.port, NQN, hostnqn=TLS_HOST, tls_psk=TLS_KEY.encode(), timeout=10
        )
        try:
            assert ctrl.admin is not None and ctrl.admin.tls is not None
            await ctrl.namespace(1).write(0, PATTERN)
        finally:
            await ctrl.close()
    finally:
        await target.stop()
    recordings = [F.load(p) for p in sorted(tmp_path.iterdir())]
    assert sorted(queue_info(r).qid for r in recordings) == [0, 1]
    written = b"".join(p.data for r in recordings for p in r.pdus if p.type == P.PduType.H2C_DATA)
    assert written == PATTERN  # the PDUs, not TLS records
    report = await _replay(recordings, _tls_target(SecureChannelPolicy.NONE))
    assert report.findings == [], report.lines()


def test_the_cli_refuses_a_file_that_is_not_a_recording(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something else"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "pynvmf", "replay", str(bad), "--target", "127.0.0.1:4420"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{bad}:1: not a pynvmf-recording file" in done.stderr


async def test_a_target_that_refuses_the_connection_is_a_finding(tmp_path: Path) -> None:
    recordings = await _record(tmp_path)
    target = _target()
    await target.start()
    port = target.ports[0].port
    await target.stop()  # nothing listens there now
    report = await replay(recordings, ("127.0.0.1", port), wait_s=0.5)
    assert report.differs and report.sent == 0
    # One finding per connection the replay could not open, nothing for its answers.
    assert [f.what for f in report.findings] == ["connection"] * len(recordings)
    assert str(report.findings[0]).endswith("#0 connection: " + report.findings[0].kind)
    assert report.findings[0].kind.startswith("refused")
