"""Get Log Page data structures (NVMe Base 2.0 and NVMe over Fabrics Discovery log).

Every page has a ``pack()`` that builds the whole page. Get Log Page asks for a window
(LPO, NUMD) of it; :func:`log_window` cuts that window so the target does not have to.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum, IntFlag
from typing import Self

from pynvmf.spec.fields import (
    U8,
    U16,
    U32,
    U64,
    U128,
    Array,
    Ascii,
    Buffer,
    Layout,
    Nqn,
    Raw,
    Structure,
    ZeroTerminated,
    at,
    structure,
)


class LogPageId(IntEnum):
    SUPPORTED_LOGS = 0x00
    ERROR = 0x01
    SMART = 0x02
    FW_SLOT = 0x03
    CHANGED_NS = 0x04
    CMD_EFFECTS = 0x05
    DEVICE_SELF_TEST = 0x06
    TELEMETRY_HOST = 0x07
    TELEMETRY_CTRL = 0x08
    ENDURANCE_GROUP = 0x09
    ANA = 0x0C
    PERSISTENT_EVENT = 0x0D
    DISCOVERY = 0x70
    RESERVATION = 0x80
    SANITIZE = 0x81


def log_window(page: Buffer, offset: int, length: int) -> bytes:
    """The `length` bytes of `page` starting at LPO `offset`, zero filled past its end.

    An offset beyond the page is the caller's Invalid Field in Command; it raises here.
    """
    if offset < 0 or length < 0:
        raise ValueError("negative log page offset or length")
    if offset > len(page):
        raise ValueError(f"log page offset {offset} is beyond the {len(page)}-byte page")
    chunk = bytes(page[offset : offset + length])
    return chunk.ljust(length, b"\x00")


# ---------------------------------------------------------------------------------------
# Error Information (LID 01h): an array of 64-byte entries, newest first.

ERROR_ENTRY_SIZE = 64


@structure(ERROR_ENTRY_SIZE)
@dataclass(slots=True)
class ErrorLogEntry(Structure):
    error_count: int = at(0, U64)  # 0 marks an unused entry
    sqid: int = at(8, U16)
    cid: int = at(10, U16)
    status: int = at(12, U16)  # status field as in CQE DW3 bits 31:16, phase tag included
    param_error_location: int = at(14, U16)  # byte in bits 7:0, bit in bits 10:8
    lba: int = at(16, U64)
    nsid: int = at(24, U32)
    vs: int = at(28, U8)
    trtype: int = at(29, U8)
    csi: int = at(30, U8)
    opcode: int = at(31, U8)
    cs: int = at(32, U64)
    trtype_specific: int = at(40, U16)
    log_page_version: int = at(63, U8)


@dataclass(slots=True)
class ErrorLog:
    """The Error Information log: `slots` entries (ELPE + 1), unused ones zeroed.

    unpack keeps only entries with a non-zero error count.
    """

    entries: list[ErrorLogEntry] = field(default_factory=list)
    slots: int = 0  # 0: exactly len(entries)

    def pack(self) -> bytes:
        count = max(self.slots, len(self.entries))
        buf = bytearray(count * ERROR_ENTRY_SIZE)
        for i, entry in enumerate(self.entries):
            entry.pack_into(buf, i * ERROR_ENTRY_SIZE)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        slots = len(data) // ERROR_ENTRY_SIZE
        entries = [ErrorLogEntry.unpack(data, i * ERROR_ENTRY_SIZE) for i in range(slots)]
        return cls([e for e in entries if e.error_count != 0], slots)


# ---------------------------------------------------------------------------------------
# SMART / Health Information (LID 02h)

SMART_LOG_SIZE = 512
KELVIN_OFFSET = 273  # the spec's own conversion: 0 degrees C is reported as 273 K


class CriticalWarning(IntFlag):
    SPARE = 1 << 0
    TEMPERATURE = 1 << 1
    RELIABILITY = 1 << 2
    READ_ONLY = 1 << 3
    VOLATILE_BACKUP = 1 << 4
    PMR_READ_ONLY = 1 << 5


def _eight_zeros() -> list[int]:
    return [0] * 8


@structure(SMART_LOG_SIZE)
@dataclass(slots=True)
class SmartLog(Structure):
    """SMART / Health Information. Temperatures are in Kelvin, 0 = not reported."""

    critical_warning: int = at(0, U8)
    composite_temp: int = at(1, U16)
    avail_spare: int = at(3, U8)  # percent
    spare_thresh: int = at(4, U8)  # percent
    percent_used: int = at(5, U8)
    eg_crit_warning_summary: int = at(6, U8)
    data_units_read: int = at(32, U128)  # thousands of 512-byte units, rounded up
    data_units_written: int = at(48, U128)
    host_read_cmds: int = at(64, U128)
    host_write_cmds: int = at(80, U128)
    ctrl_busy_time: int = at(96, U128)  # minutes
    power_cycles: int = at(112, U128)
    power_on_hours: int = at(128, U128)
    unsafe_shutdowns: int = at(144, U128)
    media_errors: int = at(160, U128)
    num_err_log_entries: int = at(176, U128)
    warning_temp_time: int = at(192, U32)  # minutes
    critical_temp_time: int = at(196, U32)  # minutes
    temp_sensors: list[int] = at(200, Array(U16, 8, exact=True), factory=_eight_zeros)
    thm_temp1_trans_count: int = at(216, U32)
    thm_temp2_trans_count: int = at(220, U32)
    thm_temp1_total_time: int = at(224, U32)
    thm_temp2_total_time: int = at(228, U32)


# ---------------------------------------------------------------------------------------
# Firmware Slot Information (LID 03h)

FW_SLOT_LOG_SIZE = 512
FW_SLOTS = 7


def _seven_empty() -> list[str]:
    return [""] * FW_SLOTS


@structure(FW_SLOT_LOG_SIZE)
@dataclass(slots=True)
class FwSlotLog(Structure):
    """Firmware Slot Information. ``frs[0]`` is slot 1; "" means no image (all zeros)."""

    afi: int = at(0, U8)  # active slot in bits 2:0, slot activated at next reset in bits 6:4
    frs: list[str] = at(8, Array(Ascii(8, empty_is_zero=True), FW_SLOTS), factory=_seven_empty)

    @property
    def active_slot(self) -> int:
        return self.afi & 0x7

    @property
    def next_slot(self) -> int:
        return (self.afi >> 4) & 0x7


# ---------------------------------------------------------------------------------------
# Changed Namespace List (LID 04h)

CHANGED_NS_LOG_SIZE = 4096
CHANGED_NS_MAX = CHANGED_NS_LOG_SIZE // 4
CHANGED_NS_OVERFLOW = 0xFFFFFFFF


@structure(CHANGED_NS_LOG_SIZE)
@dataclass(slots=True)
class ChangedNsList(Structure):
    """NSIDs whose Identify data changed since the log was last read.

    Over 1024 changes pack as the single entry FFFFFFFFh, which unpacks as
    ``ChangedNsList([CHANGED_NS_OVERFLOW])`` with ``overflow`` true.
    """

    nsids: list[int] = at(0, ZeroTerminated(U32, CHANGED_NS_MAX), factory=list)

    @property
    def overflow(self) -> bool:
        return len(self.nsids) > CHANGED_NS_MAX or (
            bool(self.nsids) and self.nsids[0] == CHANGED_NS_OVERFLOW
        )

    def pack(self) -> bytes:
        if self.overflow:
            return self.LAYOUT.encode({"nsids": [CHANGED_NS_OVERFLOW]})
        return self.LAYOUT.encode(self)

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        nsids: list[int] = cls.LAYOUT.decode(data, offset)["nsids"]
        if CHANGED_NS_OVERFLOW in nsids:
            del nsids[nsids.index(CHANGED_NS_OVERFLOW) + 1 :]
        return cls(nsids)


# ---------------------------------------------------------------------------------------
# Asymmetric Namespace Access (LID 0Ch)


class AnaState(IntEnum):
    """An ANA group's state through one controller (NVMe Base 2.0, 8.1.1)."""

    OPTIMIZED = 0x01
    NON_OPTIMIZED = 0x02
    INACCESSIBLE = 0x03
    PERSISTENT_LOSS = 0x04
    CHANGE = 0x0F


