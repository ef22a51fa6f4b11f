"""Fault rules: what a target told to misbehave does to the commands a rule selects.

A rule is a selector (subsystem, namespace, host, queue, opcode, LBA range), a
trigger (every match, the first N, all after N, or each with probability p drawn
from the rule's own seeded generator, so that one seed hits the same commands on
every run) and an action:

- ``delay``: hold the command that long before it runs (fixed, or drawn from a
  uniform or exponential distribution by the rule's generator);
- ``status``: complete it at once with a chosen status (SCT, SC, DNR, CRD);
- ``drop``: never complete it (the host's timeout runs);
- ``close``: close the connection it came on;
- on the wire (NVMe/TCP PDUs: tcp/wire_faults.py decides what is sent): ``corrupt_digest``,
  ``term_req``, ``malformed_pdu``, ``drop_r2t``, ``stall_c2h``.

Controller-level actions act on the controllers or a namespace a rule names for as long
as it is in force, not on commands one by one (controller_faults.py runs them):
``not_ready`` (a namespace's I/O completes with Namespace Not Ready), ``fail_controller``
(CSTS.CFS, nothing answered), ``ana_flap`` (an ANA group's state cycled on a schedule),
``aen_storm`` (asynchronous events at a rate).

Everything here is plain rules, no I/O: the queue (queue.py) asks `FaultTable.judge`
about a command and does what the answer says; the Target (target.py) checks a rule
against what it serves and owns the table. docs/faults.md describes the format.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pynvmf.spec.command import Sqe
from pynvmf.spec.opcodes import AdminOpcode, IoOpcode
from pynvmf.spec.status import CRD_SHIFT, DNR, Status
from pynvmf.target.ana import ANAGRPMAX, STATE_NAMES, parse_state
from pynvmf.target.changes import ChangeError, check_hostnqn
from pynvmf.target.io import IO_COMMANDS
from pynvmf.tcp.wire_faults import (
    DEFAULT_FES,
    DIGESTS,
    FES_NAMES,
    FES_WITH_FEI,
    MALFORMED_PDUS,
    WIRE_ACTIONS,
    WireFault,
)

# -- controller-level actions (see the module's docstring) --
# Rules that run on a schedule from when they are added until they are removed, and never
# judge a command (FaultRule.per_command is False).
SCHEDULED_ACTIONS: Final = ("fail_controller", "ana_flap", "aen_storm")
CONTROLLER_LEVEL_ACTIONS: Final = ("not_ready", *SCHEDULED_ACTIONS)
# aen_storm's events: Namespace Attribute Changed, or ANA Change notices.
AEN_EVENTS: Final = ("ns_attr", "ana_change")
# The shortest period of a flap or a storm: shorter is a busy loop, not a test.
MIN_PERIOD_MS: Final = 100.0
DEFAULT_FLAP_STATES: Final = ("optimized", "inaccessible")
# The fields of controller-level rules, and the selector fields each action reads (the
# others, given, are refused: they would select nothing the action acts on).
_CONTROLLER_FIELDS: Final = ("anagrpid", "ana_states", "traddr", "trsvcid", "period_ms", "event")
_SELECTORS: Final = ("subsystem", "nsid", "host", "qid", "queue", "opcode", "lba")
_READS: Final = {
    "fail_controller": ("subsystem", "host"),
    "ana_flap": ("subsystem",),
    "aen_storm": ("subsystem", "host", "nsid"),
}
# -- end of the controller-level section --

COMMAND_ACTIONS: Final = ("delay", "status", "drop", "close")
ACTIONS: Final = (*COMMAND_ACTIONS, *WIRE_ACTIONS, *CONTROLLER_LEVEL_ACTIONS)
DISTRIBUTIONS: Final = ("fixed", "uniform", "exponential")
# The fields each distribution of a delay takes.
_DELAY_FIELDS: Final = {
    "fixed": ("delay_ms",),
    "uniform": ("min_ms", "max_ms"),
    "exponential": ("mean_ms",),
}
QUEUE_KINDS: Final = ("admin", "io")
# A delay longer than this is a mistake (an hour: far past any host's timeout).
MAX_DELAY_MS: Final = 3_600_000.0
# Fabrics commands (Connect, Property Get/Set, authentication) are the transport's
# business: no rule selects them.
_FABRICS: Final = int(AdminOpcode.FABRICS)

# Opcodes by name: the NVM command set's as the metrics name them (IoCommand.name), the
# admin commands' as AdminOpcode does, in lower case.
IO_OPCODES: Final[dict[str, int]] = {cmd.name: int(op) for op, cmd in IO_COMMANDS.items()}
ADMIN_OPCODES: Final[dict[str, int]] = {
    op.name.lower(): int(op) for op in AdminOpcode if op != AdminOpcode.FABRICS
}
# The commands whose CDW10-12 hold an LBA range (SLBA, NLB): what an `lba` selector sees.
_LBA_OPCODES: Final = frozenset(
    int(op)
    for op in (
        IoOpcode.READ,
        IoOpcode.WRITE,
        IoOpcode.COMPARE,
        IoOpcode.WRITE_ZEROES,
        IoOpcode.VERIFY,
        IoOpcode.WRITE_UNCORRECTABLE,
    )
)
CRD_MAX: Final = 3
# Rules at a time: an operator's, but a table that only grows is no table to keep.
MAX_RULES: Final = 1024
_IO_NAMES: Final = {number: name for name, number in IO_OPCODES.items()}
_ADMIN_NAMES: Final = {number: name for name, number in ADMIN_OPCODES.items()}


def opcode_name(qid: int, opcode: int) -> str:
    """An opcode as rules name it, or in hex when it has no name."""
    name = (_ADMIN_NAMES if qid == 0 else _IO_NAMES).get(opcode)
    return name if name is not None else f"{opcode:#04x}"


def _integer(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ChangeError(name, f"{value!r} is not an integer in {low}..{high}")
    return value


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ChangeError(name, f"{value!r} is not a number")
    if not low <= value <= high or math.isnan(value):
        raise ChangeError(name, f"{value!r} is not in {low:g}..{high:g}")
    return float(value)


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """A rule as given: plain values (it pickles, and is what pynvmf_fault_list and the
    configuration show). `check` says what is wrong with it, naming the field."""

    action: str
    # Selector: None matches anything.
    subsystem: str | None = None
    nsid: int | None = None
    host: str | None = None
    qid: int | None = None
    queue: str | None = None  # "admin" or "io"
    opcode: str | int | None = None
    lba: tuple[int, int] | None = None  # first and last block, inclusive
    # Trigger: every match, unless one of these.
    first: int | None = None
    after: int | None = None
    probability: float | None = None
    seed: int = 0
    # The most commands the rule acts on; then it selects without acting (None: no end).
    limit: int | None = None
    # delay
    distribution: str = "fixed"
    delay_ms: float | None = None  # fixed
    min_ms: float | None = None  # uniform
    max_ms: float | None = None
    mean_ms: float | None = None  # exponential
    # status
    sct: int = 0
    sc: int | None = None
    dnr: bool = False
    crd: int = 0  # status, not_ready
    # -- controller-level actions --
    anagrpid: int | None = None  # ana_flap: the group
    ana_states: tuple[str, ...] | None = None  # ana_flap: the states it cycles through
    traddr: str | None = None  # ana_flap: on this listener only (with trsvcid)
    trsvcid: int | None = None
    period_ms: float | None = None  # ana_flap, aen_storm: time between two changes
    event: str | None = None  # aen_storm: one of AEN_EVENTS
    # -- on the wire (tcp/wire_faults.py) --
    digest: str | None = None  # corrupt_digest: "header" or "data"
    fes: str | int | None = None  # term_req: a FES by name or number (default: sequence error)
    fei: int | None = None  # term_req, with a FES that has an FEI
    pdu: str | None = None  # malformed_pdu: "type", "hlen" or "plen"

    def check(self) -> None:
        """Raise ChangeError naming the first field that is wrong."""
        if self.action not in ACTIONS:
            raise ChangeError("action", f"{self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.subsystem is not None and not isinstance(self.subsystem, str):
            raise ChangeError("subsystem", f"{self.subsystem!r} is not an NQN")
        if self.nsid is not None:
            _integer("nsid", self.nsid, 1, 0xFFFFFFFE)
        if self.host is not None:
            try:
                check_hostnqn(self.host)
            except ChangeError as exc:
                raise ChangeError("host", exc.reason) from None
        if self.qid is not None:
            _integer("qid", self.qid, 0, 0xFFFF)
        if self.queue is not None and self.queue not in QUEUE_KINDS:
            raise ChangeError("queue", f"{self.queue!r} is not one of {', '.join(QUEUE_KINDS)}")
        self.opcode_set()
        if self.lba is not None:
            lba = self.lba
            if not isinstance(lba, tuple | list) or len(lba) != 2:
                raise ChangeError("lba", f"{lba!r} is not [first, last]")
            first = _integer("lba", lba[0], 0, (1 << 64) - 1)
            if _integer("lba", lba[1], first, (1 << 64) - 1) < first:
                raise ChangeError("lba", "last is before first")
        triggers = [k for k in ("first", "after", "probability") if getattr(self, k) is not None]
        if len(triggers) > 1:
            raise ChangeError(triggers[1], f"a rule has one trigger, and {triggers[0]} is one")
        if self.first is not None:
            _integer("first", self.first, 1, 1 << 63)
        if self.after is not None:
            _integer("after", self.after, 0, 1 << 63)
        if self.probability is not None:
            _number("probability", self.probability, 0.0, 1.0)
        _integer("seed", self.seed, 0, (1 << 64) - 1)
        if self.limit is not None:
            _integer("limit", self.limit, 1, 1 << 63)
        if self.action == "delay":
            self._check_delay()
        if self.action == "status":
            self._check_status()
        self._check_controller_level()
        self._check_wire()

    def _check_delay(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ChangeError(
                "distribution",
                f"{self.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}",
            )
        needs = _DELAY_FIELDS[self.distribution]
        for name in ("delay_ms", "min_ms", "max_ms", "mean_ms"):
            value = getattr(self, name)
            if name in needs:
                if value is None:
                    raise ChangeError(name, f"missing (a {self.distribution} delay)")
                _number(name, value, 0.0, MAX_DELAY_MS)
            elif value is not None:
                raise ChangeError(name, f"not part of a {self.distribution} delay")
        if self.distribution == "uniform" and self.max_ms < self.min_ms:  # type: ignore[operator]
            raise ChangeError("max_ms", "below min_ms")

    def _check_status(self) -> None:
        if self.sc is None:
            raise ChangeError("sc", "missing (the status code to complete with)")
        _integer("sct", self.sct, 0, 7)
        _integer("sc", self.sc, 0, 0xFF)
        if not isinstance(self.dnr, bool):
            raise ChangeError("dnr", f"{self.dnr!r} is not a boolean")
        _integer("crd", self.crd, 0, CRD_MAX)
        if self.sct == 0 and self.sc == 0:
            raise ChangeError("sc", "0 with SCT 0 is success, not a fault")

    # -- controller-level actions --

    def _check_controller_level(self) -> None:
        action = self.action
        if action not in CONTROLLER_LEVEL_ACTIONS:
            for name in _CONTROLLER_FIELDS:
                if getattr(self, name) is not None:
                    raise ChangeError(name, f"not part of a {action} rule")
            return
        if action == "not_ready":
            self._check_not_ready()
            return
        for name in _SELECTORS:
            if getattr(self, name) is not None and name not in _READS[action]:
                raise ChangeError(name, f"a {action} rule does not select by {name}")
        for name in ("first", "after", "probability"):
            if getattr(self, name) is not None:
                raise ChangeError(name, f"a {action} rule has no trigger (it runs while added)")
        wanted = {"ana_flap": ("anagrpid", "ana_states", "traddr", "trsvcid", "period_ms")}.get(
            action, ("period_ms", "event") if action == "aen_storm" else ()
        )
        for name in _CONTROLLER_FIELDS:
            if getattr(self, name) is not None and name not in wanted:
                raise ChangeError(name, f"not part of a {action} rule")
        if action == "fail_controller":
            return
        if self.period_ms is None:
            raise ChangeError("period_ms", f"missing (how often the {action} acts)")
        _number("period_ms", self.period_ms, MIN_PERIOD_MS, MAX_DELAY_MS)
        if action == "aen_storm":
            if self.event not in AEN_EVENTS:
                raise ChangeError("event", f"{self.event!r} is not one of {', '.join(AEN_EVENTS)}")
            if self.event == "ana_change" and self.nsid is not None:
                raise ChangeError("nsid", "an ana_change event names no namespace")
            return
        self._check_ana_flap()

    def _check_not_ready(self) -> None:
        if self.nsid is None:
            raise ChangeError("nsid", "missing (the namespace that is not ready)")
        if self.queue == "admin" or self.qid == 0:
            raise ChangeError(
                "queue" if self.queue else "qid", "not_ready acts on I/O commands only"
            )
        if self.opcode_set()[0] is True:
            raise ChangeError("opcode", "not_ready acts on I/O commands only")
        _integer("crd", self.crd, 0, CRD_MAX)

    def _check_ana_flap(self) -> None:
        if self.subsystem is None:
            raise ChangeError("subsystem", "missing (the subsystem whose ANA group flaps)")
        if self.anagrpid is None:
            raise ChangeError("anagrpid", "missing (the ANA group that flaps)")
        _integer("anagrpid", self.anagrpid, 1, ANAGRPMAX)
        states = self.flap_states
        if not isinstance(states, tuple | list) or len(states) < 2:
            raise ChangeError("ana_states", "a list of at least two ANA states")
        for state in states:
            if parse_state(state) is None:
                raise ChangeError(
                    "ana_states", f"{state!r} is not an ANA state ({', '.join(STATE_NAMES)})"
                )
        if (self.traddr is None) != (self.trsvcid is None):
            raise ChangeError(
                "trsvcid" if self.trsvcid is None else "traddr",
                "a listener is traddr and trsvcid together",
            )
        if self.traddr is not None and not isinstance(self.traddr, str):
            raise ChangeError("traddr", f"{self.traddr!r} is not an address")
        if self.trsvcid is not None:
            _integer("trsvcid", self.trsvcid, 1, 0xFFFF)

    @property
    def flap_states(self) -> tuple[str, ...]:
        """The ANA states an ana_flap rule cycles through, as given or the default."""
        return DEFAULT_FLAP_STATES if self.ana_states is None else tuple(self.ana_states)

    @property
    def per_command(self) -> bool:
        """Whether the rule judges commands (every action but the scheduled ones)."""
        return self.action not in SCHEDULED_ACTIONS

    # -- end of the controller-level section --

    # -- on the wire --------------------------------------------------------------------

    def _check_wire(self) -> None:
        action = self.action
        for name, owner in (
            ("digest", "corrupt_digest"),
            ("fes", "term_req"),
            ("fei", "term_req"),
            ("pdu", "malformed_pdu"),
        ):
            if getattr(self, name) is not None and action != owner:
                raise ChangeError(name, f"only for action {owner}")
        if action == "corrupt_digest":
            if self.digest is None:
                raise ChangeError("digest", f"missing (one of {', '.join(DIGESTS)})")
            if self.digest not in DIGESTS:
                raise ChangeError("digest", f"{self.digest!r} is not one of {', '.join(DIGESTS)}")
            if self.digest == "data":
                self._check_direction(0x2, "a data digest is only on data sent to the host")
        elif action == "stall_c2h":
            self._check_direction(0x2, "only data sent to the host can stall")
        elif action == "drop_r2t":
            self._check_direction(0x1, "only a command with data from the host has an R2T")
        elif action == "term_req":
            fes = self.fes_number()
            if self.fei is not None:
                if fes not in FES_WITH_FEI:
                    raise ChangeError("fei", f"FES {fes:#x} has no FEI (reserved)")
                _integer("fei", self.fei, 0, 0xFFFFFFFF)
        elif action == "malformed_pdu" and self.pdu not in MALFORMED_PDUS:
            if self.pdu is None:
                raise ChangeError("pdu", f"missing (one of {', '.join(MALFORMED_PDUS)})")
            raise ChangeError("pdu", f"{self.pdu!r} is not one of {', '.join(MALFORMED_PDUS)}")

    def _check_direction(self, bit: int, why: str) -> None:
        """A wire action about data moving one way selects commands whose opcode moves it
        so (the opcode's data direction bits: 01b to the controller, 10b to the host)."""
        _admin, opcode = self.opcode_set()
        if opcode is not None and not opcode & bit:
            raise ChangeError("opcode", f"{self.opcode!r}: {why}")

    def fes_number(self) -> int:
        """A term_req rule's FES as a number."""
        fes = self.fes
        if fes is None:
            return DEFAULT_FES
        if isinstance(fes, str):
            if fes not in FES_NAMES:
                raise ChangeError("fes", f"{fes!r} is not one of {', '.join(FES_NAMES)}")
            return FES_NAMES[fes]
        return _integer("fes", fes, min(FES_NAMES.values()), max(FES_NAMES.values()))

    def wire_fault(self) -> WireFault | None:
        """What the transport is asked to do for a command the rule hit (None: not a rule
        about the wire)."""
        if self.action not in WIRE_ACTIONS:
            return None
        return WireFault(
            self.action,
            digest=self.digest or "",
            fes=self.fes_number() if self.action == "term_req" else DEFAULT_FES,
            fei=self.fei or 0,
            pdu=self.pdu or "",
        )

    def opcode_set(self) -> tuple[bool | None, int | None]:
        """(admin: True, I/O: False, either: None; the opcode or None for any)."""
        admin = None if self.queue is None else self.queue == "admin"
        opcode = self.opcode
        if opcode is None:
            return admin, None
        if isinstance(opcode, str):
            if admin is not True and opcode in IO_OPCODES:
                return False, IO_OPCODES[opcode]
            if admin is not False and opcode in ADMIN_OPCODES:
                return True, ADMIN_OPCODES[opcode]
            names = IO_OPCODES if admin is False else ADMIN_OPCODES if admin else {}
            known = ", ".join(names) if names else "an I/O or admin command's name"
            raise ChangeError("opcode", f"{opcode!r} is not {known}")
        number = _integer("opcode", opcode, 0, 0xFF)
        if number == _FABRICS:
            raise ChangeError("opcode", "Fabrics commands are not selected by fault rules")
        # A number is an I/O opcode unless the rule selects admin queues.
        return admin is True, number

    @property
    def status(self) -> int:
        """The completion's status field (pynvmf's layout, status.py): SCT, SC, CRD, DNR."""
        if self.action == "not_ready":
            # Namespace Not Ready, DNR clear: the host retries (after CRD, where enabled).
            return Status.NS_NOT_READY | (self.crd << CRD_SHIFT)
        dnr = DNR if self.dnr else 0
        return (self.sct << 8) | (self.sc or 0) | (self.crd << CRD_SHIFT) | dnr

    def as_dict(self) -> dict[str, Any]:
        """The fields given, as the configuration and pynvmf_fault_list show them."""
        defaults = FaultSpec(self.action)
        out = {k: v for k, v in asdict(self).items() if v != getattr(defaults, k)}
        out["action"] = self.action
        if self.lba is not None:
            out["lba"] = list(self.lba)
        if self.ana_states is not None:
            out["ana_states"] = list(self.ana_states)
        return out


# A rule's fields, in the order FaultSpec declares them.
FAULT_FIELDS: Final = tuple(FaultSpec.__dataclass_fields__)


def parse_fault(entry: Mapping[str, Any]) -> FaultSpec:
    """A rule from its JSON form (the configuration file, a scenario file), checked."""
    if not isinstance(entry, Mapping):
        raise ChangeError("fault", "must be an object")
    unknown = sorted(set(entry) - set(FAULT_FIELDS))
    if unknown:
        raise ChangeError(unknown[0], "unknown field")
    if "action" not in entry:
        raise ChangeError("action", f"missing (one of {', '.join(ACTIONS)})")
    values = dict(entry)
    for name in ("lba", "ana_states"):
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    spec = FaultSpec(**values)
    spec.check()
    return spec


def parse_for_ms(value: object) -> float | None:
    """A rule's lifetime (a scenario's or pynvmf_fault_add's `for_ms`): None for no end."""
    return None if value is None else _number("for_ms", value, 0.0, float(1 << 53))


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    """A rule of a scenario: added `at_ms` after the scenario starts, removed `for_ms`
    after it was added (None: stays)."""

    spec: FaultSpec
    at_ms: float = 0.0
    for_ms: float | None = None


def parse_scenario(entries: object) -> list[ScheduledFault]:
    """A scenario (`pynvmf target --faults FILE`, the configuration's `faults`): a list
    of rules, each optionally with at_ms and for_ms. ChangeError names the entry."""
    if not isinstance(entries, list):
        raise ChangeError("faults", "must be a list of rules")
    scenario = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ChangeError(f"faults[{i}]", "must be an object")
        rule = dict(entry)
        try:
            at_ms = _number("at_ms", rule.pop("at_ms", 0.0), 0.0, float(1 << 53))
            for_ms = parse_for_ms(rule.pop("for_ms", None))
            scenario.append(ScheduledFault(parse_fault(rule), at_ms, for_ms))
        except ChangeError as exc:
            raise ChangeError(f"faults[{i}].{exc.field}", exc.reason) from None
    return scenario


@dataclass(frozen=True, slots=True)
class Hit:
    """What a rule does to the command it hit: its action, and for a delay how long."""

    rule: FaultRule
    action: str
    delay_s: float = 0.0

    @property
    def wire(self) -> WireFault | None:
        """For a rule about the wire, what the transport is to do."""
        return self.rule.wire


@dataclass(slots=True)
class FaultRule:
    """A checked rule in a table: what it selects, and what it has counted."""

    id: int
    spec: FaultSpec
    admin: bool | None = None
    opcode: int | None = None
    matches: int = 0
    hits: int = 0
    rng: random.Random = field(default_factory=random.Random)
    # What take_counts reported of matches and hits so far.
    taken: tuple[int, int] = (0, 0)
    # False for a controller-level rule that runs on a schedule (controller_faults.py).
    per_command: bool = True
    # A rule about the wire: what it asks of the transport.
    wire: WireFault | None = None

    @classmethod
    def of(cls, rule_id: int, spec: FaultSpec) -> FaultRule:
        admin, opcode = spec.opcode_set()
        if spec.action == "not_ready":
            admin = False  # a namespace's I/O, never its admin commands
        rng = random.Random(spec.seed)
        return cls(
            rule_id,
            spec,
            admin,
            opcode,
            rng=rng,
            per_command=spec.per_command,
            wire=spec.wire_fault(),
        )

    def selects(self, subnqn: str, hostnqn: str, qid: int, sqe: Sqe) -> bool:
        spec = self.spec
        admin = qid == 0
        if self.admin is not None and self.admin != admin:
            return False
        if self.opcode is not None and self.opcode != sqe.opcode:
            return False
        if spec.subsystem is not None and spec.subsystem != subnqn:
            return False
        if spec.host is not None and spec.host != hostnqn:
            return False
        if spec.qid is not None and spec.qid != qid:
            return False
        if spec.nsid is not None and spec.nsid != sqe.nsid:
            return False
        if spec.lba is not None:
            if admin or sqe.opcode not in _LBA_OPCODES:
                return False
            slba = sqe.cdw10 | sqe.cdw11 << 32
            last = slba + (sqe.cdw12 & 0xFFFF)
            if last < spec.lba[0] or slba > spec.lba[1]:
                return False
        return True

    def fires(self) -> bool:
        """A selected command came: whether the trigger fires for it (counted here)."""
        self.matches += 1
        spec = self.spec
        if spec.limit is not None and self.hits >= spec.limit:
            return False
        if spec.first is not None:
            return self.matches <= spec.first
        if spec.after is not None:
            return self.matches > spec.after
        if spec.probability is not None:
            return self.rng.random() < spec.probability
        return True

    def delay_s(self) -> float:
        spec = self.spec
        if spec.distribution == "uniform":
            ms = self.rng.uniform(spec.min_ms or 0.0, spec.max_ms or 0.0)
        elif spec.distribution == "exponential":
            mean = spec.mean_ms or 0.0
            ms = min(self.rng.expovariate(1.0 / mean), MAX_DELAY_MS) if mean else 0.0
        else:
            ms = spec.delay_ms or 0.0
        return ms / 1000.0

    def listing(self) -> dict[str, Any]:
        spec = self.spec.as_dict()
        return {"id": self.id, "rule": spec, "matches": self.matches, "hits": self.hits}


class FaultTable:
    """The rules in force, in the order they were added: a command is judged by the first
    rule that selects it and fires."""

    def __init__(self) -> None:
        self.rules: dict[int, FaultRule] = {}
        self._next_id = 1
        # Hits of rules since removed, so that a total never goes down.
        self.removed_hits = 0
        # Counts of rules removed before take_counts reported them.
        self._untaken: dict[int, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def add(self, spec: FaultSpec, rule_id: int | None = None) -> FaultRule:
        """Add a checked rule; `rule_id` keeps the number another table gave it."""
        if len(self.rules) >= MAX_RULES:
            raise ChangeError("action", f"{MAX_RULES} fault rules are in force already")
        if rule_id is None:
            rule_id = self._next_id
        elif rule_id in self.rules:
            raise ChangeError("id", f"rule {rule_id} exists")
        self._next_id = max(self._next_id, rule_id + 1)
        rule = self.rules[rule_id] = FaultRule.of(rule_id, spec)
        return rule

    def remove(self, rule_id: int) -> FaultRule:
        rule = self.rules.pop(rule_id, None)
        if rule is None:
            raise ChangeError("id", f"no fault rule {rule_id}")
        self.removed_hits += rule.hits
        matches, hits = rule.matches - rule.taken[0], rule.hits - rule.taken[1]
        if matches or hits:
            self._untaken[rule_id] = (matches, hits)
        return rule

    def judge(
        self,
        subnqn: str,
        hostnqn: str,
        qid: int,
        sqe: Sqe,
        wire: Callable[[WireFault], bool] | None = None,
    ) -> Hit | None:
        """What to do with a command that arrived: None to run it as usual. `wire` says
        whether a rule about the wire can act on this command on its connection (the
        transport's can_inject; None: none can): a rule that cannot selects nothing."""
        if sqe.opcode == _FABRICS:
            return None
        for rule in self.rules.values():
            if not rule.per_command:
                continue
            if rule.wire is not None and (wire is None or not wire(rule.wire)):
                continue
            if rule.selects(subnqn, hostnqn, qid, sqe) and rule.fires():
                rule.hits += 1
                action = rule.spec.action
                return Hit(rule, action, rule.delay_s() if action == "delay" else 0.0)
        return None

    def hits(self) -> dict[int, int]:
        return {rule_id: rule.hits for rule_id, rule in self.rules.items()}

    def take_counts(self) -> dict[int, tuple[int, int]]:
        """(matches, hits) of each rule since the last call: what a worker process
        reports to the main one, whose table holds the totals (add_counts)."""
        counts, self._untaken = self._untaken, {}
        for rule in self.rules.values():
            matches, hits = rule.matches - rule.taken[0], rule.hits - rule.taken[1]
            if matches or hits:
                counts[rule.id] = (matches, hits)
                rule.taken = (rule.matches, rule.hits)
        return counts

    def add_counts(self, counts: dict[int, tuple[int, int]]) -> None:
        """Another process's take_counts, added to the rules (those since removed: to
        removed_hits). ValueError, adding nothing, for anything but counts."""
        for rule_id, pair in counts.items():
            if (
                not isinstance(rule_id, int)
                or not isinstance(pair, tuple)
                or len(pair) != 2
                or not all(isinstance(n, int) and n >= 0 for n in pair)
            ):
                raise ValueError(f"fault rule counts {rule_id!r}: {pair!r}")
        for rule_id, (matches, hits) in counts.items():
            rule = self.rules.get(rule_id)
            if rule is None:
                self.removed_hits += hits
            else:
                rule.matches += matches
                rule.hits += hits

    def follow(self, rules: list[tuple[int, FaultSpec]]) -> None:
        """Become `rules` (id and rule, as another process's table has them), keeping
        the counts and generator of each rule that stays."""
        wanted = dict(rules)
        for rule_id in [i for i, r in self.rules.items() if wanted.get(i) != r.spec]:
            self.remove(rule_id)
        for rule_id, spec in wanted.items():
            if rule_id not in self.rules:
                self.add(spec, rule_id)

    def specs(self) -> list[tuple[int, FaultSpec]]:
        """The rules as `follow` takes them."""
        return [(rule_id, rule.spec) for rule_id, rule in self.rules.items()]
