"""SPDK's own rpc.py (v25.09, installed from PyPI as `spdk-rpc`) drives pynvmf's target
unchanged: every SPDK method pynvmf implements, called as SPDK's users call it, with
pynvmf's host connected for the methods that report connections; save_config's output
loads back with rpc.py's load_config and with `pynvmf target --json`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.auth import DhchapKey
from pynvmf.host import NvmeAuthenticationError, connect
from pynvmf.host.errors import NvmeStatusError
from pynvmf.rpc.server import method_table
from pynvmf.spec.opcodes import IoOpcode
from tests.support.ceph_cluster import CephCluster
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

SPDK_RPC = Path(sys.executable).parent / "spdk-rpc"
NQN = "nqn.2016-06.io.spdk:cnode1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-000000000001"
UUID = "5b1a7c2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"
# A host that must authenticate (DH-HMAC-CHAP keys by keyring name).
AUTH_HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-0000000000a7"
TLS_HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-000000000002"
TLS_KEY = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"

# Every SPDK method the RPC server implements (pynvmf's own start with pynvmf_).
SPDK_METHODS = sorted(m for m in method_table().methods if not m.startswith("pynvmf_"))
called: set[str] = set()


class Spdk:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(SPDK_RPC), "-s", self.socket, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert result.returncode == 0, (
                f"rpc.py {' '.join(args)}:\n{result.stdout}{result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args).stdout)

    def library(self, function: str, **params: Any) -> Any:
        """spdk.rpc's `function` (module.name) called as a program using the library
        (Ceph's gateway) calls it, in a process of its own."""
        module, name = function.rsplit(".", 1)
        code = (
            "import json, sys\n"
            "from spdk.rpc.client import JSONRPCClient\n"
            f"from spdk.rpc.{module} import {name} as f\n"
            "client = JSONRPCClient(sys.argv[1])\n"
            "print(json.dumps(f(client, **json.loads(sys.argv[2]))))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, self.socket, json.dumps(params)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"spdk.rpc.{function}:\n{result.stdout}{result.stderr}"
        return json.loads(result.stdout)


def start(workdir: Path, *args: str) -> tuple[TargetProcess, Spdk]:
    workdir.mkdir(exist_ok=True)
    socket_path = str(workdir / "spdk.sock")
    proc = TargetProcess(None, workdir, [*args, "--rpc-socket", socket_path])
    proc.start()
    return proc, Spdk(socket_path)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TargetProcess, Spdk]]:
    proc, spdk = start(tmp_path, "--empty")
    yield proc, spdk
    if proc.alive:
        proc.stop()


async def tls_round_trip(port: int) -> None:
    """pynvmf's host over TLS 1.3 to the listener rpc.py made with --secure-channel."""
    async with await connect(
        "127.0.0.1", port, NQN, hostnqn=TLS_HOST, tls_psk=TLS_KEY, queues=1
    ) as ctrl:
        await ctrl.namespace(1).write(0, bytes(4096))


def hold_connection(port: int) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """pynvmf's host connected (two I/O queues) until `release` is set."""
    connected, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with await connect("127.0.0.1", port, NQN, hostnqn=HOST, queues=2) as ctrl:
            await ctrl.namespace(1).write(0, bytes(4096))
            connected.set()
            await asyncio.to_thread(release.wait, 60)

    thread = threading.Thread(target=lambda: asyncio.run(hold()), daemon=True)
    thread.start()
    assert connected.wait(30)
    return connected, release, thread


def test_rpc_py_drives_the_rbd_methods(
    served: tuple[TargetProcess, Spdk], ceph_cluster: CephCluster, rbd_image: Any
) -> None:
    """SPDK's bdev_rbd_* calls, as rpc.py sends them, on an image of the tests' Ceph
    cluster (tests/support/ceph_cluster.py); pynvmf's host writes and reads the namespace.
    Before the test below, which checks that every SPDK method was called."""
    _proc, spdk = served
    image = rbd_image(8 << 20)
    conf = str(ceph_cluster.conf)
    assert spdk.run("bdev_rbd_register_cluster", "c1", "--config-file", conf).stdout.strip()
    assert spdk.json("bdev_rbd_get_clusters_info", "-b", "c1") == {
        "cluster_name": "c1",
        "config_file": conf,
    }
    assert [c["cluster_name"] for c in spdk.json("bdev_rbd_get_clusters_info")] == ["c1"]
    # rpc.py 25.09's bdev_rbd_create command line fails on its own (it reads
    # args.read_only, its option is --readonly): SPDK's Python client library sends it.
    broken = spdk.run("bdev_rbd_create", "-c", "c1", "rbd", image, "4096", check=False)
    assert "read_only" in broken.stderr
    from spdk.rpc import bdev as spdk_bdev
    from spdk.rpc.client import JSONRPCClient

    client = JSONRPCClient(spdk.socket)
    try:
        name = spdk_bdev.bdev_rbd_create(
            client, pool_name="rbd", rbd_name=image, block_size=4096, cluster_name="c1"
        )
    finally:
        client.close()
    assert name == "Ceph0"
    (bdev,) = spdk.json("bdev_get_bdevs", "-b", "Ceph0")
    assert bdev["product_name"] == "Ceph Rbd Disk" and bdev["num_blocks"] == 2048
    assert bdev["driver_specific"]["rbd"]["rbd_name"] == image
    port = free_tcp_port()
    spdk.run("nvmf_create_transport", "-t", "TCP")
    spdk.run("nvmf_create_subsystem", NQN, "-a")
    spdk.run("nvmf_subsystem_add_ns", NQN, "Ceph0")
    spdk.run("nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", str(port))

    async def io() -> bytes:
        async with await connect("127.0.0.1", port, NQN) as ctrl:
            ns = ctrl.namespace(1)
            await ns.write(3, b"r" * 4096, fua=True)
            buf = bytearray(4096)
            await ns.read(3, memoryview(buf))
            return bytes(buf)

    assert asyncio.run(io()) == b"r" * 4096
    # rpc.py's bdev_rbd_resize NAME NEW_SIZE (MiB): the image grows, never shrinks.
    assert spdk.run("bdev_rbd_resize", "Ceph0", "16").stdout.strip() == "true"
    (bdev,) = spdk.json("bdev_get_bdevs", "-b", "Ceph0")
    assert bdev["num_blocks"] == 4096
    smaller = spdk.run("bdev_rbd_resize", "Ceph0", "8", check=False)
    assert smaller.returncode != 0 and "new_size" in smaller.stdout + smaller.stderr
    saved = json.loads(spdk.run("save_config").stdout)
    (bdev_subsystem,) = [s for s in saved["subsystems"] if s["subsystem"] == "bdev"]
    methods = [c["method"] for c in bdev_subsystem["config"]]
    assert methods == ["bdev_rbd_register_cluster", "bdev_rbd_create"]
    spdk.run("nvmf_delete_subsystem", NQN)
    assert spdk.run("bdev_rbd_unregister_cluster", "c1", check=False).returncode != 0  # in use
    spdk.run("bdev_rbd_delete", "Ceph0")
    spdk.run("bdev_rbd_unregister_cluster", "c1")
    called.update(
        {
            "bdev_rbd_register_cluster",
            "bdev_rbd_get_clusters_info",
            "bdev_rbd_create",
            "bdev_rbd_resize",
            "bdev_rbd_delete",
            "bdev_rbd_unregister_cluster",
        }
    )


