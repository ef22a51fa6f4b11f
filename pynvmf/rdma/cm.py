"""RDMA CM private data of the NVMe/RDMA transport binding (record format 0).

When a host opens a queue it sends a connect request (RDMA_CM_REQUEST) whose private data
says which queue and how large; the controller answers with an accept (RDMA_CM_REPLY) that
says how many commands it can receive, or with a reject (RDMA_CM_REJECT) that says why.
Every field is little endian. Layouts (byte offset, size), checked against Linux's
include/linux/nvme-rdma.h and SPDK's include/spdk/nvmf_spec.h:

- request, 32 bytes: RECFMT 0 (2), QID 2 (2), HRQSIZE 4 (2), HSQSIZE 6 (2), CNTLID 8 (2),
  reserved 10-31;
- accept, 32 bytes: RECFMT 0 (2), CRQSIZE 2 (2), reserved 4-31;
- reject, 4 bytes: RECFMT 0 (2), STS 2 (2).

HSQSIZE is 0's based (the Connect command's SQSIZE); HRQSIZE is the number of receive
entries the host posts for the queue's completions, 1's based: the Linux and SPDK hosts
send HSQSIZE + 1. CRQSIZE is the controller's receive queue size, 1's based. CNTLID names,
on an I/O queue, the controller the admin queue's Connect was answered with (the Linux host
leaves it zero on the admin queue).

The CM delivers a request's private data padded (an InfiniBand/RoCE CM REQ carries up to 56
bytes after the RDMA CM header): a longer buffer is accepted and the bytes past the layout
ignored; a shorter one is rejected with "invalid private data length".
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Container
from enum import IntEnum
from typing import Final, Self

RECFMT_1_0: Final = 0x0000

# The admin queue's largest size (entries): NVMe-oF's admin queue depth, 32 in Linux
# (NVME_AQ_DEPTH) and SPDK.
ADMIN_QUEUE_SIZE: Final = 32
# The smallest queue: SQSIZE is 0's based and must be at least 1 (two entries).
MIN_QUEUE_SIZE: Final = 2
# What pynvmf's RDMA listener accepts: I/O queues of up to 128 entries (HSQSIZE + 1), QIDs
# up to 128 (SPDK's RDMA defaults: max_queue_depth 128, max_io_qpairs_per_ctrlr 128).
IO_QUEUE_SIZE: Final = 128
MAX_QID: Final = 128


class RejectStatus(IntEnum):
    """STS of a reject's private data: the reasons the transport binding names."""

    INVALID_PRIVATE_DATA_LENGTH = 0x01
    INVALID_RECFMT = 0x02
    INVALID_QID = 0x03
    INVALID_HSQSIZE = 0x04
    INVALID_HRQSIZE = 0x05
    NO_RESOURCES = 0x06
    INVALID_IRD = 0x07
    INVALID_ORD = 0x08
    INVALID_CNTLID = 0x09


# What each status tells the host, for logs and error messages.
REJECT_MEANINGS: Final[dict[RejectStatus, str]] = {
    RejectStatus.INVALID_PRIVATE_DATA_LENGTH: "invalid private data length",
    RejectStatus.INVALID_RECFMT: "invalid record format (RECFMT)",
    RejectStatus.INVALID_QID: "invalid queue ID (QID)",
    RejectStatus.INVALID_HSQSIZE: "invalid host send queue size (HSQSIZE)",
    RejectStatus.INVALID_HRQSIZE: "invalid host receive queue size (HRQSIZE)",
    RejectStatus.NO_RESOURCES: "no resources",
    RejectStatus.INVALID_IRD: "invalid IRD (RDMA READs the host answers at once)",
    RejectStatus.INVALID_ORD: "invalid ORD (RDMA READs the host issues at once)",
    RejectStatus.INVALID_CNTLID: "invalid controller ID (CNTLID)",
}


