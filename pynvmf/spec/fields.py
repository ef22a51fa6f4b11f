"""The one codec of spec/'s fixed-layout data structures (Identify data, log pages).

What it decides: a structure on the wire is a :class:`Layout`, a size in bytes and a
table of fields ``(name, byte offset, kind)``. The one table drives both directions, so
encoding and decoding cannot drift apart:

- encoding writes each field's value at its offset into a zeroed buffer of the layout's
  size, so reserved and vendor specific areas are zero; the values come from a
  dataclass's attributes or from a mapping;
- decoding reads each field back into a ``{name: value}`` dict, from which the
  structure's dataclass is built; bytes outside the fields are ignored, and a buffer
  shorter than the layout raises ValueError.

A structure declares each field once, as a dataclass attribute with its offset and
kind (:func:`at`); :func:`structure` builds the class's LAYOUT from them and
:class:`Structure` gives it ``pack``, ``pack_into`` and ``unpack``.

The kinds are the ones NVMe structures use: little-endian unsigned integers of 1, 2, 3
(an IEEE OUI), 4, 8 and 16 bytes; ASCII strings (left justified, space padded, not
terminated); NQNs (NUL terminated UTF-8 in a fixed field); opaque byte strings of an
exact length; arrays of a fixed number of entries of one kind, whose entries in use a
0's based count field may give (NPSS, NLBAF), or that end at their first zero entry
(NSID lists); and nested structures. A table is checked when it is built: every field
inside the size, none overlapping another. A value that does not fit raises ValueError
naming the structure and the field.

Pages of a variable length (descriptor lists, the ANA log, the Error Information and
Discovery logs' runs of entries) are assembled by their own modules from layouts of
their fixed parts. The PDU headers of the I/O path keep their precompiled ``struct``
formats (spec/pdu.py): they are decoded per command, these structures per admin command.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, Self, TypeVar

Buffer = bytes | bytearray | memoryview


class Kind(Protocol):
    """How one field's value becomes its bytes and back."""

    @property
    def size(self) -> int: ...

    def put(self, buf: bytearray, offset: int, value: Any) -> None: ...

    def get(self, data: Buffer, offset: int) -> Any: ...


class Int:
    """A little-endian unsigned integer of a size `struct` has a format for."""

    __slots__ = ("_st", "fmt", "size")
    default = 0

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._st = struct.Struct("<" + fmt)
        self.size = self._st.size

    def put(self, buf: bytearray, offset: int, value: int) -> None:
        self._st.pack_into(buf, offset, value)

    def get(self, data: Buffer, offset: int) -> int:
        value: int = self._st.unpack_from(data, offset)[0]
        return value


class _Split:
    """An integer wider than `struct`'s formats: a low and a high part, low first."""

    __slots__ = ("_bits", "_low_bits", "_low_mask", "_st", "size")
    default = 0

    def __init__(self, fmt: str, low_bits: int) -> None:
        self._st = struct.Struct("<" + fmt)
        self.size = self._st.size
        self._bits = self.size * 8
        self._low_mask = (1 << low_bits) - 1
        self._low_bits = low_bits

    def put(self, buf: bytearray, offset: int, value: int) -> None:
        if not 0 <= value < 1 << self._bits:
            raise ValueError(f"{value:#x} does not fit in {self._bits} bits")
        self._st.pack_into(buf, offset, value & self._low_mask, value >> self._low_bits)

    def get(self, data: Buffer, offset: int) -> int:
        low, high = self._st.unpack_from(data, offset)
        result: int = low | high << self._low_bits
        return result


U8 = Int("B")
U16 = Int("H")
U32 = Int("I")
U64 = Int("Q")
U24 = _Split("HB", 16)  # the IEEE OUI
U128 = _Split("QQ", 64)  # capacities and counters the spec sizes at 128 bits


class _Bytes:
    """A fixed-size byte field; `struct` bounds-checks it against the buffer."""

    __slots__ = ("_st", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._st = struct.Struct(f"{size}s")  # packing pads with NULs

    def _raw(self, data: Buffer, offset: int) -> bytes:
        raw: bytes = self._st.unpack_from(data, offset)[0]
        return raw


class Ascii(_Bytes):
    """An NVMe "ASCII string": left justified, space padded, not terminated.

    `empty_is_zero`: an empty string is all zero bytes rather than spaces (the Firmware
    Slot log's empty slots).
    """

    __slots__ = ("_empty_is_zero",)
    default = ""

    def __init__(self, size: int, *, empty_is_zero: bool = False) -> None:
        super().__init__(size)
        self._empty_is_zero = empty_is_zero

    def put(self, buf: bytearray, offset: int, value: str) -> None:
        raw = value.encode("ascii")
        if len(raw) > self.size:
            raise ValueError(f"{value!r} is longer than {self.size} bytes")
        if raw or not self._empty_is_zero:
            raw = raw.ljust(self.size, b" ")
        self._st.pack_into(buf, offset, raw)

    def get(self, data: Buffer, offset: int) -> str:
        # Some controllers (and Linux's TRADDR/TRSVCID) NUL-pad these despite the spec.
        return self._raw(data, offset).rstrip(b" \x00").decode("ascii", errors="replace")


class Nqn(_Bytes):
    """An NQN field: NUL terminated UTF-8 in a fixed-size field."""

    __slots__ = ()
    default = ""

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)

    def put(self, buf: bytearray, offset: int, value: str) -> None:
        raw = value.encode("utf-8")
        # Keep room for the terminator: hosts copy these with C string functions.
        if len(raw) >= self.size:
            raise ValueError(f"NQN is {len(raw)} bytes, at most {self.size - 1} fit")
        self._st.pack_into(buf, offset, raw)

    def get(self, data: Buffer, offset: int) -> str:
        raw = self._raw(data, offset)
        return raw.split(b"\x00", 1)[0].decode("utf-8", errors="replace")


