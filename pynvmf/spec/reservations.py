"""Reservations as the NVMe Base 2.0 and NVM Command Set specifications define them on the
wire: the command dwords and data of Reservation Register, Acquire, Release and Report,
the Reservation Status data structure, the Reservation Notification log page, RESCAP, the
notification mask, and the table of which commands a reservation allows.

Pure data: no state here (the target's state machine is pynvmf.target.reservations).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Self

from pynvmf.spec.fields import U8, U16, U32, U64, Buffer, Layout, Raw, Structure, at, structure
from pynvmf.spec.opcodes import IoOpcode

_U64_MASK = 0xFFFF_FFFF_FFFF_FFFF


class ReservationType(IntEnum):
    """RTYPE: Reservation Acquire / Release CDW10 bits 15:08, Report byte 4."""

    WRITE_EXCLUSIVE = 1
    EXCLUSIVE_ACCESS = 2
    WRITE_EXCLUSIVE_REGISTRANTS_ONLY = 3
    EXCLUSIVE_ACCESS_REGISTRANTS_ONLY = 4
    WRITE_EXCLUSIVE_ALL_REGISTRANTS = 5
    EXCLUSIVE_ACCESS_ALL_REGISTRANTS = 6


ALL_REGISTRANTS_TYPES = frozenset(
    (
        ReservationType.WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        ReservationType.EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
    )
)
REGISTRANTS_ONLY_TYPES = frozenset(
    (
        ReservationType.WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        ReservationType.EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
    )
)


class RegisterAction(IntEnum):
    """RREGA: Reservation Register CDW10 bits 02:00 (011b..111b reserved)."""

    REGISTER = 0
    UNREGISTER = 1
    REPLACE = 2


class AcquireAction(IntEnum):
    """RACQA: Reservation Acquire CDW10 bits 02:00 (011b..111b reserved)."""

    ACQUIRE = 0
    PREEMPT = 1
    PREEMPT_AND_ABORT = 2


class ReleaseAction(IntEnum):
    """RRELA: Reservation Release CDW10 bits 02:00 (010b..111b reserved)."""

    RELEASE = 0
    CLEAR = 1


class Cptpl(IntEnum):
    """CPTPL: Reservation Register CDW10 bits 31:30 (01b reserved)."""

    NO_CHANGE = 0
    CLEAR = 2  # PTPL state 0: reservations released and registrants cleared on power on
    PERSIST = 3  # PTPL state 1: reservations and registrants persist across power loss


CPTPL_RESERVED = 1


class Rescap(IntFlag):
    """Reservation Capabilities: Identify Namespace byte 31, CNS 08h byte 2."""

    PTPLS = 1 << 0  # Persist Through Power Loss supported
    WRITE_EXCLUSIVE = 1 << 1
    EXCLUSIVE_ACCESS = 1 << 2
    WRITE_EXCLUSIVE_REGISTRANTS_ONLY = 1 << 3
    EXCLUSIVE_ACCESS_REGISTRANTS_ONLY = 1 << 4
    WRITE_EXCLUSIVE_ALL_REGISTRANTS = 1 << 5
    EXCLUSIVE_ACCESS_ALL_REGISTRANTS = 1 << 6
    IEKEY = 1 << 7  # Ignore Existing Key as revision 1.3 and later define it


RESCAP_ALL_TYPES = Rescap(0x7E)


class NotificationType(IntEnum):
    """Reservation Notification log page type (byte 8)."""

    EMPTY = 0
    REGISTRATION_PREEMPTED = 1
    RESERVATION_RELEASED = 2
    RESERVATION_PREEMPTED = 3


class NotificationMask(IntFlag):
    """Reservation Notification Mask (Feature 82h) CDW11: a set bit suppresses the type."""

    REGPRE = 1 << 1
    RESREL = 1 << 2
    RESPRE = 1 << 3


NOTIFICATION_MASK_ALL = NotificationMask.REGPRE | NotificationMask.RESREL | NotificationMask.RESPRE
# The mask bit of each notification type.
MASK_BIT: dict[NotificationType, NotificationMask] = {
    NotificationType.REGISTRATION_PREEMPTED: NotificationMask.REGPRE,
    NotificationType.RESERVATION_RELEASED: NotificationMask.RESREL,
    NotificationType.RESERVATION_PREEMPTED: NotificationMask.RESPRE,
}

# Asynchronous event information of "Reservation Log Page Available" (event type 6,
# I/O Command Set specific status).
AEN_RESERVATION_LOG_AVAILABLE = 0x00
# Reservation Persistence (Feature 83h) CDW11 / DW0 bit 0.
FEATURE_PTPL = 1 << 0
# Host Identifier (Feature 81h) CDW11 bit 0: the 128-bit (extended) host identifier.
FEATURE_EXHID = 1 << 0

# -- command dwords ---------------------------------------------------------------------

_IEKEY = 1 << 3
REPORT_EDS = 1 << 0  # Reservation Report CDW11 bit 0: extended data structure


def register_cdw10(action: int, *, iekey: bool = False, cptpl: int = Cptpl.NO_CHANGE) -> int:
    return (action & 0x7) | (_IEKEY if iekey else 0) | (cptpl & 0x3) << 30


def acquire_cdw10(action: int, rtype: int, *, iekey: bool = False) -> int:
    return (action & 0x7) | (_IEKEY if iekey else 0) | (rtype & 0xFF) << 8


def release_cdw10(action: int, rtype: int, *, iekey: bool = False) -> int:
    return (action & 0x7) | (_IEKEY if iekey else 0) | (rtype & 0xFF) << 8


@dataclass(frozen=True, slots=True)
class RegisterFields:
    action: int  # RREGA, possibly a reserved value
    iekey: bool
    cptpl: int

    @classmethod
    def from_cdw10(cls, cdw10: int) -> Self:
        # Bits 29:04 are reserved: a receiver ignores reserved bits.
        return cls(cdw10 & 0x7, bool(cdw10 & _IEKEY), (cdw10 >> 30) & 0x3)


@dataclass(frozen=True, slots=True)
class AcquireReleaseFields:
    """Reservation Acquire (RACQA) and Release (RRELA) share one CDW10 layout."""

    action: int
    iekey: bool
    rtype: int

    @classmethod
    def from_cdw10(cls, cdw10: int) -> Self:
        # Bits 07:04 and 31:16 are reserved and ignored.
        return cls(cdw10 & 0x7, bool(cdw10 & _IEKEY), (cdw10 >> 8) & 0xFF)


# Command data: Register (CRKEY, NRKEY), Acquire (CRKEY, PRKEY), Release (CRKEY).
REGISTER_DATA = struct.Struct("<QQ")
ACQUIRE_DATA = struct.Struct("<QQ")
RELEASE_DATA = struct.Struct("<Q")


def report_numd(length: int) -> int:
    """CDW10 of a Reservation Report for a `length`-byte buffer (NUMD, 0's based)."""
    if length < 4 or length % 4:
        raise ValueError("a Reservation Report buffer is a positive number of dwords")
    return length // 4 - 1


# -- Reservation Status data structure ----------------------------------------------------

STATUS_HEADER_SIZE = 24
STATUS_HEADER_EXTENDED_SIZE = 64  # bytes 24..63 reserved
_STATUS_HEADER = Layout(
    "Reservation Status header",
    STATUS_HEADER_SIZE,
    (("gen", 0, U32), ("rtype", 4, U8), ("regctl", 5, U16), ("ptpls", 9, U8)),
)
REGCTL_SIZE = 24
_REGCTL = Layout(
    "Registered Controller",
    REGCTL_SIZE,
    (("cntlid", 0, U16), ("rcsts", 2, U8), ("hostid", 8, Raw(8)), ("rkey", 16, U64)),
)
REGCTL_EXT_SIZE = 64
_REGCTL_EXT = Layout(
    "Registered Controller Extended",
    REGCTL_EXT_SIZE,
    (("cntlid", 0, U16), ("rcsts", 2, U8), ("rkey", 8, U64), ("hostid", 16, Raw(16))),
)
RCSTS_HOLDS = 1 << 0  # the host holds the reservation
CNTLID_DYNAMIC = 0xFFFF  # a subsystem with dynamic controllers reports no CNTLID


@dataclass(slots=True)
class RegisteredController:
    hostid: bytes
    rkey: int
    holds: bool = False
    cntlid: int = CNTLID_DYNAMIC


@dataclass(slots=True)
class ReservationStatus:
    """The Reservation Status data structure (Reservation Report's data).

    `regctl` is the number of registered controllers the controller reported, which may
    exceed ``len(registrants)`` when the host's buffer was too small to hold them all.
    """

    generation: int = 0
    rtype: int = 0
    ptpls: bool = False
    registrants: list[RegisteredController] = field(default_factory=list)
    regctl: int | None = None

    @property
    def count(self) -> int:
        return len(self.registrants) if self.regctl is None else self.regctl

    def pack(self, *, extended: bool = True) -> bytes:
        start, entry = _layouts(extended)
        buf = bytearray(start + entry.size * len(self.registrants))
        header = {
            "gen": self.generation & 0xFFFFFFFF,
            "rtype": self.rtype,
            "regctl": self.count & 0xFFFF,
            "ptpls": int(self.ptpls),
        }
        _STATUS_HEADER.encode_into(buf, 0, header)
        for i, r in enumerate(self.registrants):
            # The 64-bit host identifier of the data structure, or the extended one's 128.
            values = {
                "cntlid": r.cntlid,
                "rcsts": RCSTS_HOLDS if r.holds else 0,
                "hostid": r.hostid,
                "rkey": r.rkey & _U64_MASK,
            }
            entry.encode_into(buf, start + i * entry.size, values)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: Buffer, *, extended: bool = True) -> Self:
        """Parse a (possibly truncated) structure: as many registrants as fit in `data`."""
        header = _STATUS_HEADER.decode(data)
        start, entry = _layouts(extended)
        fits = max(0, (len(data) - start) // entry.size)
        registrants = []
        for i in range(min(header["regctl"], fits)):
            r = entry.decode(data, start + i * entry.size)
            holds = bool(r["rcsts"] & RCSTS_HOLDS)
            registrants.append(RegisteredController(r["hostid"], r["rkey"], holds, r["cntlid"]))
        ptpls = bool(header["ptpls"] & 1)
        return cls(header["gen"], header["rtype"], ptpls, registrants, header["regctl"])


def _layouts(extended: bool) -> tuple[int, Layout]:
    """Where the registrants start, and their layout."""
    if extended:
        return STATUS_HEADER_EXTENDED_SIZE, _REGCTL_EXT
    return STATUS_HEADER_SIZE, _REGCTL


# -- Reservation Notification log page ----------------------------------------------------

RESERVATION_LOG_SIZE = 64
AVAILABLE_MAX = 0xFF  # the field saturates


@structure(RESERVATION_LOG_SIZE)
@dataclass(frozen=True, slots=True)
class ReservationNotification(Structure):
    count: int = at(0, U64)  # Log Page Count; 0: the empty log page
    type: int = at(8, U8, NotificationType.EMPTY)
    available: int = at(9, U8)  # further log pages available after this one
    nsid: int = at(12, U32)

    def pack(self) -> bytes:
        values = {
            "count": self.count & _U64_MASK,
            "type": self.type,
            "available": min(self.available, AVAILABLE_MAX),
            "nsid": self.nsid,
        }
        return self.LAYOUT.encode(values)


# -- Command behavior in the presence of a reservation -------------------------------------

# The NVM Command Set's command groups: what a reservation allows or refuses.
READ_GROUP = frozenset((IoOpcode.READ, IoOpcode.COMPARE, IoOpcode.VERIFY))
WRITE_GROUP = frozenset(
    (
        IoOpcode.WRITE,
        IoOpcode.WRITE_UNCORRECTABLE,
        IoOpcode.WRITE_ZEROES,
        IoOpcode.DATASET_MANAGEMENT,
        IoOpcode.FLUSH,
        IoOpcode.COPY,
    )
)


@dataclass(frozen=True, slots=True)
class Access:
    """Whether a reservation type allows the read and write command groups to a registrant
    that does not hold the reservation, and to a host that is not a registrant. The
    holder is allowed everything (in the all registrants types every registrant holds)."""

    registrant_read: bool
    registrant_write: bool
    other_read: bool
    other_write: bool


# "Command Behavior in the Presence of a Reservation", one row per reservation type.
ACCESS: dict[ReservationType, Access] = {
    ReservationType.WRITE_EXCLUSIVE: Access(True, False, True, False),
    ReservationType.EXCLUSIVE_ACCESS: Access(False, False, False, False),
    ReservationType.WRITE_EXCLUSIVE_REGISTRANTS_ONLY: Access(True, True, True, False),
    ReservationType.EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: Access(True, True, False, False),
    ReservationType.WRITE_EXCLUSIVE_ALL_REGISTRANTS: Access(True, True, True, False),
    ReservationType.EXCLUSIVE_ACCESS_ALL_REGISTRANTS: Access(True, True, False, False),
}


def refused_opcodes(rtype: ReservationType) -> tuple[frozenset[int], frozenset[int]]:
    """(opcodes refused to a registrant that does not hold the reservation, opcodes
    refused to a non-registrant) under a reservation of type `rtype`."""
    access = ACCESS[rtype]

    def refused(read: bool, write: bool) -> frozenset[int]:
        return (frozenset() if read else READ_GROUP) | (frozenset() if write else WRITE_GROUP)

    return (
        refused(access.registrant_read, access.registrant_write),
        refused(access.other_read, access.other_write),
    )
