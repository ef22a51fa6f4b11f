"""Reservations with the Linux kernel's NVMe/TCP host as one registrant and pynvmf's host
library as the other, on the same namespaces of pynvmf's target.

The Linux host (booted once under QEMU for the module) uses nvme-cli's resv-register,
resv-acquire, resv-release, resv-report and resv-notif-log through its block devices, and
plain dd for the I/O a reservation allows or refuses; pynvmf's host library connects from
the test process with another Host Identifier. Each test uses its own namespace, so what
one leaves behind cannot decide another. The checks are check_* functions taking the
namespace, which test_linux_host_rbd.py runs on namespaces on Ceph RBD.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.host import Controller, NvmeStatusError, RemoteNamespace, connect
from pynvmf.spec.reservations import (
    AcquireAction,
    NotificationType,
    ReleaseAction,
    ReservationType,
)
from pynvmf.spec.status import Status
from tests.interop.test_linux_host import DEV_FOR
from tests.support.guest import OLDEST_AND_NEWEST, Guest, Peer
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = OLDEST_AND_NEWEST.mark()

NQN = "nqn.2024-11.dev.pynvmf:interop-resv"
PYNVMF_HOST = "nqn.2014-08.org.nvmexpress:uuid:5e5e5e5e-0000-4000-8000-00000000b0b0"
PYNVMF_HOSTID = uuid.UUID("5e5e5e5e-0000-4000-8000-00000000b0b0").bytes
MIB = 1 << 20
# One namespace per test; NS_FILE is file backed (able to persist through power loss).
NS_WRITE_EXCLUSIVE, NS_REPORT, NS_BAD_INPUT, NS_FILE, NS_PR_OPS = 1, 2, 3, 4, 5
MEMORY_NAMESPACES = (NS_WRITE_EXCLUSIVE, NS_REPORT, NS_BAD_INPUT, NS_PR_OPS)
PRTOOL_SOURCE = Path(__file__).with_name("prtool.c")
LINUX_KEY, PYNVMF_KEY = 0xA1, 0xB2
WE = ReservationType.WRITE_EXCLUSIVE
RESERVATION_AEN = 0x800006


@dataclass
class Setup:
    process: TargetProcess
    io_port: int
    image: Path


@dataclass
class Linux:
    guest: Guest
    hostid: bytes
    devices: dict[int, str]
    peer: Peer

    async def run(self, cmd: str, *, check: bool = True) -> tuple[int, str]:
        """A guest command, off the event loop (pynvmf's keep-alives keep flowing)."""
        result = await asyncio.to_thread(self.guest.run, cmd, 120, check)
        return result.rc, result.output

    async def pr(self, args: str, nsid: int) -> str:
        """The kernel's own pr_ops (prtool); the ioctl's return value (0: success)."""
        _rc, out = await self.run(f"/usr/local/bin/prtool {self.devices[nsid]} {args}", check=False)
        found = re.search(r"rc=(0x[0-9a-f]+|0|-1)(?: errno=(\d+))?", out)
        assert found, out
        if found.group(1) == "-1":
            return f"errno {found.group(2)}"
        return found.group(1)

    async def nvme(self, args: str, nsid: int) -> tuple[int, str]:
        return await self.run(f"nvme {args.replace('DEV', self.devices[nsid])}", check=False)

    async def json(self, args: str, nsid: int) -> dict:
        rc, out = await self.nvme(args + " -o json", nsid)
        assert rc == 0, out
        return json.loads(out[out.index("{") :])

    async def wait_for_aens(self, value: int, count: int) -> None:
        """Until the kernel has reported `count` AENs of `value` (bounded: 10 s)."""
        needle = f"NVME_AEN={value:#08x}"
        rc, out = await self.run(
            f"i=0; while [ $(grep -c {needle} /tmp/uevents) -lt {count} ]; do "
            "i=$((i + 1)); [ $i -gt 200 ] && { cat /tmp/uevents; exit 1; }; sleep 0.05; done",
            check=False,
        )
        assert rc == 0, f"no {count} x {needle} from the kernel:\n{out}"

    async def dd_write(self, nsid: int, block: int = 0) -> tuple[int, str]:
        # O_DIRECT: the write reaches the target now, not from the page cache later.
        return await self.run(
            f"dd if=/tmp/pattern of={self.devices[nsid]} bs=4096 count=1 seek={block} "
            "oflag=direct conv=notrunc 2>&1",
            check=False,
        )

    async def dd_read(self, nsid: int, block: int = 0) -> tuple[int, str]:
        return await self.run(
            f"dd if={self.devices[nsid]} of=/tmp/back bs=4096 count=1 skip={block} "
            "iflag=direct 2>&1",
            check=False,
        )


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("linux-resv")
    io_port = free_tcp_port()
    image = workdir / "resv.img"
    memory = [{"nsid": n, "memory": 16 * MIB} for n in MEMORY_NAMESPACES]
    config = {
        "ports": [{"address": "127.0.0.1", "port": io_port}],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": NQN,
                "namespaces": [*memory, {"nsid": NS_FILE, "file": str(image), "size": 16 * MIB}],
            }
        ],
    }
    proc = TargetProcess(config, workdir)
    proc.start()
    yield Setup(proc, io_port, image)
    proc.stop()


