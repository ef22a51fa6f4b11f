"""The host's NVMe/RDMA verbs adapter over rdma-core's pyverbs: one queue's connection.

Thin: what a command puts on the wire and what a completion means is host_queue.py's; this
module opens the RDMA connection and moves bytes between it and the verbs.

- RDMA CM in event-channel mode (private data arrives only there, docs/rdma.md): resolve
  the address and the route, make the queue pair, post the receives, connect with the
  NVMe/RDMA connect request (cm.py: RECFMT 0, QID, HRQSIZE, HSQSIZE, CNTLID); the accept's
  CRQSIZE, or the reject's status, is read by host_queue.read_connect_answer. The event
  channel's descriptor is made non-blocking and put on the event loop: pyverbs 65 gives
  no descriptor for it (it is the one the channel opened on /dev/infiniband/rdma_cm, found
  by the set of such descriptors before and after) and a thread blocked in
  ``CMEvent(channel)`` would hold the GIL.
- A send and a receive completion queue, their completion channels on the loop. pyverbs
  posts on a CM ID without work request IDs: completions match by order, which a
  reliable connection keeps (receives in the order posted, sends in the order posted).
- Memory: regions registered on first use and kept for the queue's life (buffers.py's
  slots, a region each: pyverbs' CM ID posts a whole region from its start, so a buffer is
  a region here rather than an offset in one): a command's data region (the controller's
  RDMA READ or WRITE, under the region's own key) and a SEND's capsule come from them,
  bounded by the size classes; what finds none free (or is larger than any) gets a region
  of its own, deregistered when done. Receive buffers are registered once.

pyverbs exists only where rdma-core's Python bindings are installed (Debian's
python3-pyverbs): imported here alone, when a host opens an rdma queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from typing import Any

from pynvmf.host.errors import NvmeConnectionError
from pynvmf.rdma import cm
from pynvmf.rdma.buffers import BufferPool, RegionPool, Slot, data_classes
from pynvmf.rdma.channels import comp_channel
from pynvmf.rdma.host_queue import RdmaHostQueue, read_connect_answer

log = logging.getLogger(__name__)

RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"
# A receive buffer holds more than a CQE, so that a controller sending more arrives whole
# and is named (host_queue) rather than failing the receive with a length error.
RECEIVE_SIZE = 64
# What the CM waits for address and route resolution.
RESOLVE_TIMEOUT_MS = 2000
# RDMA READs of the controller the host's queue pair answers at once (soft-RoCE allows 128).
RESPONDER_RESOURCES = 16
# The largest private data of a connect request (an InfiniBand/RoCE CM REQ's).
REQUEST_PRIVATE_DATA = 56
# Capsule buffers: a command with 1 KiB of data (a Connect's) or 16 KiB (the in-capsule
# size pynvmf's target and the seed offer); larger capsules get a region of their own.
CAPSULE_SIZES = (64 + 1024, 64 + 16384)


def _rdma_cm_fds() -> set[int]:
    """This process's descriptors open on the RDMA CM's character device."""
    try:
        device = os.stat(RDMA_CM_DEVICE).st_rdev
    except OSError:
        device = -1
    found = set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if os.fstat(fd).st_rdev == device or os.readlink(f"/proc/self/fd/{name}").endswith(
                "/rdma_cm"
            ):
                found.add(fd)
        except OSError:
            continue  # the listing's own descriptor, closed since
    return found


def _event_name(kind: int) -> str:
    """An RDMA CM event type's name, for errors."""
    from pyverbs.librdmacm_enums import rdma_cm_event_type as EV

    try:
        return f"RDMA CM event {EV(kind).name}"
    except (ValueError, TypeError, AttributeError):
        return f"RDMA CM event {kind}"


