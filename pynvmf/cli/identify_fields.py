"""`id-ctrl -H` and `id-ns -H`: the bit fields of Identify data in words, as nvme-cli's
--human-readable prints them under the field (`  [hi:lo] : value  meaning`).

One table per Identify structure, by field name: each entry is (high bit, low bit,
meaning). A one-bit entry reads "Supported"/"Not Supported" (or the words given for
0 and 1); a wider one prints its value, or the name the table gives it. The meanings
are the NVMe Base Specification's (2.0, Identify Controller and Identify Namespace
data structures).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bits:
    high: int
    low: int
    meaning: str
    # For a field of one bit: the words for 0 and 1 appended to `meaning`. For a wider
    # one: names of its values.
    names: Mapping[int, str] | None = None

    def line(self, value: int) -> str:
        width = self.high - self.low + 1
        v = value >> self.low & ((1 << width) - 1)
        if self.names is not None:
            text = f"{self.meaning}: {self.names.get(v, 'Reserved')}"
        elif width == 1:
            text = f"{self.meaning} {'Supported' if v else 'Not Supported'}"
        else:
            text = f"{self.meaning}: {v}"
        return f"  [{self.high}:{self.low}] : {v:#x}\t{text}"


def _flags(*meanings: tuple[int, str]) -> tuple[Bits, ...]:
    return tuple(Bits(bit, bit, meaning) for bit, meaning in meanings)


_YES_NO = {0: "No", 1: "Yes"}
_SUPPORTED = {0: "Not Supported", 1: "Supported"}

CONTROLLER: Mapping[str, Sequence[Bits]] = {
    "cmic": (
        Bits(3, 3, "ANA Reporting", _SUPPORTED),
        Bits(2, 2, "SR-IOV Virtual Function", _YES_NO),
        Bits(1, 1, "More than one controller in the NVM subsystem", _YES_NO),
        Bits(0, 0, "More than one port in the NVM subsystem", _YES_NO),
    ),
    "oaes": _flags(
        (31, "Discovery Log Page Change Notice"),
        (15, "Normal NVM Subsystem Shutdown Event"),
        (14, "Endurance Group Event Aggregate Log Page Change Notice"),
        (13, "LBA Status Information Notice"),
        (12, "Predictable Latency Event Aggregate Log Change Notice"),
        (11, "Asymmetric Namespace Access Change Notice"),
        (9, "Firmware Activation Notice"),
        (8, "Namespace Attribute Changed Event"),
    ),
    "ctratt": _flags(
        (9, "UUID List"),
        (8, "SQ Associations"),
        (7, "Namespace Granularity"),
        (6, "Traffic Based Keep Alive"),
        (5, "Predictable Latency Mode"),
        (4, "Endurance Groups"),
        (3, "Read Recovery Levels"),
        (2, "NVM Sets"),
        (1, "Non-Operational Power State Permissive Mode"),
        (0, "128-bit Host Identifier"),
    ),
    "cntrltype": (
        Bits(
            7,
            0,
            "Controller Type",
            {0: "Not Reported", 1: "I/O Controller", 2: "Discovery Controller", 3: "Admin"},
        ),
    ),
    "oacs": _flags(
        (10, "Command and Feature Lockdown"),
        (9, "Get LBA Status"),
        (8, "Doorbell Buffer Config"),
        (7, "Virtualization Management"),
        (6, "NVMe-MI Send and Receive"),
        (5, "Directives"),
        (4, "Device Self-test"),
        (3, "Namespace Management and Attachment"),
        (2, "Firmware Commit and Image Download"),
        (1, "Format NVM"),
        (0, "Security Send and Receive"),
    ),
    "frmw": (
        Bits(4, 4, "Firmware Activation without Reset", _SUPPORTED),
        Bits(3, 1, "Number of Firmware Slots"),
        Bits(0, 0, "Firmware Slot 1 Read-Only", _YES_NO),
    ),
    "lpa": _flags(
        (4, "Persistent Event Log"),
        (3, "Telemetry Host-Initiated and Controller-Initiated Log Pages"),
        (2, "Extended Data for Get Log Page"),
        (1, "Commands Supported and Effects Log Page"),
        (0, "SMART / Health Information Log Page per Namespace"),
    ),
    "sqes": (
        Bits(7, 4, "Max SQ Entry Size (log2 bytes)"),
        Bits(3, 0, "Min SQ Entry Size (log2 bytes)"),
    ),
    "cqes": (
        Bits(7, 4, "Max CQ Entry Size (log2 bytes)"),
        Bits(3, 0, "Min CQ Entry Size (log2 bytes)"),
    ),
    "oncs": _flags(
        (8, "Copy"),
        (7, "Verify"),
        (6, "Timestamp"),
        (5, "Reservations"),
        (4, "Save and Select in Set/Get Features"),
        (3, "Write Zeroes"),
        (2, "Dataset Management"),
        (1, "Write Uncorrectable"),
        (0, "Compare"),
    ),
    "fuses": _flags((0, "Fused Compare and Write")),
    "fna": (
        Bits(2, 2, "Cryptographic Erase", _SUPPORTED),
        Bits(1, 1, "Secure Erase applies to all namespaces", _YES_NO),
        Bits(0, 0, "Format applies to all namespaces", _YES_NO),
    ),
    "vwc": (
        Bits(
            2,
            1,
            "Flush with the broadcast NSID",
            {0: "Not Reported", 2: "Not Supported", 3: "Supported"},
        ),
        Bits(0, 0, "Volatile Write Cache", {0: "Not Present", 1: "Present"}),
    ),
    "sgls": (
        Bits(21, 21, "Transport SGL Data Block", _SUPPORTED),
        Bits(20, 20, "Address Field as Offset", _SUPPORTED),
        Bits(19, 19, "MPTR holding an SGL", _SUPPORTED),
        Bits(18, 18, "SGL Length larger than the data", _SUPPORTED),
        Bits(16, 16, "SGL Bit Bucket Descriptor", _SUPPORTED),
        Bits(2, 2, "Keyed SGL Data Block Descriptor", _SUPPORTED),
        Bits(
            1,
            0,
            "SGL Support",
            {0: "Not Supported", 1: "Supported (no alignment)", 2: "Supported (dword aligned)"},
        ),
    ),
}

NAMESPACE: Mapping[str, Sequence[Bits]] = {
    "nsfeat": _flags(
        (4, "Optimal I/O Fields (NPWG, NPWA, NPDG, NPDA, NOWS)"),
        (3, "NGUID and EUI64 never reused"),
        (2, "Deallocated or Unwritten Logical Block Error"),
        (1, "Namespace Atomic Fields (NAWUN, NAWUPF, NACWU)"),
        (0, "Thin Provisioning"),
    ),
    "flbas": (
        Bits(4, 4, "Metadata Transferred", {0: "in a separate buffer", 1: "at the end of data"}),
        Bits(3, 0, "Current LBA Format"),
    ),
    "dpc": _flags(
        (4, "Protection Information in the last 8 bytes of metadata"),
        (3, "Protection Information in the first 8 bytes of metadata"),
        (2, "Protection Information Type 3"),
        (1, "Protection Information Type 2"),
        (0, "Protection Information Type 1"),
    ),
    "dps": (
        Bits(
            3,
            3,
            "Protection Information",
            {0: "in the last bytes of metadata", 1: "in the first 8 bytes of metadata"},
        ),
        Bits(
            2,
            0,
            "Protection Information Type",
            {0: "Disabled", 1: "Type 1", 2: "Type 2", 3: "Type 3"},
        ),
    ),
    "nmic": (Bits(0, 0, "May be attached to two or more controllers", _YES_NO),),
    "rescap": _flags(
        (7, "Ignore Existing Key (version 1.3 behaviour)"),
        (6, "Exclusive Access - All Registrants"),
        (5, "Write Exclusive - All Registrants"),
        (4, "Exclusive Access - Registrants Only"),
        (3, "Write Exclusive - Registrants Only"),
        (2, "Exclusive Access"),
        (1, "Write Exclusive"),
        (0, "Persist Through Power Loss"),
    ),
}

_RELATIVE_PERFORMANCE = {0: "Best", 1: "Better", 2: "Good", 3: "Degraded"}


def explain(table: Mapping[str, Sequence[Bits]], name: str, value: int) -> list[str]:
    """The lines under field `name` (none for a field the table does not decode)."""
    return [bits.line(value) for bits in table.get(name, ())]


def lba_format_line(index: int, ms: int, lbads: int, rp: int, in_use: bool) -> str:
    """An LBA format as nvme-cli's -H describes it."""
    performance = _RELATIVE_PERFORMANCE.get(rp & 0x3, "Reserved")
    return (
        f"LBA Format {index:2d} : Metadata Size: {ms:<3d} bytes - Data Size: {1 << lbads} bytes"
        f" - Relative Performance: {rp:#x} {performance}{' (in use)' if in_use else ''}"
    )
