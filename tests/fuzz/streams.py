"""Hypothesis strategies for what a hostile peer sends: NVMe/TCP byte streams built from a
grammar of PDUs (well formed, subtly broken, and plain garbage), split into arbitrary
chunks, and the models of the layer above the transport that the properties drive.

The grammar matters: random bytes alone almost never get past the ICReq, so most
examples start with a valid handshake and then mix valid capsules and H2CData with
mutations of single fields, which is where parsers go wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, IoOpcode
from pynvmf.tcp.target import QueueParams, Request, TargetConnection, TransportConfig
from tests.support.raw import capsule, h2c_data, icreq

OPCODES = [
    IoOpcode.READ,
    IoOpcode.WRITE,
    IoOpcode.FLUSH,
    IoOpcode.DATASET_MANAGEMENT,
    IoOpcode.COPY,
    AdminOpcode.IDENTIFY,
    AdminOpcode.ASYNC_EVENT_REQUEST,
    AdminOpcode.FABRICS,
]


@dataclass(frozen=True)
class Shape:
    """What the stream's ICReq negotiates, so later PDUs can be framed to match."""

    hdgst: bool
    ddgst: bool


@st.composite
def sqes(draw: st.DrawFn) -> bytes:
    opcode = draw(st.sampled_from(OPCODES) | st.integers(0, 255))
    cid = draw(st.integers(0, 15))  # few CIDs, so that reuse and conflicts happen
    nsid = draw(st.sampled_from([0, 1, 2, 0xFFFFFFFF]) | st.integers(0, 2**32 - 1))
    if opcode == AdminOpcode.FABRICS:
        nsid = draw(st.sampled_from(list(FabricsType)) | st.integers(0, 255))
    sgl_type = draw(
        st.sampled_from([C.SGL_DATA_BLOCK_OFFSET, C.SGL_TRANSPORT_DATA_BLOCK]) | st.integers(0, 255)
    )
    sgl_length = draw(st.sampled_from([0, 512, 4096, 16384, 1 << 20]) | st.integers(0, 2**32 - 1))
    flags = draw(st.sampled_from([0x40, 0x80, 0x41, 0x42]) | st.integers(0, 255))
    cdws = [draw(st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 7, 0xFF])) for _ in range(6)]
    return C.build_sqe(
        opcode,
        cid,
        nsid,
        *cdws,
        sgl_type=sgl_type,
        sgl_length=sgl_length,
        sgl_addr=draw(st.sampled_from([0, 0]) | st.integers(0, 2**64 - 1)),
        flags=flags,
    )


def _mutate(draw: st.DrawFn, pdu: bytes) -> bytes:
    """One field-level mutation: flip a byte, truncate, or rewrite PLEN/PDO/HLEN."""
    kind = draw(st.sampled_from(["none", "none", "byte", "truncate", "plen", "pdo", "hlen"]))
    if kind == "none" or not pdu:
        return pdu
    if kind == "byte":
        pos = draw(st.integers(0, len(pdu) - 1))
        return pdu[:pos] + bytes([draw(st.integers(0, 255))]) + pdu[pos + 1 :]
    if kind == "truncate":
        return pdu[: draw(st.integers(0, len(pdu) - 1))]
    offset = {"plen": 4, "pdo": 3, "hlen": 2}[kind]
    size = 4 if kind == "plen" else 1
    value = draw(st.integers(0, 2 ** (8 * size) - 1))
    return pdu[:offset] + value.to_bytes(size, "little") + pdu[offset + size :]


