"""The controller's end of one NVMe/RDMA queue. Sans-I/O.

A host's command arrives as a SEND into one of the receive buffers the controller posted:
the 64-byte submission queue entry, then the in-capsule data if the command carries any
(up to the port's in-capsule size, 16 KiB by default). Its data descriptor (sgl.py) says
where the rest of the data is: in the capsule, or in host memory under a remote key, which
the controller reads with RDMA READ (a write's data) or writes with RDMA WRITE (a read's
data). The completion (a 16-byte CQE) goes back by SEND, or SEND with Invalidate when the
descriptor's sub type asked for the key to be invalidated. On a reliable connection the
work requests of a queue pair execute in order, so a read's RDMA WRITE and its completion's
SEND are posted together: the host sees the data before the completion.

This module decides those transport questions; the verbs are the adapter's (verbs.py,
pyverbs in a guest with soft-RoCE): the narrow interface `Verbs` is what this module asks
of it, and the adapter reports completions back (`received`, `read_done`,
`receive_failed`, `disconnected`). The NVMe layer above (target/queue.py) sees a
`QueueTransport` (target/transport.py), as it sees NVMe/TCP's connection.

Compiled with the NVMe layer's hot modules (setup.py): `QueueTransport` is a mypyc trait,
which only compiled classes implement.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Final, Protocol

from pynvmf.block.inplace import Loans
from pynvmf.logs import ContextLog
from pynvmf.rdma import sgl
from pynvmf.rdma.counters import RdmaCounters, RdmaQueueTally
from pynvmf.spec.command import SQE_SIZE, Sqe
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
from pynvmf.tcp.wire_faults import WireFault

log = logging.getLogger(__name__)

# The port's in-capsule data size by default: the seed's 16 KiB (issue 31).
DEFAULT_IN_CAPSULE_SIZE: Final = 16384
# Connect data is 1 KiB; a host may send it in the capsule on any queue.
CONNECT_DATA_LEN: Final = 1024
_CQE: Final = struct.Struct("<IIHHHH")
_FABRICS: Final = int(AdminOpcode.FABRICS)
_CONNECT: Final = int(FabricsType.CONNECT)


def receive_size(in_capsule_size: int) -> int:
    """The bytes of each receive buffer a queue posts: an SQE and the most in-capsule data
    any of its commands may carry."""
    return SQE_SIZE + max(in_capsule_size, CONNECT_DATA_LEN)


class Verbs(Protocol):
    """What the queue asks of the verbs adapter (one queue pair)."""

    def post_receive(self, slot: int) -> None:
        """Post receive buffer `slot` again: the queue is done with its bytes."""
        ...

    def read(self, tag: int, length: int, address: int, key: int) -> None:
        """RDMA READ `length` bytes of host memory at `address` under `key`; the adapter
        calls `RdmaConnection.read_done(tag, data)` when it completes (data None: it
        failed)."""
        ...

    def write(self, data: Buffer, address: int, key: int) -> None:
        """RDMA WRITE `data` to host memory at `address` under `key` (unsignalled: the
        SEND posted after it on the same queue pair completes after it)."""
        ...

    def send(self, message: bytes, invalidate_key: int | None) -> None:
        """SEND `message` (a completion), with Invalidate of `invalidate_key` if given."""
        ...

    def disconnect(self) -> None:
        """Disconnect the queue pair's RDMA CM connection."""
        ...


