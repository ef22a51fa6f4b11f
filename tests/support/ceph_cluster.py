"""A throwaway Ceph cluster for the tests: one monitor and one memstore OSD.

Started from Debian's packages (ceph-mon, ceph-osd, ceph-common) by hand, without
systemd: every file lives under one temporary directory, the monitor listens on two
loopback ports chosen free (never the default 3300/6789, which a parallel job or a
real cluster may hold), the OSD picks its own ports, and the daemons run in the
foreground as children that the kernel kills when the process that started them ends
(however it ends). Bring-up takes ~5-10 s on a 2-core machine.

The OSD keeps its objects in memory (memstore): nothing survives the cluster, which
is what a test wants, and the OSD's RSS grows with the data written (keep images to
a few hundred MiB).

Monitor commands go through the `rados` binding (a connected admin client) rather
than the `ceph` CLI: each CLI call is a Python start-up of its own.

Run by hand for benchmarks or experiments::

    .venv/bin/python -m tests.support.ceph_cluster  # prints the ceph.conf path; Ctrl-C stops it
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

POOL = "rbd"
START_TIMEOUT = 60.0


class CephError(RuntimeError):
    pass


def have_ceph() -> bool:
    """The daemons and the Python bindings are all installed."""
    try:
        import rados  # noqa: F401
        import rbd  # noqa: F401
    except ImportError:
        return False
    return all(shutil.which(b) for b in ("ceph-mon", "ceph-osd", "ceph-authtool", "monmaptool"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(d: Path, fsid: str, mon_addrs: str) -> str:
    return f"""[global]
