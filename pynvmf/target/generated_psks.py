"""The TLS PSKs that secure channel concatenation generated, held by the target in memory.

A host that authenticates its admin queue with SC_C NEWTLSPSK (NVMe Base 2.1 §8.3.4.3) gets a
generated PSK; it then closes that queue and connects again, over TLS with that PSK (what
Linux does), and its I/O queues use it too. So a generated PSK outlives the controller whose
authentication made it, until the controller created over TLS with it takes it: from then on
it lives as long as that controller. A REPLACETLSPSK re-authentication on that controller's
admin queue replaces it; taking the host off the subsystem, or its DH-HMAC-CHAP key, or the
subsystem away, forgets every PSK generated for them.

Bounded: at most `MAX_PER_PAIR` per host and subsystem (a new one pushes out the oldest not
yet taken, else the oldest); the pairs are those the configuration gives a key. Keys never
appear in a log line or a repr.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.tcp.psk import TlsPsk

log = logging.getLogger(__name__)

# A host with this many controllers on one subsystem, each concatenated (one per path), is
# served; one more pushes out the oldest PSK, whose controller keeps its connections.
MAX_PER_PAIR = 16


@dataclass
class _Entry:
    # The PSK as derived by RFC 8446 first, then by the derivations older hosts used (one
    # identity: the TLS binder tells which the host has).
    psks: list[TlsPsk] = field(repr=False)
    # The controllers whose admin queue came over TLS with it (or replaced theirs with it).
    takers: set[Controller] = field(default_factory=set)


class GeneratedPsks:
    def __init__(self, per_pair: int = MAX_PER_PAIR) -> None:
        self.per_pair = per_pair
        self._entries: dict[bytes, _Entry] = {}  # by identity, oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, psks: list[TlsPsk], controller: Controller | None = None) -> None:
        """Hold a generated PSK (its derivations, one identity), taken by `controller`
        already if given (a REPLACETLSPSK on its admin queue), else waiting for the TLS
        admin queue that will take it."""
        first = psks[0]
        pair = (first.hostnqn, first.subnqn)
        same = [i for i, e in self._entries.items() if self._pair(e) == pair]
        while len(same) >= self.per_pair:
            untaken = [i for i in same if not self._entries[i].takers]
            oldest = (untaken or same)[0]
            log.info(
                "generated PSK for %s on %s pushed out (%d per host and subsystem)",
                pair[0],
                pair[1],
                self.per_pair,
            )
            del self._entries[oldest]
            same.remove(oldest)
        self._entries[first.identity] = _Entry(psks, {controller} if controller else set())

    def find(self, identity: bytes) -> list[TlsPsk]:
        """The PSKs for a TLS identity a host offers (each derivation), or []."""
        entry = self._entries.get(identity)
        return list(entry.psks) if entry is not None else []

    def take(self, psk: TlsPsk, controller: Controller) -> None:
        """The admin queue of `controller` came over TLS with `psk`: it lives with it."""
        entry = self._entries.get(psk.identity)
        if entry is not None:
            entry.takers.add(controller)

    def replace(self, old: TlsPsk | None, psks: list[TlsPsk], controller: Controller) -> None:
        """A REPLACETLSPSK on `controller`'s admin queue: its new PSK takes the old one's
        place (a configured PSK, `old` not generated, is not held here and stays configured)."""
        entry = self._entries.get(old.identity) if old is not None else None
        if old is not None and entry is not None:
            entry.takers.discard(controller)
            if not entry.takers:
                del self._entries[old.identity]
        self.add(psks, controller)

    def controller_gone(self, controller: Controller) -> None:
        """A controller went away: the PSKs it took go with it (with the last of their
        takers, if another controller of the host took one too)."""
        for identity, entry in list(self._entries.items()):
            if controller in entry.takers:
                entry.takers.discard(controller)
                if not entry.takers:
                    del self._entries[identity]

    def forget(self, *, hostnqn: str | None = None, subnqn: str | None = None) -> None:
        """Drop every PSK generated for this host (on any subsystem, or `subnqn`'s), or
        for the subsystem `subnqn` (any host)."""
        for identity, entry in list(self._entries.items()):
            host, sub = self._pair(entry)
            if (hostnqn is None or host == hostnqn) and (subnqn is None or sub == subnqn):
                del self._entries[identity]

    @staticmethod
    def _pair(entry: _Entry) -> tuple[str, str]:
        return entry.psks[0].hostnqn, entry.psks[0].subnqn