class _Unbudgeted:
    def give(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _no_context() -> dict[str, object]:
    return {}


def _ignore_request(req: Request) -> None:
    pass


def _unattached(req: Request) -> None:
    raise AssertionError("a command before the NVMe layer attached")


def _host_to_controller(sqe: Sqe) -> bool:
    code = sqe.fctype if sqe.opcode == _FABRICS else sqe.opcode
    return bool(code & 0x1)


def pack_completion(result: int, sqhd: int, qid: int, cid: int, status: int) -> bytes:
    """The 16-byte completion queue entry a SEND carries."""
    return _CQE.pack(result & 0xFFFFFFFF, result >> 32, sqhd, qid, cid, (status << 1) & 0xFFFF)


class RdmaConnection(QueueTransport):
    """One queue's RDMA connection, from the controller's side."""

    def __init__(
        self,
        verbs: Verbs,
        *,
        in_capsule_size: int = DEFAULT_IN_CAPSULE_SIZE,
        max_transfer: int = sgl.KEYED_MAX_LENGTH,
        tally: RdmaQueueTally | None = None,
    ) -> None:
        self.verbs = verbs
        self.in_capsule_size = in_capsule_size
        self.max_transfer = max_transfer
        self.receive_size = receive_size(in_capsule_size)
        self.closing = False
        # Read data goes out from registered buffers (a copy of its own).
        self.loans: Loans | None = None
        self.close_reason = ""
        self._on_command: Callable[[Request], None] = _unattached
        self._on_refused: Callable[[Request], None] = _ignore_request
        self._budget: Charges = _Unbudgeted()
        self._log = ContextLog(log, _no_context)
        self.qid = 0
        self.sq_size = 1
        self.sqhd_disabled = False
        self._borrow_capsule_data = False
        self._sqhd = 0
        self._inflight: dict[int, Request] = {}
        # The keyed descriptors of the commands in flight that have one, by CID.
        self._keyed: dict[int, sgl.KeyedSgl] = {}
        self.commands = 0
        self.in_capsule_bytes = 0
        self.rdma_reads = 0
        self.rdma_writes = 0
        self.completions = 0
        # The port's tally, which reads counters() while the queue lives (counters.py).
        self._tally = tally
        if tally is not None:
            tally.opened(self)

    def counters(self) -> RdmaCounters:
        """What this queue has counted so far (a copy): the transport's statistics."""
        return RdmaCounters(
            commands=self.commands,
            in_capsule_bytes=self.in_capsule_bytes,
            rdma_reads=self.rdma_reads,
            rdma_writes=self.rdma_writes,
            completions=self.completions,
        )

    # -- the seam (target/transport.py) -------------------------------------------------

    def attach(self, queue: NvmeQueue) -> None:
        self._on_command = queue.on_command
        self._on_refused = queue.on_refused
        self._budget = queue.budget
        self._log = ContextLog(log, queue.log_context)

    def bind_queue(self, params: QueueParams) -> None:
        self.qid = params.qid
        self.sq_size = params.sq_size
        # The Connect took the queue's first entry (as on TCP: tcp/target.py).
        self._sqhd = 1 % params.sq_size
        self.sqhd_disabled = params.sqhd_disabled
        self._borrow_capsule_data = params.borrow_capsule_data

    @property
    def commands_in_flight(self) -> int:
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
        # The adapter copies what it writes into registered memory when it posts the
        # WRITE: the command's buffers are free once this returns.
        self._release(req)
        if self.closing or req.retired:
            return
        cid = req.sqe.cid
        if track and self._inflight.get(cid) is req:
            del self._inflight[cid]
        keyed = self._keyed.pop(cid, None) if track else None
        n = 0 if data is None else len(data) if type(data) is not memoryview else data.nbytes
        if data is not None and status == 0 and n:
            if keyed is None or req.sent + n > keyed.length:
                # Data back for a command whose descriptor names no (or too little) host
                # memory: the NVMe layer checked req.length, so this is a bug upstream.
                status = Status.SGL_INVALID_DATA | DNR
            else:
                self._write(keyed, req.sent, data)
        sqhd = 0xFFFF if self.sqhd_disabled else self._sqhd
        cqe = pack_completion(result, sqhd, self.qid, cid, status)
        invalidate = keyed.key if keyed is not None and keyed.invalidate else None
        self.completions += 1
        self.verbs.send(cqe, invalidate)

    def send_data(self, req: Request, data: Buffer) -> None:
        self._release(req)
        if self.closing or req.retired:
            return
        keyed = self._keyed.get(req.sqe.cid)
        n = len(data) if type(data) is not memoryview else data.nbytes
        if keyed is None or req.sent + n > keyed.length:
            self.close("controller-to-host data past the command's descriptor")
            return
        self._write(keyed, req.sent, data)
        req.sent += n

    def _release(self, req: Request) -> None:
        """Give `req`'s memory charge back to the budget (once: the charge is cleared)."""
        charge = req.charge
        if charge:
            req.charge = 0
            self._budget.give(charge)

    def fetch_data(self, req: Request, on_data: Callable[[Request], None]) -> None:
        keyed = self._keyed.get(req.sqe.cid)
        req.data = None
        if keyed is None or req.length > keyed.length:
            # Only a keyed command's data is fetched (in-capsule data came with it).
            self.complete(req, Status.SGL_INVALID_TYPE | DNR)
            on_data(req)
            return
        req.on_data = on_data
        self.rdma_reads += 1
        self.verbs.read(req.sqe.cid, req.length, keyed.address, keyed.key)

    def close(self, reason: str) -> None:
        if not self.closing:
            self.closing = True
            self.close_reason = reason
            self.verbs.disconnect()

    def can_inject(self, req: Request, fault: WireFault) -> bool:
        # The wire faults are NVMe/TCP's (digests, R2T, C2HData, TermReq PDUs).
        return False

    def inject(self, req: Request, fault: WireFault) -> bool:
        return True

    def faults_gone(self) -> None:
        pass

    # -- what the adapter reports ---------------------------------------------------------

    def received(self, slot: int, message: memoryview) -> None:
        """A SEND arrived in receive buffer `slot` (`message`: its bytes). The buffer is
        posted again once the NVMe layer has what it keeps of it."""
        try:
            self._receive(message)
        finally:
            if not self.closing:
                self.verbs.post_receive(slot)

    def receive_failed(self, reason: str) -> None:
        """A receive completed in error (a SEND larger than the posted buffer, a flushed
        receive): the queue pair is in error, the connection ends."""
        self.close(f"receive failed: {reason}")

    def read_done(self, tag: int, data: bytearray | None) -> None:
        """The RDMA READ of command `tag` (its CID) completed: with the host's data, or
        (None) in error."""
        req = self._inflight.get(tag)
        if req is None or req.on_data is None:
            return
        on_data, req.on_data = req.on_data, None
        if data is None or len(data) != req.length:
            # A READ completed in error (a key the host never registered, memory out of
            # its region) leaves the queue pair in error, as the verbs define it: nothing
            # more can be sent on it, so the queue ends (nvmet-rdma does the same).
            req.data = None
            self.close(f"RDMA READ of command {tag} failed")
        else:
            req.data = data
        on_data(req)

    def disconnected(self) -> None:
        """The RDMA CM connection is gone: nothing more goes out, nothing is owed."""
        self.closing = True
        self._budget.close()
        for req in self._inflight.values():
            self._release(req)
        self._inflight.clear()
        self._keyed.clear()
        self._on_command = _ignore_request
        self._on_refused = _ignore_request
        if self._tally is not None:
            self._tally.ended(self)

    # -- input ------------------------------------------------------------------------------

    def _receive(self, message: memoryview) -> None:
        size = len(message)
        if size > self.receive_size:
            # The verbs refuse such a SEND (a local length error): no command of it runs.
            self.close(f"a SEND of {size} bytes, the receive buffers hold {self.receive_size}")
            return
        if size < SQE_SIZE:
            self.close(f"a SEND of {size} bytes is shorter than a command")
            return
        if self.closing:
            return
        sqe = Sqe.unpack(message)
        req = Request(sqe)
        self.commands += 1
        if not self.sqhd_disabled:
            self._sqhd = (self._sqhd + 1) % self.sq_size
        cid = sqe.cid
        inflight = self._inflight
        if cid in inflight:
            old = inflight[cid]
            if not old.reusable:
                self._refuse(req, Status.CMDID_CONFLICT | DNR, track=False)
                return
            old.retired = True
        elif len(inflight) >= self.sq_size:
            self.close(f"more than {self.sq_size} commands outstanding")
            return
        inflight[cid] = req
        if sqe.flags >> 6 not in (1, 2):
            # Fabrics describe data with SGLs (PSDT 01b or 10b), never PRPs.
            self._refuse(req, Status.INVALID_FIELD | DNR)
            return
        in_capsule = size - SQE_SIZE
        limit = self.in_capsule_size
        if sqe.opcode == _FABRICS and sqe.fctype == _CONNECT:
            limit = max(limit, CONNECT_DATA_LEN)
        facts = sgl.CommandData(
            host_to_controller=_host_to_controller(sqe),
            in_capsule_bytes=in_capsule,
            in_capsule_limit=limit,
            # What the command transfers is the NVMe layer's to check (req.length).
            transfer_length=0,
            max_transfer=self.max_transfer,
        )
        try:
            descriptor = sgl.parse_sqe_descriptor(message[:SQE_SIZE], facts)
        except sgl.SglError as exc:
            self._log.info("command %#x cid %d refused: %s", sqe.opcode, cid, exc)
            self._refuse(req, exc.status)
            return
        if isinstance(descriptor, sgl.KeyedSgl):
            req.length = descriptor.length
            if descriptor.length or descriptor.invalidate:
                self._keyed[cid] = descriptor
            self._on_command(req)
            return
        req.length = descriptor.length
        if descriptor.length:
            start = SQE_SIZE + descriptor.offset
            end = start + descriptor.length
            self.in_capsule_bytes += descriptor.length
            if self._borrow_capsule_data:
                req.data = message[start:end]
            else:
                req.data = bytearray(message[start:end])
        self._on_command(req)

    def _refuse(self, req: Request, status: int, *, track: bool = True) -> None:
        self.complete(req, status, track=track)
        self._on_refused(req)

    def _write(self, keyed: sgl.KeyedSgl, offset: int, data: Buffer) -> None:
        self.rdma_writes += 1
        self.verbs.write(data, keyed.address + offset, keyed.key)
