"""Identify data structures (NVMe Base 2.0 Identify: CNS 00h-03h, 05h, 06h, 08h, 1Ch).

Pure wire formats: each structure packs to the exact 4096 bytes a controller returns and
unpacks from them, so the target builds replies and the host parses them with the same code.
Reserved and vendor specific areas pack as zeros and are ignored on unpack.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Self

from pynvmf.spec.fields import (
    U8,
    U16,
    U24,
    U32,
    U64,
    U128,
    Array,
    Ascii,
    Buffer,
    Layout,
    Nqn,
    Raw,
    Record,
    Structure,
    ZeroTerminated,
    at,
    structure,
)

IDENTIFY_DATA_SIZE = 4096


class Cns(IntEnum):
    """Controller or Namespace Structure selector (Identify CDW10 bits 7:0)."""

    NS = 0x00
    CTRL = 0x01
    NS_ACTIVE_LIST = 0x02
    NS_DESC_LIST = 0x03
    NVMSET_LIST = 0x04
    CS_NS = 0x05
    CS_CTRL = 0x06
    CS_NS_ACTIVE_LIST = 0x07
    CS_INDEP_NS = 0x08
    NS_ALLOCATED_LIST = 0x10
    NS_ALLOCATED = 0x11
    CTRL_NS_LIST = 0x12
    CTRL_LIST = 0x13
    PRIMARY_CTRL_CAPS = 0x14
    SECONDARY_CTRL_LIST = 0x15
    NS_GRANULARITY = 0x16
    UUID_LIST = 0x17
    DOMAIN_LIST = 0x18
    ENDGRP_LIST = 0x19
    CS_NS_ALLOCATED_LIST = 0x1A
    CS_NS_ALLOCATED = 0x1B
    IOCS = 0x1C


class Csi(IntEnum):
    """Command Set Identifier."""

    NVM = 0x00
    KV = 0x01
    ZNS = 0x02


class CtrlType(IntEnum):
    """Identify Controller CNTRLTYPE. 0 means "not reported" (pre-1.4 controllers)."""

    IO = 1
    DISCOVERY = 2
    ADMIN = 3


class Cmic(IntFlag):
    MULTI_PORT = 1 << 0
    MULTI_CTRL = 1 << 1
    SRIOV = 1 << 2
    ANA = 1 << 3


class Oaes(IntFlag):
    """Optional Asynchronous Events Supported."""

    NS_ATTR = 1 << 8
    FW_ACTIVATION = 1 << 9
    ANA_CHANGE = 1 << 11
    PLEA_CHANGE = 1 << 12
    LBA_STATUS = 1 << 13
    EG_EVENT_CHANGE = 1 << 14
    NORMAL_SHUTDOWN = 1 << 15
    ZONE_DESC_CHANGE = 1 << 27
    DISCOVERY_CHANGE = 1 << 31


class Ctratt(IntFlag):
    HOST_ID_128 = 1 << 0
    NON_OP_PSP = 1 << 1
    NVM_SETS = 1 << 2
    READ_RECOVERY = 1 << 3
    ENDURANCE_GROUPS = 1 << 4
    PREDICTABLE_LATENCY = 1 << 5
    TBKAS = 1 << 6
    NS_GRANULARITY = 1 << 7
    SQ_ASSOCIATIONS = 1 << 8
    UUID_LIST = 1 << 9
    ELBAS = 1 << 15


class Oacs(IntFlag):
    """Optional Admin Command Support."""

    SECURITY = 1 << 0
    FORMAT = 1 << 1
    FW = 1 << 2
    NS_MGMT = 1 << 3
    SELF_TEST = 1 << 4
    DIRECTIVES = 1 << 5
    NVME_MI = 1 << 6
    VIRT_MGMT = 1 << 7
    DBBUF = 1 << 8
    LBA_STATUS = 1 << 9


class Frmw(IntFlag):
    """Firmware Updates. The slot count lives in bits 3:1; use frmw_slots()."""

    SLOT1_RO = 1 << 0
    ACTIVATE_NO_RESET = 1 << 4


def frmw_slots(count: int) -> int:
    """FRMW bits for `count` firmware slots (1..7)."""
    if not 1 <= count <= 7:
        raise ValueError(f"firmware slot count {count} not in 1..7")
    return count << 1


class Lpa(IntFlag):
    """Log Page Attributes."""

    SMART_PER_NS = 1 << 0
    CMD_EFFECTS = 1 << 1
    EXTENDED_DATA = 1 << 2  # LPO, NUMDU and RAE are honoured
    TELEMETRY = 1 << 3
    PERSISTENT_EVENT = 1 << 4


class Oncs(IntFlag):
    """Optional NVM Command Support."""

    COMPARE = 1 << 0
    WRITE_UNCORRECTABLE = 1 << 1
    DSM = 1 << 2
    WRITE_ZEROES = 1 << 3
    SAVE_FEATURES = 1 << 4
    RESERVATIONS = 1 << 5
    TIMESTAMP = 1 << 6
    VERIFY = 1 << 7
    COPY = 1 << 8


class Fuses(IntFlag):
    """Fused Operation Support."""

    COMPARE_AND_WRITE = 1 << 0


class Vwc(IntFlag):
    """Volatile Write Cache. Bits 2:1 say how Flush with NSID FFFFFFFFh behaves."""

    PRESENT = 1 << 0
    FLUSH_BROADCAST_UNSUPPORTED = 0b10 << 1
    FLUSH_BROADCAST_SUPPORTED = 0b11 << 1


class Sgls(IntFlag):
    """SGL Support. Bits 1:0 are a value: 01b no alignment needed, 10b dword aligned."""

    SUPPORTED = 0b01
    SUPPORTED_DWORD_ALIGNED = 0b10
    KEYED = 1 << 2
    BIT_BUCKET = 1 << 16
    MPTR_BYTE_ALIGNED = 1 << 17
    OVERSIZE = 1 << 18
    MPTR_SGL = 1 << 19
    OFFSET = 1 << 20  # address field may be an offset (needed for in-capsule data)
    TRANSPORT_DATA_BLOCK = 1 << 21


class Fcatt(IntFlag):
    """Fabrics Controller Attributes: cleared means the dynamic controller model."""

    STATIC = 1 << 0


class Ofcs(IntFlag):
    """Optional Fabrics Commands Support."""

    DISCONNECT = 1 << 0


# SQES/CQES: required size in bits 3:0, maximum in bits 7:4, both log2 of bytes.
SQES_NVM = (6 << 4) | 6
CQES_NVM = (4 << 4) | 4


class NsFeat(IntFlag):
    THIN = 1 << 0
    NS_ATOMICS = 1 << 1  # NAWUN/NAWUPF/NACWU are valid
    DULBE = 1 << 2
    ID_REUSE = 1 << 3
    OPT_PERF = 1 << 4  # NPWG/NPWA/NPDG/NPDA/NOWS are valid


class Dlfeat(IntFlag):
    """Deallocate Logical Block Features. Bits 2:0 are the value read back."""

    READ_ZEROES = 0b001
    READ_ONES = 0b010
    WRITE_ZEROES_DEALLOC = 1 << 3
    GUARD_CRC = 1 << 4


NMIC_SHARED = 1 << 0
NSATTR_WRITE_PROTECTED = 1 << 0
FLBAS_EXTENDED_METADATA = 1 << 4


class Nidt(IntEnum):
    """Namespace Identifier Type in a CNS 03h descriptor."""

    EUI64 = 0x01
    NGUID = 0x02
    UUID = 0x03
    CSI = 0x04


NIDT_LENGTHS: dict[int, int] = {Nidt.EUI64: 8, Nidt.NGUID: 16, Nidt.UUID: 16, Nidt.CSI: 1}


# ---------------------------------------------------------------------------------------
# Identify Controller (CNS 01h)

PSD_SIZE = 32
PSD_OFFSET = 2048
PSD_MAX = 32


@structure(PSD_SIZE)
@dataclass(slots=True)
class PowerStateDescriptor(Structure):
    """One 32-byte power state descriptor. Powers are in units set by the scale bits."""

    max_power: int = at(0, U16)  # MP, centiwatts (or 0.0001 W when flags bit 0, MXPS, is set)
    flags: int = at(3, U8)  # bit 0 MXPS, bit 1 NOPS (non-operational state)
    entry_lat: int = at(4, U32)  # ENLAT, microseconds
    exit_lat: int = at(8, U32)  # EXLAT, microseconds
    read_tput: int = at(12, U8)  # RRT
    read_lat: int = at(13, U8)  # RRL
    write_tput: int = at(14, U8)  # RWT
    write_lat: int = at(15, U8)  # RWL
    idle_power: int = at(16, U16)  # IDLP
    idle_scale: int = at(18, U8)  # IPS in bits 7:6
    active_power: int = at(20, U16)  # ACTP
    active_work_scale: int = at(22, U8)  # APW in bits 2:0, APS in bits 7:6


def _one_psd() -> list[PowerStateDescriptor]:
    return [PowerStateDescriptor()]


@structure(IDENTIFY_DATA_SIZE, ("npss", 263, U8))
@dataclass(slots=True)
class IdentifyController(Structure):
    """Identify Controller data structure (4096 bytes).

    Every field defaults to zero/empty so a target fills in only what it supports.
    NPSS is not a field: it is derived from ``psd`` (1..32 descriptors), and unpack
    returns NPSS + 1 descriptors.
    """

    vid: int = at(0, U16)
    ssvid: int = at(2, U16)
    sn: str = at(4, Ascii(20))
    mn: str = at(24, Ascii(40))
    fr: str = at(64, Ascii(8))
    rab: int = at(72, U8)
    ieee: int = at(73, U24)  # 24-bit OUI
    cmic: int = at(76, U8)
    mdts: int = at(77, U8)  # log2 of max transfer in units of CAP.MPSMIN; 0 = no limit
    cntlid: int = at(78, U16)
    ver: int = at(80, U32)  # (major << 16) | (minor << 8) | tertiary
    rtd3r: int = at(84, U32)
    rtd3e: int = at(88, U32)
    oaes: int = at(92, U32)
    ctratt: int = at(96, U32)
    rrls: int = at(100, U16)
    cntrltype: int = at(111, U8)
    fguid: bytes = at(112, Raw(16))
    crdt1: int = at(128, U16)
    crdt2: int = at(130, U16)
    crdt3: int = at(132, U16)
    nvmsr: int = at(253, U8)
    vwci: int = at(254, U8)
    mec: int = at(255, U8)
    oacs: int = at(256, U16)
    acl: int = at(258, U8)
    aerl: int = at(259, U8)
    frmw: int = at(260, U8)
    lpa: int = at(261, U8)
    elpe: int = at(262, U8)
    avscc: int = at(264, U8)
    apsta: int = at(265, U8)
    wctemp: int = at(266, U16)
    cctemp: int = at(268, U16)
    mtfa: int = at(270, U16)
    hmpre: int = at(272, U32)
    hmmin: int = at(276, U32)
    tnvmcap: int = at(280, U128)
    unvmcap: int = at(296, U128)
    rpmbs: int = at(312, U32)
    edstt: int = at(316, U16)
    dsto: int = at(318, U8)
    fwug: int = at(319, U8)
    kas: int = at(320, U16)  # keep alive granularity, 100 ms units
    hctma: int = at(322, U16)
    mntmt: int = at(324, U16)
    mxtmt: int = at(326, U16)
    sanicap: int = at(328, U32)
    hmminds: int = at(332, U32)
    hmmaxd: int = at(336, U16)
    nsetidmax: int = at(338, U16)
    endgidmax: int = at(340, U16)
    anatt: int = at(342, U8)
    anacap: int = at(343, U8)
    anagrpmax: int = at(344, U32)
    nanagrpid: int = at(348, U32)
    pels: int = at(352, U32)
    domainid: int = at(356, U16)
    megcap: int = at(368, U128)
    sqes: int = at(512, U8)
    cqes: int = at(513, U8)
    maxcmd: int = at(514, U16)
    nn: int = at(516, U32)
    oncs: int = at(520, U16)
    fuses: int = at(522, U16)
    fna: int = at(524, U8)
    vwc: int = at(525, U8)
    awun: int = at(526, U16)
    awupf: int = at(528, U16)
    icsvscc: int = at(530, U8)
    nwpc: int = at(531, U8)
    acwu: int = at(532, U16)
    ocfs: int = at(534, U16)
    sgls: int = at(536, U32)
    mnan: int = at(540, U32)
    maxdna: int = at(544, U128)
    maxcna: int = at(560, U32)
    subnqn: str = at(768, Nqn(256))
    # NVMe over Fabrics area (1792..2047)
    ioccsz: int = at(1792, U32)  # 16-byte units, SQE included
    iorcsz: int = at(1796, U32)  # 16-byte units
    icdoff: int = at(1800, U16)  # 16-byte units
    fcatt: int = at(1802, U8)
    msdbd: int = at(1803, U8)
    ofcs: int = at(1804, U16)
    dctype: int = at(1806, U8)
    psd: list[PowerStateDescriptor] = at(
        PSD_OFFSET,
        Array(Record(PowerStateDescriptor), PSD_MAX, counted_by="npss"),
        factory=_one_psd,
    )

    @property
    def npss(self) -> int:
        """Number of Power States Support, a 0's based value."""
        return len(self.psd) - 1

    def pack(self) -> bytes:
        if not 1 <= len(self.psd) <= PSD_MAX:
            raise ValueError(f"IdentifyController.psd needs 1..{PSD_MAX} entries")
        return self.LAYOUT.encode(self)


