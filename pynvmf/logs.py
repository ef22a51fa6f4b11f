"""How a process of pynvmf logs: text for people (the default), or JSON lines for machines
(`pynvmf target --log-format json`).

A JSON record is one object on one line: `time` (ISO 8601, UTC), `level`, `logger`,
`message`, `exception` (the traceback, as one string) when there is one, `worker` in a
worker process of `--cores N`, and the context of what the record is about. That
context comes from one place, the object the record is about: code that logs about a
connection logs through `about(log, queue)`, and the queue's `log_context()` (peer
address and port, local port, host NQN, subsystem NQN, qid, cntlid once known) is
asked for only when a record is emitted: a command that logs nothing costs nothing.

An exception nothing caught is a record too (level CRITICAL, its traceback in `exception`),
never a raw multi-line traceback on stderr: in the main thread (sys.excepthook), in
another thread (threading.excepthook); what an asyncio loop reports (a callback's or an
unretrieved task's exception) goes through the loop's default handler, which logs it to
the `asyncio` logger, so it is a record as well.

A host chooses its NQN, and messages quote what hosts sent: every value goes through
json.dumps (quotes, newlines, control characters and odd bytes escaped), long values are
cut, and a record that cannot be formatted still gives a line of JSON, never an
exception.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol

LOG_FORMATS = ("text", "json")
# The record attribute ContextLog sets: the fields of the context, a dictionary.
CONTEXT_ATTRIBUTE = "pynvmf_context"
# Bounds on what one record may carry (an NQN is at most 223 bytes; messages are short).
MAX_VALUE = 1024
MAX_MESSAGE = 4096
MAX_EXCEPTION = 16384

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TEXT_FORMAT_WORKER = "%(asctime)s worker {index} %(levelname)s %(name)s: %(message)s"
# The fields a record's context may not replace.
_RESERVED = frozenset(("time", "level", "logger", "message", "exception", "stack", "worker"))

_configured = "text"

log = logging.getLogger(__name__)


class HasLogContext(Protocol):
    def log_context(self) -> dict[str, object]:
        """The fields that say which connection (or controller) a record is about."""
        ...


class ContextLog(logging.LoggerAdapter[logging.Logger]):
    """`logger`, its records carrying the fields `context()` returns at the time a record
    is emitted (never for one its level filters out)."""

    def __init__(self, logger: logging.Logger, context: Callable[[], dict[str, object]]) -> None:
        super().__init__(logger)
        self._context = context

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        try:
            context = self._context()
        except Exception as exc:  # the record goes out all the same
            context = {"context_error": _text(exc)}
        kwargs["extra"] = {**kwargs.get("extra", {}), CONTEXT_ATTRIBUTE: context}
        return msg, kwargs


def about(logger: logging.Logger, subject: HasLogContext) -> ContextLog:
    """`logger` for a record about `subject` (a queue, a controller)."""
    return ContextLog(logger, subject.log_context)


def bounded(text: str, limit: int = MAX_VALUE) -> str:
    """`text`, cut to `limit` characters and saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[cut: {len(text)} characters]"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; `fields` go into every record (a
    worker's index)."""

    def __init__(self, fields: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        try:
            return json.dumps(self._fields(record))
        except Exception as exc:  # a log line, whatever the record holds
            return json.dumps(
                {
                    "time": _time(record),
                    "level": "ERROR",
                    "logger": "pynvmf.logs",
                    "message": "a log record could not be formatted",
                    "error": bounded(_text(exc)),
                }
            )

    def _fields(self, record: logging.LogRecord) -> dict[str, object]:
        fields: dict[str, object] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": bounded(_message(record), MAX_MESSAGE),
        }
        fields.update(self.fields)
        context = getattr(record, CONTEXT_ATTRIBUTE, None)
        if isinstance(context, dict):
            for key, value in context.items():
                name = bounded(_text(key), 64)
                if name not in _RESERVED:
                    fields[name] = _value(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            fields["exception"] = bounded(record.exc_text, MAX_EXCEPTION)
        if record.stack_info:
            fields["stack"] = bounded(self.formatStack(record.stack_info), MAX_EXCEPTION)
        return fields


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # arguments that do not fit the format: say both
        return f"{_text(record.msg)} % {_text(record.args)}"


def _text(value: object) -> str:
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _value(value: object) -> object:
    if value is None or isinstance(value, bool | int | float):
        return value
    return bounded(_text(value))


def configure(level: int, log_format: str = "text", *, worker: int | None = None) -> None:
    """Log to stderr at `level`, as `log_format` says (one of LOG_FORMATS); `worker`: the
    index of a worker process, which every record names."""
    global _configured
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {LOG_FORMATS}")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter({} if worker is None else {"worker": worker}))
    elif worker is None:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT_WORKER.format(index=worker)))
    logging.basicConfig(level=level, handlers=[handler])
    _configured = log_format
    if log_format == "json":
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    else:  # the interpreter's own (a process configured again, as the tests do)
        if sys.excepthook is _log_uncaught:
            sys.excepthook = sys.__excepthook__
        if threading.excepthook is _log_uncaught_in_thread:
            threading.excepthook = threading.__excepthook__


