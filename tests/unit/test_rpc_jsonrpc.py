"""JSON-RPC framing and dispatch, sans-I/O: texts back to back on a stream, as SPDK's
rpc.py sends them, cut at any byte; batches; errors; notifications."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pynvmf.rpc.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    Dispatcher,
    JsonStream,
    MalformedStream,
    RpcError,
)

# rpc.py joins the requests of one flush with newlines and indents them.
TEXTS = [
    json.dumps({"jsonrpc": "2.0", "method": "a", "id": 1, "params": {"s": '}{][\\"', "n": [1]}}),
    json.dumps({"jsonrpc": "2.0", "method": "b", "id": 2}, indent=2),
    json.dumps([{"jsonrpc": "2.0", "method": "c", "id": 3}, {"method": "d", "id": 4}]),
    json.dumps({"method": "caf\u00e9 \U0001f600", "id": 5}, ensure_ascii=False),
]
STREAM = "\n".join(TEXTS).encode()


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, len(STREAM)])
def test_texts_are_cut_where_they_end_whatever_the_reads(chunk: int) -> None:
    stream = JsonStream()
    texts: list[bytes] = []
    for i in range(0, len(STREAM), chunk):
        texts += stream.feed(STREAM[i : i + chunk])
    assert [json.loads(t) for t in texts] == [json.loads(t) for t in TEXTS]


@pytest.mark.parametrize("garbage", [b"17", b'"x"', b"}", b"nope {}", b"\x00"])
def test_a_text_that_cannot_be_a_request_is_malformed(garbage: bytes) -> None:
    with pytest.raises(MalformedStream):
        JsonStream().feed(b'{"id": 1} ' + garbage)


def test_a_text_larger_than_the_limit_is_malformed() -> None:
    stream = JsonStream(limit=100)
    with pytest.raises(MalformedStream, match="more than 100"):
        for _ in range(20):
            stream.feed(b'{"method": "' + b"x" * 10)


async def _handler(method: str, params: dict[str, Any]) -> Any:
    if method == "echo":
        return params
    if method == "fail":
        raise RpcError(INVALID_PARAMS, "nqn: missing")
    if method == "boom":
        raise RuntimeError("unexpected")
    raise RpcError(-32601, f"method not found: {method}")


async def respond(message: Any) -> Any:
    out = await Dispatcher(_handler).respond(message)
    return None if out is None else json.loads(out)


async def test_a_request_gets_its_result_with_its_id() -> None:
    got = await respond({"jsonrpc": "2.0", "id": "x", "method": "echo", "params": {"a": 1}})
    assert got == {"jsonrpc": "2.0", "id": "x", "result": {"a": 1}}


async def test_errors_keep_the_code_and_the_message_naming_the_parameter() -> None:
    got = await respond({"jsonrpc": "2.0", "id": 7, "method": "fail"})
    assert got == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": INVALID_PARAMS, "message": "nqn: missing"},
    }
    got = await respond({"id": 8, "method": "boom"})
    assert got["error"]["code"] == INTERNAL_ERROR


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        ({"id": 1}, INVALID_REQUEST),
        ({"id": 1, "method": 5}, INVALID_REQUEST),
        ({"id": 1, "method": "echo", "jsonrpc": "1.0"}, INVALID_REQUEST),
        ({"id": [1], "method": "echo"}, INVALID_REQUEST),
        ({"id": 1, "method": "echo", "params": [1, 2]}, INVALID_PARAMS),
        ({"id": 1, "method": "echo", "params": 3}, INVALID_PARAMS),
        ("not an object", INVALID_REQUEST),
    ],
)
async def test_invalid_requests(request_: Any, code: int) -> None:
    got = await respond(request_)
    assert got["error"]["code"] == code


async def test_batches_answer_each_request_in_order_and_notifications_not_at_all() -> None:
    got = await respond(
        [
            {"id": 1, "method": "echo", "params": {"n": 1}},
            {"method": "echo", "params": {"n": 2}},  # a notification
            {"id": 3, "method": "fail"},
        ]
    )
    assert [r["id"] for r in got] == [1, 3]
    assert got[0]["result"] == {"n": 1} and "error" in got[1]
    assert await respond({"method": "echo"}) is None
    assert await respond([{"method": "echo"}]) is None
    assert (await respond([]))["error"]["code"] == INVALID_REQUEST
