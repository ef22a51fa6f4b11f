"""`pynvmf rpc [--server S] METHOD [ARG...]`: call a method of a running target's JSON-RPC.

    pynvmf rpc nvmf_get_subsystems
    pynvmf rpc bdev_malloc_create num_blocks:=2048 block_size:=512
    pynvmf rpc bdev_malloc_create -b Malloc0 64 512            # rpc.py's arguments
    pynvmf rpc nvmf_subsystem_add_ns nqn=nqn.2024-11.dev.pynvmf:a namespace.bdev_name=Malloc0
    pynvmf rpc nvmf_subsystem_add_listener '{"nqn": "...", "listen_address": {...}}'
    pynvmf rpc save-config /etc/pynvmf/target.json [--format pynvmf|spdk|nvmetcli]

A parameter is KEY=TEXT (a string) or KEY:=JSON (a number, true/false, null, a list
or an object); dots in KEY nest it in objects. A single argument that is a JSON
object is the whole parameter object. The methods people type most also take SPDK
rpc.py's own arguments (`pynvmf rpc METHOD --help` lists them; see
pynvmf.cli.rpc_args). `pynvmf rpc`'s options come before METHOD, as rpc.py's do; their
letters (rpc.py's -s, -t) are pynvmf's host commands' port and transport, so they are
spelled out: --server, --timeout. The result is printed as indented JSON; an error
response is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pynvmf.cli.common import EXIT_FAILURE, CommandError, verbose_option
from pynvmf.cli.parser import RawDescriptionFormatter
from pynvmf.cli.rpc_args import METHODS, rpc_py_params
from pynvmf.rpc.client import DEFAULT_TIMEOUT, RpcClient, RpcClientError
from pynvmf.rpc.server import DEFAULT_SOCKET

# Shorter names for pynvmf's own methods that take a path or a format.
_ALIASES = {"save-config": "pynvmf_save_config", "get-config": "pynvmf_get_config"}

_HABITS = {
    "-s": "the RPC server is --server (rpc.py's -s): -s is the target's TCP port in pynvmf",
    "-t": "the timeout is --timeout (rpc.py's -t): -t is the transport in pynvmf",
}


def add_rpc_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rpc",
        help="call a method of a running target's JSON-RPC",
        description=__doc__,
        formatter_class=RawDescriptionFormatter,
        habits=_HABITS,
    )
    add_server_options(p)
    verbose_option(p)
    p.add_argument("method", help="the method name (rpc_get_methods lists them)")
    p.add_argument(
        "params",
        nargs=argparse.REMAINDER,
        metavar="ARG",
        help="KEY=TEXT, KEY:=JSON or {JSON}; or rpc.py's arguments of the method",
    )


def add_server_options(p: argparse.ArgumentParser) -> None:
    """--server and --timeout: where a running target's RPC is, and how long to wait for it
    (`pynvmf rpc`, `pynvmf top`)."""
    p.add_argument(
        "--server",
        default=os.environ.get("PYNVMF_RPC", DEFAULT_SOCKET),
        metavar="PATH|HOST:PORT",
        help=f"the target's RPC socket or TCP address (default $PYNVMF_RPC or {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for an answer",
    )


def _is_parameter(item: str) -> bool:
    key, sep, _ = item.partition("=")
    return bool(sep and key and not key.startswith("-"))


def parse_params(items: list[str]) -> dict[str, Any]:
    """KEY=TEXT, KEY:=JSON, a.b=TEXT (nested) or one {JSON} object -> the params object."""
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        try:
            value = json.loads(items[0])
        except json.JSONDecodeError as exc:
            raise CommandError(f"parameters: {exc}") from None
        if not isinstance(value, dict):
            raise CommandError("parameters: not a JSON object")
        return value
    params: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{item!r}: a parameter is KEY=TEXT or KEY:=JSON")
        value: Any = text
        if key.endswith(":"):
            key = key[:-1]
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{key}: {text!r} is not JSON: {exc}") from None
        *parents, leaf = key.split(".")
        node = params
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise CommandError(f"{key}: {name} is not an object")
            node = child
        node[leaf] = value
    return params


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    method = _ALIASES.get(args.method, args.method)
    items: list[str] = args.params
    single_json = len(items) == 1 and items[0].lstrip().startswith("{")
    if single_json or all(_is_parameter(item) for item in items):
        params = parse_params(items)
    elif method in METHODS:
        # rpc.py's own arguments: its method parser reports its own usage errors.
        params = rpc_py_params(method, items)
    else:
        odd = next(item for item in items if not _is_parameter(item))
        raise CommandError(
            f"{args.method}: {odd!r} is not a parameter: KEY=TEXT, KEY:=JSON or one {{JSON}} "
            f"object (rpc.py's own arguments are understood for {', '.join(sorted(METHODS))})"
        )
    if method == "pynvmf_save_config" and isinstance(params.get("path"), str):
        # The target writes the file: a relative path means the caller's directory.
        params["path"] = os.path.abspath(params["path"])
    return method, params


def run_rpc_command(args: argparse.Namespace) -> int:
    try:
        method, params = _request(args)
        with RpcClient(args.server, timeout=args.timeout) as client:
            result = client.call(method, params)
    except RpcClientError as exc:
        code = f" (code {exc.code})" if exc.code is not None else ""
        print(f"pynvmf rpc: {args.method}: {exc.message}{code}", file=sys.stderr)
        return EXIT_FAILURE
    except CommandError as exc:
        print(f"pynvmf rpc: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(result, indent=2))
    return 0
