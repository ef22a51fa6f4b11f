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

Buffer = bytes | bytearray | memoryview


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


def _require(data: Buffer, size: int, what: str) -> None:
    if len(data) < size:
        raise ValueError(f"{what} needs {size} bytes, got {len(data)}")


def _ascii(value: str, size: int, what: str) -> bytes:
    """An NVMe "ASCII string": left justified and space padded to the field size."""
    raw = value.encode("ascii")
    if len(raw) > size:
        raise ValueError(f"{what} {value!r} is longer than {size} bytes")
    return raw.ljust(size, b" ")


def _from_ascii(raw: bytes) -> str:
    # Linux pads TRADDR/TRSVCID with NULs where the spec says spaces; accept both.
    return raw.rstrip(b" \x00").decode("ascii", errors="replace")


def _nqn(value: str, size: int = 256) -> bytes:
    raw = value.encode("utf-8")
    # Keep the NUL terminator: hosts copy these with C string functions.
    if len(raw) >= size:
        raise ValueError(f"NQN is {len(raw)} bytes, at most {size - 1} fit")
    return raw


def _from_nqn(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", errors="replace")


_U128 = struct.Struct("<QQ")
_U64_MASK = 0xFFFF_FFFF_FFFF_FFFF


def _put_u128(buf: bytearray, offset: int, value: int, what: str) -> None:
    if not 0 <= value < 1 << 128:
        raise ValueError(f"{what} {value} does not fit in 128 bits")
    _U128.pack_into(buf, offset, value & _U64_MASK, value >> 64)


def _get_u128(data: Buffer, offset: int) -> int:
    lo, hi = _U128.unpack_from(data, offset)
    return lo | hi << 64


# ---------------------------------------------------------------------------------------
# Error Information (LID 01h): an array of 64-byte entries, newest first.

ERROR_ENTRY_SIZE = 64
# error count, SQID, CID, status (phase tag in bit 0), parameter error location, LBA,
# NSID, vendor specific info, TRTYPE, CSI, opcode, command specific info,
# transport type specific info, reserved, log page version
_ERROR_ENTRY = struct.Struct("<QHHHHQIBBBBQH21xB")


@dataclass(slots=True)
class ErrorLogEntry:
    error_count: int = 0  # 0 marks an unused entry
    sqid: int = 0
    cid: int = 0
    status: int = 0  # status field as in CQE DW3 bits 31:16, phase tag included
    param_error_location: int = 0  # byte in bits 7:0, bit in bits 10:8
    lba: int = 0
    nsid: int = 0
    vs: int = 0
    trtype: int = 0
    csi: int = 0
    opcode: int = 0
    cs: int = 0
    trtype_specific: int = 0
    log_page_version: int = 0

    SIZE = ERROR_ENTRY_SIZE

    def pack(self) -> bytes:
        try:
            return _ERROR_ENTRY.pack(
                self.error_count,
                self.sqid,
                self.cid,
                self.status,
                self.param_error_location,
                self.lba,
                self.nsid,
                self.vs,
                self.trtype,
                self.csi,
                self.opcode,
                self.cs,
                self.trtype_specific,
                self.log_page_version,
            )
        except struct.error as exc:
            raise ValueError(f"ErrorLogEntry: {exc}") from exc

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        _require(data, offset + ERROR_ENTRY_SIZE, "Error Information entry")
        return cls(*_ERROR_ENTRY.unpack_from(data, offset))


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
            offset = i * ERROR_ENTRY_SIZE
            buf[offset : offset + ERROR_ENTRY_SIZE] = entry.pack()
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

# critical warning, composite temperature, available spare, threshold, percentage used,
# endurance group critical warning summary
_SMART_HEAD = struct.Struct("<BHBBBB")
# warning/critical temperature time, 8 sensors, thermal management transition counts
# and total times
_SMART_TAIL = struct.Struct("<II8HIIII")
_SMART_TAIL_OFFSET = 192
_SMART_COUNTERS = (
    "data_units_read",
    "data_units_written",
    "host_read_cmds",
    "host_write_cmds",
    "ctrl_busy_time",
    "power_cycles",
    "power_on_hours",
    "unsafe_shutdowns",
    "media_errors",
    "num_err_log_entries",
)
_SMART_COUNTERS_OFFSET = 32  # ten 128-bit counters back to back


class CriticalWarning(IntFlag):
    SPARE = 1 << 0
    TEMPERATURE = 1 << 1
    RELIABILITY = 1 << 2
    READ_ONLY = 1 << 3
    VOLATILE_BACKUP = 1 << 4
    PMR_READ_ONLY = 1 << 5


def _eight_zeros() -> list[int]:
    return [0] * 8


@dataclass(slots=True)
class SmartLog:
    """SMART / Health Information. Temperatures are in Kelvin, 0 = not reported."""

    critical_warning: int = 0
    composite_temp: int = 0
    avail_spare: int = 0  # percent
    spare_thresh: int = 0  # percent
    percent_used: int = 0
    eg_crit_warning_summary: int = 0
    data_units_read: int = 0  # thousands of 512-byte units, rounded up
    data_units_written: int = 0
    host_read_cmds: int = 0
    host_write_cmds: int = 0
    ctrl_busy_time: int = 0  # minutes
    power_cycles: int = 0
    power_on_hours: int = 0
    unsafe_shutdowns: int = 0
    media_errors: int = 0
    num_err_log_entries: int = 0
    warning_temp_time: int = 0  # minutes
    critical_temp_time: int = 0  # minutes
    temp_sensors: list[int] = field(default_factory=_eight_zeros)
    thm_temp1_trans_count: int = 0
    thm_temp2_trans_count: int = 0
    thm_temp1_total_time: int = 0
    thm_temp2_total_time: int = 0

    SIZE = SMART_LOG_SIZE

    def pack(self) -> bytes:
        if len(self.temp_sensors) != 8:
            raise ValueError("SmartLog.temp_sensors needs exactly 8 values")
        buf = bytearray(SMART_LOG_SIZE)
        try:
            _SMART_HEAD.pack_into(
                buf,
                0,
                self.critical_warning,
                self.composite_temp,
                self.avail_spare,
                self.spare_thresh,
                self.percent_used,
                self.eg_crit_warning_summary,
            )
            _SMART_TAIL.pack_into(
                buf,
                _SMART_TAIL_OFFSET,
                self.warning_temp_time,
                self.critical_temp_time,
                *self.temp_sensors,
                self.thm_temp1_trans_count,
                self.thm_temp2_trans_count,
                self.thm_temp1_total_time,
                self.thm_temp2_total_time,
            )
        except struct.error as exc:
            raise ValueError(f"SmartLog: {exc}") from exc
        for i, name in enumerate(_SMART_COUNTERS):
            _put_u128(buf, _SMART_COUNTERS_OFFSET + 16 * i, getattr(self, name), name)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, SMART_LOG_SIZE, "SMART / Health Information")
        head = _SMART_HEAD.unpack_from(data, 0)
        tail = _SMART_TAIL.unpack_from(data, _SMART_TAIL_OFFSET)
        counters = {
            name: _get_u128(data, _SMART_COUNTERS_OFFSET + 16 * i)
            for i, name in enumerate(_SMART_COUNTERS)
        }
        return cls(
            *head,
            **counters,
            warning_temp_time=tail[0],
            critical_temp_time=tail[1],
            temp_sensors=list(tail[2:10]),
            thm_temp1_trans_count=tail[10],
            thm_temp2_trans_count=tail[11],
            thm_temp1_total_time=tail[12],
            thm_temp2_total_time=tail[13],
        )


