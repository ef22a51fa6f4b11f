"""The host (initiator) end of one NVMe/TCP connection. Sans-I/O.

The mirror image of tcp/target.py: bytes come in through `reader` (BufferedProtocol
style), buffers to send pile up in `outbox`, and `on_output` is called when the
outbox needs flushing at a time the glue would not otherwise flush it (a
submission from a coroutine rather than from inside `data_received`).

This module decides every transport question for the host: ICReq/ICResp, whether
write data goes in the capsule or waits for an R2T, H2CData framing and
MAXH2CDATA, C2HData assembly, which digests a PDU carries, and which TermReq a
malformed controller PDU earns. Command ids live here too (one free list per
connection, i.e. per NVMe queue) because responses are matched by them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pynvmf.spec import pdu as P
from pynvmf.spec.command import (
    CONNECT_DATA_SIZE,
    SGL_DATA_BLOCK_OFFSET,
    SGL_TRANSPORT_DATA_BLOCK,
    build_sqe,
)
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import Status
from pynvmf.tcp.framing import PduConnection, PduReader
from pynvmf.tcp.target import ADMIN_INLINE_LIMIT

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview

# The specification's floor for MAXH2CDATA; a smaller value is a broken controller.
MIN_MAXH2CDATA = 4096
# Status of a command that never got a completion because the connection failed.
ABORTED = -1
# Byte offset of the CID inside a CapsuleResp PDU (common header + CQE DW0..DW2).
_OFFSET_RESP_CID = P.CH_LEN + 12
_TERM_REQ_MAX_LEN = P.TERM_REQ_HLEN + P.TERM_REQ_MAX_DATA
_CONTROLLER_TYPES = (
    P.PduType.ICRESP,
    P.PduType.CAPSULE_RESP,
    P.PduType.C2H_DATA,
    P.PduType.R2T,
    P.PduType.C2H_TERM_REQ,
)


class HostCommand:
    """One command in flight on this connection.

    `data` is host-to-controller data still to be sent on an R2T (None once it
    went in the capsule); `into` receives controller-to-host data. `waiter` is the
    glue's (an asyncio future); this module never looks at it.
    """

    __slots__ = (
        "cid",
        "data",
        "discard",
        "into",
        "length",
        "opcode",
        "received",
        "result",
        "sent",
        "sqe",
        "status",
        "transfer_error",
        "waiter",
    )

    def __init__(self, cid: int, opcode: int, sqe: bytes, length: int) -> None:
        self.cid = cid
        self.opcode = opcode
        self.sqe = sqe
        self.length = length
        self.data: memoryview | None = None
        self.into: memoryview | None = None
        self.sent = 0
        self.received = 0
        self.status = 0
        self.result = 0
        # A data digest mismatch or short transfer: the command fails, the connection lives.
        self.transfer_error = False
        # The caller gave up waiting (cancelled): late data must not land in its buffer.
        self.discard = False
        self.waiter: Any = None


@dataclass(slots=True)
class HostTransportStats:
    commands: int = 0
    in_capsule_bytes: int = 0
    r2t_received: int = 0
    h2c_data_pdus: int = 0
    c2h_data_pdus: int = 0
    c2h_success_completions: int = 0
    data_digest_errors: int = 0
    term_reqs_sent: int = 0
    max_inflight: int = 0


class HostConnection(PduConnection):
    def __init__(
        self,
        depth: int,
        on_complete: Callable[[HostCommand], None],
        on_output: Callable[[], None],
        *,
        header_digest: bool = False,
        data_digest: bool = False,
        max_transfer: int = 1024 * 1024,
        hpda: int = 0,
        on_established: Callable[[], None] | None = None,
        on_closed: Callable[[str], None] | None = None,
    ) -> None:
        if not 1 <= depth <= 0xFFFF:
            raise ValueError(f"queue depth {depth} out of range")
        self.depth = depth
        self.on_complete = on_complete
        self.on_established = on_established
        self.on_closed = on_closed
        self.want_hdgst = header_digest
        self.want_ddgst = data_digest
        self.max_transfer = max_transfer
        self.hpda = hpda
        self.stats = HostTransportStats()
        super().__init__(
            PduReader(
                self._on_pdu,
                self._on_fatal,
                # A controller may refuse the ICReq with a TermReq instead of an ICResp.
                accepted_types=frozenset((P.PduType.ICRESP, P.PduType.C2H_TERM_REQ)),
                max_pdu_len=max(P.ICRESP_LEN, _TERM_REQ_MAX_LEN),
                on_data_digest_error=self._on_data_digest_error,
            ),
            on_output,
        )
        self.started = False
        self.established = False
        self.closing = False
        self.close_reason = ""
        # Negotiated by ICResp.
        self.hdgst = False
        self.ddgst = False
        self.cpda = 0
        self.maxh2cdata = 0
        # In-capsule data limit: 8 KiB on the admin queue; IOCCSZ*16-64 on an I/O queue
        # (set_inline_limit).
        self.inline_limit = ADMIN_INLINE_LIMIT
        self._slots: list[HostCommand | None] = [None] * depth
        # A stack, so the lowest (most recently freed) ids are reused first.
        self._free = list(range(depth - 1, -1, -1))

    # -- state --------------------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def inflight(self) -> int:
        return self.depth - len(self._free)

    def set_inline_limit(self, size: int) -> None:
        """Send at most `size` bytes of a command's data in its capsule (the controller's
        IOCCSZ less the SQE on an I/O queue, or less), for the commands submitted from now
        on; larger data waits for the controller's R2T."""
        self.inline_limit = size

    def start(self) -> None:
        """Queue the ICReq: the first PDU of every connection."""
        if self.started:
            raise RuntimeError("ICReq already sent")
        self.started = True
        dgst = (P.DIGEST_HEADER if self.want_hdgst else 0) | (
            P.DIGEST_DATA if self.want_ddgst else 0
        )
        # MAXR2T 0: one outstanding R2T per command, all a host needs.
        self._emit(P.pack_ic(P.PduType.ICREQ, P.PFV_1_0, self.hpda, dgst, 0))

    # -- input ----------------------------------------------------------------------------

    def _on_pdu(
        self, pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
    ) -> None:
        if pdu_type == P.PduType.CAPSULE_RESP:
            self._on_capsule_resp(pdu)
        elif pdu_type == P.PduType.C2H_DATA:
            self._on_c2h_data(flags, pdo, data_end, pdu, corrupt=False)
        elif pdu_type == P.PduType.R2T:
            self._on_r2t(pdu)
        elif pdu_type == P.PduType.ICRESP:
            self._on_icresp(pdu)
        elif pdu_type == P.PduType.C2H_TERM_REQ:
            fes, fei = P.TERM_BODY.unpack_from(pdu, P.CH_LEN)
            log.warning("controller terminated the connection: FES %#x FEI %#x", fes, fei)
            self.close(f"controller sent C2HTermReq (FES {fes:#x}, FEI {fei:#x})")

    def _on_icresp(self, pdu: memoryview) -> None:
        pfv, cpda, dgst, maxh2cdata = P.IC_BODY.unpack_from(pdu, P.CH_LEN)
        if pfv != P.PFV_1_0:
            self._terminate(P.FatalError.UNSUPPORTED_PARAMETER, P.OFFSET_PFV, pdu)
            return
        if cpda > 31:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_HPDA, pdu)
            return
        hdgst, ddgst = bool(dgst & P.DIGEST_HEADER), bool(dgst & P.DIGEST_DATA)
        # Like Linux: a digest the user asked for and did not get is as much an error
        # as one imposed unasked; silently running without it would hide the mismatch.
        if hdgst != self.want_hdgst or ddgst != self.want_ddgst or dgst & ~0x3:
            self._terminate(P.FatalError.UNSUPPORTED_PARAMETER, P.OFFSET_DGST, pdu)
            return
        if maxh2cdata < MIN_MAXH2CDATA or maxh2cdata % 4:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_MAXR2T, pdu)
            return
        self.hdgst, self.ddgst = hdgst, ddgst
        self.cpda = cpda
        self.writer.configure(hdgst=hdgst, ddgst=ddgst, pda=cpda)
        self.maxh2cdata = maxh2cdata
        reader = self.reader
        reader.hdgst, reader.ddgst = hdgst, ddgst
        reader.accepted_types = frozenset(
            (P.PduType.CAPSULE_RESP, P.PduType.C2H_DATA, P.PduType.R2T, P.PduType.C2H_TERM_REQ)
        )
        # A C2HData PDU never carries more than one command's data, and we never ask
        # for more than max_transfer bytes in one command.
        overhead = P.DATA_HLEN + 2 * P.DIGEST_LEN + 4 * (self.hpda + 1)
        reader.set_max_pdu_len(max(self.max_transfer + overhead, _TERM_REQ_MAX_LEN))
        self.established = True
        if self.on_established is not None:
            self.on_established()

    def _lookup(self, cid: int) -> HostCommand | None:
        return self._slots[cid] if cid < self.depth else None

    def _on_capsule_resp(self, pdu: memoryview) -> None:
        _t, _f, _h, _o, _l, dw0, dw1, _sqhd, _sqid, cid, sf = P.CAPSULE_RESP.unpack_from(pdu)
        cmd = self._lookup(cid)
        if cmd is None:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, _OFFSET_RESP_CID, pdu)
            return
        status = sf >> 1
        if status == 0 and (
            cmd.transfer_error or (cmd.into is not None and cmd.received != cmd.length)
        ):
            status = _transfer_failure(cmd)
        self._finish(cmd, status, dw0 | dw1 << 32)

    def _on_c2h_data(
        self, flags: int, pdo: int, data_end: int, pdu: memoryview, *, corrupt: bool
    ) -> None:
        _t, _f, _h, _o, _l, cid, _ttag, datao, datal = P.DATA_HEADER.unpack_from(pdu)
        cmd = self._lookup(cid)
        if cmd is None or cmd.into is None:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_CCCID, pdu)
            return
        n = data_end - pdo if pdo else 0
        if datal != n:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_DATAL, pdu)
            return
        if datao != cmd.received or datao + n > cmd.length:
            self._terminate(P.FatalError.DATA_OUT_OF_RANGE, P.OFFSET_DATA_DATAO, pdu)
            return
        if flags & P.FLAG_DATA_SUCCESS and not flags & P.FLAG_DATA_LAST:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, pdu)
            return
        self.stats.c2h_data_pdus += 1
        if corrupt:
            cmd.transfer_error = True
        elif n and not cmd.discard:
            cmd.into[datao : datao + n] = pdu[pdo:data_end]
        cmd.received = datao + n
        if flags & P.FLAG_DATA_SUCCESS:
            # SQ flow control is off: this PDU stands in for the CapsuleResp.
            self.stats.c2h_success_completions += 1
            failed = cmd.transfer_error or cmd.received != cmd.length
            self._finish(cmd, _transfer_failure(cmd) if failed else 0, 0)

    def _on_r2t(self, pdu: memoryview) -> None:
        _t, _f, _h, _o, _l, cid, ttag, r2to, r2tl = P.DATA_HEADER.unpack_from(pdu)
        cmd = self._lookup(cid)
        if cmd is None or cmd.data is None:
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_DATA_CCCID, pdu)
            return
        if r2tl == 0 or r2to != cmd.sent or r2to + r2tl > cmd.length:
            self._terminate(P.FatalError.DATA_OUT_OF_RANGE, P.OFFSET_DATA_DATAO, pdu)
            return
        self.stats.r2t_received += 1
        self._send_h2c_data(cmd, ttag, r2to, r2tl)

    def _on_data_digest_error(
        self, pdu_type: int, flags: int, hlen: int, pdo: int, data_end: int, pdu: memoryview
    ) -> None:
        """A data digest mismatch fails the command, not the connection."""
        self.stats.data_digest_errors += 1
        if pdu_type == P.PduType.C2H_DATA:
            self._on_c2h_data(flags, pdo, data_end, pdu, corrupt=True)
        else:
            # Only C2HData carries data towards the host (and TermReqs, undigested).
            self._terminate(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_TYPE, pdu)

    # -- output -------------------------------------------------------------------------

    def submit(
        self,
        opcode: int,
        nsid: int = 0,
        cdw10: int = 0,
        cdw11: int = 0,
        cdw12: int = 0,
        cdw13: int = 0,
        cdw14: int = 0,
        cdw15: int = 0,
        *,
        data: Buffer | None = None,
        into: memoryview | None = None,
        fuse: int = 0,
    ) -> HostCommand:
        """Send a command; `data` goes to the controller, `into` (a byte memoryview)
        receives its data. For a Fabrics command `nsid` is the FCTYPE; `fuse` is the
        FUSE field (CDW0 bits 9:8), set for the two commands of a fused operation.

        The caller checks `free_slots` first; the connection must be established.
        """
        if self.closing:
            raise ConnectionError(self.close_reason)
        if not self.established:
            raise RuntimeError("command before ICResp")
        if data is not None and into is not None:
            raise ValueError("a command moves data in one direction only")
        cid = self._free.pop()
        length = 0
        sgl_type = SGL_TRANSPORT_DATA_BLOCK
        inline: memoryview | None = None
        later: memoryview | None = None  # sent on R2T
        if data is not None:
            view = data if type(data) is memoryview else memoryview(data)
            length = view.nbytes
            if not length:
                pass
            elif length <= self._capsule_limit(opcode, nsid):
                sgl_type = SGL_DATA_BLOCK_OFFSET
                inline = view
            else:
                later = view
        elif into is not None:
            length = into.nbytes
        sqe = build_sqe(
            opcode,
            cid,
            nsid,
            cdw10,
            cdw11,
            cdw12,
            cdw13,
            cdw14,
            cdw15,
            sgl_type=sgl_type,
            sgl_length=length,
            flags=0x40 | fuse,
        )
        cmd = HostCommand(cid, opcode, sqe, length)
        cmd.into = into
        cmd.data = later
        self._slots[cid] = cmd
        stats = self.stats
        stats.commands += 1
        inflight = self.depth - len(self._free)
        if inflight > stats.max_inflight:
            stats.max_inflight = inflight
        self._emit_capsule(sqe, inline)
        return cmd

    def _capsule_limit(self, opcode: int, nsid: int) -> int:
        if opcode == AdminOpcode.FABRICS and nsid & 0xFF == FabricsType.CONNECT:
            # Connect data goes in the capsule on every queue (as Linux sends it).
            return max(self.inline_limit, CONNECT_DATA_SIZE)
        return self.inline_limit

    def _emit_capsule(self, sqe: bytes, inline: memoryview | None) -> None:
        if inline is None:
            self.writer.control(
                self.outbox, P.CAPSULE_CMD, P.PduType.CAPSULE_CMD, P.CAPSULE_CMD_HLEN, sqe
            )
        else:
            self.writer.data(
                self.outbox,
                P.CAPSULE_CMD,
                P.PduType.CAPSULE_CMD,
                0,
                P.CAPSULE_CMD_HLEN,
                inline,
                sqe,
            )
            self.stats.in_capsule_bytes += inline.nbytes
        self._output_added()

    def _send_h2c_data(self, cmd: HostCommand, ttag: int, offset: int, length: int) -> None:
        data = cmd.data
        assert data is not None
        maxh2c = self.maxh2cdata
        out = self.outbox
        writer = self.writer
        end = offset + length
        while offset < end:
            n = min(maxh2c, end - offset)
            flags = P.FLAG_DATA_LAST if offset + n == end else 0
            writer.data(
                out,
                P.DATA_HEADER,
                P.PduType.H2C_DATA,
                flags,
                P.DATA_HLEN,
                data[offset : offset + n],
                cmd.cid,
                ttag,
                offset,
                n,
            )
            self.stats.h2c_data_pdus += 1
            offset += n
        cmd.sent = end
        self._output_added()

    def _finish(self, cmd: HostCommand, status: int, result: int) -> None:
        cid = cmd.cid
        self._slots[cid] = None
        self._free.append(cid)
        cmd.status = status
        cmd.result = result
        self.on_complete(cmd)

    # -- errors and teardown ----------------------------------------------------------------

    def _on_fatal(self, fes: int, fei: int, offending: bytes) -> None:
        # A PDU a controller may send, but not now (data before ICResp, a second
        # ICResp), is out of sequence rather than malformed.
        if (
            fes == P.FatalError.INVALID_HEADER_FIELD
            and fei == P.OFFSET_TYPE
            and offending
            and offending[0] in _CONTROLLER_TYPES
        ):
            fes = P.FatalError.PDU_SEQUENCE_ERROR
        reason = ""
        if not self.established and offending and offending[0] not in P.EXPECTED_HLEN:
            # Not even a PDU type: whatever answers speaks another protocol.
            reason = (
                f"not an NVMe/TCP port: it answered the ICReq with {_preview(offending)}, "
                "not an ICResp"
            )
        self._terminate(fes, fei, offending, reason)

    def _terminate(self, fes: int, fei: int, offending: Buffer, reason: str = "") -> None:
        """Send an H2CTermReq and close: the controller violated the transport protocol."""
        if self.closing:
            return
        # A port of another protocol is the caller's mistake, said in its error.
        log.log(
            logging.INFO if reason else logging.WARNING,
            "terminating connection: FES %#x FEI %#x",
            fes,
            fei,
        )
        self.stats.term_reqs_sent += 1
        self.reader.dead = True
        # Commands may have queued output (H2CData) that must not follow the TermReq.
        self.outbox.clear()
        self.outbox.append(P.pack_term_req(P.PduType.H2C_TERM_REQ, fes, fei, bytes(offending)))
        self.close(
            reason or f"protocol error from controller: sent H2CTermReq FES {fes:#x} FEI {fei:#x}"
        )

    def close(self, reason: str) -> None:
        """End the connection: every outstanding command completes with status ABORTED."""
        if self.closing:
            return
        self.closing = True
        self.close_reason = reason
        self.reader.dead = True
        pending = [cmd for cmd in self._slots if cmd is not None]
        self._slots = [None] * self.depth
        for cmd in pending:
            cmd.status = ABORTED
            self.on_complete(cmd)
        if self.on_closed is not None:
            self.on_closed(reason)
        self._request_output()

    def pending_commands(self) -> list[HostCommand]:
        return [cmd for cmd in self._slots if cmd is not None]


def _preview(data: bytes) -> str:
    """The first bytes a peer sent, as text if they are text (an SSH or HTTP banner)."""
    head = bytes(data[:24])
    text = head.decode("ascii", "replace").rstrip("\r\n")
    if text.isprintable() and "\ufffd" not in text:
        return repr(text)
    return head.hex(" ")


def _transfer_failure(cmd: HostCommand) -> int:
    """The status of a command whose target claimed success but whose data did not
    all arrive intact: a data digest mismatch is the transport's transient error (as
    the SPDK host and target report it); data that never came is a transfer error."""
    if cmd.transfer_error:
        return Status.TRANSIENT_TRANSPORT_ERROR
    return Status.DATA_TRANSFER_ERROR