def test_rpc_py_reads_bdev_notifications(
    served: tuple[TargetProcess, Spdk], tmp_path: Path
) -> None:
    """SPDK's notify_get_types and notify_get_notifications through rpc.py's command line:
    the bdevs created and deleted over RPC, then those a target started from a saved
    configuration (--json) created. Before the test below, which checks that every SPDK
    method was called."""
    _proc, spdk = served
    assert spdk.json("notify_get_types") == [
        "bdev_register",
        "bdev_unregister",
        "bdev_resize",
        "nvmf_keep_alive_timeout",
    ]
    assert spdk.json("notify_get_notifications") == []
    spdk.run("bdev_malloc_create", "-b", "Malloc0", "8", "512")
    spdk.run("bdev_malloc_create", "-b", "Malloc1", "8", "512")
    spdk.run("bdev_malloc_delete", "Malloc0")
    assert spdk.json("notify_get_notifications") == [
        {"type": "bdev_register", "ctx": "Malloc0", "id": 0},
        {"type": "bdev_register", "ctx": "Malloc1", "id": 1},
        {"type": "bdev_unregister", "ctx": "Malloc0", "id": 2},
    ]
    # A client that polls asks from the id after the last it saw, a few at a time.
    assert spdk.json("notify_get_notifications", "-i", "1", "-n", "1") == [
        {"type": "bdev_register", "ctx": "Malloc1", "id": 1}
    ]
    assert [n["id"] for n in spdk.json("notify_get_notifications", "-n", "2")] == [0, 1]
    assert spdk.json("notify_get_notifications", "-i", "3") == []
    called.update({"notify_get_types", "notify_get_notifications"})

    config = tmp_path / "saved.json"
    config.write_text(spdk.run("save_config").stdout)
    second, spdk2 = start(tmp_path / "second", "--json", str(config))
    try:
        assert spdk2.json("notify_get_notifications") == [
            {"type": "bdev_register", "ctx": "Malloc1", "id": 0}
        ]
    finally:
        second.stop()


def serve_two_bdevs(spdk: Spdk) -> int:
    """Malloc0 (8 MiB) as namespace 1 and Malloc1 as namespace 2 of NQN, on a new port."""
    port = free_tcp_port()
    spdk.run("bdev_malloc_create", "-b", "Malloc0", "8", "512")
    spdk.run("bdev_malloc_create", "-b", "Malloc1", "8", "512")
    spdk.run("nvmf_create_transport", "-t", "TCP")
    spdk.run("nvmf_create_subsystem", NQN, "-a")
    spdk.run("nvmf_subsystem_add_ns", NQN, "Malloc0", "-n", "1")
    spdk.run("nvmf_subsystem_add_ns", NQN, "Malloc1", "-n", "2")
    listen = ("-t", "tcp", "-a", "127.0.0.1", "-s", str(port), "-f", "ipv4")
    spdk.run("nvmf_subsystem_add_listener", NQN, *listen)
    return port


# What known_workload sends: I/O commands in all, and each bdev's iostat counts.
WORKLOAD_COMMANDS = 15
WORKLOAD_IOSTAT = {
    "Malloc0": {"bytes_read": 5 * 8192, "num_read_ops": 5, "bytes_written": 3 * 4096,
                "num_write_ops": 3, "bytes_unmapped": 0, "num_unmap_ops": 0,
                "bytes_copied": 0, "num_copy_ops": 0},
    "Malloc1": {"bytes_read": 2 * 512, "num_read_ops": 2, "bytes_written": 0,
                "num_write_ops": 0, "bytes_unmapped": 0, "num_unmap_ops": 1,
                "bytes_copied": 0, "num_copy_ops": 0},
}  # fmt: skip


async def known_workload(ctrl: Any) -> None:
    """WORKLOAD_COMMANDS commands: those WORKLOAD_IOSTAT counts, a Read that fails (past
    the end: not counted, as SPDK's bdev layer counts only successful I/O), and commands
    SPDK's iostat does not count (Write Zeroes, Flush)."""
    ns1, ns2 = ctrl.namespace(1), ctrl.namespace(2)
    for i in range(3):
        await ns1.write(i * 8, bytes(4096))
    for i in range(5):
        await ns1.read(i * 16, memoryview(bytearray(8192)))
    with pytest.raises(NvmeStatusError):
        await ctrl.io_command(IoOpcode.READ, 1, 16384, 0, 0, into=memoryview(bytearray(512)))
    for _ in range(2):
        await ns2.read(8, memoryview(bytearray(512)))
    await ns2.deallocate(0, 16)
    await ns1.write_zeroes(64, 8)
    await ns1.flush()
    await ns2.flush()


