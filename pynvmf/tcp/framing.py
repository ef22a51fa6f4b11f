"""NVMe/TCP framing for either role, sans-I/O: PduReader splits the received byte
stream into PDUs; PduWriter frames the PDUs we send.

The reader owns one receive buffer and exposes it the way asyncio's
BufferedProtocol wants (`get_buffer` / `buffer_updated`), so the kernel copies
socket data straight into it. Each complete PDU is handed to `on_pdu` as a
memoryview into that buffer; the view is only valid during the call, so a
consumer that keeps data copies it (it usually has to assemble it into a
command buffer anyway).

Checks common to both roles live here: known type, the header length each type
must have, a PDU length that covers its header, digests present and correct
once negotiated, and a data offset that lies inside the PDU. A violation is
reported once through `on_fatal` with the TermReq fields the specification
names (FES and FEI), and the reader stops.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Final, Protocol, cast

from pynvmf.spec import pdu as P
from pynvmf.tcp import digest as D

# Handler signature: (pdu_type, flags, hlen, pdo, data_end, pdu) where `pdu` is
# the whole PDU, digests included, and its data is pdu[pdo:data_end] (pdo is 0
# for a PDU without data).
Buffer = bytes | bytearray | memoryview
PduHandler = Callable[[int, int, int, int, int, memoryview], None]
FatalHandler = Callable[[int, int, bytes], None]  # (fes, fei, offending header)


# A recording of the connection's bytes (pynvmf/record/tap.py): plaintext, after TLS.
class ByteTap(Protocol):
    def received(self, data: Buffer) -> None:
        """Bytes from the peer, before they are parsed."""
        ...

    def sent(self, out: list[Buffer]) -> None:
        """Buffers about to be handed to the socket (or the TLS channel)."""
        ...

    def closed(self, reason: str) -> None: ...


# Handler for a data digest mismatch: the PDU is otherwise well formed, and the
# spec makes this a per-command error, not a connection error.
DataDigestHandler = Callable[[int, int, int, int, int, memoryview], None]

# Module constants are Final: where this module is compiled (mypyc, docs/performance.md)
# a Final int is inlined and any other Final is a C static rather than a dict lookup.
_U32: Final = struct.Struct("<I")  # a digest as it travels: CRC32C, little endian
_PACK_U32: Final = _U32.pack
# The CRC function itself (a C function where an accelerated package is installed),
# called directly: D.digest is an interpreted call per digest.
_CRC32C: Final = D.crc32c
_RESIDUE: Final = D.RESIDUE
_FLAG_HDGST: Final = P.FLAG_HDGST
_FLAG_DDGST: Final = P.FLAG_DDGST
_DIGEST_LEN: Final = P.DIGEST_LEN
_DIGEST_FLAGS: Final = P.FLAG_HDGST | P.FLAG_DDGST
_CAPSULE_CMD: Final = int(P.PduType.CAPSULE_CMD)
_EXPECTED_HLEN: Final = P.EXPECTED_HLEN
# A PDU type's HLEN by type (a tuple index, compiled, where a set and a dict were two
# hashed lookups a PDU), -1 for a type the reader does not accept now (PduReader's
# accepted_types) or NVMe/TCP does not define.
_NOT_ACCEPTED: Final = -1


def _hlen_by_type(accepted: frozenset[int]) -> tuple[int, ...]:
    return tuple(
        _EXPECTED_HLEN.get(t, _NOT_ACCEPTED) if t in accepted else _NOT_ACCEPTED for t in range(256)
    )


# The target's two per-command PDUs, framed by PduWriter.c2h_data / capsule_resp.
_PACK_DATA_HEADER: Final = P.DATA_HEADER.pack
_PACK_CAPSULE_RESP: Final = P.CAPSULE_RESP.pack
_C2H_DATA_TYPE: Final = int(P.PduType.C2H_DATA)
_CAPSULE_RESP_TYPE: Final = int(P.PduType.CAPSULE_RESP)
_DATA_HLEN: Final = P.DATA_HLEN
_CAPSULE_RESP_HLEN: Final = P.CAPSULE_RESP_HLEN
# Receive buffer size once a connection is established (each read may fill it).
_MIN_BUFFER: Final = 256 * 1024
# PDU types as bit masks (1 << type): the parser tests them on every PDU, after it has
# checked the type is one it accepts (so the shift stays small), and a mask test is
# cheaper than a set lookup in compiled code.
_NO_DIGEST_TYPES: Final = sum(
    1 << t
    for t in (P.PduType.ICREQ, P.PduType.ICRESP, P.PduType.H2C_TERM_REQ, P.PduType.C2H_TERM_REQ)
)
_DATA_TYPES: Final = sum(
    1 << t
    for t in (
        P.PduType.CAPSULE_CMD,
        P.PduType.H2C_DATA,
        P.PduType.C2H_DATA,
        P.PduType.H2C_TERM_REQ,
        P.PduType.C2H_TERM_REQ,
    )
)


def _ignore_pdu(
    pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
) -> None:
    pass


def _ignore_fatal(fes: int, fei: int, offending: bytes) -> None:
    pass


def _ignore() -> None:
    pass


class PduReader:
    def __init__(
        self,
        on_pdu: PduHandler,
        on_fatal: FatalHandler,
        *,
        accepted_types: frozenset[int],
        max_pdu_len: int,
        on_data_digest_error: DataDigestHandler | None = None,
    ) -> None:
        self._on_pdu = on_pdu
        # A handler for command capsules, called as (pdo, data_end, pdu) instead of
        # on_pdu: the target's hot path, one call less per command.
        self.on_capsule: Callable[[int, int, memoryview], None] | None = None
        self._on_fatal = on_fatal
        self._on_ddgst_error = on_data_digest_error
        self._accepted_types = accepted_types
        self._hlen_of = _hlen_by_type(accepted_types)
        self.max_pdu_len = max_pdu_len
        self.hdgst = False
        self.ddgst = False
        # Data in PDUs we receive starts on a multiple of this ((C|H)PDA + 1) * 4.
        self.pdo_alignment = 4
        # The receive buffer holds two maximal PDUs: before the handshake that is a few
        # hundred bytes (an idle connection holds next to nothing); set_max_pdu_len grows
        # it, to at least _MIN_BUFFER, so that compaction (moving a partial PDU to the
        # front) is rare.
        self._buf = bytearray(2 * max_pdu_len)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self.dead = False
        self.bytes_received = 0
        self.pdus_received = 0
        # When the PDU now arriving started to (time.monotonic()), 0.0 between PDUs: the
        # glue's deadline for input a peer has started and not finished.
        self.partial_since = 0.0

    @property
    def buffer_size(self) -> int:
        """The receive buffer's size in bytes (what the connection's input holds)."""
        return len(self._buf)

    @property
    def unparsed(self) -> int:
        """Bytes received and not yet handed on: a PDU in part (or PDUs the handler
        stopped before)."""
        return self._end - self._start

    def release(self) -> None:
        """The connection is gone: drop the handlers (bound methods of the connection, a
        reference cycle) and the receive buffer now rather than at the next full
        garbage collection."""
        self.dead = True
        self._on_pdu = _ignore_pdu
        self.on_capsule = None
        self._on_fatal = _ignore_fatal
        self._on_ddgst_error = None
        try:
            self._view.release()
        except BufferError:
            return  # a handler still holds a view of a PDU: the buffer goes with it
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def set_max_pdu_len(self, max_pdu_len: int) -> None:
        self.max_pdu_len = max_pdu_len
        size = max(2 * max_pdu_len, _MIN_BUFFER)
        if len(self._buf) < size:
            new = bytearray(size)
            pending = self._end - self._start
            new[:pending] = self._view[self._start : self._end]
            self._view.release()
            self._buf, self._view = new, memoryview(new)
            self._start, self._end = 0, pending

    # -- BufferedProtocol-style input -------------------------------------------

    @property
    def accepted_types(self) -> frozenset[int]:
        """The PDU types this end takes now (any other is a fatal error)."""
        return self._accepted_types

    @accepted_types.setter
    def accepted_types(self, types: frozenset[int]) -> None:
        self._accepted_types = types
        self._hlen_of = _hlen_by_type(types)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._end == len(self._buf):
            self._compact()
        return self._view[self._end :]

    def arrived(self, nbytes: int) -> memoryview:
        """The `nbytes` written into `get_buffer()`'s view, before `buffer_updated`."""
        return self._view[self._end : self._end + nbytes]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self.bytes_received += nbytes
        self._parse()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Copy `data` in and parse it: for tests and stream transports."""
        data = memoryview(data)
        while len(data) and not self.dead:
            target = self.get_buffer()
            n = min(len(target), len(data))
            target[:n] = data[:n]
            data = data[n:]
            self.buffer_updated(n)

    def _compact(self) -> None:
        pending = self._end - self._start
        self._buf[:pending] = self._view[self._start : self._end]
        self._start, self._end = 0, pending

    # -- parsing -----------------------------------------------------------------

    def _parse(self) -> None:
        unpack = P.COMMON_HEADER.unpack_from
        pdus_before = self.pdus_received
        while not self.dead:
            # A handler may have replaced the buffer (set_max_pdu_len after an ICReq).
            buf = self._buf
            view = self._view
            start = self._start
            avail = self._end - start
            if avail < P.CH_LEN:
                break
            # Typed, so that compiled code does the arithmetic on machine integers.
            pdu_type: int
            flags: int
            hlen: int
            pdo: int
            plen: int
            pdu_type, flags, hlen, pdo, plen = unpack(buf, start)
            fes = -1
            expected_hlen: int = self._hlen_of[pdu_type]
            if expected_hlen == _NOT_ACCEPTED:
                fes, fei = P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_TYPE
            elif hlen != expected_hlen:
                fes, fei = P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_HLEN
            else:
                hdgst = self.hdgst and not (1 << pdu_type) & _NO_DIGEST_TYPES
                header_end = hlen + (P.DIGEST_LEN if hdgst else 0)
                if plen < header_end or plen > self.max_pdu_len:
                    fes = (
                        P.FatalError.DATA_LIMIT_EXCEEDED
                        if plen > self.max_pdu_len and pdu_type == P.PduType.H2C_DATA
                        else P.FatalError.INVALID_HEADER_FIELD
                    )
                    fei = P.OFFSET_PLEN
            if fes >= 0:
                # The TermReq carries the offending header (HLEN bytes, at most what a
                # TermReq holds): wait for all of it, so that what the peer is told does
                # not depend on where its stream was cut. Not for a type NVMe/TCP does
                # not define: its HLEN means nothing, and a peer speaking another
                # protocol (an SSH banner, an HTTP request) may send no more.
                header = max(hlen, P.CH_LEN) if pdu_type in _EXPECTED_HLEN else P.CH_LEN
                if avail < min(header, P.TERM_REQ_MAX_DATA):
                    break
                self._fatal(fes, fei, start, header)
                return
            if avail < plen:
                if start + plen > len(buf):
                    self._compact()
                break
            self._start = start + plen
            self.pdus_received += 1
            pdu = view[start : start + plen]
            dflags = flags & _DIGEST_FLAGS
            if dflags and (
                (dflags & P.FLAG_HDGST and not self.hdgst)
                or (dflags & P.FLAG_DDGST and not self.ddgst)
            ):
                # A digest flag for a digest this connection did not negotiate: the PDU's
                # layout is not the one both ends agreed on.
                self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, start, hlen)
                return
            if hdgst:
                if not flags & P.FLAG_HDGST:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, start, hlen)
                    return
                if _CRC32C(pdu[:header_end]) != _RESIDUE:  # header and its digest
                    self._fatal(P.FatalError.HEADER_DIGEST_ERROR, 0, start, hlen)
                    return
            if plen > header_end:
                if not (1 << pdu_type) & _DATA_TYPES:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_PLEN, start, hlen)
                    return
                no_digest = (1 << pdu_type) & _NO_DIGEST_TYPES
                ddgst = self.ddgst and not no_digest
                data_end = plen - (P.DIGEST_LEN if ddgst else 0)
                if no_digest:
                    pdo = hlen  # TermReq data follows the header directly
                elif pdo < header_end or pdo > data_end or pdo % self.pdo_alignment:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_PDO, start, hlen)
                    return
                if ddgst:
                    if not flags & P.FLAG_DDGST:
                        self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, start, hlen)
                        return
                    if _CRC32C(pdu[pdo:plen]) != _RESIDUE:  # data and its digest
                        if self._on_ddgst_error is None:
                            self._fatal(P.FatalError.HEADER_DIGEST_ERROR, 0, start, hlen)
                        else:
                            self._on_ddgst_error(pdu_type, flags, hlen, pdo, data_end, pdu)
                        continue
                if pdu_type == _CAPSULE_CMD and self.on_capsule is not None:
                    self.on_capsule(pdo, data_end, pdu)
                else:
                    self._on_pdu(pdu_type, flags, hlen, pdo, data_end, pdu)
            elif pdu_type == _CAPSULE_CMD and self.on_capsule is not None:
                self.on_capsule(0, header_end, pdu)
            else:
                self._on_pdu(pdu_type, flags, hlen, 0, header_end, pdu)
        if self._start == self._end:
            self._start = self._end = 0
            self.partial_since = 0.0
        elif self.pdus_received != pdus_before or not self.partial_since:
            self.partial_since = time.monotonic()

    def _fatal(self, fes: int, fei: int, start: int, header: int) -> None:
        # The offending PDU's header alone (what a TermReq holds of it at most), never the
        # bytes after it: what the peer is told must not depend on what else has arrived.
        self.dead = True
        offending = bytes(self._view[start : start + min(header, P.TERM_REQ_MAX_DATA)])
        self._on_fatal(fes, fei, offending)


class PduWriter:
    """Frames outgoing PDUs for one connection: the one place that decides, per PDU,
    which of the transport's offloads apply and how.

    - Header digest: CRC32C over the header, appended when negotiated (for every PDU
      but ICReq/ICResp and TermReq), computed by the accelerated CRC32C library when
      it is installed and by the software fallback otherwise (`tcp.digest`).
    - Data digest: CRC32C over the payload, appended after it when negotiated.
    - Data placement: the payload starts at the receiver's PDU data alignment
      ((H|C)PDA + 1) * 4, with padding after the header digest when needed.
    - Zero copy: the payload is the caller's buffer, appended to the output list as
      is; header, payload and digest leave in one writelines (sendmsg) call, so the
      payload is never concatenated with its header in user space.
    """

    __slots__ = ("ddgst", "hdgst", "pda")

    def __init__(self) -> None:
        self.hdgst = False
        self.ddgst = False
        self.pda = 0  # the peer's data alignment requirement, 0's based dwords

    def configure(self, *, hdgst: bool, ddgst: bool, pda: int) -> None:
        self.hdgst, self.ddgst, self.pda = hdgst, ddgst, pda

    def control(
        self, out: list[Buffer], layout: struct.Struct, pdu_type: int, hlen: int, *fields: object
    ) -> None:
        """A PDU without data (CapsuleResp, R2T, a capsule without in-capsule data).
        `layout` packs the whole header: common header, then `fields`."""
        if self.hdgst:
            header = layout.pack(pdu_type, _FLAG_HDGST, hlen, 0, hlen + _DIGEST_LEN, *fields)
            out.append(header)
            out.append(_PACK_U32(_CRC32C(header)))
        else:
            out.append(layout.pack(pdu_type, 0, hlen, 0, hlen, *fields))

    def data(
        self,
        out: list[Buffer],
        layout: struct.Struct,
        pdu_type: int,
        flags: int,
        hlen: int,
        payload: Buffer,
        *fields: object,
    ) -> None:
        """A PDU carrying `payload` (C2HData, H2CData, a capsule with in-capsule data)."""
        hdgst, ddgst = self.hdgst, self.ddgst
        length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
        # P.data_offset, inline (an interpreted call per PDU otherwise).
        start = hlen + _DIGEST_LEN if hdgst else hlen
        align = (self.pda + 1) * 4
        pdo = -(-start // align) * align
        plen = pdo + length + (_DIGEST_LEN if ddgst else 0)
        if hdgst:
            flags |= _FLAG_HDGST
        if ddgst:
            flags |= _FLAG_DDGST
        header = layout.pack(pdu_type, flags, hlen, pdo, plen, *fields)
        out.append(header)
        if hdgst:
            out.append(_PACK_U32(_CRC32C(header)))
        if pdo > start:
            out.append(bytes(pdo - start))
        out.append(payload)
        if ddgst:
            out.append(_PACK_U32(_CRC32C(payload)))

    # The target's per-command PDUs, as `data` and `control` frame them (the same bytes),
    # with the layout and its fields fixed: compiled, a call with `*fields` builds a
    # tuple, a list and a tuple again and calls `pack` through the generic call path,
    # most of what a CapsuleResp with a header digest cost (docs/performance.md,
    # "Digests without the writer's general calls").

    def c2h_data(
        self, out: list[Buffer], flags: int, cid: int, datao: int, payload: Buffer, n: int
    ) -> None:
        """A C2HData PDU carrying `payload` (`n` bytes) at `datao` of command `cid`."""
        hdgst, ddgst = self.hdgst, self.ddgst
        start = _DATA_HLEN + _DIGEST_LEN if hdgst else _DATA_HLEN
        align = (self.pda + 1) * 4
        pdo = -(-start // align) * align
        plen = pdo + n + (_DIGEST_LEN if ddgst else 0)
        if hdgst:
            flags |= _FLAG_HDGST
        if ddgst:
            flags |= _FLAG_DDGST
        header = _PACK_DATA_HEADER(_C2H_DATA_TYPE, flags, _DATA_HLEN, pdo, plen, cid, 0, datao, n)
        out.append(header)
        if hdgst:
            out.append(_PACK_U32(_CRC32C(header)))
        if pdo > start:
            out.append(bytes(pdo - start))
        out.append(payload)
        if ddgst:
            out.append(_PACK_U32(_CRC32C(payload)))

    def capsule_resp(
        self, out: list[Buffer], cdw0: int, cdw1: int, sqhd: int, sqid: int, cid: int, status: int
    ) -> None:
        """A CapsuleResp: the completion queue entry's fields, `status` with its phase bit."""
        hdgst = self.hdgst
        header = _PACK_CAPSULE_RESP(
            _CAPSULE_RESP_TYPE,
            _FLAG_HDGST if hdgst else 0,
            _CAPSULE_RESP_HLEN,
            0,
            _CAPSULE_RESP_HLEN + _DIGEST_LEN if hdgst else _CAPSULE_RESP_HLEN,
            cdw0,
            cdw1,
            sqhd,
            sqid,
            cid,
            status,
        )
        out.append(header)
        if hdgst:
            out.append(_PACK_U32(_CRC32C(header)))


