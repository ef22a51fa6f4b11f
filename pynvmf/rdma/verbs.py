"""The NVMe/RDMA target's verbs adapter over rdma-core's pyverbs: a listener and its queues.

Thin: every protocol decision is the sans-I/O layer's (cm.py for the connect request,
queue.py for commands and data); this module moves bytes between them and the verbs.

- The RDMA CM listener uses an event channel (private data arrives only there, docs/rdma.md),
  made non-blocking and on the event loop (`loop.add_reader`). pyverbs 65 gives no file
  descriptor for a CM event channel: it is the one the channel opened on
  /dev/infiniband/rdma_cm (and a thread blocked in `CMEvent(channel)` would hold the GIL:
  pyverbs does not release it there).
- Each queue has a queue pair of the adapter's own (pyverbs' QP, given to the RDMA CM by
  number in the accept: work requests with IDs, buffers by offset, SEND with Invalidate),
  with a send and a receive completion queue whose completion channels' descriptors are on
  the loop (`loop.add_reader`; pyverbs 56, Debian 13's, has no `CompChannel.fd`: the
  descriptor is the one the channel opened). Memory is registered once per queue
  (buffers.py); the receive buffers (64 bytes + the in-capsule size each) are posted
  before the accept.
- After the host's disconnect, the DISCONNECTED event is answered with `disconnect()`, or the
  host waits for the CM's timeout.
- What the listener holds is bounded by the connections alive (cmids.py): a connection's
  CM ID wrapper, with its own Python wrappers of the device context and PD (so that
  destroying it leaves the listener's alone), until the connection ends; then its CM ID
  and queue pair, completion queues, channels and memory regions are destroyed. An
  event's connection is named by its CM ID's pointer (cmids.CmIdLedger.key_of: the queue
  pair is not the CM ID's, so it has no number there); the wrapper pyverbs makes for each
  later event is disowned once that is read; a rejected connect request's CM ID is
  destroyed at once.

pyverbs exists only where rdma-core's Python bindings are installed (Debian's
python3-pyverbs, in the RDMA guest): imported here alone, when an rdma port opens.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from pynvmf.rdma import cm
from pynvmf.rdma.buffers import BufferPool, OrderedWork, Slot, data_classes
from pynvmf.rdma.channels import comp_channel
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
        queue = self.ledger.queue_of(self.ledger.key_of(wrapper))
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
        key = self.ledger.key_of(child)
        if key is None:
            # Without the CM ID's pointer no later event (DISCONNECTED...) could be told
            # apart: the queue could never be released.
            log.error(
                "RDMA connect request on %s: pyverbs' CMID layout is not the one known"
                " (docs/rdma.md): refused",
                self.port,
            )
            self._reject(child, cm.ConnectReject(status=cm.RejectStatus.NO_RESOURCES))
            return
        try:
            queue = RdmaQueue(self, child, request.hsqsize + 1, key)
        except Exception as exc:
            log.warning("RDMA queue on %s: no resources: %s", self.port, exc)
            self._reject(child, cm.ConnectReject(status=cm.RejectStatus.NO_RESOURCES))
            return
        self.ledger.accepted(key, queue)
        try:
            child.accept(queue.accept_param(accept.encode()))
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
        self.ledger.ended(queue.key)

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


# RDMA READs the controller accepts from the host at once (none are asked for) and issues
# to it at once (each queue's RDMA READs of write data): the accept's responder resources
# and initiator depth, and the queue pair's max_dest_rd_atomic and max_rd_atomic.
RESPONDER_RESOURCES = 16
INITIATOR_DEPTH = 16
# A completion buffer: a CQE (16 bytes), in a slot of its own.
CQE_SLOT = 16

_READ, _WRITE, _SEND = 0, 1, 2


class _Work:
    """One send queue work request the queue asked for (posted, or waiting for a buffer)."""

    __slots__ = ("address", "data", "key", "kind", "length", "tag")

    def __init__(
        self, kind: int, tag: int, length: int, data: Buffer | None, address: int, key: int
    ) -> None:
        self.kind = kind
        self.tag = tag  # a READ's CID; a SEND's key to invalidate (-1: none)
        self.length = length
        self.data = data
        self.address = address
        self.key = key


def _region_view(mr: Any) -> memoryview:
    """A memoryview of registered memory region ``mr``'s bytes (valid while it is)."""
    import ctypes

    return memoryview((ctypes.c_char * mr.length).from_address(mr.buf)).cast("B")


