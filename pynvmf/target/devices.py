"""The target's block devices, by name: what namespaces are served from.

SPDK calls them bdevs and keeps them apart from namespaces (a bdev outlives the
namespace on it); the Linux target opens a namespace's device_path for that one
namespace and closes it with it. A NamedDevice can be either: `owned` marks one
that was opened for a single namespace and goes away with it.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pynvmf.block.device import BlockDevice
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice

# No Ceph import: pynvmf.block.rbd loads the bindings only when an image is opened.
from pynvmf.block.rbd import RbdDevice

if TYPE_CHECKING:
    from pynvmf.target.qos_gate import QosGate

log = logging.getLogger(__name__)

MEMORY = "memory"
FILE = "file"
RBD = "rbd"  # a Ceph RBD image (pynvmf.block.rbd)
OTHER = "other"  # any other BlockDevice: served, but no configuration format can recreate it


@dataclass(eq=False)
class NamedDevice:
    name: str
    device: BlockDevice
    kind: str = OTHER
    # A file's or block device's path (kind FILE).
    path: str = ""
    # An identity of its own (SPDK's bdev UUID): namespaces on it take it as their UUID
    # and NGUID unless they are given theirs. None: namespaces derive theirs.
    uuid: uuid.UUID | None = None
    owned: bool = False
    # Its rate limits (SPDK's bdev QoS), set by Target.set_qos_limits; None: none.
    qos: QosGate | None = field(default=None, repr=False, compare=False)

    @classmethod
    def wrap(
        cls,
        name: str,
        device: BlockDevice,
        *,
        device_uuid: uuid.UUID | None = None,
        owned: bool = False,
    ) -> NamedDevice:
        """A NamedDevice for `device`, its kind and path found from what it is."""
        if isinstance(device, MemoryDevice):
            return cls(name, device, MEMORY, uuid=device_uuid, owned=owned)
        if isinstance(device, FileDevice):
            path = os.path.realpath(device.path)
            return cls(name, device, FILE, path, uuid=device_uuid, owned=owned)
        if isinstance(device, RbdDevice):
            return cls(name, device, RBD, uuid=device_uuid, owned=owned)
        return cls(name, device, OTHER, uuid=device_uuid, owned=owned)

    @property
    def identity_key(self) -> str:
        """What backs the device, as namespace identities are derived from it: stable
        across restarts for a file, the same for every memory device."""
        if self.kind == FILE:
            return f"file:{self.path}"
        if self.kind == RBD:
            # The same on every gateway that serves the image: a multipath host groups
            # paths by the namespace identities derived from this.
            dev = self.device
            assert isinstance(dev, RbdDevice)
            return f"rbd:{dev.fsid}/{dev.pool}/{dev.image_name}"
        return self.kind

    @property
    def block_size(self) -> int:
        return self.device.capabilities.block_size

    @property
    def num_blocks(self) -> int:
        return self.device.capabilities.num_blocks

    @property
    def read_only(self) -> bool:
        if isinstance(self.device, RbdDevice):
            return self.device.read_only
        return isinstance(self.device, FileDevice) and self.device.read_only


async def close_device(entry: NamedDevice) -> None:
    """Flush and close a device the target no longer serves; a flush that fails (storage
    gone) is logged, and the device is closed all the same."""
    try:
        await entry.device.flush()
    except OSError as exc:
        log.error("flushing %s failed: %s", entry.name, exc)
    await entry.device.close()
