"""The Prometheus endpoint of an in-process target, scraped over HTTP after known work
done with the host library: exact values, bounded host labels, HTTP's answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.metrics.endpoint import MAX_CLIENTS, MAX_HEAD, MetricsEndpoint, MetricsListenError
from pynvmf.metrics.labels import OTHER
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target.budget import DataBudget, MemoryPool
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_SUBNQN, RawTarget
from tests.support.raw import HOSTNQN, rw_sqe
from tests.support.scrape import Samples, http_get, samples_of, scrape, series, value

NQN = "nqn.2024-01.org.pynvmf:metrics"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"


def _subsystem() -> Subsystem:
    subsystem = Subsystem(NQN)
    device = MemoryDevice(8 << 20, 512)
    subsystem.add_namespace(Namespace.create(NQN, 1, device, "memory:1"))
    return subsystem


@pytest.fixture
async def served() -> AsyncIterator[tuple[Target, Port, MetricsEndpoint]]:
    port = Port("127.0.0.1", 0)
    target = Target([_subsystem()], [port])
    endpoint = MetricsEndpoint(target, host_limit=3)
    await endpoint.listen("127.0.0.1", 0)
    await target.start()
    yield target, port, endpoint
    await endpoint.close()
    await target.stop()


async def test_a_scrape_after_known_work_matches_it(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, port, endpoint = served
    assert endpoint.address is not None
    where = str(port)
    a = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A, queues=2)
    b = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_B, queues=1)
    try:
        for lba in range(3):
            await a.namespace(1).write(lba * 8, bytes(4096))
        for _ in range(2):
            await b.namespace(1).read(0, memoryview(bytearray(8192)))
        m = await scrape(*endpoint.address)
    finally:
        await a.close()
        await b.close()
    assert value(m, "pynvmf_connections", port=where, host=HOST_A) == 3  # admin + 2 I/O
    assert value(m, "pynvmf_connections", port=where, host=HOST_B) == 2
    assert value(m, "pynvmf_tcp_connections") == 5
    assert value(m, "pynvmf_controllers", subsystem=NQN) == 2
    assert value(m, "pynvmf_queues", subsystem=NQN, type="io") == 3
    assert value(m, "pynvmf_queues", subsystem=NQN, type="admin") == 2
    assert value(m, "pynvmf_queues_created_total", type="io") == 3
    assert value(m, "pynvmf_subsystem_commands_total", subsystem=NQN, opcode="write") == 3
    assert value(m, "pynvmf_subsystem_commands_total", subsystem=NQN, opcode="read") == 2
    assert value(m, "pynvmf_subsystem_bytes_total", subsystem=NQN, direction="write") == 12288
    assert value(m, "pynvmf_subsystem_bytes_total", subsystem=NQN, direction="read") == 16384
    assert value(m, "pynvmf_namespaces", subsystem=NQN) == 1
    ana = {"subsystem": NQN, "group": "1", "listener": where}
    assert value(m, "pynvmf_ana_state", state="optimized", **ana) == 1
    assert value(m, "pynvmf_ana_state", state="inaccessible", **ana) == 0
    assert value(m, "pynvmf_metrics_hosts_folded") == 0


async def test_ana_transitions_and_queues_after_the_hosts_left(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    target, port, endpoint = served
    assert endpoint.address is not None
    ctrl = await connect("127.0.0.1", port.port, NQN, hostnqn=HOST_A)
    await ctrl.close()
    before = await scrape(*endpoint.address)
    target.set_ana_state(NQN, 1, "inaccessible", "127.0.0.1", port.port)
    # The host's queues are gone once the target saw the connections close.
    async with asyncio.timeout(10):
        while target.connection_budget.total:
            await asyncio.sleep(0.01)
    m = await scrape(*endpoint.address)
    ana = {"subsystem": NQN, "group": "1", "listener": str(port)}
    assert value(m, "pynvmf_ana_state", state="inaccessible", **ana) == 1
    assert value(m, "pynvmf_ana_state", state="optimized", **ana) == 0
    changes = value(m, "pynvmf_ana_changes_total", subsystem=NQN)
    assert changes == (value(before, "pynvmf_ana_changes_total", subsystem=NQN) or 0) + 1
    assert series(m, "pynvmf_connections") == {}
    assert value(m, "pynvmf_queues_created_total", type="admin") == 1
    assert value(m, "pynvmf_queues_created_total", type="io") == 1


async def test_hosts_past_the_limit_fold_and_hostile_nqns_are_escaped(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, port, endpoint = served
    assert endpoint.address is not None
    hostile = 'nqn.2024-01.evil:"}\nnvme_up 1\\'
    hosts = [f"nqn.2024-01.org.pynvmf:host{i}" for i in range(4)] + [hostile]
    ctrls = [await connect("127.0.0.1", port.port, NQN, hostnqn=h, queues=1) for h in hosts]
    try:
        status, body = await http_get(*endpoint.address, "/metrics")
        m = await scrape(*endpoint.address)
    finally:
        for ctrl in ctrls:
            await ctrl.close()
    assert status == 200
    assert b"\nnvme_up 1" not in body  # the newline was not written raw
    got = series(m, "pynvmf_connections")
    # Three places (host_limit=3), in sorted order: the hostile NQN sorts first.
    kept = {dict(labels)["host"]: n for labels, n in got.items()}
    assert kept == {
        'nqn.2024-01.evil:"}?nvme_up 1\\': 2,
        "nqn.2024-01.org.pynvmf:host0": 2,
        "nqn.2024-01.org.pynvmf:host1": 2,
        OTHER: 4,
    }
    assert value(m, "pynvmf_metrics_hosts_folded") == 2


async def test_unknown_path_is_404_and_other_methods_405(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, _port, endpoint = served
    assert endpoint.address is not None
    assert (await http_get(*endpoint.address, "/"))[0] == 404
    assert (await http_get(*endpoint.address, "/metrics/x"))[0] == 404
    assert (await http_get(*endpoint.address, "/metrics", method="POST"))[0] == 405
    status, body = await http_get(*endpoint.address, "/metrics?name[]=x", method="HEAD")
    assert (status, body) == (200, b"")


async def _unanswered(reader: asyncio.StreamReader) -> bool:
    """The connection ended with no answer (closed, or reset with our bytes unread)."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True


