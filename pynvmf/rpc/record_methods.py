"""The RPC methods of record and replay (docs/record-replay.md).

- pynvmf_record_start {directory, max_file_bytes?, max_total_bytes?}: record every
  connection accepted from now on, one file per connection in `directory` (created if
  need be), within the caps (defaults 64 MiB a file, 1 GiB in all). A recording already
  going on stops first. Refused on a target with worker processes (`--cores N`, N > 1).
- pynvmf_record_stop {}: stop: the files of connections still open get an end line and
  close. Returns whether something was being recorded.
- pynvmf_record_get {}: null, or {directory, files, bytes, full}: where the recording goes,
  how many files and bytes it has written, and whether its directory cap stopped it.
"""

from __future__ import annotations

from typing import Any

from pynvmf.record.tap import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_TOTAL_BYTES, Recorder
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params, change_error
from pynvmf.target.changes import ChangeError

table = MethodTable()
method = table.register
# A cap smaller than a PDU line would stop every recording at its first PDU.
_MIN_CAP = 4096


@method("pynvmf_record_start")
async def pynvmf_record_start(cp: ControlPlane, p: Params) -> bool:
    directory = p.string("directory", required=True)
    max_file = p.integer("max_file_bytes", DEFAULT_MAX_FILE_BYTES, low=_MIN_CAP)
    max_total = p.integer("max_total_bytes", DEFAULT_MAX_TOTAL_BYTES, low=_MIN_CAP)
    p.done()
    if not directory:
        raise RpcError(INVALID_PARAMS, "directory: empty")
    try:
        recorder = Recorder(directory, max_file_bytes=max_file, max_total_bytes=max_total)
    except OSError as exc:
        raise RpcError(INVALID_PARAMS, f"directory: {exc.strerror or exc}") from exc
    try:
        cp.target.record_connections(recorder)
    except ChangeError as exc:
        raise change_error(exc, {}) from exc
    return True


@method("pynvmf_record_stop")
async def pynvmf_record_stop(cp: ControlPlane, p: Params) -> bool:
    p.done()
    was = cp.target.recorder is not None
    cp.target.record_connections(None)
    return was


@method("pynvmf_record_get")
async def pynvmf_record_get(cp: ControlPlane, p: Params) -> dict[str, Any] | None:
    p.done()
    recorder = cp.target.recorder
    if recorder is None:
        return None
    return {
        "directory": str(recorder.directory),
        "files": recorder.connections,
        "bytes": recorder.total_bytes,
        "full": recorder.full,
    }
