"""Fault scenarios: rules in pynvmf's configuration file and in `pynvmf target --faults
FILE`, each added at_ms after the start and removed for_ms after; what a refused scenario
says; the configuration written back holds the rules in force."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pynvmf.config.native import DEFAULT_NQN, ConfigError, build_target, config_of
from pynvmf.host import NvmeStatusError, connect
from pynvmf.rpc.client import RpcClient
from pynvmf.spec.status import Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import ScheduledFault, parse_fault
from tests.support.target_process import TargetProcess

NQN = "nqn.2024-01.io.pynvmf.test:scenarios"


def _config(**extra: object) -> dict[str, object]:
    return {
        "ports": [{"address": "127.0.0.1", "port": 0}],
        "discovery_ports": [],
        "subsystems": [{"nqn": NQN, "namespaces": [{"memory": 1 << 20}]}],
        **extra,
    }


async def _until(condition: object, timeout: float = 10.0) -> None:
    """Until `condition()` holds (a timer of the target's own loop makes it so)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_scenario_adds_and_removes_its_rules_on_time() -> None:
    target = await build_target(_config())
    await target.start()
    try:
        began = time.monotonic()
        target.schedule_faults(
            [
                ScheduledFault(parse_fault({"action": "drop", "opcode": "read"}), 0, 200),
                ScheduledFault(parse_fault({"action": "close", "opcode": "flush"}), 150, None),
            ]
        )
        assert [r.spec.action for r in target.faults.rules.values()] == ["drop"]
        await _until(lambda: 2 in target.faults.rules)
        assert time.monotonic() - began >= 0.15
        await _until(lambda: 1 not in target.faults.rules)
        assert time.monotonic() - began >= 0.2
        assert list(target.faults.rules) == [2]
    finally:
        await target.stop()


async def test_a_scenario_with_a_rule_refused_adds_none() -> None:
    target = await build_target(_config())
    await target.start()
    try:
        with pytest.raises(ChangeError) as err:
            target.schedule_faults(
                [
                    ScheduledFault(parse_fault({"action": "drop"})),
                    ScheduledFault(parse_fault({"action": "drop", "subsystem": NQN, "nsid": 5})),
                ]
            )
        assert err.value.field == "faults[1].nsid"
        assert not target.faults.rules
    finally:
        await target.stop()


async def test_the_configuration_file_holds_crdt_and_rules() -> None:
    rule = {"action": "status", "subsystem": NQN, "opcode": "read", "sc": 0x82, "crd": 1}
    target = await build_target(_config(crdt=[3, 0, 0], faults=[rule]))
    await target.start()
    try:
        assert target.crdt == (3, 0, 0)
        port = target.ports[0]
        async with await connect(port.address, port.port, NQN) as ctrl:
            with pytest.raises(NvmeStatusError) as err:
                await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
            assert err.value.status == Status.NS_NOT_READY
        written = config_of(target)
        assert written["crdt"] == [3, 0, 0] and written["faults"] == [rule]
    finally:
        await target.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"faults": [{"action": "drop", "probability": 3}]}, "faults[0].probability"),
        ({"faults": [{"action": "status", "sc": 2, "crd": 2}]}, "faults[0].crd"),
        ({"crdt": [1, 2]}, "crdt"),
    ],
)
async def test_a_bad_fault_configuration_names_the_entry(
    extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        await build_target(_config(**extra))


def test_pynvmf_target_faults_file(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps([{"action": "status", "opcode": "read", "sc": 6, "first": 1, "seed": 1}])
    )
    proc = TargetProcess(
        None,
        tmp_path,
        ["--listen", "127.0.0.1:0", "--discovery-port", "0", "--faults", str(scenario)],
    )
    proc.start()
    try:

        async def read_twice() -> None:
            async with await connect(proc.address, proc.port, DEFAULT_NQN) as ctrl:
                with pytest.raises(NvmeStatusError) as err:
                    await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
                assert err.value.status == Status.INTERNAL_ERROR
                await ctrl.namespace(1).read(0, memoryview(bytearray(512)))

        asyncio.run(read_twice())
        assert proc.wait_log(r"fault rule 1: (status) qid 1", 1, timeout=30) == ["status"]
    finally:
        proc.stop(sig=signal.SIGINT)


def test_pynvmf_target_refuses_a_bad_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps([{"action": "explode"}]))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pynvmf",
            "target",
            "--listen",
            "127.0.0.1:0",
            "--discovery-port",
            "0",
            "--faults",
            str(scenario),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"--faults {scenario}: faults[0].action:" in result.stderr


def test_pynvmf_target_faults_file_on_two_cores(tmp_path: Path) -> None:
    """The I/O queues on worker processes follow the rules (added and removed), and the
    hits they count come back to pynvmf_fault_list."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps([{"action": "status", "opcode": "read", "sc": 6}]))
    socket_path = str(tmp_path / "rpc.sock")
    proc = TargetProcess(
        None,
        tmp_path,
        [
            *("--listen", "127.0.0.1:0", "--discovery-port", "0", "--cores", "2"),
            *("--faults", str(scenario), "--rpc-socket", socket_path),
        ],
    )
    proc.start()

    def rpc(method: str, **params: object) -> Any:
        with RpcClient(socket_path) as client:
            return client.call(method, params)

    try:

        async def reads(fail: bool) -> None:
            async with await connect(proc.address, proc.port, DEFAULT_NQN, queues=2) as ctrl:
                for _ in range(4):  # round robin over both I/O queues, on both workers
                    if fail:
                        with pytest.raises(NvmeStatusError) as err:
                            await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
                        assert err.value.status == Status.INTERNAL_ERROR
                    else:
                        await ctrl.namespace(1).read(0, memoryview(bytearray(512)))

        asyncio.run(reads(fail=True))
        # Each worker reports its counts within half a second.
        deadline = time.monotonic() + 30
        while (listed := rpc("pynvmf_fault_list"))[0]["hits"] < 4:
            assert time.monotonic() < deadline, listed
            time.sleep(0.1)
        assert listed[0]["hits"] == 4 and listed[0]["matches"] == 4
        rpc("pynvmf_fault_remove", id=1)
        asyncio.run(reads(fail=False))
        rule = rpc("pynvmf_fault_add", action="status", opcode="read", sc=6, first=1)
        asyncio.run(_one_failure(proc))
        assert rule == 2
    finally:
        proc.stop(sig=signal.SIGINT)


async def _one_failure(proc: TargetProcess) -> None:
    """A rule added while the target runs reaches the workers before the next Connect."""
    async with await connect(proc.address, proc.port, DEFAULT_NQN, queues=1) as ctrl:
        with pytest.raises(NvmeStatusError):
            await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
        await ctrl.namespace(1).read(0, memoryview(bytearray(512)))
