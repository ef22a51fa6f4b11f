"""Recording connections to files (docs/record-replay.md): a Recorder owns the directory
and its caps, and gives each connection a StreamTap (framing.ByteTap), which splits the
two byte streams into PDUs and writes one line per PDU (format.py).

The tap sees plaintext (after TLS) and whole PDUs as they travelled, digests included: it
needs to know nothing the connection negotiated, only each PDU's length (its common
header's PLEN). Writing is synchronous, in the event loop: recording is for debugging and
regression tests, bounded by its caps, and costs nothing on connections not recorded.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from pynvmf.record import format as F
from pynvmf.spec import pdu as P
from pynvmf.tcp.framing import Buffer

log = logging.getLogger(__name__)

# Why a file ends without its connection's end: recording was stopped or redirected.
RECORDING_STOPPED = "recording stopped"
DEFAULT_MAX_FILE_BYTES = 64 << 20
DEFAULT_MAX_TOTAL_BYTES = 1 << 30
# No NVMe/TCP PDU is this long (MAXH2CDATA and the largest C2HData pynvmf sends are far
# below): a stream whose PLEN says more is not NVMe/TCP, and recording it stops.
_MAX_PDU = 1 << 26


class _Splitter:
    """One direction's bytes, cut into whole PDUs."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: Buffer) -> list[bytes] | None:
        """The PDUs `data` completed; None when the stream is not NVMe/TCP."""
        buf = self._buf
        buf += data
        pdus: list[bytes] = []
        while len(buf) >= P.CH_LEN:
            plen = int.from_bytes(buf[4:8], "little")
            if plen < P.CH_LEN or plen > _MAX_PDU:
                return None
            if len(buf) < plen:
                break
            pdus.append(bytes(buf[:plen]))
            del buf[:plen]
        return pdus


class StreamTap:
    """One connection's recording file (framing.ByteTap)."""

    def __init__(self, recorder: Recorder, path: Path, f: IO[str], role: str) -> None:
        self._recorder = recorder
        self.path = path
        self._f: IO[str] | None = f
        self._in = _Splitter()
        self._out = _Splitter()
        # Which splitter holds host-to-controller bytes: input on a target, output on a host.
        self._h2c_is_input = role == "target"
        self.bytes_written = 0

    @property
    def recording(self) -> bool:
        return self._f is not None

    def received(self, data: Buffer) -> None:
        if self._f is not None:
            self._write(self._in.feed(data))

    def sent(self, out: list[Buffer]) -> None:
        if self._f is None:
            return
        splitter = self._out
        for buf in out:
            pdus = splitter.feed(buf)
            self._write(pdus)
            if self._f is None:
                return

    def _write(self, pdus: list[bytes] | None) -> None:
        if pdus is None:
            self.closed("the stream is not NVMe/TCP (a PDU length out of range)")
            return
        if not pdus:
            return
        ns = time.monotonic_ns()
        for raw in pdus:
            line = F.pdu_line(ns, raw) + "\n"
            why = self._recorder.charge(self, len(line))
            if why:
                self.closed(why)
                return
            assert self._f is not None
            try:
                self._f.write(line)
            except OSError as exc:
                self.closed(f"writing failed: {exc.strerror or exc}")
                return
            self.bytes_written += len(line)

    def closed(self, reason: str) -> None:
        f = self._f
        if f is None:
            return
        self._f = None
        try:
            if reason != "connection closed":
                level = logging.INFO if reason == RECORDING_STOPPED else logging.WARNING
                log.log(level, "recording %s stopped: %s", self.path, reason)
                f.write(F.end_line(time.monotonic_ns(), reason) + "\n")
            f.close()
        except OSError as exc:
            log.warning("recording %s: %s", self.path, exc.strerror or exc)
        self._recorder.tap_closed(self)


class Recorder:
    """A directory of recordings, one file per connection, within two caps: a file stops
    at `max_file_bytes` and all recording stops once the files written hold
    `max_total_bytes` (each time with a warning, and an end line in the file)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> None:
        if max_file_bytes <= 0 or max_total_bytes <= 0:
            raise ValueError("record caps must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.total_bytes = 0
        self.full = False
        self.connections = 0
        # File numbers go on after those already in the directory (an earlier recording):
        # a new file never overwrites one.
        self._last_number = max(
            (int(p.name[:6]) for p in self.directory.glob("*.jsonl") if p.name[:6].isdigit()),
            default=0,
        )
        self._open: set[StreamTap] = set()

    def open(self, role: str, local: str, peer: str) -> StreamTap | None:
        """A tap for a new connection; None once the directory's cap is reached."""
        if self.full:
            return None
        self.connections += 1
        self._last_number += 1
        number = self._last_number
        name = f"{number:06d}-{os.getpid()}-{peer.replace(':', '_').strip('[]')}.jsonl"
        path = self.directory / name
        header = F.header_line(
            role=role,
            connection=number,
            local=local,
            peer=peer,
            wall=datetime.now(UTC).isoformat(timespec="milliseconds"),
            monotonic_ns=time.monotonic_ns(),
        )
        try:
            f = open(path, "x", encoding="utf-8")  # noqa: SIM115 (closed by the tap)
            f.write(header + "\n")
        except OSError as exc:
            # The directory went away or filled up: no connection pays for it.
            self.full = True
            log.warning("recording to %s stopped: %s", self.directory, exc.strerror or exc)
            return None
        tap = StreamTap(self, path, f, role)
        self._open.add(tap)
        return tap

    def charge(self, tap: StreamTap, n: int) -> str:
        """Count `n` bytes about to be written to `tap`; why it must stop instead, or ""."""
        if self.full:
            return f"the recording directory's cap ({self.max_total_bytes} bytes) is reached"
        if tap.bytes_written + n > self.max_file_bytes:
            return f"the file's cap ({self.max_file_bytes} bytes) is reached"
        if self.total_bytes + n > self.max_total_bytes:
            self.full = True
            log.warning(
                "recording to %s stopped: %d bytes written, the cap",
                self.directory,
                self.total_bytes,
            )
            return f"the recording directory's cap ({self.max_total_bytes} bytes) is reached"
        self.total_bytes += n
        return ""

    def tap_closed(self, tap: StreamTap) -> None:
        self._open.discard(tap)

    def close(self, reason: str = "connection closed") -> None:
        """Close every file still open: the target stops (its connections close), or
        recording is stopped (`RECORDING_STOPPED`, written as the files' end)."""
        for tap in list(self._open):
            tap.closed(reason)
