"""Replaying the host side of a recording against a target (docs/record-replay.md).

The files of one association (an admin queue and its I/O queues, grouped by the CNTLID
their Connects name) are replayed as one: every host PDU of every queue, in the order
of their recorded timestamps, each sent once the answers recorded before it have come
(or the wait has run out). Answers are matched to recorded ones by what identifies
them, not by position, since a target may complete commands in another order:
CapsuleResp by CID, C2HData by CCCID and offset, R2T by CCCID and offset, ICResp and
C2HTermReq by their connection. Each match is compared (compare.py); a recorded answer
that does not come is missing, a live one nothing recorded matches is unexpected.

What the replay rewrites in what it sends: the CNTLID of the I/O queues' Connect data
(the live admin Connect's), the TTAG of H2CData (the live R2T's), and the framing each
PDU gets from what the live ICResp negotiated (digests, data alignment). The ICReq goes
as recorded, so the replay asks for the digests the recording negotiated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pynvmf.record import format as F
from pynvmf.record.compare import Difference, compare, header_fields
from pynvmf.spec import pdu as P
from pynvmf.spec.command import (
    CONNECT_DATA_OFFSET_CNTLID,
    CONNECT_DATA_OFFSET_HOSTNQN,
    CONNECT_DATA_OFFSET_SUBNQN,
    Sqe,
)
from pynvmf.spec.opcodes import AdminOpcode, FabricsType, IoOpcode
from pynvmf.tcp.digest import crc32c

log = logging.getLogger(__name__)

DEFAULT_WAIT_S = 5.0
_DIGEST_FLAGS = P.FLAG_HDGST | P.FLAG_DDGST
# Where a CapsuleResp carries its CID: after the common header, DW0, DW1, SQHD and SQID.
_CQE_CID = P.CH_LEN + 12


@dataclass(frozen=True, slots=True)
class Finding:
    """One answer that is not as recorded: `kind` differs, missing or unexpected."""

    file: str
    index: int  # the recorded PDU's index in its file (-1 for an unexpected one)
    kind: str
    what: str
    differences: tuple[Difference, ...] = ()

    def __str__(self) -> str:
        where = f"{self.file} #{self.index}" if self.index >= 0 else self.file
        if self.kind == "differs":
            return "\n".join(f"{where} {self.what}: {d}" for d in self.differences)
        return f"{where} {self.what}: {self.kind}"


@dataclass(slots=True)
class ReplayReport:
    findings: list[Finding] = field(default_factory=list)
    sent: int = 0
    matched: int = 0
    associations: int = 0

    @property
    def differs(self) -> bool:
        return bool(self.findings)

    def lines(self) -> list[str]:
        return [str(f) for f in self.findings]


# -- grouping files into associations ----------------------------------------------------


@dataclass(slots=True)
class _QueueInfo:
    qid: int = -1
    cntlid: int = -1
    subnqn: str = ""


def queue_info(rec: F.Recording) -> _QueueInfo:
    """The queue a recording carries and the controller it belongs to, from its Connect."""
    info = _QueueInfo()
    connect_cid = -1
    for pdu in rec.pdus:
        if pdu.type == P.PduType.CAPSULE_CMD and connect_cid < 0:
            sqe = Sqe.unpack(pdu.raw, P.CH_LEN)
            if sqe.opcode == AdminOpcode.FABRICS and sqe.nsid & 0xFF == FabricsType.CONNECT:
                connect_cid = sqe.cid
                info.qid = sqe.cdw10 >> 16
                data = pdu.data
                at = CONNECT_DATA_OFFSET_CNTLID
                info.cntlid = int.from_bytes(data[at : at + 2], "little")
                nqn = data[CONNECT_DATA_OFFSET_SUBNQN:CONNECT_DATA_OFFSET_HOSTNQN]
                info.subnqn = nqn.split(b"\0", 1)[0].decode(errors="replace")
        elif pdu.type == P.PduType.CAPSULE_RESP and info.qid == 0:
            _, _, _, _, _, dw0, _, _, _, cid, _ = P.CAPSULE_RESP.unpack_from(pdu.raw)
            if cid == connect_cid:
                info.cntlid = dw0 & 0xFFFF
                break
        if info.qid > 0:
            break
    return info


def associations(recordings: Iterable[F.Recording]) -> list[list[F.Recording]]:
    """The recordings grouped by association (subsystem and controller ID), each group
    admin queue first, the groups in the order they started."""
    groups: dict[tuple[str, int] | int, list[tuple[_QueueInfo, F.Recording]]] = {}
    for n, rec in enumerate(recordings):
        info = queue_info(rec)
        key: tuple[str, int] | int = (info.subnqn, info.cntlid) if info.qid >= 0 else n
        groups.setdefault(key, []).append((info, rec))
    out = [
        [rec for _, rec in sorted(g, key=lambda ir: (ir[0].qid, _start(ir[1])))]
        for g in groups.values()
    ]
    out.sort(key=lambda g: min(_start(r) for r in g))
    return out


def _start(rec: F.Recording) -> int:
    return rec.pdus[0].ns if rec.pdus else 0


# -- one association, live --------------------------------------------------------------


def answer_key(raw: bytes) -> tuple[int, ...]:
    """What identifies an answer among its connection's answers."""
    pdu_type = raw[0]
    if pdu_type == P.PduType.CAPSULE_RESP:
        return (pdu_type, int.from_bytes(raw[_CQE_CID : _CQE_CID + 2], "little"))
    if pdu_type in (P.PduType.C2H_DATA, P.PduType.R2T):
        cccid, _ttag, offset, _length = P.DATA_BODY.unpack_from(raw, P.CH_LEN)
        return (pdu_type, cccid, offset)
    return (pdu_type,)