@st.composite
def pdus_after_handshake(draw: st.DrawFn, shape: Shape) -> bytes:
    kind = draw(st.sampled_from(["capsule", "capsule", "h2c", "term", "garbage", "icreq"]))
    dg = {"hdgst": shape.hdgst, "ddgst": shape.ddgst}
    if kind == "capsule":
        data = draw(st.sampled_from([b"", b"\0" * 16, b"\xa5" * 512, b"\x01" * 4096]))
        pdu = capsule(draw(sqes()), data, **dg)
    elif kind == "h2c":
        data = draw(st.sampled_from([b"", b"\x5a" * 512, b"\x5a" * 4096]))
        pdu = h2c_data(
            draw(st.integers(0, 15)),
            draw(st.integers(0, 4) | st.integers(0, 0xFFFF)),
            draw(st.sampled_from([0, 512, 4096]) | st.integers(0, 2**32 - 1)),
            data,
            last=draw(st.booleans()),
            **dg,
        )
    elif kind == "term":
        pdu = P.pack_term_req(P.PduType.H2C_TERM_REQ, draw(st.integers(0, 0xFFFF)), 0)
    elif kind == "icreq":
        pdu = icreq()
    else:
        pdu = draw(st.binary(max_size=96))
    return _mutate(draw, pdu)


@st.composite
def host_streams(draw: st.DrawFn) -> tuple[Shape, bytes]:
    """(negotiated shape, bytes) of what a host sends a target."""
    shape = Shape(hdgst=draw(st.booleans()), ddgst=draw(st.booleans()))
    dgst = (P.DIGEST_HEADER if shape.hdgst else 0) | (P.DIGEST_DATA if shape.ddgst else 0)
    start = icreq(dgst=dgst, hpda=draw(st.sampled_from([0, 0, 1, 31])))
    if draw(st.integers(0, 9)) == 0:
        start = _mutate(draw, start)
    body = draw(st.lists(pdus_after_handshake(shape), max_size=12))
    return shape, start + b"".join(body)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the given positions (sorted, deduplicated, clipped)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    out, last = [], 0
    for point in [*points, len(data)]:
        out.append(data[last:point])
        last = point
    return [piece for piece in out if piece]


cut_lists = st.lists(st.integers(0, 20000), max_size=16)


@dataclass
class ModelController:
    """The NVMe layer a fuzzed TargetConnection talks to: every decision is a function of
    the request's position, so the same stream cut differently gets the same answers."""

    conn: TargetConnection | None = None
    seen: list[bytes] = field(default_factory=list)
    arrivals: int = 0

    @property
    def budget(self) -> ModelController:
        return self  # data buffers are not counted here

    def give(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    def on_refused(self, req: Request) -> None:
        pass

    def log_context(self) -> dict[str, object]:
        return {}

    def on_command(self, req: Request) -> None:
        assert self.conn is not None
        index = len(self.seen)
        self.seen.append(req.sqe.pack())
        choice = index % 5
        if choice == 0:
            self.conn.complete(req, 0)
        elif choice == 1:
            length = min(req.length, 8192) if req.sqe.opcode & 0x2 else 0
            self.conn.complete(req, 0, 0, bytes(length) if length else None)
        elif choice == 2 and req.data is None and 0 < req.length <= 65536:
            self.conn.fetch_data(req, self._arrived)
        elif choice == 3:
            req.reusable = True  # parked, as an AER
        else:
            self.conn.complete(req, 0x4002)

    def _arrived(self, req: Request) -> None:
        self.arrivals += 1
        assert self.conn is not None
        self.conn.complete(req, 0 if req.data is not None else 0x22)


def drive_target(pieces: list[bytes], sq_size: int = 32) -> tuple[bytes, ModelController]:
    """Feed `pieces` to a fresh target connection (bound as an I/O queue once established)
    and return everything it sent, with the model that answered its commands."""
    model = ModelController()
    outputs: list[bytes] = []
    conn = TargetConnection(
        TransportConfig(max_h2c_data=65536, inline_data_size=16384), lambda: None
    )
    conn.attach(model)
    # Bound from the start as the NVMe layer binds an I/O queue, so that what the
    # connection does never depends on where the stream was cut.
    conn.bind_queue(QueueParams(1, sq_size))
    model.conn = conn
    for piece in pieces:
        if conn.closing:
            break
        conn.feed(piece)
        outputs.extend(bytes(buf) for buf in conn.take_output())
    return b"".join(outputs), model
