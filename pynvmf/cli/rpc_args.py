"""SPDK rpc.py's own arguments for the methods people type most, so that
`pynvmf rpc bdev_malloc_create -b Malloc0 64 512` does what `rpc.py` does with it.

Each method's arguments are those of SPDK's python/spdk/cli (v25.09) that pynvmf
serves, under rpc.py's letters and with rpc.py's positionals; they belong to the method
(after METHOD on the command line), not to `pynvmf rpc`, so their letters are rpc.py's
and mean what they mean there. The parameters built are what rpc.py sends. A method
not listed takes KEY=TEXT / KEY:=JSON parameters only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynvmf.cli.parser import Parser

CONFIG_FORMATS = ("pynvmf", "spdk", "nvmetcli")


@dataclass(frozen=True, slots=True)
class Arg:
    """One rpc.py argument: `flags` as add_argument takes them, the parameter it sets
    (dots nest it: "namespace.nsid"), and add_argument's other keywords."""

    flags: tuple[str, ...]
    param: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Method:
    args: tuple[Arg, ...]
    help: str
    # Turns the parameters rpc.py's arguments give into what rpc.py sends.
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None


def _malloc_size(params: dict[str, Any]) -> dict[str, Any]:
    # rpc.py's total_size is in MiB; the method takes a number of blocks.
    total = params.pop("total_size")
    params["num_blocks"] = int(total * 1024 * 1024) // params["block_size"]
    return params


_TCP_LISTENER = (
    Arg(("nqn",), "nqn", {"help": "subsystem NQN"}),
    Arg(("-t", "--trtype"), "listen_address.trtype", {"required": True, "help": "tcp"}),
    Arg(("-a", "--traddr"), "listen_address.traddr", {"required": True, "help": "address"}),
    Arg(("-f", "--adrfam"), "listen_address.adrfam", {"help": "ipv4 or ipv6"}),
    Arg(("-s", "--trsvcid"), "listen_address.trsvcid", {"help": "TCP port"}),
)

