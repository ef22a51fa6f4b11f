"""The NVMe/RDMA target's verbs adapter over rdma-core's pyverbs: a listener and its queues.

Thin: every protocol decision is the sans-I/O layer's (cm.py for the connect request,
queue.py for commands and data); this module moves bytes between them and the verbs.

- The RDMA CM listener uses an event channel (private data arrives only there, docs/rdma.md),
  made non-blocking and on the event loop (`loop.add_reader`). pyverbs 65 gives no file
  descriptor for a CM event channel: it is the one the channel opened on
  /dev/infiniband/rdma_cm (and a thread blocked in `CMEvent(channel)` would hold the GIL:
  pyverbs does not release it there).
- Each queue has the CM ID's queue pair, with a send and a receive completion queue whose
  completion channels' descriptors are on the loop (`loop.add_reader`; pyverbs 56, Debian
  13's, has no `CompChannel.fd`: the descriptor is the one the channel opened). Receive buffers
  (an MR each, 64 bytes + the in-capsule size) are posted before the accept. pyverbs posts
  on a CM ID without work request IDs: completions are matched by order (RdmaQueue).
- After the host's disconnect, the DISCONNECTED event is answered with `disconnect()`, or the
  host waits for the CM's timeout.
- What the listener holds is bounded by the connections alive (cmids.py): a connection's
  CM ID wrapper, with its own Python wrappers of the device context and PD (so that
  destroying it leaves the listener's alone), until the connection ends; then its CM ID
  (and queue pair), completion queues, channels and memory regions are destroyed. The
  wrapper pyverbs makes for each later event is disowned once its QP number is read; a
  rejected connect request's CM ID is destroyed at once.

pyverbs exists only where rdma-core's Python bindings are installed (Debian's
python3-pyverbs, in the RDMA guest): imported here alone, when an rdma port opens.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from pynvmf.rdma import cm
from pynvmf.rdma.cmids import CmIdLedger
from pynvmf.rdma.queue import RdmaConnection, receive_size
from pynvmf.target.limits import MAX_TRANSFER
from pynvmf.target.transport import Buffer

if TYPE_CHECKING:
    from pynvmf.target.port import Port
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.target import Target

log = logging.getLogger(__name__)

RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"
# The event channels' descriptors of the listeners open in this process.
_CHANNEL_FDS: set[int] = set()


def _rdma_cm_fd(exclude: set[int]) -> int:
    """The descriptor of the RDMA CM event channel just made (pyverbs 65 does not give
    it): the newest (highest) open on the RDMA CM's character device, other than the
    `exclude`d ones (those of the listeners made before)."""
    try:
        device = os.stat(RDMA_CM_DEVICE).st_rdev
    except OSError:
        device = -1
    seen = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int, reverse=True):
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            rdev = os.fstat(fd).st_rdev
        except OSError:
            continue  # the listing's own descriptor, closed since
        seen.append(f"{fd}:{link}")
        if fd not in exclude and (rdev == device or link.endswith("/rdma_cm")):
            return fd
    raise OSError(f"no descriptor on {RDMA_CM_DEVICE}: {seen}")


# What /proc/self/fd links a completion channel's descriptor to (an anonymous inode).
COMP_CHANNEL_LINK = "anon_inode:[infinibandevent]"


def _open_fds() -> dict[int, str]:
    """The process's open descriptors and what each links to (not the listing's own,
    closed by then: a descriptor opened next may take its number)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return fds


def _comp_channel(ctx: Any) -> tuple[Any, int]:
    """A new completion channel on `ctx` and its descriptor: `CompChannel.fd` where pyverbs
    has it (65; not 56, Debian 13's), else the one descriptor the channel opened."""
    from pyverbs.cq import CompChannel

    before = _open_fds()
    channel = CompChannel(ctx)
    fd = getattr(channel, "fd", None)
    if isinstance(fd, int):
        return channel, fd
    new = [fd for fd, link in _open_fds().items() if link == COMP_CHANNEL_LINK and fd not in before]
    if len(new) != 1:
        channel.close()
        raise OSError(f"the completion channel's descriptor is not known: {new}")
    return channel, new[0]


