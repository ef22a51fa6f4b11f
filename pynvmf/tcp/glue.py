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
import os
from typing import Final, Generic, Protocol, TypeVar, cast

from pynvmf.block.inplace import Loans
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
        # Where output may hold views of memory (lend_views): their record, and the socket
        # they go to directly.
        self._loans: Loans | None = None
        self._fd = -1

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
            loans = self._loans
            if tls is not None:
                tls.write(out)
            elif loans is not None and loans.lenders:
                self._write_lent(out, transport, loans)
            else:
                transport.writelines(out)
            self._output_sent(out, transport)
        if conn.closing:
            if tls is not None:
                tls.close()
            transport.close()

    def _lend_views(self, loans: Loans) -> None:
        """The connection's output may hold views of memory namespaces lent to `loans`
        (block/inplace.py), on a connection without TLS: such output goes to the socket
        itself, at once, and what the socket does not take is copied, so no view is read
        after the flush."""
        assert self.transport is not None and self.tls is None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            self._fd = sock.fileno()
            self._loans = loans

    def _write_lent(self, out: list[Buffer], transport: asyncio.Transport, loans: Loans) -> None:
        rest: list[Buffer]
        if transport.get_write_buffer_size():
            # Queued output would be passed: it all goes through the transport, copied.
            rest = [bytes(b) if type(b) is memoryview else b for b in out]
        else:
            rest = write_at_once(self._fd, out)
        loans.returned()
        if rest:
            transport.writelines(rest)

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


# The most buffers one writev takes (Linux: 1024).
_IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def write_at_once(fd: int, out: list[Buffer]) -> list[Buffer]:
    """Hand `out` to the non-blocking socket `fd` now, with no transport in between (its
    buffer must be empty: the bytes would pass it otherwise). What the socket did not
    take comes back, in order, for the transport to send next: copies, so that no view
    in `out` is read after this returns. An error other than a full socket is left for
    the transport's next write to meet."""
    sizes = [b.nbytes if type(b) is memoryview else len(b) for b in out]
    taken = 0
    try:
        for start in range(0, len(out), _IOV_MAX):
            end = start + _IOV_MAX
            n = os.writev(fd, out[start:end])
            taken += n
            if n < sum(sizes[start:end]):
                break
    except OSError:
        pass
    rest: list[Buffer] = []
    for buf, size in zip(out, sizes, strict=True):
        if taken >= size:
            taken -= size
            continue
        if taken or type(buf) is memoryview:
            rest.append(bytes(memoryview(buf)[taken:]))
            taken = 0
        else:
            rest.append(buf)
    return rest
