"""Fixtures shared by the interoperability tests."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.guest import BOOTED, EVERY_PEER, PEERS, Peer


@pytest.fixture(scope="module", params=EVERY_PEER.params())
def linux_peer(request: pytest.FixtureRequest) -> Peer:
    """The Linux peer a module's guest boots, once per peer (tests/support/guest.py tells
    which modules run on which peers, and how)."""
    peer: Peer = request.param
    return peer


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which kernels and tools the guests ran: linux-7 follows Debian unstable, so a run's
    log must say which 7.x it was."""
    if BOOTED:
        terminalreporter.section("Linux peers booted")
        for name in sorted(BOOTED):
            terminalreporter.write_line(BOOTED[name])


# "MODULE:PEER ..." (spaces or commas): the modules `make test`'s compiled pass runs on its
# peer, left out on that peer in the pure pass (the Makefile sets it). Each build then
# meets a real Linux host or target in those modules, on a peer of its own, and no module
# runs twice on one peer: two passes of test_linux_host.py on linux-7 cost minutes of the
# 40 `make test` has.
DEFERRED_ENV = "PYNVMF_GUEST_DEFERRED"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deferred = {
        tuple(entry.rsplit(":", 1))
        for entry in re.split(r"[\s,]+", os.environ.get(DEFERRED_ENV, ""))
        if ":" in entry
    }
    if not deferred:
        return
    keep, drop = [], []
    for item in items:
        module = item.nodeid.partition("::")[0]
        if any((module, peer) in deferred for peer in _peers_of(item)):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _peers_of(item: pytest.Item) -> set[str]:
    """The peers a test is parametrized over: its ``linux_peer``, or a peer's name (a
    module whose own fixture names the kind of target, test_linux_target.py's)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return set()
    names = set(PEERS)
    return {
        value.name if isinstance(value, Peer) else value
        for value in callspec.params.values()
        if isinstance(value, Peer) or (isinstance(value, str) and value in names)
    }
