"""The control plane of a running target, driven over its sockets (a raw socket, the
Python client, the `pynvmf rpc` command) while pynvmf's host is connected: what the
host sees of each change, and how the RPC server treats its clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pynvmf.host import NvmeConnectionError, NvmeError, NvmeStatusError, connect, discover
from pynvmf.rpc.client import RpcClient
from pynvmf.rpc.jsonrpc import JsonStream
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.spec import logpages as L
from pynvmf.spec.identify import Oaes
from pynvmf.spec.opcodes import DISCOVERY_NQN, AdminOpcode, FeatureId, IoOpcode
from pynvmf.spec.status import Status
from pynvmf.target import drain
from tests.protocol.conftest import (
    RAW_ALLOWED_HOSTNQN,
    RAW_NS1_BLOCK,
    RAW_RESTRICTED_NQN,
    RAW_SUBNQN,
    RawTarget,
    RawTargetFactory,
)
from tests.support import raw as R
from tests.support.ports import free_tcp_port

pytestmark = pytest.mark.timeout(120)

NEW_NQN = "nqn.2024-01.io.pynvmf.test:rpc-new"


class RawRpc:
    """A JSON-RPC connection driven by hand: bytes out, parsed texts back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.stream = JsonStream()
        self.texts: list[bytes] = []
        self.ids = 0

    @classmethod
    async def open(cls, path: str) -> RawRpc:
        return cls(*await asyncio.open_unix_connection(path))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def request(self, method: str, **params: Any) -> int:
        self.ids += 1
        self.send(
            json.dumps(
                {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
            ).encode()
        )
        return self.ids

    async def recv(self, timeout: float = 10.0) -> Any:
        while not self.texts:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            assert data, "the server closed the connection"
            self.texts += self.stream.feed(data)
        return json.loads(self.texts.pop(0))

    async def call(self, method: str, **params: Any) -> Any:
        rid = self.request(method, **params)
        response = await self.recv()
        assert response["id"] == rid
        if "error" in response:
            raise AssertionError(f"{method}: {response['error']}")
        return response["result"]

    async def expect_eof(self) -> None:
        assert await asyncio.wait_for(self.reader.read(65536), 10) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@dataclass
class Rig:
    raw: RawTarget
    server: RpcServer
    socket: str

    @property
    def target(self) -> Any:
        return self.raw.target

    async def rpc(self) -> RawRpc:
        return await RawRpc.open(self.socket)


@pytest.fixture
async def rig(raw_target_factory: RawTargetFactory, tmp_path: Path) -> AsyncIterator[Rig]:
    raw = await raw_target_factory()
    server = RpcServer(control_plane(raw.target))
    path = str(tmp_path / "rpc.sock")
    await server.listen_unix(path)
    await server.listen_tcp("127.0.0.1", 0)
    yield Rig(raw, server, path)
    await server.close()


async def pynvmf_rpc(rig: Rig, *args: str) -> tuple[int, Any, str]:
    """`pynvmf rpc --server SOCKET ARGS...` as a user runs it: (status, parsed stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pynvmf",
        "rpc",
        "--server",
        rig.socket,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


async def arm_event(ctrl: Any) -> asyncio.Task[int]:
    task = asyncio.ensure_future(ctrl.admin_command(AdminOpcode.ASYNC_EVENT_REQUEST))
    await asyncio.sleep(0)  # the request is on the wire before the change is made
    return task


def event(result: int) -> tuple[int, int, int]:
    """(type, info, log page) of an Asynchronous Event Request's completion."""
    return result & 0x7, (result >> 8) & 0xFF, (result >> 16) & 0xFF


# -- the socket and the clients --------------------------------------------------------------


async def test_the_rpc_socket_is_its_owners_only(rig: Rig) -> None:
    st = os.stat(rig.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()


async def test_requests_back_to_back_cut_anywhere_are_answered_in_order(rig: Rig) -> None:
    rpc = await rig.rpc()
    stream = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": m}, indent=2).encode() + b"\n"
        for i, m in enumerate(["spdk_get_version", "nvmf_get_subsystems", "no_such_method"])
    )
    for i in range(0, len(stream), 5):
        rpc.send(stream[i : i + 5])
        await rpc.writer.drain()
    first, second, third = [await rpc.recv() for _ in range(3)]
    assert first["id"] == 0 and first["result"]["version"].startswith("pynvmf")
    assert second["id"] == 1 and [s["nqn"] for s in second["result"]][1:] == [
        RAW_SUBNQN,
        RAW_RESTRICTED_NQN,
    ]
    assert third["id"] == 2 and third["error"]["code"] == -32601
    # A batch, answered as one array.
    rpc.send(b'[{"jsonrpc":"2.0","id":"a","method":"spdk_get_version"},{"id":"b","method":"x"}]')
    batch = await rpc.recv()
    assert [r["id"] for r in batch] == ["a", "b"] and "error" in batch[1]
    await rpc.close()


async def test_malformed_json_closes_that_connection_only(rig: Rig) -> None:
    good, bad = await rig.rpc(), await rig.rpc()
    bad.send(b'{"jsonrpc": "2.0", "id": 1, "method": "spdk_get_version"}{"id": 2, ]')
    assert "result" in await bad.recv()
    error = await bad.recv()
    assert error["error"]["code"] == -32700 and error["id"] is None
    await bad.expect_eof()
    assert (await good.call("spdk_get_version"))["version"].startswith("pynvmf")
    for rpc in (good, bad):
        await rpc.close()


async def test_the_python_client_over_tcp(rig: Rig) -> None:
    assert rig.server.tcp_address is not None
    host, port = rig.server.tcp_address

    def use() -> Any:
        with RpcClient(f"{host}:{port}") as client:
            client.call("bdev_malloc_create", name="Tcp0", num_blocks=64, block_size=512)
            return client.call("bdev_get_bdevs", name="Tcp0")

    (bdev,) = await asyncio.to_thread(use)
    assert bdev["name"] == "Tcp0" and bdev["num_blocks"] == 64


async def test_pynvmf_rpc_prints_results_and_names_bad_parameters(rig: Rig, tmp_path: Path) -> None:
    status, out, err = await pynvmf_rpc(
        rig, "bdev_malloc_create", "num_blocks:=128", "block_size:=512"
    )
    assert (status, out, err) == (0, "Malloc0", "")
    status, out, err = await pynvmf_rpc(
        rig,
        "nvmf_subsystem_add_ns",
        f"nqn={RAW_SUBNQN}",
        "namespace.bdev_name=Malloc0",
        "namespace.nsid:=1",
    )
    assert status == 1 and out is None
    assert err.strip() == (
        "pynvmf rpc: nvmf_subsystem_add_ns: namespace.nsid: "
        f"NSID 1 of {RAW_SUBNQN} is in use (code -32602)"
    )
    status, out, _ = await pynvmf_rpc(
        rig,
        "nvmf_subsystem_add_ns",
        json.dumps({"nqn": RAW_SUBNQN, "namespace": {"bdev_name": "Malloc0"}}),
    )
    assert (status, out) == (0, 3)
    saved = tmp_path / "saved.json"
    status, out, _ = await pynvmf_rpc(rig, "save-config", str(saved))
    assert (status, out) == (0, True)
    written = json.loads(saved.read_text())
    (sub,) = [s for s in written["subsystems"] if s["nqn"] == RAW_SUBNQN]
    assert [ns["nsid"] for ns in sub["namespaces"]] == [1, 2, 3]
    assert sub["namespaces"][2]["device"] == "Malloc0"


# -- what a connected host sees -------------------------------------------------------------


async def test_a_namespace_added_and_removed_reaches_a_connected_host(rig: Rig) -> None:
    port = rig.target.ports[0]
    async with await connect(port.address, port.port, RAW_SUBNQN, queues=1) as ctrl:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.NS_ATTR)
        aer = await arm_event(ctrl)
        status, _, _ = await pynvmf_rpc(
            rig, "bdev_malloc_create", "name=Live0", "num_blocks:=256", "block_size:=512"
        )
        assert status == 0
        status, nsid, _ = await pynvmf_rpc(
            rig, "nvmf_subsystem_add_ns", f"nqn={RAW_SUBNQN}", "namespace.bdev_name=Live0"
        )
        assert (status, nsid) == (0, 3)
        assert event(await asyncio.wait_for(aer, 10)) == (2, 0x00, L.LogPageId.CHANGED_NS)
        changed = L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096))
        assert changed.nsids == [3]
        # Read once, the list is empty until the next change.
        assert (
            L.ChangedNsList.unpack(await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096)).nsids
            == []
        )
        await ctrl.refresh_namespaces()
        ns = ctrl.namespace(3)
        await ns.write(10, b"\x5a" * 512, fua=True)
        back = bytearray(512)
        await ns.read(10, memoryview(back))
        assert back == b"\x5a" * 512

        aer = await arm_event(ctrl)
        status, _, _ = await pynvmf_rpc(
            rig, "nvmf_subsystem_remove_ns", f"nqn={RAW_SUBNQN}", "nsid:=3"
        )
        assert status == 0
        assert event(await asyncio.wait_for(aer, 10)) == (2, 0x00, L.LogPageId.CHANGED_NS)
        assert L.ChangedNsList.unpack(
            await ctrl.get_log_page(L.LogPageId.CHANGED_NS, 4096)
        ).nsids == [3]
        await ctrl.refresh_namespaces()
        assert sorted(ctrl.namespaces) == [1, 2]
        with pytest.raises(NvmeError) as info:
            await ctrl.io_command(IoOpcode.READ, 3, 0, 0, 0, into=memoryview(bytearray(512)))
        assert info.value.status & 0x7FF == Status.INVALID_NS
        # The bdev outlived its namespace, with the data written.
        device = rig.target.block_devices["Live0"].device
        check = bytearray(512)
        await device.read(10, memoryview(check))
        assert check == b"\x5a" * 512


