"""The TCP ports IANA assigned to NVMe over Fabrics: what a host connects to and a
target listens on unless told otherwise."""

from __future__ import annotations

NVME_TCP_PORT = 4420  # NVMe/TCP I/O controllers
DISCOVERY_PORT = 8009  # NVMe/TCP discovery controllers