# ---------------------------------------------------------------------------------------
# Firmware Slot Information (LID 03h)

FW_SLOT_LOG_SIZE = 512
FW_SLOTS = 7
_FW_SLOT = struct.Struct("<B7x" + "8s" * FW_SLOTS)


def _seven_empty() -> list[str]:
    return [""] * FW_SLOTS


@dataclass(slots=True)
class FwSlotLog:
    """Firmware Slot Information. ``frs[0]`` is slot 1; "" means no image (all zeros)."""

    afi: int = 0  # active slot in bits 2:0, slot activated at next reset in bits 6:4
    frs: list[str] = field(default_factory=_seven_empty)

    SIZE = FW_SLOT_LOG_SIZE

    @property
    def active_slot(self) -> int:
        return self.afi & 0x7

    @property
    def next_slot(self) -> int:
        return (self.afi >> 4) & 0x7

    def pack(self) -> bytes:
        if len(self.frs) > FW_SLOTS:
            raise ValueError(f"FwSlotLog.frs holds at most {FW_SLOTS} revisions")
        # An empty slot is all zeros rather than eight spaces.
        revisions = [
            _ascii(rev, 8, f"frs{i + 1}") if rev else bytes(8) for i, rev in enumerate(self.frs)
        ]
        revisions += [bytes(8)] * (FW_SLOTS - len(revisions))
        buf = bytearray(FW_SLOT_LOG_SIZE)
        try:
            _FW_SLOT.pack_into(buf, 0, self.afi, *revisions)
        except struct.error as exc:
            raise ValueError(f"FwSlotLog: {exc}") from exc
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, _FW_SLOT.size, "Firmware Slot Information")
        afi, *revisions = _FW_SLOT.unpack_from(data, 0)
        return cls(afi, [_from_ascii(r) for r in revisions])


