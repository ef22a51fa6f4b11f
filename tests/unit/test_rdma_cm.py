"""pynvmf.rdma: the NVMe/RDMA transport binding's RDMA CM private data and the keyed SGL
data block descriptor, with the values of the binding (and of the Linux and SPDK hosts)
and the bad input a controller must refuse with the status the binding names."""

from __future__ import annotations

import struct

import pytest

from pynvmf.rdma.cm import (
    ADMIN_QUEUE_SIZE,
    REJECT_MEANINGS,
    ConnectAccept,
    ConnectReject,
    ConnectRequest,
    PrivateDataError,
    QueueLimits,
    RejectStatus,
    answer_connect,
    reject_reason,
)
from pynvmf.rdma.sgl import (
    CommandData,
    InCapsule,
    KeyedSgl,
    SglError,
    parse_descriptor,
    parse_sqe_descriptor,
)
from pynvmf.spec.status import DNR, Status

LIMITS = QueueLimits(max_qid=8, io_queue_size=128)
CONTROLLERS = {1, 7}


def request(
    recfmt: int = 0, qid: int = 1, hrqsize: int = 128, hsqsize: int = 127, cntlid: int = 1
) -> bytes:
    return struct.pack("<5H22x", recfmt, qid, hrqsize, hsqsize, cntlid)


# -- connect request ---------------------------------------------------------------------------


def test_request_layout_is_the_bindings() -> None:
    # What the Linux host sends for I/O queue 1 of 128 entries on controller 1:
    # hrqsize = queue size, hsqsize = the 0's based size, cntlid of the admin Connect.
    data = ConnectRequest.for_queue(qid=1, queue_size=128, cntlid=1).encode()
    assert data == bytes.fromhex("0000 0100 8000 7f00 0100".replace(" ", "")) + bytes(22)
    assert len(data) == 32
    assert ConnectRequest.decode(data) == ConnectRequest(qid=1, hrqsize=128, hsqsize=127, cntlid=1)


def test_request_padded_by_the_cm_is_taken() -> None:
    # A RoCE CM REQ carries 56 bytes of private data after the RDMA CM header.
    padded = request(qid=3) + bytes(24)
    assert ConnectRequest.decode(padded).qid == 3


@pytest.mark.parametrize("length", [0, 4, 31])
def test_short_request_is_invalid_length(length: int) -> None:
    with pytest.raises(PrivateDataError) as exc:
        ConnectRequest.decode(request()[:length])
    assert exc.value.field == "private_data_length"
    assert exc.value.status is RejectStatus.INVALID_PRIVATE_DATA_LENGTH


def test_request_recfmt_other_than_0_is_refused() -> None:
    with pytest.raises(PrivateDataError) as exc:
        ConnectRequest.decode(request(recfmt=1))
    assert exc.value.field == "recfmt"
    assert exc.value.status is RejectStatus.INVALID_RECFMT
    assert "recfmt" in str(exc.value)


def test_request_field_out_of_range_names_it_when_encoding() -> None:
    with pytest.raises(ValueError, match="qid"):
        ConnectRequest(qid=0x10000, hrqsize=2, hsqsize=1).encode()
    with pytest.raises(ValueError, match="hsqsize"):
        ConnectRequest.for_queue(qid=1, queue_size=0).encode()


# -- accept and reject -------------------------------------------------------------------------


def test_accept_layout() -> None:
    data = ConnectAccept(crqsize=128).encode()
    assert data == bytes.fromhex("00008000") + bytes(28)
    assert ConnectAccept.decode(data) == ConnectAccept(crqsize=128)


def test_short_accept_is_refused_naming_the_length() -> None:
    with pytest.raises(PrivateDataError) as exc:
        ConnectAccept.decode(bytes(4))
    assert exc.value.field == "private_data_length"


