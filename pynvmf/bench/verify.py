"""`pynvmf bench --verify`: what each block should hold, written and checked per job."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator


class VerifyError(Exception):
    """Data read back is not what this run last wrote there."""


class Verifier:
    """The expected content of every block this run wrote, shared by all jobs.

    A block's content is derived from (LBA, seed, generation): the generation
    counts the writes to that block, so a stale block (a lost write) is caught as
    well as a corrupted one. Blocks never written are not checked. I/Os of one
    run never partially overlap (all start on the same --bs grid), so I/Os to the
    same start LBA are serialised: which of two concurrent writes lands last, or
    whether a concurrent read sees the old or the new data, would be undefined.
    """

    def __init__(self, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self._seed = seed.to_bytes(8, "little")
        self._repeat = block_size // 64
        self.generations: dict[int, int] = {}
        self._busy: dict[int, asyncio.Event] = {}
        self.failure: str | None = None

    def pattern(self, lba: int, generation: int) -> bytes:
        key = lba.to_bytes(8, "little") + self._seed + generation.to_bytes(8, "little")
        return hashlib.blake2b(key, digest_size=64).digest() * self._repeat

    @contextlib.asynccontextmanager
    async def exclusive(self, lba: int) -> AsyncIterator[None]:
        busy = self._busy
        while (event := busy.get(lba)) is not None:
            await event.wait()
        mine = busy[lba] = asyncio.Event()
        try:
            yield
        finally:
            del busy[lba]
            mine.set()

    def fill(self, lba: int, view: memoryview) -> None:
        """Put the next generation's pattern of each block into `view`."""
        bs = self.block_size
        gens = self.generations
        for i in range(view.nbytes // bs):
            g = gens.get(lba + i, 0) + 1
            gens[lba + i] = g
            view[i * bs : (i + 1) * bs] = self.pattern(lba + i, g)

    def check(self, lba: int, view: memoryview) -> None:
        bs = self.block_size
        gens = self.generations
        for i in range(view.nbytes // bs):
            g = gens.get(lba + i)
            if g is None:
                continue
            block = view[i * bs : (i + 1) * bs]
            if block != self.pattern(lba + i, g):
                stale = g > 1 and block == self.pattern(lba + i, g - 1)
                what = "stale data (the previous write)" if stale else "unexpected data"
                message = f"verify failed at LBA {lba + i}: {what}, expected write #{g}"
                if self.failure is None:
                    self.failure = message
                raise VerifyError(message)
