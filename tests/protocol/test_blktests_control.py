"""contrib/blktests/nvme-target-control, called the way blktests calls it (common/nvme,
tests/nvme/rc, and the options contrib/blktests/blktests-target-control.patch adds),
against a pynvmf target's TCP RPC; pynvmf's host checks the result. The nvmet
counterpart (nvmet-target-control) needs a kernel with nvmet: here its command line is
checked, and `make blktests` runs it in a guest."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pynvmf.auth import DhchapKey
from pynvmf.host import NvmeAuthenticationError, NvmeError, connect
from pynvmf.rpc.client import RpcClient
from pynvmf.rpc.server import RpcServer, control_plane
from pynvmf.target.target import Target
from pynvmf.tcp.psk import ConfiguredPsk
from tests.support.ports import free_tcp_port

pytestmark = pytest.mark.timeout(120)

CONTRIB = Path(__file__).resolve().parents[2] / "contrib" / "blktests"
SCRIPT = CONTRIB / "nvme-target-control"
NVMET_SCRIPT = CONTRIB / "nvmet-target-control"
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


async def control(served: Served, *args: str, script: Path = SCRIPT) -> tuple[int, str, str]:
    """The script, as a separate process with only the standard library (-I: no site
    packages, no pynvmf), as blktests runs it: (status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(script),
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


SETUP = ("setup", "--subsysnqn", SUBSYSNQN, "--subsys-uuid", SUBSYS_UUID, "--hostnqn", HOSTNQN)


async def _connect(served: Served, port: int | None = None, **kw: object) -> object:
    return await connect(
        "127.0.0.1",
        port or served.port,
        SUBSYSNQN,
        hostnqn=HOSTNQN,
        hostid=uuid.UUID(HOSTID).bytes,
        **kw,  # type: ignore[arg-type]
    )


async def test_config_answers_several_options_in_order(served: Served) -> None:
    # blktests asks one at a time; a person may ask for several: one line each.
    status, out, err = await control(served, "config", "--show-subsysnqn", "--show-trtype")
    assert (status, err) == (0, "")
    assert out.splitlines() == ["tcp", SUBSYSNQN]  # the documented order


async def test_dhchap_keys_make_the_host_authenticate_and_cleanup_drops_them(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    # nvme/041-045: setup --hostkey, and --ctrkey as blktests master spells it.
    host_key = DhchapKey.generate().representation()
    ctrl_key = DhchapKey.generate(48).representation()
    status, out, err = await control(served, *SETUP, "--hostkey", host_key, "--ctrkey", ctrl_key)
    assert (status, out, err) == (0, "", "")
    with pytest.raises(NvmeError):  # no key: refused
        await _connect(served)
    with pytest.raises(NvmeAuthenticationError):  # a wrong key: refused
        await _connect(served, dhchap_secret=DhchapKey.generate().representation())
    with caplog.at_level(logging.INFO, logger="pynvmf"):
        async with await _connect(  # type: ignore[attr-defined]
            served, dhchap_secret=host_key, dhchap_ctrl_secret=ctrl_key
        ) as ctrl:
            assert sorted(ctrl.namespaces) == [1]
    assert "bidirectional" in caplog.text
    # The keys went through the RPC; what the target shows is their names only.
    listed = served.target.subsystems[SUBSYSNQN]
    assert host_key not in repr(listed.host_auth) and len(served.target.keyring) == 2
    assert await control(served, "cleanup", "--subsysnqn", SUBSYSNQN) == (0, "", "")
    assert not served.target.keyring and not served.target.subsystems


async def test_set_host_changes_keys_hash_and_group_for_the_next_authentication(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    # The patch's set-host: what _set_nvmet_hostkey, _hash and _dhgroup write to configfs.
    old = DhchapKey.generate().representation()
    assert (await control(served, *SETUP, "--hostkey", old))[0] == 0
    new = DhchapKey.generate().representation()
    status, out, err = await control(
        served,
        "set-host",
        "--hostnqn",
        HOSTNQN,
        "--hostkey",
        new,
        "--hash",
        "hmac(sha384)",
        "--dhgroup",
        "ffdhe3072",
    )
    assert (status, out, err) == (0, "", "")
    with pytest.raises(NvmeAuthenticationError):
        await _connect(served, dhchap_secret=old)
    with caplog.at_level(logging.INFO, logger="pynvmf"):
        async with await _connect(served, dhchap_secret=new):  # type: ignore[attr-defined]
            pass
    # The Linux host offers every hash and group: the configured ones are picked.
    assert "authenticated (sha384, ffdhe3072)" in caplog.text
    assert len(served.target.keyring) == 1  # the replaced key is gone
    # A controller key added later makes it bidirectional.
    ctrl_key = DhchapKey.generate().representation()
    assert (await control(served, "set-host", "--hostnqn", HOSTNQN, "--ctrlkey", ctrl_key))[0] == 0
    async with await _connect(  # type: ignore[attr-defined]
        served, dhchap_secret=new, dhchap_ctrl_secret=ctrl_key
    ):
        pass
    assert await control(served, "cleanup", "--subsysnqn", SUBSYSNQN) == (0, "", "")
    assert not served.target.keyring


async def test_tls_setup_offers_tls_and_force_tls_requires_it(served: Served) -> None:
    # nvme/062 with the patch: setup --tls (TREQ not required) / --force-tls, --tlskey.
    psk = ConfiguredPsk(1, os.urandom(32)).encode()
    status, out, err = await control(served, *SETUP, "--force-tls", "--tlskey", psk)
    assert (status, out, err) == (0, "", "")
    with pytest.raises((NvmeError, OSError, asyncio.IncompleteReadError)):
        await _connect(served, timeout=10)  # plaintext on a TLS-only port
    async with await _connect(served, tls_psk=psk) as ctrl:  # type: ignore[attr-defined]
        assert sorted(ctrl.namespaces) == [1]
    port = served.target.find_port("127.0.0.1", served.port)
    assert port is not None and port.secure_channel == "required"
    assert (await control(served, *SETUP, "--tls", "--tlskey", psk))[0] == 0
    port = served.target.find_port("127.0.0.1", served.port)
    assert port is not None and port.secure_channel == "optional"
    async with await _connect(served, tls_psk=psk):  # type: ignore[attr-defined]
        pass
    assert await control(served, "cleanup", "--subsysnqn", SUBSYSNQN) == (0, "", "")
    # The port goes with its only subsystem: a later plain setup gets a plain port.
    assert served.target.find_port("127.0.0.1", served.port) is None
    assert not served.target.keyring


async def test_add_ports_listens_on_the_next_ports(served: Served) -> None:
    assert (await control(served, *SETUP))[0] == 0
    extra = free_tcp_port()
    served.env["PYNVMF_TRSVCID"] = str(extra - 1)  # add-ports uses the ports after it
    status, out, err = await control(
        served,
        "add-ports",
        "--ports",
        "1",
        "--subsysnqn",
        SUBSYSNQN,
        "--subsys-uuid",
        SUBSYS_UUID,
        "--hostnqn",
        HOSTNQN,
    )
    assert (status, out, err) == (0, "", "")
    async with await _connect(served, port=extra) as ctrl:  # type: ignore[attr-defined]
        assert sorted(ctrl.namespaces) == [1]
    assert await control(served, "cleanup", "--subsysnqn", SUBSYSNQN) == (0, "", "")


async def test_what_fails_is_on_stderr_and_changes_nothing(served: Served) -> None:
    # A key that is not one: refused by the target, nothing left behind, no key echoed.
    bad = "DHHC-1:00:bm90IGEga2V5IGF0IGFsbCwganVzdCB0ZXh0Cg==:"
    status, out, err = await control(served, *SETUP, "--hostkey", bad)
    assert status == 1 and out == "" and "DHHC-1 secret" in err and bad not in err
    assert not served.target.subsystems and not served.target.keyring
    assert not served.target.block_devices
    # A controller key without a host key: nvmet would authenticate nobody.
    status, _out, err = await control(served, *SETUP, "--ctrlkey", bad)
    assert status == 1 and "--hostkey" in err
    # A target that cannot listen where asked: the subsystem made on the way is removed.
    served.env["PYNVMF_TRADDR"] = "192.0.2.1"  # TEST-NET-1: not an address of this host
    status, _out, err = await control(served, *SETUP)
    assert status == 1 and "listen_address" in err
    assert not served.target.subsystems and not served.target.block_devices


@pytest.mark.parametrize("script", [SCRIPT, NVMET_SCRIPT], ids=lambda p: p.name)
async def test_both_scripts_take_every_option_blktests_passes(served: Served, script: Path) -> None:
    """The command line blktests master (and the patch) uses, parsed by both scripts;
    nvmet's cannot go further on a machine without nvmet."""
    for args in (
        ("config", "--show-blkdev-type"),
        ("config", "--show-host-traddr"),
        ("setup", "--help"),
        ("add-ports", "--help"),
        ("set-host", "--help"),
        ("cleanup", "--help"),
    ):
        status, out, err = await control(served, *args, script=script)
        assert (status, err) == (0, ""), args
    status, out, _err = await control(served, "setup", "--help", script=script)
    for option in ("--hostkey", "--ctrlkey", "--ctrkey", "--tls", "--force-tls", "--tlskey"):
        assert option in out
    status, _out, err = await control(served, *SETUP, "--no-such-option", script=script)
    assert status == 2 and "unrecognized arguments" in err
    status, out, _err = await control(served, "config", "--show-trtype", script=script)
    assert (status, out) == (0, "tcp\n")


@pytest.mark.parametrize(
    ("script", "env"),
    [
        (SCRIPT, {"PYNVMF_TRTYPE": "rdma", "PYNVMF_TRADDR": "10.0.2.15"}),
        (NVMET_SCRIPT, {"NVMET_TRTYPE": "rdma", "NVMET_TRADDR": "10.0.2.15"}),
    ],
    ids=["nvme-target-control", "nvmet-target-control"],
)
async def test_over_rdma_the_scripts_answer_rdma_and_the_soft_roce_address(
    served: Served, script: Path, env: dict[str, str]
) -> None:
    # blktests takes NVMET_TRTYPES and the address it connects to from config.
    served.env.update(env)
    status, out, err = await control(
        served, "config", "--show-trtype", "--show-traddr", script=script
    )
    assert (status, out, err) == (0, "rdma\n10.0.2.15\n", "")
    # A transport neither script sets a target up on: the variable is named.
    served.env.update({k: "fc" for k in env if k.endswith("TRTYPE")})
    status, out, err = await control(served, "config", "--show-trtype", script=script)
    assert status == 1 and out == "" and "TRTYPE: 'fc'" in err


def _rpc(served: Served, method: str, **params: object) -> Any:
    """One call to the target's RPC, as the scripts make it (blocking: run in a thread)."""
    with RpcClient(served.env["PYNVMF_RPC"]) as rpc:
        return rpc.call(method, **params)


async def test_setup_over_rdma_makes_the_rdma_transport_and_an_rdma_listener(
    served: Served,
) -> None:
    served.env.update({"PYNVMF_TRTYPE": "rdma", "PYNVMF_TRADDR": "192.0.2.1"})
    # TLS is NVMe/TCP's: refused before anything is made.
    status, _out, err = await control(served, *SETUP, "--tls")
    assert status == 1 and "TLS" in err and not served.target.subsystems
    # This machine has no RDMA device on that address (nor soft-RoCE): the rdma listener
    # the script asks for cannot open, and the subsystem made on the way goes. What it
    # asked for is what a guest with soft-RoCE serves (tests/blktests/rdma.py).
    status, _out, err = await control(served, *SETUP)
    assert status == 1 and "listen_address" in err, err
    assert not served.target.subsystems and not served.target.block_devices
    transports = await asyncio.to_thread(_rpc, served, "nvmf_get_transports", trtype="RDMA")
    assert [t["trtype"] for t in transports] == ["RDMA"]
    # A second setup finds the transport there (SPDK's create refuses a second one).
    status, _out, err = await control(served, *SETUP)
    assert status == 1 and "already exists" not in err and "listen_address" in err, err