# ---------------------------------------------------------------------------------------
# Identify Namespace (CNS 00h), NVM command set

LBAF_OFFSET = 128
LBAF_SIZE = 4
LBAF_MAX = 64


@structure(LBAF_SIZE)
@dataclass(slots=True)
class LbaFormat(Structure):
    """One LBA Format entry."""

    ms: int = at(0, U16)  # metadata bytes per LBA
    lbads: int = at(2, U8, 9)  # log2 of the LBA data size; 9 = 512 bytes
    rp: int = at(3, U8)  # relative performance, bits 1:0 (0 best .. 3 degraded)

    @property
    def block_size(self) -> int:
        return 1 << self.lbads


def _one_lbaf() -> list[LbaFormat]:
    return [LbaFormat()]


def flbas_for_index(index: int, *, extended_metadata: bool = False) -> int:
    """FLBAS value selecting LBA format `index` (bits 3:0 low, bits 6:5 high)."""
    if not 0 <= index < LBAF_MAX:
        raise ValueError(f"LBA format index {index} not in 0..{LBAF_MAX - 1}")
    value = (index & 0xF) | (index >> 4) << 5
    if extended_metadata:
        value |= FLBAS_EXTENDED_METADATA
    return value


@structure(IDENTIFY_DATA_SIZE, ("nlbaf", 25, U8))
@dataclass(slots=True)
class IdentifyNamespace(Structure):
    """Identify Namespace data structure for the NVM command set (4096 bytes).

    NLBAF is not a field: it is derived from ``lbaf`` (1..64 formats), and unpack returns
    NLBAF + 1 formats. An inactive NSID is answered with ``bytes(IDENTIFY_DATA_SIZE)``
    rather than with this structure.
    """

    nsze: int = at(0, U64)
    ncap: int = at(8, U64)
    nuse: int = at(16, U64)
    nsfeat: int = at(24, U8)
    flbas: int = at(26, U8)
    mc: int = at(27, U8)
    dpc: int = at(28, U8)
    dps: int = at(29, U8)
    nmic: int = at(30, U8)
    rescap: int = at(31, U8)
    fpi: int = at(32, U8)
    dlfeat: int = at(33, U8)
    nawun: int = at(34, U16)
    nawupf: int = at(36, U16)
    nacwu: int = at(38, U16)
    nabsn: int = at(40, U16)
    nabo: int = at(42, U16)
    nabspf: int = at(44, U16)
    noiob: int = at(46, U16)
    nvmcap: int = at(48, U128)
    npwg: int = at(64, U16)
    npwa: int = at(66, U16)
    npdg: int = at(68, U16)
    npda: int = at(70, U16)
    nows: int = at(72, U16)
    mssrl: int = at(74, U16)
    mcl: int = at(76, U32)
    msrc: int = at(80, U8)
    nulbaf: int = at(82, U8)
    anagrpid: int = at(92, U32)
    nsattr: int = at(99, U8)
    nvmsetid: int = at(100, U16)
    endgid: int = at(102, U16)
    nguid: bytes = at(104, Raw(16))
    eui64: bytes = at(120, Raw(8))
    lbaf: list[LbaFormat] = at(
        LBAF_OFFSET, Array(Record(LbaFormat), LBAF_MAX, counted_by="nlbaf"), factory=_one_lbaf
    )

    @property
    def nlbaf(self) -> int:
        """Number of LBA Formats, a 0's based value."""
        return len(self.lbaf) - 1

    @property
    def lbaf_index(self) -> int:
        """Index of the LBA format in use, from FLBAS bits 3:0 and 6:5."""
        return (self.flbas & 0xF) | ((self.flbas >> 5) & 0x3) << 4

    @property
    def current_format(self) -> LbaFormat:
        index = self.lbaf_index
        if index >= len(self.lbaf):
            raise ValueError(f"FLBAS selects format {index}, only {len(self.lbaf)} exist")
        return self.lbaf[index]

    @property
    def block_size(self) -> int:
        """Logical block data size in bytes of the formatted LBA size."""
        return self.current_format.block_size

    @property
    def metadata_size(self) -> int:
        return self.current_format.ms

    def pack(self) -> bytes:
        if not 1 <= len(self.lbaf) <= LBAF_MAX:
            raise ValueError(f"IdentifyNamespace.lbaf needs 1..{LBAF_MAX} entries")
        return self.LAYOUT.encode(self)


