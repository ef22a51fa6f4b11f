"""Record and replay with the Linux kernel (docs/record-replay.md): a Linux host's session
(nvme connect, dd writes and reads, disconnect) recorded by pynvmf's target, then replayed
against a fresh pynvmf target configured alike (no differences after normalisation) and
against the kernel's own target, nvmet, in a guest (the differences the two targets are
known to have, and none in the data).

Run on the newest peer (PYNVMF_GUEST_PEERS=linux-7); the replay and the targets run in this
process, the host and nvmet in two guests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.record import format as F
from pynvmf.record.replay import ReplayReport, queue_info, replay
from pynvmf.record.tap import Recorder
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.guest import NEWEST, Guest, Peer, setup_kernel_target
from tests.support.ports import free_tcp_port

pytestmark = NEWEST.mark()

MIB = 1 << 20
NQN = "nqn.2024-11.dev.pynvmf:record-replay"
SIZE_MB = 64
BLOCK = 512
# The session: 64 KiB of a pattern written at 4 KiB block 100 in 4 KiB writes (in-capsule
# on both targets: no R2T), read back the same way, compared in the guest.
SESSION = """set -e
nvme connect -t tcp -a {address} -s {port} -n {nqn}
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 200 ]; do i=$((i + 1)); sleep 0.05; done
yes pynvmf-record-replay | head -c 65536 > /tmp/pattern
dd if=/tmp/pattern of=/dev/nvme0n1 bs=4k count=16 seek=100 oflag=direct status=none
dd if=/dev/nvme0n1 of=/tmp/back bs=4k count=16 skip=100 iflag=direct status=none
cmp /tmp/pattern /tmp/back
nvme disconnect -n {nqn}
"""


def _pynvmf_target(port: int = 0) -> Target:
    subsystem = Subsystem(NQN)
    device = MemoryDevice(SIZE_MB * MIB, BLOCK)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "m"))
    return Target([subsystem], [Port("127.0.0.1", port)])


@pytest.fixture(scope="module")
def host_guest(linux_peer: Peer) -> Iterator[Guest]:
    guest = Guest(peer=linux_peer)
    guest.start()
    yield guest
    guest.stop()


@pytest.fixture(scope="module")
def nvmet_port(linux_peer: Peer) -> Iterator[int]:
    port = free_tcp_port()
    guest = Guest(hostfwd=[port], peer=linux_peer)
    guest.start()
    try:
        setup_kernel_target(guest, port=port, nqn=NQN, size_mb=SIZE_MB, block_size=BLOCK)
        yield port
    finally:
        guest.stop()


@pytest.fixture(scope="module")
def recording(host_guest: Guest, tmp_path_factory: pytest.TempPathFactory) -> list[F.Recording]:
    directory = tmp_path_factory.mktemp("recording")

    async def record() -> None:
        target = _pynvmf_target()
        target.record_connections(Recorder(directory))
        await target.start()
        try:
            port = target.ports[0].port
            script = SESSION.format(address=Guest.host_address, port=port, nqn=NQN)
            result = await asyncio.to_thread(host_guest.run, script, timeout=300)
            assert result.ok, result.output
        finally:
            await target.stop()

    asyncio.run(record())
    return [F.load(p) for p in sorted(Path(directory).iterdir())]


def _replay(recordings: list[F.Recording], address: tuple[str, int]) -> ReplayReport:
    return asyncio.run(replay(recordings, address, wait_s=10.0))


def test_the_recording_holds_the_hosts_queues(recording: list[F.Recording]) -> None:
    qids = sorted(queue_info(r).qid for r in recording)
    assert qids[0] == 0 and len(qids) >= 2, qids  # the admin queue and the I/O queues
    pattern = (b"pynvmf-record-replay\n" * 4000)[:65536]
    written = b"".join(
        p.data for r in recording for p in r.pdus if p.type == 4 and len(p.data) == 4096
    )
    assert pattern[:4096] in written


def test_replayed_against_pynvmf_nothing_differs(recording: list[F.Recording]) -> None:
    async def run() -> ReplayReport:
        target = _pynvmf_target()
        await target.start()
        try:
            port = target.ports[0]
            return await replay(recording, (port.address, port.port), wait_s=10.0)
        finally:
            await target.stop()

    report = asyncio.run(run())
    assert report.findings == [], "\n".join(report.lines())
    assert report.matched > 20


def test_replayed_against_nvmet_the_known_differences(
    recording: list[F.Recording], nvmet_port: int
) -> None:
    report = _replay(recording, ("127.0.0.1", nvmet_port))
    text = "\n".join(report.lines())
    print(text)
    differences = [(d.field, d.recorded, d.live) for f in report.findings for d in f.differences]
    # Who made the controller, and what the transport offers: nvmet's, not pynvmf's.
    assert ("identify-controller.mn", "pynvmf", "Linux") in differences, text
    assert ("maxh2cdata", 128 * 1024, 4 * MIB) in differences, text
    # The SQ head pointer counts the Connect's entry as nvmet's does; it differs by the one
    # Asynchronous Event Request outstanding, which nvmet counts when it completes (as SPDK
    # does) and pynvmf when it arrives.
    sqhd = [(recorded, live) for field, recorded, live in differences if field == "sqhd"]
    assert all(recorded == live + 1 for recorded, live in sqhd), text
    # Every answer came, and nvmet sent nothing the recording has no place for.
    assert {f.kind for f in report.findings} == {"differs"}, text
    # The data read back is what was written, on either target.
    io_files = {r.path.rsplit("/", 1)[-1] for r in recording if queue_info(r).qid > 0}
    data_findings = [
        f
        for f in report.findings
        if f.file in io_files and f.what.startswith("C2HData") and f.kind != "unexpected"
    ]
    assert data_findings == [], text
