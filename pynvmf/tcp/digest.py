"""CRC32C for NVMe/TCP header and data digests.

The accelerated implementation (the `crc32c` package, which uses the CPU's
CRC32 instructions) is used whenever it imports; the table-driven fallback
gives identical results and exists so the stack still works without it.
"""

from __future__ import annotations

from collections.abc import Callable

Buffer = bytes | bytearray | memoryview


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c_software(data: Buffer, value: int = 0) -> int:
    crc = value ^ 0xFFFFFFFF
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _load_accelerated() -> Callable[[Buffer], int] | None:
    try:
        from crc32c import crc32c as accelerated
    except ImportError:
        return None
    return accelerated


_accelerated = _load_accelerated()
crc32c: Callable[[Buffer], int] = _accelerated or crc32c_software
IMPLEMENTATION = "crc32c (hardware)" if _accelerated else "software table"


def digest(data: Buffer) -> bytes:
    """The 4 digest bytes that follow a PDU header or its data (little endian)."""
    return crc32c(data).to_bytes(4, "little")
