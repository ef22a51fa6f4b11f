"""Splitting an NVMe/TCP byte stream into PDUs, for either role. Sans-I/O.

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

from collections.abc import Callable

from pynvmf.spec import pdu as P
from pynvmf.tcp import digest as D

# Handler signature: (pdu_type, flags, hlen, pdo, data_end, pdu) where `pdu` is
# the whole PDU, digests included, and its data is pdu[pdo:data_end] (pdo is 0
# for a PDU without data).
PduHandler = Callable[[int, int, int, int, int, memoryview], None]
FatalHandler = Callable[[int, int, bytes], None]  # (fes, fei, offending header)
# Handler for a data digest mismatch: the PDU is otherwise well formed, and the
# spec makes this a per-command error, not a connection error.
DataDigestHandler = Callable[[int, int, int, int, int, memoryview], None]

_NO_DIGEST_TYPES = frozenset(
    (P.PduType.ICREQ, P.PduType.ICRESP, P.PduType.H2C_TERM_REQ, P.PduType.C2H_TERM_REQ)
)
_DATA_TYPES = frozenset(
    (
        P.PduType.CAPSULE_CMD,
        P.PduType.H2C_DATA,
        P.PduType.C2H_DATA,
        P.PduType.H2C_TERM_REQ,
        P.PduType.C2H_TERM_REQ,
    )
)


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
        self._on_fatal = on_fatal
        self._on_ddgst_error = on_data_digest_error
        self.accepted_types = accepted_types
        self.max_pdu_len = max_pdu_len
        self.hdgst = False
        self.ddgst = False
        # Data in PDUs we receive starts on a multiple of this ((C|H)PDA + 1) * 4.
        self.pdo_alignment = 4
        # The receive buffer holds at least two maximal PDUs so that compaction
        # (moving a partial PDU to the front) is rare.
        self._buf = bytearray(max(2 * max_pdu_len, 256 * 1024))
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self.dead = False
        self.bytes_received = 0

    def set_max_pdu_len(self, max_pdu_len: int) -> None:
        self.max_pdu_len = max_pdu_len
        if len(self._buf) < 2 * max_pdu_len:
            new = bytearray(2 * max_pdu_len)
            pending = self._end - self._start
            new[:pending] = self._view[self._start : self._end]
            self._view.release()
            self._buf, self._view = new, memoryview(new)
            self._start, self._end = 0, pending

    # -- BufferedProtocol-style input -------------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._end == len(self._buf):
            self._compact()
        return self._view[self._end :]

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
        while not self.dead:
            # A handler may have replaced the buffer (set_max_pdu_len after an ICReq).
            buf = self._buf
            view = self._view
            start = self._start
            avail = self._end - start
            if avail < P.CH_LEN:
                break
            pdu_type, flags, hlen, pdo, plen = unpack(buf, start)
            if pdu_type not in self.accepted_types:
                self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_TYPE, start, avail)
                return
            if hlen != P.EXPECTED_HLEN[pdu_type]:
                self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_HLEN, start, avail)
                return
            hdgst = self.hdgst and pdu_type not in _NO_DIGEST_TYPES
            header_end = hlen + (P.DIGEST_LEN if hdgst else 0)
            if plen < header_end or plen > self.max_pdu_len:
                fes = (
                    P.FatalError.DATA_LIMIT_EXCEEDED
                    if plen > self.max_pdu_len and pdu_type == P.PduType.H2C_DATA
                    else P.FatalError.INVALID_HEADER_FIELD
                )
                self._fatal(fes, P.OFFSET_PLEN, start, avail)
                return
            if avail < plen:
                if start + plen > len(buf):
                    self._compact()
                break
            self._start = start + plen
            pdu = view[start : start + plen]
            if hdgst:
                if not flags & P.FLAG_HDGST:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, start, avail)
                    return
                if bytes(pdu[hlen:header_end]) != D.digest(pdu[:hlen]):
                    self._fatal(P.FatalError.HEADER_DIGEST_ERROR, 0, start, avail)
                    return
            if plen > header_end:
                if pdu_type not in _DATA_TYPES:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_PLEN, start, avail)
                    return
                ddgst = self.ddgst and pdu_type not in _NO_DIGEST_TYPES
                data_end = plen - (P.DIGEST_LEN if ddgst else 0)
                if pdu_type in _NO_DIGEST_TYPES:
                    pdo = hlen  # TermReq data follows the header directly
                elif pdo < header_end or pdo > data_end or pdo % self.pdo_alignment:
                    self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_PDO, start, avail)
                    return
                if ddgst:
                    if not flags & P.FLAG_DDGST:
                        self._fatal(P.FatalError.INVALID_HEADER_FIELD, P.OFFSET_FLAGS, start, avail)
                        return
                    if bytes(pdu[data_end:plen]) != D.digest(pdu[pdo:data_end]):
                        if self._on_ddgst_error is None:
                            self._fatal(P.FatalError.HEADER_DIGEST_ERROR, 0, start, avail)
                        else:
                            self._on_ddgst_error(pdu_type, flags, hlen, pdo, data_end, pdu)
                        continue
                self._on_pdu(pdu_type, flags, hlen, pdo, data_end, pdu)
            else:
                self._on_pdu(pdu_type, flags, hlen, 0, header_end, pdu)
        if self._start == self._end:
            self._start = self._end = 0

    def _fatal(self, fes: int, fei: int, start: int, avail: int) -> None:
        self.dead = True
        offending = bytes(self._view[start : start + min(avail, P.TERM_REQ_MAX_DATA)])
        self._on_fatal(fes, fei, offending)
