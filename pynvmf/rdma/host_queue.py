"""The host's end of an NVMe/RDMA queue (sans-I/O), and its asyncio queue.

What a host does per command on an RDMA queue (the NVMe/RDMA transport binding):

- the command capsule is one SEND: the 64-byte SQE, followed by the write's data when it
  fits the queue's in-capsule size (the controller's IOCCSZ less the SQE on an I/O queue;
  0 on the admin queue, whose receive buffers Linux's nvmet-rdma makes without room for
  data), with an SGL Data Block descriptor of sub type Offset;
- other data lies in a memory region the adapter registered for that command, named by a
  Keyed SGL Data Block descriptor (address, length, key): the controller RDMA READs a
  write's data from it and RDMA WRITEs a read's data into it; a command without data
  carries a keyed descriptor of length 0 (as Linux's host sends);
- the completion is the 16-byte CQE the controller SENDs into one of the receive buffers;
  its CID names the command. A reliable connection delivers the controller's RDMA WRITE
  before the SEND behind it, so a read's data is in its region when its CQE comes.

A receive that is not a 16-byte CQE, or a CQE naming no command in flight, ends the queue
(every command in flight fails): the controller broke the binding, and nothing it sends on
that queue can be trusted after.

The adapter below this layer (``HostVerbs``: pynvmf/rdma/host_verbs.py over pyverbs, a fake
in the tests) posts the SENDs, owns the memory regions, and hands up each receive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError
from pynvmf.host.queue import COMMAND_WATCHERS, Submission
from pynvmf.rdma import cm
from pynvmf.rdma.sgl import DESCRIPTOR_SIZE, KEYED_MAX_LENGTH, SQE_DPTR_OFFSET, InCapsule, KeyedSgl
from pynvmf.spec.command import FUSE_FIRST, FUSE_SECOND, SQE_SIZE, Sqe, build_sqe
from pynvmf.tcp.host import ABORTED, Buffer, HostCommand

log = logging.getLogger(__name__)

CQE_SIZE: Final = 16
# DW0, DW1, SQHD, SQID, CID, status and phase (bit 0).
_CQE: Final = struct.Struct("<IIHHHH")


class RdmaConnectRejected(NvmeConnectionError):
    """The controller rejected a queue's RDMA CM connect request: ``status`` is the reject
    status the transport binding names (None where the reject carried none it names)."""

    def __init__(self, message: str, status: cm.RejectStatus | None) -> None:
        super().__init__(message)
        self.status = status


def read_connect_answer(
    established: bool, private_data: bytes, request: cm.ConnectRequest, where: str
) -> int:
    """The controller's answer to ``request``: the accept's CRQSIZE when the connection
    was established (NvmeConnectionError if the accept is unreadable or the controller
    receives fewer commands than the host sends), or RdmaConnectRejected naming the
    reject's status."""
    if not established:
        try:
            reject = cm.ConnectReject.decode(private_data)
        except cm.PrivateDataError as exc:
            raise RdmaConnectRejected(
                f"{where}: the controller rejected the connect request ({exc})", None
            ) from None
        raise RdmaConnectRejected(
            f"{where}: the controller rejected the connect request: {reject.meaning}"
            f" (status {int(reject.status):#x})",
            reject.status,
        )
    try:
        accept = cm.ConnectAccept.decode(private_data)
    except cm.PrivateDataError as exc:
        raise NvmeConnectionError(f"{where}: unreadable accept: {exc}") from None
    # The host keeps at most HSQSIZE (0's based) commands in flight: one entry free.
    if accept.crqsize < request.hsqsize:
        raise NvmeConnectionError(
            f"{where}: the controller receives {accept.crqsize} commands (CRQSIZE), fewer"
            f" than the {request.hsqsize} the queue sends"
        )
    return accept.crqsize