def _command_label(sqe: Sqe | None, qid: int) -> str:
    if sqe is None:
        return ""
    try:
        name = (AdminOpcode(sqe.opcode) if qid == 0 else IoOpcode(sqe.opcode)).name
    except ValueError:
        name = f"opcode {sqe.opcode:#x}"
    if sqe.opcode == AdminOpcode.FABRICS:
        try:
            name = FabricsType(sqe.nsid & 0xFF).name
        except ValueError:
            name = f"fabrics {sqe.nsid & 0xFF:#x}"
    elif qid == 0 and sqe.opcode in (AdminOpcode.IDENTIFY, AdminOpcode.GET_LOG_PAGE):
        name += f" {sqe.cdw10 & 0xFF:#04x}"
    return f" cid {sqe.cid} ({name.lower()})"


class _Queue:
    """One recorded connection and its live counterpart."""

    def __init__(self, rec: F.Recording, info: _QueueInfo) -> None:
        self.rec = rec
        self.name = rec.path.rsplit("/", 1)[-1]
        self.qid = max(info.qid, 0)
        # Recorded answers not yet matched, by key, oldest first.
        self.expected: dict[tuple[int, ...], deque[int]] = {}
        for i, pdu in enumerate(rec.pdus):
            if pdu.direction == F.C2H:
                self.expected.setdefault(answer_key(pdu.raw), deque()).append(i)
        self.done: set[int] = set()
        # The command each recorded answer answers (by index), from the recording: the
        # latest capsule with its CID before it.
        self.answers: dict[int, Sqe] = {}
        commands: dict[int, Sqe] = {}
        for i, pdu in enumerate(rec.pdus):
            if pdu.type == P.PduType.CAPSULE_CMD:
                sqe = Sqe.unpack(pdu.raw, P.CH_LEN)
                commands[sqe.cid] = sqe
            elif pdu.type == P.PduType.CAPSULE_RESP:
                cid = int.from_bytes(pdu.raw[_CQE_CID : _CQE_CID + 2], "little")
                if cid in commands:
                    self.answers[i] = commands[cid]
            elif pdu.type in (P.PduType.C2H_DATA, P.PduType.R2T):
                cccid = int.from_bytes(pdu.raw[8:10], "little")
                if cccid in commands:
                    self.answers[i] = commands[cccid]
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        # Never connected: its answers are not each reported missing, the refusal says it.
        self.refused = False
        self.hdgst = False
        self.ddgst = False
        self.cpda = 0
        self.ttags: dict[tuple[int, int], int] = {}  # (cccid, recorded TTAG) -> live TTAG


