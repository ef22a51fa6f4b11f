"""The fault rules (target/faults.py): what a selector selects, when a trigger fires, that
a seed makes a probabilistic rule hit the same commands on every run, what a delay draws,
and the field each malformed rule is refused for."""

from __future__ import annotations

import pytest

from pynvmf.spec.command import Sqe
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import DNR, Status
from pynvmf.target.changes import ChangeError
from pynvmf.target.faults import MAX_RULES, FaultSpec, FaultTable, parse_fault, parse_scenario

SUB = "nqn.2024-01.io.pynvmf.test:faults"
OTHER_SUB = "nqn.2024-01.io.pynvmf.test:other"
HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"
OTHER_HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002"


def sqe(opcode: int = IoOpcode.READ, nsid: int = 1, slba: int = 0, nlb: int = 1) -> Sqe:
    return Sqe(
        int(opcode), 0x40, 1, nsid, 0, 512 * nlb, 0, slba & 0xFFFFFFFF, slba >> 32, nlb - 1, 0, 0, 0
    )


def table(**rule: object) -> FaultTable:
    faults = FaultTable()
    faults.add(parse_fault({"action": "drop", **rule}))
    return faults


def hit(
    faults: FaultTable, cmd: Sqe | None = None, *, sub: str = SUB, host: str = HOST, qid: int = 1
) -> bool:
    return faults.judge(sub, host, qid, cmd or sqe()) is not None


def test_an_empty_selector_selects_every_command_but_fabrics() -> None:
    faults = table()
    assert hit(faults)
    assert hit(faults, sqe(AdminOpcode.IDENTIFY), qid=0)
    assert not hit(faults, sqe(AdminOpcode.FABRICS), qid=0)


@pytest.mark.parametrize(
    ("rule", "selected", "not_selected"),
    [
        ({"subsystem": SUB}, {}, {"sub": OTHER_SUB}),
        ({"host": HOST}, {}, {"host": OTHER_HOST}),
        ({"qid": 2}, {"qid": 2}, {"qid": 1}),
        ({"queue": "admin"}, {"qid": 0}, {"qid": 3}),
        ({"queue": "io"}, {"qid": 3}, {"qid": 0}),
    ],
)
def test_a_selector_on_the_queue(
    rule: dict[str, object], selected: dict[str, object], not_selected: dict[str, object]
) -> None:
    faults = table(**rule)
    assert hit(faults, **selected)  # type: ignore[arg-type]
    assert not hit(faults, **not_selected)  # type: ignore[arg-type]


def test_opcodes_by_name_or_number_on_their_queue() -> None:
    by_name = table(opcode="write")
    assert hit(by_name, sqe(IoOpcode.WRITE))
    assert not hit(by_name, sqe(IoOpcode.READ))
    # Create I/O SQ is opcode 01h too, on the admin queue: not a Write.
    assert not hit(by_name, sqe(AdminOpcode.CREATE_SQ), qid=0)
    admin = table(opcode="keep_alive")
    assert hit(admin, sqe(AdminOpcode.KEEP_ALIVE), qid=0)
    assert not hit(admin, sqe(AdminOpcode.KEEP_ALIVE), qid=1)
    assert hit(table(opcode=2), sqe(IoOpcode.READ))
    assert hit(table(opcode=6, queue="admin"), sqe(AdminOpcode.IDENTIFY), qid=0)
    assert hit(table(opcode="dsm"), sqe(IoOpcode.DATASET_MANAGEMENT))


def test_nsid_and_lba_range() -> None:
    faults = table(nsid=2, lba=[100, 199])
    assert hit(faults, sqe(nsid=2, slba=150))
    assert hit(faults, sqe(nsid=2, slba=90, nlb=11))  # its last block is 100
    assert not hit(faults, sqe(nsid=2, slba=90, nlb=10))
    assert not hit(faults, sqe(nsid=2, slba=200))
    assert not hit(faults, sqe(nsid=1, slba=150))
    # A command without an LBA range is not in any.
    assert not hit(faults, sqe(IoOpcode.FLUSH, nsid=2))
    assert hit(table(lba=[1 << 40, 1 << 40]), sqe(slba=1 << 40))


def test_first_n_and_after_n() -> None:
    first = table(first=2)
    assert [hit(first) for _ in range(4)] == [True, True, False, False]
    after = table(after=2)
    assert [hit(after) for _ in range(4)] == [False, False, True, True]
    rule = first.rules[1]
    assert (rule.matches, rule.hits) == (4, 2)


