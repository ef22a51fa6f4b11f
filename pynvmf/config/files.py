"""Files that must survive a crash whole: a configuration, a namespace's persisted
reservations."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace `path` by `data` so that a power loss leaves the old file or the new one,
    whole: a temporary file beside it (mode 0600), fsync, rename, fsync of the directory."""
    path = Path(path)
    directory = path.parent.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def json_bytes(data: Any) -> bytes:
    """`data` as a configuration file holds it: indented, one newline at the end."""
    return (json.dumps(data, indent=2) + "\n").encode()
