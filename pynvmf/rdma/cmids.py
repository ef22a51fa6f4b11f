"""What the RDMA CM listener holds per connection, bounded by the connections alive.

pyverbs 65 names a CM event's CM ID only through a new ``CMID(creator=event, ...)``
wrapper, and every wrapper destroys its CM ID (``rdma_destroy_id``, with the queue pair)
when it is collected: dropping the wrapper of a connection's second event would destroy
the connection, dropping two wrappers of one CM ID destroys it twice. The adapter
therefore:

- keeps one wrapper per accepted connection (the CM ID it posts on), and destroys the
  CM ID through it once, when the connection ends;
- *disowns* every other wrapper as soon as it has read the queue pair's number from it:
  :class:`PointerField` clears the wrapper's ``rdma_cm_id`` pointer (the C field pyverbs'
  ``close()`` tests), so collecting it destroys nothing. pyverbs' ``CMID`` struct is
  ``id, event_channel, ctx, pd, mrs`` (pyverbs/cmid.pxd); the field is found in a live
  wrapper as the word before the run of its known neighbours (the event channel, and the
  ``None`` context and PD a wrapper made with an unbound ``listen_id`` has), and checked
  against a second wrapper of the same CM ID before it is ever written;
- where that layout is not found (another pyverbs), keeps the wrapper instead (the
  defect docs/rdma.md describes before this module), and says so in :attr:`CmIdLedger.held`.

Sans-I/O: no pyverbs here (the tests use objects with ``__slots__``).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Generic, TypeVar

Q = TypeVar("Q")

log = logging.getLogger(__name__)

_WORD = ctypes.sizeof(ctypes.c_void_p)
# ob_refcnt and ob_type: no object field before them.
_HEADER_WORDS = 2


class PointerField:
    """A pointer-sized C field of one extension type, at a byte offset found in a live
    object of it."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    @classmethod
    def before(cls, obj: object, neighbours: Sequence[object]) -> PointerField | None:
        """The field just before the run of fields that hold ``neighbours`` (these very
        objects, in this order) in ``obj``'s struct; None when there is no such run or
        more than one."""
        words = type(obj).__basicsize__ // _WORD
        cells = (ctypes.c_void_p * words).from_address(id(obj))
        want = [id(n) for n in neighbours]
        found = [
            i
            for i in range(_HEADER_WORDS + 1, words - len(want) + 1)
            if [cells[i + k] for k in range(len(want))] == want
        ]
        if len(found) != 1:
            return None
        return cls((found[0] - 1) * _WORD)

    def get(self, obj: object) -> int:
        """The field's value in ``obj`` (0 for NULL)."""
        return ctypes.c_void_p.from_address(id(obj) + self.offset).value or 0

    def clear(self, obj: object) -> None:
        """Set the field to NULL in ``obj``."""
        ctypes.c_void_p.from_address(id(obj) + self.offset).value = None


class CmIdLedger(Generic[Q]):
    """The listener's accepted queues by a key of their connection (the CM ID's pointer,
    :meth:`key_of`), and the CM ID wrappers of their events (disowned, or kept where they
    cannot be)."""

    def __init__(self) -> None:
        self._queues: dict[int, Q] = {}
        # The CM ID field once found; trusted once a second wrapper of one CM ID agreed.
        self._field: PointerField | None = None
        self._trusted = False
        self._gave_up = False
        # Wrappers kept because no field could be trusted.
        self._kept: list[object] = []

    @property
    def held(self) -> int:
        """CM IDs and wrappers held: one per accepted connection alive, plus any wrapper
        kept because it could not be disowned (never, where the layout is known)."""
        return len(self._queues) + len(self._kept)

    @property
    def disowning(self) -> bool:
        """Whether event wrappers are disowned (the field was found and checked)."""
        return self._trusted

    def learn(self, wrapper: object, neighbours: Sequence[object]) -> None:
        """Find the CM ID field in a new connection's wrapper (``neighbours``: what its
        fields after the CM ID hold); the first event wrapper of the same CM ID checks it."""
        if self._field is None and not self._gave_up:
            self._field = PointerField.before(wrapper, neighbours)

    def key_of(self, wrapper: object) -> int | None:
        """The CM ID ``wrapper`` wraps (its C pointer), read through the field found by
        :meth:`learn`; None where no field was found. A queue pair the adapter creates
        itself is not the CM ID's, so its number cannot name the connection of an event:
        this pointer does."""
        field = self._field
        if field is None:
            return None
        return field.get(wrapper) or None

    def accepted(self, key: int, queue: Q) -> None:
        self._queues[key] = queue

    def queue_of(self, key: int | None) -> Q | None:
        return None if key is None else self._queues.get(key)

    def event_wrapper(self, wrapper: object, owner: object | None) -> None:
        """Done with ``wrapper`` (made for one event; ``owner``: the connection's own
        wrapper of the same CM ID, None when no accepted connection has it): disown it,
        or keep it."""
        field = self._field
        if field is not None and not self._trusted and owner is not None:
            # Both wrap one CM ID: the field must hold the same, non-NULL pointer.
            value = field.get(wrapper)
            self._trusted = value != 0 and value == field.get(owner)
            if not self._trusted:
                self._field = None
                self._gave_up = True
                log.warning(
                    "pyverbs' CMID layout is not the one known: the RDMA CM listener keeps"
                    " a wrapper per CM event (memory grows with every connection)"
                )
        if self._trusted and field is not None:
            field.clear(wrapper)
        else:
            self._kept.append(wrapper)

    def ended(self, key: int) -> Q | None:
        """The connection ``key`` ended: forget its queue (returned; the caller destroys
        its CM ID once, through the connection's own wrapper)."""
        return self._queues.pop(key, None)

    def queues(self) -> list[Q]:
        return list(self._queues.values())
