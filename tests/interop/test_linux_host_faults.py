"""Fault rules (docs/faults.md) against the Linux kernel's NVMe/TCP host under QEMU: what
a host developer uses them for, checked end to end with the host's own recovery.

- a Write held past the host's I/O timeout: the host gives up on the queue, resets the
  controller, reconnects, sends the Write again and fio's verify pass still matches;
- a retryable status with Command Retry Delay: the host (which enabled ACRE because
  CRDT1 is set) waits CRDT1 before it retries, and the write succeeds;
- the connection closed after N commands: the host reconnects and fio's verify passes;
- on the wire: a wrong data digest on some Reads (the host fails the Read with a transfer
  error and retries it: fio's verify matches, nothing wrong is read); a C2HTermReq (the
  host starts error recovery and reconnects), as after a wrong header digest or a malformed
  PDU (an undefined type, a wrong HLEN; a wrong PLEN the host does not check); a lost R2T
  and a Read stalled halfway (the host's I/O timeout runs, it resets and reconnects, and
  sends the command again).

The rules are added over the RPC while the host is connected, as a developer would."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pynvmf.rpc.client import RpcClient
from tests.interop.test_linux_host import DEV_FOR
from tests.support.guest import NEWEST, Guest
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = NEWEST.mark()

MIB = 1 << 20
TIMEOUT = "nqn.2024-11.dev.pynvmf:faults-timeout"
RETRY = "nqn.2024-11.dev.pynvmf:faults-retry"
CLOSE = "nqn.2024-11.dev.pynvmf:faults-close"
DDGST = "nqn.2024-11.dev.pynvmf:faults-ddgst"
TERM = "nqn.2024-11.dev.pynvmf:faults-term"
R2T = "nqn.2024-11.dev.pynvmf:faults-r2t"
STALL = "nqn.2024-11.dev.pynvmf:faults-stall"
HDGST = "nqn.2024-11.dev.pynvmf:faults-hdgst"
MALFORMED = "nqn.2024-11.dev.pynvmf:faults-malformed"
# CRDT1 in 100 ms units: what the host waits before it retries a command completed with
# CRD 1.
CRDT1 = 30
# The host's I/O timeout for the timeout test (seconds), and how long the Write is held.
IO_TIMEOUT_S = 3
HELD_MS = 60_000


@dataclass
class Served:
    process: TargetProcess
    socket: str
    port: int

    def call(self, method: str, **params: Any) -> Any:
        with RpcClient(self.socket) as rpc:
            return rpc.call(method, params)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("linux-host-faults")
    port = free_tcp_port()
    config = {
        "ports": [{"address": "127.0.0.1", "port": port}],
        "discovery_ports": [],
        "crdt": [CRDT1, 0, 0],
        "subsystems": [
            {"nqn": nqn, "namespaces": [{"nsid": 1, "memory": 32 * MIB}]}
            for nqn in (TIMEOUT, RETRY, CLOSE, DDGST, TERM, R2T, STALL, HDGST, MALFORMED)
        ],
    }
    socket_path = str(workdir / "rpc.sock")
    proc = TargetProcess(config, workdir, ["--cores", "1", "--rpc-socket", socket_path])
    proc.start()
    yield Served(proc, socket_path, port)
    proc.stop()


@pytest.fixture(scope="module")
def guest(served: Served, linux_peer: Any) -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR}, peer=linux_peer)
    g.start()
    yield g
    g.stop()


def _connect(guest: Guest, served: Served, nqn: str, options: str = "") -> str:
    # A reconnect a second after a failure, not the default 10: the tests wait for it.
    guest.run(
        f"nvme connect -t tcp -a {Guest.host_address} -s {served.port} -n {nqn} "
        f"--reconnect-delay=1 --ctrl-loss-tmo=120 {options}"
    )
    return guest.run(f"sh /usr/local/bin/dev-for {nqn}").output.strip()


def _disconnect(guest: Guest, nqn: str) -> None:
    guest.run(f"nvme disconnect -n {nqn}", check=False)


def _fio_verify(
    guest: Guest, dev: str, *, size_mib: int = 4, bs: int = 4096, timeout: float = 300
) -> None:
    # SIGPIPE ignored: a connection the target closes may make the host's send, done in
    # fio's own context, raise it in fio (seen once: "fio: got signal=13" mid-verify).
    result = guest.run(
        f"trap '' PIPE; fio --name=verify --filename={dev} --ioengine=libaio --direct=1 "
        f"--rw=randwrite --bs={bs} --size={size_mib}m --iodepth=8 "
        "--verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=json",
        timeout=timeout,
    )
    report = json.loads(result.output[result.output.index("{") :])
    (job,) = report["jobs"]
    assert job["error"] == 0
    assert job["write"]["io_bytes"] == size_mib * MIB
    assert job["read"]["io_bytes"] == size_mib * MIB


def _hits(served: Served, rule_id: int) -> int:
    (rule,) = [r for r in served.call("pynvmf_fault_list") if r["id"] == rule_id]
    return int(rule["hits"])


def _new_kernel_lines(guest: Guest, since: int) -> str:
    lines = guest.run("dmesg").output.splitlines()
    return "\n".join(lines[since:])


def _kernel_lines(guest: Guest) -> int:
    return len(guest.run("dmesg").output.splitlines())


def test_a_write_held_past_the_io_timeout_is_sent_again_after_a_reset(
    guest: Guest, served: Served
) -> None:
    # The timeout of request queues made from now on (nvme_core's io_timeout parameter).
    old = guest.run("cat /sys/module/nvme_core/parameters/io_timeout").output.strip()
    guest.run(f"echo {IO_TIMEOUT_S} > /sys/module/nvme_core/parameters/io_timeout")
    try:
        dev = _connect(guest, served, TIMEOUT)
    finally:
        guest.run(f"echo {old} > /sys/module/nvme_core/parameters/io_timeout")
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="delay",
        subsystem=TIMEOUT,
        opcode="write",
        delay_ms=HELD_MS,
        limit=1,
    )
    try:
        began = time.monotonic()
        _fio_verify(guest, dev)
        took = time.monotonic() - began
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        # The host waited for its timeout, not for the Write: the reset sent it again.
        assert took < HELD_MS / 1000, (took, kernel)
        assert re.search(r"timeout", kernel, re.IGNORECASE), kernel
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, TIMEOUT)


def test_a_retryable_status_with_crd_is_retried_after_crdt(guest: Guest, served: Served) -> None:
    dev = _connect(guest, served, RETRY)
    rule = served.call(
        "pynvmf_fault_add",
        action="status",
        subsystem=RETRY,
        opcode="write",
        sct=0,
        sc=0x82,  # Namespace Not Ready: retryable
        crd=1,
        limit=1,
    )
    try:
        guest.run("dd if=/dev/urandom of=/tmp/retry bs=4096 count=4 2>/dev/null")
        began = time.monotonic()
        guest.run(f"dd if=/tmp/retry of={dev} bs=16384 count=1 seek=10 oflag=direct 2>/dev/null")
        took = time.monotonic() - began
        assert _hits(served, rule) == 1
        assert took >= CRDT1 / 10, took  # the host waited CRDT1 before its retry
        guest.run(
            f"dd if={dev} of=/tmp/back bs=16384 count=1 skip=10 iflag=direct 2>/dev/null"
            " && cmp /tmp/retry /tmp/back"
        )
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, RETRY)


def test_a_connection_closed_after_n_commands_reconnects_and_verifies(
    guest: Guest, served: Served
) -> None:
    dev = _connect(guest, served, CLOSE)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add", action="close", subsystem=CLOSE, queue="io", after=200, limit=1
    )
    try:
        _fio_verify(guest, dev)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, CLOSE)


# -- on the wire (tcp/wire_faults.py) ------------------------------------------------------


def _connect_with_short_timeout(guest: Guest, served: Served, nqn: str) -> str:
    """Connected with an I/O timeout of IO_TIMEOUT_S (nvme_core's io_timeout applies to the
    request queues made while it is set)."""
    old = guest.run("cat /sys/module/nvme_core/parameters/io_timeout").output.strip()
    guest.run(f"echo {IO_TIMEOUT_S} > /sys/module/nvme_core/parameters/io_timeout")
    try:
        return _connect(guest, served, nqn)
    finally:
        guest.run(f"echo {old} > /sys/module/nvme_core/parameters/io_timeout")


def test_a_data_digest_error_on_reads_is_retried_and_nothing_wrong_is_read(
    guest: Guest, served: Served
) -> None:
    dev = _connect(guest, served, DDGST, "--data-digest")
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="corrupt_digest",
        digest="data",
        subsystem=DDGST,
        opcode="read",
        probability=0.05,
        seed=7,
    )
    try:
        _fio_verify(guest, dev)
        hits = _hits(served, rule)
        assert hits > 0
        kernel = _new_kernel_lines(guest, since)
        # nvme_tcp_recv_ddgst: the Read ends with a Data Transfer Error, which nvme-core
        # retries (no DNR); the connection stays up.
        assert kernel.count("data digest error") == hits, kernel
        assert not re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, DDGST)


def test_a_term_req_makes_the_host_reconnect_and_io_goes_on(guest: Guest, served: Served) -> None:
    dev = _connect(guest, served, TERM)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add", action="term_req", subsystem=TERM, queue="io", after=200, limit=1
    )
    try:
        _fio_verify(guest, dev)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, TERM)


def test_a_lost_r2t_times_out_and_the_write_is_sent_again(guest: Guest, served: Served) -> None:
    dev = _connect_with_short_timeout(guest, served, R2T)
    since = _kernel_lines(guest)
    # 64 KiB Writes: more than the port's in-capsule size, so their data comes on R2T.
    rule = served.call(
        "pynvmf_fault_add", action="drop_r2t", subsystem=R2T, opcode="write", after=10, limit=1
    )
    try:
        _fio_verify(guest, dev, bs=65536)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert re.search(r"timeout", kernel, re.IGNORECASE), kernel
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, R2T)


def test_a_read_stalled_halfway_times_out_and_is_read_again(guest: Guest, served: Served) -> None:
    dev = _connect_with_short_timeout(guest, served, STALL)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add", action="stall_c2h", subsystem=STALL, opcode="read", after=10, limit=1
    )
    try:
        _fio_verify(guest, dev)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert re.search(r"timeout", kernel, re.IGNORECASE), kernel
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, STALL)


def test_a_header_digest_error_makes_the_host_reconnect(guest: Guest, served: Served) -> None:
    dev = _connect(guest, served, HDGST, "--hdr-digest")
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="corrupt_digest",
        digest="header",
        subsystem=HDGST,
        queue="io",
        after=200,
        limit=1,
    )
    try:
        _fio_verify(guest, dev)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert "header digest error" in kernel, kernel
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, HDGST)


@pytest.mark.parametrize(
    ("pdu", "logged"),
    [("type", "unsupported pdu type (8)"), ("hlen", "has unexpected header length (8)")],
)
def test_a_malformed_pdu_makes_the_host_reconnect(
    guest: Guest, served: Served, pdu: str, logged: str
) -> None:
    dev = _connect(guest, served, MALFORMED)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="malformed_pdu",
        pdu=pdu,
        subsystem=MALFORMED,
        queue="io",
        after=200,
        limit=1,
    )
    try:
        _fio_verify(guest, dev)
        assert _hits(served, rule) == 1
        kernel = _new_kernel_lines(guest, since)
        assert logged in kernel, kernel
        assert re.search(r"reconnect", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, MALFORMED)


def test_a_capsule_resp_with_a_wrong_plen_is_taken_as_it_is(guest: Guest, served: Served) -> None:
    """The Linux host reads a fixed 24-byte header and does not check PLEN: the Flush the
    malformed CapsuleResp answers completes as if it were well formed."""
    dev = _connect(guest, served, MALFORMED)
    since = _kernel_lines(guest)
    rule = served.call(
        "pynvmf_fault_add",
        action="malformed_pdu",
        pdu="plen",
        subsystem=MALFORMED,
        opcode="flush",
        limit=1,
    )
    try:
        guest.run(f"nvme flush {dev}")
        assert _hits(served, rule) == 1
        guest.run(f"nvme flush {dev}")
        kernel = _new_kernel_lines(guest, since)
        assert not re.search(r"reconnect|error recovery", kernel, re.IGNORECASE), kernel
    finally:
        served.call("pynvmf_fault_remove", id=rule)
        _disconnect(guest, MALFORMED)
