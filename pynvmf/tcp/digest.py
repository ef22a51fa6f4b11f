"""CRC32C (Castagnoli, the iSCSI CRC) for NVMe/TCP header and data digests.

The accelerated implementation is the `crc32c-rs` package (Rust, using the CPU's
CRC32 and carry-less multiply instructions), chosen by measurement against the
other maintained CRC32C packages: the fastest at every size and the lowest
per-call cost, which is what a 24-byte header digest pays (docs/crc32c.md,
benchmarks/crc32c_libs.py). The ICRAR `crc32c` package is the second choice.
When neither imports, a pure-Python fallback gives identical results, much
more slowly.

`IMPLEMENTATION` names the implementation in use and `ACCELERATED` says whether
it is the accelerated one.

Conventions: `crc32c(data)` is the CRC as a number, as RFC 3720 and the CRC
catalogues list it (init and final XOR 0xFFFFFFFF, reflected); `value` continues
a previous result, as in `binascii.crc32`. On the wire an NVMe/TCP digest is
that number in little-endian byte order: `digest(data)`.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterable
from functools import cache

Buffer = bytes | bytearray | memoryview

# The Castagnoli polynomial 0x1EDC6F41, bit-reversed for the LSB-first register.
POLYNOMIAL_REVERSED = 0x82F63B78
_MASK = 0xFFFFFFFF
# CRC-32/ISCSI of b"123456789", the CRC catalogue's check value.
CHECK_VALUE = 0xE3069283
# The CRC of any data followed by its digest (the CRC little endian): a receiver checks a
# digest with one CRC call over both, and no read of the digest field.
RESIDUE = 0x48674BC7
_ZEROS9 = 0xBBE568A3  # of 9 zero bytes, passed as a writable memoryview as pynvmf does

# -- the pure-Python fallback ------------------------------------------------------------------
#
# Two loops, by size. Short inputs (PDU headers) run a slicing-by-4 loop: one
# Python iteration per 4-byte word with four table lookups. Long inputs use
# the CRC's linearity to move almost all of the work into C-speed bytes and int
# operations: the data is cut into rows of W bytes; each row's own CRC
# contribution is the XOR of one table entry per byte position, and column j of
# all rows can be looked up at once with `bytes.translate` (one byte lane of the
# 32-bit entries at a time) and XORed for all rows at once as big integers.
# Only the chaining of the rows (4 lookups per row) stays a Python loop, so
# Python does per W bytes what the word loop does per 4. Measured ~8x the
# word loop at 128 KiB (docs/crc32c.md).

_LITTLE_ENDIAN = sys.byteorder == "little"
# (minimum input length, row width), longest first. Wider rows mean fewer rows to
# chain in Python but more translate calls per input: each width wins in its range
# (measured on x86-64, CPython 3.11); below the last, the word loop wins.
_ROW_WIDTHS = ((65536, 256), (8192, 64), (1024, 32), (256, 16))


def _shift_tables(count: int) -> list[list[int]]:
    """tables[k][b]: the register after byte b followed by k zero bytes, starting from 0."""
    first = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ POLYNOMIAL_REVERSED if crc & 1 else crc >> 1
        first.append(crc)
    tables = [first]
    for _ in range(1, count):
        prev = tables[-1]
        tables.append([(v >> 8) ^ first[v & 0xFF] for v in prev])
    return tables


_T0, _T1, _T2, _T3 = _shift_tables(4)


def _crc_words(view: memoryview, crc: int) -> int:
    """Slicing-by-4 over `view` (format "B"), from register `crc`; returns the register.
    (A big-endian machine takes the byte loop: its native words are the wrong way round.)"""
    t0, t1, t2, t3 = _T0, _T1, _T2, _T3
    whole = view.nbytes & ~3
    if whole and _LITTLE_ENDIAN:
        for w in view[:whole].cast("I"):
            w ^= crc
            crc = t3[w & 0xFF] ^ t2[w >> 8 & 0xFF] ^ t1[w >> 16 & 0xFF] ^ t0[w >> 24]
    else:
        whole = 0
    for b in view[whole:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


@cache
def _row_tables(width: int) -> tuple[list[tuple[bytes, bytes, bytes, bytes]], list[list[int]]]:
    """For rows of `width` bytes: per column, the 4 byte lanes of its table as translate
    tables; and the 4 tables that push a register through a whole row."""
    shifted = _shift_tables(width)
    lanes = []
    for column in range(width):
        table = shifted[width - 1 - column]
        lanes.append(
            (
                bytes(v & 0xFF for v in table),
                bytes(v >> 8 & 0xFF for v in table),
                bytes(v >> 16 & 0xFF for v in table),
                bytes(v >> 24 for v in table),
            )
        )
    return lanes, [shifted[width - 1 - i] for i in range(4)]


def _crc_rows(data: bytes, crc: int, width: int) -> int:
    """The register after `data` (a whole number of rows of `width` bytes), from `crc`."""
    lanes, (g0, g1, g2, g3) = _row_tables(width)
    rows = len(data) // width
    from_bytes = int.from_bytes
    a = b = c = d = 0
    for column in range(width):
        cells = data[column::width]
        l0, l1, l2, l3 = lanes[column]
        a ^= from_bytes(cells.translate(l0), "little")
        b ^= from_bytes(cells.translate(l1), "little")
        c ^= from_bytes(cells.translate(l2), "little")
        d ^= from_bytes(cells.translate(l3), "little")
    # Interleave the four lanes into one little-endian 32-bit word per row.
    words = bytearray(4 * rows)
    for lane, value in enumerate((a, b, c, d)):
        words[lane::4] = value.to_bytes(rows, "little")
    row_values: Iterable[int] = (
        memoryview(words).cast("I")
        if _LITTLE_ENDIAN
        else (v for (v,) in struct.iter_unpack("<I", words))
    )
    for v in row_values:
        crc = g0[crc & 0xFF] ^ g1[crc >> 8 & 0xFF] ^ g2[crc >> 16 & 0xFF] ^ g3[crc >> 24] ^ v
    return crc


def crc32c_software(data: Buffer, value: int = 0) -> int:
    """CRC32C in pure Python; same results as the accelerated `crc32c`."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    crc = (value & _MASK) ^ _MASK
    n = view.nbytes
    for minimum, width in _ROW_WIDTHS:
        if n >= minimum:
            body = n - n % width
            crc = _crc_rows(view[:body].tobytes(), crc, width)
            view = view[body:]
            break
    return _crc_words(view, crc) ^ _MASK


