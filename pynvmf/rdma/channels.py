"""A verbs completion channel and its file descriptor, for the event loop, on both
pyverbs the project meets: `CompChannel.fd` exists in pyverbs 65, not in 56 (Debian 13's),
where the descriptor is the one the new channel opened (an anonymous inode). Used by the
target's and the host's adapters; pyverbs is imported only when called."""

from __future__ import annotations

import os
from typing import Any

# What /proc/self/fd links a completion channel's descriptor to (an anonymous inode).
COMP_CHANNEL_LINK = "anon_inode:[infinibandevent]"


def _open_fds() -> dict[int, str]:
    """The process's open descriptors and what each links to (not the listing's own,
    closed by then: a descriptor opened next may take its number)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return fds


def comp_channel(ctx: Any) -> tuple[Any, int]:
    """A new completion channel on `ctx` and its descriptor: `CompChannel.fd` where pyverbs
    has it (65; not 56, Debian 13's), else the one descriptor the channel opened."""
    from pyverbs.cq import CompChannel

    before = _open_fds()
    channel = CompChannel(ctx)
    fd = getattr(channel, "fd", None)
    if isinstance(fd, int):
        return channel, fd
    new = [fd for fd, link in _open_fds().items() if link == COMP_CHANNEL_LINK and fd not in before]
    if len(new) != 1:
        channel.close()
        raise OSError(f"the completion channel's descriptor is not known: {new}")
    return channel, new[0]
