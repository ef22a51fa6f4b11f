"""Fault rules about the wire (tcp/wire_faults.py, docs/faults.md), seen byte by byte from a
raw socket against the in-process target: a wrong header or data digest on the PDUs that
answer the selected command (and none where the digest was not negotiated), a C2HTermReq
with the FES asked for and the connection closed, a malformed PDU in place of a completion,
a Write whose R2T never comes, and a Read that stops halfway through its data."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pynvmf.host import NvmeConnectionError, connect
from pynvmf.rpc.jsonrpc import INVALID_PARAMS
from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import IoOpcode
from pynvmf.target.faults import FaultRule, parse_fault
from pynvmf.tcp.digest import digest
from pynvmf.tcp.framing import MarkingWriter, PduWriter
from pynvmf.tcp.wire_faults import UNDEFINED_PDU_TYPE
from tests.protocol.conftest import RAW_NS1_BLOCK, RAW_SUBNQN, RawRpcTarget, RawTarget
from tests.support.raw import RawQueue, rw_sqe

TIMEOUT = 5.0


async def io_queue(raw: RawTarget, *, hdgst: bool = False, ddgst: bool = False) -> RawQueue:
    """I/O queue 1, with the digests asked for, its bytes read by hand from here on."""
    admin = await raw.admin()
    queue = await raw.open()
    await queue.handshake(hdgst=hdgst, ddgst=ddgst)
    done = await queue.connect(RAW_SUBNQN, qid=1, cntlid=admin.cntlid)
    assert done.status == 0
    await queue.detach()
    return queue


def add(raw: RawTarget, **rule: object) -> FaultRule:
    return raw.target.add_fault(parse_fault(rule))


def read(queue: RawQueue, cid: int, nlb: int = 1, slba: int = 0) -> None:
    sqe = rw_sqe(IoOpcode.READ, cid, 1, slba, nlb, nlb * RAW_NS1_BLOCK)
    queue.send(queue.capsule(sqe))


async def raw_pdu(queue: RawQueue, length: int = 0) -> bytes:
    """The next PDU's bytes as they came (its PLEN says how many), or `length` bytes."""
    reader = queue.reader
    if length:
        return await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
    common = await asyncio.wait_for(reader.readexactly(P.CH_LEN), TIMEOUT)
    plen = P.COMMON_HEADER.unpack(common)[4]
    return common + await asyncio.wait_for(reader.readexactly(plen - P.CH_LEN), TIMEOUT)


def header_digest_ok(pdu: bytes) -> bool:
    hlen = pdu[2]
    return pdu[hlen : hlen + 4] == digest(pdu[:hlen])


def c2h_fields(pdu: bytes) -> tuple[int, int, int, int, int]:
    """(flags, CCCID, DATAO, DATAL, PDO) of a C2HData PDU."""
    assert pdu[0] == P.PduType.C2H_DATA, pdu[:8].hex()
    cccid, _ttag, datao, datal = P.DATA_BODY.unpack_from(pdu, P.CH_LEN)
    return pdu[1], cccid, datao, datal, pdu[3]


def cqe_of(pdu: bytes) -> C.Cqe:
    assert pdu[0] == P.PduType.CAPSULE_RESP, pdu[:8].hex()
    return C.Cqe.unpack(pdu, P.CH_LEN)


