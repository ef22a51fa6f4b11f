"""The ports IANA assigned to NVMe over Fabrics: what a host connects to and a
target listens on unless told otherwise."""

from __future__ import annotations

NVME_TCP_PORT = 4420  # NVMe/TCP I/O controllers
DISCOVERY_PORT = 8009  # NVMe/TCP discovery controllers
# NVMe/RDMA (RDMA CM port space TCP): 4420 for I/O and discovery controllers alike, as
# nvmet-rdma and nvme-cli use it.
NVME_RDMA_PORT = 4420
