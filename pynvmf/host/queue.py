"""One NVMe queue of the host: a TCP connection and the commands in flight on it.

The asyncio glue around the sans-I/O HostConnection: tcp/glue.py's ConnectionGlue
(the target's too) moves bytes between the socket and the connection; the queue
adds the submissions, each command with a future that its completion resolves.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError
from pynvmf.spec.command import FUSE_FIRST, FUSE_SECOND, Sqe
from pynvmf.tcp.glue import ConnectionGlue
from pynvmf.tcp.host import ABORTED, Buffer, HostCommand, HostConnection
from pynvmf.tcp.psk import TlsPsk
from pynvmf.tls.engine import TlsEngine

log = logging.getLogger(__name__)

# Output is normally sent once per loop iteration, but a full batch goes at once:
# the controller can start on it while the rest of the batch is still being
# built, rather than both sides taking turns (measured: ~1.5x the IOPS at QD32
# between two single-core processes).
EAGER_FLUSH_BUFFERS = 8

# Told (qid, opcode, nsid, cdw10, cdw11, cdw12) of each command a queue sends (submit,
# execute, submit_fused): what a test or a trace wants to see of the wire without
# wrapping the methods, which the compiled build calls directly. Empty, it costs one
# length test per command.
COMMAND_WATCHERS: Final[list[Callable[[int, int, int, int, int, int], object]]] = []


def watch_commands(watcher: Callable[[int, int, int, int, int, int], object]) -> Callable[[], None]:
    """Have `watcher` told each command the queues send; returns what stops it."""
    COMMAND_WATCHERS.append(watcher)
    return lambda: COMMAND_WATCHERS.remove(watcher)


@dataclass(frozen=True, slots=True)
class Submission:
    """One command of a fused operation, for `HostQueue.submit_fused`."""

    opcode: int
    nsid: int = 0
    cdw10: int = 0
    cdw11: int = 0
    cdw12: int = 0
    cdw13: int = 0
    cdw14: int = 0
    cdw15: int = 0
    data: Buffer | None = None


class HostQueue(ConnectionGlue[HostConnection]):
    """Use `await HostQueue.open(...)`; the NVMe Connect is the caller's business."""

    def __init__(
        self,
        qid: int,
        depth: int,
        *,
        header_digest: bool = False,
        data_digest: bool = False,
        max_transfer: int = 1024 * 1024,
    ) -> None:
        super().__init__()
        self.qid = qid
        self.conn = HostConnection(
            depth,
            self._on_complete,
            self._output_wanted,
            header_digest=header_digest,
            data_digest=data_digest,
            max_transfer=max_transfer,
            on_established=self._on_established,
            on_closed=self._on_closed,
        )
        self.peer = ""
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        # Everything handed to the transport, ICReq to the last PDU (what crossed, or
        # is about to cross, the connection).
        self.bytes_sent = 0
        self._tls_ready: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls,
        address: str,
        port: int,
        qid: int,
        depth: int,
        *,
        header_digest: bool = False,
        data_digest: bool = False,
        max_transfer: int = 1024 * 1024,
        timeout: float = 10.0,
        tls_psk: TlsPsk | None = None,
        ktls: str = "auto",
    ) -> HostQueue:
        """Connect TCP (and TLS 1.3 with `tls_psk`) and exchange ICReq/ICResp."""
        loop = asyncio.get_running_loop()
        queue = cls(
            qid,
            depth,
            header_digest=header_digest,
            data_digest=data_digest,
            max_transfer=max_transfer,
        )
        host = address.strip("[]")
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: queue, host, port)
                if tls_psk is not None:
                    await queue._start_tls(tls_psk, ktls, f"{address} port {port} qid {qid}")
                queue.conn.start()
                await queue._ready
        except TimeoutError:
            what = "TLS handshake" if queue.tls and not queue.tls.engine.established else "ICResp"
            queue.abort(f"no {what} in time")
            raise NvmeConnectionError(
                f"{address} port {port}: no {what} within {timeout} s"
            ) from None
        except NvmeConnectionError:
            queue.abort("failed")
            raise
        except OSError as exc:
            queue.abort(str(exc))
            error = NvmeConnectionError(f"{address} port {port}: {exc}")
            # Set by hand: compiled by mypyc, `raise ... from exc` drops the cause, and the
            # CLI reads the errno from it.
            error.__cause__ = exc
            raise error  # noqa: B904 (the cause is set above)
        except BaseException:
            queue.abort("cancelled")
            raise
        return queue

    async def _start_tls(self, psk: TlsPsk, ktls: str, label: str) -> None:
        self._tls_ready = self._loop.create_future()
        self._secure(TlsEngine.client(psk), ktls=ktls, label=label).start()
        await self._tls_ready

    def _tls_established(self) -> None:
        if self._tls_ready is not None and not self._tls_ready.done():
            self._tls_ready.set_result(None)

    def _tls_failed(self, reason: str) -> None:
        log.warning("%s: TLS failed: %s", self.peer, reason)
        error = NvmeConnectionError(f"TLS: {reason}")
        if self._tls_ready is not None and not self._tls_ready.done():
            self._tls_ready.set_exception(error)
        self.conn.close(f"TLS: {reason}")

    # -- commands -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.conn.closing

    @property
    def bytes_received(self) -> int:
        """Everything read from the connection."""
        return self.conn.reader.bytes_received

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
        """Send a command once a command id is free; `wait()` for its completion."""
        conn = self.conn
        if conn.closing:
            raise NvmeConnectionError(conn.close_reason)
        if not conn.free_slots or self._slot_waiters:
            await self._wait_slot()
        return self._send(opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data, into)

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
        conn = self.conn
        cmd = conn.submit(
            opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data=data, into=into
        )
        cmd.waiter = self._loop.create_future()
        if COMMAND_WATCHERS:
            for watcher in COMMAND_WATCHERS:
                watcher(self.qid, opcode, nsid, cdw10, cdw11, cdw12)
        if len(conn.outbox) >= EAGER_FLUSH_BUFFERS:
            self._flush()
        return cmd

    async def submit_fused(
        self, first: Submission, second: Submission
    ) -> tuple[HostCommand, HostCommand]:
        """Send the two commands of a fused operation (FUSE 01b, then 10b) back to back:
        both command ids are taken first and both capsules queued with nothing in
        between, so no other command of this queue can come between them. `wait()` for
        each completion."""
        conn = self.conn
        if conn.depth < 2:
            raise ValueError(f"queue {self.qid} has one command id; a fused operation takes two")
        if conn.closing:
            raise NvmeConnectionError(conn.close_reason)
        if conn.free_slots < 2 or self._slot_waiters:
            await self._wait_slot(2)
        commands = []
        for command, fuse in ((first, FUSE_FIRST), (second, FUSE_SECOND)):
            cmd = conn.submit(
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
            commands.append(cmd)
            for watcher in COMMAND_WATCHERS:
                watcher(
                    self.qid,
                    command.opcode,
                    command.nsid,
                    command.cdw10,
                    command.cdw11,
                    command.cdw12,
                )
        if len(conn.outbox) >= EAGER_FLUSH_BUFFERS:
            self._flush()
        return commands[0], commands[1]

    def _result(self, cmd: HostCommand) -> int:
        if cmd.status:
            raise self._error(cmd)
        return cmd.result

    async def wait(self, cmd: HostCommand) -> int:
        """The completion's result (DW0 | DW1 << 32); raises on a failed command."""
        fut: asyncio.Future[None] = cmd.waiter
        try:
            await fut
        except asyncio.CancelledError:
            # The command stays in flight (NVMe/TCP cannot take it back); keep its
            # late data out of a buffer the caller may already have reused.
            cmd.discard = True
            raise
        return self._result(cmd)

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
        """submit() and wait() in one, without the second coroutine on the hot path."""
        conn = self.conn
        if conn.closing:
            raise NvmeConnectionError(conn.close_reason)
        if not conn.free_slots or self._slot_waiters:
            await self._wait_slot()
        cmd = self._send(opcode, nsid, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, data, into)
        try:
            await cmd.waiter
        except asyncio.CancelledError:
            cmd.discard = True
            raise
        return self._result(cmd)

    def _error(self, cmd: HostCommand) -> Exception:
        if cmd.status == ABORTED:
            return NvmeConnectionError(f"queue {self.qid}: {self.conn.close_reason}")
        return NvmeStatusError(
            cmd.status, Sqe.unpack(cmd.sqe), admin=self.qid == 0, result=cmd.result
        )

    async def _wait_slot(self, slots: int = 1) -> None:
        """Wait, in turn, until `slots` command ids are free."""
        conn = self.conn
        waiters = self._slot_waiters
        first = True
        while True:
            fut: asyncio.Future[None] = self._loop.create_future()
            # A waiter woken but beaten to the free id goes back to the front.
            if first:
                waiters.append(fut)
            else:
                waiters.appendleft(fut)
            first = False
            try:
                await fut
            except BaseException:
                if fut in waiters:
                    waiters.remove(fut)
                elif not fut.cancelled():
                    self._wake_slot_waiter()  # pass the wake-up on
                raise
            if conn.closing:
                raise NvmeConnectionError(conn.close_reason)
            if conn.free_slots >= slots:
                return

    def _wake_slot_waiter(self) -> None:
        waiters = self._slot_waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _on_complete(self, cmd: HostCommand) -> None:
        fut = cmd.waiter
        if fut is not None and not fut.done():
            fut.set_result(None)
        if self._slot_waiters:
            self._wake_slot_waiter()

    # -- lifecycle ------------------------------------------------------------------------

    def _on_established(self) -> None:
        if not self._ready.done():
            self._ready.set_result(None)

    def _on_closed(self, reason: str) -> None:
        if not self._ready.done():
            self._ready.set_exception(NvmeConnectionError(reason))
            # Nobody may be awaiting it (closed before open() got there).
            self._ready.exception()
        for fut in self._slot_waiters:
            if not fut.done():
                fut.set_result(None)  # they see conn.closing and raise
        self._slot_waiters.clear()

    def close(self, reason: str = "closed by host") -> None:
        super().close(reason)

    async def wait_closed(self, timeout: float = 5.0) -> None:
        if self.transport is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._lost)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()

    # -- asyncio protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peer = str(transport.get_extra_info("peername"))

    def _output_sent(self, out: list[Buffer], transport: asyncio.Transport) -> None:
        self.bytes_sent += sum(b.nbytes if type(b) is memoryview else len(b) for b in out)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost: {exc}" if exc else "connection closed by controller"
        if self._tls_alert(exc):
            reason = "connection closed by controller (a TLS alert)"
        if self._tls_ready is not None and not self._tls_ready.done():
            self._tls_ready.set_exception(NvmeConnectionError(f"TLS handshake: {reason}"))
        self.conn.close(reason)
        self.transport = None
        if not self._lost.done():
            self._lost.set_result(None)