def _log_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """sys.excepthook with JSON logs: the exception that ends the process, as one record."""
    if issubclass(exc_type, KeyboardInterrupt):  # an interrupted command: no crash to report
        sys.__excepthook__(exc_type, exc, tb)
        return
    log.critical(
        "uncaught exception: %s", _exception_text(exc_type, exc), exc_info=(exc_type, exc, tb)
    )


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    """threading.excepthook with JSON logs: the exception that ends a thread, as one record."""
    if args.exc_type is SystemExit:  # as the default hook: a thread that exits, quietly
        return
    name = args.thread.name if args.thread is not None else "?"
    exc = args.exc_value
    log.critical(
        "uncaught exception in thread %s: %s",
        name,
        _exception_text(args.exc_type, exc),
        exc_info=(args.exc_type, exc, args.exc_traceback) if exc is not None else None,
    )


def _exception_text(exc_type: type[BaseException], exc: BaseException | None) -> str:
    text = _text(exc) if exc is not None else ""
    return f"{exc_type.__name__}: {text}" if text else exc_type.__name__


def configured_format() -> str:
    """The format configure() chose for this process (what its workers log in)."""
    return _configured


@dataclass(frozen=True, slots=True)
class LogLevels:
    """What a running process may change in how it logs (SPDK's log methods do), as data
    that a worker process of --cores takes too: the levels set on pynvmf's loggers, by
    name (the others follow their parents), and the level of the stderr handlers (what
    is printed of what is logged; NOTSET: everything)."""

    loggers: tuple[tuple[str, int], ...] = ()
    print_level: int = logging.NOTSET

    def with_logger(self, name: str, level: int) -> LogLevels:
        """These levels with logger `name` at `level` (NOTSET: following its parent)."""
        loggers = dict(self.loggers)
        loggers.pop(name, None)
        if level != logging.NOTSET:
            loggers[name] = level
        return LogLevels(tuple(sorted(loggers.items())), self.print_level)

    def with_print_level(self, level: int) -> LogLevels:
        return LogLevels(self.loggers, level)


def _ours(name: str) -> bool:
    return name == "pynvmf" or name.startswith("pynvmf.")


def log_levels() -> LogLevels:
    """This process's LogLevels."""
    loggers = sorted(
        (name, logger.level)
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and _ours(name) and logger.level != logging.NOTSET
    )
    handlers = logging.getLogger().handlers
    print_level = min((h.level for h in handlers), default=logging.NOTSET)
    return LogLevels(tuple(loggers), print_level)


def set_log_levels(levels: LogLevels) -> None:
    """Log in this process as `levels` says: a pynvmf logger it does not name follows its
    parent."""
    named = dict(levels.loggers)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and _ours(name) and name not in named:
            logger.setLevel(logging.NOTSET)
    for name, level in named.items():
        logging.getLogger(name).setLevel(level)
    for handler in logging.getLogger().handlers:
        handler.setLevel(levels.print_level)
