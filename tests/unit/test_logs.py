"""pynvmf/logs.py: JSON lines (fields, escaping, bounds, exceptions) and the context a
record carries."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from pynvmf.logs import MAX_VALUE, ContextLog, JsonFormatter

# What a host may put in its NQN (Connect data decodes it with errors replaced, but
# quotes, backslashes, newlines, control characters, line separators pass), and more.
HOSTILE = 'nqn.evil:"},\n{"level": "CRITICAL"\\\r\x00\x1b[2J\u2028\u2029\udcff\ufffd'


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter({"worker": 3}))
    # A logger of its own, not the logging tree's: pytest's capture handlers, which
    # fail a test on a record they cannot format, have no way to it.
    logger = logging.Logger("pynvmf.test_logs", logging.DEBUG)
    logger.addHandler(handler)
    yield logger, stream


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    # One line per record, in ASCII: no \r, \u2028 or \u2029 for a reader to split on.
    assert all(line.isascii() and "\r" not in line for line in lines)
    return [json.loads(line) for line in lines]


def test_a_record_has_time_level_logger_message_and_its_context(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    context = {"peer": "[::1]:50000", "local_port": 4420, "host": "nqn.h", "qid": 2}
    before = datetime.now(UTC)
    ContextLog(logger, lambda: context).info("queue %d of %s", 2, "nqn.s")
    (record,) = records(stream)
    assert record["time"].endswith("Z")
    when = datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
    assert when.tzinfo is not None and abs((when - before).total_seconds()) < 60
    assert record["level"] == "INFO"
    assert record["logger"] == "pynvmf.test_logs"
    assert record["message"] == "queue 2 of nqn.s"
    assert record["worker"] == 3
    assert {k: record[k] for k in context} == context
    assert "exception" not in record


def test_a_record_without_context_has_none(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    logger.warning("plain")
    (record,) = records(stream)
    assert set(record) == {"time", "level", "logger", "message", "worker"}


def test_a_hostile_nqn_is_escaped_and_bounded(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    huge = HOSTILE * 5000
    ContextLog(logger, lambda: {"host": HOSTILE, "subsystem": huge}).info("host %r connects", huge)
    (record,) = records(stream)
    assert record["host"] == HOSTILE
    assert record["subsystem"].startswith(HOSTILE)
    assert len(record["subsystem"]) < MAX_VALUE + 100 < len(huge)
    assert "cut" in record["subsystem"]
    assert len(record["message"]) < 5000
    # The record is still the one record: nothing the host sent forged another field.
    assert record["level"] == "INFO"


def test_context_may_not_replace_the_record_s_own_fields(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    ContextLog(logger, lambda: {"level": "DEBUG", "message": "forged"}).error("real")
    (record,) = records(stream)
    assert record["level"] == "ERROR" and record["message"] == "real"


def test_an_exception_is_one_field_of_one_line(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    try:
        raise ValueError(f"bad {HOSTILE}")
    except ValueError:
        ContextLog(logger, lambda: {"qid": 0}).exception("connect failed")
    (record,) = records(stream)
    assert record["level"] == "ERROR" and record["message"] == "connect failed"
    assert record["exception"].startswith("Traceback (most recent call last):\n")
    assert "ValueError: bad nqn.evil" in record["exception"]
    assert record["qid"] == 0


def test_a_record_that_cannot_be_formatted_is_still_a_json_line(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    logger.info("%d commands", "not a number")  # the arguments do not fit
    logger.info(Unprintable())  # type: ignore[arg-type]
    ContextLog(logger, lambda: {"host": Unprintable(), "n": 1.5, "ok": True}).info("odd")

    def broken() -> dict[str, object]:
        raise RuntimeError("context")

    ContextLog(logger, broken).info("no context")
    wrong, unprintable, odd, no_context = records(stream)
    assert "%d commands" in wrong["message"] and "not a number" in wrong["message"]
    assert "unprintable" in unprintable["message"]
    assert odd["host"] == "<unprintable Unprintable>" and odd["n"] == 1.5 and odd["ok"] is True
    assert no_context["message"] == "no context" and no_context["context_error"] == "context"


def test_the_context_is_not_asked_for_a_record_filtered_out(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    logger.setLevel(logging.WARNING)
    asked: list[int] = []

    def context() -> dict[str, object]:
        asked.append(1)
        return {}

    ContextLog(logger, context).info("not emitted")
    assert asked == [] and stream.getvalue() == ""


# -- what nothing caught ----------------------------------------------------------------------

CRASHES = {
    "main": "raise RuntimeError('boom\\nsecond line')",
    "thread": (
        "import threading\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='doomed')\n"
        "t.start(); t.join()"
    ),
    # A callback's exception, reported by the loop's default exception handler.
    "asyncio": (
        "import asyncio\n"
        "async def main():\n"
        "    asyncio.get_running_loop().call_soon(lambda: {}['missing'])\n"
        "    await asyncio.sleep(0)\n"
        "asyncio.run(main())"
    ),
}


def _crash(where: str, log_format: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import logging\nfrom pynvmf.logs import configure\n"
        f"configure(logging.WARNING, {log_format!r})\n{CRASHES[where]}\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("where", "status", "level", "message", "error"),
    [
        (
            "main",
            1,
            "CRITICAL",
            "uncaught exception: RuntimeError: boom\nsecond line",
            "RuntimeError",
        ),
        (
            "thread",
            0,
            "CRITICAL",
            "uncaught exception in thread doomed: ZeroDivisionError",
            "ZeroDivisionError",
        ),
        ("asyncio", 0, "ERROR", "Exception in callback", "KeyError"),
    ],
)
def test_an_uncaught_exception_is_one_json_record(
    where: str, status: int, level: str, message: str, error: str
) -> None:
    done = _crash(where, "json")
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # one record, no raw traceback around it
    record = json.loads(lines[0])
    assert record["level"] == level
    assert record["message"].startswith(message)
    assert record["exception"].startswith("Traceback (most recent call last):")
    assert f"\n{error}" in record["exception"]


def test_with_text_logs_a_crash_is_the_interpreters_traceback() -> None:
    done = _crash("main", "text")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.endswith("RuntimeError: boom\nsecond line\n")
