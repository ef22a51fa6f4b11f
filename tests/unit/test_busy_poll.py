"""Poll mode (`--busy-poll`): after input the event loop keeps a callback ready for the
window, so it never sleeps in epoll_wait meanwhile, and it goes back to sleeping after."""

from __future__ import annotations

import asyncio

import pytest

from pynvmf.target import protocol
from pynvmf.target.changes import ChangeError
from pynvmf.target.protocol import BusyPoller
from pynvmf.target.target import Target


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_loop_polls_for_the_window_after_input_then_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(protocol.time, "monotonic", clock)
    poller = BusyPoller(50e-6)
    assert not poller.spinning
    poller.input()
    for _ in range(5):  # loop iterations within the window: the spin stays scheduled
        await asyncio.sleep(0)
        assert poller.spinning
    clock.now += 40e-6
    poller.input()  # more input moves the window on
    clock.now += 40e-6
    await asyncio.sleep(0)
    assert poller.spinning
    clock.now += 20e-6  # 60 us after the last input
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not poller.spinning
    poller.input()  # and it starts again with the next input
    await asyncio.sleep(0)
    assert poller.spinning
    clock.now += 1.0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not poller.spinning


def test_busy_poll_is_off_by_default_and_refuses_a_negative_window() -> None:
    assert Target().poller is None
    assert Target(busy_poll_us=25).poller is not None
    with pytest.raises(ChangeError):
        Target(busy_poll_us=-1)
