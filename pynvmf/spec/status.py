"""NVMe completion status codes.

A status value here is (Status Code Type << 8) | Status Code, the way the
specification's tables index them; `DNR` and `MORE` are the bits above that.
The CQE carries it shifted left by one, below the phase tag.
"""

from enum import IntEnum
from typing import Final

DNR: Final = 0x4000
MORE: Final = 0x2000
# Command Retry Delay: which of the controller's CRDT1-3 the host waits before a retry.
CRD_SHIFT: Final = 11
CRD_MASK: Final = 0x3 << CRD_SHIFT


class Status(IntEnum):
    # Generic command status (SCT 0)
    SUCCESS = 0x000
    INVALID_OPCODE = 0x001
    INVALID_FIELD = 0x002
    CMDID_CONFLICT = 0x003
    DATA_TRANSFER_ERROR = 0x004
    POWER_LOSS_ABORT = 0x005
    INTERNAL_ERROR = 0x006
    ABORT_REQUESTED = 0x007
    ABORT_SQ_DELETED = 0x008
    FUSED_FAIL = 0x009
    FUSED_MISSING = 0x00A
    INVALID_NS = 0x00B
    CMD_SEQ_ERROR = 0x00C
    SGL_INVALID_LAST = 0x00D
    SGL_INVALID_COUNT = 0x00E
    SGL_INVALID_DATA = 0x00F
    SGL_INVALID_METADATA = 0x010
    SGL_INVALID_TYPE = 0x011
    SGL_INVALID_OFFSET = 0x016
    HOST_ID_INCONSISTENT = 0x018
    KA_TIMEOUT_EXPIRED = 0x019
    KA_TIMEOUT_INVALID = 0x01A
    NS_WRITE_PROTECTED = 0x020
    TRANSIENT_TRANSPORT_ERROR = 0x022
    LBA_OUT_OF_RANGE = 0x080
    CAPACITY_EXCEEDED = 0x081
    NS_NOT_READY = 0x082
    # NVM command set generic status: I/O or a reservation command that a reservation held
    # on the namespace forbids (Linux's NVME_SC_RESERVATION_CONFLICT).
    RESERVATION_CONFLICT = 0x083
    # Command specific status (SCT 1)
    INVALID_CQ = 0x100
    INVALID_QID = 0x101
    INVALID_QUEUE_SIZE = 0x102
    ABORT_LIMIT = 0x103
    ASYNC_EVENT_LIMIT = 0x105
    INVALID_LOG_PAGE = 0x109
    INVALID_FORMAT = 0x10A
    FEATURE_NOT_SAVEABLE = 0x10D
    FEATURE_NOT_CHANGEABLE = 0x10E
    FEATURE_NOT_PER_NS = 0x10F
    IOCS_NOT_SUPPORTED = 0x129
    IOCS_NOT_ENABLED = 0x12A
    IOCS_COMBINATION_REJECTED = 0x12B
    INVALID_IOCS = 0x12C
    # Fabrics Connect (SCT 1, command specific to Connect)
    CONNECT_INCOMPATIBLE_FORMAT = 0x180
    CONNECT_CTRL_BUSY = 0x181
    CONNECT_INVALID_PARAM = 0x182
    CONNECT_RESTART_DISCOVERY = 0x183
    CONNECT_INVALID_HOST = 0x184
    DISCOVERY_RESTART = 0x190
    # A command other than Connect, authentication or Property Get before the queue has
    # authenticated (DH-HMAC-CHAP), as nvmet and SPDK answer it.
    AUTH_REQUIRED = 0x191
    # Media and data integrity errors (SCT 2)
    WRITE_FAULT = 0x280
    UNRECOVERED_READ_ERROR = 0x281
    GUARD_CHECK = 0x282
    COMPARE_FAILED = 0x285
    ACCESS_DENIED = 0x286
    DEALLOCATED_OR_UNWRITTEN = 0x287
    # Path related (SCT 3)
    INTERNAL_PATH_ERROR = 0x300
    # The namespace's ANA group is not usable through this controller's port: the host
    # should retry on another path (no DNR), after re-reading the ANA log.
    ANA_PERSISTENT_LOSS = 0x301
    ANA_INACCESSIBLE = 0x302
    ANA_TRANSITION = 0x303
    HOST_PATH_ERROR = 0x370
    HOST_ABORTED = 0x371


IOCS_COMBINATION_REJECTED = Status.IOCS_COMBINATION_REJECTED

# Command specific codes of the NVM command set share numbers with Connect's,
# so they are plain constants rather than enum members (an IntEnum would alias them).
CMD_SIZE_LIMIT_EXCEEDED = 0x183  # Copy: more than MSSRL / MCL / MSRC
ATTEMPTED_WRITE_TO_READ_ONLY = 0x182
INCOMPATIBLE_NS_OR_FORMAT = 0x185  # Copy: a source namespace formatted unlike the destination
OVERLAPPING_IO_RANGE = 0x187  # Copy formats 2/3: a source overlaps the destination


# Names of the NVM command set's command specific codes, for I/O commands: the same
# numbers mean Connect statuses on a Fabrics command.
_NVM_COMMAND_SPECIFIC = {
    0x180: "CONFLICTING_ATTRIBUTES",
    0x181: "INVALID_PROTECTION_INFO",
    ATTEMPTED_WRITE_TO_READ_ONLY: "ATTEMPTED_WRITE_TO_READ_ONLY",
    CMD_SIZE_LIMIT_EXCEEDED: "CMD_SIZE_LIMIT_EXCEEDED",
    INCOMPATIBLE_NS_OR_FORMAT: "INCOMPATIBLE_NS_OR_FORMAT",
    0x186: "FAST_COPY_NOT_POSSIBLE",
    OVERLAPPING_IO_RANGE: "OVERLAPPING_IO_RANGE",
}


def status_name(value: int, *, io: bool = False) -> str:
    """The status's name; `io` for a status an NVM I/O command completed with, whose
    command specific codes are the NVM command set's rather than Connect's."""
    code = value & 0x7FF
    if io and code in _NVM_COMMAND_SPECIFIC:
        return _NVM_COMMAND_SPECIFIC[code]
    try:
        return Status(code).name
    except ValueError:
        return f"SCT{code >> 8:x}/SC{code & 0xFF:02x}"


def split(value: int) -> tuple[int, int]:
    """(Status Code Type, Status Code) of a status value."""
    return (value >> 8) & 0x7, value & 0xFF
