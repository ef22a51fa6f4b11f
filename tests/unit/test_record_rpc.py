"""The record RPC methods (pynvmf/rpc/record_methods.py) against a Target that is not
started: starting, replacing and stopping a recording, and what they refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pynvmf.record import format as F
from pynvmf.record.tap import RECORDING_STOPPED
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.spec import pdu as P
from pynvmf.target.cores.workers import MultiCoreTarget
from pynvmf.target.target import Target


async def test_start_get_and_stop(tmp_path: Path) -> None:
    target = Target()
    cp = control_plane(target)
    assert await cp.call("pynvmf_record_get", {}) is None
    directory = tmp_path / "rec"
    assert await cp.call("pynvmf_record_start", {"directory": str(directory)}) is True
    recorder = target.recorder
    assert recorder is not None and directory.is_dir()
    tap = recorder.open("target", "a:1", "b:1")  # what a connection accepted now gets
    assert tap is not None
    tap.received(P.pack_ic(P.PduType.ICREQ, 0, 0, 0, 0))
    got = await cp.call("pynvmf_record_get", {})
    assert got == {"directory": str(directory), "files": 1, "bytes": got["bytes"], "full": False}
    assert got["bytes"] > 0
    assert await cp.call("pynvmf_record_stop", {}) is True
    assert target.recorder is None and not tap.recording
    (path,) = directory.iterdir()
    rec = F.load(path)
    assert len(rec.pdus) == 1 and rec.end == RECORDING_STOPPED
    assert await cp.call("pynvmf_record_stop", {}) is False


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "directory: missing"),
        ({"directory": ""}, "directory: empty"),
        ({"directory": 7}, "directory: 7 is not a string"),
        ({"directory": "d", "max_file_bytes": 100}, "max_file_bytes: 100 not in"),
        ({"directory": "d", "max_total_bytes": -1}, "max_total_bytes: -1 not in"),
        ({"directory": "d", "extra": 1}, "extra"),
    ],
)
async def test_bad_parameters_are_refused_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: dict[str, Any], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    target = Target()
    with pytest.raises(RpcError) as exc:
        await control_plane(target).call("pynvmf_record_start", params)
    assert exc.value.code == INVALID_PARAMS and message in exc.value.message
    assert target.recorder is None and not (tmp_path / "d").exists()


async def test_a_directory_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    target = Target()
    with pytest.raises(RpcError, match="directory: "):
        await control_plane(target).call(
            "pynvmf_record_start", {"directory": str(tmp_path / "file" / "rec")}
        )
    assert target.recorder is None


async def test_a_target_with_workers_refuses_to_record(tmp_path: Path) -> None:
    target = MultiCoreTarget(2)
    with pytest.raises(RpcError, match="record: recording needs a target on one core"):
        await control_plane(target).call("pynvmf_record_start", {"directory": str(tmp_path)})
    assert target.recorder is None