METHODS: dict[str, Method] = {
    "bdev_malloc_create": Method(
        (
            Arg(("-b", "--name"), "name", {"help": "bdev name"}),
            Arg(("-u", "--uuid"), "uuid", {"help": "bdev UUID"}),
            Arg(("total_size",), "total_size", {"type": float, "help": "size in MiB"}),
            Arg(("block_size",), "block_size", {"type": int, "help": "block size in bytes"}),
        ),
        "a memory bdev of TOTAL_SIZE MiB",
        _malloc_size,
    ),
    "bdev_malloc_delete": Method((Arg(("name",), "name"),), "delete a memory bdev"),
    "bdev_aio_create": Method(
        (
            Arg(("filename",), "filename", {"help": "file or block device"}),
            Arg(("name",), "name", {"help": "bdev name"}),
            Arg(("block_size",), "block_size", {"type": int, "nargs": "?"}),
            Arg(("-r", "--readonly"), "readonly", {"action": "store_true"}),
            Arg(("-u", "--uuid"), "uuid", {"help": "bdev UUID"}),
        ),
        "a bdev on a file or block device",
    ),
    "bdev_aio_delete": Method((Arg(("name",), "name"),), "delete a file bdev"),
    "nvmf_create_subsystem": Method(
        (
            Arg(("nqn",), "nqn"),
            Arg(("-s", "--serial-number"), "serial_number"),
            Arg(("-d", "--model-number"), "model_number"),
            Arg(("-a", "--allow-any-host"), "allow_any_host", {"action": "store_true"}),
            Arg(("-m", "--max-namespaces"), "max_namespaces", {"type": int}),
            Arg(("-r", "--ana-reporting"), "ana_reporting", {"action": "store_true"}),
            Arg(("-i", "--min-cntlid"), "min_cntlid", {"type": int}),
            Arg(("-I", "--max-cntlid"), "max_cntlid", {"type": int}),
        ),
        "create a subsystem",
    ),
    "nvmf_delete_subsystem": Method((Arg(("nqn",), "nqn"),), "delete a subsystem"),
    "nvmf_subsystem_add_listener": Method(
        (
            *_TCP_LISTENER,
            Arg(("-k", "--secure-channel"), "secure_channel", {"action": "store_true"}),
            Arg(
                ("-n", "--ana-state"),
                "ana_state",
                {"choices": ("optimized", "non_optimized", "inaccessible")},
            ),
        ),
        "listen for a subsystem",
    ),
    "nvmf_subsystem_remove_listener": Method(_TCP_LISTENER, "stop listening for a subsystem"),
    "nvmf_subsystem_add_ns": Method(
        (
            Arg(("nqn",), "nqn"),
            Arg(("bdev_name",), "namespace.bdev_name"),
            Arg(("-n", "--nsid"), "namespace.nsid", {"type": int}),
            Arg(("-g", "--nguid"), "namespace.nguid"),
            Arg(("-e", "--eui64"), "namespace.eui64"),
            Arg(("-u", "--uuid"), "namespace.uuid"),
            Arg(("-a", "--anagrpid"), "namespace.anagrpid", {"type": int}),
            Arg(("-p", "--ptpl-file"), "namespace.ptpl_file"),
            Arg(
                ("-i", "--no-auto-visible"),
                "namespace.no_auto_visible",
                {"action": "store_true", "help": "attached to the hosts nvmf_ns_add_host names"},
            ),
        ),
        "add a bdev as a namespace",
    ),
    "nvmf_ns_add_host": Method(
        (Arg(("nqn",), "nqn"), Arg(("nsid",), "nsid", {"type": int}), Arg(("host",), "host")),
        "attach a no_auto_visible namespace to a host's controllers",
    ),
    "nvmf_ns_remove_host": Method(
        (Arg(("nqn",), "nqn"), Arg(("nsid",), "nsid", {"type": int}), Arg(("host",), "host")),
        "detach it from a host's controllers",
    ),
    "nvmf_subsystem_remove_ns": Method(
        (Arg(("nqn",), "nqn"), Arg(("nsid",), "nsid", {"type": int})), "remove a namespace"
    ),
    "nvmf_subsystem_add_host": Method(
        (
            Arg(("nqn",), "nqn"),
            Arg(("host",), "host"),
            Arg(("--psk",), "psk"),
            Arg(("--dhchap-key",), "dhchap_key"),
            Arg(("--dhchap-ctrlr-key",), "dhchap_ctrlr_key"),
        ),
        "allow a host",
    ),
    "nvmf_subsystem_remove_host": Method(
        (Arg(("nqn",), "nqn"), Arg(("host",), "host")), "disallow a host"
    ),
    "keyring_file_add_key": Method(
        (Arg(("name",), "name"), Arg(("path",), "path")), "add a key file to the keyring"
    ),
    "keyring_file_remove_key": Method((Arg(("name",), "name"),), "remove a key"),
    # pynvmf's own (`pynvmf rpc save-config FILE --format spdk`).
    "pynvmf_save_config": Method(
        (
            Arg(("path",), "path", {"help": "file the target writes (relative: to here)"}),
            Arg(("--format",), "format", {"choices": CONFIG_FORMATS, "help": "default pynvmf"}),
        ),
        "the running target's configuration, written to PATH by the target",
    ),
    "pynvmf_get_config": Method(
        (Arg(("--format",), "format", {"choices": CONFIG_FORMATS, "help": "default pynvmf"}),),
        "the running target's configuration",
    ),
}


def _dest(arg: Arg) -> str:
    return arg.param.replace(".", "__")


def method_parser(name: str) -> Parser:
    """The parser of `name`'s rpc.py arguments (a METHODS entry)."""
    method = METHODS[name]
    p = Parser(prog=f"pynvmf rpc {name}", description=method.help)
    for arg in method.args:
        options = dict(arg.options)
        options.setdefault("help", f"the parameter {arg.param}")
        if arg.flags[0].startswith("-"):
            options["dest"] = _dest(arg)
            p.add_argument(*arg.flags, **options)
        else:
            p.add_argument(_dest(arg), metavar=arg.flags[0].upper(), **options)
    return p


def rpc_py_params(name: str, items: list[str]) -> dict[str, Any]:
    """The parameters rpc.py sends for `name` called with arguments `items`; a usage
    error of the method's own parser (exit status 2) if they do not parse."""
    parsed = method_parser(name).parse_args(items)
    params: dict[str, Any] = {}
    for arg in METHODS[name].args:
        value = getattr(parsed, _dest(arg))
        if value is None or value is False:
            continue  # not given: rpc.py leaves it out, the method's default applies
        *parents, leaf = arg.param.split(".")
        node = params
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    finish = METHODS[name].finish
    return finish(params) if finish is not None else params


def method_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each method's parser, as `pynvmf rpc METHOD --help` shows it (docs/cli.md)."""
    return {name: method_parser(name) for name in sorted(METHODS)}
