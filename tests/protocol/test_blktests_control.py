"""contrib/blktests/nvme-target-control, called the way blktests calls it (common/nvme,
tests/nvme/rc), against a pynvmf target's TCP RPC; pynvmf's host checks the result."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pynvmf.host import NvmeError, connect
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.target.server import Target
from tests.interop.guest import free_tcp_port

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).resolve().parents[2] / "contrib" / "blktests" / "nvme-target-control"
HOSTID = "0f01fb42-9f7f-4856-b0b3-51e60b8de349"
HOSTNQN = f"nqn.2014-08.org.nvmexpress:uuid:{HOSTID}"
OTHER_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f01fb42-0000-4000-8000-000000000002"
SUBSYSNQN = "blktests-subsystem-1"
SUBSYS_UUID = "91fdba0d-f87b-4c25-b80f-db7be1418b9e"


@dataclass
class Served:
    target: Target
    env: dict[str, str]
    port: int


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """An empty target whose RPC listens on TCP, as `pynvmf target --empty --rpc-listen`."""
    target = Target()
    await target.start()
    server = RpcServer(control_plane(target))
    await server.listen_tcp("127.0.0.1", 0)
    assert server.tcp_address is not None
    port = free_tcp_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYNVMF_RPC": f"127.0.0.1:{server.tcp_address[1]}",
        "PYNVMF_TRSVCID": str(port),
        "PYNVMF_HOSTNQN": HOSTNQN,
        "PYNVMF_HOSTID": HOSTID,
    }
    yield Served(target, env, port)
    await server.close()
    await target.stop()


async def control(served: Served, *args: str) -> tuple[int, str, str]:
    """The script, as a separate process with only the standard library (-I: no site
    packages, no pynvmf), as blktests runs it: (status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(SCRIPT),
        *args,
        env=served.env,
        cwd="/",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_config_prints_one_line_per_setting(served: Served) -> None:
    expected = {
        "--show-trtype": "tcp",
        "--show-blkdev-type": "device",
        "--show-hostnqn": HOSTNQN,
        "--show-hostid": HOSTID,
        "--show-traddr": "127.0.0.1",
        "--show-trsvid": str(served.port),
        "--show-subsys-uuid": SUBSYS_UUID,
        "--show-subsysnqn": SUBSYSNQN,
    }
    for option, value in expected.items():
        assert await control(served, "config", option) == (0, value + "\n", "")


async def test_setup_makes_a_fresh_namespace_for_that_host_and_cleanup_removes_it(
    served: Served,
) -> None:
    # _nvmet_target_setup: setup --subsysnqn --subsys-uuid --hostnqn (nothing printed).
    status, out, err = await control(
        served,
        "setup",
        "--subsysnqn",
        SUBSYSNQN,
        "--subsys-uuid",
        SUBSYS_UUID,
        "--hostnqn",
        HOSTNQN,
    )
    assert (status, out, err) == (0, "", "")
    hostid = uuid.UUID(HOSTID).bytes
    async with await connect(
        "127.0.0.1", served.port, SUBSYSNQN, hostnqn=HOSTNQN, hostid=hostid
    ) as ctrl:
        assert sorted(ctrl.namespaces) == [1]
        ns = ctrl.namespace(1)
        assert ns.capabilities.size >= 1 << 30
        ident = await ctrl.identify_namespace(1)
        assert ident.nsze * ns.capabilities.block_size == ns.capabilities.size
        target_ns = served.target.subsystems[SUBSYSNQN].namespaces[1]
        assert str(target_ns.uuid) == SUBSYS_UUID
        first = bytearray(4096)
        await ns.read(0, memoryview(first))
        assert first == bytes(4096)  # fresh: zero-filled
        await ns.write(0, b"\xaa" * 4096, fua=True)
    with pytest.raises(NvmeError):
        await connect("127.0.0.1", served.port, SUBSYSNQN, hostnqn=OTHER_HOSTNQN)

    # A second setup (a test after an earlier one) starts from zeroes again.
    assert (
        await control(
            served,
            "setup",
            "--subsysnqn",
            SUBSYSNQN,
            "--subsys-uuid",
            SUBSYS_UUID,
            "--hostnqn",
            HOSTNQN,
        )
    )[0] == 0
    async with await connect(
        "127.0.0.1", served.port, SUBSYSNQN, hostnqn=HOSTNQN, hostid=hostid
    ) as ctrl:
        again = bytearray(4096)
        await ctrl.namespace(1).read(0, memoryview(again))
        assert again == bytes(4096)

    # _nvmet_target_cleanup: cleanup --subsysnqn (stdout to /dev/null, stderr kept).
    status, _out, err = await control(served, "cleanup", "--subsysnqn", SUBSYSNQN)
    assert (status, err) == (0, "")
    assert SUBSYSNQN not in served.target.subsystems
    assert not served.target.block_devices
    with pytest.raises(NvmeError):
        await connect("127.0.0.1", served.port, SUBSYSNQN, hostnqn=HOSTNQN)
    # Cleaning up what is not there is not an error.
    assert await control(served, "cleanup", "--subsysnqn", "blktests-subsystem-9") == (0, "", "")


async def test_what_pynvmf_cannot_do_fails_on_stderr_and_changes_nothing(served: Served) -> None:
    status, out, err = await control(
        served,
        "setup",
        "--subsysnqn",
        SUBSYSNQN,
        "--subsys-uuid",
        SUBSYS_UUID,
        "--hostnqn",
        HOSTNQN,
        "--ctrkey",
        "DHHC-1:00:abcd:",
    )
    assert status == 1 and out == ""
    assert "DH-HMAC-CHAP" in err
    assert not served.target.subsystems
    # A target that cannot listen where asked: the subsystem made on the way is removed.
    served.env["PYNVMF_TRADDR"] = "192.0.2.1"  # TEST-NET-1: not an address of this host
    status, _out, err = await control(
        served,
        "setup",
        "--subsysnqn",
        SUBSYSNQN,
        "--subsys-uuid",
        SUBSYS_UUID,
        "--hostnqn",
        HOSTNQN,
    )
    assert status == 1 and "listen_address" in err
    assert not served.target.subsystems and not served.target.block_devices
