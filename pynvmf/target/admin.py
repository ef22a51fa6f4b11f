"""Admin commands of I/O and discovery controllers."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from pynvmf import __version__
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.command import HOST_BEHAVIOR_SIZE, host_behavior_cdfe
from pynvmf.spec.opcodes import NSID_ALL, AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.controller import (
    AERL,
    ERROR_LOG_ENTRIES,
    KAS_100MS,
    QUEUE_ENTRIES,
    VERSION,
    Controller,
)
from pynvmf.target.limits import MAX_TRANSFER, MDTS, OCFS, copy_limits, reported_nn

if TYPE_CHECKING:
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Namespace
    from pynvmf.tcp.target import Request

log = logging.getLogger(__name__)

# (status, result, data to send to the host or None)
Outcome = tuple[int, int, bytes | bytearray | None]
PENDING = None  # an Asynchronous Event Request completes later, not now

FIRMWARE = __version__[:8]

_SUPPORTED_ADMIN = (
    AdminOpcode.GET_LOG_PAGE,
    AdminOpcode.IDENTIFY,
    AdminOpcode.ABORT,
    AdminOpcode.SET_FEATURES,
    AdminOpcode.GET_FEATURES,
    AdminOpcode.ASYNC_EVENT_REQUEST,
    AdminOpcode.KEEP_ALIVE,
    AdminOpcode.FABRICS,
)
_LBA_CHANGING_IO = (
    IoOpcode.WRITE,
    IoOpcode.WRITE_ZEROES,
    IoOpcode.DATASET_MANAGEMENT,
    IoOpcode.COPY,
)
_SUPPORTED_IO = (IoOpcode.FLUSH, IoOpcode.READ, *_LBA_CHANGING_IO)
# Optional asynchronous events a host may enable with Set Features (Async Event Config).
_AEN_SUPPORTED_IO = I.Oaes.NS_ATTR
_AEN_SUPPORTED_DISCOVERY = I.Oaes.DISCOVERY_CHANGE


async def execute(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome | None:
    sqe = req.sqe
    opcode = sqe.opcode
    if ctrl.is_discovery and opcode not in _DISCOVERY_ADMIN:
        return Status.INVALID_OPCODE | DNR, 0, None
    if opcode == AdminOpcode.IDENTIFY:
        return identify(ctrl, queue, req)
    if opcode == AdminOpcode.GET_LOG_PAGE:
        return get_log_page(ctrl, queue, req)
    if opcode == AdminOpcode.KEEP_ALIVE:
        return Status.SUCCESS, 0, None
    if opcode == AdminOpcode.GET_FEATURES:
        return get_features(ctrl, req)
    if opcode == AdminOpcode.SET_FEATURES:
        return await set_features(ctrl, queue, req)
    if opcode == AdminOpcode.ASYNC_EVENT_REQUEST:
        if len(ctrl.aer) > AERL:
            return Status.ASYNC_EVENT_LIMIT | DNR, 0, None
        ctrl.aer.append((queue, req))
        return PENDING
    if opcode == AdminOpcode.ABORT:
        # Commands complete as soon as they can; report "not aborted" (DW0 bit 0).
        return Status.SUCCESS, 1, None
    return Status.INVALID_OPCODE | DNR, 0, None


_DISCOVERY_ADMIN = (
    AdminOpcode.IDENTIFY,
    AdminOpcode.GET_LOG_PAGE,
    AdminOpcode.KEEP_ALIVE,
    AdminOpcode.GET_FEATURES,
    AdminOpcode.SET_FEATURES,
    AdminOpcode.ASYNC_EVENT_REQUEST,
)


# -- Identify ------------------------------------------------------------------------


def identify(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    cns = sqe.cdw10 & 0xFF
    csi = sqe.cdw11 >> 24
    nsid = sqe.nsid
    if req.length < I.IDENTIFY_DATA_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    if cns == I.Cns.CTRL:
        return Status.SUCCESS, 0, identify_controller(ctrl, queue).pack()
    if ctrl.is_discovery:
        return Status.INVALID_FIELD | DNR, 0, None
    namespaces = ctrl.subsystem.namespaces
    if cns == I.Cns.NS:
        if nsid in (0, NSID_ALL):
            return Status.INVALID_NS | DNR, 0, None
        ns = namespaces.get(nsid)
        if ns is None:
            return Status.SUCCESS, 0, bytes(I.IDENTIFY_DATA_SIZE)  # inactive NSID
        return Status.SUCCESS, 0, identify_namespace(ns).pack()
    if cns == I.Cns.NS_ACTIVE_LIST:
        if nsid >= 0xFFFFFFFE:
            return Status.INVALID_NS | DNR, 0, None
        return Status.SUCCESS, 0, I.NsIdList.active(namespaces, nsid).pack()
    if cns == I.Cns.NS_DESC_LIST:
        ns = namespaces.get(nsid)
        if ns is None:
            return Status.INVALID_NS | DNR, 0, None
        descriptors = I.NsIdDescriptorList(
            [
                I.NsIdDescriptor.eui64(ns.eui64),
                I.NsIdDescriptor.nguid(ns.nguid),
                I.NsIdDescriptor.uuid(ns.uuid.bytes),
                I.NsIdDescriptor.csi(I.Csi.NVM),
            ]
        )
        return Status.SUCCESS, 0, descriptors.pack()
    if cns in (I.Cns.CS_NS, I.Cns.CS_CTRL):
        if csi != I.Csi.NVM:
            return Status.INVALID_FIELD | DNR, 0, None
        if cns == I.Cns.CS_NS and nsid not in namespaces:
            return Status.INVALID_NS | DNR, 0, None
        # The NVM command set's specific structures: every limit 0 means "not reported".
        return Status.SUCCESS, 0, bytes(I.IDENTIFY_DATA_SIZE)
    return Status.INVALID_FIELD | DNR, 0, None


def identify_controller(ctrl: Controller, queue: TargetQueue) -> I.IdentifyController:
    subsystem = ctrl.subsystem
    inline = queue.port.transport.inline_data_size
    common = dict(
        sn=subsystem.serial[:20],
        mn=subsystem.model[:40],
        fr=FIRMWARE,
        cntlid=ctrl.cntlid,
        ver=VERSION,
        maxcmd=QUEUE_ENTRIES,
        kas=KAS_100MS,
        sgls=I.Sgls.SUPPORTED | (I.Sgls.OFFSET if inline else 0),
        subnqn=subsystem.nqn,
        ioccsz=(64 + inline) // 16,
        iorcsz=1,
        icdoff=0,
        msdbd=1,
        aerl=AERL,
        sqes=I.SQES_NVM,
        cqes=I.CQES_NVM,
        elpe=ERROR_LOG_ENTRIES - 1,
    )
    if ctrl.is_discovery:
        return I.IdentifyController(
            cntrltype=I.CtrlType.DISCOVERY,
            lpa=I.Lpa.EXTENDED_DATA,
            oaes=_AEN_SUPPORTED_DISCOVERY,
            **common,
        )
    return I.IdentifyController(
        cntrltype=I.CtrlType.IO,
        rab=6,
        cmic=I.Cmic.MULTI_CTRL,
        mdts=MDTS,
        oaes=_AEN_SUPPORTED_IO,
        ctratt=_CTRATT,
        acl=3,
        frmw=I.frmw_slots(1) | 1,
        lpa=I.Lpa.CMD_EFFECTS | I.Lpa.EXTENDED_DATA,
        wctemp=343,
        cctemp=358,
        nn=reported_nn(subsystem),
        oncs=I.Oncs.DSM | I.Oncs.WRITE_ZEROES | I.Oncs.COPY,
        ocfs=OCFS,
        vwc=I.Vwc.PRESENT | I.Vwc.FLUSH_BROADCAST_SUPPORTED,
        **common,
    )


_CTRATT = I.Ctratt.HOST_ID_128 | I.Ctratt.TBKAS


def identify_namespace(ns: Namespace) -> I.IdentifyNamespace:
    caps = ns.device.capabilities
    limits = copy_limits(caps.block_size)
    dlfeat = I.Dlfeat.WRITE_ZEROES_DEALLOC
    if caps.deallocated_reads_zero:
        dlfeat |= I.Dlfeat.READ_ZEROES
    return I.IdentifyNamespace(
        nsze=caps.num_blocks,
        ncap=caps.num_blocks,
        nuse=caps.num_blocks,
        nsfeat=I.NsFeat.THIN if caps.deallocate else 0,
        flbas=0,
        nmic=I.NMIC_SHARED,
        dlfeat=dlfeat,
        nvmcap=caps.size,
        mssrl=limits.max_range_blocks,
        mcl=limits.max_blocks,
        msrc=limits.max_ranges - 1,
        nguid=ns.nguid,
        eui64=ns.eui64,
        lbaf=[I.LbaFormat(ms=0, lbads=int(math.log2(caps.block_size)), rp=0)],
    )


# -- Features -----------------------------------------------------------------------------


def get_features(ctrl: Controller, req: Request) -> Outcome:
    sqe = req.sqe
    fid = sqe.cdw10 & 0xFF
    sel = (sqe.cdw10 >> 8) & 0x7
    if sel == 3:
        # Supported capabilities: every feature we know is changeable, none saveable.
        if fid in ctrl.features or fid in _DYNAMIC_FEATURES:
            return Status.SUCCESS, 0x4, None
        return Status.INVALID_FIELD | DNR, 0, None
    if fid == FeatureId.NUM_QUEUES:
        n = ctrl.io_queues - 1
        return Status.SUCCESS, n | n << 16, None
    if fid == FeatureId.KATO:
        return Status.SUCCESS, ctrl.kato_ms, None
    if fid == FeatureId.ASYNC_EVENT:
        return Status.SUCCESS, ctrl.aen_config, None
    if fid == FeatureId.VOLATILE_WC:
        return Status.SUCCESS, int(ctrl.volatile_write_cache), None
    if fid == FeatureId.IRQ_CONFIG:
        return Status.SUCCESS, sqe.cdw11 & 0xFFFF, None
    if fid == FeatureId.HOST_ID:
        if not sqe.cdw11 & 1:
            return Status.INVALID_FIELD | DNR, 0, None
        if req.length < len(ctrl.hostid):
            return Status.SGL_INVALID_DATA | DNR, 0, None
        return Status.SUCCESS, 0, ctrl.hostid
    if ctrl.is_discovery:
        return Status.INVALID_FIELD | DNR, 0, None
    if fid == FeatureId.HOST_BEHAVIOR:
        return _get_host_behavior(ctrl, req, sel)
    if fid in ctrl.features:
        return Status.SUCCESS, ctrl.features[fid], None
    return Status.INVALID_FIELD | DNR, 0, None


def _get_host_behavior(ctrl: Controller, req: Request, sel: int) -> Outcome:
    if req.length < HOST_BEHAVIOR_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    if sel:
        # Default and saved values (the feature is not saveable): all zeros.
        return Status.SUCCESS, 0, bytes(HOST_BEHAVIOR_SIZE)
    return Status.SUCCESS, 0, ctrl.host_behavior


_DYNAMIC_FEATURES = (
    FeatureId.NUM_QUEUES,
    FeatureId.KATO,
    FeatureId.ASYNC_EVENT,
    FeatureId.VOLATILE_WC,
    FeatureId.IRQ_CONFIG,
    FeatureId.HOST_BEHAVIOR,
)


async def set_features(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    fid = sqe.cdw10 & 0xFF
    save = sqe.cdw10 >> 31
    value = sqe.cdw11
    if save:
        return Status.FEATURE_NOT_SAVEABLE | DNR, 0, None
    if fid == FeatureId.KATO:
        ctrl.kato_ms = value
        ctrl.start_keep_alive()
        return Status.SUCCESS, 0, None
    if fid == FeatureId.ASYNC_EVENT:
        supported = _AEN_SUPPORTED_DISCOVERY if ctrl.is_discovery else _AEN_SUPPORTED_IO
        ctrl.aen_config = value & supported
        return Status.SUCCESS, ctrl.aen_config, None
    if ctrl.is_discovery:
        return Status.INVALID_FIELD | DNR, 0, None
    if fid == FeatureId.NUM_QUEUES:
        nsqr, ncqr = value & 0xFFFF, value >> 16
        if nsqr == 0xFFFF or ncqr == 0xFFFF:
            return Status.INVALID_FIELD | DNR, 0, None
        ctrl.io_queues = min(max(nsqr, ncqr) + 1, ctrl.io_queues)
        n = ctrl.io_queues - 1
        return Status.SUCCESS, n | n << 16, None
    if fid == FeatureId.VOLATILE_WC:
        ctrl.volatile_write_cache = bool(value & 1)
        return Status.SUCCESS, 0, None
    if fid == FeatureId.POWER_MGMT:
        if value & 0x1F:
            return Status.INVALID_FIELD | DNR, 0, None
        ctrl.features[fid] = value
        return Status.SUCCESS, 0, None
    if fid == FeatureId.HOST_ID:
        # Fabrics hosts give their identifier in Connect; it cannot change afterwards.
        return Status.CMD_SEQ_ERROR | DNR, 0, None
    if fid == FeatureId.HOST_BEHAVIOR:
        return await _set_host_behavior(ctrl, queue, req)
    if fid in ctrl.features:
        ctrl.features[fid] = value
        return Status.SUCCESS, 0, None
    if fid == FeatureId.IRQ_CONFIG:
        return Status.SUCCESS, 0, None
    return Status.INVALID_FIELD | DNR, 0, None


async def _set_host_behavior(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    # Exactly the structure, as for every other command with data: a longer SGL would
    # have the target fetch bytes it then ignores.
    if req.length != HOST_BEHAVIOR_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    data = req.data if req.data is not None else await queue.fetch_data(req)
    # A host may only enable descriptor formats this controller has (OCFS); what it does
    # enable decides which formats Copy accepts (TP 4130).
    if host_behavior_cdfe(data) & ~OCFS:
        return Status.INVALID_FIELD | DNR, 0, None
    ctrl.host_behavior = bytes(data)
    return Status.SUCCESS, 0, None


# -- Log pages ----------------------------------------------------------------------------


def get_log_page(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    lid = sqe.cdw10 & 0xFF
    numd = ((sqe.cdw10 >> 16) | (sqe.cdw11 & 0xFFFF) << 16) + 1
    offset = sqe.cdw12 | sqe.cdw13 << 32
    length = numd * 4
    if length > MAX_TRANSFER:
        return Status.INVALID_FIELD | DNR, 0, None
    if req.length < length:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    if offset & 3:
        return Status.INVALID_FIELD | DNR, 0, None
    page = _log_page(ctrl, queue, lid)
    if page is None:
        return Status.INVALID_FIELD | DNR, 0, None
    if offset > len(page):
        return Status.INVALID_FIELD | DNR, 0, None
    return Status.SUCCESS, 0, L.log_window(page, offset, length)


def _log_page(ctrl: Controller, queue: TargetQueue, lid: int) -> bytes | None:
    if ctrl.is_discovery:
        if lid == L.LogPageId.DISCOVERY:
            return ctrl.target.discovery_log(ctrl.hostnqn, queue)
        return None
    if lid == L.LogPageId.ERROR:
        return L.ErrorLog(list(ctrl.errors), slots=ERROR_LOG_ENTRIES).pack()
    if lid == L.LogPageId.SMART:
        stats = ctrl.subsystem.stats
        hours = int((time.monotonic() - ctrl.target.started) // 3600)
        return L.SmartLog(
            composite_temp=313,
            avail_spare=100,
            spare_thresh=10,
            data_units_read=-(-stats.read_bytes // 512_000),
            data_units_written=-(-stats.write_bytes // 512_000),
            host_read_cmds=stats.read_cmds,
            host_write_cmds=stats.write_cmds,
            power_cycles=1,
            power_on_hours=hours,
            num_err_log_entries=ctrl.error_count,
        ).pack()
    if lid == L.LogPageId.FW_SLOT:
        return L.FwSlotLog(afi=1, frs=[FIRMWARE] + [""] * 6).pack()
    if lid == L.LogPageId.CHANGED_NS:
        return L.ChangedNsList([]).pack()
    if lid == L.LogPageId.CMD_EFFECTS:
        csupp = L.CmdEffects.CSUPP
        admin = {op: int(csupp) for op in _SUPPORTED_ADMIN}
        io = {op: int(csupp) for op in _SUPPORTED_IO}
        for op in _LBA_CHANGING_IO:
            io[op] |= L.CmdEffects.LBCC
        return L.CmdEffectsLog.from_opcodes(admin, io).pack()
    return None
