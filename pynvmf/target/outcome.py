"""What every command handler of the target returns: the command's Outcome.

Admin (admin.py, reservations.py's features), Fabrics (fabrics.py, auth.py) and I/O
(io.py, compare.py, reservations.py's commands) handlers all return one shape, which
their queue (queue.py, io.py's IoHandler.execute) hands to the transport's `complete`:

    (status, result, data)

- status: the completion's status field (spec/status.py; 0: success);
- result: the completion's DW0 (DW1 above bit 32), 0 when the command has none;
- data: the controller-to-host data to send before the completion, or None.

A plain tuple, not a NamedTuple or a class: a handler builds one per command, and on
the I/O path a tuple display costs a few bytecodes where constructing a NamedTuple is
a Python-level call (about eight times as long), for no gain a caller would use (every
caller unpacks all three at once).
"""

from __future__ import annotations

Outcome = tuple[int, int, bytes | bytearray | memoryview | None]
