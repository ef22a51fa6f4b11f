"""A real Prometheus (Debian's `prometheus`) scrapes `pynvmf target --metrics-listen`
and answers PromQL about a known workload through its HTTP API: what a dashboard sees.

No sleep stands for a scrape: the test asks Prometheus's API until the answer it waits
for is there (each scrape every 200 ms makes it come), within a deadline."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import DEFAULT_NQN
from pynvmf.host import Controller, connect
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000d1"
DEADLINE_S = 60.0


class Prometheus:
    """A Prometheus server scraping one target every 200 ms, its data in `workdir`."""

    def __init__(self, workdir: Path, scrape_target: str) -> None:
        self.port = free_tcp_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
            "scrape_configs:\n  - job_name: pynvmf\n    static_configs:\n"
            f"      - targets: ['{scrape_target}']\n"
        )
        prometheus = shutil.which("prometheus")
        assert prometheus, "Debian's prometheus is missing: make system-deps"
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self) -> None:
        self.until(self._ready, "ready")

    def _ready(self) -> bool:
        try:
            return self._get("/-/ready")[0] == 200
        except OSError:  # not listening yet
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def value(self, promql: str) -> float | None:
        """The value of a query that names one series, or None while it has none."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def until(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: no {what} within {DEADLINE_S} s")
            time.sleep(0.1)  # the pace of asking, not a synchronisation

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[tuple[TargetProcess, str]]:
    metrics_port = free_tcp_port()
    proc = TargetProcess(
        None,
        tmp_path,
        [
            *("--listen", "127.0.0.1:0", "--discovery-port", "0", "--cores", "1"),
            *("--metrics-listen", f"127.0.0.1:{metrics_port}", "--latency-tracking"),
        ],
    )
    proc.start()
    yield proc, f"127.0.0.1:{metrics_port}"
    proc.stop()


def test_prometheus_scrapes_the_target_and_answers_promql(
    tmp_path: Path, target: tuple[TargetProcess, str]
) -> None:
    proc, metrics = target
    prometheus = Prometheus(tmp_path, metrics)
    try:
        prometheus.wait_ready()
        prometheus.until(
            lambda: prometheus.value('up{job="pynvmf"}') == 1, "successful scrape of the target"
        )

        async def run() -> None:
            ctrl: Controller
            async with await connect(
                proc.address, proc.port, DEFAULT_NQN, hostnqn=HOST, queues=2
            ) as ctrl:
                ns = ctrl.namespace(1)
                for i in range(9):
                    await ns.read(i * 8, memoryview(bytearray(4096)))
                # While the host is connected, Prometheus sees its connections.
                query = f'sum by (host) (pynvmf_connections{{host="{HOST}"}})'
                await asyncio.to_thread(
                    prometheus.until, lambda: prometheus.value(query) == 3, "host's connections"
                )

        asyncio.run(run())
        reads = f'pynvmf_subsystem_commands_total{{subsystem="{DEFAULT_NQN}",opcode="read"}}'
        prometheus.until(lambda: prometheus.value(reads) == 9, "9 reads")
        read_bytes = f'pynvmf_subsystem_bytes_total{{subsystem="{DEFAULT_NQN}",direction="read"}}'
        assert prometheus.value(read_bytes) == 9 * 4096
        # A rate over the samples Prometheus holds: the reads happened, so it is above 0.
        rate = f"rate({reads}[1m])"
        prometheus.until(lambda: (prometheus.value(rate) or 0) > 0, "a read rate")
        # The latency histogram (--latency-tracking): as many reads, and
        # PromQL's quantile of its buckets is a latency within them.
        timed = 'sum(pynvmf_command_latency_seconds_count{opcode="read"})'
        prometheus.until(lambda: prometheus.value(timed) == 9, "9 timed reads")
        p99 = (
            "histogram_quantile(0.99, sum by (le) "
            '(pynvmf_command_latency_seconds_bucket{opcode="read"}))'
        )
        assert 0 < (prometheus.value(p99) or 0) <= 10
    finally:
        prometheus.stop()