class HostVerbs(Protocol):
    """What the host's queue asks of its RDMA adapter."""

    def send(self, capsule: bytes) -> None:
        """Post a SEND of the command capsule (SQE and in-capsule data)."""

    def register(self, cid: int, length: int, data: memoryview | None) -> tuple[int, int]:
        """Register ``length`` bytes of memory for command ``cid``'s data: a write's
        ``data`` copied in (the controller RDMA READs it), or, with None, room the
        controller RDMA WRITEs a read's data into. Returns (address, remote key)."""

    def registered_data(self, cid: int, length: int) -> bytes:
        """The first ``length`` bytes of command ``cid``'s region (a read's data)."""

    def release(self, cid: int) -> None:
        """Deregister command ``cid``'s region (none: nothing to do)."""

    def disconnect(self) -> None:
        """End the RDMA connection."""


@dataclasses.dataclass
class RdmaHostStats:
    commands: int = 0
    in_capsule_bytes: int = 0
    # Commands whose data the controller moved by RDMA READ (writes) or WRITE (reads).
    keyed_writes: int = 0
    keyed_reads: int = 0
    capsule_bytes_sent: int = 0
    completions: int = 0


class RdmaHostConnection:
    """One NVMe/RDMA queue of a host: command IDs, capsules, completions. The same
    submission interface as tcp/host.py's HostConnection, so the host library's queue
    code reads alike over both transports."""

    def __init__(
        self,
        depth: int,
        verbs: HostVerbs,
        on_complete: Callable[[HostCommand], None],
        *,
        on_closed: Callable[[str], None] | None = None,
        max_transfer: int = 1024 * 1024,
    ) -> None:
        if not 1 <= depth <= 0xFFFF:
            raise ValueError(f"queue depth {depth} out of range")
        self.depth = depth
        self.verbs = verbs
        self.on_complete = on_complete
        self.on_closed = on_closed
        self.max_transfer = min(max_transfer, KEYED_MAX_LENGTH)
        self.stats = RdmaHostStats()
        self.closing = False
        self.close_reason = ""
        # In-capsule data limit: none until told (set_inline_limit, an I/O queue).
        self.inline_limit = 0
        self._slots: list[HostCommand | None] = [None] * depth
        # Commands whose data has a registered region (released on completion).
        self._registered: set[int] = set()
        self._free = list(range(depth - 1, -1, -1))

    # -- state --------------------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def inflight(self) -> int:
        return self.depth - len(self._free)

    def set_inline_limit(self, size: int) -> None:
        """Send at most ``size`` bytes of a write's data in its capsule, for the commands
        submitted from now on; larger data goes by keyed SGL."""
        self.inline_limit = max(0, size)

    def pending_commands(self) -> list[HostCommand]:
        return [cmd for cmd in self._slots if cmd is not None]

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
        """Send a command (the caller checked ``free_slots``): ``data`` goes to the
        controller, ``into`` (a byte memoryview) receives its data."""
        if self.closing:
            raise ConnectionError(self.close_reason)
        if data is not None and into is not None:
            raise ValueError("a command moves data in one direction only")
        view: memoryview | None = None
        length = 0
        if data is not None:
            view = data if type(data) is memoryview else memoryview(data)
            length = view.nbytes
        elif into is not None:
            length = into.nbytes
        if length > self.max_transfer:
            raise ValueError(f"{length} bytes is above the queue's largest transfer")
        cid = self._free.pop()
        inline: memoryview | None = None
        descriptor: bytes
        try:
            if view is not None and 0 < length <= self.inline_limit:
                inline = view
                descriptor = InCapsule(offset=0, length=length).encode()
            elif length:
                address, key = self.verbs.register(cid, length, view)
                self._registered.add(cid)
                descriptor = KeyedSgl(address=address, length=length, key=key).encode()
            else:
                descriptor = KeyedSgl(address=0, length=0, key=0).encode()
        except BaseException:
            self._free.append(cid)
            raise
        # PSDT 01b (SGL for data), the descriptor in DPTR.
        sqe = bytearray(
            build_sqe(
                opcode, cid, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, flags=0x40 | fuse
            )
        )
        sqe[SQE_DPTR_OFFSET : SQE_DPTR_OFFSET + DESCRIPTOR_SIZE] = descriptor
        cmd = HostCommand(cid, opcode, bytes(sqe), length)
        cmd.into = into
        self._slots[cid] = cmd
        stats = self.stats
        stats.commands += 1
        if inline is not None:
            stats.in_capsule_bytes += length
            capsule = bytes(sqe) + inline.tobytes()
        else:
            if length:
                if into is not None:
                    stats.keyed_reads += 1
                else:
                    stats.keyed_writes += 1
            capsule = bytes(sqe)
        stats.capsule_bytes_sent += len(capsule)
        self.verbs.send(capsule)
        return cmd

    # -- input --------------------------------------------------------------------------

    def received(self, message: bytes | memoryview) -> None:
        """A receive completed with ``message``: the controller's CQE."""
        if self.closing:
            return
        n = len(message)
        if n != CQE_SIZE:
            self.close(f"the controller sent {n} bytes where a {CQE_SIZE}-byte completion goes")
            return
        dw0, dw1, _sqhd, _sqid, cid, sf = _CQE.unpack(message)
        cmd = self._slots[cid] if cid < self.depth else None
        if cmd is None:
            self.close(f"the controller completed command {cid}, which is not in flight")
            return
        self.stats.completions += 1
        status = sf >> 1
        into = cmd.into
        if into is not None and cid in self._registered and status == 0 and not cmd.discard:
            into[: cmd.length] = self.verbs.registered_data(cid, cmd.length)
            cmd.received = cmd.length
        self._release(cid)
        self._slots[cid] = None
        self._free.append(cid)
        cmd.status = status
        cmd.result = dw0 | dw1 << 32
        self.on_complete(cmd)

    def failed(self, reason: str) -> None:
        """A work request completed in error (the queue pair is in error by then), or the
        connection was lost: the queue ends."""
        self.close(reason)

    def _release(self, cid: int) -> None:
        if cid in self._registered:
            self._registered.discard(cid)
            self.verbs.release(cid)

    # -- teardown -------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """End the queue: every outstanding command completes with status ABORTED."""
        if self.closing:
            return
        self.closing = True
        self.close_reason = reason
        pending = self.pending_commands()
        self._slots = [None] * self.depth
        for cid in list(self._registered):
            self._release(cid)
        for cmd in pending:
            cmd.status = ABORTED
            self.on_complete(cmd)
        if self.on_closed is not None:
            self.on_closed(reason)
        self.verbs.disconnect()