class Raw(_Bytes):
    """Opaque bytes (GUIDs, EUI-64, TSAS) that must be exactly `size` long."""

    __slots__ = ()

    @property
    def default(self) -> bytes:
        return bytes(self.size)

    def put(self, buf: bytearray, offset: int, value: bytes) -> None:
        if len(value) != self.size:
            raise ValueError(f"expected {self.size} bytes, got {len(value)}")
        self._st.pack_into(buf, offset, bytes(value))

    def get(self, data: Buffer, offset: int) -> bytes:
        return self._raw(data, offset)


class Array:
    """`count` entries of one kind back to back. Encoding takes up to `count` values
    (exactly `count` when `exact`) and leaves the entries after them zero; decoding
    returns all `count` entries, or as many as the field `counted_by` says.

    `counted_by` names the structure's 0's based count of the entries in use (NPSS,
    NLBAF): the structure derives it from the list's length (a property encoding
    reads), and its layout decodes it into the list's length rather than into a value.
    """

    __slots__ = ("_bulk", "count", "counted_by", "exact", "kind", "size")

    def __init__(
        self, kind: Kind, count: int, *, exact: bool = False, counted_by: str | None = None
    ) -> None:
        self.kind = kind
        self.count = count
        self.exact = exact
        self.counted_by = counted_by
        self.size = kind.size * count
        # Integer arrays (NSID lists, command effects) go through struct in one call.
        self._bulk = struct.Struct(f"<{count}{kind.fmt}") if isinstance(kind, Int) else None

    def put(self, buf: bytearray, offset: int, value: Sequence[Any]) -> None:
        if len(value) > self.count or (self.exact and len(value) != self.count):
            wanted = "exactly" if self.exact else "at most"
            raise ValueError(f"{len(value)} entries, {wanted} {self.count} fit")
        if self._bulk is not None:
            padding = [0] * (self.count - len(value))
            self._bulk.pack_into(buf, offset, *value, *padding)
            return
        step = self.kind.size
        for i, item in enumerate(value):
            try:
                self.kind.put(buf, offset + i * step, item)
            except (struct.error, ValueError, TypeError) as exc:
                raise ValueError(f"[{i}]: {exc}") from exc

    def get(self, data: Buffer, offset: int, used: int | None = None) -> list[Any]:
        if self._bulk is not None:
            return list(self._bulk.unpack_from(data, offset))[:used]
        step = self.kind.size
        count = self.count if used is None else min(used, self.count)
        return [self.kind.get(data, offset + i * step) for i in range(count)]


class ZeroTerminated(Array):
    """An Array of identifiers that ends at the first zero entry (the NSID lists): a zero
    among the values would end the list early, so encoding refuses it."""

    __slots__ = ()

    def put(self, buf: bytearray, offset: int, value: Sequence[Any]) -> None:
        if 0 in value:
            raise ValueError("a zero entry would terminate the list early")
        super().put(buf, offset, value)

    def get(self, data: Buffer, offset: int) -> list[Any]:
        values = super().get(data, offset)
        return values[: values.index(0)] if 0 in values else values


Field = tuple[str, int, Kind]


