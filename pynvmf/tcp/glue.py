"""The asyncio glue both ends of an NVMe/TCP connection share.

A BufferedProtocol that moves bytes between the socket and the sans-I/O connection
(tcp/target.py's TargetConnection, tcp/host.py's HostConnection): input goes straight
into the connection's receive buffer, or through the TLS channel while user space
decrypts; output is handed to the socket (or the channel) in one `writelines` per
event-loop iteration. What each role adds is its subclass's: admission, sniffing,
budgets and the flow control of input on the target (target/protocol.py), the
submissions and their futures on the host (host/queue.py).
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar, cast

from pynvmf.compiled import mypyc_attr
from pynvmf.tcp.framing import Buffer, PduReader
from pynvmf.tls.channel import COUNTERS, SecureChannel, TlsCounters, kernel_record_error
from pynvmf.tls.engine import TlsEngine


class GluedConnection(Protocol):
    """What the glue uses of a sans-I/O connection (either role's)."""

    reader: PduReader
    closing: bool

    def data_received(self, nbytes: int) -> None: ...

    def feed(self, data: Buffer) -> None: ...

    def take_output(self) -> list[Buffer]: ...

    def close(self, reason: str) -> None: ...


ConnT = TypeVar("ConnT", bound=GluedConnection)


# Compiled with the host's queue (setup.py); the target's TargetProtocol, interpreted,
# derives from it too, which a compiled class allows only when it says so.
@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectionGlue(asyncio.BufferedProtocol, Generic[ConnT]):
    """One connection's protocol object; the subclass makes `conn`, with `_output_wanted`
    as its on_output."""

    conn: ConnT

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # The secure channel (TLS 1.3 with a PSK), on a connection that has one.
        self.tls: SecureChannel | None = None
        self._flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def _secure(
        self,
        engine: TlsEngine,
        *,
        ktls: str,
        label: str,
        log_fields: dict[str, object] | None = None,
        counters: TlsCounters = COUNTERS,
    ) -> SecureChannel:
        """The connection's bytes through TLS with `engine` (client or server) from now on."""
        self.tls = SecureChannel(
            engine,
            self.transport,
            self.conn.feed,
            self._tls_established,
            self._tls_failed,
            ktls=ktls,
            label=label,
            log_fields=log_fields,
            counters=counters,
        )
        return self.tls

    def _tls_established(self) -> None:
        raise NotImplementedError

    def _tls_failed(self, reason: str) -> None:
        raise NotImplementedError

    def _tls_alert(self, exc: Exception | None) -> bool:
        """Whether the connection ended because a TLS control record (an alert, or a
        post-handshake message) came to the kernel's record layer, which recv() cannot
        return as data."""
        tls = self.tls
        return tls is not None and tls.rx_kernel and kernel_record_error(exc)

    # -- input --------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        tls = self.tls
        if tls is not None and tls.rx_user:
            return tls.get_buffer(sizehint)
        return self.conn.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        tls = self.tls
        if tls is not None and tls.rx_user:
            tls.buffer_updated(nbytes)
        else:
            self.conn.data_received(nbytes)
        self._flush()

    def eof_received(self) -> bool:
        return False

    # -- output -------------------------------------------------------------------------

    def _output_wanted(self) -> None:
        # Coalesce the output of this loop iteration into one writelines.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        conn = self.conn
        out = conn.take_output()
        tls = self.tls
        if out:
            if tls is not None:
                tls.write(out)
            else:
                transport.writelines(out)
            self._output_sent(out, transport)
        if conn.closing:
            if tls is not None:
                tls.close()
            transport.close()

    def _output_sent(self, out: list[Buffer], transport: asyncio.Transport) -> None:
        """`out` has been handed to the socket (or the TLS channel)."""

    def close(self, reason: str) -> None:
        """Close gracefully: queued output is sent, then the socket closes."""
        self.conn.close(reason)
        self._flush()

    def abort(self, reason: str) -> None:
        self.conn.close(reason)
        if self.transport is not None:
            self.transport.abort()