# Get Log Page LSP bit 0 for the ANA log: Return Groups Only, without their NSID lists.
ANA_LSP_RGO = 1 << 0
ANA_HEADER_SIZE = 16
ANA_DESC_SIZE = 32
_ANA_HEADER = Layout("ANA log header", ANA_HEADER_SIZE, (("chgcnt", 0, U64), ("ngrps", 8, U16)))
_ANA_DESC = Layout(
    "ANA group descriptor",
    ANA_DESC_SIZE,
    (("grpid", 0, U32), ("nnsids", 4, U32), ("chgcnt", 8, U64), ("state", 16, U8)),
)


@dataclass(slots=True)
class AnaGroupDescriptor:
    grpid: int
    state: int
    chgcnt: int = 0
    nsids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class AnaLog:
    """The ANA log: a change count, then one descriptor per ANA group, each with the
    NSIDs of the group's attached namespaces (none with RGO)."""

    chgcnt: int = 0
    groups: list[AnaGroupDescriptor] = field(default_factory=list)

    def pack(self, *, groups_only: bool = False) -> bytes:
        out = bytearray(_ANA_HEADER.encode({"chgcnt": self.chgcnt, "ngrps": len(self.groups)}))
        for g in self.groups:
            nsids = [] if groups_only else g.nsids
            desc = {"grpid": g.grpid, "nnsids": len(nsids), "chgcnt": g.chgcnt, "state": g.state}
            out += _ANA_DESC.encode(desc)
            out += struct.pack(f"<{len(nsids)}I", *nsids)
        return bytes(out)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        header = _ANA_HEADER.decode(data)
        offset = ANA_HEADER_SIZE
        groups = []
        for _ in range(header["ngrps"]):
            desc = _ANA_DESC.decode(data, offset)
            offset += ANA_DESC_SIZE
            nnsids = desc["nnsids"]
            if len(data) < offset + 4 * nnsids:
                raise ValueError(f"ANA group NSID list needs {4 * nnsids} bytes")
            nsids = list(struct.unpack_from(f"<{nnsids}I", data, offset))
            offset += 4 * nnsids
            groups.append(AnaGroupDescriptor(desc["grpid"], desc["state"], desc["chgcnt"], nsids))
        return cls(header["chgcnt"], groups)


