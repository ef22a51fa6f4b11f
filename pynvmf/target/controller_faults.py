"""Controller-level fault rules that run on a schedule, not per command (faults.py's
SCHEDULED_ACTIONS): from when a rule is added until it is removed.

- ``fail_controller``: the (enabled) controllers the rule selects when it is added get
  CSTS.CFS and answer nothing but Fabrics commands from then on (queue.py holds their commands
  as dropped ones). A failed controller stays failed until its host resets it (a new
  association, or CC.EN cleared) or its keep-alive expires here: its held commands are
  no traffic, so the target's own KATO timer ends it. Controllers made later are healthy.
- ``ana_flap``: an ANA group of a subsystem cycles through the rule's states every
  period, on one listener or on all; each change goes through Target.set_ana_state, which
  decides what it means for the connected hosts (ANA Change events, path statuses, the
  workers' copy). Removing the rule puts back the state the group had.
- ``aen_storm``: every period, each controller the rule selects that has an Asynchronous
  Event Request outstanding (and has not left the last event's log page unread) gets a
  Namespace Attribute Changed or ANA Change notice through the controller's own event
  path. A controller without an AER gets nothing: nothing queues up.

A rule counts what it selected (matches: controllers, or ticks) and what it did (hits:
controllers failed, state changes, events raised); `limit` ends a flap or a storm after
that many hits. One timer per rule, at most MAX_RULES rules: memory stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pynvmf.spec.command import CSTS_CFS, CSTS_RDY
from pynvmf.spec.identify import Oaes
from pynvmf.spec.logpages import LogPageId
from pynvmf.target.ana import NAMES
from pynvmf.target.changes import ChangeError

if TYPE_CHECKING:
    from pynvmf.target.controller import Controller
    from pynvmf.target.faults import FaultRule, FaultSpec
    from pynvmf.target.target import Target

log = logging.getLogger(__name__)

# An aen_storm event: the feature bit a host enables it with, and the log page it names.
_EVENTS: dict[str, tuple[int, int]] = {
    "ns_attr": (Oaes.NS_ATTR, LogPageId.CHANGED_NS),
    "ana_change": (Oaes.ANA_CHANGE, LogPageId.ANA),
}


def selected_controllers(target: Target, spec: FaultSpec) -> Iterator[Controller]:
    """The live controllers of I/O subsystems that a rule's subsystem and host select."""
    for nqn, subsystem in target.subsystems.items():
        if spec.subsystem is not None and spec.subsystem != nqn:
            continue
        for ctrl in list(subsystem.controllers.values()):
            if ctrl.destroyed or ctrl.is_discovery:
                continue
            if spec.host is None or spec.host == ctrl.hostnqn:
                yield ctrl