def build_prtool(workdir: Path) -> Path:
    """The block layer's reservation ioctls as a static program for the guest."""
    cc = shutil.which("cc")
    if cc is None:
        raise RuntimeError(
            "a C compiler (gcc, libc6-dev) is needed: scripts/install-system-deps.sh"
        )
    out = workdir / "prtool"
    subprocess.run(
        [cc, "-static", "-O2", "-Wall", "-o", str(out), str(PRTOOL_SOURCE)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def linux(
    target: Setup, tmp_path_factory: pytest.TempPathFactory, linux_peer: Peer
) -> Iterator[Linux]:
    prtool = build_prtool(tmp_path_factory.mktemp("prtool"))
    guest = Guest(
        extra_files={"/usr/local/bin/dev-for": DEV_FOR, "/usr/local/bin/prtool": prtool},
        peer=linux_peer,
    )
    guest.start()
    try:
        yield attach_linux(guest, target.io_port, NQN, (*MEMORY_NAMESPACES, NS_FILE))
        guest.run(f"nvme disconnect -n {NQN}")
    finally:
        guest.stop()


def attach_linux(guest: Guest, port: int, nqn: str, nsids: tuple[int, ...]) -> Linux:
    """The guest (with DEV_FOR as /usr/local/bin/dev-for and prtool as
    /usr/local/bin/prtool) connected to `nqn` on `port`, as one registrant."""
    guest.run(f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {nqn}")
    devices = {
        nsid: guest.run(f"sh /usr/local/bin/dev-for {nqn} {nsid}").output.strip() for nsid in nsids
    }
    hostid = uuid.UUID(guest.run("cat /etc/nvme/hostid").output.strip()).bytes
    guest.run("dd if=/dev/urandom of=/tmp/pattern bs=4096 count=1 2>/dev/null")
    # The kernel turns an AEN it does not act on into a uevent (NVME_AEN=...): record
    # them, so a check can see the reservation event reach the kernel's parked AER.
    guest.run(
        "touch /tmp/uevents; "
        "busybox uevent sh -c 'env >> /tmp/uevents' </dev/null >/dev/null 2>&1 &"
    )
    return Linux(guest, hostid, devices, guest.peer)


@pytest.fixture
async def pynvmf(target: Setup) -> AsyncIterator[Controller]:
    ctrl = await connect_pynvmf(target.io_port, NQN)
    yield ctrl
    await ctrl.close()


async def connect_pynvmf(port: int, nqn: str) -> Controller:
    """pynvmf's host library as the other registrant (another Host Identifier)."""
    return await connect("127.0.0.1", port, nqn, hostnqn=PYNVMF_HOST, hostid=PYNVMF_HOSTID)


async def _status_of(coro: object) -> int:
    try:
        await coro  # type: ignore[misc]
    except NvmeStatusError as exc:
        return exc.status
    return Status.SUCCESS


async def _read_block(ns: RemoteNamespace, block: int = 0) -> bytes:
    buf = bytearray(4096)
    await ns.read(block * 4096 // ns.capabilities.block_size, memoryview(buf))
    return bytes(buf)


async def _ptpl_feature(linux: Linux, nsid: int) -> int:
    """Reservation Persistence (Feature 83h) as the kernel's host reads it."""
    rc, out = await linux.nvme("get-feature DEV --feature-id=0x83", nsid)
    found = re.search(r"Current value:\s*(?:0x)?([0-9a-fA-F]+)", out)
    assert rc == 0 and found, out
    return int(found.group(1), 16)


async def _pattern(linux: Linux) -> bytes:
    return await asyncio.to_thread(linux.guest.read_file, "/tmp/pattern")


# Each test calls a check_* function with the namespace it uses, so that
# test_linux_host_rbd.py runs the same checks on namespaces on Ceph RBD.


async def test_write_exclusive_refuses_the_other_host_both_ways(
    linux: Linux, pynvmf: Controller
) -> None:
    await check_write_exclusive_refuses_the_other_host_both_ways(linux, pynvmf, NS_WRITE_EXCLUSIVE)


async def check_write_exclusive_refuses_the_other_host_both_ways(
    linux: Linux, pynvmf: Controller, nsid: int
) -> None:
    ns = pynvmf.namespace(nsid)
    pattern = await _pattern(linux)
    # CPTPL 11b, as the kernel's own pr_ops send it: a namespace without PTPL accepts it.
    rc, out = await linux.nvme(f"resv-register DEV --nrkey={LINUX_KEY} --rrega=0 --cptpl=3", nsid)
    assert rc == 0, out
    await ns.reservation_register(nrkey=PYNVMF_KEY)
    await ns.reservation_acquire(WE, crkey=PYNVMF_KEY)
    await ns.write(0, bytes(4096))

    # pynvmf holds Write Exclusive: the kernel's writes are refused, its reads are not.
    rc, out = await linux.dd_write(nsid)
    assert rc != 0, out
    rc, out = await linux.nvme(
        "write DEV --start-block=0 --block-count=7 --data-size=4096 --data=/tmp/pattern", nsid
    )
    assert rc != 0 and "RESERVATION_CONFLICT" in out.upper().replace(" ", "_"), out
    rc, out = await linux.dd_read(nsid)
    assert rc == 0, out
    assert await _read_block(ns) == bytes(4096)  # nothing of the kernel's landed

    # And the other way round.
    await ns.reservation_release(WE, crkey=PYNVMF_KEY)
    rc, out = await linux.nvme(f"resv-acquire DEV --crkey={LINUX_KEY} --rtype=1 --racqa=0", nsid)
    assert rc == 0, out
    assert await _status_of(ns.write(0, bytes(4096))) == Status.RESERVATION_CONFLICT
    rc, out = await linux.dd_write(nsid)
    assert rc == 0, out
    assert await _read_block(ns) == pattern
    rc, out = await linux.nvme(f"resv-release DEV --crkey={LINUX_KEY} --rtype=1 --rrela=0", nsid)
    assert rc == 0, out
    await ns.write(0, bytes(4096))


async def test_report_preempt_and_the_notification_log(linux: Linux, pynvmf: Controller) -> None:
    await check_report_preempt_and_the_notification_log(linux, pynvmf, NS_REPORT)


async def check_report_preempt_and_the_notification_log(
    linux: Linux, pynvmf: Controller, nsid: int
) -> None:
    """The first check in its guest to raise reservation AENs (it counts them)."""
    ns = pynvmf.namespace(nsid)
    rc, out = await linux.nvme(f"resv-register DEV --nrkey={LINUX_KEY} --rrega=0", nsid)
    assert rc == 0, out
    await ns.reservation_register(nrkey=PYNVMF_KEY)
    rc, out = await linux.nvme(f"resv-acquire DEV --crkey={LINUX_KEY} --rtype=1 --racqa=0", nsid)
    assert rc == 0, out

    report = await linux.json("resv-report DEV --eds", nsid)
    assert (report["rtype"], report["regctl"], report["ptpls"]) == (WE, 2, 0), report
    listed = {(e["hostid"], e["rkey"], e["rcsts"]) for e in report["regctlext"]}
    assert listed == {(linux.hostid.hex(), LINUX_KEY, 1), (PYNVMF_HOSTID.hex(), PYNVMF_KEY, 0)}
    mine = await ns.reservation_report()
    assert {(r.hostid, r.rkey, r.holds) for r in mine.registrants} == {
        (linux.hostid, LINUX_KEY, True),
        (PYNVMF_HOSTID, PYNVMF_KEY, False),
    }
    assert mine.generation == report["gen"]
    # Without the extended structure there is no room for the 128-bit host IDs. (Sent
    # raw: nvme-cli 2.13's resv-report asks for the extended structure by itself.)
    rc, out = await linux.nvme(
        f"io-passthru DEV --opcode=0x0e --namespace-id={nsid} --data-len=4096 --read"
        " --cdw10=1023 --cdw11=0",
        nsid,
    )
    assert rc != 0 and re.search(r"Host Identifier Inconsistent Format|0x18\b|0x4018", out), out

    # pynvmf preempts the kernel's registration and reservation.
    await ns.reservation_acquire(
        WE, crkey=PYNVMF_KEY, prkey=LINUX_KEY, action=AcquireAction.PREEMPT
    )
    # Type 6 (I/O command set specific), info 0 (reservation log page available), 80h.
    await linux.wait_for_aens(RESERVATION_AEN, 1)
    log = await linux.json("resv-notif-log DEV", nsid)
    assert log["rn_log_type"] == NotificationType.REGISTRATION_PREEMPTED, log
    # nvme-cli 2.3 names it "nsid", 2.13 "NSID".
    assert (log.get("nsid", log.get("NSID")), log["num_logs"]) == (nsid, 0), log
    empty = await linux.json("resv-notif-log DEV", nsid)  # reading it removed it
    assert empty["rn_log_type"] == NotificationType.EMPTY, empty
    rc, out = await linux.dd_write(nsid)
    assert rc != 0, out

    # The kernel registers again; pynvmf clears: the kernel is told it was preempted.
    rc, out = await linux.nvme(f"resv-register DEV --nrkey={LINUX_KEY} --rrega=0", nsid)
    assert rc == 0, out
    await ns.reservation_release(0, crkey=PYNVMF_KEY, action=ReleaseAction.CLEAR)
    await linux.wait_for_aens(RESERVATION_AEN, 2)  # the log was read: a new event
    log = await linux.json("resv-notif-log DEV", nsid)
    assert log["rn_log_type"] == NotificationType.RESERVATION_PREEMPTED, log
    report = await linux.json("resv-report DEV --eds", nsid)
    assert report["regctl"] == 0 and report["rtype"] == 0, report
    rc, out = await linux.dd_write(nsid)
    assert rc == 0, out


async def test_bad_input_from_nvme_cli(linux: Linux, pynvmf: Controller) -> None:
    await check_bad_input_from_nvme_cli(linux, pynvmf, NS_BAD_INPUT)


async def check_bad_input_from_nvme_cli(linux: Linux, pynvmf: Controller, nsid: int) -> None:
    ns = pynvmf.namespace(nsid)
    rc, out = await linux.nvme(f"resv-register DEV --nrkey={LINUX_KEY} --rrega=0", nsid)
    assert rc == 0, out
    await ns.reservation_register(nrkey=PYNVMF_KEY)
    await ns.reservation_acquire(WE, crkey=PYNVMF_KEY)
    before = await ns.reservation_report()
    for args, expected in (
        (f"resv-register DEV --nrkey={LINUX_KEY + 1} --rrega=0", "CONFLICT"),
        (f"resv-register DEV --crkey={LINUX_KEY + 1} --rrega=1", "CONFLICT"),
        ("resv-register DEV --nrkey=1 --rrega=5", "INVALID_FIELD"),
        (f"resv-acquire DEV --crkey={LINUX_KEY} --rtype=1 --racqa=0", "CONFLICT"),
        (f"resv-acquire DEV --crkey={LINUX_KEY} --rtype=7 --racqa=0", "INVALID_FIELD"),
        (f"resv-acquire DEV --crkey={LINUX_KEY} --rtype=1 --racqa=3", "INVALID_FIELD"),
        (f"resv-release DEV --crkey={LINUX_KEY} --rtype=1 --rrela=4", "INVALID_FIELD"),
    ):
        rc, out = await linux.nvme(args, nsid)
        assert rc != 0 and expected in out.upper().replace(" ", "_"), (args, out)
    # Releasing what it does not hold: success, no effect.
    rc, out = await linux.nvme(f"resv-release DEV --crkey={LINUX_KEY} --rtype=1 --rrela=0", nsid)
    assert rc == 0, out
    assert await ns.reservation_report() == before
    # The holder releasing another type than it holds: Invalid Field, and it still holds.
    status = await _status_of(
        ns.reservation_release(ReservationType.EXCLUSIVE_ACCESS, crkey=PYNVMF_KEY)
    )
    assert status == Status.INVALID_FIELD
    rc, out = await linux.dd_write(nsid)
    assert rc != 0, out
    await ns.reservation_release(0, crkey=PYNVMF_KEY, action=ReleaseAction.CLEAR)


async def test_a_file_namespace_persists_when_the_kernel_asks(
    linux: Linux, pynvmf: Controller, target: Setup
) -> None:
    await check_persists_when_the_kernel_asks(
        linux, pynvmf, NS_FILE, Path(str(target.image) + ".ptpl.json")
    )


async def check_persists_when_the_kernel_asks(
    linux: Linux, pynvmf: Controller, nsid: int, ptpl_file: Path
) -> None:
    """Namespace `nsid` keeps its reservations in `ptpl_file`."""
    ns = pynvmf.namespace(nsid)
    assert (await pynvmf.identify_namespace(nsid)).rescap & 1  # PTPLS
    assert await _ptpl_feature(linux, nsid) == 0
    rc, out = await linux.nvme(f"resv-register DEV --nrkey={LINUX_KEY} --rrega=0 --cptpl=3", nsid)
    assert rc == 0, out
    assert await _ptpl_feature(linux, nsid) == 1
    assert (await ns.reservation_report()).ptpls
    saved = json.loads(ptpl_file.read_text())
    assert saved["registrants"] == [{"hostid": linux.hostid.hex(), "key": LINUX_KEY}]
    rc, out = await linux.nvme(f"resv-register DEV --crkey={LINUX_KEY} --rrega=1 --cptpl=2", nsid)
    assert rc == 0, out
    assert not json.loads(ptpl_file.read_text())["ptpl"]


async def test_the_kernels_own_pr_ops(linux: Linux, pynvmf: Controller) -> None:
    await check_the_kernels_own_pr_ops(linux, pynvmf, NS_PR_OPS)


async def check_the_kernels_own_pr_ops(linux: Linux, pynvmf: Controller, nsid: int) -> None:
    """IOC_PR_*: the kernel builds the commands (CPTPL 11b on every register, 16 bytes of
    Release data on 6.1, IEKEY when a Release or Clear key is 0). Namespace `nsid` cannot
    persist its reservations."""
    ns = pynvmf.namespace(nsid)
    assert await linux.pr(f"register 0 {LINUX_KEY}", nsid) == "0"  # CPTPL 11b, no PTPL
    await ns.reservation_register(nrkey=PYNVMF_KEY)
    assert await linux.pr(f"reserve {LINUX_KEY} 1", nsid) == "0"
    assert await _status_of(ns.write(0, bytes(4096))) == Status.RESERVATION_CONFLICT
    report = await ns.reservation_report()
    assert (report.rtype, report.ptpls) == (WE, False)
    assert [(r.hostid, r.holds) for r in report.registrants] == [
        (linux.hostid, True),
        (PYNVMF_HOSTID, False),
    ]
    assert await linux.pr(f"release {LINUX_KEY} 1", nsid) == "0"
    await ns.write(0, bytes(4096))
    # A key of 0 makes the kernel set IEKEY, which Release does not take. The 6.1 kernel
    # returns the NVMe status; 6.12 and 7 turn Invalid Field into EINVAL (nvme_sc_to_pr_err).
    refused = await linux.pr("release 0 1", nsid)
    if linux.peer.kernel == "6.1":
        assert refused == hex(0x4000 | Status.INVALID_FIELD)
    else:
        assert refused == f"errno {errno.EINVAL}"
    # Preempted by the kernel: pynvmf loses its registration and its reservation.
    await ns.reservation_acquire(WE, crkey=PYNVMF_KEY)
    assert await linux.pr(f"preempt {LINUX_KEY} {PYNVMF_KEY} 2", nsid) == "0"
    report = await ns.reservation_report()
    assert report.rtype == ReservationType.EXCLUSIVE_ACCESS
    assert [(r.hostid, r.holds) for r in report.registrants] == [(linux.hostid, True)]
    buf = memoryview(bytearray(4096))
    assert await _status_of(ns.read(0, buf)) == Status.RESERVATION_CONFLICT
    page = await pynvmf.reservation_notification()
    assert (page.type, page.nsid) == (NotificationType.REGISTRATION_PREEMPTED, nsid)
    # Replacing the key, then clearing with it.
    assert await linux.pr(f"register {LINUX_KEY} {LINUX_KEY + 1}", nsid) == "0"
    assert await linux.pr(f"clear {LINUX_KEY + 1}", nsid) == "0"
    report = await ns.reservation_report()
    assert report.count == 0 and report.rtype == 0
    await ns.read(0, buf)