def test_unselected_commands_do_not_count_towards_a_trigger() -> None:
    faults = table(opcode="write", first=1)
    assert not hit(faults, sqe(IoOpcode.READ))
    assert hit(faults, sqe(IoOpcode.WRITE))
    assert faults.rules[1].matches == 1


def _pattern(seed: int, n: int = 200) -> list[bool]:
    faults = table(probability=0.3, seed=seed)
    return [hit(faults) for _ in range(n)]


def test_the_same_seed_hits_the_same_commands() -> None:
    a = _pattern(7)
    assert a == _pattern(7)
    assert a != _pattern(8)
    assert 30 < sum(a) < 90  # about 0.3 of 200


def test_probability_zero_and_one() -> None:
    assert not any(_hits(0.0))
    assert all(_hits(1.0))


def _hits(p: float) -> list[bool]:
    faults = table(probability=p)
    return [hit(faults) for _ in range(50)]


def test_the_first_rule_that_fires_acts() -> None:
    faults = FaultTable()
    faults.add(parse_fault({"action": "drop", "opcode": "write", "first": 1}))
    faults.add(parse_fault({"action": "close"}))
    actions = [faults.judge(SUB, HOST, 1, sqe(IoOpcode.WRITE)) for _ in range(2)]
    assert [a.action for a in actions if a] == ["drop", "close"]


def test_delays_fixed_and_drawn_from_the_seed() -> None:
    fixed = FaultTable()
    fixed.add(parse_fault({"action": "delay", "delay_ms": 250}))
    judged = fixed.judge(SUB, HOST, 1, sqe())
    assert judged is not None and judged.delay_s == 0.25

    def draws(spec: dict[str, object]) -> list[float]:
        faults = FaultTable()
        faults.add(parse_fault({"action": "delay", "seed": 3, **spec}))
        return [faults.judge(SUB, HOST, 1, sqe()).delay_s for _ in range(100)]  # type: ignore[union-attr]

    uniform = draws({"distribution": "uniform", "min_ms": 10, "max_ms": 20})
    assert all(0.010 <= d <= 0.020 for d in uniform)
    assert uniform == draws({"distribution": "uniform", "min_ms": 10, "max_ms": 20})
    assert len(set(uniform)) > 50
    exponential = draws({"distribution": "exponential", "mean_ms": 5})
    assert 0.002 < sum(exponential) / len(exponential) < 0.010


def test_status_field() -> None:
    spec = parse_fault({"action": "status", "sct": 0, "sc": 0x82, "crd": 2, "dnr": False})
    assert spec.status == Status.NS_NOT_READY | 2 << 11
    dnr = parse_fault({"action": "status", "sct": 3, "sc": 0})
    assert dnr.status == Status.INTERNAL_PATH_ERROR
    assert parse_fault({"action": "status", "sc": 6, "dnr": True}).status == 6 | DNR


def test_removal_keeps_the_total() -> None:
    faults = table()
    hit(faults)
    faults.add(parse_fault({"action": "close"}))
    removed = faults.remove(1)
    assert removed.hits == 1 and faults.removed_hits == 1
    assert list(faults.rules) == [2]
    with pytest.raises(ChangeError) as err:
        faults.remove(1)
    assert err.value.field == "id"


