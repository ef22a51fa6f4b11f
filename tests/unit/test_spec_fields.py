"""spec/fields.py, the one codec of Identify data and log pages: its kinds, its layout
checks, and every structure of identify.py, logpages.py and reservations.py through it
(sizes as the spec gives them, round trips with every field set, bytes pinned)."""

import dataclasses
import hashlib
import inspect
from types import ModuleType
from typing import Any

import pytest

from pynvmf.spec import identify, logpages, reservations
from pynvmf.spec.fields import (
    U8,
    U16,
    U24,
    U32,
    U128,
    Array,
    Ascii,
    Int,
    Layout,
    Nqn,
    Raw,
    Record,
    ZeroTerminated,
)

# The sizes NVMe Base 2.0 and NVMe over Fabrics 1.1 give each structure.
SPEC_SIZES: dict[type, int] = {
    identify.PowerStateDescriptor: 32,
    identify.IdentifyController: 4096,
    identify.LbaFormat: 4,
    identify.IdentifyNamespace: 4096,
    identify.NsIdList: 4096,
    identify.IdentifyNamespaceIndependent: 4096,
    identify.IdentifyControllerNvm: 4096,
    identify.IdentifyNamespaceNvm: 4096,
    identify.IoCommandSetList: 4096,
    logpages.ErrorLogEntry: 64,
    logpages.SmartLog: 512,
    logpages.FwSlotLog: 512,
    logpages.ChangedNsList: 4096,
    logpages.CmdEffectsLog: 4096,
    logpages.DiscoveryLogHeader: 1024,
    logpages.DiscoveryLogEntry: 1024,
    reservations.ReservationNotification: 64,
}

# The first half of the sha256 of each sample's bytes as the hand-written struct formats
# packed them before the structures moved onto the codec: the move changed no byte.
PACKED_SHA256: dict[type, str] = {
    identify.PowerStateDescriptor: "e97ec98cddf523d470cd1f5b92467fd0",
    identify.IdentifyController: "6c1208c3c86db832d7556a8afa295f94",
    identify.LbaFormat: "a3198b806abb79e9f1ba659e7ff06ed3",
    identify.IdentifyNamespace: "74dd9f75fcbbd989ec864822613bfb0e",
    identify.NsIdList: "49ba7f852b950820bbe7714de62d3868",
    identify.IdentifyNamespaceIndependent: "7006507bc30b36c0414e3c9778a484f9",
    identify.IdentifyControllerNvm: "e8464834e0c7b7a62b7b9831dfe1e700",
    identify.IdentifyNamespaceNvm: "c488e5f888ba3e53c32352736195163a",
    identify.IoCommandSetList: "68dc71e5c6cda5b11d4834a4c9a873a8",
    logpages.ErrorLogEntry: "86d5dedc24c4d298c54fdf40da816b9e",
    logpages.SmartLog: "b3b02197bff34262e7101ecac0e39aaa",
    logpages.FwSlotLog: "cead46f6704f8f469df4d713a3a5712e",
    logpages.ChangedNsList: "49ba7f852b950820bbe7714de62d3868",
    logpages.CmdEffectsLog: "fb2007b267397cecb641c6c44bd22681",
    logpages.DiscoveryLogHeader: "3a85d8a523fd7477293a747b1c1dc829",
    logpages.DiscoveryLogEntry: "0952ae454fcd77cf7ae7f9463a3a2180",
    reservations.ReservationNotification: "ae90e5b8858bc912a2f1ab9a1fbe47e4",
}


def structures(module: ModuleType) -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and isinstance(getattr(cls, "LAYOUT", None), Layout)
    ]


def test_every_structure_has_the_spec_size() -> None:
    found = structures(identify) + structures(logpages) + structures(reservations)
    assert set(found) == set(SPEC_SIZES), "a structure was added: give its spec size here"
    for cls, size in SPEC_SIZES.items():
        assert cls.LAYOUT.size == size, cls.__name__
        assert size == cls.SIZE, cls.__name__
        assert len(cls().pack()) == size, cls.__name__


