"""Identify data structures (NVMe Base 2.0 Identify: CNS 00h-03h, 05h, 06h, 08h, 1Ch).

Pure wire formats: each structure packs to the exact 4096 bytes a controller returns and
unpacks from them, so the target builds replies and the host parses them with the same code.
Reserved and vendor specific areas pack as zeros and are ignored on unpack.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import ClassVar, Self

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


@dataclass(slots=True)
class PowerStateDescriptor(Structure):
    """One 32-byte power state descriptor. Powers are in units set by the scale bits."""

    max_power: int = 0  # MP, centiwatts (or 0.0001 W when flags bit 0, MXPS, is set)
    flags: int = 0  # bit 0 MXPS, bit 1 NOPS (non-operational state)
    entry_lat: int = 0  # ENLAT, microseconds
    exit_lat: int = 0  # EXLAT, microseconds
    read_tput: int = 0  # RRT
    read_lat: int = 0  # RRL
    write_tput: int = 0  # RWT
    write_lat: int = 0  # RWL
    idle_power: int = 0  # IDLP
    idle_scale: int = 0  # IPS in bits 7:6
    active_power: int = 0  # ACTP
    active_work_scale: int = 0  # APW in bits 2:0, APS in bits 7:6

    SIZE = PSD_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "PowerStateDescriptor",
        PSD_SIZE,
        (
            ("max_power", 0, U16),
            ("flags", 3, U8),
            ("entry_lat", 4, U32),
            ("exit_lat", 8, U32),
            ("read_tput", 12, U8),
            ("read_lat", 13, U8),
            ("write_tput", 14, U8),
            ("write_lat", 15, U8),
            ("idle_power", 16, U16),
            ("idle_scale", 18, U8),
            ("active_power", 20, U16),
            ("active_work_scale", 22, U8),
        ),
    )


_CTRL_LAYOUT = Layout(
    "IdentifyController",
    IDENTIFY_DATA_SIZE,
    (
        ("vid", 0, U16),
        ("ssvid", 2, U16),
        ("sn", 4, Ascii(20)),
        ("mn", 24, Ascii(40)),
        ("fr", 64, Ascii(8)),
        ("rab", 72, U8),
        ("ieee", 73, U24),
        ("cmic", 76, U8),
        ("mdts", 77, U8),
        ("cntlid", 78, U16),
        ("ver", 80, U32),
        ("rtd3r", 84, U32),
        ("rtd3e", 88, U32),
        ("oaes", 92, U32),
        ("ctratt", 96, U32),
        ("rrls", 100, U16),
        ("cntrltype", 111, U8),
        ("fguid", 112, Raw(16)),
        ("crdt1", 128, U16),
        ("crdt2", 130, U16),
        ("crdt3", 132, U16),
        ("nvmsr", 253, U8),
        ("vwci", 254, U8),
        ("mec", 255, U8),
        ("oacs", 256, U16),
        ("acl", 258, U8),
        ("aerl", 259, U8),
        ("frmw", 260, U8),
        ("lpa", 261, U8),
        ("elpe", 262, U8),
        ("npss", 263, U8),  # len(psd) - 1: a property, decoded into the length of psd
        ("avscc", 264, U8),
        ("apsta", 265, U8),
        ("wctemp", 266, U16),
        ("cctemp", 268, U16),
        ("mtfa", 270, U16),
        ("hmpre", 272, U32),
        ("hmmin", 276, U32),
        ("tnvmcap", 280, U128),
        ("unvmcap", 296, U128),
        ("rpmbs", 312, U32),
        ("edstt", 316, U16),
        ("dsto", 318, U8),
        ("fwug", 319, U8),
        ("kas", 320, U16),
        ("hctma", 322, U16),
        ("mntmt", 324, U16),
        ("mxtmt", 326, U16),
        ("sanicap", 328, U32),
        ("hmminds", 332, U32),
        ("hmmaxd", 336, U16),
        ("nsetidmax", 338, U16),
        ("endgidmax", 340, U16),
        ("anatt", 342, U8),
        ("anacap", 343, U8),
        ("anagrpmax", 344, U32),
        ("nanagrpid", 348, U32),
        ("pels", 352, U32),
        ("domainid", 356, U16),
        ("megcap", 368, U128),
        ("sqes", 512, U8),
        ("cqes", 513, U8),
        ("maxcmd", 514, U16),
        ("nn", 516, U32),
        ("oncs", 520, U16),
        ("fuses", 522, U16),
        ("fna", 524, U8),
        ("vwc", 525, U8),
        ("awun", 526, U16),
        ("awupf", 528, U16),
        ("icsvscc", 530, U8),
        ("nwpc", 531, U8),
        ("acwu", 532, U16),
        ("ocfs", 534, U16),
        ("sgls", 536, U32),
        ("mnan", 540, U32),
        ("maxdna", 544, U128),
        ("maxcna", 560, U32),
        ("subnqn", 768, Nqn(256)),
        # NVMe over Fabrics area (1792..2047)
        ("ioccsz", 1792, U32),
        ("iorcsz", 1796, U32),
        ("icdoff", 1800, U16),
        ("fcatt", 1802, U8),
        ("msdbd", 1803, U8),
        ("ofcs", 1804, U16),
        ("dctype", 1806, U8),
        (
            "psd",
            PSD_OFFSET,
            Array(
                Record(PowerStateDescriptor.LAYOUT, PowerStateDescriptor),
                PSD_MAX,
                counted_by="npss",
            ),
        ),
    ),
)


def _one_psd() -> list[PowerStateDescriptor]:
    return [PowerStateDescriptor()]


@dataclass(slots=True)
class IdentifyController(Structure):
    """Identify Controller data structure (4096 bytes).

    Every field defaults to zero/empty so a target fills in only what it supports.
    NPSS is not a field: it is derived from ``psd`` (1..32 descriptors), and unpack
    returns NPSS + 1 descriptors.
    """

    vid: int = 0
    ssvid: int = 0
    sn: str = ""
    mn: str = ""
    fr: str = ""
    rab: int = 0
    ieee: int = 0  # 24-bit OUI
    cmic: int = 0
    mdts: int = 0  # log2 of max transfer in units of CAP.MPSMIN; 0 = no limit
    cntlid: int = 0
    ver: int = 0  # (major << 16) | (minor << 8) | tertiary
    rtd3r: int = 0
    rtd3e: int = 0
    oaes: int = 0
    ctratt: int = 0
    rrls: int = 0
    cntrltype: int = 0
    fguid: bytes = bytes(16)
    crdt1: int = 0
    crdt2: int = 0
    crdt3: int = 0
    nvmsr: int = 0
    vwci: int = 0
    mec: int = 0
    oacs: int = 0
    acl: int = 0
    aerl: int = 0
    frmw: int = 0
    lpa: int = 0
    elpe: int = 0
    avscc: int = 0
    apsta: int = 0
    wctemp: int = 0
    cctemp: int = 0
    mtfa: int = 0
    hmpre: int = 0
    hmmin: int = 0
    tnvmcap: int = 0
    unvmcap: int = 0
    rpmbs: int = 0
    edstt: int = 0
    dsto: int = 0
    fwug: int = 0
    kas: int = 0  # keep alive granularity, 100 ms units
    hctma: int = 0
    mntmt: int = 0
    mxtmt: int = 0
    sanicap: int = 0
    hmminds: int = 0
    hmmaxd: int = 0
    nsetidmax: int = 0
    endgidmax: int = 0
    anatt: int = 0
    anacap: int = 0
    anagrpmax: int = 0
    nanagrpid: int = 0
    pels: int = 0
    domainid: int = 0
    megcap: int = 0
    sqes: int = 0
    cqes: int = 0
    maxcmd: int = 0
    nn: int = 0
    oncs: int = 0
    fuses: int = 0
    fna: int = 0
    vwc: int = 0
    awun: int = 0
    awupf: int = 0
    icsvscc: int = 0
    nwpc: int = 0
    acwu: int = 0
    ocfs: int = 0
    sgls: int = 0
    mnan: int = 0
    maxdna: int = 0
    maxcna: int = 0
    subnqn: str = ""
    ioccsz: int = 0  # 16-byte units, SQE included
    iorcsz: int = 0  # 16-byte units
    icdoff: int = 0  # 16-byte units
    fcatt: int = 0
    msdbd: int = 0
    ofcs: int = 0
    dctype: int = 0
    psd: list[PowerStateDescriptor] = field(default_factory=_one_psd)

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = _CTRL_LAYOUT

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


@dataclass(slots=True)
class LbaFormat(Structure):
    """One LBA Format entry."""

    ms: int = 0  # metadata bytes per LBA
    lbads: int = 9  # log2 of the LBA data size; 9 = 512 bytes
    rp: int = 0  # relative performance, bits 1:0 (0 best .. 3 degraded)

    SIZE = LBAF_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "LbaFormat", LBAF_SIZE, (("ms", 0, U16), ("lbads", 2, U8), ("rp", 3, U8))
    )

    @property
    def block_size(self) -> int:
        return 1 << self.lbads


_NS_LAYOUT = Layout(
    "IdentifyNamespace",
    IDENTIFY_DATA_SIZE,
    (
        ("nsze", 0, U64),
        ("ncap", 8, U64),
        ("nuse", 16, U64),
        ("nsfeat", 24, U8),
        ("nlbaf", 25, U8),  # len(lbaf) - 1: a property, decoded into the length of lbaf
        ("flbas", 26, U8),
        ("mc", 27, U8),
        ("dpc", 28, U8),
        ("dps", 29, U8),
        ("nmic", 30, U8),
        ("rescap", 31, U8),
        ("fpi", 32, U8),
        ("dlfeat", 33, U8),
        ("nawun", 34, U16),
        ("nawupf", 36, U16),
        ("nacwu", 38, U16),
        ("nabsn", 40, U16),
        ("nabo", 42, U16),
        ("nabspf", 44, U16),
        ("noiob", 46, U16),
        ("nvmcap", 48, U128),
        ("npwg", 64, U16),
        ("npwa", 66, U16),
        ("npdg", 68, U16),
        ("npda", 70, U16),
        ("nows", 72, U16),
        ("mssrl", 74, U16),
        ("mcl", 76, U32),
        ("msrc", 80, U8),
        ("nulbaf", 82, U8),
        ("anagrpid", 92, U32),
        ("nsattr", 99, U8),
        ("nvmsetid", 100, U16),
        ("endgid", 102, U16),
        ("nguid", 104, Raw(16)),
        ("eui64", 120, Raw(8)),
        (
            "lbaf",
            LBAF_OFFSET,
            Array(Record(LbaFormat.LAYOUT, LbaFormat), LBAF_MAX, counted_by="nlbaf"),
        ),
    ),
)


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


@dataclass(slots=True)
class IdentifyNamespace(Structure):
    """Identify Namespace data structure for the NVM command set (4096 bytes).

    NLBAF is not a field: it is derived from ``lbaf`` (1..64 formats), and unpack returns
    NLBAF + 1 formats. An inactive NSID is answered with ``bytes(IDENTIFY_DATA_SIZE)``
    rather than with this structure.
    """

    nsze: int = 0
    ncap: int = 0
    nuse: int = 0
    nsfeat: int = 0
    flbas: int = 0
    mc: int = 0
    dpc: int = 0
    dps: int = 0
    nmic: int = 0
    rescap: int = 0
    fpi: int = 0
    dlfeat: int = 0
    nawun: int = 0
    nawupf: int = 0
    nacwu: int = 0
    nabsn: int = 0
    nabo: int = 0
    nabspf: int = 0
    noiob: int = 0
    nvmcap: int = 0
    npwg: int = 0
    npwa: int = 0
    npdg: int = 0
    npda: int = 0
    nows: int = 0
    mssrl: int = 0
    mcl: int = 0
    msrc: int = 0
    nulbaf: int = 0
    anagrpid: int = 0
    nsattr: int = 0
    nvmsetid: int = 0
    endgid: int = 0
    nguid: bytes = bytes(16)
    eui64: bytes = bytes(8)
    lbaf: list[LbaFormat] = field(default_factory=_one_lbaf)

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = _NS_LAYOUT

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


@dataclass(slots=True)
class NsIdList(Structure):
    """A list of up to 1024 NSIDs in increasing order, zero filled (CNS 02h and kin)."""

    nsids: list[int] = field(default_factory=list)

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "NsIdList", IDENTIFY_DATA_SIZE, (("nsids", 0, ZeroTerminated(U32, NSID_LIST_MAX)),)
    )

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


@dataclass(slots=True)
class IdentifyNamespaceIndependent(Structure):
    """I/O Command Set Independent Identify Namespace (CNS 08h)."""

    nsfeat: int = 0
    nmic: int = 0
    rescap: int = 0
    fpi: int = 0
    anagrpid: int = 0
    nsattr: int = 0
    nvmsetid: int = 0
    endgid: int = 0
    nstat: int = 0

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "IdentifyNamespaceIndependent",
        IDENTIFY_DATA_SIZE,
        (
            ("nsfeat", 0, U8),
            ("nmic", 1, U8),
            ("rescap", 2, U8),
            ("fpi", 3, U8),
            ("anagrpid", 4, U32),
            ("nsattr", 8, U8),
            ("nvmsetid", 10, U16),
            ("endgid", 12, U16),
            ("nstat", 14, U8),
        ),
    )


@dataclass(slots=True)
class IdentifyControllerNvm(Structure):
    """The NVM command set's I/O Command Set specific Identify Controller (CNS 06h, CSI 0).

    Size limits are log2 of units of the minimum memory page size (4 KiB), 0 = no limit
    beyond the command's own fields; DMRL is a count of ranges, DMRSL and DMSL blocks.
    """

    vsl: int = 0
    wzsl: int = 0
    wusl: int = 0
    dmrl: int = 0
    dmrsl: int = 0
    dmsl: int = 0

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "IdentifyControllerNvm",
        IDENTIFY_DATA_SIZE,
        (
            ("vsl", 0, U8),
            ("wzsl", 1, U8),
            ("wusl", 2, U8),
            ("dmrl", 3, U8),
            ("dmrsl", 4, U32),
            ("dmsl", 8, U64),
        ),
    )


@dataclass(slots=True)
class IdentifyNamespaceNvm:
    """The NVM command set's I/O Command Set specific Identify Namespace (CNS 05h, CSI 0):
    the storage tag mask, protection information capabilities and one extended LBA format
    (storage tag size bits 6:0, protection information format bits 8:7) per LBA format."""

    lbstm: int = 0
    pic: int = 0
    elbaf: list[int] = field(default_factory=list)

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "IdentifyNamespaceNvm",
        IDENTIFY_DATA_SIZE,
        (("lbstm", 0, U64), ("pic", 8, U8), ("elbaf", 12, Array(U32, LBAF_MAX))),
    )

    def pack(self) -> bytes:
        return self.LAYOUT.encode(self)

    @classmethod
    def unpack(cls, data: Buffer, formats: int = LBAF_MAX) -> Self:
        """`formats`: how many ELBAF entries to read (the namespace's NLBAF + 1)."""
        values = cls.LAYOUT.decode(data)
        del values["elbaf"][max(formats, 0) :]
        return cls(**values)


IOCS_VECTORS = 512


class IocsVector(IntFlag):
    """One I/O Command Set Vector: the command sets of one combination (bit = CSI)."""

    NVM = 1 << Csi.NVM
    KV = 1 << Csi.KV
    ZNS = 1 << Csi.ZNS


@dataclass(slots=True)
class IoCommandSetList(Structure):
    """I/O Command Set data structure (CNS 1Ch): the combinations a host may select with
    the I/O Command Set Profile feature, by index; zero vectors after the last."""

    vectors: list[int] = field(default_factory=list)

    SIZE = IDENTIFY_DATA_SIZE
    LAYOUT: ClassVar[Layout] = Layout(
        "IoCommandSetList", IDENTIFY_DATA_SIZE, (("vectors", 0, Array(U64, IOCS_VECTORS)),)
    )

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        vectors: list[int] = cls.LAYOUT.decode(data, offset)["vectors"]
        while vectors and not vectors[-1]:
            vectors.pop()
        return cls(vectors)