# ---------------------------------------------------------------------------------------
# Namespace Identification Descriptor list (CNS 03h)

_DESC_HEADER = Layout("NsIdDescriptor header", 4, (("nidt", 0, U8), ("nidl", 1, U8)))


@dataclass(slots=True)
class NsIdDescriptor:
    nidt: int
    nid: bytes

    @classmethod
    def eui64(cls, value: bytes) -> Self:
        return cls(Nidt.EUI64, bytes(value))

    @classmethod
    def nguid(cls, value: bytes) -> Self:
        return cls(Nidt.NGUID, bytes(value))

    @classmethod
    def uuid(cls, value: bytes) -> Self:
        """`value` is the 16 bytes of the UUID in RFC 4122 order (``uuid.UUID.bytes``)."""
        return cls(Nidt.UUID, bytes(value))

    @classmethod
    def csi(cls, value: int = Csi.NVM) -> Self:
        return cls(Nidt.CSI, bytes([value]))


@dataclass(slots=True)
class NsIdDescriptorList:
    """The CNS 03h page: descriptors back to back, the rest of the 4096 bytes zero."""

    descriptors: list[NsIdDescriptor] = field(default_factory=list)

    SIZE = IDENTIFY_DATA_SIZE

    def pack(self) -> bytes:
        buf = bytearray(IDENTIFY_DATA_SIZE)
        pos = 0
        for desc in self.descriptors:
            nidl = len(desc.nid)
            expected = NIDT_LENGTHS.get(desc.nidt)
            if expected is not None and nidl != expected:
                raise ValueError(f"NIDT {desc.nidt} needs {expected} bytes, got {nidl}")
            # A zero NIDL is what terminates the list, so a real descriptor cannot have it.
            if not 1 <= nidl <= 0xFF or not 1 <= desc.nidt <= 0xFF:
                raise ValueError(f"invalid descriptor NIDT {desc.nidt} NIDL {nidl}")
            end = pos + _DESC_HEADER.size + nidl
            if end > IDENTIFY_DATA_SIZE:
                raise ValueError("namespace identification descriptors exceed 4096 bytes")
            _DESC_HEADER.encode_into(buf, pos, {"nidt": desc.nidt, "nidl": nidl})
            buf[pos + _DESC_HEADER.size : end] = desc.nid
            pos = end
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        size = min(len(data), IDENTIFY_DATA_SIZE)
        descriptors: list[NsIdDescriptor] = []
        pos = 0
        while pos + _DESC_HEADER.size <= size:
            header = _DESC_HEADER.decode(data, pos)
            nidt, nidl = header["nidt"], header["nidl"]
            if nidl == 0:
                break
            start = pos + _DESC_HEADER.size
            if start + nidl > size:
                raise ValueError(f"descriptor at offset {pos} runs past the end of the page")
            descriptors.append(NsIdDescriptor(nidt, bytes(data[start : start + nidl])))
            pos = start + nidl
        return cls(descriptors)

    def get(self, nidt: int) -> bytes | None:
        """The identifier of the first descriptor of type `nidt`, if any."""
        for desc in self.descriptors:
            if desc.nidt == nidt:
                return desc.nid
        return None


