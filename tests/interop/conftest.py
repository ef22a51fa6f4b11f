"""Fixtures shared by the interoperability tests."""

from __future__ import annotations

import pytest

from tests.support.guest import BOOTED, EVERY_PEER, Peer


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