def iostat_counts(answer: dict[str, Any]) -> dict[str, dict[str, int]]:
    counts = {}
    for bdev in answer["bdevs"]:
        counts[bdev["name"]] = {k: bdev[k] for k in WORKLOAD_IOSTAT["Malloc0"]}
    return counts


IOSTAT_FIELDS = [
    "name",
    *WORKLOAD_IOSTAT["Malloc0"],
    *(f"{m}{op}_latency_ticks" for op in ("read", "write", "unmap", "copy")
      for m in ("", "max_", "min_")),
    "io_error",
]  # fmt: skip


def test_rpc_py_reads_iostat_and_poll_group_statistics(tmp_path: Path) -> None:
    """bdev_get_iostat, nvmf_get_stats, nvmf_subsystem_get_qpairs and thread_get_stats
    through rpc.py's command line after a known workload from pynvmf's host: exact counts
    per bdev, v25.09's fields in its order, SPDK's errors. Before the test below, which
    checks that every SPDK method was called. One process (--cores 1): the counts are
    there when the commands complete."""
    proc, spdk = start(tmp_path, "--empty", "--cores", "1")
    try:
        check_iostat_and_poll_group(spdk)
    finally:
        proc.stop()


def check_iostat_and_poll_group(spdk: Spdk) -> None:
    assert spdk.json("bdev_get_iostat")["bdevs"] == []
    port = serve_two_bdevs(spdk)
    connected, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with await connect("127.0.0.1", port, NQN, hostnqn=HOST, queues=2) as ctrl:
            await known_workload(ctrl)
            connected.set()
            await asyncio.to_thread(release.wait, 60)

    thread = threading.Thread(target=lambda: asyncio.run(hold()), daemon=True)
    thread.start()
    try:
        assert connected.wait(30)
        answer = spdk.json("bdev_get_iostat")
        assert answer["tick_rate"] == 1_000_000_000 and answer["ticks"] > 0
        assert [list(b) for b in answer["bdevs"]] == [IOSTAT_FIELDS, IOSTAT_FIELDS]
        assert iostat_counts(answer) == WORKLOAD_IOSTAT
        (one,) = spdk.json("bdev_get_iostat", "-b", "Malloc1")["bdevs"]
        assert one["name"] == "Malloc1" and one["num_read_ops"] == 2
        assert one["read_latency_ticks"] == 0 and one["io_error"] == {}

        qpairs = spdk.json("nvmf_subsystem_get_qpairs", NQN)
        assert [(q["qid"], q["thread"]) for q in qpairs] == [
            (0, "nvmf_tgt_poll_group_000"),
            (1, "nvmf_tgt_poll_group_000"),
            (2, "nvmf_tgt_poll_group_000"),
        ]
        stats = spdk.json("nvmf_get_stats")
        (group,) = stats["poll_groups"]
        assert stats["tick_rate"] == 1_000_000_000
        assert {k: v for k, v in group.items() if k != "transports"} == {
            "name": "nvmf_tgt_poll_group_000",
            "admin_qpairs": 1,
            "io_qpairs": 2,
            "current_admin_qpairs": 1,
            "current_io_qpairs": 2,
            "pending_bdev_io": 0,
            "completed_nvme_io": WORKLOAD_COMMANDS,
        }
        assert group["transports"][0]["trtype"] == "TCP"
        threads = spdk.json("thread_get_stats")
        (main,) = threads["threads"]
        assert threads["tick_rate"] == 1_000_000_000
        assert list(main) == [
            "name", "id", "cpumask", "busy", "idle",
            "active_pollers_count", "timed_pollers_count", "paused_pollers_count",
        ]  # fmt: skip
        assert main["name"] == "nvmf_tgt_poll_group_000" and main["id"] == 1
        assert main["busy"] > 0 and main["idle"] > 0 and int(main["cpumask"], 16) > 0
    finally:
        release.set()
        thread.join(30)

    # The queues gone, the counts stay; the namespace removed, its bdev keeps them.
    stats = spdk.json("nvmf_get_stats")
    assert stats["poll_groups"][0]["current_io_qpairs"] == 0
    assert stats["poll_groups"][0]["io_qpairs"] == 2
    spdk.run("nvmf_subsystem_remove_ns", NQN, "1")
    assert iostat_counts(spdk.json("bdev_get_iostat")) == WORKLOAD_IOSTAT
    # SPDK's errors: no such bdev (-ENODEV), per_channel without a name (-EINVAL).
    bad = spdk.run("bdev_get_iostat", "-b", "Nothing", check=False)
    assert bad.returncode != 0
    assert '"code": -19' in bad.stdout + bad.stderr and "No such device" in bad.stdout + bad.stderr
    bad = spdk.run("bdev_get_iostat", "-c", check=False)
    assert (
        '"code": -22' in bad.stdout + bad.stderr and "Invalid argument" in bad.stdout + bad.stderr
    )
    bad = spdk.run("bdev_get_iostat", "-b", "Malloc0", "-c", check=False)
    assert bad.returncode != 0 and "per_channel: " in bad.stdout + bad.stderr
    called.update({"bdev_get_iostat", "thread_get_stats"})