async def until(condition: Any, timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (it changes as the event loop runs the target)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_write_in_flight_lands_before_its_namespace_goes(rig: Rig) -> None:
    """A namespace removed while a write waits for its data: the removal waits (and so
    does every other RPC client: calls are serialised) until the write has landed and
    completed with success; then the namespace is gone and later commands fail."""
    rpc = await rig.rpc()
    await rpc.call("bdev_malloc_create", name="Flight0", num_blocks=1024, block_size=512)
    nsid = await rpc.call(
        "nvmf_subsystem_add_ns", nqn=RAW_SUBNQN, namespace={"bdev_name": "Flight0"}
    )
    host = await rig.raw.host()
    io = host.io[0]
    await io.detach()
    nblocks = 64  # 32 KiB: above the in-capsule size, so the target asks for it with R2T
    io.send(io.capsule(R.rw_sqe(IoOpcode.WRITE, 9, nsid, 100, nblocks, nblocks * RAW_NS1_BLOCK)))
    r2t = await io.recv_pdu()
    assert r2t.type == R.P.PduType.R2T
    cccid, ttag, _offset, length = r2t.data_fields()

    other = await rig.rpc()
    rpc.request("nvmf_subsystem_remove_ns", nqn=RAW_SUBNQN, nsid=nsid)
    namespaces = rig.target.subsystems[RAW_SUBNQN].namespaces
    await until(lambda: nsid not in namespaces)  # removed: no new command reaches it
    other.request("bdev_get_bdevs", name="Flight0")
    pending = asyncio.ensure_future(other.recv(timeout=30))
    # Neither call is answered while the write is in flight.
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done
    payload = bytes(range(256)) * (length // 256)
    io.send(R.h2c_data(cccid, ttag, 0, payload))
    resp = await io.recv_pdu()
    assert resp.cqe().cid == 9 and resp.cqe().status == 0
    assert (await rpc.recv())["result"] is True
    (bdev,) = (await pending)["result"]
    assert not bdev["claimed"]
    # What was acknowledged is on the device, which outlives the namespace.
    back = bytearray(length)
    await rig.target.block_devices["Flight0"].device.read(100, memoryview(back))
    assert back == payload
    io.send(io.capsule(R.rw_sqe(IoOpcode.READ, 10, nsid, 100, 1, RAW_NS1_BLOCK)))
    resp = await io.recv_pdu()
    assert resp.cqe().status & 0x7FF == Status.INVALID_NS
    for conn in (rpc, other):
        await conn.close()


async def test_removing_a_subsystem_tears_down_a_connected_host(rig: Rig) -> None:
    port = rig.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_SUBNQN, queues=1)
    other = await connect(port.address, port.port, RAW_RESTRICTED_NQN, hostnqn=RAW_ALLOWED_HOSTNQN)
    try:
        rpc = await rig.rpc()
        assert await rpc.call("nvmf_delete_subsystem", nqn=RAW_SUBNQN) is True
        with pytest.raises(NvmeConnectionError):
            async with asyncio.timeout(10):
                while True:  # the target closed the connections: the next command fails
                    await ctrl.admin_command(AdminOpcode.KEEP_ALIVE)
                    await asyncio.sleep(0.05)
        with pytest.raises(NvmeError, match=r"(?i)invalid"):
            await connect(port.address, port.port, RAW_SUBNQN)
        await other.admin_command(AdminOpcode.KEEP_ALIVE)  # another subsystem's host is fine
        await rpc.close()
    finally:
        for c in (ctrl, other):
            with contextlib.suppress(NvmeError):
                await c.close()


async def test_removing_a_host_tears_down_its_controller(rig: Rig) -> None:
    port = rig.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_RESTRICTED_NQN, hostnqn=RAW_ALLOWED_HOSTNQN)
    try:
        rpc = await rig.rpc()
        controllers = await rpc.call("nvmf_subsystem_get_controllers", nqn=RAW_RESTRICTED_NQN)
        assert [c["hostnqn"] for c in controllers] == [RAW_ALLOWED_HOSTNQN]
        qpairs = await rpc.call("nvmf_subsystem_get_qpairs", nqn=RAW_RESTRICTED_NQN)
        assert [q["qid"] for q in qpairs] == [0, 1]
        assert qpairs[0]["listen_address"]["trsvcid"] == str(port.port)
        await rpc.call(
            "nvmf_subsystem_remove_host", nqn=RAW_RESTRICTED_NQN, host=RAW_ALLOWED_HOSTNQN
        )
        with pytest.raises(NvmeConnectionError):
            async with asyncio.timeout(10):
                while True:
                    await ctrl.admin_command(AdminOpcode.KEEP_ALIVE)
                    await asyncio.sleep(0.05)
        assert await rpc.call("nvmf_subsystem_get_controllers", nqn=RAW_RESTRICTED_NQN) == []
        await rpc.close()
    finally:
        with contextlib.suppress(NvmeError):
            await ctrl.close()


