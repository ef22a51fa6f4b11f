"""A small, deliberately dumb NVMe/TCP host for protocol tests: `RawQueue`.

It builds every PDU byte by byte from `pynvmf.spec` (so a test can break any
field it likes) and parses what the target sends back. Two ways to use a queue:

- raw: `send()` bytes and `recv_pdu()` / `expect_term()` / `expect_eof()` the answer;
- commands: `cmd()` (and the Fabrics helpers built on it) submit a capsule and
  await its completion; a background reader routes C2HData to the command's
  buffer, answers R2T with H2CData, and completes on CapsuleResp (or on
  C2HData with SUCCESS). Once `cmd()` has been used, `recv_pdu()` may not be.

The PDU builders and `parse_pdus` are plain functions, shared with the sans-I/O
unit tests of the target connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from pynvmf.spec import command as C
from pynvmf.spec import pdu as P
from pynvmf.spec.opcodes import AdminOpcode, FabricsType
from pynvmf.spec.status import DNR
from pynvmf.tcp.digest import digest

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6c9e2a3e-0b5c-4a57-9a43-5b0c1d7e8f01"
HOSTID = uuid.UUID("6c9e2a3e-0b5c-4a57-9a43-5b0c1d7e8f01").bytes
# CC for an I/O controller: EN, IOSQES 6 (64 bytes), IOCQES 4 (16 bytes).
CC_ENABLE = C.CC_EN | 6 << C.CC_IOSQES_SHIFT | 4 << C.CC_IOCQES_SHIFT
ADMIN_INLINE = 8192
DEFAULT_TIMEOUT = 5.0

_NO_DIGEST = frozenset(
    (P.PduType.ICREQ, P.PduType.ICRESP, P.PduType.H2C_TERM_REQ, P.PduType.C2H_TERM_REQ)
)


# -- PDUs as bytes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pdu:
    """One parsed PDU; `data` is its data section with any digest removed."""

    type: int
    flags: int
    hlen: int
    pdo: int
    plen: int
    header: bytes
    data: bytes
    raw: bytes

    def cqe(self) -> C.Cqe:
        assert self.type == P.PduType.CAPSULE_RESP, f"not a CapsuleResp: {self}"
        return C.Cqe.unpack(self.header, P.CH_LEN)

    def data_fields(self) -> tuple[int, int, int, int]:
        """(CCCID, TTAG, offset, length) of a C2HData, H2CData or R2T PDU."""
        assert self.type in (P.PduType.C2H_DATA, P.PduType.H2C_DATA, P.PduType.R2T), self
        return P.DATA_BODY.unpack_from(self.header, P.CH_LEN)

    def ic_fields(self) -> tuple[int, int, int, int]:
        """(PFV, HPDA/CPDA, DGST, MAXR2T/MAXH2CDATA) of an ICReq or ICResp."""
        return P.IC_BODY.unpack_from(self.header, P.CH_LEN)

    def term_fields(self) -> tuple[int, int]:
        """(FES, FEI) of a TermReq."""
        assert self.type in (P.PduType.C2H_TERM_REQ, P.PduType.H2C_TERM_REQ), self
        return P.TERM_BODY.unpack_from(self.header, P.CH_LEN)

    def __repr__(self) -> str:
        name = P.PduType(self.type).name if self.type in iter(P.PduType) else hex(self.type)
        return f"Pdu({name}, flags={self.flags:#x}, plen={self.plen}, header={self.header.hex()})"


def _split_one(buf: bytes, hdgst: bool, ddgst: bool) -> Pdu:
    pdu_type, flags, hlen, pdo, plen = P.COMMON_HEADER.unpack_from(buf)
    assert len(buf) == plen, f"PDU of {len(buf)} bytes says PLEN {plen}"
    header = buf[:hlen]
    digests = pdu_type not in _NO_DIGEST
    header_end = hlen
    if hdgst and digests:
        assert flags & P.FLAG_HDGST, "header digest negotiated but HDGSTF clear"
        assert buf[hlen : hlen + 4] == digest(header), "bad header digest from the target"
        header_end += P.DIGEST_LEN
    data = b""
    if plen > header_end:
        start = hlen if not digests else pdo
        end = plen
        if ddgst and digests:
            assert flags & P.FLAG_DDGST, "data digest negotiated but DDGSTF clear"
            end -= P.DIGEST_LEN
            assert buf[end:plen] == digest(buf[start:end]), "bad data digest from the target"
        data = buf[start:end]
    return Pdu(pdu_type, flags, hlen, pdo, plen, header, data, buf)


def parse_pdus(data: bytes, *, hdgst: bool = False, ddgst: bool = False) -> list[Pdu]:
    """Split bytes holding whole PDUs (nothing partial) into parsed PDUs."""
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= P.CH_LEN, f"{len(data) - pos} stray bytes"
        plen = P.COMMON_HEADER.unpack_from(data, pos)[4]
        assert plen >= P.CH_LEN and pos + plen <= len(data), f"bad PLEN {plen}"
        out.append(_split_one(bytes(data[pos : pos + plen]), hdgst, ddgst))
        pos += plen
    return out


def icreq(*, pfv: int = 0, hpda: int = 0, dgst: int = 0, maxr2t: int = 0) -> bytes:
    return P.pack_ic(P.PduType.ICREQ, pfv, hpda, dgst, maxr2t)


def data_pdu(
    pdu_type: int,
    header: bytes,
    data: bytes = b"",
    *,
    hdgst: bool = False,
    ddgst: bool = False,
    cpda: int = 0,
    flags: int = 0,
    pdo: int | None = None,
    plen: int | None = None,
) -> bytes:
    """A PDU from its type-specific header part (everything after the common header).

    `pdo` and `plen` override the computed values, for tests that break them; a
    wrong `plen` does not change how many bytes are produced.
    """
    hlen = P.CH_LEN + len(header)
    if hdgst:
        flags |= P.FLAG_HDGST
    if data and ddgst:
        flags |= P.FLAG_DDGST
    real_pdo = P.data_offset(hlen, hdgst, cpda) if data else 0
    total = (real_pdo + len(data) + (P.DIGEST_LEN if ddgst else 0)) if data else hlen
    if not data and hdgst:
        total += P.DIGEST_LEN
    common = P.COMMON_HEADER.pack(
        pdu_type,
        flags,
        hlen,
        real_pdo if pdo is None else pdo,
        total if plen is None else plen,
    )
    out = bytearray(common + header)
    if hdgst:
        out += digest(out)
    if data:
        out += bytes(real_pdo - len(out))
        out += data
        if ddgst:
            out += digest(data)
    return bytes(out)


def capsule(
    sqe: bytes,
    data: bytes = b"",
    *,
    hdgst: bool = False,
    ddgst: bool = False,
    cpda: int = 0,
    pdo: int | None = None,
    plen: int | None = None,
) -> bytes:
    assert len(sqe) == C.SQE_SIZE
    return data_pdu(
        P.PduType.CAPSULE_CMD, sqe, data, hdgst=hdgst, ddgst=ddgst, cpda=cpda, pdo=pdo, plen=plen
    )


def h2c_data(
    cccid: int,
    ttag: int,
    offset: int,
    data: bytes,
    *,
    last: bool = True,
    datal: int | None = None,
    hdgst: bool = False,
    ddgst: bool = False,
    cpda: int = 0,
) -> bytes:
    body = P.DATA_BODY.pack(cccid, ttag, offset, len(data) if datal is None else datal) + bytes(4)
    flags = P.FLAG_DATA_LAST if last else 0
    return data_pdu(
        P.PduType.H2C_DATA, body, data, hdgst=hdgst, ddgst=ddgst, cpda=cpda, flags=flags
    )


def rw_sqe(
    opcode: int,
    cid: int,
    nsid: int,
    slba: int,
    nlb: int,
    length: int,
    *,
    inline: bool = False,
    fua: bool = False,
) -> bytes:
    """A Read or Write SQE; `nlb` is the number of blocks (not 0's based)."""
    return C.build_sqe(
        opcode,
        cid,
        nsid,
        cdw10=slba & 0xFFFFFFFF,
        cdw11=slba >> 32,
        cdw12=((nlb - 1) & 0xFFFF) | (1 << 30 if fua else 0),
        sgl_type=C.SGL_DATA_BLOCK_OFFSET if inline else C.SGL_TRANSPORT_DATA_BLOCK,
        sgl_length=length,
    )


# -- a queue over a real socket -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completion:
    cqe: C.Cqe
    data: bytes = b""

    @property
    def status(self) -> int:
        """The status code (SCT << 8 | SC), without DNR and MORE."""
        return self.cqe.status & 0x7FF

    @property
    def dnr(self) -> bool:
        return bool(self.cqe.status & DNR)

    @property
    def result(self) -> int:
        return self.cqe.result

    def __repr__(self) -> str:
        return (
            f"Completion(status={self.status:#x}, dnr={self.dnr}, result={self.result:#x}, "
            f"cid={self.cqe.cid}, sqhd={self.cqe.sq_head}, data={len(self.data)} bytes)"
        )


class TargetTerminated(ConnectionError):
    def __init__(self, pdu: Pdu) -> None:
        super().__init__(f"target sent {pdu!r}")
        self.pdu = pdu


@dataclass
class _Pending:
    fut: asyncio.Future[Completion]
    buf: bytearray
    data_out: bytes = b""


@dataclass
class QueueCounters:
    r2t: int = 0
    h2c_data: int = 0
    c2h_data: int = 0
    capsule_resp: int = 0
    in_capsule: int = 0
    max_in_flight: int = 0


class RawQueue:
    """One NVMe/TCP connection, driven by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.hdgst = False
        self.ddgst = False
        self.cpda = 0
        self.maxh2cdata = 0
        self.qid = -1
        self.cntlid = 0
        # Write data up to this size travels in the capsule; larger writes wait for R2T.
        self.inline_limit = 0
        self.counters = QueueCounters()
        self.term: Pdu | None = None
        self.eof = False
        self._pending: dict[int, _Pending] = {}
        self._cids = itertools.count(1)
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT) -> RawQueue:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(reader, writer)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    async def detach(self) -> None:
        """Stop the reader task so that `recv_pdu()` may be used again; only while no
        command is in flight (nothing is then half read)."""
        assert not self._pending, "commands still in flight"
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None

    # -- raw bytes ------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv_pdu(self, timeout: float = DEFAULT_TIMEOUT) -> Pdu:
        assert self._pump is None, "recv_pdu() after cmd(): the reader task owns the socket"
        return await asyncio.wait_for(self._read_pdu(), timeout)

    async def _read_pdu(self) -> Pdu:
        common = await self.reader.readexactly(P.CH_LEN)
        plen = P.COMMON_HEADER.unpack(common)[4]
        assert P.CH_LEN <= plen <= 16 << 20, f"target sent PLEN {plen}"
        rest = await self.reader.readexactly(plen - P.CH_LEN)
        return _split_one(common + rest, self.hdgst, self.ddgst)

    async def expect_eof(self, timeout: float = 10.0) -> bytes:
        """Wait for the target to close the connection; returns what it sent before
        (nothing, once `cmd()` has been used: the reader task consumes it)."""
        if self._pump is not None:
            await asyncio.wait_for(asyncio.shield(self._pump), timeout)
            assert self.eof, "the reader task ended without EOF"
            return b""

        async def drain() -> bytes:
            chunks = []
            while chunk := await self.reader.read(65536):
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(drain(), timeout)
        except ConnectionResetError:
            return b""

    async def expect_term(self, timeout: float = DEFAULT_TIMEOUT) -> Pdu:
        """The next PDU must be a C2HTermReq, and the target must close after it."""
        pdu = await self.recv_pdu(timeout)
        assert pdu.type == P.PduType.C2H_TERM_REQ, f"expected a C2HTermReq, got {pdu!r}"
        assert pdu.hlen == P.TERM_REQ_HLEN
        assert pdu.plen == P.TERM_REQ_HLEN + len(pdu.data)
        assert len(pdu.data) <= P.TERM_REQ_MAX_DATA
        rest = await self.expect_eof()
        assert rest == b"", f"bytes after the TermReq: {rest[:32].hex()}"
        return pdu

    # -- connection setup -------------------------------------------------------------------

    async def handshake(
        self, *, hdgst: bool = False, ddgst: bool = False, hpda: int = 0, maxr2t: int = 0
    ) -> Pdu:
        dgst = (P.DIGEST_HEADER if hdgst else 0) | (P.DIGEST_DATA if ddgst else 0)
        self.send(icreq(hpda=hpda, dgst=dgst, maxr2t=maxr2t))
        resp = await self.recv_pdu()
        assert resp.type == P.PduType.ICRESP, f"expected an ICResp, got {resp!r}"
        pfv, cpda, got_dgst, maxh2cdata = resp.ic_fields()
        assert pfv == P.PFV_1_0
        self.cpda = cpda
        self.maxh2cdata = maxh2cdata
        self.hdgst = bool(got_dgst & P.DIGEST_HEADER)
        self.ddgst = bool(got_dgst & P.DIGEST_DATA)
        return resp

    # -- commands -------------------------------------------------------------------------

    def next_cid(self) -> int:
        while True:
            cid = next(self._cids) & 0xFFFF
            if cid not in self._pending:
                return cid

    def capsule(self, sqe: bytes, data: bytes = b"") -> bytes:
        return capsule(sqe, data, hdgst=self.hdgst, ddgst=self.ddgst, cpda=self.cpda)

    def cmd_nowait(
        self,
        opcode: int,
        *,
        nsid: int = 0,
        cdw10: int = 0,
        cdw11: int = 0,
        cdw12: int = 0,
        cdw13: int = 0,
        cdw14: int = 0,
        cdw15: int = 0,
        data: bytes | None = None,
        read_len: int = 0,
        inline: bool | None = None,
        sgl_length: int | None = None,
    ) -> asyncio.Future[Completion]:
        """Send one command now; the returned future holds its completion.

        `data` is written to the controller (in the capsule when it fits
        `inline_limit`, unless `inline` says otherwise; else on R2T); `read_len`
        bytes are expected back. `sgl_length` overrides the SGL's length.
        """
        cid = self.next_cid()
        in_capsule = b""
        if data is not None:
            if inline is None:
                inline = len(data) <= self.inline_limit
            length = len(data)
            sgl_type = C.SGL_DATA_BLOCK_OFFSET if inline else C.SGL_TRANSPORT_DATA_BLOCK
            if inline:
                in_capsule = data
        else:
            length = read_len
            sgl_type = C.SGL_TRANSPORT_DATA_BLOCK
        sqe = C.build_sqe(
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
            sgl_length=length if sgl_length is None else sgl_length,
        )
        return self.submit_nowait(sqe, in_capsule, data_out=data or b"", read_len=read_len)

    async def cmd(
        self, opcode: int, *, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any
    ) -> Completion:
        """Submit one command (see `cmd_nowait`) and await its completion."""
        return await asyncio.wait_for(self.cmd_nowait(opcode, **kwargs), timeout)

    def submit_nowait(
        self,
        sqe: bytes,
        in_capsule: bytes = b"",
        *,
        data_out: bytes = b"",
        read_len: int = 0,
        wire: bytes | None = None,
    ) -> asyncio.Future[Completion]:
        """Send a prepared SQE (its CID is used as is); the future holds its completion.

        `wire`, if given, is sent instead of the capsule built from `sqe` and
        `in_capsule` (a test's deliberately damaged version of it)."""
        if self.term is not None:
            raise TargetTerminated(self.term)
        loop = asyncio.get_running_loop()
        if self._pump is None:
            self._pump = loop.create_task(self._run_pump())
        cid = C.Sqe.unpack(sqe).cid
        assert cid not in self._pending, f"CID {cid} already in flight"
        fut: asyncio.Future[Completion] = loop.create_future()
        self._pending[cid] = _Pending(fut, bytearray(read_len), data_out)
        self.counters.max_in_flight = max(self.counters.max_in_flight, len(self._pending))
        fut.add_done_callback(lambda _f: self._forget(cid, fut))
        if in_capsule:
            self.counters.in_capsule += 1
        self.send(self.capsule(sqe, in_capsule) if wire is None else wire)
        return fut

    def abandon(self, cid: int) -> None:
        """Forget a command in flight, as a host that completes it by itself does (SPDK
        its AERs at detach): its CID may be sent again, and a completion for it that then
        arrives belongs to the new command."""
        pending = self._pending.pop(cid)
        pending.fut.cancel()

    def _forget(self, cid: int, fut: asyncio.Future[Completion]) -> None:
        pending = self._pending.get(cid)
        if pending is not None and pending.fut is fut:
            del self._pending[cid]

    async def _run_pump(self) -> None:
        try:
            while True:
                pdu = await self._read_pdu()
                self._dispatch(pdu)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.eof = True
            self._fail_all(ConnectionError(f"connection lost: {exc!r}"))
        except Exception as exc:  # a malformed PDU from the target: fail every waiter with it
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for pending in self._pending.values():
            if not pending.fut.done():
                pending.fut.set_exception(exc)

    def _dispatch(self, pdu: Pdu) -> None:
        assert self.term is None, f"{pdu!r} after the C2HTermReq"
        if pdu.type == P.PduType.CAPSULE_RESP:
            self.counters.capsule_resp += 1
            cqe = pdu.cqe()
            pending = self._pending.get(cqe.cid)
            assert pending is not None, f"completion for unknown CID {cqe.cid}: {cqe}"
            if not pending.fut.done():
                pending.fut.set_result(Completion(cqe, bytes(pending.buf)))
        elif pdu.type == P.PduType.C2H_DATA:
            self.counters.c2h_data += 1
            cccid, _ttag, offset, length = pdu.data_fields()
            pending = self._pending.get(cccid)
            assert pending is not None, f"C2HData for unknown CID {cccid}"
            assert length == len(pdu.data)
            assert offset + length <= len(pending.buf), "C2HData past the host buffer"
            pending.buf[offset : offset + length] = pdu.data
            if pdu.flags & P.FLAG_DATA_SUCCESS:
                assert pdu.flags & P.FLAG_DATA_LAST
                cqe = C.Cqe(0, 0xFFFF, self.qid, cccid, 0)
                if not pending.fut.done():
                    pending.fut.set_result(Completion(cqe, bytes(pending.buf)))
        elif pdu.type == P.PduType.R2T:
            self.counters.r2t += 1
            cccid, ttag, offset, length = pdu.data_fields()
            pending = self._pending.get(cccid)
            assert pending is not None, f"R2T for unknown CID {cccid}"
            assert offset + length <= len(pending.data_out), "R2T past the write data"
            chunk = self.maxh2cdata or length
            end = offset + length
            for pos in range(offset, end, chunk):
                piece = pending.data_out[pos : min(pos + chunk, end)]
                self.counters.h2c_data += 1
                self.send(
                    h2c_data(
                        cccid,
                        ttag,
                        pos,
                        piece,
                        last=pos + len(piece) == end,
                        hdgst=self.hdgst,
                        ddgst=self.ddgst,
                        cpda=self.cpda,
                    )
                )
        elif pdu.type == P.PduType.C2H_TERM_REQ:
            self.term = pdu
            self._fail_all(TargetTerminated(pdu))
        else:
            raise AssertionError(f"unexpected PDU from the target: {pdu!r}")

    # -- Fabrics and admin helpers -----------------------------------------------------------

    async def fabrics(
        self,
        fctype: int,
        *,
        cdw10: int = 0,
        cdw11: int = 0,
        cdw12: int = 0,
        cdw13: int = 0,
        data: bytes | None = None,
    ) -> Completion:
        # The Fabrics command type is SQE byte 4, where other commands carry the NSID.
        return await self.cmd(
            AdminOpcode.FABRICS,
            nsid=fctype,
            cdw10=cdw10,
            cdw11=cdw11,
            cdw12=cdw12,
            cdw13=cdw13,
            data=data,
            inline=data is not None,
        )

    async def connect(
        self,
        subnqn: str,
        *,
        hostnqn: str = HOSTNQN,
        hostid: bytes = HOSTID,
        qid: int = 0,
        cntlid: int = C.CNTLID_DYNAMIC,
        sqsize: int = 127,
        kato: int = 0,
        cattr: int = 0,
        inline_limit: int = 16384,
    ) -> Completion:
        """Fabrics Connect. On success the queue records QID and CNTLID and starts
        sending write data in the capsule up to the limit for its queue type."""
        if self.maxh2cdata == 0:
            await self.handshake()
        cdw10, cdw11, cdw12 = C.ConnectCommand(0, qid, sqsize, cattr, kato).cdws()
        data = C.ConnectData(hostid, cntlid, subnqn, hostnqn).pack()
        completion = await self.fabrics(
            FabricsType.CONNECT, cdw10=cdw10, cdw11=cdw11, cdw12=cdw12, data=data
        )
        if completion.status == 0:
            self.qid = qid
            self.cntlid = completion.result & 0xFFFF
            self.inline_limit = ADMIN_INLINE if qid == 0 else inline_limit
        return completion

    async def prop_get(self, offset: int, *, size: int = 4) -> Completion:
        return await self.fabrics(
            FabricsType.PROPERTY_GET, cdw10=1 if size == 8 else 0, cdw11=offset
        )

    async def prop_set(self, offset: int, value: int, *, size: int = 4) -> Completion:
        return await self.fabrics(
            FabricsType.PROPERTY_SET,
            cdw10=1 if size == 8 else 0,
            cdw11=offset,
            cdw12=value & 0xFFFFFFFF,
            cdw13=value >> 32,
        )

    async def enable(self, cc: int = CC_ENABLE) -> None:
        """CC.EN = 1 and check CSTS.RDY, as a host brings a controller up."""
        done = await self.prop_set(C.PROP_CC, cc)
        assert done.status == 0, done
        csts = await self.prop_get(C.PROP_CSTS)
        assert csts.status == 0 and csts.result & C.CSTS_RDY, csts

    async def identify(self, cns: int, *, nsid: int = 0, cntid: int = 0) -> Completion:
        return await self.cmd(
            AdminOpcode.IDENTIFY, nsid=nsid, cdw10=cns | cntid << 16, read_len=4096
        )

    async def get_log_page(
        self, lid: int, length: int, *, offset: int = 0, nsid: int = 0
    ) -> Completion:
        numd = length // 4 - 1
        return await self.cmd(
            AdminOpcode.GET_LOG_PAGE,
            nsid=nsid,
            cdw10=lid | (numd & 0xFFFF) << 16,
            cdw11=numd >> 16,
            cdw12=offset & 0xFFFFFFFF,
            cdw13=offset >> 32,
            read_len=length,
        )

    async def read(self, nsid: int, slba: int, nlb: int, block_size: int) -> Completion:
        return await self.cmd(
            0x02,
            nsid=nsid,
            cdw10=slba & 0xFFFFFFFF,
            cdw11=slba >> 32,
            cdw12=nlb - 1,
            read_len=nlb * block_size,
        )

    async def write(
        self,
        nsid: int,
        slba: int,
        data: bytes,
        block_size: int,
        *,
        fua: bool = False,
        inline: bool | None = None,
    ) -> Completion:
        nlb = len(data) // block_size
        return await self.cmd(
            0x01,
            nsid=nsid,
            cdw10=slba & 0xFFFFFFFF,
            cdw11=slba >> 32,
            cdw12=(nlb - 1) | (1 << 30 if fua else 0),
            data=data,
            inline=inline,
        )


@dataclass
class RawHost:
    """A host association: an enabled admin queue and connected I/O queues."""

    admin: RawQueue
    io: list[RawQueue] = field(default_factory=list)
