"""Per-command counters of the Prometheus endpoint (pynvmf_commands_total,
pynvmf_command_bytes_total, pynvmf_command_errors_total) on an in-process target: exact
after a known mix of commands from two hosts to two namespaces, errors by status, and
counts that outlive the controller and the subsystem."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.host.errors import NvmeStatusError
from pynvmf.host.namespace import CopyingNamespace
from pynvmf.metrics.endpoint import MetricsEndpoint
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.command_counts import CommandCounts, HostCounts
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.scrape import Samples, scrape, series, value

NQN = "nqn.2024-01.org.pynvmf:commands"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"
BLOCKS = (8 << 20) // 512


def _subsystem() -> Subsystem:
    subsystem = Subsystem(NQN)
    for nsid in (1, 2):
        device = MemoryDevice(8 << 20, 512)
        subsystem.add_namespace(Namespace.create(NQN, nsid, device, f"memory:{nsid}"))
    return subsystem


@pytest.fixture
async def served() -> AsyncIterator[tuple[Target, Port, MetricsEndpoint]]:
    port = Port("127.0.0.1", 0)
    target = Target([_subsystem()], [port])
    endpoint = MetricsEndpoint(target)
    await endpoint.listen("127.0.0.1", 0)
    await target.start()
    yield target, port, endpoint
    await endpoint.close()
    await target.stop()


def _ours(m: Samples, name: str) -> dict[tuple[str, ...], float]:
    """The samples of `name` as {label values but the subsystem's: value}."""
    out = {}
    for labels, n in series(m, name).items():
        d = dict(labels)
        assert d.pop("subsystem") == NQN
        out[tuple(v for _k, v in sorted(d.items()))] = n
    return out


async def test_commands_bytes_and_errors_per_host_namespace_and_opcode(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, port, endpoint = served
    assert endpoint.address is not None
    a = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A, queues=2)
    b = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_B, queues=1)
    try:
        a1, a2, b2 = a.namespace(1), a.namespace(2), b.namespace(2)
        for lba in range(5):
            await a1.write(lba * 8, bytes(4096))  # in-capsule: the fast path
        await a1.write(64, bytes(65536))  # R2T: the general path
        for _ in range(3):
            await a1.read(0, memoryview(bytearray(4096)))  # the fast path
        await a1.read(0, memoryview(bytearray(1 << 20)))  # in pieces
        await a2.flush()
        await a2.write_zeroes(0, 16)
        await a2.deallocate(0, 8)
        assert await a2.compare(0, bytes(512))
        await a2.verify(0, 4)
        assert isinstance(a2, CopyingNamespace)
        assert await a2.copy_one(0, 100, 4)  # 2 KiB within the target
        for _ in range(2):
            await b2.read(8, memoryview(bytearray(512)))
        await b2.write(8, bytes(1024))
        with pytest.raises(NvmeStatusError) as err:  # past the end: LBA Out of Range
            await b.io_command(IoOpcode.READ, 2, BLOCKS, 0, 0, into=memoryview(bytearray(512)))
        assert err.value.status == Status.LBA_OUT_OF_RANGE
        with pytest.raises(NvmeStatusError) as err:  # no namespace 7
            await b.io_command(IoOpcode.READ, 7, 0, 0, 0, into=memoryview(bytearray(512)))
        assert err.value.status == Status.INVALID_NS
        with pytest.raises(NvmeStatusError) as err:  # no such opcode
            await b.io_command(0x80, 2)
        assert err.value.status == Status.INVALID_OPCODE
        m = await scrape(*endpoint.address)
    finally:
        await a.close()
        await b.close()
    # Label values in the order of the labels' names: direction, host, nsid, opcode, status.
    assert _ours(m, "pynvmf_commands_total") == {
        (HOST_A, "1", "write"): 6,
        (HOST_A, "1", "read"): 4,
        (HOST_A, "2", "flush"): 1,
        (HOST_A, "2", "write_zeroes"): 1,
        (HOST_A, "2", "dsm"): 1,
        (HOST_A, "2", "compare"): 1,
        (HOST_A, "2", "verify"): 1,
        (HOST_A, "2", "copy"): 1,
        (HOST_B, "2", "read"): 3,
        (HOST_B, "2", "write"): 1,
        (HOST_B, "none", "read"): 1,
        (HOST_B, "2", "other"): 1,
    }
    assert _ours(m, "pynvmf_command_bytes_total") == {
        ("read", HOST_A, "1"): 3 * 4096 + (1 << 20),
        ("write", HOST_A, "1"): 5 * 4096 + 65536,
        ("copy", HOST_A, "2"): 2048,
        ("read", HOST_B, "2"): 1024,
        ("write", HOST_B, "2"): 1024,
    }
    assert _ours(m, "pynvmf_command_errors_total") == {
        (HOST_B, "2", "read", "lba_out_of_range"): 1,
        (HOST_B, "none", "read", "invalid_ns"): 1,
        (HOST_B, "2", "other", "invalid_opcode"): 1,
    }
    assert value(m, "pynvmf_metrics_command_hosts_folded") == 0


async def test_counts_outlive_the_controller_and_the_subsystem(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    target, port, endpoint = served
    assert endpoint.address is not None
    labels = {"subsystem": NQN, "nsid": "1", "host": HOST_A, "opcode": "write"}
    for n in (1, 2):
        ctrl = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A)
        try:
            await ctrl.namespace(1).write(0, bytes(512))
        finally:
            await ctrl.close()
        await target.remove_subsystem(NQN)
        m = await scrape(*endpoint.address)
        assert value(m, "pynvmf_commands_total", **labels) == n
        target.add_subsystem(NQN)
        device = MemoryDevice(1 << 20, 512)
        target.add_namespace(NQN, NamedDevice.wrap("memory", device, owned=True), nsid=1)


def test_hosts_past_the_limit_are_counted_together() -> None:
    counts = CommandCounts(max_hosts=2)
    first, second = counts.of(NQN, "h1"), counts.of(NQN, "h2")
    third, fourth = counts.of(NQN, "h3"), counts.of(NQN, "h4")
    assert len({id(first), id(second), id(third)}) == 3
    assert third is fourth
    assert set(counts.hosts) == {(NQN, "h1"), (NQN, "h2"), (NQN, "_other")}
    assert counts.of(NQN, "h1") is first


def test_a_report_is_taken_once_and_a_bad_one_adds_nothing() -> None:
    worker, main = CommandCounts(), CommandCounts()
    host = worker.of(NQN, HOST_A)
    host.namespace(1).reads += 3
    host.error(1, IoOpcode.READ, Status.LBA_OUT_OF_RANGE | 0x4000)
    report = worker.take()
    assert worker.take() == []
    main.add(report)
    main.add(report)
    got = main.of(NQN, HOST_A)
    assert got.namespaces[1].reads == 6
    assert got.errors == {(1, IoOpcode.READ, Status.LBA_OUT_OF_RANGE): 2}
    bad = [(NQN, HOST_B, {1: [-1] + [0] * 35}, {}, {}, {})]
    with pytest.raises(ValueError):
        main.add(report + bad)
    assert got.namespaces[1].reads == 6
    assert (NQN, HOST_B) not in main.hosts
    assert isinstance(host, HostCounts) and host.namespaces[1].reads == 0
