"""The secure channel: the asyncio glue both roles share. It sits between an
``asyncio.BufferedProtocol`` and its transport, runs the handshake, decides per
connection and per direction whether the kernel or user space carries the records,
logs and counts that decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynvmf.logs import about
from pynvmf.tls.engine import TlsEngine
from pynvmf.tls.ktls import TLS_RX, TLS_TX, ktls_attach, ktls_set
from pynvmf.tls.wire import GROUP_SECP256R1, GROUP_SECP384R1, GROUP_X25519, PSK_DHE_KE, TlsError

log = logging.getLogger(__name__)


@dataclass
class TlsCounters:
    """Per-process counts of secure-channel decisions (the target's stats show them)."""

    handshakes: int = 0
    handshake_failures: int = 0
    ktls_tx: int = 0
    ktls_rx: int = 0
    user_tx: int = 0
    user_rx: int = 0
    fallback_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "handshakes": self.handshakes,
            "handshake_failures": self.handshake_failures,
            "ktls_tx": self.ktls_tx,
            "ktls_rx": self.ktls_rx,
            "user_space_tx": self.user_tx,
            "user_space_rx": self.user_rx,
            "fallback_reasons": dict(self.fallback_reasons),
        }


COUNTERS = TlsCounters()


KTLS_POLICIES = ("auto", "off")


