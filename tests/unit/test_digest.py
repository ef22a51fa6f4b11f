"""CRC32C for NVMe/TCP digests: known vectors, byte order, accelerated vs fallback.

Byte order: RFC 3720 (appendix B.4) prints each example's CRC as the bytes sent
on the wire, lowest-order byte first: 32 zero bytes give "aa 36 91 8a", which
is the number 0x8A9136AA that CRC catalogues list. NVMe/TCP digests use the same
order (the CRC as a little-endian 32-bit field), so `digest()` must produce the
RFC's bytes exactly and `crc32c()` the catalogue's numbers.
"""

from __future__ import annotations

import importlib.util
import os
import random
import struct
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynvmf.tcp import digest as D

Crc = Callable[[bytes | bytearray | memoryview], int]

IMPLEMENTATIONS: dict[str, Crc] = {"in use": D.crc32c, "fallback": D.crc32c_software}

READ10_PDU = bytes.fromhex(
    "01c00000 00000000 00000000 00000000 14000000 00000400"
    " 00000014 00000018 28000000 00000000 02000000 00000000"
)

# (data, the CRC as a number, the RFC's CRC bytes in wire order)
RFC3720_VECTORS = [
    pytest.param(bytes(32), 0x8A9136AA, "aa 36 91 8a", id="32 zeros"),
    pytest.param(b"\xff" * 32, 0x62A8AB43, "43 ab a8 62", id="32 0xff"),
    pytest.param(bytes(range(32)), 0x46DD794E, "4e 79 dd 46", id="incrementing"),
    pytest.param(bytes(range(31, -1, -1)), 0x113FDB5C, "5c db 3f 11", id="decrementing"),
    # The iSCSI SCSI Read (10) command PDU of B.4 (48 bytes).
    pytest.param(READ10_PDU, 0xD9963A56, "56 3a 96 d9", id="iSCSI read PDU"),
]

# crc32c(data + digest(data)) for any data: the CRC-32C residue (0xB798B438 in the
# catalogue, before the final complement).
RESIDUE = 0xB798B438 ^ 0xFFFFFFFF


def crc32c_bitwise(data: bytes, value: int = 0) -> int:
    """The textbook bit-at-a-time definition: an oracle independent of every table."""
    crc = value ^ 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def crc(request: pytest.FixtureRequest) -> Crc:
    return IMPLEMENTATIONS[request.param]


@pytest.mark.parametrize(("data", "number", "wire"), RFC3720_VECTORS)
def test_rfc3720_vectors(crc: Crc, data: bytes, number: int, wire: str) -> None:
    assert crc(data) == number
    assert number.to_bytes(4, "little") == bytes.fromhex(wire)
    assert crc32c_bitwise(data) == number


@pytest.mark.parametrize(("data", "number", "wire"), RFC3720_VECTORS)
def test_digest_bytes_are_the_rfc_wire_bytes(data: bytes, number: int, wire: str) -> None:
    assert D.digest(data) == bytes.fromhex(wire)
    assert D.digest(data) == struct.pack("<I", number)


def test_check_value(crc: Crc) -> None:
    assert crc(b"123456789") == 0xE3069283 == D.CHECK_VALUE
    assert crc(b"") == 0


def test_digest_is_the_crc_little_endian_and_verifies_by_residue() -> None:
    rng = random.Random(7)
    for n in (0, 1, 24, 72, 4096):
        data = rng.randbytes(n)
        d = D.digest(data)
        assert len(d) == 4 and int.from_bytes(d, "little") == D.crc32c(data)
        # A receiver may run the CRC over data and digest together.
        assert D.crc32c(data + d) == RESIDUE
    assert D.RESIDUE == RESIDUE  # the constant the reader checks against


def test_buffer_types(crc: Crc) -> None:
    data = os.urandom(5000)
    expected = crc32c_bitwise(data[3:4099])
    backing = bytearray(data)
    assert crc(memoryview(backing)[3:4099]) == expected  # writable slice, as framing passes
    assert crc(bytes(data[3:4099])) == expected
    assert crc(bytearray(data[3:4099])) == expected
    assert crc(memoryview(data)[3:4099]) == expected
    assert crc(memoryview(bytearray(data[4:4100])).cast("I")) == crc32c_bitwise(data[4:4100])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1100), st.integers(0, 0xFFFFFFFF))