class PrivateDataError(ValueError):
    """Private data that cannot be taken: ``field`` names the offending field and
    ``status`` is the reject status a controller answers a request with (None where the
    data is an accept or a reject, which a host reads and never answers)."""

    def __init__(self, message: str, *, field: str, status: RejectStatus | None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status = status


@dataclasses.dataclass(frozen=True)
class _Layout:
    """One private data message: its size on the wire and its fields, in order."""

    name: str
    size: int
    # (field name, byte offset, struct format of one little-endian field)
    fields: tuple[tuple[str, int, str], ...]

    def unpack(self, data: bytes | bytearray | memoryview) -> dict[str, int]:
        if len(data) < self.size:
            raise PrivateDataError(
                f"the {self.name} is {self.size} bytes, got {len(data)}",
                field="private_data_length",
                status=RejectStatus.INVALID_PRIVATE_DATA_LENGTH,
            )
        return {name: struct.unpack_from(fmt, data, offset)[0] for name, offset, fmt in self.fields}

    def pack(self, values: dict[str, int]) -> bytes:
        buf = bytearray(self.size)  # reserved bytes stay zero
        for name, offset, fmt in self.fields:
            value = values[name]
            limit = 1 << (8 * struct.calcsize(fmt))
            if not 0 <= value < limit:
                raise ValueError(f"{self.name}.{name}: {value} does not fit in {fmt}")
            struct.pack_into(fmt, buf, offset, value)
        return bytes(buf)


REQUEST_LAYOUT: Final = _Layout(
    "connect request",
    32,
    (
        ("recfmt", 0, "<H"),
        ("qid", 2, "<H"),
        ("hrqsize", 4, "<H"),
        ("hsqsize", 6, "<H"),
        ("cntlid", 8, "<H"),
    ),
)
ACCEPT_LAYOUT: Final = _Layout("accept", 32, (("recfmt", 0, "<H"), ("crqsize", 2, "<H")))
REJECT_LAYOUT: Final = _Layout("reject", 4, (("recfmt", 0, "<H"), ("sts", 2, "<H")))


def _check_recfmt(values: dict[str, int]) -> None:
    if values["recfmt"] != RECFMT_1_0:
        raise PrivateDataError(
            f"record format {values['recfmt']:#06x} is not {RECFMT_1_0:#06x}",
            field="recfmt",
            status=RejectStatus.INVALID_RECFMT,
        )


@dataclasses.dataclass(frozen=True)
class ConnectRequest:
    """The host's private data in RDMA_CM_REQUEST."""

    qid: int
    hrqsize: int
    hsqsize: int  # 0's based
    cntlid: int = 0
    recfmt: int = RECFMT_1_0

    @classmethod
    def for_queue(cls, qid: int, queue_size: int, cntlid: int = 0) -> Self:
        """What a host sends for a queue of ``queue_size`` entries (1's based): HSQSIZE is
        the 0's based size, HRQSIZE one receive per entry."""
        return cls(qid=qid, hrqsize=queue_size, hsqsize=queue_size - 1, cntlid=cntlid)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        values = REQUEST_LAYOUT.unpack(data)
        _check_recfmt(values)
        return cls(**values)

    def encode(self) -> bytes:
        return REQUEST_LAYOUT.pack(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class ConnectAccept:
    """The controller's private data in RDMA_CM_REPLY."""

    crqsize: int  # 1's based
    recfmt: int = RECFMT_1_0

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        values = ACCEPT_LAYOUT.unpack(data)
        _check_recfmt(values)
        return cls(**values)

    def encode(self) -> bytes:
        return ACCEPT_LAYOUT.pack(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class ConnectReject:
    """The controller's private data in RDMA_CM_REJECT."""

    status: RejectStatus
    recfmt: int = RECFMT_1_0

    @property
    def meaning(self) -> str:
        return REJECT_MEANINGS[self.status]

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        values = REJECT_LAYOUT.unpack(data)
        _check_recfmt(values)
        try:
            status = RejectStatus(values["sts"])
        except ValueError:
            raise PrivateDataError(
                f"reject status {values['sts']:#06x} is none the transport binding names",
                field="sts",
                status=None,
            ) from None
        return cls(status=status, recfmt=values["recfmt"])

    def encode(self) -> bytes:
        return REJECT_LAYOUT.pack({"recfmt": self.recfmt, "sts": int(self.status)})


@dataclasses.dataclass(frozen=True)
class QueueLimits:
    """What a controller takes on a port: the highest I/O queue ID and the largest queue
    sizes (entries, 1's based)."""

    max_qid: int
    io_queue_size: int
    admin_queue_size: int = ADMIN_QUEUE_SIZE

    def __post_init__(self) -> None:
        for name in ("io_queue_size", "admin_queue_size"):
            if not MIN_QUEUE_SIZE <= getattr(self, name) <= 0x10000:
                raise ValueError(f"{name}: {getattr(self, name)} is not in 2..65536")
        if not 0 <= self.max_qid <= 0xFFFE:
            raise ValueError(f"max_qid: {self.max_qid} is not in 0..65534")


def _check_qid(req: ConnectRequest, limits: QueueLimits, controllers: Container[int]) -> None:
    if req.qid > limits.max_qid:
        raise PrivateDataError(
            f"queue {req.qid} is above the highest I/O queue {limits.max_qid}",
            field="qid",
            status=RejectStatus.INVALID_QID,
        )


def _check_hsqsize(req: ConnectRequest, limits: QueueLimits, controllers: Container[int]) -> None:
    largest = limits.admin_queue_size if req.qid == 0 else limits.io_queue_size
    if not MIN_QUEUE_SIZE <= req.hsqsize + 1 <= largest:
        raise PrivateDataError(
            f"a queue of {req.hsqsize + 1} entries (0's based {req.hsqsize}) is not in"
            f" {MIN_QUEUE_SIZE}..{largest}",
            field="hsqsize",
            status=RejectStatus.INVALID_HSQSIZE,
        )


def _check_hrqsize(req: ConnectRequest, limits: QueueLimits, controllers: Container[int]) -> None:
    # One completion per command in flight: fewer receives than entries would let the
    # controller SEND a completion the host has no buffer for.
    if req.hrqsize < req.hsqsize + 1:
        raise PrivateDataError(
            f"{req.hrqsize} receive entries for a queue of {req.hsqsize + 1}",
            field="hrqsize",
            status=RejectStatus.INVALID_HRQSIZE,
        )


def _check_cntlid(req: ConnectRequest, limits: QueueLimits, controllers: Container[int]) -> None:
    # An I/O queue joins a controller its admin queue created; the admin queue names none.
    if req.qid != 0 and req.cntlid not in controllers:
        raise PrivateDataError(
            f"no controller {req.cntlid:#06x} to add I/O queue {req.qid} to",
            field="cntlid",
            status=RejectStatus.INVALID_CNTLID,
        )


# The checks of a decoded request, in the order a reject reports the first failure.
REQUEST_CHECKS: Final = (_check_qid, _check_hsqsize, _check_hrqsize, _check_cntlid)


def answer_connect(
    data: bytes | bytearray | memoryview,
    limits: QueueLimits,
    controllers: Container[int],
) -> tuple[ConnectRequest, ConnectAccept] | ConnectReject:
    """A controller's answer to a connect request's private data: the request and the
    accept to send (CRQSIZE: one receive per submission queue entry), or the reject with
    the status of the first field that fails. ``controllers`` holds the IDs I/O queues may
    join. Never raises on bad input."""
    try:
        req = ConnectRequest.decode(data)
        for check in REQUEST_CHECKS:
            check(req, limits, controllers)
    except PrivateDataError as exc:
        # A request's checks always name a status (None is for accepts and rejects).
        return ConnectReject(status=exc.status or RejectStatus.NO_RESOURCES)
    return req, ConnectAccept(crqsize=req.hsqsize + 1)


def reject_reason(data: bytes | bytearray | memoryview) -> str:
    """What a host says of a reject's private data (the status's meaning, or why the data
    is not a reject the binding defines)."""
    try:
        return ConnectReject.decode(data).meaning
    except PrivateDataError as exc:
        return f"unreadable reject ({exc})"