def value_for(kind: Any, seed: int) -> Any:
    """A value of `kind`, non-zero and different for each seed, that fits."""
    if isinstance(kind, ZeroTerminated):
        return [value_for(kind.kind, seed + i) for i in range(3)]
    if isinstance(kind, Array):
        return [value_for(kind.kind, seed + i) for i in range(kind.count)]
    if isinstance(kind, Record):
        return kind.factory(**sample_values(kind.factory, kind.layout, seed))
    if isinstance(kind, Ascii):
        return f"v{seed}"[: kind.size]
    if isinstance(kind, Nqn):
        return f"nqn.2014-08.org.example:{seed}"
    if isinstance(kind, Raw):
        return bytes((seed + i) % 255 + 1 for i in range(kind.size))
    # Integers: the top byte set too, so a field a byte too narrow would lose it.
    return (1 << (8 * kind.size - 1)) | (seed % 127 + 1)


def sample_values(cls: type, layout: Layout, seed: int = 1) -> dict[str, Any]:
    attributes = {f.name for f in dataclasses.fields(cls)}
    # Fields that are not attributes (NPSS, NLBAF) are properties derived from a list.
    # Each value is seeded by its offset: the same sample whatever the table's order.
    return {
        name: value_for(kind, seed + offset)
        for name, offset, kind in layout.fields
        if name in attributes
    }


def sample(cls: type) -> Any:
    obj = cls(**sample_values(cls, cls.LAYOUT))
    defaults = cls()
    for f in dataclasses.fields(cls):
        # Every attribute set: one the layout forgot would come back as its default.
        assert getattr(obj, f.name) != getattr(defaults, f.name), f"{cls.__name__}.{f.name}"
    return obj


@pytest.mark.parametrize("cls", list(SPEC_SIZES), ids=lambda cls: cls.__name__)
def test_round_trip_with_every_field_set(cls: type) -> None:
    obj = sample(cls)
    data = obj.pack()
    assert len(data) == SPEC_SIZES[cls]
    assert cls.unpack(data) == obj
    # Decoding keeps nothing but the fields: a second encoding is the same bytes.
    assert cls.unpack(data).pack() == data
    assert hashlib.sha256(data).hexdigest()[:32] == PACKED_SHA256[cls]


def test_layout_refuses_overlapping_and_outside_fields() -> None:
    with pytest.raises(ValueError, match="b overlaps c"):
        Layout("x", 8, (("a", 0, U16), ("b", 2, U32), ("c", 5, U8)))
    with pytest.raises(ValueError, match="outside"):
        Layout("x", 8, (("a", 6, U32),))
    with pytest.raises(ValueError, match="outside"):
        Layout("x", 8, (("a", -1, U8),))


def test_encode_names_structure_and_field() -> None:
    layout = Layout("Thing", 4, (("small", 0, U8), ("wide", 1, U16)))
    assert layout.encode({"small": 1, "wide": 0x0302}) == b"\x01\x02\x03\x00"
    with pytest.raises(ValueError, match=r"Thing\.wide"):
        layout.encode({"small": 1, "wide": 1 << 16})
    with pytest.raises(ValueError, match=r"Thing\.small"):
        layout.encode({"small": -1, "wide": 0})
    with pytest.raises(ValueError, match="Thing needs 4 bytes, got 3"):
        layout.decode(bytes(3))
    with pytest.raises(ValueError, match="Thing needs 4 bytes, got 2"):
        layout.decode(bytes(6), 4)