class PduConnection:
    """What both ends of an NVMe/TCP connection share: PDUs come in through `reader`
    (filled the way asyncio's BufferedProtocol fills a buffer), framed buffers go out
    through `outbox`, and `on_output` asks the glue to flush the outbox when output
    appears outside input handling (input handling is always followed by a flush)."""

    def __init__(self, reader: PduReader, on_output: Callable[[], None]) -> None:
        self.reader = reader
        self.on_output = on_output
        self.outbox: list[Buffer] = []
        self.writer = PduWriter()
        self._receiving = False
        self._output_requested = False
        # Recording (docs/record-replay.md): None unless this connection is recorded, the
        # one test per batch of input and per flush that recording costs otherwise.
        self.tap: ByteTap | None = None

    def record(self, tap: ByteTap) -> None:
        """Record this connection's bytes, both ways, from now on."""
        self.tap = tap

    def data_received(self, nbytes: int) -> None:
        """The glue wrote `nbytes` into `reader.get_buffer()`."""
        if self.tap is not None:
            self.tap.received(self.reader.arrived(nbytes))
        self._receiving = True
        try:
            self.reader.buffer_updated(nbytes)
        finally:
            self._receiving = False

    def feed(self, data: Buffer) -> None:
        """Copy bytes in and handle them: for tests and stream transports."""
        if self.tap is not None:
            self.tap.received(data)
        self._receiving = True
        try:
            self.reader.feed(data)
        finally:
            self._receiving = False

    def release(self) -> None:
        """Once the connection has closed: break the reference cycles between this end,
        its reader and the glue's callbacks, so that the connection's memory (its receive
        buffer above all) is freed as soon as the glue lets go of it."""
        self.reader.release()
        self.on_output = _ignore
        self.outbox = []
        if self.tap is not None:
            self.tap.closed("connection closed")
            self.tap = None

    def take_output(self) -> list[Buffer]:
        out = self.outbox
        self.outbox = []
        self._output_requested = False
        if self.tap is not None and out:
            self.tap.sent(out)
        return out

    def _emit(self, buf: Buffer) -> None:
        self.outbox.append(buf)
        self._output_added()

    def _output_added(self) -> None:
        if not self._receiving:
            self._request_output()

    def _request_output(self) -> None:
        if not self._output_requested:
            self._output_requested = True
            self.on_output()