def test_rpc_py_reads_iostat_latency_ticks_with_latency_tracking(tmp_path: Path) -> None:
    """With `--latency-tracking`, bdev_get_iostat's latency ticks are each bdev's
    successful operations' device time (ns, tick_rate 10^9): sums, maxima and minima
    that agree with one another (one unmap: all three equal), none for operations that
    did not happen; reset_mode maxmin starts the extremes again and keeps the sums."""
    proc, spdk = start(tmp_path, "--empty", "--cores", "1", "--latency-tracking")
    try:
        port = serve_two_bdevs(spdk)

        async def workload() -> None:
            async with await connect("127.0.0.1", port, NQN, hostnqn=HOST, queues=2) as ctrl:
                await known_workload(ctrl)

        asyncio.run(workload())
        answer = spdk.json("bdev_get_iostat")
        bdevs = {b["name"]: b for b in answer["bdevs"]}
        assert iostat_counts(answer) == WORKLOAD_IOSTAT
        malloc0, malloc1 = bdevs["Malloc0"], bdevs["Malloc1"]
        for bdev, ops in ((malloc0, ("read", "write")), (malloc1, ("read", "unmap"))):
            for op in ("read", "write", "unmap", "copy"):
                total = bdev[f"{op}_latency_ticks"]
                most, least = bdev[f"max_{op}_latency_ticks"], bdev[f"min_{op}_latency_ticks"]
                if op not in ops:
                    assert (total, most, least) == (0, 0, 0), (bdev["name"], op)
                    continue
                n = bdev[f"num_{op}_ops"]
                assert 0 < least <= most <= total, (bdev["name"], op)
                assert least * n <= total <= most * n, (bdev["name"], op)
        one_unmap = (malloc1["unmap_latency_ticks"], malloc1["max_unmap_latency_ticks"],
                     malloc1["min_unmap_latency_ticks"])  # fmt: skip
        assert one_unmap[0] == one_unmap[1] == one_unmap[2]
        spdk.json("bdev_get_iostat", "-b", "Malloc1", "--reset-mode", "maxmin")
        (after,) = spdk.json("bdev_get_iostat", "-b", "Malloc1")["bdevs"]
        assert after["unmap_latency_ticks"] == one_unmap[0]
        assert after["read_latency_ticks"] == malloc1["read_latency_ticks"]
        assert after["max_unmap_latency_ticks"] == after["min_read_latency_ticks"] == 0
        (untouched,) = spdk.json("bdev_get_iostat", "-b", "Malloc0")["bdevs"]
        assert untouched == malloc0
    finally:
        proc.stop()


def test_rpc_py_reads_poll_groups_of_worker_processes(tmp_path: Path) -> None:
    """With --cores 2, nvmf_get_stats, thread_get_stats and nvmf_subsystem_get_qpairs
    name a poll group per process, and the workers' commands reach bdev_get_iostat and
    their groups' counts exactly (they report every half second at most)."""
    proc, spdk = start(tmp_path, "--empty", "--cores", "2")
    try:
        port = serve_two_bdevs(spdk)

        async def run() -> None:
            async with await connect("127.0.0.1", port, NQN, hostnqn=HOST, queues=2) as ctrl:
                await known_workload(ctrl)

        asyncio.run(run())
        names = [f"nvmf_tgt_poll_group_00{i}" for i in range(3)]
        deadline = 30.0
        while True:
            groups = spdk.json("nvmf_get_stats")["poll_groups"]
            assert [g["name"] for g in groups] == names
            workers_done = sum(g["completed_nvme_io"] for g in groups[1:])
            assert workers_done <= WORKLOAD_COMMANDS
            if workers_done == WORKLOAD_COMMANDS:
                break
            deadline -= 0.1
            assert deadline > 0, groups
            threading.Event().wait(0.1)
        main = groups[0]
        # The admin queue stayed here; the two I/O queues went to the workers.
        assert main["admin_qpairs"] == 1 and main["io_qpairs"] == 0
        assert main["completed_nvme_io"] == 0
        assert sum(g["io_qpairs"] for g in groups[1:]) == 2
        assert all(g["current_io_qpairs"] == 0 for g in groups)
        assert iostat_counts(spdk.json("bdev_get_iostat")) == WORKLOAD_IOSTAT
        threads = spdk.json("thread_get_stats")["threads"]
        assert [(t["name"], t["id"]) for t in threads] == [(n, i + 1) for i, n in enumerate(names)]
        assert all(t["busy"] > 0 for t in threads)
    finally:
        proc.stop()