async def test_discovery_controllers_that_asked_hear_of_new_subsystems(rig: Rig) -> None:
    port = rig.target.ports[0]
    ctrl = await connect(port.address, port.port, DISCOVERY_NQN, queues=0, kato_ms=0)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.DISCOVERY_CHANGE)
        before = L.DiscoveryLogHeader.unpack(
            await ctrl.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
        ).genctr
        aer = await arm_event(ctrl)
        rpc = await rig.rpc()
        await rpc.call("nvmf_create_subsystem", nqn=NEW_NQN, allow_any_host=True)
        assert event(await asyncio.wait_for(aer, 10)) == (2, 0xF0, L.LogPageId.DISCOVERY)
        new_port = free_tcp_port()
        await rpc.call(
            "nvmf_subsystem_add_listener",
            nqn=NEW_NQN,
            listen_address={"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": str(new_port)},
        )
        header = L.DiscoveryLogHeader.unpack(
            await ctrl.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
        )
        assert header.genctr > before
        entries = await discover(port.address, port.port)
        assert (NEW_NQN, str(new_port)) in [(e.subnqn, e.trsvcid) for e in entries]
        await rpc.close()
        # The new port takes connections at once.
        async with await connect("127.0.0.1", new_port, NEW_NQN) as fresh:
            assert fresh.namespaces == {}
    finally:
        with contextlib.suppress(NvmeError):
            await ctrl.close()