# ---------------------------------------------------------------------------------------
# Active Namespace ID list (CNS 02h)

NSID_LIST_MAX = IDENTIFY_DATA_SIZE // 4


@structure(IDENTIFY_DATA_SIZE)
@dataclass(slots=True)
class NsIdList(Structure):
    """A list of up to 1024 NSIDs in increasing order, zero filled (CNS 02h and kin)."""

    nsids: list[int] = at(0, ZeroTerminated(U32, NSID_LIST_MAX), factory=list)

    @classmethod
    def active(cls, nsids: Iterable[int], start_nsid: int = 0) -> Self:
        """The CNS 02h answer: active NSIDs greater than the command's NSID, ascending.

        The target must reject NSID FFFFFFFEh/FFFFFFFFh itself (Invalid Namespace).
        """
        selected = sorted({n for n in nsids if n > start_nsid})
        return cls(selected[:NSID_LIST_MAX])


# ---------------------------------------------------------------------------------------
# NVMe 2.0's I/O command set model: structures a host reads once it selected every
# supported I/O command set (CC.CSS = 110b), and that any NVMe 2.0 host may ask for.


class Nstat(IntFlag):
    """Namespace Status (CNS 08h)."""

    READY = 1 << 0


@structure(IDENTIFY_DATA_SIZE)
@dataclass(slots=True)
class IdentifyNamespaceIndependent(Structure):
    """I/O Command Set Independent Identify Namespace (CNS 08h)."""

    nsfeat: int = at(0, U8)
    nmic: int = at(1, U8)
    rescap: int = at(2, U8)
    fpi: int = at(3, U8)
    anagrpid: int = at(4, U32)
    nsattr: int = at(8, U8)
    nvmsetid: int = at(10, U16)
    endgid: int = at(12, U16)
    nstat: int = at(14, U8)