class PyverbsHostVerbs:
    """One RDMA connection of a host queue: the CM ID, its queue pair, the completion
    queues and the memory regions. host_queue.HostVerbs over pyverbs."""

    def __init__(self, depth: int, max_transfer: int = 1024 * 1024) -> None:
        import pyverbs.cmid as c
        import pyverbs.libibverbs_enums as e
        from pyverbs.librdmacm_enums import rdma_cm_event_type as EV
        from pyverbs.librdmacm_enums import rdma_port_space as PS
        from pyverbs.mr import MR

        self._c = c
        self._e = e
        self._with_private_data = (EV.RDMA_CM_EVENT_ESTABLISHED, EV.RDMA_CM_EVENT_REJECTED)
        self._MR = MR
        self.loop = asyncio.get_running_loop()
        # Receives: one per entry of the queue (HRQSIZE), as the connect request says.
        self.receive_count = depth + 1
        before = _rdma_cm_fds()
        self.channel = c.CMEventChannel()
        new = _rdma_cm_fds() - before
        if len(new) != 1:
            self.channel.close()
            raise OSError(f"cannot tell the RDMA CM event channel's descriptor: {sorted(new)}")
        self.fd = new.pop()
        os.set_blocking(self.fd, False)  # rdma_get_cm_event answers EAGAIN when none waits
        self.cmid = c.CMID(creator=self.channel, port_space=PS.RDMA_PS_TCP)
        self._events: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.loop.add_reader(self.fd, self._cm_readable)
        self.queue: RdmaHostQueue | None = None
        self._max_transfer = max_transfer
        self._data: RegionPool[Any] | None = None  # made with the queue pair (the PD's)
        self._capsules: RegionPool[Any] | None = None
        # Command data regions by CID: (region, its slot; None: a region of its own).
        self._regions: dict[int, tuple[Any, Slot | None]] = {}
        self._receives: list[Any] = []
        self._posted: deque[int] = deque()
        self._sent: deque[tuple[Any, Slot | None]] = deque()
        self._cqs: list[tuple[Any, Any, int]] = []  # (channel, CQ, its descriptor)
        self._disconnecting = False
        self._established = False
        self._gone = False

    # -- connection ------------------------------------------------------------------------

    async def connect(
        self, address: str, port: int, request: cm.ConnectRequest, queue: RdmaHostQueue
    ) -> int:
        """Resolve, make the queue pair and receives, connect with ``request``; the accept's
        CRQSIZE (RdmaConnectRejected, NvmeConnectionError otherwise)."""
        from pyverbs.librdmacm_enums import rdma_cm_event_type as EV
        from pyverbs.librdmacm_enums import rdma_port_space as PS

        c = self._c
        self.queue = queue
        where = f"{address} port {port} qid {request.qid}"
        info = c.AddrInfo(dst=address, dst_service=str(port), port_space=PS.RDMA_PS_TCP)
        self.cmid.resolve_addr(info, RESOLVE_TIMEOUT_MS)
        await self._expect(EV.RDMA_CM_EVENT_ADDR_RESOLVED, where, "address resolution")
        self.cmid.resolve_route(RESOLVE_TIMEOUT_MS)
        await self._expect(EV.RDMA_CM_EVENT_ROUTE_RESOLVED, where, "route resolution")
        self._make_queue_pair()
        # The controller RDMA READs writes' data from the host: responder resources for
        # it; the host issues no READ. Retries as Linux's host asks (7: the most).
        param = c.ConnParam(
            resources=RESPONDER_RESOURCES,
            depth=0,
            retry=7,
            rnr_retry=7,
            data_len=REQUEST_PRIVATE_DATA,
        )
        param.set_private_data(request.encode())
        self.cmid.connect(param)
        kind, private = await self._events.get()
        established = kind == EV.RDMA_CM_EVENT_ESTABLISHED
        if not established and kind != EV.RDMA_CM_EVENT_REJECTED:
            raise NvmeConnectionError(f"{where}: {_event_name(kind)} instead of an accept")
        crqsize = read_connect_answer(established, private, request, where)
        self._established = True
        self.loop.add_reader(self.fd, self._cm_readable_connected)
        return crqsize

    async def _expect(self, want: int, where: str, what: str) -> None:
        kind, _ = await self._events.get()
        if kind != want:
            raise NvmeConnectionError(f"{where}: {what} failed ({_event_name(kind)})")

    def _make_queue_pair(self) -> None:
        import pyverbs.libibverbs_enums as e
        from pyverbs.cq import CQ
        from pyverbs.qp import QPCap, QPInitAttr

        ctx = self.cmid.context
        pd = self.cmid.pd
        n = self.receive_count
        (send_channel, send_fd), (recv_channel, recv_fd) = comp_channel(ctx), comp_channel(ctx)
        self.send_cq = CQ(ctx, n, None, send_channel, 0)
        self.recv_cq = CQ(ctx, n, None, recv_channel, 0)
        cap = QPCap(max_send_wr=n, max_recv_wr=n, max_send_sge=1, max_recv_sge=1)
        self.cmid.create_qp(
            QPInitAttr(
                qp_type=e.ibv_qp_type.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq, cap=cap
            )
        )
        access = e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
        self._receives = [self._MR(pd, RECEIVE_SIZE, access) for _ in range(n)]
        flags = e.ibv_access_flags
        # A data region serves a write (the controller's RDMA READ) or a read (its RDMA
        # WRITE) as the slot's next command needs.
        remote = access | flags.IBV_ACCESS_REMOTE_READ | flags.IBV_ACCESS_REMOTE_WRITE
        self._data = RegionPool(
            BufferPool(data_classes(n, self._max_transfer)),
            lambda size: self._MR(pd, size, remote),
        )
        self._capsules = RegionPool(
            BufferPool([(size, n) for size in CAPSULE_SIZES]),
            lambda size: self._MR(pd, size, access),
        )
        for slot in range(n):
            self._post_receive(slot)
        for channel, fd, cq in (
            (send_channel, send_fd, self.send_cq),
            (recv_channel, recv_fd, self.recv_cq),
        ):
            cq.req_notify()
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._on_completions, channel, cq)
            self._cqs.append((channel, cq, fd))

    def _read_cm_events(self) -> list[tuple[int, bytes]]:
        events: list[tuple[int, bytes]] = []
        while True:
            try:
                event = self._c.CMEvent(self.channel)
            except Exception:  # EAGAIN: none left
                return events
            kind = event.event_type
            # Only a connection's events carry private data (the union pyverbs reads is
            # another event's otherwise).
            private = bytes(event.private_data) if kind in self._with_private_data else b""
            event.ack_cm_event()
            events.append((kind, private))

    def _cm_readable(self) -> None:
        for event in self._read_cm_events():
            self._events.put_nowait(event)

    def _cm_readable_connected(self) -> None:
        """After the accept, every CM event but a duplicate means the connection ended
        (DISCONNECTED, DEVICE_REMOVAL, TIMEWAIT_EXIT...)."""
        from pyverbs.librdmacm_enums import rdma_cm_event_type as EV

        for kind, _ in self._read_cm_events():
            if kind != EV.RDMA_CM_EVENT_ESTABLISHED:
                self._ended()

    # -- host_queue.HostVerbs --------------------------------------------------------------

    def send(self, capsule: bytes) -> None:
        assert self._capsules is not None  # the queue pair is made before any command
        n = len(capsule)
        mr, slot = self._capsules.take(n)
        mr.write(capsule, n)
        self._sent.append((mr, slot))
        # Exactly the capsule's bytes go out of a region that may be larger.
        self.cmid.post_send(mr, self._e.ibv_send_flags.IBV_SEND_SIGNALED, n)

    def register(self, cid: int, length: int, data: memoryview | None) -> tuple[int, int]:
        assert self._data is not None
        mr, slot = self._data.take(length)
        if data is not None:
            mr.write(data.tobytes(), length)
        self._regions[cid] = (mr, slot)
        # The descriptor names `length` bytes: the controller moves no more than that.
        return mr.buf, mr.rkey

    def registered_data(self, cid: int, length: int) -> bytes:
        return bytes(self._regions[cid][0].read(length, 0))

    def release(self, cid: int) -> None:
        region = self._regions.pop(cid, None)
        if region is not None and self._data is not None:
            self._data.give(*region)

    def disconnect(self) -> None:
        if self._disconnecting or self._gone:
            return
        self._disconnecting = True
        if not self._established:
            # Rejected, or given up on before the accept: no DISCONNECTED event will come.
            self._ended()
            return
        try:
            self.cmid.disconnect()
        except Exception as exc:  # never connected, or already down
            log.debug("RDMA disconnect: %s", exc)
            self._ended()

    # -- completions -----------------------------------------------------------------------

    def _post_receive(self, slot: int) -> None:
        self.cmid.post_recv(self._receives[slot])
        self._posted.append(slot)

    def _on_completions(self, channel: Any, cq: Any) -> None:
        try:
            try:
                channel.get_cq_event(cq)
            except Exception:  # EAGAIN: the wakeup was for an event already taken
                return
            cq.ack_events(1)
            cq.req_notify()
            while not self._gone:
                n, wcs = cq.poll(16)
                if n <= 0:
                    break
                for wc in wcs:
                    if cq is self.recv_cq:
                        self._received(wc)
                    else:
                        self._sent_done(wc)
        except Exception as exc:
            log.exception("RDMA completions")
            self._fail(f"completion handling failed: {exc}")

    def _received(self, wc: Any) -> None:
        slot = self._posted.popleft() if self._posted else -1
        if wc.status != self._e.ibv_wc_status.IBV_WC_SUCCESS or slot < 0:
            self._fail(f"a receive completed with status {wc.status}")
            return
        # At most a receive buffer; more than a CQE is host_queue's to refuse.
        message = self._receives[slot].read(min(wc.byte_len, RECEIVE_SIZE), 0)
        if self.queue is not None and not self.queue.closed:
            self._post_receive(slot)
            self.queue.received(message)

    def _sent_done(self, wc: Any) -> None:
        if self._sent and self._capsules is not None:
            self._capsules.give(*self._sent.popleft())
        if wc.status != self._e.ibv_wc_status.IBV_WC_SUCCESS:
            self._fail(f"a SEND completed with status {wc.status}")

    def _fail(self, reason: str) -> None:
        queue = self.queue
        if queue is not None and not queue.closed:
            queue.conn.failed(reason)

    def _ended(self) -> None:
        """The RDMA connection is down: release everything, tell the queue."""
        if self._gone:
            return
        self._gone = True
        if not self._disconnecting:
            self._disconnecting = True
            try:
                self.cmid.disconnect()  # the answer to the controller's DREQ
            except Exception as exc:
                log.debug("RDMA disconnect: %s", exc)
        self.loop.remove_reader(self.fd)
        for _channel, _cq, fd in self._cqs:
            self.loop.remove_reader(fd)
        queue = self.queue
        if queue is not None:
            queue.disconnected()
        for cid in list(self._regions):
            self.release(cid)
        # The queue pair (with the CM ID) before the completion queues it uses.
        for obj in (self.cmid, *(cq for _, cq, _ in self._cqs), *(ch for ch, _, _ in self._cqs)):
            try:
                obj.close()
            except Exception as exc:
                log.debug("RDMA close: %s", exc)
        for mr, slot in self._sent:
            if slot is None:
                mr.close()
        self._sent.clear()
        for mr in self._receives:
            mr.close()
        for pool in (self._data, self._capsules):
            if pool is not None:
                pool.close()
        self.channel.close()


