"""fio's per-interval logs for `pynvmf bench`: --write_bw_log, --write_iops_log and
--write_lat_log NAME, to plot a run as fio's logs are plotted (fio_generate_plots,
gnuplot, a spreadsheet).

The files are named as fio names them: NAME_bw.N.log, NAME_iops.N.log, NAME_lat.N.log
and NAME_clat.N.log, N the job (1 to --numjobs). Each line is fio's, as fio writes it
without log_offset:

    time (ms since the job's measured start), value, data direction, block size, priority

with the value in KiB/s (bw), I/Os per second (iops) or nanoseconds (lat, clat), the
direction 0 for reads and 1 for writes (copies, in copy mode), and priority 0.

What differs from fio: pynvmf logs windowed averages, as fio does with log_avg_msec
(the block size column is then 0): a line per direction that completed I/Os in each
--log_avg_msec window (500 ms unless given). fio's default, a line per I/O, would put
a file write on every I/O's path. lat and clat are the same figure (pynvmf measures
no separate submission latency), so there is no slat log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from pynvmf.bench.loadgen import Measurement

DEFAULT_LOG_AVG_MSEC = 500


@dataclass(frozen=True, slots=True)
class LogNames:
    """The NAME of each log asked for (None: not asked for)."""

    bw: str | None = None
    iops: str | None = None
    lat: str | None = None

    def any(self) -> bool:
        return any((self.bw, self.iops, self.lat))


class _JobLogs:
    """One job's log files and where its last window ended."""

    def __init__(self, names: LogNames, job: int) -> None:
        self.files: dict[str, TextIO] = {}
        wanted = (("bw", names.bw), ("iops", names.iops), ("lat", names.lat), ("clat", names.lat))
        try:
            for kind, name in wanted:
                if name is not None:
                    self.files[kind] = open(f"{name}_{kind}.{job}.log", "w")  # noqa: SIM115
        except OSError:
            self.close()
            raise
        self.last_time: float | None = None
        self.last = ((0, 0), (0, 0))  # (count, total ns) of reads, writes

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class IntervalLogs:
    """The logs of every job; `run` writes them while the jobs run."""

    def __init__(
        self, names: LogNames, jobs: int, bytes_per_io: tuple[int, int], avg_msec: int
    ) -> None:
        self._bytes_per_io = bytes_per_io
        self._interval = avg_msec / 1000
        # Opened before the run: a log that cannot be written fails the command first.
        self._jobs: list[_JobLogs] = []
        try:
            for job in range(jobs):
                self._jobs.append(_JobLogs(names, job + 1))
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for logs in self._jobs:
            logs.close()

    def _window(self, logs: _JobLogs, m: Measurement, now: float) -> None:
        now_counts = ((m.reads.count, m.reads.total_ns), (m.writes.count, m.writes.total_ns))
        if logs.last_time is None:
            logs.last_time, logs.last = m.start, ((0, 0), (0, 0))
        spent = now - logs.last_time
        at = round((now - m.start) * 1000)
        for ddir in (0, 1):
            ios = now_counts[ddir][0] - logs.last[ddir][0]
            if ios <= 0 or spent <= 0:
                continue  # as fio: a direction with nothing in the window logs nothing
            latency = (now_counts[ddir][1] - logs.last[ddir][1]) // ios
            values = {
                "bw": int(ios * self._bytes_per_io[ddir] / 1024 / spent),
                "iops": int(ios / spent),
                "lat": latency,
                "clat": latency,
            }
            for kind, f in logs.files.items():
                f.write(f"{at}, {values[kind]}, {ddir}, 0, 0\n")
        logs.last_time, logs.last = now, now_counts

    async def run(
        self, live: Sequence[Measurement | None], runtime: float, stop: asyncio.Event
    ) -> None:
        """Write a window of every job whose measurement has started, each
        --log_avg_msec from its start, until its `runtime` is over or `stop` is set
        (what completes while the jobs drain is not measured, so not logged either)."""
        due: list[float | None] = [None] * len(self._jobs)
        while not stop.is_set():
            now = time.perf_counter()
            for j, m in enumerate(live):
                if m is None or now > m.start + runtime + self._interval / 2:
                    continue
                when = due[j]
                if when is None:
                    due[j] = when = m.start + self._interval
                if now >= when:
                    self._window(self._jobs[j], m, now)
                    # The next point of the job's grid: no drift over a long run.
                    steps = int((now - m.start) / self._interval) + 1
                    due[j] = m.start + steps * self._interval
            pending = [d for d in due if d is not None]
            wait = min(pending) - time.perf_counter() if pending else self._interval / 10
            await asyncio.sleep(max(0.001, wait))
