"""The asyncio glue between a socket and the sans-I/O TargetConnection, and poll mode.

Deliberately thin: tcp/glue.py's ConnectionGlue moves bytes between the socket (or
the TLS channel over it) and the connection; the target's protocol object adds what
only a target does: it admits connections, tells TLS from plain NVMe/TCP, charges the
receive buffer to the target's memory, holds input while the host does not read, and
says why a connection that waits too long for its host should go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from pynvmf.logs import about
from pynvmf.target.budget import WRITE_HIGH_WATER, WRITE_LOW_WATER
from pynvmf.target.port import SecureChannelPolicy
from pynvmf.target.queue import TargetQueue
from pynvmf.tcp.framing import Buffer
from pynvmf.tcp.glue import ConnectionGlue
from pynvmf.tcp.target import TargetConnection
from pynvmf.tls.channel import SecureChannel
from pynvmf.tls.engine import TlsEngine
from pynvmf.tls.wire import CT_HANDSHAKE

if TYPE_CHECKING:
    from pynvmf.target.port import Port
    from pynvmf.target.target import Target

log = logging.getLogger(__name__)


class BusyPoller:
    """Poll mode: after input, the event loop keeps polling its sockets (a callback always
    ready, so it never sleeps in epoll_wait) for `window_s` seconds, and goes back to
    sleeping once no input came for that long. A host that sends its next command within
    the window gets it read without the wake-up of a sleeping thread (tens of
    microseconds on an idle core), at the price of a core kept busy while I/O goes on."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.last_input = 0.0
        self.spinning = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def input(self) -> None:
        """Input arrived: poll for the window from now."""
        self.last_input = time.monotonic()
        if not self.spinning:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self.spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        loop = self._loop
        if loop is not None and time.monotonic() - self.last_input < self.window_s:
            loop.call_soon(self._spin)
        else:
            self.spinning = False


