"""A controller: one host's association with a subsystem (dynamic controller model).

It owns the controller registers that Property Get/Set reach, the features,
the outstanding Asynchronous Event Requests, the keep-alive timer, and the
queues connected to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from pynvmf.logs import about
from pynvmf.spec import command as C
from pynvmf.spec.identify import IocsVector, Oaes
from pynvmf.spec.logpages import CHANGED_NS_MAX, ErrorLogEntry, LogPageId
from pynvmf.spec.opcodes import (
    NOTICE_ANA_CHANGE,
    NOTICE_DISC_LOG_CHANGED,
    NOTICE_NS_ATTR_CHANGED,
    AsyncEventType,
    FeatureId,
)
from pynvmf.target.budget import effective_kato_ms, keep_alive_check_ms
from pynvmf.target.notifications import KEEP_ALIVE_TIMEOUT
from pynvmf.target.reservations import NotificationLog
from pynvmf.target.subsystem import DEFAULT_VERSION

if TYPE_CHECKING:
    from pynvmf.target.port import Port
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Subsystem
    from pynvmf.target.target import Target
    from pynvmf.target.transport import Request
    from pynvmf.tcp.psk import TlsPsk

log = logging.getLogger(__name__)

VERSION = DEFAULT_VERSION  # what a subsystem reports unless configured otherwise
QUEUE_ENTRIES = 1024  # MQES + 1
MAX_IO_QUEUES = 64
AERL = 3  # 0's based: four Asynchronous Event Requests may be outstanding
ERROR_LOG_ENTRIES = 64
KAS_100MS = 10  # keep-alive granularity reported in Identify, 100 ms units
_FAILED = C.CSTS_CFS | C.CSTS_RDY

# CAP: MQES, CQR (contiguous queues required), TO = 15 (7.5 s); CSS: the NVM command set
# alone (CC.CSS 000b) or every I/O command set supported (110b, NVMe 2.0 hosts).
CAP = (QUEUE_ENTRIES - 1) | 1 << 16 | 15 << 24 | C.CAP_CSS_NVM | C.CAP_CSS_IOCS
# The I/O command set combinations (Identify CNS 1Ch), selected by index with the I/O
# Command Set Profile feature: the NVM command set is the only one.
IOCS_COMBINATIONS: tuple[int, ...] = (IocsVector.NVM,)


class Controller:
    def __init__(
        self,
        target: Target,
        subsystem: Subsystem,
        cntlid: int,
        hostnqn: str,
        hostid: bytes,
        kato_ms: int,
        port: Port,
    ) -> None:
        self.target = target
        self.subsystem = subsystem
        self.cntlid = cntlid
        self.hostnqn = hostnqn
        self.hostid = hostid
        self.port = port
        self.cc = 0
        self.csts = 0
        self.queues: dict[int, TargetQueue] = {}
        # The namespaces attached to this controller (every one visible to its host), by
        # NSID: what its commands may name. Kept in place by Subsystem.refresh_views.
        self.namespaces = subsystem.view_of(hostnqn)
        # Those of them whose Reads, Writes and Copies may take the I/O fast path now
        # (target/io.py), by NSID. Kept in place by Subsystem.refresh_io_paths.
        self.io_paths = subsystem.io_paths_of(self.namespaces)
        self.io_queues = subsystem.max_io_queues or MAX_IO_QUEUES
        # Asynchronous Event Requests waiting for an event, and events waiting for one.
        self.aer: deque[tuple[TargetQueue, Request]] = deque()
        self.pending_events: deque[int] = deque()
        # While above 0, events wait in pending_events (a change on its way to the worker
        # processes that serve this controller's I/O queues: cores/workers.py).
        self.events_held = 0
        # Log pages whose event was reported and not yet read: further events of the same
        # log page stay quiet until the host reads it (without Retain Asynchronous Event).
        self.masked_log_pages: set[int] = set()
        self.aen_config = 0
        # NSIDs added, removed or changed since the host last read the Changed Namespace
        # List log; past what the log holds it only says "more" (bounded either way).
        self.changed_nsids: list[int] = []
        # I/O Command Set Profile: the index into IOCS_COMBINATIONS the host selected.
        self.iocs_index = 0
        self.volatile_write_cache = True
        self.features: dict[int, int] = {
            FeatureId.ARBITRATION: 0,
            FeatureId.POWER_MGMT: 0,
            FeatureId.TEMP_THRESHOLD: 343,  # 70 degrees C, in Kelvin
            FeatureId.ERROR_RECOVERY: 0,
            FeatureId.IRQ_COALESCE: 0,
            FeatureId.WRITE_ATOMIC: 0,
        }
        # Host Behavior Support (Feature 16h) as the host last set it: zeros until then.
        self.host_behavior = subsystem.host_behavior_default
        self.errors: deque[ErrorLogEntry] = deque(maxlen=ERROR_LOG_ENTRIES)
        # Reservation Notification log pages for this controller, and their mask.
        self.reservation_log = NotificationLog()
        self.error_count = 0
        self.created = time.monotonic()
        self._kato_ms = effective_kato_ms(kato_ms)
        # Set by every command; the keep-alive check clears it (traffic based keep alive).
        self.traffic = True
        self._last_traffic = time.monotonic()
        self._ka_handle: asyncio.TimerHandle | None = None
        self.destroyed = False
        # The PSK secure channel concatenation generated that this controller's admin queue
        # came over TLS with (or replaced its PSK with): its queues need no authentication.
        self.generated_psk: TlsPsk | None = None

    @property
    def is_discovery(self) -> bool:
        return self.subsystem.is_discovery

    @property
    def copy_formats_enabled(self) -> int:
        """Copy descriptor formats the host enabled in Host Behavior Support (CDFE)."""
        return C.host_behavior_cdfe(self.host_behavior)

    @property
    def failed(self) -> bool:
        """CSTS.CFS on a ready controller: a fault rule failed it (controller_faults.py),
        and it answers nothing but Fabrics commands. One that refused the configuration it
        was enabled with has CFS without RDY, and answers as it always did."""
        return self.csts & _FAILED == _FAILED

    @property
    def acre(self) -> bool:
        """Whether the host enabled Command Retry Delay (Host Behavior Support ACRE)."""
        return C.host_behavior_acre(self.host_behavior)

    # -- keep alive -------------------------------------------------------------------

    @property
    def kato_ms(self) -> int:
        return self._kato_ms

    @kato_ms.setter
    def kato_ms(self, requested: int) -> None:
        # KATO 0 would let a controller (and what it holds) live for ever: bounded.
        self._kato_ms = effective_kato_ms(requested)

    @property
    def keep_alive_running(self) -> bool:
        return self._ka_handle is not None

    def start_keep_alive(self) -> None:
        """(Re)start the keep-alive timer: traffic based, checked every slack interval, so
        a silent host is noticed after KATO and before KATO + 2 intervals."""
        self._cancel_keep_alive()
        if not self.destroyed:
            self.traffic = False
            self._last_traffic = time.monotonic()
            self._schedule_check()

    def log_context(self) -> dict[str, object]:
        """What each log record about this controller says of it (pynvmf/logs.py)."""
        return {"host": self.hostnqn, "subsystem": self.subsystem.nqn, "cntlid": self.cntlid}

    def _schedule_check(self) -> None:
        loop = asyncio.get_running_loop()
        interval = keep_alive_check_ms(self._kato_ms) / 1000
        self._ka_handle = loop.call_later(interval, self._keep_alive_check)

    def _cancel_keep_alive(self) -> None:
        if self._ka_handle is not None:
            self._ka_handle.cancel()
            self._ka_handle = None

    def _keep_alive_check(self) -> None:
        self._ka_handle = None
        now = time.monotonic()
        if self.traffic:
            self.traffic = False
            self._last_traffic = now
        elif (now - self._last_traffic) * 1000 >= self._kato_ms:
            about(log, self).warning(
                "controller %d of %s: no keep alive from %s within %d ms, tearing it down",
                self.cntlid,
                self.subsystem.nqn,
                self.hostnqn,
                self._kato_ms,
            )
            self.target.counters.keep_alive_expiries += 1
            self.target.notifications.send(KEEP_ALIVE_TIMEOUT, self.hostnqn)
            self.destroy("keep-alive timeout")
            return
        self._schedule_check()

    # -- asynchronous events ------------------------------------------------------------

    def park_event_request(self, queue: TargetQueue, req: Request) -> bool:
        """Keep an Asynchronous Event Request until there is an event for it; False when
        the host already has AERL + 1 outstanding."""
        self.aer = deque(item for item in self.aer if not item[1].retired)
        if len(self.aer) > AERL:
            return False
        # The host may take its identifier back without the request completing (SPDK
        # completes its AERs itself when it detaches and reuses their CIDs).
        req.reusable = True
        self.aer.append((queue, req))
        self._deliver_events()
        return True

    def notify(self, event_type: int, info: int, log_page: int) -> None:
        """Raise an asynchronous event: the completion of an outstanding AER now, or of
        the next one. Events of a log page the host has not read since are not repeated."""
        if log_page in self.masked_log_pages or self.destroyed:
            return
        self.masked_log_pages.add(log_page)
        self.pending_events.append(event_type & 0x7 | (info & 0xFF) << 8 | log_page << 16)
        self._deliver_events()

    def awaits_event(self, log_page: int) -> bool:
        """Whether an event of `log_page` would complete an outstanding AER now (one is
        outstanding, and the host read that log page since its last event)."""
        if self.destroyed or self.events_held or log_page in self.masked_log_pages:
            return False
        return any(not req.retired for _, req in self.aer)

    def log_page_read(self, log_page: int) -> None:
        self.masked_log_pages.discard(log_page)

    def namespace_changed(self, nsid: int) -> None:
        """Namespace `nsid` appeared, went away or changed: note it in the Changed Namespace
        List log and raise a Namespace Attribute Changed event if the host enabled it."""
        changed = self.changed_nsids
        if nsid not in changed and len(changed) <= CHANGED_NS_MAX:
            changed.append(nsid)
        if self.aen_config & Oaes.NS_ATTR:
            self.notify(AsyncEventType.NOTICE, NOTICE_NS_ATTR_CHANGED, LogPageId.CHANGED_NS)

    def take_changed_nsids(self) -> list[int]:
        """The Changed Namespace List as the host reads it; reading clears it."""
        changed, self.changed_nsids = self.changed_nsids, []
        return changed

    def ana_changed(self) -> None:
        """What this controller's ANA log says changed: an ANA Change event, if enabled
        (and unless one is waiting for the host to read the log)."""
        if self.aen_config & Oaes.ANA_CHANGE:
            self.notify(AsyncEventType.NOTICE, NOTICE_ANA_CHANGE, LogPageId.ANA)

    def discovery_changed(self) -> None:
        """The discovery log changed: a Discovery Log Page Change event, if enabled."""
        if self.aen_config & Oaes.DISCOVERY_CHANGE:
            self.notify(AsyncEventType.NOTICE, NOTICE_DISC_LOG_CHANGED, LogPageId.DISCOVERY)

    def hold_events(self) -> None:
        self.events_held += 1

    def release_events(self) -> None:
        self.events_held -= 1
        self._deliver_events()

    def _deliver_events(self) -> None:
        while self.pending_events and self.aer and not self.events_held:
            queue, req = self.aer.popleft()
            if req.retired:
                continue
            queue.conn.complete(req, 0, self.pending_events.popleft())

    # -- errors -----------------------------------------------------------------------

    def record_error(self, sqid: int, req: Request, status: int) -> None:
        self.error_count += 1
        sqe = req.sqe
        self.errors.appendleft(
            ErrorLogEntry(
                error_count=self.error_count,
                sqid=sqid,
                cid=sqe.cid,
                status=(status << 1) & 0xFFFF,
                param_error_location=0xFFFF,
                nsid=sqe.nsid if sqe.opcode != 0x7F else 0,
                trtype=3,
                opcode=sqe.opcode,
            )
        )

    # -- authentication -------------------------------------------------------------------

    @property
    def admin_authenticated(self) -> bool:
        """Whether the admin queue did what its host's key asks: authenticated, or came over
        a TLS channel whose PSK an authentication generated (or no key asks anything)."""
        if self.generated_psk is not None:
            return True
        admin = self.queues.get(0)
        auth = admin.auth if admin is not None else None
        return auth is None or auth.authenticated

    # -- teardown ------------------------------------------------------------------------

    def remove_queue(self, qid: int, queue: TargetQueue) -> None:
        if self.queues.get(qid) is queue:
            del self.queues[qid]
        if qid == 0:
            # The admin queue going away ends the association.
            self.destroy("admin queue closed")

    def destroy(self, reason: str) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        self._cancel_keep_alive()
        self.target.generated_psks.controller_gone(self)
        about(log, self).info(
            "controller %d of %s destroyed: %s", self.cntlid, self.subsystem.nqn, reason
        )
        if self.subsystem.controllers.get(self.cntlid) is self:
            del self.subsystem.controllers[self.cntlid]
        self.aer.clear()
        self.pending_events.clear()
        for queue in list(self.queues.values()):
            queue.close(reason)
        self.queues.clear()
