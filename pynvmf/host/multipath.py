"""ANA on the host side: a controller's ANA log, and one namespace reached through several
controllers (paths) as one BlockDevice that follows their ANA states.

`MultipathNamespace` sends each command through an optimized path (a non-optimized one
when there is none), as the Linux host's native multipath does. A command that comes back
with a path-related status (SCT 3h: ANA inaccessible, persistent loss, transition, or a
path error) or whose connection is lost is sent again through another path after the
paths' ANA logs are read again; while no path is usable it waits, up to the controllers'
ANA Transition Time, for one to become so. Writes are safe to resend: the same data at
the same place. The paths are checked to be one namespace (same subsystem NQN, NSID and
namespace identifiers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from pynvmf.block.device import Buffer, Capabilities
from pynvmf.host.errors import NvmeConnectionError, NvmeStatusError, NvmeUnsupportedError
from pynvmf.spec import identify as I
from pynvmf.spec.logpages import ANA_DESC_SIZE, ANA_HEADER_SIZE, AnaLog, AnaState, LogPageId

if TYPE_CHECKING:
    from pynvmf.host.controller import Controller
    from pynvmf.host.namespace import RemoteNamespace

log = logging.getLogger(__name__)

T = TypeVar("T")
PATH_RELATED_SCT = 0x3
# What a path's state is taken to be after a command through it failed with this status.
_STATUS_STATE = {
    0x301: AnaState.PERSISTENT_LOSS,
    0x302: AnaState.INACCESSIBLE,
    0x303: AnaState.CHANGE,
}
_USABLE = (AnaState.OPTIMIZED, AnaState.NON_OPTIMIZED)


def reports_ana(ctrl: Controller) -> bool:
    info = ctrl.info
    return info is not None and bool(info.cmic & I.Cmic.ANA)


async def read_ana_log(ctrl: Controller, *, groups_only: bool = False, rae: bool = False) -> AnaLog:
    """The controller's ANA log (NvmeUnsupportedError if it reports no ANA): read whole,
    as large as Identify says it can be."""
    info = ctrl.info
    if info is None or not reports_ana(ctrl):
        raise NvmeUnsupportedError(f"{ctrl} does not report ANA")
    size = ANA_HEADER_SIZE + info.nanagrpid * ANA_DESC_SIZE + (0 if groups_only else info.mnan * 4)
    raw = await ctrl.get_log_page(LogPageId.ANA, size, lsp=1 if groups_only else 0, rae=rae)
    return AnaLog.unpack(raw)


async def ana_state(namespace: RemoteNamespace) -> AnaState:
    """The ANA state of the namespace's group through its controller (optimized on a
    controller that reports no ANA: every path is then as good)."""
    ctrl = namespace.controller
    if not reports_ana(ctrl):
        return AnaState.OPTIMIZED
    grpid = namespace.identify.anagrpid
    for group in (await read_ana_log(ctrl, groups_only=True)).groups:
        if group.grpid == grpid:
            return AnaState(group.state)
    # A group the log does not list (yet): not usable until it does.
    return AnaState.INACCESSIBLE


class NoUsablePath(NvmeConnectionError):
    """No path of a MultipathNamespace became usable in time."""


class MultipathNamespace:
    """One namespace through several controllers (a BlockDevice)."""

    def __init__(self, paths: Sequence[RemoteNamespace], *, wait_s: float | None = None) -> None:
        if not paths:
            raise ValueError("a multipath namespace needs at least one path")
        first = paths[0]
        for other in paths[1:]:
            if (
                other.controller.subnqn != first.controller.subnqn
                or other.nsid != first.nsid
                or other.identify.nguid != first.identify.nguid
                or other.identify.eui64 != first.identify.eui64
            ):
                raise ValueError(f"{other} through {other.controller} is not {first}'s namespace")
        self.paths = list(paths)
        self.states: list[AnaState | None] = [None] * len(paths)
        anatt = max((p.controller.info.anatt for p in paths if p.controller.info), default=0)
        self.wait_s = wait_s if wait_s is not None else max(anatt, 1) + 1
        self.retries = 0  # commands sent again through another path
        self._refreshing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"MultipathNamespace(nsid={self.paths[0].nsid}, {len(self.paths)} paths)"

    @property
    def capabilities(self) -> Capabilities:
        return self.paths[0].capabilities

    async def refresh(self) -> list[AnaState | None]:
        """Read every path's ANA state again (None: the path's connection is gone)."""
        # Concurrent failures share one refresh.
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)
        return list(self.states)

    async def _refresh(self) -> None:
        for i, path in enumerate(self.paths):
            if path.controller.closed:
                self.states[i] = None
                continue
            try:
                self.states[i] = await ana_state(path)
            except (NvmeConnectionError, NvmeStatusError) as exc:
                log.info("%s: path %s unusable: %s", self, path.controller, exc)
                self.states[i] = None

    def _choose(self) -> int | None:
        for wanted in _USABLE:
            for i, state in enumerate(self.states):
                if state == wanted and not self.paths[i].controller.closed:
                    return i
        return None

    async def _run(self, op: Callable[[RemoteNamespace], Awaitable[T]]) -> T:
        if all(state is None for state in self.states):
            await self.refresh()
        deadline = time.monotonic() + self.wait_s
        while True:
            i = self._choose()
            if i is None:
                if time.monotonic() > deadline:
                    raise NoUsablePath(f"{self}: no usable path within {self.wait_s:g} s")
                await asyncio.sleep(0.05)  # poll: the controllers' events are not read here
                await self.refresh()
                continue
            try:
                return await op(self.paths[i])
            except NvmeStatusError as exc:
                if exc.sct != PATH_RELATED_SCT or exc.dnr:
                    raise
                self.states[i] = _STATUS_STATE.get(exc.status, AnaState.INACCESSIBLE)
            except NvmeConnectionError:
                self.states[i] = None
            self.retries += 1
            await self.refresh()

    async def read(self, lba: int, buf: memoryview) -> None:
        await self._run(lambda p: p.read(lba, buf))

    async def write(self, lba: int, data: Buffer, *, fua: bool = False) -> None:
        await self._run(lambda p: p.write(lba, data, fua=fua))

    async def flush(self) -> None:
        await self._run(lambda p: p.flush())

    async def write_zeroes(self, lba: int, nblocks: int, *, fua: bool = False) -> None:
        await self._run(lambda p: p.write_zeroes(lba, nblocks, fua=fua))

    async def deallocate(self, lba: int, nblocks: int) -> None:
        await self._run(lambda p: p.deallocate(lba, nblocks))

    async def close(self) -> None:
        """The paths' controllers stay as they are (their owner closes them)."""
        if self._refreshing is not None:
            self._refreshing.cancel()