class _Periodic:
    """A rule that acts every period_ms until stopped or its limit is reached."""

    def __init__(self, target: Target, rule: FaultRule) -> None:
        self.target = target
        self.rule = rule
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._tick()

    def _tick(self) -> None:
        self._timer = None
        try:
            self.act()
        except ChangeError as exc:
            # What it acted on went away (a subsystem, a listener): the rule stops acting.
            log.warning("fault rule %d stops: %s", self.rule.id, exc)
            return
        limit = self.rule.spec.limit
        if limit is not None and self.rule.hits >= limit:
            return
        period = (self.rule.spec.period_ms or 0.0) / 1000.0
        self._timer = asyncio.get_running_loop().call_later(period, self._tick)

    def act(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stop(self) -> None:
        """The rule was removed."""
        self.cancel()


class _AnaFlap(_Periodic):
    def __init__(self, target: Target, rule: FaultRule) -> None:
        super().__init__(target, rule)
        spec = rule.spec
        self.states = spec.flap_states
        self.next = 0
        # The state to put back when the rule goes (Target.check_fault made sure the
        # group and the listener exist).
        self.before = target.ana_state_of(
            spec.subsystem or "", spec.anagrpid or 0, spec.traddr, spec.trsvcid
        )

    def act(self) -> None:
        spec = self.rule.spec
        state = self.states[self.next]
        self.next = (self.next + 1) % len(self.states)
        self.rule.matches += 1
        self._set(state)
        self.rule.hits += 1
        log.info(
            "fault rule %d: ana_flap group %d of %s to %s",
            self.rule.id,
            spec.anagrpid,
            spec.subsystem,
            state,
        )

    def _set(self, state: str) -> None:
        spec = self.rule.spec
        self.target.set_ana_state(
            spec.subsystem or "", spec.anagrpid, state, spec.traddr, spec.trsvcid
        )

    def stop(self) -> None:
        super().stop()
        try:
            self._set(NAMES[self.before])
        except ChangeError as exc:
            log.info("fault rule %d: ANA state not put back: %s", self.rule.id, exc)


class _AenStorm(_Periodic):
    def act(self) -> None:
        spec = self.rule.spec
        enable, log_page = _EVENTS[spec.event or ""]
        for ctrl in selected_controllers(self.target, spec):
            self.rule.matches += 1
            if not ctrl.aen_config & enable or not ctrl.awaits_event(log_page):
                continue  # not enabled, or no AER to complete: nothing is queued
            if spec.event == "ana_change":
                ctrl.ana_changed()
            else:
                nsids = [spec.nsid] if spec.nsid is not None else sorted(ctrl.namespaces)
                for nsid in nsids:
                    if nsid in ctrl.namespaces:
                        ctrl.namespace_changed(nsid)
            self.rule.hits += 1
            limit = spec.limit
            if limit is not None and self.rule.hits >= limit:
                return


class ScheduledFaults:
    """The controller-level rules of a target that are running, by rule id."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._running: dict[int, _Periodic] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def check_start(self, spec: FaultSpec) -> None:
        """ChangeError if the rule would act on nothing now (fail_controller: no
        controller is selected; it acts once, when added)."""
        if spec.action == "fail_controller" and not any(selected_controllers(self._target, spec)):
            field = "host" if spec.host is not None else "subsystem"
            raise ChangeError(field, "selects no connected controller")

    def start(self, rule: FaultRule) -> None:
        action = rule.spec.action
        if action == "fail_controller":
            self._fail(rule)
            return
        runner = (
            _AnaFlap(self._target, rule) if action == "ana_flap" else _AenStorm(self._target, rule)
        )
        self._running[rule.id] = runner
        runner.start()

    def _fail(self, rule: FaultRule) -> None:
        target = self._target
        limit = rule.spec.limit
        for ctrl in list(selected_controllers(target, rule.spec)):
            if limit is not None and rule.hits >= limit:
                break
            rule.matches += 1
            if ctrl.failed or not ctrl.csts & CSTS_RDY:
                continue  # failed already, or not enabled yet: nothing to fail
            ctrl.csts |= CSTS_CFS
            rule.hits += 1
            log.warning(
                "fault rule %d: controller %d of %s (host %s) failed (CSTS.CFS)",
                rule.id,
                ctrl.cntlid,
                ctrl.subsystem.nqn,
                ctrl.hostnqn,
            )
            target.arm_controller_faults(ctrl)
            # Worker processes serving its I/O queues take the new CSTS too.
            task = asyncio.get_running_loop().create_task(target.controller_changed(ctrl))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Until what serves the failed controllers' queues elsewhere (the workers) has
        their new state: what the RPC waits for before it answers."""
        while self._tasks:
            await asyncio.gather(*self._tasks)

    def stop(self, rule_id: int) -> None:
        runner = self._running.pop(rule_id, None)
        if runner is not None:
            runner.stop()

    def stop_all(self) -> None:
        """The target stops: the timers go, nothing is put back (nothing is served)."""
        for runner in self._running.values():
            runner.cancel()
        self._running.clear()