REFERRED_NQN = "nqn.2024-01.io.pynvmf.test:referred"


async def test_referrals_are_in_the_discovery_log_with_a_new_generation_and_an_event(
    rig: Rig,
) -> None:
    port = rig.target.ports[0]
    ctrl = await connect(port.address, port.port, DISCOVERY_NQN, queues=0, kato_ms=0)
    try:
        await ctrl.set_features(FeatureId.ASYNC_EVENT, Oaes.DISCOVERY_CHANGE)
        before = L.DiscoveryLogHeader.unpack(
            await ctrl.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
        ).genctr
        aer = await arm_event(ctrl)
        rpc = await rig.rpc()
        elsewhere = {"trtype": "TCP", "adrfam": "IPv4", "traddr": "192.0.2.7", "trsvcid": "4420"}
        assert await rpc.call("nvmf_discovery_add_referral", address=elsewhere) is True
        assert event(await asyncio.wait_for(aer, 10)) == (2, 0xF0, L.LogPageId.DISCOVERY)
        await rpc.call(
            "nvmf_discovery_add_referral",
            address={**elsewhere, "trsvcid": "4421"},
            subnqn=REFERRED_NQN,
            secure_channel=True,
        )
        # The same referral again: SPDK takes it and changes nothing.
        genctr = rig.target.genctr
        assert await rpc.call("nvmf_discovery_add_referral", address=elsewhere) is True
        assert rig.target.genctr == genctr
        header = L.DiscoveryLogHeader.unpack(
            await ctrl.get_log_page(L.LogPageId.DISCOVERY, L.DISC_HEADER_SIZE)
        )
        assert header.genctr == before + 2
        entries = await discover(port.address, port.port)
        referrals = [e for e in entries if e.traddr == "192.0.2.7"]
        assert [(e.subtype, e.trsvcid, e.subnqn) for e in referrals] == [
            (L.SubType.DISCOVERY, "4420", DISCOVERY_NQN),
            (L.SubType.NVME, "4421", REFERRED_NQN),
        ]
        assert [e.treq & L.Treq.SECURE_CHANNEL_MASK for e in referrals] == [
            L.Treq.NOT_SPECIFIED,
            L.Treq.REQUIRED,
        ]
        assert await rpc.call("nvmf_discovery_get_referrals") == [
            {"address": elsewhere, "secure_channel": False, "subnqn": DISCOVERY_NQN},
            {
                "address": {**elsewhere, "trsvcid": "4421"},
                "secure_channel": True,
                "subnqn": REFERRED_NQN,
            },
        ]
        aer = await arm_event(ctrl)
        assert await rpc.call("nvmf_discovery_remove_referral", address=elsewhere) is True
        assert event(await asyncio.wait_for(aer, 10)) == (2, 0xF0, L.LogPageId.DISCOVERY)
        entries = await discover(port.address, port.port)
        assert [e.trsvcid for e in entries if e.traddr == "192.0.2.7"] == ["4421"]
        await rpc.close()
    finally:
        with contextlib.suppress(NvmeError):
            await ctrl.close()