def test_reject_statuses_are_the_bindings() -> None:
    assert {s.name: s.value for s in RejectStatus} == {
        "INVALID_PRIVATE_DATA_LENGTH": 0x01,
        "INVALID_RECFMT": 0x02,
        "INVALID_QID": 0x03,
        "INVALID_HSQSIZE": 0x04,
        "INVALID_HRQSIZE": 0x05,
        "NO_RESOURCES": 0x06,
        "INVALID_IRD": 0x07,
        "INVALID_ORD": 0x08,
        "INVALID_CNTLID": 0x09,
    }
    assert set(REJECT_MEANINGS) == set(RejectStatus)


@pytest.mark.parametrize("status", list(RejectStatus))
def test_reject_round_trip(status: RejectStatus) -> None:
    data = ConnectReject(status=status).encode()
    assert data == struct.pack("<HH", 0, status)
    assert ConnectReject.decode(data).status is status
    assert reject_reason(data) == REJECT_MEANINGS[status]


def test_reject_with_an_unknown_status_names_sts() -> None:
    data = struct.pack("<HH", 0, 0x0A)
    with pytest.raises(PrivateDataError) as exc:
        ConnectReject.decode(data)
    assert exc.value.field == "sts"
    assert "sts" in reject_reason(data)
    assert "private_data_length" in reject_reason(b"\x00")


# -- the controller's answer -------------------------------------------------------------------


def test_io_queue_is_accepted_with_one_receive_per_entry() -> None:
    answer = answer_connect(request(), LIMITS, CONTROLLERS)
    assert not isinstance(answer, ConnectReject)
    req, accept = answer
    assert req.qid == 1
    assert accept.crqsize == 128


def test_admin_queue_of_32_entries_is_accepted_and_names_no_controller() -> None:
    data = request(qid=0, hrqsize=ADMIN_QUEUE_SIZE, hsqsize=ADMIN_QUEUE_SIZE - 1, cntlid=0)
    answer = answer_connect(data, LIMITS, set())
    assert not isinstance(answer, ConnectReject)
    assert answer[1].crqsize == ADMIN_QUEUE_SIZE


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (request()[:16], RejectStatus.INVALID_PRIVATE_DATA_LENGTH),
        (request(recfmt=2), RejectStatus.INVALID_RECFMT),
        (request(qid=9), RejectStatus.INVALID_QID),
        (request(qid=0xFFFF), RejectStatus.INVALID_QID),
        # The admin queue holds 32 entries at most.
        (request(qid=0, hrqsize=33, hsqsize=32, cntlid=0), RejectStatus.INVALID_HSQSIZE),
        (request(hrqsize=129, hsqsize=128), RejectStatus.INVALID_HSQSIZE),
        # A queue of one entry: SQSIZE must be at least 1.
        (request(hrqsize=1, hsqsize=0), RejectStatus.INVALID_HSQSIZE),
        # Fewer receives than entries: a completion would find no buffer.
        (request(hrqsize=127, hsqsize=127), RejectStatus.INVALID_HRQSIZE),
        (request(cntlid=2), RejectStatus.INVALID_CNTLID),
        # The first failing field decides: QID before HSQSIZE.
        (request(qid=9, hrqsize=0, hsqsize=0xFFFF, cntlid=5), RejectStatus.INVALID_QID),
    ],
)
def test_bad_request_is_rejected_with_the_bindings_status(
    data: bytes, status: RejectStatus
) -> None:
    answer = answer_connect(data, LIMITS, CONTROLLERS)
    assert isinstance(answer, ConnectReject)
    assert answer.status is status
    assert answer.encode() == struct.pack("<HH", 0, status)


def test_queue_limits_refuse_sizes_outside_the_spec() -> None:
    with pytest.raises(ValueError, match="io_queue_size"):
        QueueLimits(max_qid=1, io_queue_size=1)
    with pytest.raises(ValueError, match="max_qid"):
        QueueLimits(max_qid=0xFFFF, io_queue_size=128)


# -- keyed SGL data block descriptor -----------------------------------------------------------

