"""SPDK-compatible RPC methods: SPDK's scripts/rpc.py drives pynvmf with them unchanged.

Names, parameters and result shapes are SPDK v25.09's. Where SPDK has an option
pynvmf has no use for (a poll group mask, an RDMA queue size), the option is
accepted and reported as what pynvmf does; where it asks for something pynvmf
does not do (TLS, DH-HMAC-CHAP keys, metadata), the call fails with
an error naming it. `save_config` (rpc.py's, built from framework_get_config)
writes what `pynvmf target --json` loads again (pynvmf.config.spdk).

One module per SPDK method family, as SPDK's own python/spdk/rpc/ divides them; each
has its method table, and `table` is all of them.
"""

from __future__ import annotations

from pynvmf.rpc.methods import MethodTable
from pynvmf.rpc.spdk import (
    bdev,
    bdev_iostat,
    bdev_rbd,
    framework,
    keyring,
    log,
    notify,
    nvmf_discovery,
    nvmf_stats,
    nvmf_subsystem,
    nvmf_transport,
    thread,
)

FAMILIES = (
    framework,
    bdev,
    bdev_iostat,
    bdev_rbd,
    nvmf_transport,
    nvmf_subsystem,
    keyring,
    nvmf_stats,
    notify,
    thread,
    nvmf_discovery,
    log,
)

table = MethodTable()
for _family in FAMILIES:
    table.methods.update(_family.table.methods)