def test_rpc_py_drives_every_spdk_method_pynvmf_implements(
    served: tuple[TargetProcess, Spdk], tmp_path: Path
) -> None:
    proc, spdk = served
    io_port, disc_port = free_tcp_port(), free_tcp_port()
    image = tmp_path / "aio.img"
    image.write_bytes(bytes(16 << 20))

    def note(*methods: str) -> None:
        called.update(methods)

    assert spdk.json("spdk_get_version")["version"].startswith("pynvmf v")
    methods = spdk.json("rpc_get_methods")
    assert set(SPDK_METHODS) <= set(methods)
    assert spdk.run("framework_wait_init").returncode == 0
    assert [s["subsystem"] for s in spdk.json("framework_get_subsystems")] == [
        "keyring",
        "bdev",
        "nvmf",
    ]
    note("spdk_get_version", "rpc_get_methods", "framework_wait_init", "framework_get_subsystems")

    spdk.run("nvmf_create_transport", "-t", "TCP", "-u", "8192", "-c", "8192", "-q", "128")
    (transport,) = spdk.json("nvmf_get_transports")
    assert transport["trtype"] == "TCP" and transport["in_capsule_data_size"] == 8192
    spdk.run("nvmf_set_max_subsystems", "-x", "64")
    spdk.run("nvmf_set_crdt", "-t1", "0", "-t2", "0", "-t3", "0")
    spdk.run("nvmf_set_config", "-d", "match_any")
    note("nvmf_create_transport", "nvmf_get_transports", "nvmf_set_max_subsystems")
    note("nvmf_set_crdt", "nvmf_set_config")

    assert spdk.run("bdev_malloc_create", "-b", "Malloc0", "64", "512").stdout.strip() == "Malloc0"
    assert spdk.run("bdev_aio_create", str(image), "Aio0", "4096").stdout.strip() == "Aio0"
    spdk.run("bdev_wait_for_examine")
    (malloc,) = spdk.json("bdev_get_bdevs", "-b", "Malloc0")
    assert malloc["num_blocks"] == 131072 and malloc["block_size"] == 512
    assert {b["name"] for b in spdk.json("bdev_get_bdevs")} == {"Malloc0", "Aio0"}
    note("bdev_malloc_create", "bdev_aio_create", "bdev_wait_for_examine", "bdev_get_bdevs")

    spdk.run(
        "nvmf_create_subsystem",
        NQN,
        "-s",
        "SPDK00000000000001",
        "-d",
        "SPDK Controller",
        "-m",
        "32",
    )
    spdk.run("nvmf_subsystem_add_ns", NQN, "Malloc0")
    spdk.run("nvmf_subsystem_add_ns", NQN, "Aio0", "-n", "5", "-u", UUID)
    spdk.run(
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        str(io_port),
        "-f",
        "ipv4",
    )
    spdk.run(
        "nvmf_subsystem_add_listener",
        "discovery",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        str(disc_port),
    )
    spdk.run("nvmf_subsystem_add_host", NQN, HOST)
    keys = {name: DhchapKey.generate(32) for name in ("key0", "key1", "ckey0")}
    for name, key in keys.items():
        path = tmp_path / f"{name}.txt"
        path.write_text(key.representation())
        path.chmod(0o600)
        spdk.run("keyring_file_add_key", name, str(path))
    spdk.run(
        "nvmf_subsystem_add_host",
        NQN,
        AUTH_HOST,
        "--dhchap-key",
        "key0",
        "--dhchap-ctrlr-key",
        "ckey0",
    )
    spdk.run(
        "nvmf_subsystem_set_keys",
        NQN,
        AUTH_HOST,
        "--dhchap-key",
        "key1",
        "--dhchap-ctrlr-key",
        "ckey0",
    )
    listed = spdk.json("keyring_get_keys")
    assert [(k["name"], k["path"]) for k in listed] == [
        (name, str(tmp_path / f"{name}.txt")) for name in keys
    ]
    assert not any(
        k.representation().split(":")[2][:12] in json.dumps(listed) for k in keys.values()
    )
    note("keyring_file_add_key", "keyring_get_keys", "nvmf_subsystem_set_keys")
    # TLS: a PSK in the keyring, a listener that requires TLS, a host that has the key.
    tls_port = free_tcp_port()
    keyfile = tmp_path / "psk.txt"
    keyfile.write_text(TLS_KEY + "\n")
    keyfile.chmod(0o600)
    spdk.run("keyring_file_add_key", "psk0", str(keyfile))
    spdk.run(
        "nvmf_subsystem_add_listener",
        NQN,
        *("-t", "tcp", "-a", "127.0.0.1", "-s", str(tls_port), "--secure-channel"),
    )
    spdk.run("nvmf_subsystem_add_host", NQN, TLS_HOST, "--psk", "psk0")
    (psk,) = [k for k in spdk.json("keyring_get_keys") if k["name"] == "psk0"]
    assert psk["path"] == str(keyfile) and psk["refcnt"] == 2
    spdk.run("nvmf_subsystem_allow_any_host", "-e", NQN)
    spdk.run("nvmf_subsystem_allow_any_host", "-d", NQN)
    note("nvmf_create_subsystem", "nvmf_subsystem_add_ns", "nvmf_subsystem_add_listener")
    note("nvmf_subsystem_add_host", "nvmf_subsystem_allow_any_host")

    discovery, sub = spdk.json("nvmf_get_subsystems")
    assert discovery["subtype"] == "Discovery" and sub["nqn"] == NQN
    assert not sub["allow_any_host"] and sub["hosts"] == [
        {"nqn": HOST},
        {"nqn": TLS_HOST, "psk": "psk0"},
        {"nqn": AUTH_HOST, "dhchap_key": "key1", "dhchap_ctrlr_key": "ckey0"},
    ]
    assert TLS_KEY.split(":")[2] not in json.dumps(spdk.json("nvmf_get_subsystems"))
    assert [(n["nsid"], n["bdev_name"]) for n in sub["namespaces"]] == [(1, "Malloc0"), (5, "Aio0")]
    assert sub["namespaces"][1]["uuid"] == UUID
    listeners = spdk.json("nvmf_subsystem_get_listeners", NQN)
    assert [x["address"]["trsvcid"] for x in listeners] == [str(io_port), str(tls_port)]
    note("nvmf_get_subsystems", "nvmf_subsystem_get_listeners")

    # ANA: rpc.py's own flags; the state shows in get_listeners and in save_config.
    listen = ["-t", "tcp", "-a", "127.0.0.1", "-s", str(io_port)]
    spdk.run(
        "nvmf_subsystem_listener_set_ana_state", NQN, "-n", "non_optimized", *listen, "-g", "1"
    )
    listener, tls_listener = spdk.json("nvmf_subsystem_get_listeners", NQN)
    assert listener["ana_states"] == [{"ana_group": 1, "ana_state": "non_optimized"}]
    assert tls_listener["address"]["trsvcid"] == str(tls_port)
    bad = spdk.run(
        "nvmf_subsystem_listener_set_ana_state", NQN, "-n", "optimized", *listen, "-g", "7",
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "anagrpid: " in bad.stdout + bad.stderr
    bad = spdk.run(
        "nvmf_subsystem_listener_set_ana_state", NQN, "-n", "asleep", *listen, check=False
    )
    assert bad.returncode != 0 and "ana_state: 'asleep'" in bad.stdout + bad.stderr
    note("nvmf_subsystem_listener_set_ana_state")

    _connected, release, thread = hold_connection(io_port)
    try:
        (ctrl,) = spdk.json("nvmf_subsystem_get_controllers", NQN)
        assert ctrl["hostnqn"] == HOST and ctrl["cntrltype"] == "io" and ctrl["num_io_qpairs"] == 3
        qpairs = spdk.json("nvmf_subsystem_get_qpairs", NQN)
        assert sorted(q["qid"] for q in qpairs) == [0, 1, 2]
        assert all(q["peer_address"]["traddr"] == "127.0.0.1" for q in qpairs)
        # A poll group per process: the main one and the workers that took the I/O queues.
        groups = spdk.json("nvmf_get_stats")["poll_groups"]
        assert sum(g["current_io_qpairs"] for g in groups) == 2
        assert [g["current_admin_qpairs"] for g in groups] == [1] + [0] * (len(groups) - 1)
        asyncio.run(tls_round_trip(tls_port))
        tls = spdk.json("nvmf_get_stats")["poll_groups"][0]["transports"][0]["tls"]
        assert tls["handshakes"] == 2 and tls["handshake_failures"] == 0
        assert tls["ktls_tx"] + tls["user_space_tx"] == 2
        note("nvmf_subsystem_get_controllers", "nvmf_subsystem_get_qpairs", "nvmf_get_stats")
    finally:
        release.set()
        thread.join(30)

    # Referrals, as rpc.py takes them; one to the target's own listener is refused.
    referral = ["-t", "tcp", "-a", "192.0.2.7", "-s", "4420", "-f", "ipv4"]
    spdk.run("nvmf_discovery_add_referral", *referral)
    spdk.run("nvmf_discovery_add_referral", *referral[:5], "4421", "-n", NQN, "-k")
    spdk.run("nvmf_discovery_add_referral", *referral[:5], "4422")
    spdk.run("nvmf_discovery_remove_referral", *referral[:5], "4422")
    assert spdk.json("nvmf_discovery_get_referrals") == [
        {
            "address": {
                "trtype": "TCP",
                "adrfam": "IPv4",
                "traddr": "192.0.2.7",
                "trsvcid": "4420",
            },
            "secure_channel": False,
            "subnqn": "nqn.2014-08.org.nvmexpress.discovery",
        },
        {
            "address": {
                "trtype": "TCP",
                "adrfam": "IPv4",
                "traddr": "192.0.2.7",
                "trsvcid": "4421",
            },
            "secure_channel": True,
            "subnqn": NQN,
        },
    ]
    bad = spdk.run("nvmf_discovery_add_referral", *listen, "-f", "ipv4", check=False)
    assert bad.returncode != 0 and "address.traddr: " in bad.stdout + bad.stderr
    assert len(spdk.json("nvmf_discovery_get_referrals")) == 2
    note("nvmf_discovery_add_referral", "nvmf_discovery_remove_referral")
    note("nvmf_discovery_get_referrals")

    # What Ceph's gateway calls: logging, and a namespace's ANA group.
    # rpc.py's own log_set_level command fails in v25.09 (its JSONRPCClient has a method
    # of that name, for the client's logging): call spdk.rpc.log as Ceph's gateway does.
    spdk.library("log.log_set_level", level="DEBUG")
    assert spdk.json("log_get_level") == "DEBUG"
    spdk.run("log_set_print_level", "NOTICE")
    assert spdk.json("log_get_print_level") == "NOTICE"
    spdk.run("log_set_flag", "nvmf_tcp")
    assert spdk.json("log_get_flags")["nvmf_tcp"] is True
    spdk.run("log_clear_flag", "nvmf_tcp")
    assert spdk.json("log_get_flags")["nvmf_tcp"] is False
    bad = spdk.run("log_set_flag", "no_such_flag", check=False)
    assert bad.returncode != 0 and "invalid log flag" in bad.stdout + bad.stderr
    bad = spdk.run("log_set_print_level", "LOUD", check=False)
    assert bad.returncode != 0 and "invalid log level" in bad.stdout + bad.stderr
    spdk.library("log.log_set_level", level="NOTICE")
    note("log_set_level", "log_get_level", "log_set_print_level", "log_get_print_level")
    note("log_set_flag", "log_get_flags", "log_clear_flag")
    spdk.run("nvmf_subsystem_set_ns_ana_group", NQN, "5", "2")
    (sub,) = spdk.json("nvmf_get_subsystems", NQN)
    assert [n["anagrpid"] for n in sub["namespaces"]] == [1, 2]
    bad = spdk.run("nvmf_subsystem_set_ns_ana_group", NQN, "9", "2", check=False)
    assert bad.returncode != 0 and "nsid: " in bad.stdout + bad.stderr
    note("nvmf_subsystem_set_ns_ana_group")

    # A namespace one host sees, and a file that grew: rpc.py's own arguments.
    spdk.run("bdev_malloc_create", "-b", "Hidden0", "8", "512")
    spdk.run("nvmf_subsystem_add_ns", NQN, "Hidden0", "-n", "7", "-i")
    spdk.run("nvmf_ns_add_host", NQN, "7", HOST)
    spdk.run("nvmf_ns_add_host", NQN, "7", AUTH_HOST)
    spdk.run("nvmf_ns_remove_host", NQN, "7", AUTH_HOST)
    (sub,) = spdk.json("nvmf_get_subsystems", NQN)
    (hidden,) = [n for n in sub["namespaces"] if n["nsid"] == 7]
    assert hidden["no_auto_visible"] is True and hidden["hosts"] == [{"nqn": HOST}]
    bad = spdk.run("nvmf_ns_add_host", NQN, "1", HOST, check=False)
    assert bad.returncode != 0 and "nsid: " in bad.stdout + bad.stderr
    os.truncate(image, 32 << 20)
    spdk.run("bdev_aio_rescan", "Aio0")
    (aio,) = spdk.json("bdev_get_bdevs", "-b", "Aio0")
    assert aio["num_blocks"] == (32 << 20) // 4096
    note("nvmf_ns_add_host", "nvmf_ns_remove_host", "bdev_aio_rescan")

    # Rate limits: an IOPS limit that is not a multiple of 1,000 is rounded up, as SPDK
    # rounds it; an unknown bdev is refused, naming the parameter.
    spdk.run("bdev_set_qos_limit", "Aio0", "--rw-ios-per-sec", "2500", "--w-mbytes-per-sec", "8")
    spdk.run("bdev_set_qos_limit", "Aio0", "--r-mbytes-per-sec", "4")
    spdk.run("bdev_set_qos_limit", "Aio0", "--r-mbytes-per-sec", "0")
    (aio,) = spdk.json("bdev_get_bdevs", "-b", "Aio0")
    assert aio["assigned_rate_limits"] == {
        "rw_ios_per_sec": 3000,
        "rw_mbytes_per_sec": 0,
        "r_mbytes_per_sec": 0,
        "w_mbytes_per_sec": 8,
    }
    bad = spdk.run("bdev_set_qos_limit", "Nope0", "--rw-ios-per-sec", "1000", check=False)
    assert bad.returncode != 0 and "name: " in bad.stdout + bad.stderr
    bad = spdk.run("bdev_set_qos_limit", "Aio0", check=False)
    assert bad.returncode != 0 and "rw_ios_per_sec" in bad.stdout + bad.stderr
    note("bdev_set_qos_limit")

    saved = spdk.run("save_config").stdout
    nvmf_only = json.loads(spdk.run("save_subsystem_config", "-n", "nvmf").stdout)
    by_name = {s["subsystem"]: s["config"] for s in json.loads(saved)["subsystems"]}
    assert nvmf_only["config"] == by_name["nvmf"]
    assert [c["params"]["name"] for c in by_name["keyring"]] == [*keys, "psk0"]
    assert not any(k.representation().split(":")[2][:12] in saved for k in keys.values())
    assert TLS_KEY.split(":")[2] not in saved
    referrals = [c for c in by_name["nvmf"] if c["method"] == "nvmf_discovery_add_referral"]
    assert [c["params"]["address"]["trsvcid"] for c in referrals] == ["4420", "4421"]
    # The limits in force, right after their bdev, as SPDK writes them.
    bdevs = by_name["bdev"]
    aio_at = next(i for i, c in enumerate(bdevs) if c["method"] == "bdev_aio_create")
    assert bdevs[aio_at + 1] == {
        "method": "bdev_set_qos_limit",
        "params": {"name": "Aio0", "rw_ios_per_sec": 3000, "w_mbytes_per_sec": 8},
    }
    note("framework_get_config")

    # The host with keys authenticates with the ones set last, and with no others.
    async def authenticated() -> None:
        async with await connect(
            "127.0.0.1",
            io_port,
            NQN,
            hostnqn=AUTH_HOST,
            dhchap_secret=keys["key1"],
            dhchap_ctrl_secret=keys["ckey0"],
        ) as ctrl:
            assert ctrl.authenticated_queues == {0, 1}
        with pytest.raises(NvmeAuthenticationError):
            await connect("127.0.0.1", io_port, NQN, hostnqn=AUTH_HOST, dhchap_secret=keys["key0"])

    asyncio.run(authenticated())

    # Bad input: an error response naming the parameter, and rpc.py fails.
    failed = spdk.run("nvmf_subsystem_add_ns", NQN, "Malloc9", check=False)
    assert failed.returncode != 0
    assert "namespace.bdev_name: no block device named 'Malloc9'" in failed.stdout + failed.stderr

    spdk.run(
        "nvmf_subsystem_remove_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", str(io_port)
    )
    spdk.run("nvmf_subsystem_remove_host", NQN, HOST)
    spdk.run("nvmf_subsystem_remove_host", NQN, AUTH_HOST)
    spdk.run("keyring_file_remove_key", "key0")
    failed = spdk.run("keyring_file_remove_key", "psk0", check=False)
    assert failed.returncode != 0 and "in use" in failed.stdout + failed.stderr
    spdk.run("nvmf_subsystem_remove_host", NQN, TLS_HOST)
    spdk.run("keyring_file_remove_key", "psk0")
    assert [k["name"] for k in spdk.json("keyring_get_keys")] == ["key1", "ckey0"]
    note("keyring_file_remove_key")
    spdk.run("nvmf_subsystem_remove_ns", NQN, "5")
    spdk.run("nvmf_delete_subsystem", NQN)
    spdk.run("bdev_malloc_delete", "Malloc0")
    spdk.run("bdev_malloc_delete", "Hidden0")
    spdk.run("bdev_aio_delete", "Aio0")
    assert spdk.json("bdev_get_bdevs") == []
    assert [s["nqn"] for s in spdk.json("nvmf_get_subsystems")] == [
        "nqn.2014-08.org.nvmexpress.discovery"
    ]
    note("nvmf_subsystem_remove_listener", "nvmf_subsystem_remove_host", "nvmf_subsystem_remove_ns")
    note("nvmf_delete_subsystem", "bdev_malloc_delete", "bdev_aio_delete")

    spdk.run("spdk_kill_instance", "SIGTERM")
    note("spdk_kill_instance")
    assert proc.wait() == 0, proc.stderr()  # it stops by itself
    assert called >= set(SPDK_METHODS), sorted(set(SPDK_METHODS) - called)

    # rpc.py load_config rebuilds it, on a fresh target, from what save_config wrote.
    fresh, spdk2 = start(tmp_path / "fresh", "--empty")
    try:
        spdk2.run("load_config", stdin=saved)
        assert json.loads(spdk2.run("save_config").stdout) == json.loads(saved)
    finally:
        fresh.stop()

    # So does nvmf_tgt --json's pynvmf counterpart.
    config = tmp_path / "saved.json"
    config.write_text(saved)
    second, spdk3 = start(tmp_path / "second", "--json", str(config))
    try:
        assert json.loads(spdk3.run("save_config").stdout) == json.loads(saved)

        async def io() -> None:
            async with await connect("127.0.0.1", io_port, NQN, hostnqn=HOST) as ctrl:
                assert sorted(ctrl.namespaces) == [1, 5, 7]  # 7: this host's alone

        asyncio.run(io())
    finally:
        second.stop()


def _error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON-RPC error rpc.py printed for a call that failed."""
    assert result.returncode != 0, result.stdout
    text = result.stdout + result.stderr
    start = text.rindex('"code"')
    return json.loads("{" + text[start : text.index("}", start)] + "}")


def test_rpc_py_subsystem_limits_and_secure_channel_as_spdk(
    served: tuple[TargetProcess, Spdk],
) -> None:
    """nvmf_create_subsystem's max_namespaces (SPDK's 32 when not given), min_cntlid and
    max_cntlid (1..FFEFh, min <= max), ana_reporting, and nvmf_subsystem_add_listener's
    secure_channel (refused while any host is allowed), as SPDK v25.09 answers them:
    the same codes, and nothing made by a refused call."""
    _proc, spdk = served
    io_port, tls_port = free_tcp_port(), free_tcp_port()
    spdk.run("nvmf_create_transport", "-t", "TCP")
    for args in (("-i", "0"), ("-I", "65520"), ("-i", "10", "-I", "5"), ("-i", "70000")):
        assert _error(spdk.run("nvmf_create_subsystem", NQN, *args, check=False))["code"] == -32602
    assert (
        _error(spdk.run("nvmf_create_subsystem", NQN, "-m", "4294967296", check=False))["code"]
        == -32602
    )
    assert spdk.json("nvmf_get_subsystems")[1:] == []  # none of them made
    spdk.run("nvmf_create_subsystem", NQN, "-i", "100", "-I", "199", "-r", "-a")
    spdk.run("nvmf_create_subsystem", NQN + "b", "-m", "2")
    made, two = spdk.json("nvmf_get_subsystems")[1:]
    assert (made["max_namespaces"], made["min_cntlid"], made["max_cntlid"]) == (32, 100, 199)
    assert two["max_namespaces"] == 2
    for i in range(3):
        spdk.run("bdev_malloc_create", "-b", f"M{i}", "1", "512")
    # NSIDs 1..32 without -m, as SPDK: 33 is refused, and so is a third namespace of two.
    assert (
        _error(spdk.run("nvmf_subsystem_add_ns", NQN, "M0", "-n", "33", check=False))["code"]
        == -32602
    )
    spdk.run("nvmf_subsystem_add_ns", NQN, "M0", "-n", "32")
    spdk.run("nvmf_subsystem_add_ns", NQN + "b", "M1")
    spdk.run("nvmf_subsystem_add_ns", NQN + "b", "M2")
    spdk.run("bdev_malloc_create", "-b", "M3", "1", "512")
    assert _error(spdk.run("nvmf_subsystem_add_ns", NQN + "b", "M3", check=False))["code"] == -32602

    # A secure channel while any host may connect: SPDK's refusal, no listener made.
    listen = ("-t", "tcp", "-a", "127.0.0.1", "-f", "ipv4")
    refused = spdk.run(
        "nvmf_subsystem_add_listener",
        NQN,
        *listen,
        "-s",
        str(tls_port),
        "--secure-channel",
        check=False,
    )
    assert _error(refused) == {
        "code": -32603,
        "message": "Cannot establish secure channel, when 'allow_any_host' is set",
    }
    assert spdk.json("nvmf_subsystem_get_listeners", NQN) == []
    spdk.run("nvmf_subsystem_allow_any_host", "-d", NQN)
    spdk.run("nvmf_subsystem_add_listener", NQN, *listen, "-s", str(tls_port), "--secure-channel")
    spdk.run("nvmf_subsystem_add_listener", NQN, *listen, "-s", str(io_port))
    spdk.run("nvmf_subsystem_add_host", NQN, HOST)
    saved = spdk.json("save_config")
    (nvmf,) = [s["config"] for s in saved["subsystems"] if s["subsystem"] == "nvmf"]
    creates = {
        c["params"]["nqn"]: c["params"] for c in nvmf if c["method"] == "nvmf_create_subsystem"
    }
    assert creates[NQN]["max_namespaces"] == 32 and creates[NQN + "b"]["max_namespaces"] == 2
    assert (creates[NQN]["min_cntlid"], creates[NQN]["max_cntlid"]) == (100, 199)
    listeners = {
        c["params"]["listen_address"]["trsvcid"]: c["params"]["secure_channel"]
        for c in nvmf
        if c["method"] == "nvmf_subsystem_add_listener" and c["params"]["nqn"] == NQN
    }
    assert listeners == {str(tls_port): True, str(io_port): False}

    async def identify() -> None:
        async with await connect("127.0.0.1", io_port, NQN, hostnqn=HOST, queues=1) as ctrl:
            info = await ctrl.identify_controller()
            assert info.nn == 32 and 100 <= ctrl.cntlid <= 199
            assert list(ctrl.namespaces) == [32]

    asyncio.run(identify())


@pytest.mark.skipif(
    importlib.util.find_spec("pyverbs") is not None, reason="pyverbs is installed here"
)
def test_rpc_py_creates_the_rdma_transport_and_an_rdma_listener_says_pyverbs_is_missing(
    served: tuple[TargetProcess, Spdk],
) -> None:
    """rpc.py's `nvmf_create_transport -t RDMA` needs no RDMA device; its
    `nvmf_subsystem_add_listener -t rdma` needs pyverbs, which this machine's Python has
    not: refused naming the field and the package, nothing applied, the target serving on.
    (The listener that opens is the RDMA guest's: tests/interop/test_linux_rdma_host.py.)"""
    proc, spdk = served
    spdk.run("nvmf_create_transport", "-t", "RDMA", "-c", "8192")
    rdma = [t for t in spdk.json("nvmf_get_transports") if t["trtype"] == "RDMA"]
    assert [t["in_capsule_data_size"] for t in rdma] == [8192]
    # The RDMA transport in every poll group's statistics, with no device yet.
    for group in spdk.json("nvmf_get_stats")["poll_groups"]:
        assert {"trtype": "RDMA", "pending_data_buffer": 0, "devices": []} in group["transports"]
    spdk.run("nvmf_create_subsystem", NQN, "-a")
    port = free_tcp_port()
    refused = spdk.run(
        "nvmf_subsystem_add_listener", NQN, "-t", "rdma", "-a", "127.0.0.1", "-s", str(port),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "listen_address.trtype: cannot listen on rdma:127.0.0.1:" in said, said
    assert "pyverbs" in said, said
    assert spdk.json("nvmf_subsystem_get_listeners", NQN) == []
    assert proc.alive
    # The same listener on TCP opens: the refusal left the subsystem as it was.
    spdk.run("nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-a", "127.0.0.1", "-s", str(port))
    [listener] = spdk.json("nvmf_subsystem_get_listeners", NQN)
    assert listener["address"]["trtype"] == "TCP"