class RdmaListener:
    """An rdma port's RDMA CM listener (what a TCP port's asyncio Server is)."""

    def __init__(self, target: Target, port: Port) -> None:
        import pyverbs.cmid as c
        from pyverbs.librdmacm_enums import RAI_PASSIVE
        from pyverbs.librdmacm_enums import rdma_port_space as PS

        self.target = target
        self.port = port
        self.loop = asyncio.get_running_loop()
        self._c = c
        self.channel = c.CMEventChannel()
        self.fd = _rdma_cm_fd(_CHANNEL_FDS)
        _CHANNEL_FDS.add(self.fd)
        # Non-blocking: rdma_get_cm_event answers EAGAIN when no event is waiting.
        os.set_blocking(self.fd, False)
        self.listen_id = c.CMID(creator=self.channel, port_space=PS.RDMA_PS_TCP)
        info = c.AddrInfo(
            src=port.address,
            src_service=str(port.port),
            port_space=PS.RDMA_PS_TCP,
            flags=RAI_PASSIVE,
        )
        self.listen_id.bind_addr(info)
        self.listen_id.listen()
        # The listen_id of every wrapper made from an event: unbound, so the wrapper has
        # no device context or PD (the bound listen_id's would be shared with it, and a
        # wrapper's close() clears them).
        self.bare_id = c.CMID(creator=self.channel, port_space=PS.RDMA_PS_TCP)
        self.ledger: CmIdLedger[RdmaQueue] = CmIdLedger()
        self.closed = asyncio.Event()
        self.loop.add_reader(self.fd, self._events)

    def _events(self) -> None:
        """The event channel is readable: handle every event waiting, in order."""
        while True:
            try:
                event = self._c.CMEvent(self.channel)
            except Exception:  # EAGAIN: none left
                return
            try:
                self._dispatch(event)
            except Exception:
                log.exception("RDMA CM event %s on %s", event.event_str(), self.port)

    def _dispatch(self, event: Any) -> None:
        from pyverbs.librdmacm_enums import rdma_cm_event_type as EV

        ended = (
            EV.RDMA_CM_EVENT_DISCONNECTED,
            EV.RDMA_CM_EVENT_TIMEWAIT_EXIT,
            EV.RDMA_CM_EVENT_DEVICE_REMOVAL,
            EV.RDMA_CM_EVENT_REJECTED,
            EV.RDMA_CM_EVENT_CONNECT_ERROR,
            EV.RDMA_CM_EVENT_UNREACHABLE,
        )
        kind = event.event_type
        if kind == EV.RDMA_CM_EVENT_CONNECT_REQUEST:
            private = bytes(event.private_data)
            child = self._c.CMID(creator=event, listen_id=self.bare_id)
            event.ack_cm_event()
            self.ledger.learn(child, (self.channel, None, None))
            self._connect_request(child, private)
            return
        # The events of an accepted queue name it by its CM ID's QP number.
        wrapper = self._c.CMID(creator=event, listen_id=self.bare_id)
        queue = self.ledger.queue_of(wrapper.qpn)
        self.ledger.event_wrapper(wrapper, None if queue is None else queue.cmid)
        del wrapper
        event.ack_cm_event()
        if queue is None:
            return
        if kind == EV.RDMA_CM_EVENT_ESTABLISHED:
            queue.established()
        elif kind in ended:
            queue.disconnected()

    @property
    def held_cm_ids(self) -> int:
        """The CM IDs (and pyverbs wrappers of them) this listener holds besides its own:
        one per connection alive (cmids.CmIdLedger.held)."""
        return self.ledger.held

    def _connect_request(self, child: Any, private: bytes) -> None:
        limits = cm.QueueLimits(max_qid=cm.MAX_QID, io_queue_size=cm.IO_QUEUE_SIZE)
        controllers = {cntlid for s in self.target.subsystems.values() for cntlid in s.controllers}
        answer = cm.answer_connect(private, limits, controllers)
        if isinstance(answer, cm.ConnectReject):
            log.info("RDMA connect request on %s rejected: %s", self.port, answer.meaning)
            self._reject(child, answer)
            return
        request, accept = answer
        try:
            queue = RdmaQueue(self, child, request.hsqsize + 1)
        except Exception as exc:
            log.warning("RDMA queue on %s: no resources: %s", self.port, exc)
            self._reject(child, cm.ConnectReject(status=cm.RejectStatus.NO_RESOURCES))
            return
        self.ledger.accepted(queue.qpn, queue)
        param = self._c.ConnParam(resources=16, depth=16, data_len=196)
        param.set_private_data(accept.encode())
        try:
            child.accept(param)
        except Exception as exc:
            log.warning("RDMA accept on %s failed: %s", self.port, exc)
            queue.disconnected()  # no event will end it: release it now

    def _reject(self, child: Any, reject: cm.ConnectReject) -> None:
        """Reject a connect request and destroy its CM ID (and any queue pair made for
        it): nothing of a rejected request stays."""
        try:
            child.reject(reject.encode())
        finally:
            child.close()

    def forget(self, queue: RdmaQueue) -> None:
        self.ledger.ended(queue.qpn)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        _CHANNEL_FDS.discard(self.fd)
        for queue in self.ledger.queues():
            queue.conn.close("port closing")
            # The DISCONNECTED event would come on the channel no longer read.
            queue.disconnected()
        # The listener's own CM IDs, then their channel: the bound listen_id holds the
        # address and port until destroyed (a port re-opened on them, as blktests'
        # control script does per test, gets EADDRINUSE otherwise).
        for obj in (self.bare_id, self.listen_id, self.channel):
            try:
                obj.close()
            except Exception as exc:
                log.warning("RDMA listener on %s: closing %s: %s", self.port, obj, exc)
        self.closed.set()

    async def wait_closed(self) -> None:
        await self.closed.wait()


