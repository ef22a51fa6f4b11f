"""Load generation and measurement: the engine of benchmarks/ and of the
`pynvmf bench` command (fio-like).

- `loadgen`: `Workload`, `run_workload(device, workload)` for any BlockDevice,
  `run_remote(address, port, nqn, workload)`, results with IOPS, MB/s and latency
  percentiles per direction.
- `target_process`: `start_target(...)`, a target in a child process pinned to a CPU.
- `microbench`: per-call timing of small functions (CRC32C).
- `report`: the command, machine and software a result came from; Markdown tables.
- `pynvmf bench`'s parts (the command itself, its options and exit status, is
  pynvmf.cli.bench): `run` (one run: the jobs on their queues, and what runs beside them),
  `jobs` (the plan, the read/write and copy jobs, the prefill), `job_device` (the queue
  each job drives), `verify` (--verify's expected data), `job_result` (what a job
  measured, and their sum), `fio_report` (fio's JSON and text report), `fio_logs` (fio's
  per-interval log files), `progress` (the progress line), `interrupt` (Ctrl-C).
"""

from pynvmf.bench.loadgen import (
    PERCENTILES,
    RW_MODES,
    BenchResult,
    ConnectOptions,
    LatencyHistogram,
    LatencyStats,
    OpResult,
    Summary,
    Workload,
    merge_results,
    prefill,
    remote_namespace,
    run_interleaved,
    run_remote,
    run_workload,
    summarize,
)
from pynvmf.bench.target_process import (
    BENCH_NQN,
    TargetProcess,
    busy_cpu_seconds,
    start_target,
)

__all__ = [
    "BENCH_NQN",
    "PERCENTILES",
    "RW_MODES",
    "BenchResult",
    "ConnectOptions",
    "LatencyHistogram",
    "LatencyStats",
    "OpResult",
    "Summary",
    "TargetProcess",
    "Workload",
    "busy_cpu_seconds",
    "merge_results",
    "prefill",
    "remote_namespace",
    "run_interleaved",
    "run_remote",
    "run_workload",
    "start_target",
    "summarize",
]
