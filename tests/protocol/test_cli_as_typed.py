"""The command line as a user with nvme-cli, SPDK rpc.py and fio habits types it: each
command runs as `python -m pynvmf ...` against a `pynvmf target` process, and the test
reads what the user reads (stdout, stderr, the exit status, the files written).

One section per row of issue 26 ("The command line speaks nvme-cli"): the host identity,
errors that name the problem, one meaning per letter, usage errors, help and progress.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynvmf.block.device import BlockDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = pytest.mark.timeout(180)

PUBLIC = "nqn.2024-11.dev.pynvmf:typed"
PRIVATE = "nqn.2024-11.dev.pynvmf:typed-private"
# The machine identity the tests give the commands through PYNVMF_NVME_CONFIG_DIR.
MACHINE_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:2b1e1ffa-26a3-4a8b-9c43-aa5d3c2a0001"
MACHINE_HOSTID = "2b1e1ffa-26a3-4a8b-9c43-aa5d3c2a0002"
OTHER_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:2b1e1ffa-26a3-4a8b-9c43-aa5d3c2a0003"
MiB = 1 << 20


class TargetCommand:
    """A `pynvmf target` process: PUBLIC (any host; namespaces 1 of 8 MiB, 2 of 1 MiB in
    4 KiB blocks) and PRIVATE (MACHINE_HOSTNQN only), a discovery port, an RPC socket."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_tcp_port()
        self.discovery_port = free_tcp_port()
        self.rpc_socket = str(workdir / "rpc.sock")
        config = {
            "ports": [{"address": "127.0.0.1", "port": self.port}],
            "discovery_ports": [{"address": "127.0.0.1", "port": self.discovery_port}],
            "subsystems": [
                {
                    "nqn": PUBLIC,
                    "namespaces": [
                        {"nsid": 1, "memory": "8M"},
                        {"nsid": 2, "memory": "1M", "block_size": 4096},
                    ],
                },
                {"nqn": PRIVATE, "hosts": [MACHINE_HOSTNQN], "namespaces": [{"memory": "1M"}]},
            ],
        }
        self.process = TargetProcess(config, workdir, ["--rpc-socket", self.rpc_socket])

    def at(self, nqn: str = PUBLIC) -> list[str]:
        return ["-a", "127.0.0.1", "-s", str(self.port), "--nqn", nqn]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TargetCommand]:
    started = TargetCommand(tmp_path_factory.mktemp("typed-target"))
    started.process.start()
    yield started
    started.process.stop()


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, str]:
    """An environment whose /etc/nvme (PYNVMF_NVME_CONFIG_DIR) holds MACHINE_HOSTNQN and
    MACHINE_HOSTID, as `nvme gen-hostnqn` and the nvme-cli package leave them."""
    etc = tmp_path / "etc-nvme"
    etc.mkdir()
    (etc / "hostnqn").write_text(MACHINE_HOSTNQN + "\n")
    (etc / "hostid").write_text(MACHINE_HOSTID + "\n")
    return {"PYNVMF_NVME_CONFIG_DIR": str(etc), "XDG_STATE_HOME": str(tmp_path / "state")}