READ_64K = CommandData(
    host_to_controller=False,
    in_capsule_bytes=0,
    in_capsule_limit=16384,
    transfer_length=65536,
    max_transfer=1 << 20,
)
WRITE_16K_IN_CAPSULE = CommandData(
    host_to_controller=True,
    in_capsule_bytes=16384,
    in_capsule_limit=16384,
    transfer_length=16384,
    max_transfer=1 << 20,
)


def keyed(length: int = 65536, ident: int = 0x40) -> bytes:
    return (
        struct.pack("<Q", 0x1122334455667788)
        + length.to_bytes(3, "little")
        + (struct.pack("<IB", 0xDEADBEEF, ident))
    )


def test_keyed_descriptor_layout() -> None:
    sgl = KeyedSgl(address=0x1122334455667788, length=0x123456, key=0xDEADBEEF)
    assert sgl.encode() == bytes.fromhex("8877665544332211563412efbeadde40")
    with_invalidate = KeyedSgl(address=1, length=2, key=3, invalidate=True).encode()
    assert with_invalidate[15] == 0x4F


@pytest.mark.parametrize("invalidate", [False, True])
def test_keyed_descriptor_parses_from_the_sqe(invalidate: bool) -> None:
    sgl = KeyedSgl(address=0x1000, length=65536, key=0x1234, invalidate=invalidate)
    sqe = bytes(24) + sgl.encode() + bytes(24)
    assert parse_sqe_descriptor(sqe, READ_64K) == sgl


def test_keyed_length_is_24_bits() -> None:
    with pytest.raises(ValueError, match="length"):
        KeyedSgl(address=0, length=1 << 24, key=0).encode()
    assert parse_descriptor(keyed(length=0xFFFFFF), _with(max_transfer=1 << 24)).length == (
        0xFFFFFF
    )


def _with(**changes: int | bool) -> CommandData:
    values = {**READ_64K.__dict__, **changes}
    return CommandData(**values)


@pytest.mark.parametrize(
    ("raw", "cmd", "field", "status"),
    [
        # NVMe/TCP's Transport SGL Data Block (5Ah) has no place on RDMA.
        (keyed(ident=0x5A), READ_64K, "sgl.type", Status.SGL_INVALID_TYPE),
        (keyed(ident=0x41), READ_64K, "sgl.subtype", Status.INVALID_FIELD),
        (keyed(length=65535), READ_64K, "sgl.length", Status.SGL_INVALID_DATA),
        (
            keyed(length=1 << 21),
            _with(transfer_length=1 << 21),
            "sgl.length",
            Status.SGL_INVALID_DATA,
        ),
        (keyed(), _with(in_capsule_bytes=512), "sgl.type", Status.SGL_INVALID_TYPE),
        (InCapsule(0, 16384).encode(), READ_64K, "sgl.subtype", Status.INVALID_FIELD),
        (
            InCapsule(0, 16384).encode()[:15] + b"\x00",
            WRITE_16K_IN_CAPSULE,
            "sgl.subtype",
            Status.INVALID_FIELD,
        ),
        (
            InCapsule(512, 16384).encode(),
            WRITE_16K_IN_CAPSULE,
            "sgl.address",
            Status.SGL_INVALID_OFFSET,
        ),
        (InCapsule(0, 8192).encode(), WRITE_16K_IN_CAPSULE, "sgl.length", Status.SGL_INVALID_DATA),
    ],
)
def test_bad_descriptor_names_the_field_and_the_status(
    raw: bytes, cmd: CommandData, field: str, status: Status
) -> None:
    with pytest.raises(SglError) as exc:
        parse_descriptor(raw, cmd)
    assert exc.value.field == field
    assert exc.value.status == status | DNR
    assert field in str(exc.value)


def test_in_capsule_data_of_16k_is_taken() -> None:
    raw = InCapsule(0, 16384).encode()
    assert raw == struct.pack("<QI3xB", 0, 16384, 0x01)
    assert parse_descriptor(raw, WRITE_16K_IN_CAPSULE) == InCapsule(0, 16384)


def test_descriptor_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        parse_descriptor(bytes(15), READ_64K)