def test_wide_integers_are_little_endian_and_bounded() -> None:
    buf = bytearray(16)
    U24.put(buf, 0, 0xABCDEF)
    assert buf[:3] == b"\xef\xcd\xab"
    assert U24.get(buf, 0) == 0xABCDEF
    with pytest.raises(ValueError):
        U24.put(buf, 0, 1 << 24)
    U128.put(buf, 0, (1 << 127) | 5)
    assert buf == b"\x05" + bytes(14) + b"\x80"
    assert U128.get(buf, 0) == (1 << 127) | 5
    with pytest.raises(ValueError):
        U128.put(buf, 0, 1 << 128)
    with pytest.raises(ValueError):
        U128.put(buf, 0, -1)


def test_strings() -> None:
    buf = bytearray(8)
    Ascii(8).put(buf, 0, "ab")
    assert buf == b"ab      "
    # Controllers that NUL-pad are read the same.
    assert Ascii(8).get(b"ab\x00\x00\x00\x00\x00\x00", 0) == "ab"
    with pytest.raises(ValueError):
        Ascii(8).put(buf, 0, "x" * 9)
    with pytest.raises(UnicodeEncodeError):
        Ascii(8).put(buf, 0, "caf\u00e9")
    Ascii(8, empty_is_zero=True).put(buf, 0, "")
    assert buf == bytes(8)
    Nqn(8).put(buf, 0, "nqn.x")
    assert buf == b"nqn.x\x00\x00\x00"
    assert Nqn(8).get(buf, 0) == "nqn.x"
    with pytest.raises(ValueError, match="at most 7"):
        Nqn(8).put(buf, 0, "n" * 8)
    with pytest.raises(ValueError):
        Raw(4).put(buf, 0, b"abc")


def test_arrays() -> None:
    buf = bytearray(8)
    Array(U16, 4).put(buf, 0, [1, 2])
    assert buf == b"\x01\x00\x02\x00" + bytes(4)
    assert Array(U16, 4).get(buf, 0) == [1, 2, 0, 0]
    with pytest.raises(ValueError, match="at most 4"):
        Array(U16, 4).put(buf, 0, [1] * 5)
    with pytest.raises(ValueError, match="exactly 4"):
        Array(U16, 4, exact=True).put(buf, 0, [1] * 3)
    with pytest.raises(ValueError, match=r"\[1\]"):
        Array(Ascii(2), 4).put(buf, 0, ["a", "abc"])
    ids = ZeroTerminated(U16, 4)
    assert ids.get(b"\x01\x00\x02\x00\x00\x00\x03\x00", 0) == [1, 2]
    assert ids.get(b"\x01\x00\x02\x00\x03\x00\x04\x00", 0) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="terminate"):
        ids.put(buf, 0, [1, 0, 2])


def test_an_array_counted_by_a_field() -> None:
    # NPSS and NLBAF: a 0's based count the structure derives from its list's length.
    layout = Layout("Counted", 8, (("n", 0, U8), ("items", 2, Array(U16, 3, counted_by="n"))))
    data = layout.encode({"n": 1, "items": [7, 8]})
    assert data == b"\x01\x00\x07\x00\x08\x00\x00\x00"
    assert layout.decode(data) == {"items": [7, 8]}
    assert layout.decode(b"\x00" + bytes(7)) == {"items": [0]}
    # A count past the array reads the whole array, no further.
    assert layout.decode(b"\xff" + bytes(7)) == {"items": [0, 0, 0]}
    with pytest.raises(ValueError, match="counted by"):
        Layout("Uncounted", 8, (("items", 2, Array(U16, 3, counted_by="n")),))


def test_integer_only_layouts_name_the_field_that_does_not_fit() -> None:
    layout = Layout("Ints", 8, (("a", 0, U8), ("b", 4, U32)))
    assert isinstance(U32, Int)
    assert layout.encode({"a": 1, "b": 2}) == b"\x01" + bytes(3) + b"\x02" + bytes(3)
    assert layout.decode(b"\x01\xff\xff\xff\x02\x00\x00\x00") == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match=r"Ints\.b"):
        layout.encode({"a": 1, "b": 1 << 32})
