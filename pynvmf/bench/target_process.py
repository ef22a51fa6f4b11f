"""A pynvmf target in a child process, pinned to one CPU: what benchmarks measure.

The target gets a core of its own, so that the measuring host (this process,
usually pinned to another core) neither steals its CPU nor shares its event
loop. It serves one subsystem with one in-memory namespace on 127.0.0.1 and an
ephemeral port, with the TransportConfig given (in-capsule size, digests the
target accepts, ...).

    with start_target(cpu=0, transport=TransportConfig(inline_data_size=4096)) as target:
        asyncio.run(run_remote("127.0.0.1", target.port, target.nqn, Workload()))
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
from collections.abc import Iterable
from multiprocessing.connection import Connection
from types import TracebackType

from pynvmf.aio import install_uvloop
from pynvmf.malloc import tune_for_io_buffers
from pynvmf.tcp.target import TransportConfig

BENCH_NQN = "nqn.2024-01.org.pynvmf:bench"
GiB = 1024**3


class TargetProcess:
    """A running target; `stop()` (or leaving the `with` block) ends it."""

    def __init__(
        self,
        process: multiprocessing.process.BaseProcess,
        conn: Connection,
        port: int,
        uvloop: bool,
        nqn: str,
        cpu: int | None,
        transport: TransportConfig,
    ) -> None:
        self._process = process
        self._conn = conn
        self.port = port
        self.uvloop = uvloop  # whether the target's event loop is uvloop's
        self.nqn = nqn
        self.cpu = cpu
        self.transport = transport
        self.address = "127.0.0.1"
        # With tls_psks: the ports that take TLS, by kTLS policy ("auto", "off").
        self.tls_ports: dict[str, int] = {}

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None
        return pid

    def cpu_seconds(self) -> float:
        """User + system CPU time the target has used so far (for CPU load figures)."""
        return process_cpu_seconds(self.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the target to stop (it closes its connections), wait, then insist."""
        with contextlib.suppress(OSError):
            self._conn.send("stop")
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._conn.close()

    def __enter__(self) -> TargetProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_target(
    *,
    cpu: int | None = 0,
    size: int = 1 * GiB,
    block_size: int = 512,
    transport: TransportConfig | None = None,
    nqn: str = BENCH_NQN,
    fill: bool = False,
    use_uvloop: bool = True,
    timeout: float = 30.0,
    tls_psks: dict[str, str] | None = None,
    busy_poll_us: int = 0,
) -> TargetProcess:
    """Start a target serving a `size`-byte memory namespace (NSID 1) and return once it
    listens. `cpu`: the CPU to pin it to (None: not pinned). `fill`: write pseudo-random
    data over the whole namespace first (in the child, without the network), so that
    reads copy real pages rather than the shared zero page. `tls_psks` (host NQN: PSK in
    the interchange format): the hosts that may connect with TLS, on two more ports that
    allow TLS (``tls_ports``: one may move records into the kernel, one keeps them in user
    space)."""
    transport = transport or TransportConfig()
    # spawn, not fork: the child must not inherit this process's event loop or threads.
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    process = ctx.Process(
        target=_child_main,
        args=(
            child_end,
            cpu,
            size,
            block_size,
            transport,
            nqn,
            fill,
            use_uvloop,
            tls_psks,
            busy_poll_us,
        ),
        name="pynvmf-bench-target",
        daemon=True,
    )
    process.start()
    child_end.close()
    try:
        if not parent_end.poll(timeout):
            raise RuntimeError(f"the target did not start within {timeout} s")
        try:
            port, uvloop, tls_ports = parent_end.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(
                f"the target process exited while starting (exit code {process.exitcode})"
            ) from None
    except BaseException:
        process.terminate()
        process.join()
        parent_end.close()
        raise
    started = TargetProcess(process, parent_end, port, uvloop, nqn, cpu, transport)
    started.tls_ports = tls_ports
    return started


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds(cpus: Iterable[int]) -> float:
    """Seconds the given CPUs have spent busy (not idle or waiting for I/O), by anyone,
    from /proc/stat (Linux): with the host's and target's own CPU time, this tells how
    much other work shared the benchmark's CPUs."""
    wanted = {f"cpu{n}" for n in cpus}
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name in wanted:
                # user nice system idle iowait irq softirq steal ...
                values = [int(v) for v in fields[:8]]
                busy += sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


# -- the child ----------------------------------------------------------------------------


def _child_main(
    conn: Connection,
    cpu: int | None,
    size: int,
    block_size: int,
    transport: TransportConfig,
    nqn: str,
    fill: bool,
    use_uvloop: bool,
    tls_psks: dict[str, str] | None = None,
    busy_poll_us: int = 0,
) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    tune_for_io_buffers()  # as `pynvmf target` does
    uvloop = install_uvloop() if use_uvloop else False
    asyncio.run(
        _serve(conn, size, block_size, transport, nqn, fill, uvloop, tls_psks, busy_poll_us)
    )


async def _serve(
    conn: Connection,
    size: int,
    block_size: int,
    transport: TransportConfig,
    nqn: str,
    fill: bool,
    uvloop: bool,
    tls_psks: dict[str, str] | None = None,
    busy_poll_us: int = 0,
) -> None:
    from pynvmf.block.memory import MemoryDevice
    from pynvmf.target.port import Port, SecureChannelPolicy
    from pynvmf.target.subsystem import Namespace, Subsystem
    from pynvmf.target.target import Target

    device = MemoryDevice(size, block_size)
    if fill:
        chunk = memoryview(os.urandom(1024 * 1024))
        step = chunk.nbytes // block_size
        for lba in range(0, device.capabilities.num_blocks, step):
            n = min(step, device.capabilities.num_blocks - lba)
            await device.write(lba, chunk[: n * block_size])
    subsystem = Subsystem(nqn)
    subsystem.add_namespace(Namespace.create(nqn, 1, device, "bench-memory"))
    port = Port("127.0.0.1", 0, transport=transport)
    tls_ports = {
        policy: Port(
            "127.0.0.1",
            0,
            transport=transport,
            secure_channel=SecureChannelPolicy.OPTIONAL,
            ktls=policy,
        )
        for policy in (("auto", "off") if tls_psks else ())
    }
    target = Target([subsystem], [port, *tls_ports.values()], busy_poll_us=busy_poll_us)
    await target.start()
    for hostnqn, psk in (tls_psks or {}).items():
        target.add_host(nqn, hostnqn, psk=psk)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)  # any message, or EOF (the parent died), means stop
    conn.send((port.port, uvloop, {k: p.port for k, p in tls_ports.items()}))
    await stop.wait()
    loop.remove_reader(conn.fileno())
    await target.stop()
