"""Admin commands of I/O and discovery controllers.

Dispatch follows the specification's tables: admin opcodes, Identify CNS values,
feature identifiers and log page identifiers each map to one handler here, and the
Commands Supported and Effects log is built from the same tables, so that what a
host is told is supported is exactly what is dispatched.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pynvmf import __version__
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.command import HOST_BEHAVIOR_SIZE, host_behavior_cdfe
from pynvmf.spec.opcodes import AdminOpcode, FeatureId
from pynvmf.spec.reservations import FEATURE_EXHID
from pynvmf.spec.status import DNR, IOCS_COMBINATION_REJECTED, Status
from pynvmf.target import ana, discovery, reservations
from pynvmf.target.controller import (
    AERL,
    ERROR_LOG_ENTRIES,
    IOCS_COMBINATIONS,
    KAS_100MS,
    QUEUE_ENTRIES,
    Controller,
)
from pynvmf.target.io import IO_COMMANDS
from pynvmf.target.limits import (
    ACWU,
    MAX_TRANSFER,
    MDTS,
    OCFS,
    VERIFY_SIZE_LIMIT,
    WRITE_ZEROES_SIZE_LIMIT,
    copy_limits,
    reported_nn,
)
from pynvmf.target.outcome import Outcome

if TYPE_CHECKING:
    from pynvmf.spec.command import Sqe
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.subsystem import Namespace
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

PENDING = None  # an Asynchronous Event Request completes later, not now

FIRMWARE = __version__[:8]

# Optional asynchronous events a host may enable with Set Features (Async Event Config).
_AEN_SUPPORTED_IO = I.Oaes.NS_ATTR | I.Oaes.ANA_CHANGE
# Identify Controller MNAN: at most NN (the Linux host refuses ANA otherwise) and small
# enough that the largest ANA log (16 + NANAGRPID * 32 + MNAN * 4 bytes) fits MDTS.
MNAN_MAX = 65536
_AEN_SUPPORTED_DISCOVERY = I.Oaes.DISCOVERY_CHANGE


async def execute(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome | None:
    opcode = req.sqe.opcode
    table = _DISCOVERY_ADMIN if ctrl.is_discovery else _ADMIN
    command = table.get(opcode)
    if command is None:
        return Status.INVALID_OPCODE | DNR, 0, None
    return await command.handler(ctrl, queue, req)


AdminHandler = Callable[["Controller", "TargetQueue", "Request"], Awaitable[Outcome | None]]


@dataclass(frozen=True, slots=True)
class AdminCommand:
    handler: AdminHandler
    effects: int = L.CmdEffects.CSUPP


async def _identify(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return identify(ctrl, queue, req)


async def _get_log_page(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return get_log_page(ctrl, queue, req)


async def _keep_alive(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return Status.SUCCESS, 0, None


async def _get_features(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return get_features(ctrl, req)


async def _set_features(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return await set_features(ctrl, queue, req)


async def _async_event_request(
    ctrl: Controller, queue: TargetQueue, req: Request
) -> Outcome | None:
    if not ctrl.park_event_request(queue, req):
        return Status.ASYNC_EVENT_LIMIT | DNR, 0, None
    return PENDING


async def _abort(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    # Commands complete as soon as they can, but for those a fault rule holds (delayed or
    # dropped, faults.py): those are aborted; anything else "not aborted" (DW0 bit 0).
    sqid, cid = req.sqe.cdw10 & 0xFFFF, req.sqe.cdw10 >> 16
    target = ctrl.queues.get(sqid)
    if target is not None and target.abort_held(cid):
        return Status.SUCCESS, 0, None
    return Status.SUCCESS, 1, None


_ADMIN: dict[int, AdminCommand] = {
    AdminOpcode.GET_LOG_PAGE: AdminCommand(_get_log_page),
    AdminOpcode.IDENTIFY: AdminCommand(_identify),
    AdminOpcode.ABORT: AdminCommand(_abort),
    AdminOpcode.SET_FEATURES: AdminCommand(_set_features),
    AdminOpcode.GET_FEATURES: AdminCommand(_get_features),
    AdminOpcode.ASYNC_EVENT_REQUEST: AdminCommand(_async_event_request),
    AdminOpcode.KEEP_ALIVE: AdminCommand(_keep_alive),
}
_DISCOVERY_ADMIN: dict[int, AdminCommand] = {
    op: _ADMIN[op]
    for op in (
        AdminOpcode.IDENTIFY,
        AdminOpcode.GET_LOG_PAGE,
        AdminOpcode.KEEP_ALIVE,
        AdminOpcode.GET_FEATURES,
        AdminOpcode.SET_FEATURES,
        AdminOpcode.ASYNC_EVENT_REQUEST,
    )
}


# -- Identify ------------------------------------------------------------------------

IdentifyHandler = Callable[["Controller", "TargetQueue", "Sqe"], Outcome]


def identify(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    if req.length < I.IDENTIFY_DATA_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    table = _DISCOVERY_CNS if ctrl.is_discovery else _CNS
    handler = table.get(sqe.cdw10 & 0xFF)
    if handler is None:
        return Status.INVALID_FIELD | DNR, 0, None
    return handler(ctrl, queue, sqe)


def _csi(sqe: Sqe) -> int:
    return sqe.cdw11 >> 24


def _identify_ctrl(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    return Status.SUCCESS, 0, identify_controller(ctrl, queue).pack()


def _namespace_or_status(ctrl: Controller, nsid: int) -> tuple[int, Namespace | None]:
    """The namespace an Identify names: (success, None) for an inactive NSID, which is
    answered with zeroes; Invalid Namespace for NSIDs that name none (0, beyond NN)."""
    if not 0 < nsid <= reported_nn(ctrl.subsystem):
        return Status.INVALID_NS | DNR, None
    return Status.SUCCESS, ctrl.namespaces.get(nsid)


def _identify_ns(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    status, ns = _namespace_or_status(ctrl, sqe.nsid)
    if status or ns is None:
        return status, 0, None if status else bytes(I.IDENTIFY_DATA_SIZE)
    return Status.SUCCESS, 0, identify_namespace(ns).pack()


def _active_nsids(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    if sqe.nsid >= 0xFFFFFFFE:
        return Status.INVALID_NS | DNR, 0, None
    return Status.SUCCESS, 0, I.NsIdList.active(ctrl.namespaces, sqe.nsid).pack()


def _ns_descriptors(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    ns = ctrl.namespaces.get(sqe.nsid)
    if ns is None:
        return Status.INVALID_NS | DNR, 0, None
    # An identifier of zeroes is one the namespace does not have (a namespace moved from
    # nvmet, which reports no EUI-64): not described, as Identify Namespace leaves it zero.
    ids = [
        I.NsIdDescriptor.eui64(ns.eui64) if any(ns.eui64) else None,
        I.NsIdDescriptor.nguid(ns.nguid) if any(ns.nguid) else None,
        I.NsIdDescriptor.uuid(ns.uuid.bytes) if ns.uuid.int else None,
    ]
    descriptors = I.NsIdDescriptorList(
        [d for d in ids if d is not None] + [I.NsIdDescriptor.csi(I.Csi.NVM)]
    )
    return Status.SUCCESS, 0, descriptors.pack()


def _cs_namespace(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    if _csi(sqe) != I.Csi.NVM:
        return Status.INVALID_FIELD | DNR, 0, None
    status, ns = _namespace_or_status(ctrl, sqe.nsid)
    if status or ns is None:
        return status, 0, None if status else bytes(I.IDENTIFY_DATA_SIZE)
    # One LBA format, with no storage tag and no protection information.
    return Status.SUCCESS, 0, I.IdentifyNamespaceNvm(elbaf=[0]).pack()


def _cs_controller(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    if _csi(sqe) != I.Csi.NVM:
        return Status.INVALID_FIELD | DNR, 0, None
    return Status.SUCCESS, 0, identify_controller_nvm().pack()


def _cs_active_nsids(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    if _csi(sqe) != I.Csi.NVM:
        return Status.INVALID_FIELD | DNR, 0, None
    return _active_nsids(ctrl, queue, sqe)


def _cs_independent_ns(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    status, ns = _namespace_or_status(ctrl, sqe.nsid)
    if status or ns is None:
        return status, 0, None if status else bytes(I.IDENTIFY_DATA_SIZE)
    return Status.SUCCESS, 0, identify_namespace_independent(ns).pack()


def _command_sets(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> Outcome:
    # CNTID names the controller whose combinations are asked for: this one (FFFFh
    # meaning "this controller" too, as SPDK's target takes it).
    if sqe.cdw10 >> 16 not in (ctrl.cntlid, 0xFFFF):
        return Status.INVALID_FIELD | DNR, 0, None
    return Status.SUCCESS, 0, I.IoCommandSetList(list(IOCS_COMBINATIONS)).pack()


_CNS: dict[int, IdentifyHandler] = {
    I.Cns.NS: _identify_ns,
    I.Cns.CTRL: _identify_ctrl,
    I.Cns.NS_ACTIVE_LIST: _active_nsids,
    I.Cns.NS_DESC_LIST: _ns_descriptors,
    I.Cns.CS_NS: _cs_namespace,
    I.Cns.CS_CTRL: _cs_controller,
    I.Cns.CS_NS_ACTIVE_LIST: _cs_active_nsids,
    I.Cns.CS_INDEP_NS: _cs_independent_ns,
    I.Cns.IOCS: _command_sets,
}
_DISCOVERY_CNS: dict[int, IdentifyHandler] = {I.Cns.CTRL: _identify_ctrl}


def identify_controller(ctrl: Controller, queue: TargetQueue) -> I.IdentifyController:
    subsystem = ctrl.subsystem
    inline = queue.port.transport.inline_data_size
    common = dict(
        sn=subsystem.serial[:20],
        mn=subsystem.model[:40],
        fr=subsystem.firmware or FIRMWARE,
        cntlid=ctrl.cntlid,
        ver=subsystem.version,
        ieee=subsystem.ieee_oui,
        maxcmd=QUEUE_ENTRIES,
        kas=KAS_100MS,
        # Keyed SGL data blocks on an rdma port (the host's memory under its key), as
        # nvmet's transports with keyed SGLs say; the Linux RDMA host requires the bit.
        sgls=I.Sgls.SUPPORTED
        | (I.Sgls.OFFSET if inline else 0)
        | (I.Sgls.KEYED if queue.port.trtype == "rdma" else 0),
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
    crdt = ctrl.target.crdt
    return I.IdentifyController(
        cntrltype=I.CtrlType.IO,
        rab=6,
        # Several ports, several controllers, ANA reporting: the subsystem may be served
        # by several gateways, each a port of it.
        cmic=I.Cmic.MULTI_PORT | I.Cmic.MULTI_CTRL | I.Cmic.ANA,
        anatt=ana.ANATT,
        anacap=ana.ANACAP,
        anagrpmax=ana.ANAGRPMAX,
        nanagrpid=ana.ANAGRPMAX,
        mnan=min(reported_nn(subsystem), MNAN_MAX),
        mdts=MDTS,
        oaes=_AEN_SUPPORTED_IO,
        ctratt=_CTRATT,
        acl=3,
        frmw=I.frmw_slots(1) | 1,
        lpa=I.Lpa.CMD_EFFECTS | I.Lpa.EXTENDED_DATA,
        wctemp=343,
        cctemp=358,
        nn=reported_nn(subsystem),
        oncs=(
            I.Oncs.COMPARE
            | I.Oncs.DSM
            | I.Oncs.WRITE_ZEROES
            # Get Features answers its Select field, Set Features its Save field (every
            # feature not saveable): get_features, set_features.
            | I.Oncs.SAVE_FEATURES
            | I.Oncs.VERIFY
            | I.Oncs.COPY
            | I.Oncs.RESERVATIONS
        ),
        fuses=I.Fuses.COMPARE_AND_WRITE,
        acwu=ACWU,
        ocfs=OCFS,
        vwc=I.Vwc.PRESENT | I.Vwc.FLUSH_BROADCAST_SUPPORTED,
        # Command Retry Delay Times, 0 unless a fault rule's status asks for CRD.
        crdt1=crdt[0],
        crdt2=crdt[1],
        crdt3=crdt[2],
        **common,
    )


_CTRATT = I.Ctratt.HOST_ID_128 | I.Ctratt.TBKAS


def identify_controller_nvm() -> I.IdentifyControllerNvm:
    # The NVM command set's limits beyond MDTS; Dataset Management has none beyond the
    # command's own fields (256 ranges of up to 2^32 - 1 blocks), reported as 0.
    return I.IdentifyControllerNvm(vsl=VERIFY_SIZE_LIMIT, wzsl=WRITE_ZEROES_SIZE_LIMIT)


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
        nsfeat=_nsfeat(ns),
        flbas=0,
        nmic=I.NMIC_SHARED,
        rescap=ns.reservation.rescap,
        dlfeat=dlfeat,
        nvmcap=caps.size,
        mssrl=limits.max_range_blocks,
        mcl=limits.max_blocks,
        msrc=limits.max_ranges - 1,
        nguid=ns.nguid,
        eui64=ns.eui64,
        anagrpid=ns.anagrpid,
        lbaf=[I.LbaFormat(ms=0, lbads=int(math.log2(caps.block_size)), rp=0)],
    )


def _nsfeat(ns: Namespace) -> int:
    return I.NsFeat.THIN if ns.device.capabilities.deallocate else 0


def identify_namespace_independent(ns: Namespace) -> I.IdentifyNamespaceIndependent:
    # The same facts as CNS 00h reports, for hosts that read the command set
    # independent structure (the Linux host does when CAP.CRMS asks it to, or for
    # command sets other than NVM).
    return I.IdentifyNamespaceIndependent(
        nsfeat=_nsfeat(ns),
        nmic=I.NMIC_SHARED,
        rescap=ns.reservation.rescap,
        anagrpid=ns.anagrpid,
        nstat=I.Nstat.READY,
    )


# -- Features -----------------------------------------------------------------------------

GetFeature = Callable[["Controller", "Request", int], Outcome]
SetFeature = Callable[["Controller", "TargetQueue", "Request"], Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class Feature:
    get: GetFeature
    set: SetFeature
    # Discovery controllers have only the features their few commands need.
    discovery: bool = False
    # A value per namespace (Supported Capabilities NSSPEC): NSID names the namespace.
    per_namespace: bool = False


def get_features(ctrl: Controller, req: Request) -> Outcome:
    sqe = req.sqe
    fid = sqe.cdw10 & 0xFF
    sel = (sqe.cdw10 >> 8) & 0x7
    feature = FEATURES.get(fid)
    if feature is None or (ctrl.is_discovery and not feature.discovery):
        return Status.INVALID_FIELD | DNR, 0, None
    if sel == 3:
        # Supported capabilities: every feature we know is changeable, none saveable.
        return Status.SUCCESS, 0x4 | (0x2 if feature.per_namespace else 0), None
    return feature.get(ctrl, req, sel)


async def set_features(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    fid = sqe.cdw10 & 0xFF
    if sqe.cdw10 >> 31:
        return Status.FEATURE_NOT_SAVEABLE | DNR, 0, None
    feature = FEATURES.get(fid)
    if feature is None or (ctrl.is_discovery and not feature.discovery):
        return Status.INVALID_FIELD | DNR, 0, None
    return await feature.set(ctrl, queue, req)


def _value_feature(fid: int) -> Feature:
    """A feature that is only a CDW11 value the controller keeps for the host."""

    def get(ctrl: Controller, req: Request, sel: int) -> Outcome:
        return Status.SUCCESS, ctrl.features[fid], None

    async def set_(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
        ctrl.features[fid] = req.sqe.cdw11
        return Status.SUCCESS, 0, None

    return Feature(get, set_)


def _get_num_queues(ctrl: Controller, req: Request, sel: int) -> Outcome:
    n = ctrl.io_queues - 1
    return Status.SUCCESS, n | n << 16, None


async def _set_num_queues(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    value = req.sqe.cdw11
    nsqr, ncqr = value & 0xFFFF, value >> 16
    if nsqr == 0xFFFF or ncqr == 0xFFFF:
        return Status.INVALID_FIELD | DNR, 0, None
    if any(qid for qid in ctrl.queues):
        # The number of queues is fixed once an I/O queue exists.
        return Status.CMD_SEQ_ERROR | DNR, 0, None
    ctrl.io_queues = min(max(nsqr, ncqr) + 1, ctrl.io_queues)
    return _get_num_queues(ctrl, req, 0)


def _get_kato(ctrl: Controller, req: Request, sel: int) -> Outcome:
    return Status.SUCCESS, ctrl.kato_ms, None


async def _set_kato(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    ctrl.kato_ms = req.sqe.cdw11
    ctrl.start_keep_alive()
    return Status.SUCCESS, 0, None


def _get_async_event(ctrl: Controller, req: Request, sel: int) -> Outcome:
    return Status.SUCCESS, ctrl.aen_config, None


async def _set_async_event(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    supported = _AEN_SUPPORTED_DISCOVERY if ctrl.is_discovery else _AEN_SUPPORTED_IO
    ctrl.aen_config = req.sqe.cdw11 & supported
    return Status.SUCCESS, ctrl.aen_config, None


def _get_vwc(ctrl: Controller, req: Request, sel: int) -> Outcome:
    return Status.SUCCESS, int(ctrl.volatile_write_cache), None


async def _set_vwc(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    ctrl.volatile_write_cache = bool(req.sqe.cdw11 & 1)
    return Status.SUCCESS, 0, None


def _get_irq_config(ctrl: Controller, req: Request, sel: int) -> Outcome:
    return Status.SUCCESS, req.sqe.cdw11 & 0xFFFF, None


async def _set_irq_config(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    return Status.SUCCESS, 0, None


async def _set_power_mgmt(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    value = req.sqe.cdw11
    if value & 0x1F:
        return Status.INVALID_FIELD | DNR, 0, None  # power state 0 is the only one
    ctrl.features[FeatureId.POWER_MGMT] = value
    return Status.SUCCESS, 0, None


def _get_host_id(ctrl: Controller, req: Request, sel: int) -> Outcome:
    # Fabrics hosts have 128-bit host identifiers (given in Connect): asked for the 64-bit
    # one (EXHID 0), there is none to return.
    if not req.sqe.cdw11 & FEATURE_EXHID:
        return Status.INVALID_FIELD | DNR, 0, None
    if req.length < len(ctrl.hostid):
        return Status.SGL_INVALID_DATA | DNR, 0, None
    return Status.SUCCESS, 0, ctrl.hostid


async def _set_host_id(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    # Fabrics hosts give their identifier in Connect; it cannot change afterwards.
    return Status.CMD_SEQ_ERROR | DNR, 0, None


def _get_host_behavior(ctrl: Controller, req: Request, sel: int) -> Outcome:
    if req.length < HOST_BEHAVIOR_SIZE:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    if sel:
        # Default and saved values (the feature is not saveable): the subsystem's default.
        return Status.SUCCESS, 0, ctrl.subsystem.host_behavior_default
    return Status.SUCCESS, 0, ctrl.host_behavior


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


def _get_iocs_profile(ctrl: Controller, req: Request, sel: int) -> Outcome:
    return Status.SUCCESS, 0 if sel else ctrl.iocs_index, None


async def _set_iocs_profile(ctrl: Controller, queue: TargetQueue, req: Request) -> Outcome:
    index = req.sqe.cdw11 & 0x1FF
    if any(qid for qid in ctrl.queues):
        return Status.CMD_SEQ_ERROR | DNR, 0, None
    if index >= len(IOCS_COMBINATIONS) or not IOCS_COMBINATIONS[index]:
        return IOCS_COMBINATION_REJECTED | DNR, 0, None
    ctrl.iocs_index = index
    return Status.SUCCESS, 0, None


FEATURES: dict[int, Feature] = {
    FeatureId.ARBITRATION: _value_feature(FeatureId.ARBITRATION),
    FeatureId.POWER_MGMT: Feature(_value_feature(FeatureId.POWER_MGMT).get, _set_power_mgmt),
    FeatureId.TEMP_THRESHOLD: _value_feature(FeatureId.TEMP_THRESHOLD),
    FeatureId.ERROR_RECOVERY: _value_feature(FeatureId.ERROR_RECOVERY),
    FeatureId.VOLATILE_WC: Feature(_get_vwc, _set_vwc),
    FeatureId.NUM_QUEUES: Feature(_get_num_queues, _set_num_queues),
    FeatureId.IRQ_COALESCE: _value_feature(FeatureId.IRQ_COALESCE),
    FeatureId.IRQ_CONFIG: Feature(_get_irq_config, _set_irq_config),
    FeatureId.WRITE_ATOMIC: _value_feature(FeatureId.WRITE_ATOMIC),
    FeatureId.ASYNC_EVENT: Feature(_get_async_event, _set_async_event, discovery=True),
    FeatureId.KATO: Feature(_get_kato, _set_kato, discovery=True),
    FeatureId.HOST_BEHAVIOR: Feature(_get_host_behavior, _set_host_behavior),
    FeatureId.IOCS_PROFILE: Feature(_get_iocs_profile, _set_iocs_profile),
    FeatureId.HOST_ID: Feature(_get_host_id, _set_host_id, discovery=True),
    FeatureId.RESERVATION_MASK: Feature(
        reservations.get_notification_mask, reservations.set_notification_mask, per_namespace=True
    ),
    FeatureId.RESERVATION_PERSISTENCE: Feature(
        reservations.get_persistence, reservations.set_persistence, per_namespace=True
    ),
}


# -- Log pages ----------------------------------------------------------------------------

LogPageBuilder = Callable[["Controller", "TargetQueue", "Sqe"], bytes | None]
# Get Log Page CDW10 bit 15: Retain Asynchronous Event (reading leaves events masked).
_RAE = 1 << 15


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
    table = _DISCOVERY_LOG_PAGES if ctrl.is_discovery else _LOG_PAGES
    builder = table.get(lid)
    page = builder(ctrl, queue, sqe) if builder is not None else None
    if page is None or offset > len(page):
        return Status.INVALID_FIELD | DNR, 0, None
    if not sqe.cdw10 & _RAE:
        ctrl.log_page_read(lid)
    return Status.SUCCESS, 0, L.log_window(page, offset, length)


def _error_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    return L.ErrorLog(list(ctrl.errors), slots=ERROR_LOG_ENTRIES).pack()


def _smart_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
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


def _fw_slot_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    return L.FwSlotLog(afi=1, frs=[ctrl.subsystem.firmware or FIRMWARE] + [""] * 6).pack()


def _changed_ns_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    # Reading the log clears it, whatever RAE says (RAE is about the event, as for nvmet).
    return L.ChangedNsList(ctrl.take_changed_nsids()).pack()


def _cmd_effects_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    # The I/O half is per command set (CSI in CDW14 bits 31:24); NVM is the only one the
    # controller has, so another set's log lists the admin commands and no I/O command (as
    # QEMU's controller answers). nvme-cli's `effects-log` asks for the Zoned Namespace
    # set's log too whenever CAP.CSS has the I/O command sets bit, and fails on an error.
    return command_effects(sqe.cdw14 >> 24).pack()


def command_effects(csi: int = I.Csi.NVM) -> L.CmdEffectsLog:
    """Commands Supported and Effects for command set ``csi``: the dispatch tables."""
    admin = {op: command.effects for op, command in _ADMIN.items()}
    admin[AdminOpcode.FABRICS] = L.CmdEffects.CSUPP
    io = {op: command.effects for op, command in IO_COMMANDS.items()} if csi == I.Csi.NVM else {}
    return L.CmdEffectsLog.from_opcodes(admin, io)


def _reservation_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    return reservations.notification_log_page(ctrl, sqe.cdw12 | sqe.cdw13 << 32)


def _ana_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    # The states through the port this controller was created on; LSP bit 0 (RGO): the
    # group descriptors without their NSID lists.
    subsystem = ctrl.subsystem
    groups_only = bool((sqe.cdw10 >> 8) & L.ANA_LSP_RGO)
    page = subsystem.ana.log(ctrl.port, subsystem.ana_members(ctrl.namespaces)).pack(
        groups_only=groups_only
    )
    # The log's size is what Identify promises at most (16 + NANAGRPID * 32 + MNAN * 4
    # bytes), which hosts read in pieces (nvme-cli 2.3 does): past the groups, zeros.
    nn = reported_nn(subsystem)
    largest = L.ANA_HEADER_SIZE + ana.ANAGRPMAX * L.ANA_DESC_SIZE + 4 * min(nn, MNAN_MAX)
    offset = sqe.cdw12 | sqe.cdw13 << 32
    return page if offset <= len(page) else page.ljust(min(offset, largest))


def _discovery_log(ctrl: Controller, queue: TargetQueue, sqe: Sqe) -> bytes:
    return discovery.discovery_log(ctrl.target, ctrl.hostnqn, queue)


_LOG_PAGES: dict[int, LogPageBuilder] = {
    L.LogPageId.ERROR: _error_log,
    L.LogPageId.SMART: _smart_log,
    L.LogPageId.FW_SLOT: _fw_slot_log,
    L.LogPageId.CHANGED_NS: _changed_ns_log,
    L.LogPageId.CMD_EFFECTS: _cmd_effects_log,
    L.LogPageId.ANA: _ana_log,
    L.LogPageId.RESERVATION: _reservation_log,
}
_DISCOVERY_LOG_PAGES: dict[int, LogPageBuilder] = {L.LogPageId.DISCOVERY: _discovery_log}