def pynvmf(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`pynvmf ARGV...` as a user runs it; `env` adds to the test session's environment."""
    return subprocess.run(
        [sys.executable, "-m", "pynvmf", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- 1. the host identity is the machine's -----------------------------------------------------


def test_the_machines_hostnqn_reaches_a_subsystem_restricted_to_it(
    target: TargetCommand, machine: dict[str, str]
) -> None:
    # What `--allow-host "$(cat /etc/nvme/hostnqn)"` set up: no -q needed.
    done = pynvmf("list", *target.at(PRIVATE), env=machine)
    assert done.returncode == 0, done.stderr
    assert f"Subsystem {PRIVATE}" in done.stdout
    # discover shows this host everything it may reach, the private subsystem included.
    found = pynvmf("discover", "-a", "127.0.0.1", "-s", str(target.discovery_port), env=machine)
    assert f"subnqn:  {PRIVATE}\n" in found.stdout


def test_libnvmes_environment_variables_name_the_host(
    target: TargetCommand, machine: dict[str, str]
) -> None:
    env = {**machine, "LIBNVME_HOSTNQN": OTHER_HOSTNQN}
    done = pynvmf("list", *target.at(PRIVATE), env=env)
    assert done.returncode == 1
    assert f"host {OTHER_HOSTNQN} (from $LIBNVME_HOSTNQN) is not allowed" in one_line(done.stderr)


def test_without_etc_nvme_an_identity_is_stored_once_and_reported(
    target: TargetCommand, tmp_path: Path
) -> None:
    env = {"PYNVMF_NVME_CONFIG_DIR": str(tmp_path / "none"), "XDG_STATE_HOME": str(tmp_path)}
    stored = tmp_path / "pynvmf" / "hostnqn"
    first = pynvmf("list", *target.at(), env=env)
    assert first.returncode == 0, first.stderr
    hostnqn = stored.read_text().strip()
    assert re.fullmatch(r"nqn\.2014-08\.org\.nvmexpress:uuid:[0-9a-f-]{36}", hostnqn)
    report = one_line(first.stderr)
    assert f"this host is {hostnqn} from now on" in report
    assert f"stored in {stored}" in report and "nvme gen-hostnqn" in report
    # The next command is the same host, and says nothing about it.
    second = pynvmf("id-ctrl", *target.at(PRIVATE), env=env)
    assert second.returncode == 1
    assert one_line(second.stderr) == (
        f"pynvmf id-ctrl: host {hostnqn} (from {stored}) is not allowed on subsystem "
        f"'{PRIVATE}' at 127.0.0.1:{target.port} (-q/--hostnqn connects as another host)"
    )


def test_q_overrides_the_machines_identity(target: TargetCommand, machine: dict[str, str]) -> None:
    done = pynvmf("list", *target.at(PRIVATE), "-q", OTHER_HOSTNQN, env=machine)
    assert done.returncode == 1
    assert f"host {OTHER_HOSTNQN} (from -q/--hostnqn) is not allowed" in one_line(done.stderr)


def test_a_broken_etc_nvme_hostnqn_is_named(target: TargetCommand, tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "hostnqn").write_text("not an nqn\n")
    done = pynvmf("list", *target.at(), env={"PYNVMF_NVME_CONFIG_DIR": str(etc)})
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"pynvmf list: {etc / 'hostnqn'}: host NQN 'not an nqn' is not valid: contains a space "
        "or a control character"
    )


# -- 2. errors that name the problem ----------------------------------------------------------


def test_a_mistyped_subsystem_nqn_names_it_and_the_command_that_lists_what_is(
    target: TargetCommand,
) -> None:
    typo = PUBLIC.replace("typed", "tpyed")
    done = pynvmf("list", *target.at(typo))
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"pynvmf list: subsystem '{typo}' is not served at 127.0.0.1:{target.port} "
        f"(`pynvmf discover -a 127.0.0.1 -s {target.port}` lists what is)"
    )
    # ... and that command does list it.
    listed = pynvmf("discover", "-a", "127.0.0.1", "-s", str(target.port))
    assert f"subnqn:  {PUBLIC}\n" in listed.stdout


@pytest.fixture
def ssh_like_port() -> Iterator[int]:
    """A port whose server speaks first, as sshd does, and never NVMe/TCP."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
                conn.settimeout(30)
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    server.close()
    thread.join(timeout=10)


def test_a_port_that_does_not_speak_nvme_tcp_fails_at_once_with_the_address_once(
    ssh_like_port: int,
) -> None:
    done = pynvmf("list", "-a", "127.0.0.1", "-s", str(ssh_like_port), "--nqn", PUBLIC)
    assert done.returncode == 1
    # The words come from what the port sent (its first eight bytes, the common header it
    # would have been), not from a timeout running out.
    assert one_line(done.stderr) == (
        f"pynvmf list: cannot connect to 127.0.0.1 port {ssh_like_port}: not an NVMe/TCP "
        "port: it answered the ICReq with 'SSH-2.0-', not an ICResp"
    )


# -- 3. one letter, one meaning ------------------------------------------------------------------


def test_n_is_the_namespace_id_as_in_nvme_id_ns(target: TargetCommand) -> None:
    done = pynvmf("id-ns", *target.at(), "-n", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("NVME Identify Namespace 2:\n")
    assert f"nsze    : {MiB // 4096:#x}\n" in done.stdout


def test_nvme_connects_n_gets_told_the_nqn_is_nqn(target: TargetCommand) -> None:
    address = ["-a", "127.0.0.1", "-s", str(target.port)]
    done = pynvmf("id-ns", *address, "-n", PUBLIC)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: pynvmf id-ns ")
    assert (
        f"pynvmf id-ns: error: argument -n/--namespace-id: '{PUBLIC}' is not a namespace ID: "
        "-n is --namespace-id, as in nvme id-ns, read and write; the subsystem NQN is --nqn "
        "(nvme connect's -n)\n"
    ) in done.stderr
    done = pynvmf("list", *address, "-n", PUBLIC)
    assert done.returncode == 2
    assert "pynvmf list: hint: the subsystem NQN is --nqn (nvme connect's -n)" in done.stderr


def test_block_count_is_zeroes_based_as_nvme_clis(target: TargetCommand, tmp_path: Path) -> None:
    data = os.urandom(3 * 512)
    (tmp_path / "in.bin").write_bytes(data)
    wrote = pynvmf("write", *target.at(), "--start-block", "64", "-d", str(tmp_path / "in.bin"))
    assert wrote.returncode == 0 and wrote.stderr == "write: Success\n", wrote.stderr
    # -c 2: three blocks, as `nvme read -c 2` reads.
    read = subprocess.run(
        [sys.executable, "-m", "pynvmf", "read", *target.at(), "--start-block", "64", "-c", "2"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert read.returncode == 0 and read.stdout == data
    by_size = pynvmf("read", *target.at(), "--start-block", "64", "-z", "1K", "-d", "/dev/null")
    assert by_size.returncode == 0


def test_id_ctrl_and_id_ns_take_nvme_clis_h(target: TargetCommand) -> None:
    ctrl = pynvmf("id-ctrl", *target.at(), "-H")
    assert ctrl.returncode == 0, ctrl.stderr
    assert "oncs      : " in ctrl.stdout
    assert "  [8:8] : 0x1\tCopy Supported\n" in ctrl.stdout  # pynvmf serves Copy
    assert "  [0:0] : 0x1\tMore than one port in the NVM subsystem: Yes\n" in ctrl.stdout
    ns = pynvmf("id-ns", *target.at(), "-n", "2", "--human-readable")
    assert "LBA Format  0 : Metadata Size: 0   bytes - Data Size: 4096 bytes" in ns.stdout


def test_copys_q_is_the_host_nqn_and_quiet_is_spelled_out(
    target: TargetCommand, tmp_path: Path
) -> None:
    source = f"nvme://127.0.0.1:{target.port}/{PUBLIC}/1@0+8"
    done = pynvmf("copy", "-q", source, str(tmp_path / "out.img"))
    assert done.returncode == 2
    assert "pynvmf copy: hint: -q is --hostnqn, as in nvme connect; no progress bar" in done.stderr
    quiet = pynvmf("copy", "--quiet", source, str(tmp_path / "out.img"))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    host = pynvmf("copy", "-q", OTHER_HOSTNQN, source, str(tmp_path / "out2.img"))
    assert host.returncode == 0, host.stderr


def test_an_option_given_twice_is_refused(target: TargetCommand) -> None:
    done = pynvmf("id-ns", *target.at(), "-n", "1", "--namespace-id", "2")
    assert done.returncode == 2
    assert (
        "pynvmf id-ns: error: argument -n/--namespace-id: given twice (-n 1, then "
        "--namespace-id 2): give it once"
    ) in done.stderr


# -- 4. usage errors from the right parser -------------------------------------------------------


def test_an_unknown_option_of_a_subcommand_prints_that_subcommands_usage(
    target: TargetCommand,
) -> None:
    done = pynvmf("id-ctrl", *target.at(), "--vendor-specific")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: pynvmf id-ctrl ")
    assert "pynvmf id-ctrl: error: unrecognized arguments: --vendor-specific\n" in done.stderr


def test_option_prefixes_are_not_options() -> None:
    done = pynvmf("target", "--mem", "16M")
    assert done.returncode == 2
    assert "pynvmf target: error: unrecognized arguments: --mem 16M" in done.stderr


def test_a_bad_size_is_a_usage_error_not_a_configuration_error() -> None:
    done = pynvmf("target", "--memory", "10X")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: pynvmf target ")
    assert (
        "pynvmf target: error: argument --memory: not a size: '10X' (e.g. 4096, 64K, 1M, 2GiB)"
    ) in done.stderr


def test_one_size_grammar_copy_takes_1mb(target: TargetCommand, tmp_path: Path) -> None:
    out = tmp_path / "one.img"
    done = pynvmf("copy", f"nvme://127.0.0.1:{target.port}/{PUBLIC}/1@0+1MB", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size == MiB
    assert done.stdout.startswith("copied 1048576 bytes (1.0 MiB)")


def test_rpc_takes_rpc_pys_positionals(target: TargetCommand) -> None:
    server = ["--server", target.rpc_socket]
    made = pynvmf("rpc", *server, "bdev_malloc_create", "-b", "Typed0", "64", "512")
    assert (made.returncode, made.stdout, made.stderr) == (0, '"Typed0"\n', "")
    bdev = json.loads(pynvmf("rpc", *server, "bdev_get_bdevs", "name=Typed0").stdout)[0]
    assert (bdev["num_blocks"], bdev["block_size"]) == (64 * MiB // 512, 512)
    # rpc.py's usage error, in the method's own usage.
    short = pynvmf("rpc", *server, "bdev_malloc_create", "-b", "Typed1", "64")
    assert short.returncode == 2
    assert "usage: pynvmf rpc bdev_malloc_create [-h] [-b NAME] [-u UUID]" in short.stderr
    # A method without rpc.py's arguments here: what it takes instead.
    other = pynvmf("rpc", *server, "bdev_get_bdevs", "-b", "Typed0")
    assert other.returncode == 1
    assert "'-b' is not a parameter: KEY=TEXT, KEY:=JSON or one {JSON} object" in other.stderr
    # rpc.py's -s is the server; here it is spelled out.
    letter = pynvmf("rpc", "-s", target.rpc_socket, "bdev_get_bdevs")
    assert letter.returncode == 2
    assert "pynvmf rpc: hint: the RPC server is --server (rpc.py's -s)" in letter.stderr


# -- 5. help, progress and logs --------------------------------------------------------------


def test_target_help_describes_the_command_and_every_option() -> None:
    done = pynvmf("target", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())  # as wide as the terminal: compare words
    assert "Serve NVMe/TCP until SIGINT or SIGTERM." in text
    assert "--block-size {512,4096} logical block size of the namespaces the options add " in text
    # Every option has its help (tests/unit/test_cli_parser.py checks every command's).
    assert "--discovery-port PORT discovery-only port on each listen address" in text


def test_bench_help_shows_defaults() -> None:
    text = " ".join(pynvmf("bench", "--help").stdout.split())
    assert "--bs SIZE block size (default 4096)" in text
    assert "--runtime SECONDS measured time (default 10)" in text
    assert "--rw {randread,randwrite,read,write,randrw,copy} I/O pattern (default randread)" in text
    assert "--bwavgtime MS bandwidth sampling interval (default 500)" in text


def test_bench_progress_shows_percentage_and_eta(target: TargetCommand) -> None:
    # stderr on a terminal, as a user's: the progress line is drawn only there.
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pynvmf", "bench", *target.at(), "--runtime", "1.5"],
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, "no progress output"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the command closed its terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    frames = [f for f in seen.decode().split("\r") if f.startswith("[")]
    assert frames, seen
    assert re.match(r"\[ *\d+\.\d%\] +\d+\.\ds ETA +\d+\.\ds +\d+ IOPS +\d+\.\d MB/s", frames[0])
    assert "Run status group 0" in out


def test_bench_status_interval_and_fios_logs(target: TargetCommand, tmp_path: Path) -> None:
    name = str(tmp_path / "run")
    done = pynvmf(
        "bench", *target.at(), "--rw", "randrw", "--runtime", "2", "--numjobs", "2",
        "--status-interval", "0.5", "--log_avg_msec", "250",
        "--write_bw_log", name, "--write_lat_log", name, "--write_iops_log", name,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The reports so far, then the final one.
    assert done.stdout.count("Run status group 0 (all jobs):") >= 2
    line = re.compile(r"(\d+), (\d+), ([01]), 0, 0")
    for job in (1, 2):
        for kind in ("bw", "iops", "lat", "clat"):
            rows = (tmp_path / f"run_{kind}.{job}.log").read_text().splitlines()
            parsed = [line.fullmatch(row) for row in rows]
            assert rows and all(parsed), (kind, rows)
            directions = {m.group(3) for m in parsed if m}
            assert directions == {"0", "1"}, (kind, rows)
            times = [int(m.group(1)) for m in parsed if m]
            # Windows of the measured 2 s only (bench.fio_logs stops half a window after).
            assert times == sorted(times) and times[-1] <= 2125


def test_discover_shows_the_generation_counter_and_it_counts(target: TargetCommand) -> None:
    where = ["-a", "127.0.0.1", "-s", str(target.discovery_port)]
    header = re.compile(r"^Discovery Log Number of Records (\d+), Generation counter (\d+)$", re.M)
    before = header.search(pynvmf("discover", *where).stdout)
    assert before is not None
    gen = "nqn.2024-11.dev.pynvmf:gen"
    server = ["--server", target.rpc_socket]
    assert pynvmf("rpc", *server, "nvmf_create_subsystem", gen, "-a").returncode == 0
    added = pynvmf(
        "rpc", *server, "nvmf_subsystem_add_listener", gen,
        "-t", "tcp", "-a", "127.0.0.1", "-s", str(target.port),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    after = header.search(pynvmf("discover", *where).stdout)
    assert after is not None
    assert int(after.group(1)) == int(before.group(1)) + 1
    assert int(after.group(2)) > int(before.group(2))
    listing = json.loads(pynvmf("discover", *where, "-o", "json").stdout)
    assert listing["genctr"] == int(after.group(2))


# -- against a target in this process, whose namespace misbehaves on purpose -----------------


class _InProcessTarget:
    """A pynvmf Target on its own loop in a thread, serving PUBLIC with `device` as
    namespace 1, for the command (a subprocess) to connect to."""

    def __init__(self, device: BlockDevice) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> Target:
            subsystem = Subsystem(PUBLIC)
            subsystem.add_namespace(Namespace.create(PUBLIC, 1, device, "test"))
            started = Target([subsystem], [Port("127.0.0.1", 0)])
            await started.start()
            return started

        self.target = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.port = self.target.ports[0].port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.target.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


class _Gated(MemoryDevice):
    """Holds every read at or past GATE_LBA until `opened` is set (on the target's loop);
    `reached` is set when the first one arrives."""

    GATE_LBA = 1024  # 512 KiB in: the first 16 chunks of 32 KiB pass

    def __init__(self) -> None:
        super().__init__(4 * MiB, 512)
        self.reached = threading.Event()
        self.opened: asyncio.Event | None = None

    async def read(self, lba: int, buf: memoryview) -> None:
        if lba >= self.GATE_LBA:
            if self.opened is None:
                self.opened = asyncio.Event()
            self.reached.set()
            await self.opened.wait()
        await super().read(lba, buf)


def test_an_interrupted_copy_leaves_the_file_as_long_as_the_data_copied(tmp_path: Path) -> None:
    device = _Gated()
    server = _InProcessTarget(device)
    out = tmp_path / "copy.img"
    try:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "pynvmf", "copy", "--chunk", "32K", "--depth", "2",
                f"nvme://127.0.0.1:{server.port}/{PUBLIC}/1", str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert device.reached.wait(60), "the copy never got to the gate"
        # The copy made the file full size to start with, as it must to write out of order.
        assert out.stat().st_size == 4 * MiB
        proc.send_signal(signal.SIGINT)
        opened = device.opened
        assert opened is not None
        server.loop.call_soon_threadsafe(opened.set)  # the reads in flight finish
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        server.stop()
    assert proc.returncode == 130, stderr
    size = out.stat().st_size
    # Every chunk before the gate arrived; the file ends with them, not at 4 MiB.
    assert _Gated.GATE_LBA * 512 <= size < 4 * MiB and size % (32 * 1024) == 0
    assert stdout.startswith("cancelled: copied ")
    assert stdout.rstrip().endswith(
        f"; {out} cut to {size} bytes, the end of the data copied without a gap"
    )


class _Failing(MemoryDevice):
    """Reads of block 8 fail, as a disk's unreadable sector does."""

    async def read(self, lba: int, buf: memoryview) -> None:
        if lba <= 8 < lba + memoryview(buf).nbytes // 512:
            raise OSError(errno.EIO, "unreadable")
        await super().read(lba, buf)


def test_a_bench_error_is_words_not_a_python_repr() -> None:
    server = _InProcessTarget(_Failing(MiB, 512))
    try:
        done = pynvmf(
            "bench", "-a", "127.0.0.1", "-s", str(server.port), "--nqn", PUBLIC,
            "--rw", "read", "--bs", "4k", "--runtime", "5",
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"pynvmf bench: job0: read at LBA 8: READ failed: \w+ \(SCT 0x\d SC 0x[0-9a-f]{2}.*\)",
        last,
    ), done.stderr
    assert "Error(" not in done.stderr and "Traceback" not in done.stderr
