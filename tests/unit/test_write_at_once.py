"""tcp/glue.py's write_at_once: output handed to the socket now, the rest copied."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from pynvmf.tcp.glue import write_at_once


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _drain(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += sock.recv(n - len(got))
    return bytes(got)


def test_everything_taken_leaves_nothing(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    memory = bytearray(b"x" * 100)
    assert write_at_once(a.fileno(), [b"head", memoryview(memory)[:10], b"tail"]) == []
    assert _drain(b, 18) == b"head" + b"x" * 10 + b"tail"


def test_a_full_socket_leaves_the_rest_in_order_with_every_view_copied(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    memory = bytearray(bytes(range(256)) * 1024)  # 256 KiB: more than the socket takes
    out: list[bytes | bytearray | memoryview] = [b"H" * 24, memoryview(memory), b"R" * 16]
    expected = b"".join(bytes(x) for x in out)
    rest = write_at_once(a.fileno(), out)
    assert rest and all(type(x) is not memoryview for x in rest)
    taken = len(expected) - sum(len(x) for x in rest)
    assert 0 < taken < len(expected)
    # What the socket did not take is the bytes as they were: the memory may change now.
    memory[:] = bytes(len(memory))
    assert _drain(b, taken) + b"".join(rest) == expected


def test_more_buffers_than_one_writev_takes(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    out: list[bytes | bytearray | memoryview] = [bytes([i % 256]) for i in range(3000)]
    assert write_at_once(a.fileno(), out) == []
    assert _drain(b, 3000) == b"".join(out)


def test_a_closed_peer_leaves_everything_for_the_transport(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.close()
    memory = bytearray(b"y" * 64)
    rest = write_at_once(a.fileno(), [b"head", memoryview(memory)])
    assert rest == [b"head", b"y" * 64] and type(rest[1]) is bytes