async def test_a_wrong_header_digest_on_the_first_pdu_of_the_command(
    raw_target: RawTarget, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await io_queue(raw_target, hdgst=True)
    rule = add(raw_target, action="corrupt_digest", digest="header", opcode="read", first=1)
    caplog.set_level(logging.INFO, "pynvmf.target.queue")
    read(queue, 3)
    data = await raw_pdu(queue)
    assert c2h_fields(data)[1] == 3 and not header_digest_ok(data)
    assert header_digest_ok(await raw_pdu(queue))  # its CapsuleResp: only the first PDU
    read(queue, 4)  # first=1: the next Read is answered as usual
    assert header_digest_ok(await raw_pdu(queue))
    resp = await raw_pdu(queue)
    assert header_digest_ok(resp) and cqe_of(resp).cid == 4
    assert (rule.matches, rule.hits) == (2, 1)
    assert any("fault rule 1: corrupt_digest qid 1 cid 3" in r.getMessage() for r in caplog.records)


async def test_a_command_without_data_gets_a_wrong_header_digest_on_its_completion(
    raw_target: RawTarget,
) -> None:
    queue = await io_queue(raw_target, hdgst=True)
    add(raw_target, action="corrupt_digest", digest="header", opcode="flush")
    sqe = C.build_sqe(IoOpcode.FLUSH, 9, 1)
    queue.send(queue.capsule(sqe))
    resp = await raw_pdu(queue)
    assert cqe_of(resp).cid == 9 and not header_digest_ok(resp)


async def test_a_write_gets_a_wrong_header_digest_on_its_r2t(raw_target: RawTarget) -> None:
    queue = await io_queue(raw_target, hdgst=True)
    add(raw_target, action="corrupt_digest", digest="header", opcode="write")
    queue.send(queue.capsule(rw_sqe(IoOpcode.WRITE, 14, 1, 0, 4, 4 * RAW_NS1_BLOCK)))
    r2t = await raw_pdu(queue)
    assert r2t[0] == P.PduType.R2T and P.DATA_BODY.unpack_from(r2t, P.CH_LEN)[0] == 14
    assert not header_digest_ok(r2t)


async def test_a_wrong_data_digest_on_a_read(raw_target: RawTarget) -> None:
    queue = await io_queue(raw_target, hdgst=True, ddgst=True)
    rule = add(raw_target, action="corrupt_digest", digest="data", opcode="read")
    read(queue, 5, nlb=2)
    data = await raw_pdu(queue)
    flags, cid, _datao, datal, pdo = c2h_fields(data)
    assert cid == 5 and datal == 2 * RAW_NS1_BLOCK and flags & P.FLAG_DDGST
    payload = data[pdo : pdo + datal]
    assert header_digest_ok(data)
    assert data[pdo + datal :] != digest(payload)  # the data itself is right, its digest not
    resp = await raw_pdu(queue)
    assert cqe_of(resp).cid == 5 and cqe_of(resp).status == 0
    assert rule.hits == 1
    # A command that moves no data to the host is not selected by a data digest rule.
    queue.send(queue.capsule(C.build_sqe(IoOpcode.FLUSH, 6, 1)))
    assert cqe_of(await raw_pdu(queue)).cid == 6
    assert (rule.matches, rule.hits) == (1, 1)


@pytest.mark.parametrize("digests", [False, True])
async def test_a_connection_frames_plainly_again_once_the_last_rule_is_gone(
    raw_target: RawTarget, digests: bool
) -> None:
    queue = await io_queue(raw_target, hdgst=digests, ddgst=digests)
    action = (
        {"action": "corrupt_digest", "digest": "header"} if digests else {"action": "stall_c2h"}
    )
    rule = add(raw_target, opcode="read", first=1, **action)
    other = add(raw_target, action="drop", opcode="flush", first=1)
    conn = queue_conn(raw_target)
    assert type(conn.writer) is PduWriter  # type: ignore[attr-defined]
    read(queue, 50)
    first = await raw_pdu(queue)
    assert rule.hits == 1
    if digests:
        assert not header_digest_ok(first)
        assert cqe_of(await raw_pdu(queue)).cid == 50
    assert isinstance(conn.writer, MarkingWriter)  # type: ignore[attr-defined]
    # A rule left (it selects nothing here): the marking writer stays.
    raw_target.target.remove_fault(rule.id)
    assert isinstance(conn.writer, MarkingWriter)  # type: ignore[attr-defined]
    raw_target.target.remove_fault(other.id)
    assert type(conn.writer) is PduWriter  # type: ignore[attr-defined]
    # And frames as a fresh connection does.
    read(queue, 51)
    data = await raw_pdu(queue)
    flags, cid, _datao, datal, pdo = c2h_fields(data)
    assert cid == 51 and datal == RAW_NS1_BLOCK and flags & P.FLAG_DATA_LAST
    if digests:
        assert header_digest_ok(data)
        assert data[pdo + datal :] == digest(data[pdo : pdo + datal])
    if not flags & P.FLAG_DATA_SUCCESS:
        assert cqe_of(await raw_pdu(queue)).cid == 51


async def test_a_digest_rule_on_a_connection_without_that_digest_selects_nothing(
    raw_target: RawTarget,
) -> None:
    queue = await io_queue(raw_target)  # no digests
    header = add(raw_target, action="corrupt_digest", digest="header")
    data = add(raw_target, action="corrupt_digest", digest="data", opcode="read")
    read(queue, 1)
    pdu = await raw_pdu(queue)
    assert c2h_fields(pdu)[1] == 1 and len(pdu) == P.DATA_HLEN + RAW_NS1_BLOCK
    assert cqe_of(await raw_pdu(queue)).status == 0
    for rule in (header, data):
        assert (rule.matches, rule.hits) == (0, 0)


@pytest.mark.parametrize(
    ("rule", "fes", "fei"),
    [
        ({}, P.FatalError.PDU_SEQUENCE_ERROR, 0),
        ({"fes": "invalid_header_field", "fei": 8}, P.FatalError.INVALID_HEADER_FIELD, 8),
        ({"fes": 3}, P.FatalError.HEADER_DIGEST_ERROR, 0),
    ],
)
async def test_a_term_req_with_the_fes_and_the_connection_closes(
    raw_target: RawTarget, rule: dict[str, object], fes: int, fei: int
) -> None:
    queue = await io_queue(raw_target)
    add(raw_target, action="term_req", opcode="read", **rule)
    read(queue, 12)
    term = await queue.expect_term()
    assert term.term_fields() == (fes, fei)
    # It quotes the command's capsule header.
    assert term.data[0] == P.PduType.CAPSULE_CMD and C.Sqe.unpack(term.data, P.CH_LEN).cid == 12
    conn = queue_conn(raw_target)
    assert conn is None or conn.stats.term_reqs_sent == 1


def queue_conn(raw: RawTarget) -> object:
    (ctrl,) = raw.target.subsystems[RAW_SUBNQN].controllers.values()
    queue = ctrl.queues.get(1)
    return None if queue is None else queue.conn


@pytest.mark.parametrize("hdgst", [False, True])
@pytest.mark.parametrize("kind", ["type", "hlen", "plen"])
async def test_a_malformed_pdu_in_place_of_the_completion(
    raw_target: RawTarget, kind: str, hdgst: bool
) -> None:
    queue = await io_queue(raw_target, hdgst=hdgst)
    add(raw_target, action="malformed_pdu", pdu=kind, opcode="read", first=1)
    read(queue, 21)
    pdu = await raw_pdu(queue, P.CAPSULE_RESP_HLEN + (4 if hdgst else 0))
    pdu_type, _flags, hlen, _pdo, plen = P.COMMON_HEADER.unpack_from(pdu)
    expected = {
        "type": (UNDEFINED_PDU_TYPE, P.CAPSULE_RESP_HLEN, len(pdu)),
        "hlen": (P.PduType.CAPSULE_RESP, P.CH_LEN, len(pdu)),
        "plen": (P.PduType.CAPSULE_RESP, P.CAPSULE_RESP_HLEN, P.CH_LEN),
    }[kind]
    assert (pdu_type, hlen, plen) == expected
    assert P.CAPSULE_RESP.unpack_from(pdu)[9] == 21  # in place of command 21's completion
    # Nothing else of the command comes; the host is to terminate: it does.
    queue.send(P.pack_term_req(P.PduType.H2C_TERM_REQ, P.FatalError.INVALID_HEADER_FIELD, 0, pdu))
    assert await queue.expect_eof() == b""


async def test_a_write_whose_r2t_never_comes(raw_target: RawTarget) -> None:
    queue = await io_queue(raw_target)
    rule = add(raw_target, action="drop_r2t", opcode="write", first=1)
    length = 4 * RAW_NS1_BLOCK
    write = rw_sqe(IoOpcode.WRITE, 30, 1, 0, 4, length)  # its data on R2T
    queue.send(queue.capsule(write))
    read(queue, 31)
    # The Write's R2T would have gone out before the Read was even parsed: the Read's
    # answer comes first, and nothing about the Write.
    assert c2h_fields(await raw_pdu(queue))[1] == 31
    assert cqe_of(await raw_pdu(queue)).cid == 31
    assert rule.hits == 1
    (ctrl,) = raw_target.target.subsystems[RAW_SUBNQN].controllers.values()
    assert ctrl.queues[1].commands_in_flight == 1  # the Write waits for its data
    # The next Write gets its R2T.
    queue.send(queue.capsule(rw_sqe(IoOpcode.WRITE, 32, 1, 0, 4, length)))
    r2t = await raw_pdu(queue)
    assert r2t[0] == P.PduType.R2T and P.DATA_BODY.unpack_from(r2t, P.CH_LEN)[0] == 32
    # The connection counts the R2T it sent, and the one it kept back apart.
    stats = ctrl.queues[1].conn.stats
    assert (stats.r2t_sent, stats.r2t_dropped) == (1, 1)


async def test_a_read_stalled_halfway(raw_target: RawTarget) -> None:
    queue = await io_queue(raw_target, hdgst=True, ddgst=True)
    rule = add(raw_target, action="stall_c2h", opcode="read", first=1)
    read(queue, 40, nlb=4)
    read(queue, 41)
    flags, cid, datao, datal, pdo = c2h_fields(first := await raw_pdu(queue))
    assert (cid, datao, datal) == (40, 0, 2 * RAW_NS1_BLOCK)  # half of it
    assert not flags & (P.FLAG_DATA_LAST | P.FLAG_DATA_SUCCESS)
    assert header_digest_ok(first) and first[pdo + datal :] == digest(first[pdo : pdo + datal])
    # Then the next Read: nothing more of Read 40, not even its completion, which the
    # target made before it parsed Read 41.
    assert c2h_fields(await raw_pdu(queue))[1] == 41
    assert cqe_of(await raw_pdu(queue)).cid == 41
    assert rule.hits == 1


async def test_the_rpc_refuses_a_bad_wire_rule_naming_the_field(
    raw_rpc_target: RawRpcTarget,
) -> None:
    for params, named in (
        ({"action": "corrupt_digest", "digest": "data", "opcode": "write"}, "opcode:"),
        ({"action": "corrupt_digest", "digest": "footer"}, "digest:"),
        ({"action": "term_req", "fes": "nope"}, "fes:"),
    ):
        answer = await raw_rpc_target.call("pynvmf_fault_add", **params)
        assert answer["error"]["code"] == INVALID_PARAMS
        assert answer["error"]["message"].startswith(named), answer
    rule_id = await raw_rpc_target.ok("pynvmf_fault_add", action="stall_c2h", opcode="read")
    (listed,) = await raw_rpc_target.ok("pynvmf_fault_list")
    assert listed["id"] == rule_id and listed["rule"] == {"action": "stall_c2h", "opcode": "read"}


@pytest.mark.parametrize("kind", ["type", "hlen", "plen"])
async def test_pynvmfs_host_terminates_on_a_malformed_pdu(raw_target: RawTarget, kind: str) -> None:
    add(raw_target, action="malformed_pdu", pdu=kind, opcode="read", first=1)
    port = raw_target.port
    ctrl = await connect(port.address, port.port, RAW_SUBNQN)
    try:
        with pytest.raises(NvmeConnectionError):
            await asyncio.wait_for(
                ctrl.namespace(1).read(0, memoryview(bytearray(RAW_NS1_BLOCK))), TIMEOUT
            )
    finally:
        await ctrl.close()
