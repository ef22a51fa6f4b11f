"""`pynvmf controllers` and the live fields it reads (nvmf_subsystem_get_controllers,
nvmf_subsystem_get_qpairs): who is connected, from where, with how many queues, which
keep-alive timeout, DH-HMAC-CHAP state (SPDK's `auth` object) and TLS."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from pynvmf.auth import DhchapKey
from pynvmf.auth.controller import HostAuthConfig
from pynvmf.cli.controllers import joined, table
from pynvmf.cli.top_view import plain_text
from pynvmf.host import connect
from tests.protocol.conftest import RAW_RESTRICTED_NQN, RAW_SUBNQN, RawRpcTarget

pytestmark = pytest.mark.timeout(120)

PLAIN = "nqn.2014-08.org.nvmexpress:uuid:0000000c-0000-4000-8000-00000000000c"
AUTHED = "nqn.2014-08.org.nvmexpress:uuid:0000000d-0000-4000-8000-00000000000d"
KEY = DhchapKey.generate(32)


async def _command(rt: RawRpcTarget, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pynvmf",
        "controllers",
        "--server",
        rt.socket,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_connected_hosts_are_listed_with_their_queues_and_security(
    raw_rpc_target: RawRpcTarget,
) -> None:
    rt = raw_rpc_target
    target = rt.target
    target.add_host(RAW_RESTRICTED_NQN, AUTHED, auth=HostAuthConfig(KEY))
    port = target.ports[0]
    plain = await connect(
        port.address, port.port, RAW_SUBNQN, hostnqn=PLAIN, queues=2, kato_ms=15000
    )
    authed = await connect(
        port.address, port.port, RAW_RESTRICTED_NQN, hostnqn=AUTHED, queues=1, dhchap_secret=KEY
    )
    try:
        qpairs = await rt.ok("nvmf_subsystem_get_qpairs", nqn=RAW_RESTRICTED_NQN)
        assert len(qpairs) == 2
        for q in qpairs:  # SPDK's names; the hash and group the host chose
            assert q["auth"]["state"] == "completed"
            assert q["auth"]["digest"] in ("sha256", "sha384", "sha512")
            assert q["auth"]["dhgroup"].startswith(("null", "ffdhe"))
        assert all(q["tls"] is False for q in qpairs)
        assert "auth" not in (await rt.ok("nvmf_subsystem_get_qpairs", nqn=RAW_SUBNQN))[0]

        rc, out, err = await _command(rt, "--json")
        assert rc == 0, err
        records: list[dict[str, Any]] = json.loads(out)
        by_host = {r["host"]: r for r in records}
        assert by_host[PLAIN]["subsystem"] == RAW_SUBNQN
        assert by_host[PLAIN]["queues"] == 3  # the admin queue and two I/O queues
        assert by_host[PLAIN]["kato_ms"] == 15000
        assert by_host[PLAIN]["auth"] == "-" and by_host[PLAIN]["tls"] is False
        assert by_host[PLAIN]["address"].startswith("127.0.0.1:")
        assert by_host[AUTHED]["queues"] == 2
        assert by_host[AUTHED]["auth"].startswith("completed ")

        rc, out, err = await _command(rt, "--subsystem", RAW_SUBNQN)
        assert rc == 0, err
        header, *lines = out.splitlines()
        assert header.split() == [
            "SUBSYSTEM", "CNTLID", "HOST", "HOSTID", "ADDRESS", "QUEUES", "KATO", "AUTH", "TLS"
        ]  # fmt: skip
        assert len(lines) == 1 and PLAIN in lines[0] and AUTHED not in out

        rc, out, err = await _command(rt, "--subsystem", "nqn.2024-01.io.pynvmf:none")
        assert rc == 1 and "nqn" in err and not out
    finally:
        await plain.close()
        await authed.close()


def test_odd_host_nqns_are_shown_printable() -> None:
    controllers = {
        RAW_SUBNQN: [
            {"cntlid": 2, "hostnqn": "nqn.x\x1b[31m\nevil", "hostid": "h", "num_io_qpairs": 1}
        ]
    }
    qpairs = {RAW_SUBNQN: [{"cntlid": 2, "qid": 0}]}
    text = plain_text(table(joined(controllers, qpairs)))
    assert "\x1b" not in text and "\nevil" not in text
    assert "nqn.x?[31m?evil" in text
