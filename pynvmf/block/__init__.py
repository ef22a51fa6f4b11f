"""Block backends: the BlockDevice protocol and its local implementations."""

from pynvmf.block.device import BlockDevice, BlockRangeError, Capabilities
from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice

__all__ = ["BlockDevice", "BlockRangeError", "Capabilities", "FileDevice", "MemoryDevice"]