class RdmaQueue:
    """One accepted queue: its queue pair, two completion queues, and registered memory;
    the Verbs that RdmaConnection drives.

    The queue pair is the adapter's own (pyverbs' ``QP`` on the CM ID's PD), given to the
    RDMA CM by number in the accept and moved through INIT, RTR and RTS with the CM's
    attributes (``CMID.init_qp_attr``), as librdmacm does for its own: pyverbs posts on a
    CM ID's queue pair only plain SENDs, READs and WRITEs of a whole MR, without work
    request IDs; on a QP of its own it posts work requests with IDs, SGEs that name an
    offset in a region, and SEND with Invalidate. Memory is registered once per queue
    (buffers.py): the receive buffers, the data buffers in size classes, a completion
    buffer per send queue entry; released once with the queue."""

    def __init__(self, listener: RdmaListener, cmid: Any, depth: int, key: int) -> None:
        import pyverbs.libibverbs_enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPCap, QPInitAttr
        from pyverbs.wr import SGE, RecvWR, SendWR

        self._e = e
        self._SGE = SGE
        self._SendWR = SendWR
        self.listener = listener
        self.cmid = cmid
        self.key = key
        target = listener.target
        port = listener.port
        # This CM ID's own Python wrappers of the device context and PD (the same C objects
        # as every CM ID's on the device): its close() clears these, not the listener's.
        ctx = Context(cmid=cmid)
        self.pd = PD(cmid)
        self.closed = False
        self.released = False
        self._owned: list[Any] = []  # what release() closes, in order
        sends = depth * 3 + 4  # a completion, a WRITE and a READ per command at most
        self.send_channel, self.send_fd = comp_channel(ctx)
        self.recv_channel, self.recv_fd = comp_channel(ctx)
        self.send_cq = CQ(ctx, sends, None, self.send_channel, 0)
        self.recv_cq = CQ(ctx, depth, None, self.recv_channel, 0)
        cap = QPCap(max_send_wr=sends, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(
            qp_type=e.ibv_qp_type.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq, cap=cap
        )
        self.qp = QP(self.pd, init)
        # The queue pair before the CM ID and the completion queues it uses.
        self._owned = [self.qp, cmid, self.send_cq, self.recv_cq]
        self._owned += [self.send_channel, self.recv_channel]
        self.qpn = self.qp.qp_num
        in_capsule = port.transport.inline_data_size
        self.conn = RdmaConnection(
            self,
            in_capsule_size=in_capsule,
            max_transfer=MAX_TRANSFER,
            tally=target.rdma_counters.port(str(port)),
        )
        access = e.ibv_access_flags.IBV_ACCESS_LOCAL_WRITE
        # Receive buffers: one region, a slot per entry.
        receives = BufferPool([(receive_size(in_capsule), depth)])
        self.recv_mr = MR(self.pd, receives.size, access)
        self._owned.append(self.recv_mr)
        self._recv_view = _region_view(self.recv_mr)
        base, lkey = self.recv_mr.buf, self.recv_mr.lkey
        self._recv_slots = receives.slots
        self._recv_wrs = [
            RecvWR(wr_id=s.index, num_sge=1, sg=[SGE(base + s.offset, s.size, lkey)])
            for s in receives.slots
        ]
        # Data buffers (RDMA READ into, RDMA WRITE from) and completion buffers.
        self.work: OrderedWork[_Work] = OrderedWork(
            BufferPool(data_classes(depth, MAX_TRANSFER)), sends
        )
        self.data_mr = MR(self.pd, self.work.pool.size, access)
        self._owned.append(self.data_mr)
        self._data_view = _region_view(self.data_mr)
        self.cqes = BufferPool([(CQE_SLOT, sends)])
        self.cqe_mr = MR(self.pd, self.cqes.size, access)
        self._owned.append(self.cqe_mr)
        self._cqe_view = _region_view(self.cqe_mr)
        # Posted send queue work by work request ID: (READ tag or -1, length, data slot,
        # completion slot).
        self._posted: dict[int, tuple[int, int, Slot | None, Slot | None]] = {}
        self._next_wr = 0
        self.sends_with_invalidate = 0
        self._connect_qp()
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

    def _connect_qp(self) -> None:
        """INIT, RTR and RTS with the attributes the RDMA CM gives for this connection
        (before the accept, as librdmacm's rdma_accept does for a QP of its own), with
        the READ depths the accept announces."""
        states = self._e.ibv_qp_state
        for state in (states.IBV_QPS_INIT, states.IBV_QPS_RTR, states.IBV_QPS_RTS):
            attr, mask = self.cmid.init_qp_attr(state)
            if state == states.IBV_QPS_RTR:
                attr.max_dest_rd_atomic = RESPONDER_RESOURCES
            elif state == states.IBV_QPS_RTS:
                attr.max_rd_atomic = INITIATOR_DEPTH
            self.qp.modify(attr, mask)

    def accept_param(self, private: bytes) -> Any:
        """The accept's parameters: this queue pair's number, the READ depths, the
        NVMe/RDMA private data."""
        c = self.listener._c
        param = c.ConnParam(
            resources=RESPONDER_RESOURCES, depth=INITIATOR_DEPTH, qp_num=self.qpn, data_len=196
        )
        param.set_private_data(private)
        return param

    def established(self) -> None:
        pass

    # -- Verbs (queue.py) -------------------------------------------------------------------

    def post_receive(self, slot: int) -> None:
        if self.released:
            return  # the queue pair is gone: nothing more goes out
        self.qp.post_recv(self._recv_wrs[slot])

    def read(self, tag: int, length: int, address: int, key: int) -> None:
        self._ask(_Work(_READ, tag, length, None, address, key), max(length, 1))

    def write(self, data: Buffer, address: int, key: int) -> None:
        n = len(data) if type(data) is not memoryview else data.nbytes
        self._ask(_Work(_WRITE, -1, n, data, address, key), max(n, 1))

    def send(self, message: bytes, invalidate_key: int | None) -> None:
        tag = -1 if invalidate_key is None else invalidate_key
        self._ask(_Work(_SEND, tag, len(message), message, 0, 0), 0)

    def _ask(self, work: _Work, need: int) -> None:
        if self.released:
            return
        try:
            ready = self.work.push(work, need)
        except ValueError as exc:  # larger than any buffer: the queue checked the length
            self.conn.close(f"no buffer: {exc}")
            return
        self._post(ready)
        if work.data is not None and all(w is not work for w, _ in ready):
            # Waiting: the caller's data is its own again once this returns.
            work.data = bytes(work.data)

    def _post(self, ready: list[tuple[_Work, Slot | None]]) -> None:
        e = self._e
        SGE, SendWR = self._SGE, self._SendWR
        for work, slot in ready:
            if self.released or self.conn.closing:
                return  # nothing more goes out (what waited is dropped with the queue)
            wr_id = self._next_wr
            self._next_wr = wr_id + 1
            n = work.length
            if work.kind == _SEND:
                cqe = self.cqes.take(n)
                if cqe is None:  # as many as send queue entries: never
                    self.conn.close("no completion buffer")
                    return
                assert work.data is not None
                self._cqe_view[cqe.offset : cqe.offset + n] = work.data
                sge = SGE(self.cqe_mr.buf + cqe.offset, n, self.cqe_mr.lkey)
                if work.tag >= 0:
                    # SEND with Invalidate: the host's key is invalidated as the CQE
                    # arrives, and its driver skips its own local invalidation.
                    wr = SendWR(
                        wr_id=wr_id,
                        opcode=e.ibv_wr_opcode.IBV_WR_SEND_WITH_INV,
                        num_sge=1,
                        sg=[sge],
                        # invalidate_rkey shares imm_data's place in ibv_send_wr.
                        imm_data=work.tag,
                    )
                    self.sends_with_invalidate += 1
                else:
                    wr = SendWR(
                        wr_id=wr_id, opcode=e.ibv_wr_opcode.IBV_WR_SEND, num_sge=1, sg=[sge]
                    )
                self._posted[wr_id] = (-1, n, None, cqe)
            else:
                assert slot is not None
                sge = SGE(self.data_mr.buf + slot.offset, n, self.data_mr.lkey)
                if work.kind == _WRITE:
                    data = work.data
                    assert data is not None
                    if type(data) is memoryview and data.format != "B":
                        data = data.cast("B")
                    self._data_view[slot.offset : slot.offset + n] = data
                    opcode = e.ibv_wr_opcode.IBV_WR_RDMA_WRITE
                    self._posted[wr_id] = (-1, n, slot, None)
                else:
                    opcode = e.ibv_wr_opcode.IBV_WR_RDMA_READ
                    self._posted[wr_id] = (work.tag, n, slot, None)
                wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge])
                wr.set_wr_rdma(work.key, work.address)
            work.data = None
            self.qp.post_send(wr)

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
        status = self._e.ibv_wc_status
        if wc.status != status.IBV_WC_SUCCESS:
            if wc.status == status.IBV_WC_WR_FLUSH_ERR and self._posted:
                # The queue pair went into error for a reason a send queue completion
                # names (an RDMA READ the host refused), which may come after these: every
                # work request posted there completes, in error, and closes the queue.
                return
            if not self.conn.closing:
                self.conn.receive_failed(self._status(wc))
            return
        slot = wc.wr_id
        offset = self._recv_slots[slot].offset
        # Lent, not copied: the queue posts the buffer again once the NVMe layer has
        # taken what it keeps (borrow_capsule_data's rule).
        self.conn.received(slot, self._recv_view[offset : offset + wc.byte_len])

    def _status(self, wc: Any) -> str:
        """A failed completion's status, as libibverbs names it (ibv_wc_status_str)."""
        try:
            return f"{self._e.ibv_wc_status(wc.status).name} ({wc.status})"
        except (ValueError, TypeError, AttributeError):
            return f"status {wc.status}"

    def _sent_done(self, wc: Any) -> None:
        posted = self._posted.pop(wc.wr_id, None)
        if posted is None:
            return
        tag, length, slot, cqe = posted
        ok = wc.status == self._e.ibv_wc_status.IBV_WC_SUCCESS
        if cqe is not None:
            self.cqes.give(cqe)
        if not ok:
            # The queue pair is in error: the queue closes, and nothing more is posted.
            if tag >= 0:
                self.conn.read_done(tag, None)
            elif not self.conn.closing:
                self.conn.close(f"work request failed: {self._status(wc)}")
            self._post(self.work.done(slot))
            return
        data = None
        if tag >= 0 and slot is not None:
            # The READ's bytes, for the command's length only; the slot is free after.
            data = bytearray(self._data_view[slot.offset : slot.offset + length])
        # What waited goes out before anything the callback below asks for.
        self._post(self.work.done(slot))
        if tag >= 0:
            self.conn.read_done(tag, data)

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
            " %d RDMA READs, %d RDMA WRITEs, %d sends with invalidate, %d waits for a"
            " data buffer; the listener holds %d CM IDs; reason: %s",
            conn.qid,
            self.listener.port,
            conn.commands,
            conn.in_capsule_bytes,
            conn.rdma_reads,
            conn.rdma_writes,
            self.sends_with_invalidate,
            self.work.waits,
            self.listener.held_cm_ids,
            conn.close_reason or "the host disconnected",
        )

    def release(self) -> None:
        """Destroy the queue pair (first: it uses the completion queues), the CM ID, the
        completion queues, their channels and the memory regions. Once; nothing of the
        connection stays."""
        if self.released:
            return
        self.released = True
        self.work.clear()
        self._posted.clear()
        self._recv_wrs = []
        owned, self._owned = self._owned, []
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