async def test_a_referral_to_the_targets_own_listener_is_refused_and_nothing_changes(
    rig: Rig,
) -> None:
    port = rig.target.ports[0]
    rpc = await rig.rpc()
    genctr = rig.target.genctr
    own = {"trtype": "TCP", "adrfam": "IPv4", "traddr": port.address, "trsvcid": str(port.port)}
    rid = rpc.request("nvmf_discovery_add_referral", address=own)
    response = await rpc.recv()
    assert response["id"] == rid
    assert response["error"]["message"].startswith("address.traddr: ")
    assert "own listener" in response["error"]["message"]
    rid = rpc.request(
        "nvmf_discovery_remove_referral",
        address={**own, "traddr": "192.0.2.9"},
    )
    response = await rpc.recv()
    assert response["error"] == {"code": -32603, "message": "Unable to remove a referral."}
    assert rig.target.genctr == genctr and rig.target.referrals == []
    assert await rpc.call("nvmf_discovery_get_referrals") == []
    await rpc.close()


async def test_a_subsystems_controller_ids_come_from_its_range_and_a_full_one_refuses(
    rig: Rig,
) -> None:
    """nvmf_create_subsystem's min_cntlid/max_cntlid: a Connect past the range's last free
    ID gets Connect Controller Busy (as nvmet answers; SPDK: Internal Error)."""
    rpc = await rig.rpc()
    port = free_tcp_port()
    await rpc.call(
        "nvmf_create_subsystem", nqn=NEW_NQN, allow_any_host=True, min_cntlid=7, max_cntlid=7
    )
    await rpc.call(
        "nvmf_subsystem_add_listener",
        nqn=NEW_NQN,
        listen_address={"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": str(port)},
    )
    (sub,) = await rpc.call("nvmf_get_subsystems", nqn=NEW_NQN)
    assert (sub["min_cntlid"], sub["max_cntlid"]) == (7, 7)
    async with await connect("127.0.0.1", port, NEW_NQN, queues=0) as first:
        assert first.cntlid == 7
        with pytest.raises(NvmeStatusError) as refused:
            await connect("127.0.0.1", port, NEW_NQN, queues=0)
        assert refused.value.status == Status.CONNECT_CTRL_BUSY and refused.value.dnr
    await rpc.close()