class RdmaQueue:
    """One accepted queue: the CM ID's queue pair, its two completion queues, and the
    buffers; the Verbs that RdmaConnection drives.

    pyverbs posts on a CM ID's queue pair without work request IDs, so completions are
    matched by order, which a reliable connection keeps: the receive queue's in the order
    the buffers were posted, the send queue's in the order its work requests were."""

    def __init__(self, listener: RdmaListener, cmid: Any, depth: int) -> None:
        import pyverbs.libibverbs_enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QPCap, QPInitAttr

        self._e = e
        self._MR = MR
        self.listener = listener
        self.cmid = cmid
        target = listener.target
        port = listener.port
        # This CM ID's own Python wrappers of the device context and PD (the same C objects
        # as every CM ID's on the device): its close() clears these, not the listener's.
        ctx = Context(cmid=cmid)
        self.pd = PD(cmid)
        self.closed = False
        self.released = False
        self.receives: list[Any] = []
        self._sent: deque[tuple[int, Any]] = deque()
        sends = depth * 3 + 4  # a completion, a WRITE and a READ per command at most
        self.send_channel, self.send_fd = _comp_channel(ctx)
        self.recv_channel, self.recv_fd = _comp_channel(ctx)
        self.send_cq = CQ(ctx, sends, None, self.send_channel, 0)
        self.recv_cq = CQ(ctx, depth, None, self.recv_channel, 0)
        cap = QPCap(max_send_wr=sends, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        cmid.create_qp(
            QPInitAttr(
                qp_type=e.ibv_qp_type.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq, cap=cap
            )
        )
        self.qpn = cmid.qpn
        in_capsule = port.transport.inline_data_size
        self.conn = RdmaConnection(self, in_capsule_size=in_capsule, max_transfer=MAX_TRANSFER)
        size = receive_size(in_capsule)
        access = e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
        self.receives = [MR(self.pd, size, access) for _ in range(depth)]
        # The slots posted, oldest first; the send queue's work (self._sent): (READ tag or
        # -1, MR).
        self._posted: deque[int] = deque()
        for slot in range(depth):
            self.post_receive(slot)
        loop = listener.loop
        for channel, fd, cq in (
            (self.send_channel, self.send_fd, self.send_cq),
            (self.recv_channel, self.recv_fd, self.recv_cq),
        ):
            cq.req_notify()
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._on_completions, channel, cq)
        from pynvmf.target.queue import TargetQueue

        self.queue: TargetQueue = TargetQueue(target, port, self.conn, port.address)

    def established(self) -> None:
        pass

    # -- Verbs (queue.py) -------------------------------------------------------------------

    def post_receive(self, slot: int) -> None:
        if self.released:
            return  # the CM ID is gone: nothing more goes out
        self.cmid.post_recv(self.receives[slot])
        self._posted.append(slot)

    def read(self, tag: int, length: int, address: int, key: int) -> None:
        if self.released:
            return
        e = self._e
        mr = self._MR(self.pd, max(length, 1), e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE)
        self._sent.append((tag, mr))
        self.cmid.post_read(mr, length, address, key, e.ibv_send_flags.IBV_SEND_SIGNALED)

    def write(self, data: Buffer, address: int, key: int) -> None:
        if self.released:
            return
        e = self._e
        n = len(data) if type(data) is not memoryview else data.nbytes
        mr = self._MR(self.pd, max(n, 1), e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE)
        mr.write(bytes(data), n)
        self._sent.append((-1, mr))
        self.cmid.post_write(mr, n, address, key, e.ibv_send_flags.IBV_SEND_SIGNALED)

    def send(self, message: bytes, invalidate_key: int | None) -> None:
        if self.released:
            return
        # pyverbs' CM ID posts a plain SEND only: a host that asked for invalidation
        # invalidates the key itself when the completion comes without (Linux's does).
        e = self._e
        mr = self._MR(self.pd, len(message), e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE)
        mr.write(message, len(message))
        self._sent.append((-1, mr))
        self.cmid.post_send(mr, e.ibv_send_flags.IBV_SEND_SIGNALED)

    def disconnect(self) -> None:
        if self.released:
            return
        try:
            self.cmid.disconnect()
        except Exception as exc:
            log.debug("RDMA disconnect: %s", exc)

    # -- completions ------------------------------------------------------------------------

    def _on_completions(self, channel: Any, cq: Any) -> None:
        try:
            try:
                channel.get_cq_event(cq)
            except Exception:  # EAGAIN: the wakeup was for an event already taken
                return
            cq.ack_events(1)
            cq.req_notify()
            while not self.closed:
                n, wcs = cq.poll(16)
                if n <= 0:
                    break
                for wc in wcs:
                    if cq is self.recv_cq:
                        self._received(wc)
                    else:
                        self._sent_done(wc)
        except Exception:
            log.exception("RDMA completions on %s", self.listener.port)
            self.conn.close("completion handling failed")

    def _received(self, wc: Any) -> None:
        slot = self._posted.popleft() if self._posted else -1
        if wc.status != self._e.ibv_wc_status.IBV_WC_SUCCESS or slot < 0:
            if not self.conn.closing:
                self.conn.receive_failed(self._status(wc))
            return
        message = memoryview(self.receives[slot].read(wc.byte_len, 0))
        self.conn.received(slot, message)

    def _status(self, wc: Any) -> str:
        """A failed completion's status, as libibverbs names it (ibv_wc_status_str)."""
        try:
            return f"{self._e.ibv_wc_status(wc.status).name} ({wc.status})"
        except (ValueError, TypeError, AttributeError):
            return f"status {wc.status}"

    def _sent_done(self, wc: Any) -> None:
        if not self._sent:
            return
        tag, mr = self._sent.popleft()
        ok = wc.status == self._e.ibv_wc_status.IBV_WC_SUCCESS
        if tag >= 0:
            self.conn.read_done(tag, bytearray(mr.read(mr.length, 0)) if ok else None)
        elif not ok and not self.conn.closing:
            self.conn.close(f"work request failed: {self._status(wc)}")
        mr.close()

    def disconnected(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.disconnect()  # the answer to the host's DREQ
        loop = self.listener.loop
        loop.remove_reader(self.send_fd)
        loop.remove_reader(self.recv_fd)
        conn = self.conn
        conn.disconnected()
        self.queue.connection_lost()
        self.listener.forget(self)
        self.release()
        log.info(
            "rdma queue %d on %s closed: %d commands, %d bytes in capsules,"
            " %d RDMA READs, %d RDMA WRITEs; the listener holds %d CM IDs; reason: %s",
            conn.qid,
            self.listener.port,
            conn.commands,
            conn.in_capsule_bytes,
            conn.rdma_reads,
            conn.rdma_writes,
            self.listener.held_cm_ids,
            conn.close_reason or "the host disconnected",
        )

    def release(self) -> None:
        """Destroy the CM ID (with its queue pair: first, as the completion queues it uses
        must outlive it), then the completion queues, their channels and the memory
        regions. Once; nothing of the connection stays."""
        if self.released:
            return
        self.released = True
        owned = [
            self.cmid,
            self.send_cq,
            self.recv_cq,
            self.send_channel,
            self.recv_channel,
            *self.receives,
            *(mr for _, mr in self._sent),
        ]
        self.receives = []
        self._sent.clear()
        for obj in owned:
            try:
                obj.close()
            except Exception as exc:  # one that fails leaves the others to close
                log.warning("RDMA queue on %s: closing %s: %s", self.listener.port, obj, exc)


async def listen(target: Target, port: Port) -> RdmaListener:
    """Open rdma port `port`."""
    listener = RdmaListener(target, port)
    log.info("listening on %s", port)
    return listener
