"""SPDK's log methods (log_set_flag, log_clear_flag, log_get_flags, log_set_level,
log_get_level, log_set_print_level, log_get_print_level) on Python's logging.

SPDK's log level says what is logged, its print level what reaches stderr, and a flag
turns on one component's debug messages. Here the level is the "pynvmf" logger's, the
print level that of the handlers on the root logger (pynvmf.logs.configure's stderr
handler), and a flag sets one package's logger to DEBUG (cleared: it follows the level
again). The flags are SPDK's component names for the parts pynvmf has. Each change goes
through the Target (set_log_levels), so that the worker processes of `--cores N` log
as the main process does by the time the method answers.
"""

from __future__ import annotations

import logging

from pynvmf.logs import log_levels
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params

table = MethodTable()
method = table.register

# SPDK's log component names and the loggers of pynvmf's counterparts.
FLAGS = {
    "nvmf": "pynvmf.target",
    "nvmf_tcp": "pynvmf.tcp",
    "nvmf_auth": "pynvmf.auth",
    "bdev": "pynvmf.block",
    "bdev_malloc": "pynvmf.block.memory",
    "aio": "pynvmf.block.file",
    "bdev_rbd": "pynvmf.block.rbd",
    "keyring": "pynvmf.target.keyring",
    "rpc": "pynvmf.rpc",
}

# SPDK's levels, most severe first, as Python levels (Python has no NOTICE: between
# INFO and WARNING, as syslog has it).
NOTICE = (logging.INFO + logging.WARNING) // 2
LEVELS = {
    "ERROR": logging.ERROR,
    "WARNING": logging.WARNING,
    "NOTICE": NOTICE,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
}


def level_name(level: int) -> str:
    """The SPDK level that lets through what Python `level` does."""
    for name, value in LEVELS.items():
        if level >= value:
            return name
    return "DEBUG"


def _level(p: Params) -> int:
    name = p.string("level")
    p.done()
    level = LEVELS.get(name.upper())
    if level is None:
        # SPDK's answer; the parameter named, as pynvmf's errors do.
        raise RpcError(INVALID_PARAMS, f"level: {name!r}: invalid log level")
    return level


def _flag(p: Params) -> str:
    """The name of the logger flag `flag` turns to DEBUG."""
    name = p.string("flag")
    p.done()
    logger = FLAGS.get(name)
    if logger is None:
        raise RpcError(INVALID_PARAMS, f"flag: {name!r}: invalid log flag")
    return logger


def _print_handlers() -> list[logging.Handler]:
    return logging.getLogger().handlers


@method("log_set_flag")
async def log_set_flag(cp: ControlPlane, p: Params) -> bool:
    await cp.target.set_log_levels(log_levels().with_logger(_flag(p), logging.DEBUG))
    return True


@method("log_clear_flag")
async def log_clear_flag(cp: ControlPlane, p: Params) -> bool:
    await cp.target.set_log_levels(log_levels().with_logger(_flag(p), logging.NOTSET))
    return True


@method("log_get_flags")
async def log_get_flags(cp: ControlPlane, p: Params) -> dict[str, bool]:
    p.done()
    return {
        name: logging.getLogger(logger).level == logging.DEBUG
        for name, logger in sorted(FLAGS.items())
    }


@method("log_set_level")
async def log_set_level(cp: ControlPlane, p: Params) -> bool:
    await cp.target.set_log_levels(log_levels().with_logger("pynvmf", _level(p)))
    return True


@method("log_get_level")
async def log_get_level(cp: ControlPlane, p: Params) -> str:
    p.done()
    return level_name(logging.getLogger("pynvmf").getEffectiveLevel())


@method("log_set_print_level")
async def log_set_print_level(cp: ControlPlane, p: Params) -> bool:
    await cp.target.set_log_levels(log_levels().with_print_level(_level(p)))
    return True


@method("log_get_print_level")
async def log_get_print_level(cp: ControlPlane, p: Params) -> str:
    p.done()
    levels = [h.level for h in _print_handlers()]
    return level_name(min(levels) if levels else logging.getLogger().getEffectiveLevel())