# ---------------------------------------------------------------------------------------
# Changed Namespace List (LID 04h)

CHANGED_NS_LOG_SIZE = 4096
CHANGED_NS_MAX = CHANGED_NS_LOG_SIZE // 4
CHANGED_NS_OVERFLOW = 0xFFFFFFFF
_CHANGED_NS = struct.Struct(f"<{CHANGED_NS_MAX}I")


@dataclass(slots=True)
class ChangedNsList:
    """NSIDs whose Identify data changed since the log was last read.

    Over 1024 changes pack as the single entry FFFFFFFFh, which unpacks as
    ``ChangedNsList([CHANGED_NS_OVERFLOW])`` with ``overflow`` true.
    """

    nsids: list[int] = field(default_factory=list)

    SIZE = CHANGED_NS_LOG_SIZE

    @property
    def overflow(self) -> bool:
        return len(self.nsids) > CHANGED_NS_MAX or (
            bool(self.nsids) and self.nsids[0] == CHANGED_NS_OVERFLOW
        )

    def pack(self) -> bytes:
        nsids = [CHANGED_NS_OVERFLOW] if self.overflow else self.nsids
        if 0 in nsids:
            raise ValueError("NSID 0 would terminate the list early")
        try:
            return _CHANGED_NS.pack(*nsids, *([0] * (CHANGED_NS_MAX - len(nsids))))
        except struct.error as exc:
            raise ValueError(f"ChangedNsList: {exc}") from exc

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, CHANGED_NS_LOG_SIZE, "Changed Namespace List")
        nsids: list[int] = []
        for nsid in _CHANGED_NS.unpack_from(data, 0):
            if nsid == 0:
                break
            nsids.append(nsid)
            if nsid == CHANGED_NS_OVERFLOW:
                break
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
_ANA_HEADER = struct.Struct("<QH6x")
_ANA_DESC = struct.Struct("<IIQB15x")


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
        out = bytearray(_ANA_HEADER.pack(self.chgcnt, len(self.groups)))
        for g in self.groups:
            nsids = [] if groups_only else g.nsids
            out += _ANA_DESC.pack(g.grpid, len(nsids), g.chgcnt, g.state)
            out += struct.pack(f"<{len(nsids)}I", *nsids)
        return bytes(out)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, ANA_HEADER_SIZE, "ANA log header")
        chgcnt, ngrps = _ANA_HEADER.unpack_from(data, 0)
        offset = ANA_HEADER_SIZE
        groups = []
        for _ in range(ngrps):
            _require(data, offset + ANA_DESC_SIZE, "ANA group descriptor")
            grpid, nnsids, gchg, state = _ANA_DESC.unpack_from(data, offset)
            offset += ANA_DESC_SIZE
            _require(data, offset + 4 * nnsids, "ANA group NSID list")
            nsids = list(struct.unpack_from(f"<{nnsids}I", data, offset))
            offset += 4 * nnsids
            groups.append(AnaGroupDescriptor(grpid, state, gchg, nsids))
        return cls(chgcnt, groups)


# ---------------------------------------------------------------------------------------
# Commands Supported and Effects (LID 05h)

CMD_EFFECTS_LOG_SIZE = 4096
_EFFECTS = struct.Struct("<256I256I")


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


@dataclass(slots=True)
class CmdEffectsLog:
    """Effects of each admin (``acs``) and I/O (``iocs``) opcode, 256 entries each."""

    acs: list[int] = field(default_factory=_zeros_256)
    iocs: list[int] = field(default_factory=_zeros_256)

    SIZE = CMD_EFFECTS_LOG_SIZE

    @classmethod
    def from_opcodes(cls, admin: Mapping[int, int], io: Mapping[int, int]) -> Self:
        """Build from {opcode: effects}; unlisted opcodes are unsupported (0)."""
        log = cls()
        for opcode, effects in admin.items():
            log.acs[opcode] = effects
        for opcode, effects in io.items():
            log.iocs[opcode] = effects
        return log

    def pack(self) -> bytes:
        if len(self.acs) != 256 or len(self.iocs) != 256:
            raise ValueError("CmdEffectsLog.acs and .iocs need exactly 256 entries each")
        buf = bytearray(CMD_EFFECTS_LOG_SIZE)
        try:
            _EFFECTS.pack_into(buf, 0, *self.acs, *self.iocs)
        except struct.error as exc:
            raise ValueError(f"CmdEffectsLog: {exc}") from exc
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, _EFFECTS.size, "Commands Supported and Effects")
        values = _EFFECTS.unpack_from(data, 0)
        return cls(list(values[:256]), list(values[256:]))


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