# -- selection -----------------------------------------------------------------------------------


def _crc32c_rs() -> tuple[Callable[[Buffer], int], str]:
    import crc32c_rs

    # Picks the fastest code for the CPU at run time (CRC32 and carry-less multiply
    # instructions, AVX-512 where present), falling back to its own tables.
    return crc32c_rs.crc32c, f"crc32c-rs {_version('crc32c-rs')}"


def _crc32c() -> tuple[Callable[[Buffer], int], str]:
    import crc32c

    # Without the CPU instructions the package runs its own C table loop: still far
    # faster than ours, but say so.
    kind = "hardware" if getattr(crc32c, "hardware_based", False) else "software C"
    return crc32c.crc32c, f"crc32c {_version('crc32c')} ({kind})"


# In order of preference (measured: docs/crc32c.md). Only the first is a dependency
# of pynvmf; the ICRAR `crc32c` package is used where it is installed and the first
# is not (e.g. a platform without a crc32c-rs wheel).
ACCELERATED_LOADERS: tuple[Callable[[], tuple[Callable[[Buffer], int], str]], ...] = (
    _crc32c_rs,
    _crc32c,
)


def _version(distribution: str) -> str:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:  # metadata is informative only; never fail the import over it
        return "?"


def _load_accelerated() -> tuple[Callable[[Buffer], int], str] | None:
    for loader in ACCELERATED_LOADERS:
        # Not installed, a broken build, an API that changed: whatever goes wrong with
        # an optional accelerator, the next one (or the fallback) still gives digests.
        try:
            fn, name = loader()
            works = fn(b"123456789") == CHECK_VALUE and fn(memoryview(bytearray(9))) == _ZEROS9
        except Exception:
            continue
        if works:
            return fn, name
    return None


_accelerated = _load_accelerated()
ACCELERATED = _accelerated is not None
crc32c: Callable[[Buffer], int]
if _accelerated is not None:
    crc32c, IMPLEMENTATION = _accelerated
else:
    crc32c, IMPLEMENTATION = crc32c_software, "pure-Python fallback"


def digest(data: Buffer) -> bytes:
    """The 4 digest bytes that follow a PDU header or its data (the CRC, little endian)."""
    return crc32c(data).to_bytes(4, "little")
