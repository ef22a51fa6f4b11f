"""The controller (target) end of one NVMe/TCP connection. Sans-I/O.

Bytes come in through `reader` (BufferedProtocol style); buffers to send pile
up in `outbox`, and `on_output` is called when the outbox needs flushing at a
time the glue would not otherwise flush it (a completion after an await).

This module decides every transport question for the target: whether data is
in the capsule or fetched with R2T, how C2HData and responses are framed, which
digests a PDU carries, and which TermReq a malformed PDU earns. The NVMe
command semantics are the layer's above (`NvmeQueue`).

The seam between the two is named, as nvmet's `nvmet_fabrics_ops` and SPDK's
transport ops tables name theirs: `pynvmf.target.transport.QueueTransport`, which this
connection implements (as the RDMA transport's does). The NVMe layer gives the connection
its `NvmeQueue` once (`attach`), and states the queue's parameters once Connect has
bound it (`bind_queue`); it calls `complete`, `send_data`, `fetch_data` and `close`,
and, for a command a fault rule selected, `can_inject` and `inject` (wire_faults.py).
`Request`, `QueueParams`, `NvmeQueue` and `Charges` are the seam's, imported here under
their names as before.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pynvmf.block.inplace import Loans
from pynvmf.logs import ContextLog
from pynvmf.spec import pdu as P
from pynvmf.spec.command import (
    SGL_DATA_BLOCK_OFFSET,
    SGL_TRANSPORT_DATA_BLOCK,
    Sqe,
    new_sqe,
    unpack_sqe,
)
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import DNR, Status
from pynvmf.target.transport import (
    Buffer,
    Charges,
    NvmeQueue,
    QueueParams,
    QueueTransport,
    Request,
)
from pynvmf.tcp.config import EstablishedState, TransportConfig
from pynvmf.tcp.framing import (
    MARK_DATA_DIGEST,
    MARK_DROP_R2T,
    MARK_HEADER_DIGEST,
    MARK_STALL_C2H,
    MarkingWriter,
    PduConnection,
    PduReader,
    PduWriter,
)
from pynvmf.tcp.wire_faults import WireFault, capsule_header, malformed_resp

log = logging.getLogger(__name__)

# The admin queue's capsules may carry this much data (the Linux host assumes 8 KiB).
ADMIN_INLINE_LIMIT = 8192
# Connect data is 1 KiB and hosts send it in the capsule on every queue.
CONNECT_DATA_LEN = 1024
# Transfer tags are 16 bits; 0xFFFF is reserved.
_TTAG_LIMIT: Final = 0xFFFF
# The hot path's names as Final module constants: plain ints rather than enum members,
# and, where this module is compiled (mypyc, docs/performance.md), C statics rather than
# dictionary lookups.
_CAPSULE_RESP_TYPE: Final = int(P.PduType.CAPSULE_RESP)
_C2H_DATA_TYPE: Final = int(P.PduType.C2H_DATA)
_H2C_DATA_TYPE: Final = int(P.PduType.H2C_DATA)
_CAPSULE_CMD_TYPE: Final = int(P.PduType.CAPSULE_CMD)
_R2T_TYPE: Final = int(P.PduType.R2T)
_DATA_HEADER: Final = P.DATA_HEADER
# The builtin as a C static: compiled, the name `memoryview` is a lookup in the builtins
# module each time (a test per data PDU).
_MEMORYVIEW: Final = memoryview
_UNPACK_DATA_BODY: Final = P.DATA_BODY.unpack_from
_FABRICS: Final = int(AdminOpcode.FABRICS)
_CONNECT: Final = int(FabricsType.CONNECT)
# A response capsule without a header digest, in one pack of four values: its common
# header's eight bytes are always the same, and the CQE's DW2 (SQHD, SQID) and DW3 (CID,
# status) are one 32-bit value each. Eleven values took eleven conversions a completion.
_RESP_COMMON_HEADER: Final = P.CAPSULE_RESP.pack(
    _CAPSULE_RESP_TYPE, 0, P.CAPSULE_RESP_HLEN, 0, P.CAPSULE_RESP_HLEN, 0, 0, 0, 0, 0, 0
)[: P.CH_LEN]
_PACK_RESP: Final = struct.Struct("<8sQII").pack
# A C2HData header without digests or padding, in one pack of five values likewise: the
# common header's first four bytes (type, flags, HLEN, PDO) as one 32-bit value, the
# CCCID with its TTAG (0) as another; nine values took nine conversions a Read.
_PACK_C2H_HEADER: Final = struct.Struct("<IIIII4x").pack
_C2H_HEAD: Final = _C2H_DATA_TYPE | P.DATA_HLEN << 16 | P.DATA_HLEN << 24
_UNPACK_SQE: Final = unpack_sqe
_NEW_SQE: Final = new_sqe
_SQE: Final = Sqe


class _Unbudgeted:
    def give(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


_NO_BUDGET = _Unbudgeted()


def _no_context() -> dict[str, object]:
    return {}


_UNATTACHED_LOG = ContextLog(log, _no_context)


@dataclass(slots=True)
class TransportStats:
    commands: int = 0
    r2t_sent: int = 0
    r2t_dropped: int = 0  # kept from the wire by a drop_r2t fault rule (not in r2t_sent)
    h2c_data_pdus: int = 0
    c2h_data_pdus: int = 0
    in_capsule_bytes: int = 0
    term_reqs_sent: int = 0
    data_digest_errors: int = 0


class TargetConnection(PduConnection, QueueTransport):
    def __init__(
        self,
        config: TransportConfig,
        on_output: Callable[[], None],
        *,
        flush_now: Callable[[], None] | None = None,
    ) -> None:
        """`on_output` and `flush_now` are the glue's: `flush_now` hands the outbox to the
        socket at once, for data sent piece by piece (None: it waits for the next flush
        as usual)."""
        self.config = config
        self.stats = TransportStats()
        super().__init__(
            PduReader(
                self._on_pdu,
                self._on_fatal,
                accepted_types=frozenset((P.PduType.ICREQ,)),
                max_pdu_len=P.ICREQ_LEN,
                on_data_digest_error=self._on_data_digest_error,
            ),
            on_output,
        )
        self.established = False
        self.closing = False
        # None: a Read's data is always a copy (lend_views).
        self.loans: Loans | None = None
        self.close_reason = ""
        self.hpda = 0
        self.hdgst = False
        self.ddgst = False
        self.maxr2t = 0
        # The NVMe layer's queue (attach): plain attributes, for the hot path.
        self._on_command: Callable[[Request], None] = _unattached
        self._on_refused: Callable[[Request], None] = _ignore_request
        self._budget: Charges = _NO_BUDGET
        self._log = _UNATTACHED_LOG
        # The queue's parameters, as Connect decided them (bind_queue).
        self.qid = 0
        self.sq_size = 1
        self.sqhd_disabled = False
        self.inline_limit = ADMIN_INLINE_LIMIT
        self._borrow_capsule_data = False
        self._sqhd = 0
        self._inflight: dict[int, Request] = {}
        self._flush_now = flush_now
        self.undrained = 0
        self._r2t: dict[int, Request] = {}
        self._next_ttag = 0
        # Responses framed by _PACK_RESP (no header digest, no fault rule's marks).
        self._plain_resp = False
        self._plain_data = False
        # Latency tracking (batch_arrived): the clock read of the batch of input being
        # handled (0: not timing), and when the PDU parsed next began to arrive.
        self._batch_at = 0
        self._pdu_at = 0
        # Timed commands completed since the last flush, in order.
        self.timed: list[Request] = []

    def lend_views(self) -> Loans:
        """A Read's data may be a view of a memory namespace from now on (block/inplace.py),
        recalled into copies while it waits in the outbox if the memory is about to change:
        the glue hands each take_output's buffers to the kernel at once, copying what the
        kernel does not take, and returns the loans (no TLS channel holds them)."""
        if self.loans is None:
            self.loans = Loans(self._copy_lent_views)
        return self.loans

    def _copy_lent_views(self) -> None:
        out = self.outbox
        for i, buf in enumerate(out):
            if type(buf) is _MEMORYVIEW:
                out[i] = bytes(buf)

    def attach(self, queue: NvmeQueue) -> None:
        """The NVMe layer's queue above this connection, once, before any input."""
        self._on_command = queue.on_command
        self._on_refused = queue.on_refused
        self._budget = queue.budget
        self._log = ContextLog(log, queue.log_context)

    def bind_queue(self, params: QueueParams) -> None:
        """Connect has bound this connection to a queue: the completions carry its QID and
        SQHD from now on, and its capsules may carry as much data as the port allows for
        its kind (the admin queue's as much as Linux assumes)."""
        self.qid = params.qid
        self.sq_size = params.sq_size
        # The Connect took the queue's first entry: its completion, as nvmet's and SPDK's,
        # says the head is past it (it arrived before the queue had a size to count in).
        self._sqhd = 1 % params.sq_size
        self.sqhd_disabled = params.sqhd_disabled
        self.inline_limit = self.config.inline_data_size if params.qid else ADMIN_INLINE_LIMIT
        self._borrow_capsule_data = params.borrow_capsule_data

    # -- input ----------------------------------------------------------------------

    def _on_pdu(
        self, pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
    ) -> None:
        if pdu_type == _CAPSULE_CMD_TYPE:
            self._on_capsule(pdo, data_end, pdu)
        elif pdu_type == _H2C_DATA_TYPE:
            self._on_h2c_data(flags, pdo, data_end, pdu)
        elif pdu_type == P.PduType.ICREQ:
            self._on_icreq(pdu)
        elif pdu_type == P.PduType.H2C_TERM_REQ:
            fes, fei = P.TERM_BODY.unpack_from(pdu, P.CH_LEN)
            self._log.info("host terminated the connection: FES %#x FEI %#x", fes, fei)
            self.close(f"H2CTermReq FES {fes:#x}")

    def _on_icreq(self, pdu: memoryview) -> None:
        pfv, hpda, dgst, maxr2t = P.IC_BODY.unpack_from(pdu, P.CH_LEN)
        if pfv != P.PFV_1_0:
            self._terminate(P.FatalError.UNSUPPORTED_PARAMETER, P.OFFSET_PFV, bytes(pdu))
            return
        if hpda > 31:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_HPDA, bytes(pdu))
            return
        cfg = self.config
        hdgst = bool(dgst & P.DIGEST_HEADER) and cfg.allow_header_digest
        ddgst = bool(dgst & P.DIGEST_DATA) and cfg.allow_data_digest
        resp_dgst = (P.DIGEST_HEADER if hdgst else 0) | (P.DIGEST_DATA if ddgst else 0)
        self._emit(P.pack_ic(P.PduType.ICRESP, P.PFV_1_0, cfg.cpda, resp_dgst, cfg.max_h2c_data))
        self._establish(EstablishedState(hpda, hdgst, ddgst, maxr2t))

    def _establish(self, state: EstablishedState) -> None:
        """Frame and parse as the handshake settled (`state`): from here on the
        connection carries capsules and data."""
        cfg = self.config
        self.hpda = state.hpda
        self.maxr2t = state.maxr2t
        self.hdgst = state.hdgst
        self.ddgst = state.ddgst
        self.established = True
        self._frame_plainly()
        reader = self.reader
        reader.hdgst, reader.ddgst = self.hdgst, self.ddgst
        reader.pdo_alignment = (cfg.cpda + 1) * 4
        reader.accepted_types = frozenset(
            (P.PduType.CAPSULE_CMD, P.PduType.H2C_DATA, P.PduType.H2C_TERM_REQ)
        )
        reader.on_capsule = self._on_capsule  # capsules without data skip _on_pdu
        overhead = P.CAPSULE_CMD_HLEN + 2 * P.DIGEST_LEN + 4 * (cfg.cpda + 1)
        reader.set_max_pdu_len(
            max(cfg.inline_data_size, ADMIN_INLINE_LIMIT, cfg.max_h2c_data) + overhead
        )

    def _on_capsule(self, pdo: int, data_end: int, pdu: memoryview) -> None:
        sqe: Sqe = _NEW_SQE(_SQE, _UNPACK_SQE(pdu, P.CH_LEN))
        req = Request(sqe)
        at = self._batch_at
        if at:
            # The clock reads of the batches of input that brought its first and, where
            # that is a later one, its last bytes.
            started = req.started = self._pdu_at
            if started != at:
                req.dispatched = at
                self._pdu_at = at
        self.stats.commands += 1
        if not self.sqhd_disabled:
            self._sqhd = (self._sqhd + 1) % self.sq_size
        cid = sqe.cid
        inflight = self._inflight
        if cid in inflight:
            old = inflight[cid]
            if not old.reusable:
                self._refuse(req, Status.CMDID_CONFLICT | DNR, track=False)
                return
            # SPDK's host completes its outstanding AERs itself when it detaches and
            # reuses their CIDs (the Linux and SPDK targets accept the new command).
            old.retired = True
        elif len(inflight) >= self.sq_size:
            # More commands outstanding than the queue has entries (SQSIZE): the host
            # sent a capsule it may not send now.
            self._terminate(P.FatalError.PDU_SEQUENCE_ERROR, 0, pdu)
            return
        inflight[cid] = req
        if sqe.flags >> 6 not in (1, 2):
            # Fabrics describe data with SGLs (PSDT 01b or 10b), never PRPs. (The FUSE
            # bits are the NVMe layer's: fused operations pair queue entries.)
            self._refuse(req, Status.INVALID_FIELD | DNR)
            return
        data_len = data_end - pdo if pdo else 0
        if data_len:
            if sqe.sgl_type != SGL_DATA_BLOCK_OFFSET:
                self._refuse(req, Status.SGL_INVALID_TYPE | DNR)
            elif not _host_to_controller(sqe):
                self._refuse(req, Status.INVALID_FIELD | DNR)
            elif data_len > self._capsule_limit(sqe) or sqe.sgl_addr != 0:
                self._refuse(req, Status.SGL_INVALID_OFFSET | DNR)
            elif sqe.sgl_length != data_len:
                self._refuse(req, Status.SGL_INVALID_DATA | DNR)
            else:
                self.stats.in_capsule_bytes += data_len
                if self._borrow_capsule_data:
                    req.data = pdu[pdo:data_end]
                    self._on_command(req)
                else:
                    req.data = bytearray(pdu[pdo:data_end])
                    self._on_command(req)
            return
        if sqe.sgl_type == SGL_DATA_BLOCK_OFFSET and sqe.sgl_length:
            # The SGL promises in-capsule data that the capsule does not carry.
            self._refuse(req, Status.SGL_INVALID_DATA | DNR)
            return
        if sqe.sgl_length and sqe.sgl_type != SGL_TRANSPORT_DATA_BLOCK:
            self._refuse(req, Status.SGL_INVALID_TYPE | DNR)
            return
        self._on_command(req)

    def _refuse(self, req: Request, status: int, *, track: bool = True) -> None:
        """Fail a command before the NVMe layer sees it, and tell it so."""
        self.complete(req, status, track=track)
        self._on_refused(req)

    def _capsule_limit(self, sqe: Sqe) -> int:
        if sqe.opcode == _FABRICS and sqe.fctype == _CONNECT:
            return max(self.inline_limit, CONNECT_DATA_LEN)
        return self.inline_limit

    # -- R2T / H2CData -------------------------------------------------------------

    def fetch_data(self, req: Request, on_data: Callable[[Request], None]) -> None:
        """Ask the host for a command's data with R2T; `on_data(req)` runs once it is all here,
        or with req.data None if the transfer failed (the command is then already completed).

        The caller has validated the command (so no data moves for a command that
        will fail) and bounded req.length by the transfer limit.
        """
        req.data = bytearray(req.length)
        req.on_data = on_data
        ttag = self._allocate_ttag()
        req.ttag = ttag
        self._r2t[ttag] = req
        # Counted before the writer frames it: a writer that keeps it from the wire (a
        # drop_r2t fault rule) moves it to r2t_dropped (_r2t_dropped).
        self.stats.r2t_sent += 1
        self.writer.control(
            self.outbox,
            _DATA_HEADER,
            _R2T_TYPE,
            P.R2T_HLEN,
            req.sqe.cid,
            ttag,
            0,
            req.length,
        )
        self._output_added()

    def _frame_plainly(self) -> None:
        """Frame with the plain writer, as the handshake settled, and the common case
        without the writer's general code (same bytes)."""
        self.writer.configure(hdgst=self.hdgst, ddgst=self.ddgst, pda=self.hpda)
        self._plain_resp = not self.hdgst
        self._plain_data = (
            not self.hdgst
            and not self.ddgst
            and P.data_offset(P.DATA_HLEN, False, self.hpda) == P.DATA_HLEN
        )

    def _allocate_ttag(self) -> int:
        for _ in range(_TTAG_LIMIT):
            ttag = self._next_ttag
            self._next_ttag = (ttag + 1) % _TTAG_LIMIT
            if ttag not in self._r2t:
                return ttag
        raise RuntimeError("no free transfer tag")

    def _on_h2c_data(self, flags: int, pdo: int, data_end: int, pdu: memoryview) -> None:
        self._pdu_at = self._batch_at
        cccid, ttag, datao, datal = _UNPACK_DATA_BODY(pdu, P.CH_LEN)
        req = self._r2t.get(ttag)
        if req is None:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG, pdu)
            return
        if cccid != req.sqe.cid:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_CCCID, pdu)
            return
        data_len = data_end - pdo if pdo else 0
        if datal != data_len or not datal:
            # An H2CData PDU carries data: an empty one moves the transfer nowhere.
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_DATAL, pdu)
            return
        if datal > self.config.max_h2c_data:
            self._terminate(P.FatalError.DATA_LIMIT_EXCEEDED, 0, pdu)
            return
        end = datao + datal
        if datao != req.received or end > req.length:
            self._terminate(P.FatalError.DATA_OUT_OF_RANGE, 0, pdu)
            return
        if bool(flags & P.FLAG_DATA_LAST) != (end == req.length):
            # LAST_PDU marks the PDU that ends the R2T's range, and only that one.
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, pdu)
            return
        self.stats.h2c_data_pdus += 1
        assert req.data is not None
        req.data[datao : datao + datal] = pdu[pdo:data_end]
        req.received += datal
        if req.received == req.length:
            del self._r2t[ttag]
            on_data, req.on_data = req.on_data, None
            assert on_data is not None
            on_data(req)

    def _on_data_digest_error(
        self, pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
    ) -> None:
        """A data digest mismatch fails the command, not the connection."""
        self.stats.data_digest_errors += 1
        if pdu_type == P.PduType.CAPSULE_CMD:
            sqe = Sqe.unpack(pdu, P.CH_LEN)
            self.stats.commands += 1
            if not self.sqhd_disabled:
                self._sqhd = (self._sqhd + 1) % self.sq_size
            # Not tracked: a CID already in flight belongs to that command, not this one.
            self._refuse(Request(sqe), Status.TRANSIENT_TRANSPORT_ERROR, track=False)
        elif pdu_type == P.PduType.H2C_DATA:
            _cccid, ttag, _datao, _datal = P.DATA_BODY.unpack_from(pdu, P.CH_LEN)
            req = self._r2t.pop(ttag, None)
            if req is None:
                self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_TTAG, pdu)
                return
            on_data, req.on_data = req.on_data, None
            req.data = None
            self.complete(req, Status.TRANSIENT_TRANSPORT_ERROR)
            if on_data is not None:
                on_data(req)  # tells the waiting command that no data is coming

    # -- output ----------------------------------------------------------------------

    def batch_arrived(self, now: int) -> None:
        """The glue's clock read (monotonic ns) as a batch of input arrives, before it is
        parsed, while latency tracking is on; 0 once it is off. A PDU that began in an
        earlier batch began when the reader saw it incomplete."""
        self._batch_at = now
        since = self.reader.partial_since
        self._pdu_at = int(since * 1e9) if since and now else now

    @property
    def commands_in_flight(self) -> int:
        """Commands received on this connection and not completed yet (an admin queue's
        Asynchronous Event Requests among them)."""
        return len(self._inflight)

    def complete(
        self,
        req: Request,
        status: int,
        result: int = 0,
        data: Buffer | None = None,
        *,
        track: bool = True,
    ) -> None:
        """Send `data` (controller-to-host) if any, then the completion. After send_data,
        `data` is the rest of the command's data."""
        charge = req.charge
        if charge:
            req.charge = 0
            if data is not None and not self.closing:
                # Data handed to the socket may sit in its buffer until the host reads
                # it: the bytes stay charged until the glue says the output drained.
                self.undrained += charge
            else:
                self._budget.give(charge)
        if self.closing or req.retired:
            return
        if req.latency is not None:
            self.timed.append(req)
        cid = req.sqe.cid
        inflight = self._inflight
        if track and inflight.get(cid) is req:
            del inflight[cid]
        if req.ttag >= 0 and self._r2t.get(req.ttag) is req:
            del self._r2t[req.ttag]
        out = self.outbox
        if data is not None and status == 0 and len(data):
            success = self.sqhd_disabled
            self._emit_c2h_data(cid, data, req.sent, True, success)
            if success:
                if not self._receiving:
                    self._request_output()
                return
        if self._plain_resp:
            out.append(
                _PACK_RESP(
                    _RESP_COMMON_HEADER,
                    result,
                    (0xFFFF if self.sqhd_disabled else self._sqhd) | self.qid << 16,
                    cid | ((status << 1) & 0xFFFF) << 16,
                )
            )
        else:
            self.writer.capsule_resp(
                out,
                result & 0xFFFFFFFF,
                result >> 32,
                0xFFFF if self.sqhd_disabled else self._sqhd,
                self.qid,
                cid,
                (status << 1) & 0xFFFF,
            )
        if not self._receiving:
            self._request_output()

    def send_data(self, req: Request, data: Buffer) -> None:
        """Send the next part of a command's controller-to-host data (not its last part,
        which goes with complete), at once: the bytes `req` holds against the budget are
        given back once the socket has taken them (flush_now), so a large Read sent
        piece by piece holds about one piece at a time."""
        charge = req.charge
        if charge:
            req.charge = 0
            if self.closing:
                self._budget.give(charge)
            else:
                self.undrained += charge
        if self.closing or req.retired:
            return
        self._emit_c2h_data(req.sqe.cid, data, req.sent, False, False)
        req.sent += len(data) if type(data) is not _MEMORYVIEW else data.nbytes
        flush = self._flush_now
        if flush is not None:
            flush()
        else:
            self._request_output()

    def _emit_c2h_data(self, cid: int, data: Buffer, datao: int, last: bool, success: bool) -> None:
        self.stats.c2h_data_pdus += 1
        flags = (P.FLAG_DATA_LAST if last else 0) | (P.FLAG_DATA_SUCCESS if success else 0)
        n = len(data) if type(data) is not _MEMORYVIEW else data.nbytes
        if self._plain_data:
            # No digests, data right after the header: the header is one pack.
            out = self.outbox
            out.append(_PACK_C2H_HEADER(_C2H_HEAD | flags << 8, P.DATA_HLEN + n, cid, datao, n))
            out.append(data)
            return
        self.writer.c2h_data(self.outbox, flags, cid, datao, data, n)

    # -- fault rules on the wire (wire_faults.py, docs/faults.md) ----------------------

    def can_inject(self, req: Request, fault: WireFault) -> bool:
        """Whether `fault` can act on `req`'s PDUs here: the digest it corrupts was
        negotiated, data moves the way it needs. A rule that cannot selects nothing."""
        action = fault.action
        if action == "corrupt_digest":
            if fault.digest == "header":
                return self.hdgst
            return self.ddgst and _moves_data_to_host(req)
        if action == "stall_c2h":
            return _moves_data_to_host(req)
        if action == "drop_r2t":
            return req.data is None and req.length > 0 and _host_to_controller(req.sqe)
        return True

    def inject(self, req: Request, fault: WireFault) -> bool:
        """Act on `req`'s PDUs as `fault` says (can_inject said it can): True if the
        command is to run on as usual (its PDUs are marked), False if this took it (a
        TermReq closed the connection; a malformed PDU went out in place of its answer)."""
        action = fault.action
        if action == "term_req":
            self._terminate(fault.fes, fault.fei, capsule_header(req.sqe, self.hdgst))
            return False
        if action == "malformed_pdu":
            # The command stays among those in flight: its answer never comes.
            self._emit(malformed_resp(fault.pdu, self.qid, req.sqe.cid, self.hdgst))
            return False
        writer = self.writer
        if not isinstance(writer, MarkingWriter):
            # From now on every PDU goes through the writer, which frames the marked
            # commands' wrongly (the plain shortcuts would pass it by).
            writer = MarkingWriter(self._r2t_dropped)
            writer.configure(hdgst=self.hdgst, ddgst=self.ddgst, pda=self.hpda)
            self.writer = writer
            self._plain_resp = False
            self._plain_data = False
        if action == "corrupt_digest":
            mark = MARK_HEADER_DIGEST if fault.digest == "header" else MARK_DATA_DIGEST
        else:
            mark = MARK_DROP_R2T if action == "drop_r2t" else MARK_STALL_C2H
        writer.marks[req.sqe.cid] = mark
        return True

    def faults_gone(self) -> None:
        """No fault rule can select this connection's commands any more: it frames its
        PDUs plainly again (and by the shortcuts), unless a marked command has PDUs still
        to come (a stalled Read's completion, a digest not yet spoiled), which keep the
        MarkingWriter for the connection's life."""
        writer = self.writer
        if not isinstance(writer, MarkingWriter) or writer.marks or not self.established:
            return
        self.writer = PduWriter()
        self._frame_plainly()

    def _r2t_dropped(self) -> None:
        """The R2T fetch_data counted as sent never went out."""
        self.stats.r2t_sent -= 1
        self.stats.r2t_dropped += 1

    # -- errors and teardown ------------------------------------------------------------

    def _on_fatal(self, fes: int, fei: int, offending: bytes) -> None:
        if fes == P.FatalError.INVALID_HEADER_FIELD and fei == P.OFFSET_TYPE and offending:
            # A PDU the host may send, but not now (a capsule before ICReq, a second
            # ICReq), is out of sequence rather than malformed.
            host_types = (P.PduType.ICREQ, P.PduType.CAPSULE_CMD, P.PduType.H2C_DATA)
            if offending[0] in host_types:
                fes = P.FatalError.PDU_SEQUENCE_ERROR
        self._terminate(fes, fei, offending)

    def _terminate(self, fes: int, fei: int, offending: Buffer) -> None:
        """Send a C2HTermReq and close: the host violated the transport protocol."""
        if self.closing:
            return
        self._log.warning("terminating connection: FES %#x FEI %#x", fes, fei)
        self.stats.term_reqs_sent += 1
        self.reader.dead = True
        self._emit(P.pack_term_req(P.PduType.C2H_TERM_REQ, fes, fei, bytes(offending)))
        self.close(f"C2HTermReq FES {fes:#x} FEI {fei:#x}")
        self._request_output()

    def close(self, reason: str) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = reason
            self.reader.dead = True
            for req in self._r2t.values():
                req.on_data = None  # its waiter is failed by the NVMe layer's own cleanup
            self._r2t.clear()
            self._request_output()

    def output_drained(self) -> None:
        """The glue's socket buffer has emptied (or fallen below its low-water mark)."""
        if self.undrained:
            undrained, self.undrained = self.undrained, 0
            self._budget.give(undrained)

    def release(self) -> None:
        super().release()
        self._on_command = _ignore_request
        self._on_refused = _ignore_request
        self._log = _UNATTACHED_LOG
        self._flush_now = None
        # Nothing more is granted to this connection, and commands that will never complete
        # now hold nothing any more.
        self._budget.close()
        for req in self._inflight.values():
            if req.charge:
                self._budget.give(req.charge)
                req.charge = 0
        self._inflight.clear()
        self._r2t.clear()
        self.output_drained()
        if self.loans is not None:
            self.loans.returned()
            self.loans = None

    def pending_requests(self) -> list[Request]:
        return list(self._inflight.values())

    # -- hand-over: an established connection continued by another TargetConnection ------
    # (`pynvmf target --cores N` gives an I/O queue's connection to a worker process once
    # its Connect was validated: target/cores/workers.py and worker.py.)

    def input_pending(self) -> bool:
        """Whether bytes arrived that are not handled yet (a PDU in part, or more)."""
        return self.reader.unparsed > 0

    def export_state(self) -> EstablishedState:
        """What another TargetConnection continues this established one from (adopt)."""
        if not self.established:
            raise RuntimeError("the connection has not completed its ICReq")
        return EstablishedState(self.hpda, self.hdgst, self.ddgst, self.maxr2t, self._sqhd)

    def adopt(self, state: EstablishedState) -> None:
        """Continue a connection that another TargetConnection established (its ICReq
        and ICResp went through there), from `state` (export_state): this one has
        received nothing of it yet."""
        if self.established or self.reader.unparsed:
            raise RuntimeError("only a connection that has received nothing adopts another")
        self._establish(state)
        self._sqhd = state.sqhd


def _ignore_request(req: Request) -> None:
    pass


def _unattached(req: Request) -> None:
    raise AssertionError("a command before the NVMe layer attached")


def _moves_data_to_host(req: Request) -> bool:
    """Whether `req` has controller-to-host data (the data direction bits of its opcode)."""
    return req.length > 0 and bool(req.sqe.opcode & 0x2)


def _host_to_controller(sqe: Sqe) -> bool:
    code = sqe.fctype if sqe.opcode == _FABRICS else sqe.opcode
    return bool(code & 0x1)
