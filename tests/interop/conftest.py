"""Fixtures shared by the interoperability tests."""

from __future__ import annotations

import pytest

from tests.interop.guest import Peer, peer_params


@pytest.fixture(scope="module", params=peer_params())
def linux_peer(request: pytest.FixtureRequest) -> Peer:
    """The Linux peer a module's guest boots, once per peer (tests/interop/guest.py tells
    how a module runs on both)."""
    peer: Peer = request.param
    return peer