# -- PDUs framed wrongly on purpose (fault rules: tcp/wire_faults.py, docs/faults.md) ----------
# What a mark makes of the PDUs about one command (by CID), until the command's last PDU.
MARK_HEADER_DIGEST: Final = 1  # the first PDU about it carries a wrong header digest
MARK_DATA_DIGEST: Final = 2  # its first C2HData carries a wrong data digest
MARK_DROP_R2T: Final = 3  # its R2T is never sent
MARK_STALL_C2H: Final = 4  # half of its first C2HData's data is sent, nothing after
_STALLED: Final = 5  # a stalled command's later PDUs (its completion too) are not sent
_R2T: Final = int(P.PduType.R2T)
_C2H_DATA: Final = int(P.PduType.C2H_DATA)
_CAPSULE_RESP: Final = int(P.PduType.CAPSULE_RESP)
_FLAG_SUCCESS: Final = P.FLAG_DATA_SUCCESS
# Where the CID is among the header fields PduWriter.control takes (after the common header).
_CAPSULE_RESP_CID: Final = 4


def _spoiled(digest: Buffer) -> bytes:
    """A digest that is certainly wrong: every bit of the right one flipped."""
    return bytes(b ^ 0xFF for b in digest)


class MarkingWriter(PduWriter):
    """A PduWriter that frames the PDUs about marked commands wrongly, as a fault rule asked
    (TargetConnection.inject puts it in place of the connection's writer): the PDUs of
    every other command are framed as PduWriter frames them. A mark lasts until the
    command's last PDU (its CapsuleResp, or a C2HData with SUCCESS), or its first PDU for a
    digest; the connection's end takes the rest. `on_r2t_dropped` runs for each R2T a mark
    kept from the wire (the connection counts it dropped, not sent)."""

    __slots__ = ("marks", "on_r2t_dropped")

    def __init__(self, on_r2t_dropped: Callable[[], None] = _ignore) -> None:
        super().__init__()
        self.marks: dict[int, int] = {}
        self.on_r2t_dropped = on_r2t_dropped

    def control(
        self, out: list[Buffer], layout: struct.Struct, pdu_type: int, hlen: int, *fields: object
    ) -> None:
        if pdu_type == _R2T:
            cid = cast(int, fields[0])
        elif pdu_type == _CAPSULE_RESP:
            cid = cast(int, fields[_CAPSULE_RESP_CID])
        else:
            PduWriter.control(self, out, layout, pdu_type, hlen, *fields)
            return
        marks = self.marks
        mark = marks.get(cid, 0)
        if not mark:
            PduWriter.control(self, out, layout, pdu_type, hlen, *fields)
            return
        if pdu_type == _CAPSULE_RESP:
            del marks[cid]  # the command's last PDU
            if mark == _STALLED:
                return
        elif mark in (MARK_DROP_R2T, MARK_HEADER_DIGEST):
            del marks[cid]  # the R2T is the first PDU about it
            if mark == MARK_DROP_R2T:
                self.on_r2t_dropped()
                return
        frame: list[Buffer] = []
        PduWriter.control(self, frame, layout, pdu_type, hlen, *fields)
        if mark == MARK_HEADER_DIGEST and self.hdgst:
            frame[1] = _spoiled(frame[1])
        out.extend(frame)

    # The fixed-layout methods go through control and data, where the marks are read.

    def c2h_data(
        self, out: list[Buffer], flags: int, cid: int, datao: int, payload: Buffer, n: int
    ) -> None:
        self.data(out, P.DATA_HEADER, _C2H_DATA, flags, P.DATA_HLEN, payload, cid, 0, datao, n)

    def capsule_resp(
        self, out: list[Buffer], cdw0: int, cdw1: int, sqhd: int, sqid: int, cid: int, status: int
    ) -> None:
        self.control(
            out,
            P.CAPSULE_RESP,
            _CAPSULE_RESP,
            P.CAPSULE_RESP_HLEN,
            cdw0,
            cdw1,
            sqhd,
            sqid,
            cid,
            status,
        )

    def data(
        self,
        out: list[Buffer],
        layout: struct.Struct,
        pdu_type: int,
        flags: int,
        hlen: int,
        payload: Buffer,
        *fields: object,
    ) -> None:
        if pdu_type != _C2H_DATA:  # (the target sends no other PDU with data)
            PduWriter.data(self, out, layout, pdu_type, flags, hlen, payload, *fields)
            return
        marks = self.marks
        cid = cast(int, fields[0])
        mark = marks.get(cid, 0)
        if not mark or mark == MARK_DROP_R2T:
            if mark and flags & _FLAG_SUCCESS:
                del marks[cid]
            PduWriter.data(self, out, layout, pdu_type, flags, hlen, payload, *fields)
            return
        if mark == _STALLED:
            if flags & _FLAG_SUCCESS:
                del marks[cid]
            return
        if mark == MARK_STALL_C2H:
            # The first half of this PDU's data, as a PDU of its own that ends nothing; the
            # rest of the command's data and its completion stay here.
            marks[cid] = _STALLED
            if flags & _FLAG_SUCCESS:
                del marks[cid]
            view = memoryview(payload).cast("B")
            half = view.nbytes // 2
            datao = fields[2]
            PduWriter.data(
                self, out, layout, pdu_type, 0, hlen, view[:half], cid, fields[1], datao, half
            )
            return
        del marks[cid]  # a digest: the first PDU about it
        frame: list[Buffer] = []
        PduWriter.data(self, frame, layout, pdu_type, flags, hlen, payload, *fields)
        if mark == MARK_HEADER_DIGEST and self.hdgst:
            frame[1] = _spoiled(frame[1])
        elif mark == MARK_DATA_DIGEST and self.ddgst:
            frame[-1] = _spoiled(frame[-1])
        out.extend(frame)
