"""Opcodes, feature identifiers and other small enumerations of the NVMe specifications."""

from enum import IntEnum


class AdminOpcode(IntEnum):
    DELETE_SQ = 0x00
    CREATE_SQ = 0x01
    GET_LOG_PAGE = 0x02
    DELETE_CQ = 0x04
    CREATE_CQ = 0x05
    IDENTIFY = 0x06
    ABORT = 0x08
    SET_FEATURES = 0x09
    GET_FEATURES = 0x0A
    ASYNC_EVENT_REQUEST = 0x0C
    NS_MANAGEMENT = 0x0D
    FW_COMMIT = 0x10
    FW_DOWNLOAD = 0x11
    NS_ATTACH = 0x15
    KEEP_ALIVE = 0x18
    DIRECTIVE_SEND = 0x19
    DIRECTIVE_RECV = 0x1A
    FABRICS = 0x7F
    FORMAT_NVM = 0x80
    SECURITY_SEND = 0x81
    SECURITY_RECV = 0x82
    SANITIZE = 0x84
    GET_LBA_STATUS = 0x86


class IoOpcode(IntEnum):
    FLUSH = 0x00
    WRITE = 0x01
    READ = 0x02
    WRITE_UNCORRECTABLE = 0x04
    COMPARE = 0x05
    WRITE_ZEROES = 0x08
    DATASET_MANAGEMENT = 0x09
    VERIFY = 0x0C
    RESERVATION_REGISTER = 0x0D
    RESERVATION_REPORT = 0x0E
    RESERVATION_ACQUIRE = 0x11
    RESERVATION_RELEASE = 0x15
    COPY = 0x19
    FABRICS = 0x7F


class FabricsType(IntEnum):
    PROPERTY_SET = 0x00
    CONNECT = 0x01
    PROPERTY_GET = 0x04
    AUTH_SEND = 0x05
    AUTH_RECV = 0x06
    DISCONNECT = 0x08


class FeatureId(IntEnum):
    ARBITRATION = 0x01
    POWER_MGMT = 0x02
    LBA_RANGE = 0x03
    TEMP_THRESHOLD = 0x04
    ERROR_RECOVERY = 0x05
    VOLATILE_WC = 0x06
    NUM_QUEUES = 0x07
    IRQ_COALESCE = 0x08
    IRQ_CONFIG = 0x09
    WRITE_ATOMIC = 0x0A
    ASYNC_EVENT = 0x0B
    AUTO_PST = 0x0C
    HOST_MEM_BUF = 0x0D
    TIMESTAMP = 0x0E
    KATO = 0x0F
    HOST_BEHAVIOR = 0x16  # Host Behavior Support: a 512-byte structure, not a CDW11 value
    IOCS_PROFILE = 0x19  # I/O Command Set Profile: an index into Identify CNS 1Ch
    HOST_ID = 0x81
    RESERVATION_MASK = 0x82  # Reservation Notification Mask: per namespace
    RESERVATION_PERSISTENCE = 0x83  # Reservation Persistence (PTPL): per namespace


class DataDirection(IntEnum):
    """Bits 1:0 of an opcode (or of a Fabrics command type)."""

    NONE = 0
    HOST_TO_CTRL = 1
    CTRL_TO_HOST = 2
    BIDIRECTIONAL = 3


def data_direction(opcode: int) -> DataDirection:
    return DataDirection(opcode & 0x3)


# Asynchronous event types and the notice info of the ones we raise.
class AsyncEventType(IntEnum):
    ERROR = 0
    SMART = 1
    NOTICE = 2
    IO_CMD_SET = 6
    VENDOR = 7


NOTICE_NS_ATTR_CHANGED = 0x00
NOTICE_ANA_CHANGE = 0x03
NOTICE_DISC_LOG_CHANGED = 0xF0

DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
NSID_ALL = 0xFFFFFFFF
