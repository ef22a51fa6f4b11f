"""The target's notification log (SPDK's notify): ids from 0, the newest MAX_EVENTS kept,
`id` and `max` as SPDK's notify_get_notifications reads them, and a notification for
every block device that joins or leaves the target, whichever way it does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pynvmf.config.native import apply_config
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.rpc.jsonrpc import RpcError
from pynvmf.rpc.server import control_plane
from pynvmf.target.notifications import (
    BDEV_REGISTER,
    BDEV_RESIZE,
    BDEV_UNREGISTER,
    CTX_MAX,
    MAX_EVENTS,
    Notification,
    NotificationLog,
)
from pynvmf.target.target import Target

NQN = "nqn.2016-06.io.spdk:cnode1"


def test_ids_count_from_zero_in_order() -> None:
    log = NotificationLog()
    assert log.send(BDEV_REGISTER, "Malloc0") == 0
    assert log.send(BDEV_UNREGISTER, "Malloc0") == 1
    assert log.read() == [
        Notification(0, BDEV_REGISTER, "Malloc0"),
        Notification(1, BDEV_UNREGISTER, "Malloc0"),
    ]
    assert log.read(1) == [Notification(1, BDEV_UNREGISTER, "Malloc0")]
    assert log.read(2) == [] and log.read(1 << 64) == []


def test_max_limits_how_many_from_the_first_id() -> None:
    log = NotificationLog()
    for i in range(10):
        log.send(BDEV_REGISTER, f"Malloc{i}")
    assert [n.id for n in log.read(3, 4)] == [3, 4, 5, 6]
    assert [n.id for n in log.read(8, 4)] == [8, 9]
    assert log.read(0, 0) == []


def test_the_log_keeps_the_newest_and_counts_what_it_dropped() -> None:
    log = NotificationLog(capacity=4)
    for i in range(10):
        log.send(BDEV_REGISTER, f"Malloc{i}")
    assert log.dropped == 6 and log.next_id == 10
    # An id that was overwritten reads from the oldest kept: the gap shows what was lost.
    assert [n.id for n in log.read()] == [6, 7, 8, 9]
    assert [n.ctx for n in log.read(2, 2)] == ["Malloc6", "Malloc7"]
    assert [n.id for n in log.read(8)] == [8, 9]


def test_spdk_s_ring_size_bounds_the_log() -> None:
    log = NotificationLog()
    for i in range(3 * MAX_EVENTS):
        log.send(BDEV_REGISTER if i % 2 == 0 else BDEV_UNREGISTER, "x" * 4096)
    kept = log.read()
    assert len(kept) == MAX_EVENTS and kept[0].id == 2 * MAX_EVENTS
    assert all(len(n.ctx) == CTX_MAX for n in kept)  # SPDK's 128-byte field, its NUL


def test_only_registered_types_are_sent() -> None:
    log = NotificationLog()
    assert log.types == (BDEV_REGISTER, BDEV_UNREGISTER, BDEV_RESIZE)
    with pytest.raises(ValueError, match="not registered"):
        log.send("fsdev_register", "x")
    assert log.next_id == 0


async def test_rpc_devices_are_notified_and_read_with_id_and_max(tmp_path: Path) -> None:
    cp = control_plane(Target())
    image = tmp_path / "aio.img"
    image.write_bytes(bytes(1 << 20))
    assert await cp.call("notify_get_types", {}) == [
        "bdev_register",
        "bdev_unregister",
        "bdev_resize",
        "nvmf_keep_alive_timeout",
    ]
    assert await cp.call("notify_get_notifications", {}) == []
    await cp.call("bdev_malloc_create", {"num_blocks": 2048, "block_size": 512})
    await cp.call("bdev_aio_create", {"name": "Aio0", "filename": str(image)})
    await cp.call("bdev_malloc_delete", {"name": "Malloc0"})
    await cp.call("bdev_aio_delete", {"name": "Aio0"})
    assert await cp.call("notify_get_notifications", {}) == [
        {"type": "bdev_register", "ctx": "Malloc0", "id": 0},
        {"type": "bdev_register", "ctx": "Aio0", "id": 1},
        {"type": "bdev_unregister", "ctx": "Malloc0", "id": 2},
        {"type": "bdev_unregister", "ctx": "Aio0", "id": 3},
    ]
    window = await cp.call("notify_get_notifications", {"id": 1, "max": 2})
    assert [(n["id"], n["ctx"]) for n in window] == [(1, "Aio0"), (2, "Malloc0")]
    for params, message in (
        ({"id": -1}, "id: -1 not in"),
        ({"max": "2"}, "max: '2' is not an integer"),
        ({"since": 0}, "since: unknown parameter"),
    ):
        with pytest.raises(RpcError, match=message):
            await cp.call("notify_get_notifications", params)
    with pytest.raises(RpcError, match="unknown parameter"):
        await cp.call("notify_get_types", {"id": 0})
    # A refused create notifies nothing.
    with pytest.raises(RpcError):
        await cp.call("bdev_aio_create", {"name": "Bad", "filename": str(tmp_path / "none")})
    assert cp.target.notifications.next_id == 4
    await cp.target.stop()


async def test_a_loaded_spdk_configuration_notifies_its_devices(tmp_path: Path) -> None:
    cp = control_plane(Target())
    await cp.call("bdev_malloc_create", {"name": "Malloc0", "num_blocks": 64, "block_size": 512})
    await cp.call("bdev_malloc_create", {"name": "Malloc1", "num_blocks": 64, "block_size": 512})
    again = control_plane(Target())
    await load_spdk_config(again, copy.deepcopy(spdk_config(cp.target)))
    assert [(n.type, n.ctx) for n in again.target.notifications.read()] == [
        (BDEV_REGISTER, "Malloc0"),
        (BDEV_REGISTER, "Malloc1"),
    ]
    for t in (cp.target, again.target):
        await t.stop()


async def test_configuration_file_devices_and_namespace_devices_are_notified() -> None:
    """A device of `devices`, and one opened for a namespace alone (it goes with the
    namespace, here with its subsystem): both are bdevs to SPDK's clients."""
    target = Target()
    await apply_config(
        target,
        {
            "devices": [{"name": "shared", "memory": "1M"}],
            "subsystems": [{"nqn": NQN, "namespaces": [{"nsid": 1, "memory": "1M"}]}],
        },
    )
    (ns,) = target.subsystems[NQN].namespaces.values()
    assert [(n.type, n.ctx) for n in target.notifications.read()] == [
        (BDEV_REGISTER, "shared"),
        (BDEV_REGISTER, ns.device_name),
    ]
    await target.remove_subsystem(NQN)
    await target.remove_block_device("shared")
    assert [(n.type, n.ctx) for n in target.notifications.read(2)] == [
        (BDEV_UNREGISTER, ns.device_name),
        (BDEV_UNREGISTER, "shared"),
    ]
    await target.stop()