def test_listing_shows_the_rule_as_given() -> None:
    faults = table(opcode="read", lba=[0, 7])
    hit(faults)
    assert faults.rules[1].listing() == {
        "id": 1,
        "rule": {"action": "drop", "opcode": "read", "lba": [0, 7]},
        "matches": 1,
        "hits": 1,
    }
    assert parse_fault(faults.rules[1].listing()["rule"]) == faults.rules[1].spec


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"action": "explode"}, "action"),
        ({}, "action"),
        ({"action": "drop", "colour": "red"}, "colour"),
        ({"action": "drop", "probability": 1.5}, "probability"),
        ({"action": "drop", "probability": -0.1}, "probability"),
        ({"action": "drop", "probability": "half"}, "probability"),
        ({"action": "drop", "first": 2, "after": 3}, "after"),
        ({"action": "drop", "first": 0}, "first"),
        ({"action": "drop", "nsid": 0}, "nsid"),
        ({"action": "drop", "host": "not an nqn"}, "host"),
        ({"action": "drop", "qid": -1}, "qid"),
        ({"action": "drop", "queue": "both"}, "queue"),
        ({"action": "drop", "opcode": "frobnicate"}, "opcode"),
        ({"action": "drop", "opcode": "keep_alive", "queue": "io"}, "opcode"),
        ({"action": "drop", "opcode": 0x7F}, "opcode"),
        ({"action": "drop", "opcode": 256}, "opcode"),
        ({"action": "drop", "lba": [5, 4]}, "lba"),
        ({"action": "drop", "lba": [5]}, "lba"),
        ({"action": "delay"}, "delay_ms"),
        ({"action": "delay", "delay_ms": -1}, "delay_ms"),
        ({"action": "delay", "delay_ms": 1, "mean_ms": 3}, "mean_ms"),
        ({"action": "delay", "distribution": "normal", "delay_ms": 1}, "distribution"),
        ({"action": "delay", "distribution": "uniform", "min_ms": 5, "max_ms": 1}, "max_ms"),
        ({"action": "status"}, "sc"),
        ({"action": "status", "sc": 256}, "sc"),
        ({"action": "status", "sct": 8, "sc": 1}, "sct"),
        ({"action": "status", "sc": 0}, "sc"),
        ({"action": "status", "sc": 2, "crd": 4}, "crd"),
        ({"action": "status", "sc": 2, "dnr": 1}, "dnr"),
    ],
)
def test_a_malformed_rule_names_its_field(rule: dict[str, object], field: str) -> None:
    with pytest.raises(ChangeError) as err:
        parse_fault(rule)
    assert err.value.field == field


def test_scenario_entries() -> None:
    scenario = parse_scenario(
        [{"action": "drop", "at_ms": 100, "for_ms": 50}, {"action": "close", "after": 3}]
    )
    assert [(e.at_ms, e.for_ms, e.spec.action) for e in scenario] == [
        (100.0, 50.0, "drop"),
        (0.0, None, "close"),
    ]
    assert scenario[1].spec == FaultSpec("close", after=3)
    with pytest.raises(ChangeError) as err:
        parse_scenario([{"action": "drop"}, {"action": "drop", "at_ms": -5}])
    assert err.value.field == "faults[1].at_ms"
    with pytest.raises(ChangeError) as err:
        parse_scenario({"action": "drop"})
    assert err.value.field == "faults"


def test_a_table_holds_a_bounded_number_of_rules() -> None:
    faults = FaultTable()
    for _ in range(MAX_RULES):
        faults.add(FaultSpec("drop"))
    with pytest.raises(ChangeError, match=f"{MAX_RULES} fault rules"):
        faults.add(FaultSpec("drop"))


def test_a_limit_ends_the_hits() -> None:
    faults = table(after=2, limit=1)
    assert [hit(faults) for _ in range(5)] == [False, False, True, False, False]
    sampled = table(probability=1.0, limit=2)
    assert [hit(sampled) for _ in range(3)] == [True, True, False]
    with pytest.raises(ChangeError) as err:
        parse_fault({"action": "close", "limit": 0})
    assert err.value.field == "limit"


def test_a_worker_follows_the_rules_and_reports_its_counts() -> None:
    main = FaultTable()
    main.add(parse_fault({"action": "drop", "opcode": "read"}))
    main.add(parse_fault({"action": "close", "opcode": "flush"}))
    worker = FaultTable()
    worker.follow(main.specs())
    assert worker.specs() == main.specs()
    hit(worker)
    hit(worker)
    hit(worker, sqe(IoOpcode.WRITE))  # selected by neither
    assert worker.take_counts() == {1: (2, 2)}
    assert worker.take_counts() == {}
    main.add_counts({1: (2, 2)})
    assert (main.rules[1].matches, main.rules[1].hits) == (2, 2)
    # Rule 1 goes: the worker's counts of it since its last report still come back.
    hit(worker)
    main.remove(1)
    worker.follow(main.specs())
    assert list(worker.rules) == [2]
    main.add_counts(worker.take_counts())
    assert main.removed_hits == 3
    with pytest.raises(ValueError):
        main.add_counts({2: (-1, 0)})
    with pytest.raises(ValueError):
        main.add_counts({2: "many"})  # type: ignore[dict-item]
    assert main.rules[2].hits == 0