async def test_scrapers_that_send_too_much_or_hold_connections_cost_nothing_lasting(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, _port, endpoint = served
    assert endpoint.address is not None
    # A request head past the limit: the connection closes, unanswered.
    reader, writer = await asyncio.open_connection(*endpoint.address)
    writer.write(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_HEAD)
    assert await _unanswered(reader)
    writer.close()
    # Connections held open without a request: past the limit, the next one is closed
    # at once; once they go, scrapes are answered again.
    idle = [await asyncio.open_connection(*endpoint.address) for _ in range(MAX_CLIENTS)]
    async with asyncio.timeout(10):
        while endpoint.clients < MAX_CLIENTS:
            await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection(*endpoint.address)
    writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
    assert await _unanswered(reader)
    writer.close()
    for _reader, held in idle:
        held.close()
    async with asyncio.timeout(10):
        while endpoint.clients:
            await asyncio.sleep(0.01)
    assert (await http_get(*endpoint.address, "/metrics"))[0] == 200


async def test_closing_ends_the_scrapers_connections_quietly(
    served: tuple[Target, Port, MetricsEndpoint], caplog: pytest.LogCaptureFixture
) -> None:
    _target, _port, endpoint = served
    assert endpoint.address is not None
    reader, writer = await asyncio.open_connection(*endpoint.address)
    async with asyncio.timeout(10):
        while not endpoint.clients:
            await asyncio.sleep(0.01)
    await endpoint.close()
    assert await _unanswered(reader)
    writer.close()
    assert endpoint.clients == 0 and endpoint.address is None
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_port_in_use_is_refused_and_the_old_endpoint_keeps_serving(
    served: tuple[Target, Port, MetricsEndpoint],
) -> None:
    _target, port, endpoint = served
    assert endpoint.address is not None
    with pytest.raises(MetricsListenError, match=r"127\.0\.0\.1:\d+: Address already in use"):
        await endpoint.listen("127.0.0.1", port.port)  # the NVMe port holds it
    assert (await http_get(*endpoint.address, "/metrics"))[0] == 200


async def test_a_request_for_buffers_that_must_wait_is_counted() -> None:
    pool = MemoryPool(4096)
    budget = DataBudget(pool, capacity=8192)
    await budget.take(4096)
    assert pool.waits == 0
    waiter = asyncio.ensure_future(budget.take(4096))
    await asyncio.sleep(0)
    assert pool.waits == 1 and not waiter.done()
    budget.give(4096)
    await waiter
    budget.give(4096)


def _collected(target: Target) -> Samples:
    return samples_of(MetricsEndpoint(target).exposition().decode())


async def test_digest_errors_and_term_reqs_count_on_open_and_closed_connections(
    raw_target: RawTarget,
) -> None:
    admin = await raw_target.admin()
    io = await raw_target.open()
    await io.handshake(hdgst=True, ddgst=True)
    assert (await io.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)).status == 0
    # A data digest that does not match: the command fails, the connection stays.
    data = b"\x55" * RAW_NS1_BLOCK
    sqe = rw_sqe(IoOpcode.WRITE, io.next_cid(), 1, 10, 1, RAW_NS1_BLOCK, inline=True)
    bad = bytearray(io.capsule(sqe, data))
    bad[-1] ^= 0xFF
    failed = await io.submit_nowait(sqe, data, wire=bytes(bad))
    assert failed.status == Status.TRANSIENT_TRANSPORT_ERROR
    m = _collected(raw_target.target)
    assert value(m, "pynvmf_data_digest_errors_total") == 1
    assert value(m, "pynvmf_term_reqs_sent_total") == 0
    # A header digest that does not match, on another connection: a TermReq, and that
    # connection ends.
    victim = await raw_target.open()
    await victim.handshake(hdgst=True, ddgst=True)
    wire = bytearray(victim.capsule(rw_sqe(IoOpcode.READ, 1, 1, 0, 1, RAW_NS1_BLOCK)))
    wire[P.CAPSULE_CMD_HLEN] ^= 0x01
    victim.send(bytes(wire))
    await victim.expect_term()
    async with asyncio.timeout(10):
        while len(raw_target.port.connections) > 2:  # the admin and I/O queues' stay
            await asyncio.sleep(0.01)
    # Its counts moved to the target's as it closed: each counted once.
    m = _collected(raw_target.target)
    assert value(m, "pynvmf_data_digest_errors_total") == 1
    assert value(m, "pynvmf_term_reqs_sent_total") == 1


async def test_a_keep_alive_expiry_is_counted_and_notified(raw_target: RawTarget) -> None:
    assert value(_collected(raw_target.target), "pynvmf_keep_alive_expiries_total") == 0
    admin = await raw_target.admin(kato=500)
    await admin.expect_eof(timeout=10)
    assert value(_collected(raw_target.target), "pynvmf_keep_alive_expiries_total") == 1
    # A gateway that polls SPDK's notify_get_notifications learns which host went silent.
    notes = raw_target.target.notifications.read()
    assert [n.ctx for n in notes if n.type == "nvmf_keep_alive_timeout"] == [HOSTNQN]
