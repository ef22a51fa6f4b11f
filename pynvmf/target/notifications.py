"""The target's notification log: what happened to its block devices, for a client that
polls for it (SPDK's lib/notify, read with notify_get_types and notify_get_notifications).

Every notification has a type, a context (for a block device, its name) and an id that
counts from 0 in the order they were sent, never reused. The log keeps the newest
`capacity` of them, as SPDK's ring of 1024 does: a client that polls too seldom sees a
gap in the ids (and `dropped` counts what was overwritten), and no client, however often
devices come and go, makes the log hold more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

# SPDK's SPDK_NOTIFY_MAX_EVENTS.
MAX_EVENTS = 1024
# SPDK keeps a context in 128 bytes with its terminating NUL: a longer one is cut.
CTX_MAX = 127

# The types SPDK's bdev library registers, in its order, with the block device's name as
# context (bdev_resize: Target.resize_block_device).
BDEV_REGISTER = "bdev_register"
BDEV_UNREGISTER = "bdev_unregister"
BDEV_RESIZE = "bdev_resize"
BDEV_TYPES = (BDEV_REGISTER, BDEV_UNREGISTER, BDEV_RESIZE)
# pynvmf's own, in SPDK's style of name: a controller torn down because its host sent
# nothing within the keep-alive timeout, with the host's NQN as context, so that a
# gateway that polls learns which host went silent.
KEEP_ALIVE_TIMEOUT = "nvmf_keep_alive_timeout"
TARGET_TYPES = (*BDEV_TYPES, KEEP_ALIVE_TIMEOUT)


@dataclass(frozen=True)
class Notification:
    id: int
    type: str
    ctx: str


class NotificationLog:
    """The newest `capacity` notifications of the registered `types`."""

    def __init__(self, types: Iterable[str] = BDEV_TYPES, capacity: int = MAX_EVENTS) -> None:
        if capacity < 1:
            raise ValueError(f"a notification log holds at least one notification, not {capacity}")
        self.types = tuple(dict.fromkeys(types))
        self.capacity = capacity
        self._events: deque[Notification] = deque(maxlen=capacity)
        self.next_id = 0

    @property
    def dropped(self) -> int:
        """How many notifications were overwritten by newer ones."""
        return self.next_id - len(self._events)

    def send(self, type_: str, ctx: str) -> int:
        """Log a notification of a registered type; its id."""
        if type_ not in self.types:
            raise ValueError(f"notification type {type_!r} is not registered")
        notification = Notification(self.next_id, type_, ctx[:CTX_MAX])
        self._events.append(notification)
        self.next_id += 1
        return notification.id

    def read(self, first_id: int = 0, max_count: int | None = None) -> list[Notification]:
        """The notifications from id `first_id` on (from the oldest kept, if that one was
        overwritten), oldest first, at most `max_count` of them (all: None)."""
        kept = len(self._events)
        start = min(max(first_id - self.dropped, 0), kept)
        stop = kept if max_count is None else min(start + max_count, kept)
        return list(islice(self._events, start, stop))
