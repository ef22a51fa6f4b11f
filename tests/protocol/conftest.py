"""Fixtures for the raw-socket protocol tests: an in-process target and RawQueue clients.

Every fixture name starts with `raw_` so these fixtures never clash with the
host library's fixtures in the same directory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pynvmf.block.memory import MemoryDevice
from pynvmf.host import connect
from pynvmf.host.controller import Controller
from pynvmf.rpc.client import RpcClient, RpcClientError
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.spec.identify import Oaes
from pynvmf.spec.opcodes import FeatureId
from pynvmf.target.budget import ConnectionLimits
from pynvmf.target.port import Port
from pynvmf.target.subsystem import Namespace, Subsystem
from pynvmf.target.target import Target
from tests.support.raw import HOSTID, HOSTNQN, RawHost, RawQueue

RAW_SUBNQN = "nqn.2024-01.io.pynvmf.test:raw"
RAW_RESTRICTED_NQN = "nqn.2024-01.io.pynvmf.test:restricted"
RAW_ALLOWED_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-1111-2222-3333-444455556666"
# Namespace 1: 512-byte blocks; namespace 2: 4096-byte blocks.
RAW_NS1_BLOCK = 512
RAW_NS1_BLOCKS = 8192
RAW_NS2_BLOCK = 4096
RAW_NS2_BLOCKS = 1024


def raw_memory_subsystem(nqn: str = RAW_SUBNQN, **kwargs: Any) -> Subsystem:
    """A subsystem with the two in-memory namespaces described above."""
    subsystem = Subsystem(nqn, **kwargs)
    for nsid, block, blocks in (
        (1, RAW_NS1_BLOCK, RAW_NS1_BLOCKS),
        (2, RAW_NS2_BLOCK, RAW_NS2_BLOCKS),
    ):
        device = MemoryDevice(block * blocks, block)
        subsystem.add_namespace(Namespace.create(nqn, nsid, device, f"memory:{nsid}"))
    return subsystem


def raw_default_subsystems() -> list[Subsystem]:
    """RAW_SUBNQN open to every host, RAW_RESTRICTED_NQN to RAW_ALLOWED_HOSTNQN only."""
    return [
        raw_memory_subsystem(),
        raw_memory_subsystem(
            RAW_RESTRICTED_NQN, allow_any_host=False, allowed_hosts={RAW_ALLOWED_HOSTNQN}
        ),
    ]


@dataclass
class RawTarget:
    """A started in-process target and the client queues opened against it."""

    target: Target
    queues: list[RawQueue] = field(default_factory=list)
    stopped: bool = False

    @property
    def port(self) -> Port:
        return self.target.ports[0]

    async def open(self, port: Port | None = None) -> RawQueue:
        """A TCP connection to `port` (default: the first), nothing sent yet."""
        port = port or self.port
        queue = await RawQueue.open(port.address, port.port)
        self.queues.append(queue)
        return queue

    async def admin(
        self,
        subnqn: str = RAW_SUBNQN,
        *,
        hostnqn: str = HOSTNQN,
        hostid: bytes = HOSTID,
        kato: int = 0,
        enable: bool = True,
        port: Port | None = None,
    ) -> RawQueue:
        """An admin queue connected (and by default enabled) to `subnqn`."""
        queue = await self.open(port)
        await queue.handshake()
        done = await queue.connect(subnqn, hostnqn=hostnqn, hostid=hostid, kato=kato)
        assert done.status == 0, done
        if enable:
            await queue.enable()
        return queue

    async def io_queue(
        self,
        admin: RawQueue,
        qid: int,
        subnqn: str = RAW_SUBNQN,
        *,
        hostnqn: str = HOSTNQN,
        hostid: bytes = HOSTID,
    ) -> RawQueue:
        """I/O queue `qid` of the controller behind `admin`."""
        queue = await self.open()
        await queue.handshake()
        done = await queue.connect(
            subnqn,
            hostnqn=hostnqn,
            hostid=hostid,
            qid=qid,
            cntlid=admin.cntlid,
            inline_limit=self.port.transport.inline_data_size,
        )
        assert done.status == 0, done
        return queue

    async def host(self, io_queues: int = 1, subnqn: str = RAW_SUBNQN) -> RawHost:
        """A complete association: an enabled admin queue and `io_queues` I/O queues."""
        admin = await self.admin(subnqn)
        host = RawHost(admin)
        for qid in range(1, io_queues + 1):
            host.io.append(await self.io_queue(admin, qid, subnqn))
        return host

    async def aclose(self) -> None:
        """Close every client queue, then stop the target (once)."""
        for queue in self.queues:
            await queue.close()
        self.queues.clear()
        if not self.stopped:
            self.stopped = True
            await self.target.stop()


RawTargetFactory = Callable[..., Awaitable[RawTarget]]


@pytest.fixture
async def raw_target_factory() -> AsyncIterator[RawTargetFactory]:
    """make(subsystems=None, ports=None, limits=None): a started Target (defaults: the raw
    subsystems on one 127.0.0.1 port with an ephemeral port number), stopped at teardown."""
    made: list[RawTarget] = []

    async def make(
        subsystems: list[Subsystem] | None = None,
        ports: list[Port] | None = None,
        limits: ConnectionLimits | None = None,
    ) -> RawTarget:
        target = Target(
            raw_default_subsystems() if subsystems is None else subsystems,
            ports or [Port("127.0.0.1", 0)],
            limits=limits,
        )
        await target.start()
        raw = RawTarget(target)
        made.append(raw)
        return raw

    yield make
    for raw in reversed(made):
        await raw.aclose()


@pytest.fixture
async def raw_target(raw_target_factory: RawTargetFactory) -> RawTarget:
    """The default target: see `raw_default_subsystems`."""
    return await raw_target_factory()


@dataclass
class RawRpcTarget:
    """The default raw target with its RPC server on a Unix socket."""

    raw: RawTarget
    socket: str

    @property
    def target(self) -> Target:
        return self.raw.target

    async def call(self, method: str, **params: Any) -> Any:
        """The whole JSON-RPC answer (`result` or `error`) to one call, through pynvmf's
        own RPC client (in a thread: the target answers on this event loop)."""

        def call() -> dict[str, Any]:
            with RpcClient(self.socket, timeout=30) as client:
                try:
                    return {"result": client.call(method, params)}
                except RpcClientError as exc:
                    if exc.code is None:
                        raise  # no answer at all: not an error response
                    return {"error": {"code": exc.code, "message": exc.message}}

        return await asyncio.to_thread(call)

    async def ok(self, method: str, **params: Any) -> Any:
        answer = await self.call(method, **params)
        assert "error" not in answer, answer
        return answer["result"]

    async def host(self, hostnqn: str, subnqn: str = RAW_SUBNQN) -> Controller:
        """pynvmf's host as `hostnqn`, with Namespace Attribute Changed events enabled."""
        port = self.target.ports[0]
        ctrl = await connect(port.address, port.port, subnqn, hostnqn=hostnqn, queues=1)
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        return ctrl


@pytest.fixture
async def raw_rpc_target(
    raw_target_factory: RawTargetFactory, tmp_path: Path
) -> AsyncIterator[RawRpcTarget]:
    raw = await raw_target_factory()
    server = RpcServer(control_plane(raw.target))
    path = str(tmp_path / "rpc.sock")
    await server.listen_unix(path)
    yield RawRpcTarget(raw, path)
    await server.close()
