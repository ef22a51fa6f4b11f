"""The device each `pynvmf bench` job sees: one I/O queue of the connection, counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from pynvmf.bench.verify import Verifier
from pynvmf.block.device import BlockDevice, Buffer, Capabilities
from pynvmf.host import Controller, RemoteNamespace
from pynvmf.host.namespace import remote_namespace
from pynvmf.host.queue import HostQueue


@dataclass(slots=True)
class Counter:
    """Completed I/Os and bytes, for the progress line."""

    ios: int = 0
    bytes: int = 0


class JobDevice:
    """A namespace as one job uses it: counts completions for the progress line,
    writes and checks patterns with --verify. It does not offer CopyOffload, so
    the copy planner emulates copies to it (--copy-mode emulate)."""

    def __init__(
        self, inner: BlockDevice, counter: Counter | None = None, verifier: Verifier | None = None
    ) -> None:
        self._inner = inner
        self._counter = counter
        self._verifier = verifier

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    async def read(self, lba: int, buf: memoryview) -> None:
        verifier = self._verifier
        if verifier is None:
            await self._inner.read(lba, buf)
        else:
            async with verifier.exclusive(lba):
                await self._inner.read(lba, buf)
                verifier.check(lba, memoryview(buf).cast("B"))
        if self._counter is not None:
            self._counter.ios += 1
            self._counter.bytes += memoryview(buf).nbytes

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        verifier = self._verifier
        view = memoryview(data).cast("B")
        if verifier is None:
            await self._inner.write(lba, view, fua=fua)
        else:
            async with verifier.exclusive(lba):
                if view.readonly:
                    view = memoryview(bytearray(view.nbytes))
                verifier.fill(lba, view)
                await self._inner.write(lba, view, fua=fua)
        if self._counter is not None:
            self._counter.ios += 1
            self._counter.bytes += view.nbytes

    async def flush(self) -> None:
        await self._inner.flush()

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._inner.write_zeroes(lba, nblocks, fua=fua)

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._inner.deallocate(lba, nblocks)

    async def close(self) -> None:
        await self._inner.close()


class _OneQueue:
    """The controller as one job's namespace sees it: every command goes to the job's
    own I/O queue instead of round-robin over all of them (fio: one queue per job)."""

    def __init__(self, ctrl: Controller, queue: HostQueue) -> None:
        self._ctrl = ctrl
        self._queue = queue

    def next_queue(self) -> HostQueue:
        return self._queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctrl, name)


def job_namespace(ctrl: Controller, ns: RemoteNamespace, queue: HostQueue) -> RemoteNamespace:
    """`ns` bound to `queue` (a CopyingNamespace if `ns` is one)."""
    return remote_namespace(cast(Controller, _OneQueue(ctrl, queue)), ns.nsid, ns.identify)