async def open_queue(
    address: str,
    port: int,
    qid: int,
    depth: int,
    *,
    cntlid: int = 0,
    max_transfer: int = 1024 * 1024,
    timeout: float = 10.0,
) -> RdmaHostQueue:
    """Open NVMe/RDMA queue ``qid`` to ``address``:``port`` for ``depth`` commands in flight
    (``depth`` + 1 entries: HSQSIZE ``depth``, HRQSIZE ``depth`` + 1); the NVMe Connect is
    the caller's."""
    request = cm.ConnectRequest.for_queue(qid, depth + 1, cntlid)
    verbs = PyverbsHostVerbs(depth, max_transfer)
    queue = RdmaHostQueue(qid, depth, verbs, max_transfer=max_transfer)
    queue.peer = f"{address}:{port}"
    try:
        async with asyncio.timeout(timeout):
            crqsize = await verbs.connect(address, port, request, queue)
    except TimeoutError:
        queue.abort("no answer in time")
        raise NvmeConnectionError(
            f"{address} port {port} qid {qid}: no RDMA CM answer within {timeout} s"
        ) from None
    except NvmeConnectionError:
        queue.abort("connect failed")
        raise
    except Exception as exc:
        # pyverbs' errors (no RDMA device for the address, no route...): the connection's.
        queue.abort("connect failed")
        raise NvmeConnectionError(f"{address} port {port} qid {qid}: {exc}") from exc
    except BaseException:
        queue.abort("cancelled")
        raise
    log.debug("rdma queue %d to %s: CRQSIZE %d", qid, queue.peer, crqsize)
    return queue
