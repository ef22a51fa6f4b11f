"""The BlockDevice protocol: what every backend (and every remote namespace) offers.

A device declares its geometry and capabilities once, in `Capabilities`; callers
(the target's I/O handlers, later the copy planner) decide from those, never by
probing the device type.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Buffer = bytes | bytearray | memoryview


class BlockRangeError(ValueError):
    """An LBA range that does not lie inside the device."""


class StorageShrank(ValueError):
    """A rescan found the storage smaller than the size served: it was cut outside this
    process (a file truncated, an image resized with allow_shrink by another client), so
    the data past `size_bytes` (whole blocks) is gone already. The device still serves
    the old size: the target follows with the forced shrink's steps (quiesce, every
    process `serve_only(size_bytes)`), which cut nothing more."""

    def __init__(self, what: str, served: int, size_bytes: int) -> None:
        super().__init__(f"{what} shrank from {served} to {size_bytes} bytes")
        self.size_bytes = size_bytes


class StorageUnavailable(OSError):
    """The device's storage cannot be reached through this device, for now or for good:
    a network backend whose cluster does not answer, or whose client was fenced (a Ceph
    client on the OSD blocklist). Not a media error: the data is intact, and another
    path (another gateway, another client) may reach it. The target answers it with a
    path-related status, so that a multipath host retries on another path."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    block_size: int
    num_blocks: int
    # A write is only durable after flush() unless it was written with fua=True.
    volatile_write_cache: bool = False
    # Native support; a device without them gets the operation emulated by the caller.
    write_zeroes: bool = True
    deallocate: bool = True
    # Reads of deallocated blocks return zeroes (NVMe DLFEAT bits 2:0 = 001b).
    deallocated_reads_zero: bool = True
    # The device copies within itself without the data passing through the caller
    # (`NativeCopy.copy_within`); the copy planner (block.copy) decides from this.
    native_copy: bool = False

    @property
    def size(self) -> int:
        return self.block_size * self.num_blocks