# ---------------------------------------------------------------------------------------
# Commands Supported and Effects (LID 05h)

CMD_EFFECTS_LOG_SIZE = 4096


class CmdEffects(IntFlag):
    CSUPP = 1 << 0  # command supported
    LBCC = 1 << 1  # may change logical block content
    NCC = 1 << 2  # may change namespace capabilities
    NIC = 1 << 3  # may change the namespace inventory
    CCC = 1 << 4  # may change controller capabilities
    CSER_MASK = 0x3 << 14
    # Command Submission and Execution, bits 18:16 (a value, not independent bits)
    CSE_SAME_NS = 0x1 << 16  # no other command to the same namespace meanwhile
    CSE_ANY_NS = 0x2 << 16  # no other command to any namespace meanwhile
    CSE_MASK = 0x7 << 16
    USS = 1 << 19  # UUID selection supported
    CSP_MASK = 0xFFF << 20  # command scope


def _zeros_256() -> list[int]:
    return [0] * 256


@structure(CMD_EFFECTS_LOG_SIZE)
@dataclass(slots=True)
class CmdEffectsLog(Structure):
    """Effects of each admin (``acs``) and I/O (``iocs``) opcode, 256 entries each."""

    acs: list[int] = at(0, Array(U32, 256, exact=True), factory=_zeros_256)
    iocs: list[int] = at(1024, Array(U32, 256, exact=True), factory=_zeros_256)

    @classmethod
    def from_opcodes(cls, admin: Mapping[int, int], io: Mapping[int, int]) -> Self:
        """Build from {opcode: effects}; unlisted opcodes are unsupported (0)."""
        log = cls()
        for opcode, effects in admin.items():
            log.acs[opcode] = effects
        for opcode, effects in io.items():
            log.iocs[opcode] = effects
        return log


# ---------------------------------------------------------------------------------------
# Discovery log page (LID 70h, NVMe over Fabrics)


class TrType(IntEnum):
    RDMA = 1
    FC = 2
    TCP = 3
    LOOP = 254  # intra-host


class AdrFam(IntEnum):
    PCI = 0
    IPV4 = 1
    IPV6 = 2
    IB = 3
    FC = 4
    LOOP = 254  # intra-host


class SubType(IntEnum):
    DISCOVERY = 1  # referral to another discovery subsystem
    NVME = 2
    CURRENT_DISCOVERY = 3  # the discovery subsystem answering the request


class Treq(IntFlag):
    """Transport Requirements. Bits 1:0 are a value for the secure channel."""

    NOT_SPECIFIED = 0
    REQUIRED = 0b01
    NOT_REQUIRED = 0b10
    SECURE_CHANNEL_MASK = 0b11
    DISABLE_SQFLOW = 1 << 2  # the controller can disable SQ flow control at Connect


class DiscEflags(IntFlag):
    DUPRETINFO = 1 << 0  # same information as other entries with this flag
    EPCSD = 1 << 1  # explicit persistent connections supported
    NCC = 1 << 2  # no CDC connectivity


class RdmaQpType(IntEnum):
    """TSAS byte 0 (RDMA_QPTYPE) for the RDMA transport."""

    CONNECTED = 1  # reliable connected
    DATAGRAM = 2  # reliable datagram


class RdmaPrType(IntEnum):
    """TSAS byte 1 (RDMA_PRTYPE): the RDMA provider type."""

    NOT_SPECIFIED = 1
    IB = 2
    ROCE = 3
    ROCEV2 = 4
    IWARP = 5


