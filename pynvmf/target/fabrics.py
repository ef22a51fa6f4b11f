"""Fabrics commands: Connect (creates controllers and binds queues), Property Get/Set."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from pynvmf.auth.controller import ControllerAuth
from pynvmf.logs import about
from pynvmf.spec import command as C
from pynvmf.spec.auth import AUTHREQ_ATR
from pynvmf.spec.opcodes import FabricsType
from pynvmf.spec.status import DNR, Status
from pynvmf.target.controller import CAP, QUEUE_ENTRIES, Controller
from pynvmf.target.outcome import Outcome

if TYPE_CHECKING:
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

_IOSQES = 6
_IOCQES = 4


async def connect(queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    if req.length != C.CONNECT_DATA_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    data = req.data if req.data is not None else await queue.fetch_data(req)
    cmd = C.ConnectCommand.from_sqe(sqe)
    cdata = C.ConnectData.unpack(data)
    queue.named(cdata.hostnqn, cdata.subnqn)
    if cmd.recfmt != 0:
        return Status.CONNECT_INCOMPATIBLE_FORMAT | DNR, 0, None
    target = queue.target
    subsystem = target.find_subsystem(cdata.subnqn, queue.port)
    if subsystem is None:
        about(log, queue).info(
            "connect from %s to unknown subsystem %r", cdata.hostnqn, cdata.subnqn
        )
        return _invalid_data(C.CONNECT_DATA_OFFSET_SUBNQN)
    if not subsystem.host_allowed(cdata.hostnqn):
        about(log, queue).info("host %r is not allowed on %s", cdata.hostnqn, subsystem.nqn)
        result = C.connect_invalid_param_result(C.CONNECT_DATA_OFFSET_HOSTNQN, in_data=True)
        return Status.CONNECT_INVALID_HOST | DNR, result, None
    tls_psk = queue.tls_psk
    if tls_psk is not None and (
        tls_psk.hostnqn != cdata.hostnqn
        or (tls_psk.subnqn != subsystem.nqn and not subsystem.is_discovery)
    ):
        about(log, queue).info(
            "host %r connects to %s over TLS with the PSK of %r for %s: refused",
            cdata.hostnqn,
            subsystem.nqn,
            tls_psk.hostnqn,
            tls_psk.subnqn,
        )
        result = C.connect_invalid_param_result(C.CONNECT_DATA_OFFSET_HOSTNQN, in_data=True)
        return Status.CONNECT_INVALID_HOST | DNR, result, None
    if cmd.sqsize == 0 or cmd.sqsize >= QUEUE_ENTRIES:
        result = C.connect_invalid_param_result(C.CONNECT_SQE_OFFSET_SQSIZE, in_data=False)
        return Status.CONNECT_INVALID_PARAM | DNR, result, None
    if cmd.qid == 0:
        if cdata.cntlid != C.CNTLID_DYNAMIC:
            return _invalid_data(C.CONNECT_DATA_OFFSET_CNTLID)
        cntlid = subsystem.allocate_cntlid()
        if cntlid is None:
            return Status.CONNECT_CTRL_BUSY | DNR, 0, None
        ctrl = Controller(
            target, subsystem, cntlid, cdata.hostnqn, cdata.hostid, cmd.kato, queue.port
        )
        subsystem.controllers[cntlid] = ctrl
        about(log, queue).info(
            "controller %d of %s created for %s (kato %d ms)",
            cntlid,
            subsystem.nqn,
            cdata.hostnqn,
            cmd.kato,
        )
    else:
        # The controller is the one with this CNTLID in this subsystem, of this host NQN,
        # as nvmet and SPDK find it. The Host Identifier is not compared: both accept
        # another one here, and some hosts send it. The controller's stays the admin
        # queue's (reservations and Get Features Host Identifier answer with it).
        found = subsystem.controllers.get(cdata.cntlid)
        if found is None or found.destroyed:
            return _invalid_data(C.CONNECT_DATA_OFFSET_CNTLID)
        ctrl = found
        if cdata.hostnqn != ctrl.hostnqn:
            return _invalid_data(C.CONNECT_DATA_OFFSET_HOSTNQN)
        if ctrl.is_discovery or cmd.qid > ctrl.io_queues:
            result = C.connect_invalid_param_result(C.CONNECT_SQE_OFFSET_QID, in_data=False)
            return Status.CONNECT_INVALID_PARAM | DNR, result, None
        if not ctrl.admin_authenticated:
            # Its host has a key here and the admin queue has not authenticated: nothing
            # the controller has may be used, an I/O queue first.
            about(log, queue).info(
                "I/O queue %d for controller %d of %s whose admin queue did not authenticate",
                cmd.qid,
                ctrl.cntlid,
                subsystem.nqn,
            )
            return Status.AUTH_REQUIRED | DNR, 0, None
        if not ctrl.csts & C.CSTS_RDY:
            return Status.CMD_SEQ_ERROR | DNR, 0, None
        if cmd.qid in ctrl.queues:
            return Status.CMD_SEQ_ERROR | DNR, 0, None
    concatenated = tls_psk is not None and tls_psk.generated
    authreq = 0
    if not subsystem.is_discovery and cdata.hostnqn in subsystem.host_auth and not concatenated:
        # The host has a key here: this queue answers nothing but authentication (and
        # Property Get) until it has authenticated; AUTHREQ.ATR tells the host so. A queue
        # over TLS with a PSK an authentication generated (secure channel concatenation)
        # needs none: that PSK is the proof, and Linux authenticates no queue of it again.
        authreq = AUTHREQ_ATR
        queue.require_auth(
            ControllerAuth(
                functools.partial(subsystem.host_auth.get, cdata.hostnqn),
                cdata.hostnqn,
                subsystem.nqn,
                cmd.qid,
                ctrl.cntlid,
                tls_offered=queue.port.offers_tls,
                on_tls=tls_psk is not None,
            )
        )
    if cmd.qid == 0 and concatenated and not subsystem.is_discovery:
        assert tls_psk is not None
        ctrl.generated_psk = tls_psk
        target.generated_psks.take(tls_psk, ctrl)
    bind(queue, ctrl, cmd)
    about(log, queue).info(
        "queue %d of controller %d of %s connected for %s",
        cmd.qid,
        ctrl.cntlid,
        subsystem.nqn,
        cdata.hostnqn,
    )
    if cmd.qid == 0 and not authreq:
        # With authentication the keep-alive timer starts once the admin queue has
        # authenticated: a host cannot send Keep Alive before, and its DH computation may
        # take longer than KATO on a slow machine. The authentication deadline bounds it.
        ctrl.start_keep_alive()
    return Status.SUCCESS, ctrl.cntlid | authreq, None


def bind(queue: TargetQueue, ctrl: Controller, cmd: C.ConnectCommand) -> None:
    """Make `queue` queue `cmd.qid` of `ctrl`, as the validated Connect `cmd` asks (its
    size, SQ flow control): here, or in the worker process a connection was handed to."""
    queue.bind(ctrl, cmd.qid, cmd.sqsize + 1, bool(cmd.cattr & C.CATTR_DISABLE_SQ_FLOW))


# CC.CSS values CAP.CSS advertises: the NVM command set, or every I/O command set.
_SELECTABLE_CSS = (C.CC_CSS_NVM, C.CC_CSS_IOCS)


def _valid_configuration(ctrl: Controller, cc: int) -> bool:
    """Whether the controller can be enabled as `cc` asks (else CSTS.CFS, as nvmet does):
    4 KiB pages, round robin arbitration, a command set CAP.CSS lists, and (I/O
    controllers) 64-byte submission and 16-byte completion queue entries."""
    if (cc >> C.CC_MPS_SHIFT) & 0xF or (cc >> C.CC_AMS_SHIFT) & 0x7:
        return False
    if (cc >> C.CC_CSS_SHIFT) & 0x7 not in _SELECTABLE_CSS:
        return False
    if ctrl.is_discovery:
        return True
    iosqes = (cc >> C.CC_IOSQES_SHIFT) & 0xF
    iocqes = (cc >> C.CC_IOCQES_SHIFT) & 0xF
    return iosqes == _IOSQES and iocqes == _IOCQES


def _invalid_data(offset: int) -> Outcome:
    status = Status.CONNECT_INVALID_PARAM | DNR
    return status, C.connect_invalid_param_result(offset, in_data=True), None


async def execute(queue: TargetQueue, req: Request) -> Outcome:
    """A Fabrics command on a connected queue."""
    sqe = req.sqe
    fctype = sqe.fctype
    ctrl = queue.controller
    assert ctrl is not None
    if fctype == FabricsType.CONNECT:
        return Status.CMD_SEQ_ERROR | DNR, 0, None
    if queue.qid != 0:
        return Status.INVALID_OPCODE | DNR, 0, None
    if fctype == FabricsType.PROPERTY_GET:
        return property_get(ctrl, sqe.cdw10 & 0xFF, sqe.cdw11)
    if fctype == FabricsType.PROPERTY_SET:
        return await property_set(ctrl, sqe.cdw10 & 0xFF, sqe.cdw11, sqe.cdw12 | sqe.cdw13 << 32)
    return Status.INVALID_OPCODE | DNR, 0, None


def property_get(ctrl: Controller, attrib: int, offset: int) -> Outcome:
    if C.property_size(attrib) == 8:
        if offset == C.PROP_CAP:
            return Status.SUCCESS, CAP, None
        return Status.INVALID_FIELD | DNR, 0, None
    values = {
        C.PROP_VS: ctrl.subsystem.version,
        C.PROP_CC: ctrl.cc,
        C.PROP_CSTS: ctrl.csts,
        C.PROP_NSSR: 0,
        C.PROP_CAP: CAP & 0xFFFFFFFF,
        C.PROP_CAP + 4: CAP >> 32,
    }
    if offset not in values:
        return Status.INVALID_FIELD | DNR, 0, None
    return Status.SUCCESS, values[offset], None


async def property_set(ctrl: Controller, attrib: int, offset: int, value: int) -> Outcome:
    if offset != C.PROP_CC or C.property_size(attrib) != 4:
        return Status.INVALID_FIELD | DNR, 0, None
    old, new = ctrl.cc, value & 0xFFFFFFFF
    ctrl.cc = new
    if new & C.CC_EN and not old & C.CC_EN:
        ctrl.csts = C.CSTS_RDY if _valid_configuration(ctrl, new) else C.CSTS_CFS
    elif old & C.CC_EN and not new & C.CC_EN:
        ctrl.csts &= ~(C.CSTS_RDY | C.CSTS_CFS)
    if new & C.CC_SHN_MASK and not old & C.CC_SHN_MASK:
        # A copy: the target may remove a namespace while this waits for a flush.
        for ns in list(ctrl.namespaces.values()):
            try:
                await ns.device.flush()
            except OSError as exc:
                # Storage that cannot be flushed (gone, fenced) must not fail the host's
                # shutdown: the controller's side of it is done, and the error is logged.
                log.error("flush at shutdown of nsid %d failed: %s", ns.nsid, exc)
        ctrl.csts = (ctrl.csts & ~C.CSTS_SHST_MASK) | C.CSTS_SHST_COMPLETE
    elif not new & C.CC_SHN_MASK:
        ctrl.csts &= ~C.CSTS_SHST_MASK
    return Status.SUCCESS, 0, None