async def test_removing_a_listener_tears_down_controllers_through_it(rig: Rig) -> None:
    port = rig.target.ports[0]
    ctrl = await connect(port.address, port.port, RAW_SUBNQN)
    try:
        rpc = await rig.rpc()
        await rpc.call(
            "nvmf_subsystem_remove_listener",
            nqn=RAW_SUBNQN,
            listen_address={
                "trtype": "TCP",
                "adrfam": "IPv4",
                "traddr": port.address,
                "trsvcid": str(port.port),
            },
        )
        with pytest.raises(NvmeConnectionError):
            async with asyncio.timeout(10):
                while True:
                    await ctrl.admin_command(AdminOpcode.KEEP_ALIVE)
                    await asyncio.sleep(0.05)
        assert port.subsystems == [RAW_RESTRICTED_NQN]  # the others stay on the port
        with pytest.raises(NvmeError):
            await connect(port.address, port.port, RAW_SUBNQN)
        await rpc.close()
    finally:
        with contextlib.suppress(NvmeError):
            await ctrl.close()


async def test_a_listener_address_that_cannot_be_bound_is_refused_and_nothing_changes(
    rig: Rig,
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        rpc = await rig.rpc()
        before = [(p.address, p.port) for p in rig.target.ports]
        genctr = rig.target.genctr
        rid = rpc.request(
            "nvmf_subsystem_add_listener",
            nqn=RAW_SUBNQN,
            listen_address={"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": str(port)},
        )
        response = await rpc.recv()
        assert response["id"] == rid
        assert response["error"]["message"].startswith(
            f"listen_address.traddr: cannot listen on 127.0.0.1:{port}: "
        )
        assert "in use" in response["error"]["message"].lower()
        assert [(p.address, p.port) for p in rig.target.ports] == before
        assert rig.target.genctr == genctr
        await rpc.close()
    finally:
        taken.close()


async def test_a_write_whose_data_never_comes_does_not_hold_a_removal_forever(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that starts a write and never sends its data: after the drain timeout the
    removal tears that controller down (the host sees its connection close) and ends."""
    monkeypatch.setattr(drain, "DRAIN_TIMEOUT", 0.5)
    host = await rig.raw.host()
    io = host.io[0]
    await io.detach()
    io.send(io.capsule(R.rw_sqe(IoOpcode.WRITE, 5, 2, 0, 16, 16 * 4096)))
    assert (await io.recv_pdu()).type == R.P.PduType.R2T
    rpc = await rig.rpc()
    assert await rpc.call("nvmf_subsystem_remove_ns", nqn=RAW_SUBNQN, nsid=2) is True
    assert await io.expect_eof() == b""
    assert sorted(rig.target.subsystems[RAW_SUBNQN].namespaces) == [1]
    await rpc.close()