class TcpSecType(IntEnum):
    """TSAS byte 0 (SECTYPE) for the TCP transport."""

    NONE = 0
    TLS12 = 1
    TLS13 = 2


DISC_HEADER_SIZE = 1024
DISC_ENTRY_SIZE = 1024
_DISC_HEADER = struct.Struct("<QQH1006x")  # GENCTR, NUMREC, RECFMT
# TRTYPE, ADRFAM, SUBTYPE, TREQ, PORTID, CNTLID, ASQSZ, EFLAGS, reserved, TRSVCID,
# reserved, SUBNQN, TRADDR, TSAS
_DISC_ENTRY = struct.Struct("<BBBBHHHH20x32s192x256s256s256s")


@dataclass(slots=True)
class DiscoveryLogEntry:
    """One 1024-byte Discovery Log Page Entry.

    ``tsas`` is the raw 256-byte Transport Specific Address Subtype, shorter values are
    zero padded; for TCP byte 0 is the SECTYPE (see :class:`TcpSecType`).
    """

    trtype: int = TrType.TCP
    adrfam: int = AdrFam.IPV4
    subtype: int = SubType.NVME
    treq: int = Treq.NOT_SPECIFIED
    portid: int = 0
    cntlid: int = 0xFFFF  # dynamic controller model: any controller may be allocated
    asqsz: int = 32  # the spec's minimum admin submission queue size
    eflags: int = 0
    trsvcid: str = ""
    subnqn: str = ""
    traddr: str = ""
    tsas: bytes = bytes(256)

    SIZE = DISC_ENTRY_SIZE

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

    def pack_into(self, buf: bytearray, offset: int) -> None:
        if len(self.tsas) > 256:
            raise ValueError("DiscoveryLogEntry.tsas is at most 256 bytes")
        try:
            _DISC_ENTRY.pack_into(
                buf,
                offset,
                self.trtype,
                self.adrfam,
                self.subtype,
                self.treq,
                self.portid,
                self.cntlid,
                self.asqsz,
                self.eflags,
                _ascii(self.trsvcid, 32, "trsvcid"),
                _nqn(self.subnqn),
                _ascii(self.traddr, 256, "traddr"),
                bytes(self.tsas),
            )
        except struct.error as exc:
            raise ValueError(f"DiscoveryLogEntry: {exc}") from exc

    def pack(self) -> bytes:
        buf = bytearray(DISC_ENTRY_SIZE)
        self.pack_into(buf, 0)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        _require(data, offset + DISC_ENTRY_SIZE, "Discovery Log Page Entry")
        *numbers, trsvcid, subnqn, traddr, tsas = _DISC_ENTRY.unpack_from(data, offset)
        return cls(
            *numbers,
            trsvcid=_from_ascii(trsvcid),
            subnqn=_from_nqn(subnqn),
            traddr=_from_ascii(traddr),
            tsas=tsas,
        )


@dataclass(slots=True)
class DiscoveryLogHeader:
    """The first 1024 bytes, enough for a host to learn NUMREC before the full read."""

    genctr: int = 0
    numrec: int = 0
    recfmt: int = 0

    SIZE = DISC_HEADER_SIZE

    def pack(self) -> bytes:
        try:
            return _DISC_HEADER.pack(self.genctr, self.numrec, self.recfmt)
        except struct.error as exc:
            raise ValueError(f"DiscoveryLogHeader: {exc}") from exc

    @classmethod
    def unpack(cls, data: Buffer) -> Self:
        _require(data, DISC_HEADER_SIZE, "Discovery log header")
        return cls(*_DISC_HEADER.unpack_from(data, 0))


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
        _require(data, DISC_HEADER_SIZE + header.numrec * DISC_ENTRY_SIZE, "Discovery log")
        entries = [
            DiscoveryLogEntry.unpack(data, DISC_HEADER_SIZE + i * DISC_ENTRY_SIZE)
            for i in range(header.numrec)
        ]
        return cls(header.genctr, entries, header.recfmt)


def discovery_log(genctr: int, entries: Sequence[DiscoveryLogEntry]) -> bytes:
    """The whole Discovery log page: header followed by one record per entry."""
    return DiscoveryLogPage(genctr, list(entries)).pack()