class RdmaHostQueue:
    """One NVMe/RDMA queue of the host library: what pynvmf.host.queue.HostQueue is to
    TCP (submit, execute, wait, submit_fused, close), over an RdmaHostConnection. Made by
    pynvmf.rdma.host_verbs.open_queue, already connected (the RDMA CM exchange done);
    the NVMe Connect is the caller's business."""

    # No TLS on an RDMA queue (the host library's authentication asks).
    tls = None

    def __init__(
        self, qid: int, depth: int, verbs: HostVerbs, *, max_transfer: int = 1024 * 1024
    ) -> None:
        self.qid = qid
        self._loop = asyncio.get_running_loop()
        self.conn = RdmaHostConnection(
            depth,
            verbs,
            self._on_complete,
            on_closed=self._on_closed,
            max_transfer=max_transfer,
        )
        self.peer = ""
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        # Set when the adapter saw the RDMA connection end (wait_closed).
        self._gone = asyncio.Event()
        self.bytes_received = 0

    # -- commands -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.conn.closing

    @property
    def bytes_sent(self) -> int:
        return self.conn.stats.capsule_bytes_sent

    def received(self, message: bytes | memoryview) -> None:
        """The adapter's receive: a CQE (or what the controller sent in its place)."""
        self.bytes_received += len(message)
        self.conn.received(message)

    async def submit(
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
    ) -> HostCommand:
        """Send a command once a command id is free; ``wait()`` for its completion."""
        await self._wait_slot(1)
        return self._send(opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data, into)

    async def execute(
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
    ) -> int:
        """submit() and wait() in one."""
        cmd = await self.submit(
            opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data=data, into=into
        )
        return await self.wait(cmd)

    async def submit_fused(
        self, first: Submission, second: Submission
    ) -> tuple[HostCommand, HostCommand]:
        """The two commands of a fused operation back to back (FUSE 01b, then 10b)."""
        if self.conn.depth < 2:
            raise ValueError(f"queue {self.qid} has one command id; a fused operation takes two")
        await self._wait_slot(2)
        commands = []
        for command, fuse in ((first, FUSE_FIRST), (second, FUSE_SECOND)):
            cmd = self.conn.submit(
                command.opcode,
                command.nsid,
                command.cdw10,
                command.cdw11,
                command.cdw12,
                command.cdw13,
                command.cdw14,
                command.cdw15,
                data=command.data,
                fuse=fuse,
            )
            cmd.waiter = self._loop.create_future()
            self._watch(command.opcode, command.nsid, command.cdw10, command.cdw11, command.cdw12)
            commands.append(cmd)
        return commands[0], commands[1]

    def _send(
        self,
        opcode: int,
        nsid: int,
        cdw10: int,
        cdw11: int,
        cdw12: int,
        cdw13: int,
        cdw14: int,
        cdw15: int,
        data: Buffer | None,
        into: memoryview | None,
    ) -> HostCommand:
        cmd = self.conn.submit(
            opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data=data, into=into
        )
        cmd.waiter = self._loop.create_future()
        self._watch(opcode, nsid, cdw10, cdw11, cdw12)
        return cmd

    def _watch(self, opcode: int, nsid: int, cdw10: int, cdw11: int, cdw12: int) -> None:
        for watcher in COMMAND_WATCHERS:
            watcher(self.qid, opcode, nsid, cdw10, cdw11, cdw12)

    async def wait(self, cmd: HostCommand) -> int:
        """The completion's result (DW0 | DW1 << 32); raises on a failed command."""
        try:
            await cmd.waiter
        except asyncio.CancelledError:
            # The command stays in flight; its late data must not land in a buffer the
            # caller may already have reused.
            cmd.discard = True
            raise
        if cmd.status == ABORTED:
            raise NvmeConnectionError(f"queue {self.qid}: {self.conn.close_reason}")
        if cmd.status:
            raise NvmeStatusError(
                cmd.status, Sqe.unpack(cmd.sqe[:SQE_SIZE]), admin=self.qid == 0, result=cmd.result
            )
        return cmd.result

    async def _wait_slot(self, slots: int) -> None:
        conn = self.conn
        while True:
            if conn.closing:
                raise NvmeConnectionError(conn.close_reason)
            if conn.free_slots >= slots and not self._slot_waiters:
                return
            fut: asyncio.Future[None] = self._loop.create_future()
            self._slot_waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in self._slot_waiters:
                    self._slot_waiters.remove(fut)
                elif not fut.cancelled():
                    self._wake_one()  # woken, then cancelled: pass the wake-up on
                raise
            if conn.closing:
                raise NvmeConnectionError(conn.close_reason)
            if conn.free_slots >= slots:
                return

    def _on_complete(self, cmd: HostCommand) -> None:
        fut = cmd.waiter
        if fut is not None and not fut.done():
            fut.set_result(None)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _on_closed(self, reason: str) -> None:
        for fut in self._slot_waiters:
            if not fut.done():
                fut.set_result(None)  # they see conn.closing and raise
        self._slot_waiters.clear()

    # -- lifecycle ------------------------------------------------------------------------

    def close(self, reason: str = "closed by host") -> None:
        self.conn.close(reason)

    def abort(self, reason: str) -> None:
        self.conn.close(reason)

    def disconnected(self) -> None:
        """The adapter saw the RDMA connection end (the controller's disconnect, the
        answer to ours, an error)."""
        self.conn.close("connection closed by controller")
        self._gone.set()

    async def wait_closed(self, timeout: float = 5.0) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self._gone.wait()
        except TimeoutError:
            log.warning("rdma queue %d: not closed within %s s", self.qid, timeout)