class RdmaCms(IntEnum):
    """TSAS byte 2 (RDMA_CMS): the connection management service."""

    RDMA_CM = 1


# The RDMA TSAS of a port, as nvmet fills it (nvmet_port_init_tsas_rdma): a reliable
# connected queue pair, the provider not specified, the RDMA CM; P_KEY (bytes 8-9) zero.
RDMA_TSAS = bytes([RdmaQpType.CONNECTED, RdmaPrType.NOT_SPECIFIED, RdmaCms.RDMA_CM])


class TcpSecType(IntEnum):
    """TSAS byte 0 (SECTYPE) for the TCP transport."""

    NONE = 0
    TLS12 = 1
    TLS13 = 2


DISC_HEADER_SIZE = 1024
DISC_ENTRY_SIZE = 1024


@structure(DISC_ENTRY_SIZE)
@dataclass(slots=True)
class DiscoveryLogEntry(Structure):
    """One 1024-byte Discovery Log Page Entry.

    ``tsas`` is the raw 256-byte Transport Specific Address Subtype, shorter values are
    zero padded; for TCP byte 0 is the SECTYPE (see :class:`TcpSecType`).
    """

    trtype: int = at(0, U8, TrType.TCP)
    adrfam: int = at(1, U8, AdrFam.IPV4)
    subtype: int = at(2, U8, SubType.NVME)
    treq: int = at(3, U8, Treq.NOT_SPECIFIED)
    portid: int = at(4, U16)
    cntlid: int = at(6, U16, 0xFFFF)  # dynamic controller model: any controller may be allocated
    asqsz: int = at(8, U16, 32)  # the spec's minimum admin submission queue size
    eflags: int = at(10, U16)
    trsvcid: str = at(32, Ascii(32))
    subnqn: str = at(256, Nqn(256))
    traddr: str = at(512, Ascii(256))
    tsas: bytes = at(768, Raw(256))

    def __post_init__(self) -> None:
        # Compare equal after a round trip: the wire always carries all 256 TSAS bytes.
        if len(self.tsas) < 256:
            self.tsas = bytes(self.tsas).ljust(256, b"\x00")

    @property
    def tcp_sectype(self) -> int:
        return self.tsas[0] if self.tsas else TcpSecType.NONE

    def __repr__(self) -> str:
        # The 256 TSAS bytes are zeroes past the first few: shown as an expression that
        # builds them, not as 256 escapes.
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "tsas"
        )
        head = bytes(self.tsas).rstrip(b"\x00")
        tsas = (
            f"bytes.fromhex({head.hex()!r}).ljust({len(self.tsas)}, b'\\x00')"
            if head
            else f"bytes({len(self.tsas)})"
        )
        return f"DiscoveryLogEntry({shown}, tsas={tsas})"


@structure(DISC_HEADER_SIZE)
@dataclass(slots=True)
class DiscoveryLogHeader(Structure):
    """The first 1024 bytes, enough for a host to learn NUMREC before the full read."""

    genctr: int = at(0, U64)
    numrec: int = at(8, U64)
    recfmt: int = at(16, U16)


@dataclass(slots=True)
class DiscoveryLogPage:
    """Header plus NUMREC entries; NUMREC is len(entries)."""

    genctr: int = 0
    entries: list[DiscoveryLogEntry] = field(default_factory=list)
    recfmt: int = 0

    @property
    def numrec(self) -> int:
        return len(self.entries)

    def pack(self) -> bytes:
        header = DiscoveryLogHeader(self.genctr, len(self.entries), self.recfmt)
        buf = bytearray(DISC_HEADER_SIZE + DISC_ENTRY_SIZE * len(self.entries))
        buf[:DISC_HEADER_SIZE] = header.pack()
        for i, entry in enumerate(self.entries):
            entry.pack_into(buf, DISC_HEADER_SIZE + i * DISC_ENTRY_SIZE)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        """Parse a complete page; a page shorter than NUMREC entries raises ValueError."""
        header = DiscoveryLogHeader.unpack(data)
        size = DISC_HEADER_SIZE + header.numrec * DISC_ENTRY_SIZE
        if len(data) < size:
            raise ValueError(f"Discovery log needs {size} bytes, got {len(data)}")
        entries = [
            DiscoveryLogEntry.unpack(data, DISC_HEADER_SIZE + i * DISC_ENTRY_SIZE)
            for i in range(header.numrec)
        ]
        return cls(header.genctr, entries, header.recfmt)


def discovery_log(genctr: int, entries: Sequence[DiscoveryLogEntry]) -> bytes:
    """The whole Discovery log page: header followed by one record per entry."""
    return DiscoveryLogPage(genctr, list(entries)).pack()
