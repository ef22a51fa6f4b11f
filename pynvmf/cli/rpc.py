"""`pynvmf rpc METHOD [PARAM...]`: call a method of a running target's JSON-RPC.

    pynvmf rpc nvmf_get_subsystems
    pynvmf rpc bdev_malloc_create num_blocks:=2048 block_size:=512
    pynvmf rpc nvmf_subsystem_add_ns nqn=nqn.2024-11.dev.pynvmf:a namespace.bdev_name=Malloc0
    pynvmf rpc nvmf_subsystem_add_listener '{"nqn": "...", "listen_address": {...}}'
    pynvmf rpc save-config /etc/pynvmf/target.json [--format pynvmf|spdk|nvmetcli]

A parameter is KEY=TEXT (a string) or KEY:=JSON (a number, true/false, null, a list
or an object); dots in KEY nest it in objects. A single argument that is a JSON
object is the whole parameter object. The result is printed as indented JSON; an
error response is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pynvmf.cli.common import EXIT_FAILURE, CommandError
from pynvmf.rpc.client import DEFAULT_TIMEOUT, RpcClient, RpcClientError
from pynvmf.rpc.server import DEFAULT_SOCKET

# Shorter names for pynvmf's own methods that take a path or a format.
_ALIASES = {"save-config": "pynvmf_save_config", "get-config": "pynvmf_get_config"}


def add_rpc_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "rpc",
        help="call a method of a running target's JSON-RPC",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-s",
        "--server",
        default=os.environ.get("PYNVMF_RPC", DEFAULT_SOCKET),
        metavar="PATH|HOST:PORT",
        help=f"the target's RPC socket or TCP address (default $PYNVMF_RPC or {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "-t", "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for an answer"
    )
    p.add_argument(
        "--format",
        choices=("pynvmf", "spdk", "nvmetcli"),
        help="for save-config and get-config: the configuration format (default pynvmf)",
    )
    p.add_argument("method", help="the method name (rpc_get_methods lists them)")
    p.add_argument("params", nargs="*", metavar="PARAM", help="KEY=TEXT, KEY:=JSON or {JSON}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeatable)")


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
    if method == "pynvmf_save_config":
        # The target writes the file: a relative path means the caller's directory.
        if len(args.params) == 1 and "=" not in args.params[0]:
            params: dict[str, Any] = {"path": os.path.abspath(args.params[0])}
        else:
            params = parse_params(args.params)
            if "path" in params:
                params["path"] = os.path.abspath(params["path"])
    else:
        params = parse_params(args.params)
    if args.format is not None:
        if method not in ("pynvmf_save_config", "pynvmf_get_config"):
            raise CommandError("--format: only for save-config and get-config")
        params["format"] = args.format
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