@structure(IDENTIFY_DATA_SIZE)
@dataclass(slots=True)
class IdentifyControllerNvm(Structure):
    """The NVM command set's I/O Command Set specific Identify Controller (CNS 06h, CSI 0).

    Size limits are log2 of units of the minimum memory page size (4 KiB), 0 = no limit
    beyond the command's own fields; DMRL is a count of ranges, DMRSL and DMSL blocks.
    """

    vsl: int = at(0, U8)
    wzsl: int = at(1, U8)
    wusl: int = at(2, U8)
    dmrl: int = at(3, U8)
    dmrsl: int = at(4, U32)
    dmsl: int = at(8, U64)


@structure(IDENTIFY_DATA_SIZE)
@dataclass(slots=True)
class IdentifyNamespaceNvm(Structure):
    """The NVM command set's I/O Command Set specific Identify Namespace (CNS 05h, CSI 0):
    the storage tag mask, protection information capabilities and one extended LBA format
    (storage tag size bits 6:0, protection information format bits 8:7) per LBA format."""

    lbstm: int = at(0, U64)
    pic: int = at(8, U8)
    elbaf: list[int] = at(12, Array(U32, LBAF_MAX), factory=list)

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0, *, formats: int = LBAF_MAX) -> Self:
        """`formats`: how many ELBAF entries to read (the namespace's NLBAF + 1)."""
        values = cls.LAYOUT.decode(data, offset)
        del values["elbaf"][max(formats, 0) :]
        return cls(**values)


IOCS_VECTORS = 512


class IocsVector(IntFlag):
    """One I/O Command Set Vector: the command sets of one combination (bit = CSI)."""

    NVM = 1 << Csi.NVM
    KV = 1 << Csi.KV
    ZNS = 1 << Csi.ZNS


@structure(IDENTIFY_DATA_SIZE)
@dataclass(slots=True)
class IoCommandSetList(Structure):
    """I/O Command Set data structure (CNS 1Ch): the combinations a host may select with
    the I/O Command Set Profile feature, by index; zero vectors after the last."""

    vectors: list[int] = at(0, Array(U64, IOCS_VECTORS), factory=list)

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        vectors: list[int] = cls.LAYOUT.decode(data, offset)["vectors"]
        while vectors and not vectors[-1]:
            vectors.pop()
        return cls(vectors)
