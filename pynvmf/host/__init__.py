"""The NVMe/TCP and NVMe/RDMA host library: connect to a remote controller, use its namespaces
as BlockDevices, discover subsystems."""

from pynvmf.host.controller import Controller, connect
from pynvmf.host.discovery import connect_entry, discover, entry_trtype, read_discovery_log
from pynvmf.host.errors import (
    NvmeAuthenticationError,
    NvmeConnectionError,
    NvmeConnectRejected,
    NvmeError,
    NvmeStatusError,
    NvmeTimeoutError,
    NvmeTransportUnavailableError,
    NvmeUnsupportedError,
)
from pynvmf.host.fabrics import HostIdentity
from pynvmf.host.namespace import RemoteNamespace
from pynvmf.spec.logpages import DiscoveryLogEntry

__all__ = [
    "Controller",
    "DiscoveryLogEntry",
    "HostIdentity",
    "NvmeAuthenticationError",
    "NvmeConnectRejected",
    "NvmeConnectionError",
    "NvmeError",
    "NvmeStatusError",
    "NvmeTimeoutError",
    "NvmeTransportUnavailableError",
    "NvmeUnsupportedError",
    "RemoteNamespace",
    "connect",
    "connect_entry",
    "discover",
    "entry_trtype",
    "read_discovery_log",
]