class SecureChannel:
    """TLS between an asyncio BufferedProtocol and its transport.

    The protocol forwards `get_buffer`/`buffer_updated` here while `rx_user` is true and
    sends through `write`. Plaintext goes to `on_plaintext`; `on_established` runs once the
    handshake is done (before any plaintext), `on_failed(reason)` once it fails.

    The record layer moves into the kernel per direction when it can: transmit right after
    the handshake (our last handshake record has left user space: the transport's buffer is
    empty), receive at the first moment no partial record waits in user space, with the
    sequence number of the records user space has already opened (a NewSessionTicket the
    server sent after its Finished counts among them).
    """

    def __init__(
        self,
        engine: TlsEngine,
        transport: Any,
        on_plaintext: Callable[[bytes], None],
        on_established: Callable[[], None],
        on_failed: Callable[[str], None],
        *,
        ktls: str = "auto",
        label: str = "",
        log_fields: dict[str, object] | None = None,
        counters: TlsCounters = COUNTERS,
    ) -> None:
        self.engine = engine
        self.transport = transport
        self.on_plaintext = on_plaintext
        self.on_established = on_established
        self.on_failed = on_failed
        self.ktls = ktls
        self.label = label
        # What this channel's log records say of its connection (pynvmf/logs.py).
        self.log_fields = log_fields or {}
        self.counters = counters
        self.rx_user = True
        self.tx_user = True
        self.tx_kernel = False
        self.rx_kernel = False
        self.reason = ""
        # The peer ended the session with close_notify (not a failure).
        self.clean_close = False
        self._announced = False
        self._pending_tx: list[Any] = []
        self._ulp = False
        self._ulp_tried = False
        self._rx_decided = False
        self._app_seen = False

    def log_context(self) -> dict[str, object]:
        return self.log_fields

    def start(self) -> None:
        if self.engine.is_client:
            self.engine.start()
        self._send_engine_output()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.engine.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._after_input(self.engine.received(nbytes))

    def feed(self, data: bytes) -> None:
        self._after_input(self.engine.feed(data))

    def _after_input(self, app: list[bytes]) -> None:
        engine = self.engine
        was = self._announced
        self._send_engine_output()
        if engine.established and not was and engine.error is None:
            self._announced = True
            self.counters.handshakes += 1
            self._offload_tx()
            self.on_established()
        for data in app:
            self._app_seen = True
            self.on_plaintext(data)
        if engine.error is not None:
            self._fail(str(engine.error))
            return
        if engine.closed:
            self.clean_close = True
            self._fail("the peer closed the TLS session (close_notify)")
            return
        # A client waits for the server's first application data (ICResp): a server may
        # send post-handshake messages (NewSessionTicket) first, and those are easier read
        # here than as control messages from the kernel.
        if self._announced and not self._rx_decided and (self._app_seen or not engine.is_client):
            self._offload_rx()

    def _fail(self, reason: str) -> None:
        transport = self.transport
        if not self._announced:
            self.counters.handshake_failures += 1
        self._announced = True
        self.rx_user = False
        self._rx_decided = True
        self.on_failed(reason)
        if transport is not None and not transport.is_closing():
            transport.close()
        self.transport = None

    def _send_engine_output(self) -> None:
        out = self.engine.take_output()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def write(self, buffers: list[Any]) -> None:
        """Application data out: straight to the socket when the kernel encrypts."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.tx_kernel:
            transport.writelines(buffers)
            return
        if not self._announced:
            self._pending_tx.extend(buffers)
            return
        try:
            transport.writelines(self.engine.protect(buffers))
        except TlsError as exc:
            self._fail(str(exc))

    def close(self) -> None:
        """A close_notify where the record layer is ours, then the socket closes."""
        transport = self.transport
        if transport is not None and self.tx_user and not self.tx_kernel and self._announced:
            self.engine.close()
            self._send_engine_output()

    def _sock(self) -> Any:
        return self.transport.get_extra_info("socket") if self.transport is not None else None

    def _attach(self) -> str:
        if self.ktls != "auto":
            return "kTLS disabled by configuration"
        if self._ulp_tried:
            return "" if self._ulp else self.reason
        self._ulp_tried = True
        sock = self._sock()
        if sock is None:
            return "no socket"
        reason = ktls_attach(sock)
        self._ulp = not reason
        return reason

    def _note_fallback(self, direction: str, reason: str) -> None:
        self.counters.fallback_reasons[reason] = self.counters.fallback_reasons.get(reason, 0) + 1
        if not self.reason:
            self.reason = reason
        about(log, self).debug("%s: TLS %s in user space: %s", self.label, direction, reason)

    def _offload_tx(self) -> None:
        engine = self.engine
        tx, _ = engine.traffic()
        reason = self._attach()
        if not reason and self.transport.get_write_buffer_size():
            reason = "handshake records still queued in user space"
        if not reason:
            reason = ktls_set(self._sock(), TLS_TX, tx)
        if reason:
            self.counters.user_tx += 1
            self._note_fallback("transmit", reason)
        else:
            self.tx_kernel = True
            self.tx_user = False
            self.counters.ktls_tx += 1
        assert engine.suite is not None
        about(log, self).info(
            "%s: TLS 1.3 established: %s, %s%s, identity %s, records sent by %s",
            self.label,
            engine.suite.name,
            "psk_dhe_ke" if engine.mode == PSK_DHE_KE else "psk_ke",
            f" ({_GROUP_NAMES.get(engine.group or 0, '')})" if engine.group else "",
            (engine.psk.identity.decode(errors="replace").split(" ")[0] if engine.psk else "-")
            + (
                f" ({engine.psk.derivation} derivation)"
                if engine.psk and engine.psk.derivation
                else ""
            ),
            "the kernel (kTLS)" if self.tx_kernel else f"user space ({self.reason})",
        )
        pending, self._pending_tx = self._pending_tx, []
        if pending:
            self.write(pending)

    def _offload_rx(self) -> None:
        if not self.engine.at_record_boundary:
            return  # a record is half read: the kernel must start at a record's first byte
        reason = self._attach()
        if not reason:
            _, rx = self.engine.traffic()
            reason = ktls_set(self._sock(), TLS_RX, rx)
        if reason:
            self.counters.user_rx += 1
            self._note_fallback("receive", reason)
            self.rx_kernel = False
            # Decided: the engine stays the receive record layer for this connection.
            self._rx_decided = True
        else:
            self._rx_decided = True
            self.rx_kernel = True
            self.rx_user = False
            self.counters.ktls_rx += 1
            about(log, self).info("%s: TLS receive by the kernel", self.label)

    @property
    def offload(self) -> str:
        """What carries the records: "ktls", "user" or "ktls-tx" (one direction)."""
        if self.tx_kernel and self.rx_kernel:
            return "ktls"
        if self.tx_kernel or self.rx_kernel:
            return "ktls-tx" if self.tx_kernel else "ktls-rx"
        return "user"


_GROUP_NAMES = {GROUP_X25519: "x25519", GROUP_SECP256R1: "secp256r1", GROUP_SECP384R1: "secp384r1"}


def kernel_record_error(exc: BaseException | None) -> bool:
    """A kTLS receive that failed because a record other than application data arrived
    (an alert, a post-handshake message): recv() without room for the record type's
    control message fails with EIO."""
    return isinstance(exc, OSError) and exc.errno == 5
