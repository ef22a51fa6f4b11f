"""Each block device's share of the per-host command counters (target/device_io.py):
only successful reads, writes, unmaps and copies; a namespace's counts stay with the
device that backed it when it goes, and a new namespace of the same NSID starts from
zero for its device."""

from __future__ import annotations

from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.command_counts import CommandCounts, opcode_slot
from pynvmf.target.device_io import DeviceIo, DeviceIoLedger
from pynvmf.target.poll_groups import completed_commands, report_commands

NQN = "nqn.2024-01.org.pynvmf:dev"
READ, WRITE, DSM, FLUSH = IoOpcode.READ, IoOpcode.WRITE, IoOpcode.DATASET_MANAGEMENT, IoOpcode.FLUSH


def commands(counts: CommandCounts, host: str, nsid: int, opcode: int, n: int, length: int) -> None:
    per_ns = counts.of(NQN, host).namespace(nsid)
    for _ in range(n):
        per_ns.command(opcode_slot(opcode), 0, length)


def test_counts_of_every_host_successful_ones_only() -> None:
    counts = CommandCounts()
    ledger = DeviceIoLedger(counts)
    ledger.namespace_added(NQN, 1)
    commands(counts, "a", 1, READ, 3, 4096)
    commands(counts, "b", 1, READ, 2, 512)
    commands(counts, "a", 1, WRITE, 4, 8192)
    commands(counts, "a", 1, DSM, 2, 16)
    commands(counts, "b", 1, FLUSH, 5, 0)  # not in SPDK's iostat
    commands(counts, "b", 2, WRITE, 7, 512)  # another namespace
    failed = counts.of(NQN, "b")
    failed.namespace(1).command(READ, Status.LBA_OUT_OF_RANGE, 512)
    failed.error(1, READ, Status.LBA_OUT_OF_RANGE)
    assert ledger.of("Malloc0", [(NQN, 1)]) == DeviceIo(
        bytes_read=3 * 4096 + 2 * 512,
        num_read_ops=5,
        bytes_written=4 * 8192,
        num_write_ops=4,
        num_unmap_ops=2,
    )


def test_a_device_keeps_what_its_namespace_counted_and_a_new_one_starts_from_zero() -> None:
    counts = CommandCounts()
    ledger = DeviceIoLedger(counts)
    ledger.namespace_added(NQN, 1)
    commands(counts, "a", 1, WRITE, 6, 4096)
    ledger.namespace_gone(NQN, 1, "Malloc0")
    assert ledger.of("Malloc0", []) == DeviceIo(bytes_written=6 * 4096, num_write_ops=6)
    # NSID 1 again, on another device: the counters of NSID 1 go on, its device's from 0.
    ledger.namespace_added(NQN, 1)
    assert ledger.of("Again", [(NQN, 1)]) == DeviceIo()
    commands(counts, "a", 1, WRITE, 1, 512)
    assert ledger.of("Again", [(NQN, 1)]) == DeviceIo(bytes_written=512, num_write_ops=1)
    assert ledger.of("Malloc0", []) == DeviceIo(bytes_written=6 * 4096, num_write_ops=6)
    ledger.device_gone("Malloc0")
    assert ledger.of("Malloc0", []) == DeviceIo()


def test_commands_completed_and_in_a_worker_report() -> None:
    counts = CommandCounts()
    commands(counts, "a", 1, READ, 3, 512)
    commands(counts, "b", 2, FLUSH, 2, 0)
    commands(counts, "b", 2, 0x7F, 1, 0)  # a vendor opcode: the "other" slot
    assert completed_commands(counts) == 6
    assert report_commands(counts.take()) == 6
    assert completed_commands(counts) == 0
