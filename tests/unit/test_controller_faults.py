"""Controller-level fault rules as rules (faults.py): what each action takes and the field
each malformed one is refused for, that not_ready is a per-command status on I/O only, and
that the scheduled actions never judge a command (workers hold them in their tables)."""

from __future__ import annotations

import pytest

from pynvmf.spec.command import Sqe
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import CRD_SHIFT, DNR, Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import (
    MIN_PERIOD_MS,
    FaultSpec,
    FaultTable,
    parse_fault,
    parse_for_ms,
    parse_scenario,
)

SUB = "nqn.2024-01.io.pynvmf.test:faults"
HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"


def sqe(opcode: int = IoOpcode.READ, nsid: int = 1) -> Sqe:
    return Sqe(int(opcode), 0x40, 1, nsid, 0, 512, 0, 0, 0, 0, 0, 0, 0)


def test_not_ready_completes_io_of_its_namespace_with_namespace_not_ready() -> None:
    spec = parse_fault({"action": "not_ready", "nsid": 1, "crd": 2})
    assert spec.status == Status.NS_NOT_READY | 2 << CRD_SHIFT
    assert not spec.status & DNR
    faults = FaultTable()
    faults.add(spec)
    hit = faults.judge(SUB, HOST, 1, sqe())
    assert hit is not None and hit.action == "not_ready"
    assert faults.judge(SUB, HOST, 1, sqe(nsid=2)) is None
    # Admin commands naming the namespace are not I/O: not selected.
    assert faults.judge(SUB, HOST, 0, sqe(AdminOpcode.IDENTIFY)) is None


@pytest.mark.parametrize(
    "rule",
    [
        {"action": "fail_controller", "host": HOST},
        {"action": "ana_flap", "subsystem": SUB, "anagrpid": 1, "period_ms": 2000},
        {"action": "aen_storm", "event": "ns_attr", "period_ms": 100},
    ],
)
def test_scheduled_rules_never_judge_a_command(rule: dict[str, object]) -> None:
    faults = FaultTable()
    added = faults.add(parse_fault(rule))
    assert not added.per_command
    assert faults.judge(SUB, HOST, 1, sqe()) is None
    assert faults.judge(SUB, HOST, 0, sqe(AdminOpcode.KEEP_ALIVE)) is None
    assert added.matches == 0
    # A worker's table follows them as any rule (listing, ids).
    other = FaultTable()
    other.follow(faults.specs())
    assert list(other.rules) == [added.id]


def test_ana_flap_defaults_and_listing() -> None:
    spec = parse_fault(
        {"action": "ana_flap", "subsystem": SUB, "anagrpid": 2, "period_ms": MIN_PERIOD_MS}
    )
    assert spec.flap_states == ("optimized", "inaccessible")
    listed = parse_fault({**spec.as_dict(), "ana_states": ["non-optimized", "change"]}).as_dict()
    assert listed["ana_states"] == ["non-optimized", "change"]


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"action": "not_ready"}, "nsid"),
        ({"action": "not_ready", "nsid": 1, "queue": "admin"}, "queue"),
        ({"action": "not_ready", "nsid": 1, "qid": 0}, "qid"),
        ({"action": "not_ready", "nsid": 1, "opcode": "identify"}, "opcode"),
        ({"action": "not_ready", "nsid": 1, "crd": 4}, "crd"),
        ({"action": "fail_controller", "nsid": 1}, "nsid"),
        ({"action": "fail_controller", "first": 1}, "first"),
        ({"action": "fail_controller", "period_ms": 500}, "period_ms"),
        ({"action": "ana_flap", "anagrpid": 1, "period_ms": 500}, "subsystem"),
        ({"action": "ana_flap", "subsystem": SUB, "period_ms": 500}, "anagrpid"),
        ({"action": "ana_flap", "subsystem": SUB, "anagrpid": 1}, "period_ms"),
        ({"action": "ana_flap", "subsystem": SUB, "anagrpid": 1, "period_ms": 10}, "period_ms"),
        ({"action": "ana_flap", "subsystem": SUB, "anagrpid": 200, "period_ms": 500}, "anagrpid"),
        (
            {
                "action": "ana_flap",
                "subsystem": SUB,
                "anagrpid": 1,
                "period_ms": 500,
                "ana_states": ["optimized", "asleep"],
            },
            "ana_states",
        ),
        (
            {
                "action": "ana_flap",
                "subsystem": SUB,
                "anagrpid": 1,
                "period_ms": 500,
                "ana_states": ["optimized"],
            },
            "ana_states",
        ),
        (
            {
                "action": "ana_flap",
                "subsystem": SUB,
                "anagrpid": 1,
                "period_ms": 500,
                "traddr": "10.0.0.1",
            },
            "trsvcid",
        ),
        (
            {"action": "ana_flap", "subsystem": SUB, "anagrpid": 1, "period_ms": 500, "host": HOST},
            "host",
        ),
        ({"action": "aen_storm", "period_ms": 500}, "event"),
        ({"action": "aen_storm", "event": "smart", "period_ms": 500}, "event"),
        ({"action": "aen_storm", "event": "ana_change", "nsid": 1, "period_ms": 500}, "nsid"),
        (
            {"action": "aen_storm", "event": "ns_attr", "period_ms": 500, "probability": 0.5},
            "probability",
        ),
        ({"action": "delay", "delay_ms": 5, "event": "ns_attr"}, "event"),
        ({"action": "status", "sc": 2, "anagrpid": 1}, "anagrpid"),
    ],
)
def test_a_malformed_controller_level_rule_names_its_field(
    rule: dict[str, object], field: str
) -> None:
    with pytest.raises(ChangeError) as err:
        parse_fault(rule)
    assert err.value.field == field


def test_a_scenario_times_controller_level_rules() -> None:
    (flap, window) = parse_scenario(
        [
            {"action": "ana_flap", "subsystem": SUB, "anagrpid": 1, "period_ms": 2000},
            {"action": "not_ready", "nsid": 1, "at_ms": 1000, "for_ms": 10000},
        ]
    )
    assert flap.for_ms is None and window.at_ms == 1000 and window.for_ms == 10000
    assert parse_for_ms(None) is None
    with pytest.raises(ChangeError) as err:
        parse_for_ms(-5)
    assert err.value.field == "for_ms"
    with pytest.raises(ChangeError) as err:
        parse_scenario([{"action": "aen_storm", "event": "ns_attr", "period_ms": 1}])
    assert err.value.field == "faults[0].period_ms"


def test_fault_spec_defaults_keep_other_actions_as_they_were() -> None:
    assert FaultSpec("drop").as_dict() == {"action": "drop"}
