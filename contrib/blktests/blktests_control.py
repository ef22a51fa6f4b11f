"""The command line of blktests' NVME_TARGET_CONTROL, shared by the control scripts here.

blktests (common/nvme, tests/nvme/rc; Documentation/running-tests.md) calls the script
NVME_TARGET_CONTROL names in these forms; the options marked (ext) are what
contrib/blktests/blktests-target-control.patch adds to blktests, so that the settings
its tests otherwise write to the local nvmet's configfs reach a target elsewhere:

    config --show-trtype | --show-blkdev-type | --show-hostnqn | --show-hostid |
           --show-host-traddr | --show-traddr | --show-trsvid | --show-subsys-uuid |
           --show-subsysnqn                      (one line per option, in that order)
    setup --subsysnqn NQN --subsys-uuid UUID --hostnqn NQN
          [--hostkey KEY] [--ctrlkey KEY | --ctrkey KEY]
          [--tls | --force-tls] [--tlskey PSK]   (ext)
    add-ports --ports N --subsysnqn NQN --subsys-uuid UUID --hostnqn NQN
              [--hostkey KEY] [--ctrlkey KEY | --ctrkey KEY]
    set-host --hostnqn NQN [--subsysnqn NQN] [--hostkey KEY] [--ctrlkey KEY]
             [--hash HASH] [--dhgroup GROUP]     (ext: _set_nvmet_hostkey and friends)
    cleanup --subsysnqn NQN

(blktests master spells the controller key --ctrkey when it calls setup; its
documentation says --ctrlkey: both are taken.) A script prints nothing on stderr unless
something failed (blktests compares what a test prints), and exits 1 then.

Python 3 standard library only: the scripts run on the machine under test.
"""

from __future__ import annotations

import argparse
import re
import sys
import uuid
from collections.abc import Callable, Mapping

# blktests' defaults (common/nvme): what its tests use when nothing else is set.
BLKTESTS_HOSTID = "0f01fb42-9f7f-4856-b0b3-51e60b8de349"
BLKTESTS_HOSTNQN = f"nqn.2014-08.org.nvmexpress:uuid:{BLKTESTS_HOSTID}"
BLKTESTS_SUBSYSNQN = "blktests-subsystem-1"
BLKTESTS_SUBSYS_UUID = "91fdba0d-f87b-4c25-b80f-db7be1418b9e"

CONFIG_OPTIONS = (
    "show_trtype",
    "show_blkdev_type",
    "show_hostnqn",
    "show_hostid",
    "show_host_traddr",
    "show_traddr",
    "show_trsvid",
    "show_subsys_uuid",
    "show_subsysnqn",
)

# What `setup --tls` and `--force-tls` ask of the port: nvmet's TREQ.
TLS_OFF = "none"
TLS_OPTIONAL = "not-required"
TLS_REQUIRED = "required"
# The transports the scripts set a target up on (config --show-trtype answers one).
TRTYPES = ("tcp", "rdma")


class Failure(Exception):
    """One line on stderr, exit status 1."""


def file_line(path: str) -> str | None:
    try:
        with open(path) as f:
            line = f.readline().strip()
    except OSError:
        return None
    return line or None


def hostid_of(hostnqn: str) -> str:
    """A host ID for a host NQN: the UUID a uuid NQN carries, else one derived from it
    (the same every time: blktests asks for it in several calls)."""
    try:
        return str(uuid.UUID(hostnqn.rpartition(":uuid:")[2]))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, hostnqn))


def key_text(text: str, prefix: str) -> str:
    """The key in what a test captured from nvme-cli: `nvme gen-tls-key --insert` prints
    the key, then a line "Inserted TLS key ..."; the first word with `prefix` is the key
    (else the text as given, for the target to refuse)."""
    for word in text.split():
        if word.startswith(prefix):
            return word
    return text


def parse_size(text: str, what: str, block_size: int) -> int:
    """A size in bytes, or with K, M, G, T (blktests' NVME_IMG_SIZE)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise Failure(f"{what}: not a size: {text!r}")
    size = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]
    if size < block_size or size % block_size:
        raise Failure(f"{what}: {text!r} is not a whole number of {block_size}-byte blocks")
    return size


def trtype_from(name: str, environ: Mapping[str, str]) -> str:
    """The transport environment variable `name` names: tcp when unset."""
    value = (environ.get(name) or "tcp").lower()
    if value not in TRTYPES:
        raise Failure(f"{name}: {value!r} is not one of {', '.join(TRTYPES)}")
    return value


def print_config(args: argparse.Namespace, values: Mapping[str, Callable[[], str]]) -> None:
    asked = [key for key in CONFIG_OPTIONS if getattr(args, key)]
    if not asked:
        raise Failure(
            "config: give one of " + ", ".join("--" + k.replace("_", "-") for k in CONFIG_OPTIONS)
        )
    for key in asked:
        print(values[key]())


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _keys(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hostkey", default="")
    p.add_argument("--ctrlkey", "--ctrkey", dest="ctrlkey", default="")


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The command line; each subcommand's handler is looked up by `args.command`."""
    top = _Parser(prog=prog, description=description)
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("config", help="print one setting per option")
    for key in CONFIG_OPTIONS:
        p.add_argument("--" + key.replace("_", "-"), dest=key, action="store_true")
    p = sub.add_parser("setup", help="create the subsystem, fresh")
    p.add_argument("--subsysnqn", required=True)
    p.add_argument("--subsys-uuid", required=True)
    p.add_argument("--hostnqn", required=True)
    _keys(p)
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--tls", dest="tls", action="store_const", const=TLS_OPTIONAL)
    tls.add_argument("--force-tls", dest="tls", action="store_const", const=TLS_REQUIRED)
    p.set_defaults(tls=TLS_OFF)
    p.add_argument("--tlskey", default="")
    p = sub.add_parser("add-ports", help="more ports for the subsystem")
    p.add_argument("--ports", type=int, required=True)
    p.add_argument("--subsysnqn", required=True)
    p.add_argument("--subsys-uuid", required=True)
    p.add_argument("--hostnqn", required=True)
    _keys(p)
    p = sub.add_parser("set-host", help="change a host's DH-HMAC-CHAP settings")
    p.add_argument("--hostnqn", required=True)
    p.add_argument("--subsysnqn", default="")
    _keys(p)
    p.add_argument("--hash", default="")
    p.add_argument("--dhgroup", default="")
    p = sub.add_parser("cleanup", help="remove the subsystem")
    p.add_argument("--subsysnqn", required=True)
    return top


def run(
    prog: str,
    description: str,
    commands: Mapping[str, Callable[[argparse.Namespace], None]],
    argv: list[str] | None = None,
) -> int:
    args = parser(prog, description).parse_args(argv)
    try:
        commands[args.command](args)
    except Failure as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0