fsid = {fsid}
mon host = {mon_addrs}
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon data = {d}/mon
osd data = {d}/osd$id
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 2147483648
# The monitor's disk-space warnings and checks make no sense for a test's temp dir.
mon data avail warn = 1
mon data avail crit = 0
# One daemon of each: no need for the monitor to wait for peers or for out-marking.
mon osd down out interval = 0
osd pool default pg autoscale mode = off
[mon]
admin socket = {d}/run/$name.asok
[osd]
admin socket = {d}/run/$name.asok
osd op num shards = 1
osd op num threads per shard = 2
[client]
# A request the cluster never answers fails after this long instead of blocking its
# thread for ever: a test's own rados call on the main thread cannot be interrupted by
# pytest-timeout, and one stuck request once held a CI run until its limit. Well above
# anything a test means to wait (a frozen OSD is thawed within seconds).
rados osd op timeout = 120
rados mon op timeout = 120
"""


class CephCluster:
    """`start()` brings the cluster up; `stop()` kills its daemons and removes its files."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._own_dir = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="pynvmf-ceph-"))
        self.conf = self.dir / "ceph.conf"
        self.pool = POOL
        self.mon_port = 0
        self.mon_host = ""
        self._admin: Any = None
        self._pids: dict[str, int] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self.startup_seconds = 0.0

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> CephCluster:
        # The daemons outlive whoever started them: stop them however that ends (short
        # of SIGKILL).
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start(self) -> None:
        d = self.dir
        for sub in ("mon", "osd0", "run", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        # Free now, taken by the monitor a moment later: the same small race every test
        # server here accepts (free_tcp_port); a collision fails the bring-up loudly.
        v2, v1 = _free_port(), _free_port()
        self.mon_port = v2
        addrs = f"[v2:127.0.0.1:{v2},v1:127.0.0.1:{v1}]"
        self.mon_host = addrs
        self.conf.write_text(_conf(d, fsid, addrs))
        c = str(self.conf)
        keyring = str(d / "keyring")
        self._run(
            "ceph-authtool",
            "--create-keyring",
            keyring,
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        )
        self._run(
            "ceph-authtool",
            keyring,
            "--gen-key",
            "-n",
            "client.admin",
            "--cap",
            "mon",
            "allow *",
            "--cap",
            "osd",
            "allow *",
            "--cap",
            "mgr",
            "allow *",
        )
        self._run("monmaptool", "--create", "--addv", "a", addrs, "--fsid", fsid, str(d / "monmap"))
        self._run(
            "ceph-mon",
            "-c",
            c,
            "--mkfs",
            "-i",
            "a",
            "--monmap",
            str(d / "monmap"),
            "--keyring",
            keyring,
        )
        self._daemon("mon.a", "ceph-mon", "-c", c, "-i", "a")

        admin = self.admin()
        osd_uuid = str(uuid.uuid4())
        osd_id = int(self.mon_command({"prefix": "osd new", "uuid": osd_uuid}).strip() or 0)
        osd_keyring = str(d / f"osd{osd_id}" / "keyring")
        (d / f"osd{osd_id}").mkdir(exist_ok=True)
        self._run(
            "ceph-authtool", "--create-keyring", osd_keyring, "--gen-key", "-n", f"osd.{osd_id}"
        )
        key = self._run("ceph-authtool", osd_keyring, "-p", "-n", f"osd.{osd_id}").strip()
        self.mon_command(
            {
                "prefix": "auth add",
                "entity": f"osd.{osd_id}",
                "caps": ["osd", "allow *", "mon", "allow profile osd"],
            },
            inbuf=f"[osd.{osd_id}]\n\tkey = {key}\n".encode(),
        )
        self._run(
            "ceph-osd",
            "-c",
            c,
            "-i",
            str(osd_id),
            "--mkfs",
            "--osd-uuid",
            osd_uuid,
            "--keyring",
            osd_keyring,
        )
        self._daemon(
            f"osd.{osd_id}", "ceph-osd", "-c", c, "-i", str(osd_id), "--keyring", osd_keyring
        )
        self.osd_name = f"osd.{osd_id}"
        self.wait_osd_up()
        self.mon_command(
            {"prefix": "osd pool create", "pool": self.pool, "pg_num": 8, "pgp_num": 8}
        )
        self.mon_command({"prefix": "osd pool application enable", "pool": self.pool, "app": "rbd"})
        # The first I/O waits for the PGs to peer; do it here, not in a test's timing.
        with admin.open_ioctx(self.pool) as io:
            io.write_full("pynvmf-ceph-ready", b"ok")

    def wait_osd_up(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            stat = json.loads(self.mon_command({"prefix": "osd stat", "format": "json"}))
            if stat.get("num_up_osds", 0) >= 1:
                return
            if time.monotonic() > deadline:
                raise CephError(f"the OSD is not up after {timeout} s: {stat}")
            time.sleep(0.2)  # polling the monitor: the OSD's boot has no other signal

    def stop(self) -> None:
        """Kill the daemons, then remove the directory. SIGKILL: a memstore cluster has
        nothing to save, and the OSD's orderly exit takes seconds."""
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.shutdown()
            self._admin = None
        for name in list(self._pids):
            self._pids.pop(name)
        for proc in self._procs:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._procs.clear()
        for pid_file in (self.dir / "run").glob("*.pid") if self.dir.exists() else ():
            with contextlib.suppress(ValueError, OSError):
                _kill(int(pid_file.read_text().strip()))
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def __enter__(self) -> CephCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use --------------------------------------------------------------------------------

    def pid(self, name: str) -> int:
        return self._pids[name]

    def freeze(self, name: str, timeout: float = 10.0) -> None:
        """SIGSTOP daemon `name` and return once every one of its threads has stopped.
        kill() returns when the signal is sent; each thread stops only when it next runs,
        and on a loaded machine one may still answer a request sent meanwhile."""
        pid = self._pids[name]
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise CephError(f"{name} did not stop within {timeout} s of SIGSTOP")
            time.sleep(0.002)  # polling the threads' states: the stop has no other signal

    def thaw(self, name: str) -> None:
        os.kill(self._pids[name], signal.SIGCONT)

    def admin(self) -> Any:
        """The connected client.admin (shared; the caller must not shut it down)."""
        if self._admin is None:
            import rados

            cl = rados.Rados(conffile=str(self.conf))
            cl.connect(timeout=30)
            self._admin = cl
        return self._admin

    def client(self, **conf: str) -> Any:
        """A new connected client.admin of its own (the caller shuts it down)."""
        import rados

        cl = rados.Rados(conffile=str(self.conf), conf=conf or None)
        cl.connect(timeout=30)
        return cl

    def mon_command(self, cmd: dict[str, Any], inbuf: bytes = b"") -> str:
        ret, out, err = self.admin().mon_command(json.dumps(cmd), inbuf, timeout=30)
        if ret != 0:
            raise CephError(f"{cmd['prefix']}: {err} (errno {-ret})")
        return out.decode()

    def blocklist(self, addr: str) -> None:
        self.mon_command({"prefix": "osd blocklist", "blocklistop": "add", "addr": addr})

    def create_image(self, name: str, size: int) -> None:
        import rbd

        with self.admin().open_ioctx(self.pool) as io:
            rbd.RBD().create(
                io,
                name,
                size,
                old_format=False,
                features=rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK,
            )

    def remove_image(self, name: str) -> None:
        import rbd

        with self.admin().open_ioctx(self.pool) as io:
            rbd.RBD().remove(io, name)

    # -- internals ------------------------------------------------------------------------

    def _run(self, *argv: str) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise CephError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def _daemon(self, name: str, *argv: str) -> None:
        """Start a daemon in the foreground as our child, killed by the kernel when the
        process that started it ends, however it ends: a test run killed by a timeout or
        SIGKILL (where atexit does not run) left daemonised clusters behind, one per run.
        setpriv (util-linux) sets the parent-death signal without a preexec_fn, which is
        unsafe once librados' threads run in this process."""
        with open(self.dir / "log" / f"{name}.stderr", "wb") as err:
            proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", *argv, "-f"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self._procs.append(proc)
        self._pids[name] = proc.pid

    def diagnosis(self, lines: int = 40) -> str:
        """Which daemons still run and the end of each one's log: for a failed test's
        report. Reads files only, so it answers even when the cluster does not."""
        out: list[str] = []
        names = {pid: name for name, pid in self._pids.items()}
        for proc in self._procs:
            state = "running" if proc.poll() is None else f"exited {proc.returncode}"
            out.append(f"{names.get(proc.pid, proc.args)} (pid {proc.pid}): {state}")
        log_dir = self.dir / "log"
        for log in sorted(log_dir.glob("*")) if log_dir.exists() else ():
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                if tail:
                    out += [f"--- {log.name} (last {len(tail)} lines)", *tail]
        return "\n".join(out)


def _all_threads_stopped(pid: int) -> bool:
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that just ended
        if state not in ("T", "t"):
            return False
    return True


def _kill(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL `pid` and wait (up to `timeout`) until it is gone: a daemon named by a
    pid file, which need not be our child, so there is no wait(): poll for its end."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


if __name__ == "__main__":
    with CephCluster() as cluster:
        print(f"cluster up in {cluster.startup_seconds:.1f} s; conf: {cluster.conf}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