class _Association:
    def __init__(
        self, recs: list[F.Recording], address: tuple[str, int], wait_s: float, timing: bool
    ) -> None:
        self.queues = [_Queue(rec, queue_info(rec)) for rec in recs]
        self.address = address
        self.wait_s = wait_s
        self.timing = timing
        self.report = ReplayReport()
        self.cntlids: dict[int, int] = {}  # recorded CNTLID -> live
        self.progress = asyncio.Event()

    async def run(self) -> ReplayReport:
        events = sorted(
            (pdu.ns, qn, i) for qn, q in enumerate(self.queues) for i, pdu in enumerate(q.rec.pdus)
        )
        pending: list[tuple[_Queue, int]] = []  # recorded answers that came before now
        first_ns = events[0][0] if events else 0
        started = time.monotonic_ns()
        try:
            for ns, qn, i in events:
                q = self.queues[qn]
                pdu = q.rec.pdus[i]
                if pdu.direction == F.C2H:
                    pending.append((q, i))
                    continue
                await self._wait(pending)
                pending = []
                if self.timing:
                    delay = (ns - first_ns) - (time.monotonic_ns() - started)
                    if delay > 0:
                        await asyncio.sleep(delay / 1e9)
                await self._send(q, pdu)
            await self._wait([(q, i) for q in self.queues for i in _outstanding(q)])
        finally:
            for q in self.queues:
                await self._close(q)
        return self.report

    async def _wait(self, pending: list[tuple[_Queue, int]]) -> None:
        """Until every answer in `pending` has come (or its connection closed, or the wait
        ran out: then it is missing)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            left = [(q, i) for q, i in pending if i not in q.done and not q.closed]
            if not left:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), remaining)
        for q, i in pending:
            if i not in q.done:
                self._missing(q, i)

    def _missing(self, q: _Queue, i: int) -> None:
        q.done.add(i)
        if q.refused:
            return
        key = answer_key(q.rec.pdus[i].raw)
        waiting = q.expected.get(key)
        if waiting and i in waiting:
            waiting.remove(i)
        pdu = q.rec.pdus[i]
        label = pdu.type_name + _command_label(q.answers.get(i), q.qid)
        self.report.findings.append(Finding(q.name, i, "missing", label))

    async def _send(self, q: _Queue, pdu: F.Pdu) -> None:
        if q.writer is None:
            if q.closed:
                return
            try:
                q.reader, q.writer = await asyncio.open_connection(*self.address)
            except OSError as exc:
                q.closed = q.refused = True
                why = f"refused ({exc.strerror or exc})"
                self.report.findings.append(Finding(q.name, 0, why, "connection"))
                return
            q.task = asyncio.create_task(self._receive(q))
        if q.closed:
            return
        framed = self._reframe(q, pdu)
        if not framed:
            return
        q.writer.write(framed)
        self.report.sent += 1
        try:
            await q.writer.drain()
        except OSError:
            q.closed = True

    def _reframe(self, q: _Queue, pdu: F.Pdu) -> bytes:
        """The recorded host PDU as the live connection wants it."""
        pdu_type = pdu.type
        if pdu_type in F.NO_DIGEST_TYPES:
            return pdu.raw
        header = bytearray(pdu.header)
        data = bytearray(pdu.data)
        if pdu_type == P.PduType.CAPSULE_CMD:
            sqe = Sqe.unpack(header, P.CH_LEN)
            connect = sqe.opcode == AdminOpcode.FABRICS and sqe.nsid & 0xFF == FabricsType.CONNECT
            if connect and sqe.cdw10 >> 16 and len(data) > CONNECT_DATA_OFFSET_SUBNQN:
                at = CONNECT_DATA_OFFSET_CNTLID
                recorded = int.from_bytes(data[at : at + 2], "little")
                if recorded in self.cntlids:
                    data[at : at + 2] = self.cntlids[recorded].to_bytes(2, "little")
        elif pdu_type == P.PduType.H2C_DATA:
            cccid, ttag, _, _ = P.DATA_BODY.unpack_from(header, P.CH_LEN)
            live = q.ttags.get((cccid, ttag))
            if live is None:
                return b""  # no R2T asked for it: the host would not send it either
            header[P.OFFSET_DATA_TTAG : P.OFFSET_DATA_TTAG + 2] = live.to_bytes(2, "little")
        hlen = len(header)
        flags = header[1] & ~_DIGEST_FLAGS
        start = hlen + (P.DIGEST_LEN if q.hdgst else 0)
        pdo = P.data_offset(hlen, q.hdgst, q.cpda) if data else 0
        plen = (pdo + len(data) + (P.DIGEST_LEN if q.ddgst else 0)) if data else start
        if q.hdgst:
            flags |= P.FLAG_HDGST
        if q.ddgst and data:
            flags |= P.FLAG_DDGST
        P.COMMON_HEADER.pack_into(header, 0, pdu_type, flags, hlen, pdo, plen)
        out = bytearray(header)
        if q.hdgst:
            out += crc32c(header).to_bytes(4, "little")
        if data:
            out += bytes(pdo - len(out))
            out += data
            if q.ddgst:
                out += crc32c(data).to_bytes(4, "little")
        return bytes(out)

    async def _receive(self, q: _Queue) -> None:
        reader = q.reader
        assert reader is not None
        try:
            while True:
                head = await reader.readexactly(P.CH_LEN)
                plen = int.from_bytes(head[4:8], "little")
                if plen < P.CH_LEN:
                    break
                raw = head + await reader.readexactly(plen - P.CH_LEN)
                self._answer(q, raw)
                self.progress.set()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            q.closed = True
            self.progress.set()

    def _answer(self, q: _Queue, raw: bytes) -> None:
        pdu_type = raw[0]
        problems = self._check_digests(q, raw)
        if pdu_type == P.PduType.ICRESP:
            _pfv, cpda, dgst, _maxh2c = P.IC_BODY.unpack_from(raw, P.CH_LEN)
            q.cpda, q.hdgst, q.ddgst = cpda, bool(dgst & 1), bool(dgst & 2)
        key = answer_key(raw)
        waiting = q.expected.get(key)
        if not waiting:
            sqe = None
            fields = header_fields(raw, sqe, q.qid)
            what = F.TYPE_NAMES.get(pdu_type, str(pdu_type))
            detail = " ".join(f"{k}={v}" for k, v in fields.items() if k != "type")
            self.report.findings.append(Finding(q.name, -1, "unexpected", f"{what} {detail}"))
            return
        i = waiting.popleft()
        q.done.add(i)
        self.report.matched += 1
        recorded = q.rec.pdus[i].raw
        sqe = q.answers.get(i)
        if pdu_type == P.PduType.CAPSULE_RESP and sqe is not None:
            self._capsule_resp(q, i, sqe, recorded, raw)
        elif pdu_type == P.PduType.R2T:
            cccid, ttag, _, _ = P.DATA_BODY.unpack_from(recorded, P.CH_LEN)
            q.ttags[(cccid, ttag)] = P.DATA_BODY.unpack_from(raw, P.CH_LEN)[1]
        diffs = problems + compare(recorded, raw, sqe, qid=q.qid)
        if diffs:
            label = q.rec.pdus[i].type_name + _command_label(sqe, q.qid)
            self.report.findings.append(Finding(q.name, i, "differs", label, tuple(diffs)))

    def _capsule_resp(self, q: _Queue, i: int, sqe: Sqe, recorded: bytes, raw: bytes) -> None:
        connect = sqe.opcode == AdminOpcode.FABRICS and sqe.nsid & 0xFF == FabricsType.CONNECT
        if connect and q.qid == 0:
            rec_id = P.CAPSULE_RESP.unpack_from(recorded)[5] & 0xFFFF
            self.cntlids[rec_id] = P.CAPSULE_RESP.unpack_from(raw)[5] & 0xFFFF
        # The command is over: its data and R2Ts recorded before its response, not come,
        # will not come.
        for k, waiting in q.expected.items():
            data_or_r2t = k[0] in (P.PduType.C2H_DATA, P.PduType.R2T)
            if data_or_r2t and k[1] == sqe.cid:
                for j in [j for j in waiting if j < i]:
                    self._missing(q, j)

    def _check_digests(self, q: _Queue, raw: bytes) -> list[Difference]:
        _pdu_type, flags, hlen, pdo, plen = P.COMMON_HEADER.unpack_from(raw)
        out: list[Difference] = []
        header_digest = raw[hlen : hlen + 4]
        if flags & P.FLAG_HDGST and header_digest != crc32c(raw[:hlen]).to_bytes(4, "little"):
            out.append(Difference("header digest", "valid", "wrong"))
        if flags & P.FLAG_DDGST and pdo and plen >= pdo + 4:
            data = raw[pdo : plen - 4]
            if int.from_bytes(raw[plen - 4 : plen], "little") != crc32c(data):
                out.append(Difference("data digest", "valid", "wrong"))
        return out

    async def _close(self, q: _Queue) -> None:
        if q.writer is not None:
            q.writer.close()
            with contextlib.suppress(OSError):
                await q.writer.wait_closed()
        if q.task is not None:
            q.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await q.task


def _outstanding(q: _Queue) -> list[int]:
    return [i for waiting in q.expected.values() for i in waiting]


async def replay(
    recordings: Iterable[F.Recording],
    address: tuple[str, int],
    *,
    timing: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
) -> ReplayReport:
    """Replay every association in `recordings` against the target at `address`, one
    after the other, and report where its answers differ."""
    report = ReplayReport()
    for group in associations(recordings):
        part = await _Association(group, address, wait_s, timing).run()
        report.findings += part.findings
        report.sent += part.sent
        report.matched += part.matched
        report.associations += 1
    return report
