"""The transport's exceptions, in a module of their own: an exception class derives from
a built-in type, which mypyc cannot compile into a native class, and the modules that
raise it may be compiled (docs/performance.md, "Compiled hot modules")."""

from __future__ import annotations


class TransferAborted(ConnectionError):
    """A command's data transfer ended without the data (digest error, connection loss)."""