@runtime_checkable
class BlockDevice(Protocol):
    """All ranges are in logical blocks of `capabilities.block_size` bytes.

    Every method raises BlockRangeError for a range that is not entirely inside
    the device, before touching any data, and OSError for a backend failure.
    """

    @property
    def capabilities(self) -> Capabilities: ...

    async def read(self, lba: int, buf: memoryview) -> None:
        """Fill `buf` (a whole number of blocks long) from `lba` onwards."""
        ...

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        """Write `data` (a whole number of blocks) at `lba`; with fua it is durable on return."""
        ...

    async def flush(self) -> None:
        """Make every completed write durable."""
        ...

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None: ...

    async def deallocate(self, lba: int, nblocks: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Resizable(Protocol):
    """A device whose size may change while it serves (growing here: made smaller only
    as a Shrinkable, when forced, since a host may hold data past a smaller end). Both
    return the new number of blocks and raise ValueError (or OSError: storage that did
    not answer), the size kept, for a size they cannot take. Coroutines, since the
    storage may be across a network (RBD); no I/O of the device sees a size between the
    old and the new."""

    async def rescan(self) -> int:
        """Take the size the storage has now (it grew outside this process). Storage
        found smaller (cut outside) is not taken here: StorageShrank, the size kept,
        since the other processes serving it must stop serving past the new end too."""
        ...

    async def grow(self, size_bytes: int) -> int:
        """Extend the storage to `size_bytes` and take that size."""
        ...


@runtime_checkable
class Shrinkable(Protocol):
    """A Resizable device that can also be made smaller: the blocks past the new end are
    dropped (a host's data there is lost), so the target only asks it when forced, with
    the device's I/O quiesced. Two steps, because other processes may serve the same
    storage (`--cores` workers): each of them first stops serving past the new end
    (`serve_only`), then one process cuts the storage (`shrink`), so that none touches
    storage that is gone (a mapping past the end of its memfd faults: SIGBUS; a write
    past the end of a file would extend it again). Both return the new number of blocks
    and raise ValueError, the size kept, for a size they cannot take (not whole blocks,
    not smaller, storage that cannot be cut here), OSError for storage that did not
    answer."""

    async def serve_only(self, size_bytes: int) -> int:
        """From now on serve the first `size_bytes` only (I/O past them: BlockRangeError),
        the storage left as it is: either it is cut next, or it was cut to them outside
        already (StorageShrank), which a device that cannot cut (a block device, a
        read-only file) follows too."""
        ...

    async def shrink(self, size_bytes: int) -> int:
        """`serve_only`, then cut the storage to `size_bytes`."""
        ...


# Called on the event loop's thread that added it, with no argument.
SizeListener = Callable[[], None]


@runtime_checkable
class GrowsOutside(Protocol):
    """A Resizable device whose storage others may grow while it serves (an RBD image
    another Ceph client resizes), and which hears of it: its listeners are called then
    (the target rescans it, block.device.Resizable)."""

    def add_size_listener(self, listener: SizeListener) -> None: ...

    def remove_size_listener(self, listener: SizeListener) -> None: ...


@runtime_checkable
class NativeCopy(Protocol):
    """A local device that copies within itself (capabilities.native_copy)."""

    async def copy_within(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> None:
        """Copy blocks inside the device, as memmove would: overlapping ranges are safe."""
        ...


@dataclass(frozen=True, slots=True)
class CopyLimits:
    """What one offloaded copy request may carry (NVMe MSSRL, MCL, MSRC + 1)."""

    max_range_blocks: int
    max_blocks: int
    max_ranges: int


@runtime_checkable
class CopyOffload(Protocol):
    """A device that takes multi-range copy requests and moves the data itself, without
    it passing through the caller (a remote namespace whose controller supports the
    NVMe Copy command; a linear device whose segments map onto such devices).

    The copy planner (block.copy) is the only caller: it splits requests to fit
    `copy_limits` and only passes sources for which `can_copy_from` is true.
    """

    @property
    def copy_limits(self) -> CopyLimits: ...

    def can_copy_from(self, source: BlockDevice) -> bool:
        """True if this device can copy data from `source` natively: the same device,
        or (NVMe TP 4130) another namespace of the same controller."""
        ...

    async def copy_offload(
        self, sources: Sequence[tuple[BlockDevice, int, int]], dst_lba: int, *, fua: bool = False
    ) -> None:
        """Copy (device, lba, nblocks) sources, in order, to consecutive blocks from
        dst_lba; within copy_limits, every source accepted by can_copy_from."""
        ...


@runtime_checkable
class CopyOne(Protocol):
    """A CopyOffload device that also takes one range of itself in one call: the common
    small copy, without the range objects and the checks a general request needs (a
    remote namespace: one Copy command with one descriptor).

    The copy planner calls it for a single range of the device copied within it that
    does not overlap its destination, both ranges inside the device.
    """

    async def copy_one(
        self, src_lba: int, dst_lba: int, nblocks: int, *, fua: bool = False
    ) -> bool:
        """Copy `nblocks` from `src_lba` to `dst_lba` with one request; False, having done
        nothing, if this device cannot take it so (over its limits, or it would first have
        to settle something): the planner then plans the copy."""
        ...


@runtime_checkable
class CopyPreparation(Protocol):
    """A CopyOffload device whose `can_copy_from` depends on something it has to settle
    with the device first, by I/O: a remote namespace may copy from another namespace
    of its controller only once the controller has enabled NVMe Copy descriptor formats
    2h/3h for the host, which it can refuse.

    The copy planner awaits `prepare_copy` with a copy's source devices before it asks
    `can_copy_from` about them, so that the answer is final when the plan is made.
    """

    async def prepare_copy(self, sources: Iterable[BlockDevice]) -> None:
        """Settle what copies from `sources` need. A refusal is not an error: it makes
        `can_copy_from` false for the sources concerned (their copies are emulated)."""
        ...


@dataclass(frozen=True, slots=True)
class Medium:
    """The storage a device's blocks are: block n of the device is the bytes from
    `offset + n * block_size` on of the storage that `keys` name.

    Devices whose media share a key are the same storage even as different objects (two
    FileDevices on one file, two RemoteNamespaces for one namespace reached through two
    controllers), and the copy planner treats them so. A storage may have several names
    (a namespace: its NQN and NSID, its NGUID), any one of which another device may
    share, so there are several keys and one in common is enough. A name that two
    different storages share only costs a copy between them staging memory; a storage
    whose devices do not share a name gets a copy between them corrupted: when in doubt,
    a key should be coarser.
    """

    keys: tuple[Hashable, ...]
    offset: int = 0  # in bytes


@runtime_checkable
class KnownMedium(Protocol):
    """A device that can say what storage it is. A device that cannot (neither this nor
    `MappedDevice`) is taken to be its own storage, shared with no other object."""

    @property
    def medium(self) -> Medium: ...


class Extent(Protocol):
    """`nblocks` blocks of `device` from `start_lba` on (a LinearDevice's Segment)."""

    @property
    def device(self) -> BlockDevice: ...

    @property
    def start_lba(self) -> int: ...

    @property
    def nblocks(self) -> int: ...


@runtime_checkable
class MappedDevice(Protocol):
    """A device whose blocks are blocks of other devices (a LinearDevice): what storage
    a range of it is depends on the range, so it has no single `medium`."""

    def map_range(self, lba: int, nblocks: int) -> Sequence[Extent]:
        """Where blocks [lba, lba + nblocks) live, in order: one extent per device piece."""
        ...


def check_range(caps: Capabilities, lba: int, nblocks: int) -> None:
    """Raise BlockRangeError unless [lba, lba + nblocks) lies inside the device."""
    if lba < 0 or nblocks < 0 or lba + nblocks > caps.num_blocks:
        raise BlockRangeError(
            f"blocks {lba}..{lba + nblocks} outside device of {caps.num_blocks} blocks"
        )


def block_shift(block_size: int) -> int:
    """log2 of `block_size`; ValueError unless it is a power of two >= 512."""
    if not isinstance(block_size, int) or block_size < 512 or block_size & (block_size - 1):
        raise ValueError(f"block size {block_size!r} is not a power of two >= 512")
    return block_size.bit_length() - 1
