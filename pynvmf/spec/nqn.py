"""NVMe Qualified Names: what makes one valid (NVMe Base Specification, section 4.7)."""

from __future__ import annotations

import re
import uuid

NQN_MAX = 223  # bytes of UTF-8, without the terminating NUL the wire format adds
UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:"

_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")


def nqn_problem(nqn: object) -> str | None:
    """Why `nqn` is not a valid NQN, or None if it is.

    The specification's forms are "nqn.yyyy-mm.reverse.domain:name" and the UUID form;
    a name in the UUID form must hold a UUID. Other names are accepted as the Linux
    target accepts them (blktests names its subsystems "blktests-subsystem-1"), if they
    fit and hold no spaces or control characters.
    """
    if not isinstance(nqn, str):
        return "not a string"
    size = len(nqn.encode())
    if not nqn:
        return "empty"
    if size > NQN_MAX:
        return f"{size} bytes long, more than {NQN_MAX}"
    if _FORBIDDEN.search(nqn):
        return "contains a space or a control character"
    if nqn.startswith(UUID_NQN_PREFIX):
        tail = nqn[len(UUID_NQN_PREFIX) :]
        try:
            if len(tail) != 36 or str(uuid.UUID(tail)) != tail.lower():
                raise ValueError(tail)
        except ValueError:
            return f"{tail!r} is not a UUID in 8-4-4-4-12 form"
        return None
    return None