def test_fallback_matches_bitwise_definition(data: bytes, value: int) -> None:
    assert D.crc32c_software(data, value) == crc32c_bitwise(data, value)


@settings(max_examples=200, deadline=None)
@given(
    length=st.one_of(
        st.integers(0, 600),
        st.integers(600, 20000),
        st.sampled_from([255, 256, 1023, 1024, 8191, 8192, 65535, 65536, 65537]),
        st.integers(65536, 300_000),
    ),
    start=st.integers(0, 15),
    seed=st.integers(0, 2**32),
)
def test_in_use_matches_fallback(length: int, start: int, seed: int) -> None:
    """Every path of the fallback (word loop and each row width, with ragged ends) against
    the implementation in use, on memoryview slices at every alignment."""
    data = bytearray(random.Random(seed).randbytes(start + length))
    view = memoryview(data)[start:]
    assert D.crc32c_software(view) == D.crc32c(view)
    split = length // 3
    assert D.crc32c_software(view[split:], D.crc32c_software(view[:split])) == D.crc32c(view)


def test_accelerated_is_in_use_when_installed() -> None:
    assert (D.crc32c is not D.crc32c_software) == D.ACCELERATED
    if importlib.util.find_spec("crc32c_rs") is not None:
        assert D.IMPLEMENTATION.startswith("crc32c-rs ")


# -- selection, with the accelerated packages hidden --------------------------------------------


def load_digest_module(monkeypatch: pytest.MonkeyPatch, **modules: object) -> ModuleType:
    """A fresh copy of pynvmf.tcp.digest, imported with sys.modules patched: a None entry
    makes that import fail as if the package were not installed. The copy is separate,
    so the module every other import uses stays as it is."""
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.find_spec("pynvmf.tcp.digest")
    assert spec is not None and spec.origin is not None
    copy_spec = importlib.util.spec_from_file_location("_digest_under_test", spec.origin)
    assert copy_spec is not None and copy_spec.loader is not None
    module = importlib.util.module_from_spec(copy_spec)
    copy_spec.loader.exec_module(module)
    return module


def test_fallback_when_no_accelerated_package_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    m = load_digest_module(monkeypatch, crc32c_rs=None, crc32c=None)
    assert m.ACCELERATED is False
    assert m.IMPLEMENTATION == "pure-Python fallback"
    assert m.crc32c is m.crc32c_software
    rng = random.Random(3)
    for n in (0, 1, 24, 72, 512, 4096, 70000):
        data = memoryview(bytearray(rng.randbytes(n + 1)))[1:]
        assert m.crc32c(data) == D.crc32c(data)
        assert m.digest(data) == D.digest(data)
    assert m.digest(bytes(32)) == bytes.fromhex("aa36918a")


def test_second_choice_when_first_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("crc32c")
    m = load_digest_module(monkeypatch, crc32c_rs=None)
    assert m.ACCELERATED is True
    assert m.IMPLEMENTATION.startswith("crc32c ")
    assert m.crc32c(b"123456789") == 0xE3069283


def _wrong(data: object, value: int = 0) -> int:
    return 0


def _refuses_writable(data: object, value: int = 0) -> int:
    if isinstance(data, memoryview) and not data.readonly:
        raise TypeError("read-only buffer required")
    return D.crc32c_software(data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "attributes",
    [{"crc32c": _wrong}, {"crc32c": _refuses_writable}, {}],
    ids=["wrong results", "refuses writable buffers", "API changed"],
)
def test_a_broken_accelerated_package_is_not_trusted(
    monkeypatch: pytest.MonkeyPatch, attributes: dict[str, object]
) -> None:
    broken = ModuleType("crc32c_rs")
    for name, value in attributes.items():
        setattr(broken, name, value)
    m = load_digest_module(monkeypatch, crc32c_rs=broken, crc32c=None)
    assert m.ACCELERATED is False and m.crc32c is m.crc32c_software


def test_fallback_portable_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code a big-endian machine runs (no native word casts) gives the same results."""
    m = load_digest_module(monkeypatch)
    monkeypatch.setattr(m, "_LITTLE_ENDIAN", False)
    rng = random.Random(5)
    for n in (0, 3, 24, 300, 5000, 70001):
        data = rng.randbytes(n)
        assert m.crc32c_software(data) == D.crc32c(data)