class Layout:
    """A structure's size and its table of fields, checked when built."""

    __slots__ = ("_counted", "_int_names", "_ints", "_plain", "fields", "name", "size")

    def __init__(self, name: str, size: int, fields: Sequence[Field]) -> None:
        self.name = name
        self.size = size
        self.fields = tuple(fields)
        spans = sorted((offset, offset + kind.size, field) for field, offset, kind in fields)
        for (_, end, field), (start, _, following) in itertools.pairwise(spans):
            if end > start:
                raise ValueError(f"{name}: {field} overlaps {following}")
        if spans and (spans[0][0] < 0 or spans[-1][1] > size):
            raise ValueError(f"{name}: fields run outside its {size} bytes")
        # (array field, its offset, the array, its count's offset and kind)
        self._counted: list[tuple[str, int, Array, int, Kind]] = []
        by_name = {field: (offset, kind) for field, offset, kind in self.fields}
        for field, offset, kind in self.fields:
            if isinstance(kind, Array) and kind.counted_by is not None:
                if kind.counted_by not in by_name:
                    raise ValueError(f"{name}: {field} is counted by a field it does not have")
                self._counted.append((field, offset, kind, *by_name[kind.counted_by]))
        skipped = {f[0] for f in self._counted} | {f[2].counted_by for f in self._counted}
        self._plain = tuple(f for f in self.fields if f[0] not in skipped)
        # A layout of integers only (descriptors, entries, headers) is also one struct
        # format: Identify decodes arrays of 32 and 64 of them with each page.
        self._ints: struct.Struct | None = None
        self._int_names: tuple[str, ...] = ()
        by_offset = sorted(self.fields, key=lambda f: f[1])
        formats = [kind.fmt for _, _, kind in by_offset if isinstance(kind, Int)]
        if len(formats) == len(by_offset):
            fmt, end = "<", 0
            for (_, offset, kind), piece in zip(by_offset, formats, strict=True):
                fmt += f"{offset - end}x{piece}" if offset > end else piece
                end = offset + kind.size
            self._ints = struct.Struct(fmt)
            self._int_names = tuple(field for field, _, _ in by_offset)

    def encode(self, source: object) -> bytes:
        """The structure's bytes from `source`'s attributes (or keys, for a mapping)."""
        buf = bytearray(self.size)
        self.encode_into(buf, 0, source)
        return bytes(buf)

    def encode_into(self, buf: bytearray, offset: int, source: object) -> None:
        value_of: Callable[[str], Any] = (
            source.__getitem__ if isinstance(source, Mapping) else source.__getattribute__
        )
        if self._ints is not None:
            try:
                self._ints.pack_into(buf, offset, *map(value_of, self._int_names))
                return
            except struct.error:
                pass  # encoded field by field below, to name the field that does not fit
        for field, at, kind in self.fields:
            try:
                kind.put(buf, offset + at, value_of(field))
            except (struct.error, ValueError, TypeError, OverflowError) as exc:
                raise ValueError(f"{self.name}.{field}: {exc}") from exc

    def decode(self, data: Buffer, offset: int = 0) -> dict[str, Any]:
        """Every field's value, by name; ValueError when `data` ends before the layout."""
        if len(data) < offset + self.size:
            raise ValueError(f"{self.name} needs {self.size} bytes, got {len(data) - offset}")
        if self._ints is not None:
            return dict(zip(self._int_names, self._ints.unpack_from(data, offset), strict=True))
        values = {field: kind.get(data, offset + at) for field, at, kind in self._plain}
        for field, at, array, count_at, count_kind in self._counted:
            used = count_kind.get(data, offset + count_at) + 1  # a 0's based count
            values[field] = array.get(data, offset + at, used)
        return values


class Record:
    """A nested structure as a field: a Structure class, encoded and decoded by its layout."""

    __slots__ = ("factory", "layout", "size")

    def __init__(self, factory: type[Structure]) -> None:
        self.layout = factory.LAYOUT
        self.factory = factory
        self.size = self.layout.size

    def put(self, buf: bytearray, offset: int, value: object) -> None:
        self.layout.encode_into(buf, offset, value)

    def get(self, data: Buffer, offset: int) -> Any:
        return self.factory(**self.layout.decode(data, offset))


class Structure:
    """Base of a dataclass whose every attribute is a field of its LAYOUT: pack and
    unpack are the layout's encode and decode."""

    __slots__ = ()
    LAYOUT: ClassVar[Layout]
    SIZE: ClassVar[int]

    def pack(self) -> bytes:
        return self.LAYOUT.encode(self)

    def pack_into(self, buf: bytearray, offset: int) -> None:
        self.LAYOUT.encode_into(buf, offset, self)

    @classmethod
    def unpack(cls, data: Buffer, offset: int = 0) -> Self:
        return cls(**cls.LAYOUT.decode(data, offset))


T = TypeVar("T", bound=Structure)
_AT = "pynvmf.spec.fields.at"  # where at() keeps a field's offset and kind
_KIND_DEFAULT: Any = object()


def at(
    offset: int,
    kind: Kind,
    default: Any = _KIND_DEFAULT,
    *,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass attribute that is a field of the structure: its byte offset and kind.

    The default is the kind's zero (0, "", all-zero bytes) unless `default` is given;
    an array's default is built by `factory`.
    """
    metadata = {_AT: (offset, kind)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if default is _KIND_DEFAULT:
        default = kind.default  # type: ignore[attr-defined]
    return dataclasses.field(default=default, metadata=metadata)


def structure(size: int, *derived: Field) -> Callable[[type[T]], type[T]]:
    """Class decorator, placed above ``@dataclass``: the class's LAYOUT, `size` bytes,
    from its attributes declared with :func:`at` and the `derived` fields (counts the
    class computes as properties from its lists' lengths), and its SIZE."""

    def build(cls: type[T]) -> type[T]:
        table = [(f.name, *f.metadata[_AT]) for f in dataclasses.fields(cls) if _AT in f.metadata]
        cls.LAYOUT = Layout(cls.__name__, size, (*table, *derived))
        cls.SIZE = size
        return cls

    return build
