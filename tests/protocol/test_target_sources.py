"""`pynvmf target` started from what the control plane writes: a running target saved
with `pynvmf rpc save-config` (pynvmf's format and nvmetcli's) starts again from the
file with `--config` / `--nvmetcli-config`, serving the same namespaces with the same
identities and data."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pynvmf.host import connect
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

pytestmark = pytest.mark.timeout(120)

NQN = "nqn.2024-11.dev.pynvmf:sources"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-0000000000aa"


def rpc(socket: str, *args: str) -> object:
    result = subprocess.run(
        [sys.executable, "-m", "pynvmf", "rpc", "--server", socket, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def identities(port: int) -> list[tuple[int, str, bytes]]:
    async with await connect("127.0.0.1", port, NQN, hostnqn=HOST) as ctrl:
        out = []
        for nsid, ns in sorted(ctrl.namespaces.items()):
            ident = await ctrl.identify_namespace(nsid)
            data = bytearray(4096)
            await ns.read(0, memoryview(data))
            out.append((nsid, ident.nguid.hex(), bytes(data[:16])))
        return out


async def write_marks(port: int) -> None:
    async with await connect("127.0.0.1", port, NQN, hostnqn=HOST) as ctrl:
        for nsid, ns in ctrl.namespaces.items():
            await ns.write(0, bytes([nsid]) * 4096, fua=True)


@pytest.mark.parametrize(
    ("fmt", "option"), [("pynvmf", "--config"), ("nvmetcli", "--nvmetcli-config")]
)
def test_a_saved_target_starts_again_from_its_file(tmp_path: Path, fmt: str, option: str) -> None:
    port = free_tcp_port()
    socket = str(tmp_path / "rpc.sock")
    first = TargetProcess(None, tmp_path, ["--empty", "--rpc-socket", socket])
    first.start()
    try:
        for name in ("a", "b"):
            image = tmp_path / f"{name}.img"
            image.write_bytes(bytes(4 << 20))
            rpc(socket, "bdev_aio_create", f"name={name}", f"filename={image}")
        rpc(socket, "nvmf_create_subsystem", f"nqn={NQN}", "serial_number=SRC0001")
        rpc(socket, "nvmf_subsystem_add_host", f"nqn={NQN}", f"host={HOST}")
        rpc(socket, "nvmf_subsystem_add_ns", f"nqn={NQN}", "namespace.bdev_name=a")
        rpc(
            socket,
            "nvmf_subsystem_add_ns",
            f"nqn={NQN}",
            "namespace.bdev_name=b",
            "namespace.nsid:=7",
        )
        rpc(
            socket,
            "nvmf_subsystem_add_listener",
            f"nqn={NQN}",
            "listen_address.trtype=tcp",
            "listen_address.traddr=127.0.0.1",
            f"listen_address.trsvcid={port}",
        )
        asyncio.run(write_marks(port))
        before = asyncio.run(identities(port))
        saved = tmp_path / "saved.json"
        assert rpc(socket, "save-config", str(saved), "--format", fmt) is True
        written = rpc(socket, "get-config", "--format", fmt)
        assert json.loads(saved.read_text()) == written
    finally:
        first.stop()
    assert [nsid for nsid, _, _ in before] == [1, 7]
    assert [mark for _, _, mark in before] == [b"\x01" * 16, b"\x07" * 16]

    second = TargetProcess(None, tmp_path / "second", [option, str(saved), "--rpc-socket", socket])
    (tmp_path / "second").mkdir()
    second.start()
    try:
        assert asyncio.run(identities(port)) == before
        assert rpc(socket, "get-config", "--format", fmt) == written
    finally:
        second.stop()