class TargetProtocol(ConnectionGlue[TargetConnection]):
    def __init__(self, target: Target, port: Port) -> None:
        super().__init__()
        self.target = target
        self.port = port
        self.conn = TargetConnection(port.transport, self._output_wanted, flush_now=self._flush)
        self.queue: TargetQueue | None = None
        self.accepted = time.monotonic()
        self.peer_address = ""
        self.admitted = False
        # Why input is not being read now ("write": the host does not read what we send):
        # reading resumes when none holds. (A command waiting for data buffers does not
        # stop input: the data of transfers already granted must keep arriving, and what
        # waits holds no buffer; SQSIZE bounds how many commands can wait.)
        self._input_holds: set[str] = set()
        self._rx_charge = 0  # the receive buffer, charged to the target's memory pool
        # Whether the target times commands (command_counts.py; read at every batch of
        # input), and whether this connection did at the last batch.
        self._counts = target.command_counts
        self._timing = False
        # On a port that offers TLS, until the first bytes arrive: is this TLS or plain
        # NVMe/TCP?
        self._sniffing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        sockname = transport.get_extra_info("sockname")
        peer = transport.get_extra_info("peername")
        self.peer_address = peer[0] if peer else ""
        if not self.target.connection_budget.admit(self.peer_address):
            self.transport.abort()
            return
        self.admitted = True
        queue = self.queue = TargetQueue(self.target, self.port, self.conn, sockname[0])
        if peer:
            queue.peer_address = (peer[0], peer[1])
        self.logger().debug("connection from %s on %s", peer, self.port)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        if not self.port.offers_tls:
            self._lend_views(self.conn.lend_views())
        self.port.connections.add(self)
        recorder = self.target.recorder
        if recorder is not None:
            local = f"{sockname[0]}:{sockname[1]}" if len(sockname) > 1 else str(sockname)
            tap = recorder.open("target", local, f"{peer[0]}:{peer[1]}" if peer else "")
            if tap is not None:
                self.conn.record(tap)
        if self.port.offers_tls:
            self._secure(
                TlsEngine.server(self.target.tls_lookup(self.port)),
                ktls=self.port.ktls,
                label=f"connection from {self.peer_address} on {self.port}",
                # What is known of the connection before its Connect: where it is from.
                log_fields=queue.log_context(),
                counters=self.target.tls_counters,
            )
            self._sniffing = True

    def logger(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        """The log for records about this connection: with its context once admitted."""
        queue = self.queue
        return about(log, queue) if queue is not None else log

    def _tls_established(self) -> None:
        tls, queue = self.tls, self.queue
        if tls is not None and queue is not None:
            queue.tls_psk = tls.engine.psk

    def _tls_failed(self, reason: str) -> None:
        # The reason names the failure (alert, field), never a key or a secret.
        clean = self.tls is not None and self.tls.clean_close
        self.logger().log(
            logging.INFO if clean else logging.WARNING,
            "TLS from %s on %s %s: %s",
            self.peer_address,
            self.port,
            "closed" if clean else "failed",
            reason,
        )
        self.conn.close(f"TLS: {reason}")

    def _sniff(self, tls: SecureChannel, nbytes: int) -> bool:
        """The connection's first bytes: a TLS handshake record, or plain NVMe/TCP (an
        ICReq) where the port allows it. False: the connection is refused."""
        self._sniffing = False
        first = tls.engine.peek_input(nbytes)
        if first[:1] == bytes([CT_HANDSHAKE]):
            return True
        if self.port.secure_channel == SecureChannelPolicy.REQUIRED:
            self.logger().warning(
                "connection from %s on %s refused: the port requires TLS, the host sent "
                "plain NVMe/TCP",
                self.peer_address,
                self.port,
            )
            self.target.tls_counters.handshake_failures += 1
            self.abort("TLS required")
            return False
        self.tls = None
        self.conn.feed(first)
        return False

    def overdue(self, now: float) -> str:
        """Why this connection has waited too long for its host, or "" if it has not."""
        queue = self.queue
        limits = self.target.connection_budget.limits
        unbound = queue is not None and queue.controller is None
        if unbound and now - self.accepted > limits.connect_deadline_s:
            return f"no Connect within {limits.connect_deadline_s:g} s of the connection"
        if queue is not None and queue.auth_deadline and now > queue.auth_deadline:
            return "the queue did not authenticate in time"
        since = self.conn.reader.partial_since
        if since and now - since > limits.pdu_deadline_s:
            return f"a PDU started {now - since:.0f} s ago is still incomplete"
        return ""

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        # Latency tracking: one clock read a batch of input, shared by its commands.
        if self._counts.tracking:
            self._timing = True
            conn.batch_arrived(time.monotonic_ns())
        elif self._timing:
            self._timing = False
            conn.batch_arrived(0)
        poller = self.target.poller
        if poller is not None:
            poller.input()
        tls = self.tls
        if tls is not None and tls.rx_user:
            if not self._sniffing or self._sniff(tls, nbytes):
                tls.buffer_updated(nbytes)
        else:
            conn.data_received(nbytes)
        if not self._rx_charge and conn.established:
            self._charge_receive_buffer()
        self._flush()

    def _charge_receive_buffer(self) -> None:
        """The handshake sized the receive buffer: it counts against the target's memory
        like any data buffer, and a connection the pool cannot hold goes."""
        size = self.conn.reader.buffer_size
        if self.tls is not None:
            size += self.tls.engine.buffer_size
        pool = self.target.memory_pool
        if pool.used + size > pool.capacity:
            self.logger().warning(
                "connection from %s on %s closed: the target's memory limit (%d bytes) is reached",
                self.peer_address,
                self.port,
                pool.capacity,
            )
            self.abort("memory limit")
            return
        pool.charge(size)
        self._rx_charge = size

    def _hold_input(self, reason: str, hold: bool) -> None:
        holds = self._input_holds
        transport = self.transport
        if hold:
            if not holds and transport is not None:
                transport.pause_reading()
            holds.add(reason)
        elif reason in holds:
            holds.discard(reason)
            if not holds and transport is not None and not transport.is_closing():
                transport.resume_reading()

    def _output_sent(self, out: list[Buffer], transport: asyncio.Transport) -> None:
        # Read data still in the socket's buffer stays charged only above the high water
        # mark: past it asyncio pauses us and resume_writing gives it back; below it (the
        # bound is the mark itself) no callback would ever come.
        conn = self.conn
        if conn.undrained and transport.get_write_buffer_size() <= WRITE_HIGH_WATER:
            conn.output_drained()
        timed = conn.timed
        if timed or self._timing:
            # Latency tracking: one clock read a flush, for every completion it sent (the
            # fast path's, counted by the queue, and those timed alone).
            queue = self.queue
            if queue is not None:
                queue.timed_sent(timed, time.monotonic_ns())
            timed.clear()

    def pause_writing(self) -> None:
        # The host is not reading its completions: stop reading its commands.
        self._hold_input("write", True)

    def resume_writing(self) -> None:
        self.conn.output_drained()
        self._hold_input("write", False)

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        tls = self.tls
        if self._tls_alert(exc):
            conn.close("a TLS control record (alert) arrived")
        if conn.established:
            # One line per connection: what the transport did, for users and for tests
            # that check offload decisions (in-capsule vs R2T, digests) made with real hosts.
            s = conn.stats
            queue = self.queue
            ctrl = queue.controller if queue is not None else None
            self.logger().info(
                "connection closed: port=%s qid=%d cntlid=%d digests=%s%s commands=%d "
                "r2t=%d r2t_dropped=%d h2c_data=%d c2h_data=%d in_capsule_bytes=%d "
                "data_digest_errors=%d term_reqs=%d tls=%s reason=%s",
                self.port,
                conn.qid,
                ctrl.cntlid if ctrl else 0,
                "h" if conn.hdgst else "-",
                "d" if conn.ddgst else "-",
                s.commands,
                s.r2t_sent,
                s.r2t_dropped,
                s.h2c_data_pdus,
                s.c2h_data_pdus,
                s.in_capsule_bytes,
                s.data_digest_errors,
                s.term_reqs_sent,
                tls.offload if tls is not None else "-",
                conn.close_reason or "host closed",
            )
        if self.admitted:
            self.admitted = False
            self.target.connection_budget.release(self.peer_address)
        conn.close("connection lost")
        # Its counts move to the target's in the same step as it leaves the port's
        # connections: a scrape between two callbacks sees each once.
        counters = self.target.counters
        counters.data_digest_errors += conn.stats.data_digest_errors
        counters.term_reqs_sent += conn.stats.term_reqs_sent
        self.port.connections.discard(self)
        if self.queue is not None:
            self.queue.connection_lost()
        # Nothing may keep a closed connection alive until a full garbage collection:
        # its receive buffer alone is 256 KiB.
        conn.release()
        if self._rx_charge:
            self.target.memory_pool.give(self._rx_charge)
            self._rx_charge = 0
        self.queue = None
        self.transport = None
