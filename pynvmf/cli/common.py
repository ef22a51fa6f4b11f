"""What the `pynvmf` commands share: exit statuses, the one-line error, and the one
argument layer of every command (sizes, addresses, NQNs, namespace IDs, the host
identity and the connect options), so that each option means the same everywhere.

The short options follow nvme-cli's letters for the same meaning, and no letter means
two things across pynvmf's commands (docs/cli.md, "Option letters"):

  -t -a -s   transport, address, TCP port (nvme connect's)
  -n         namespace ID (nvme id-ns, read, write); the subsystem NQN is --nqn
  -q -I      host NQN and host ID (nvme connect's)
  -g -G      header and data digest;  -S -C  DH-HMAC-CHAP host and controller secrets
  -o         output format;  -H  human-readable (id-ctrl, id-ns);  -v  verbose
  -c -z -d   block count (0's based), data size, data file (nvme read/write)
  -f         Force Unit Access (nvme write's --force-unit-access)
"""

from __future__ import annotations

import argparse
import logging
import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pynvmf import units
from pynvmf.cli.identity import CommandIdentity, IdentityError, resolve
from pynvmf.host import Controller, RemoteNamespace
from pynvmf.host.controller import TRTYPES
from pynvmf.spec.nqn import nqn_problem
from pynvmf.spec.ports import NVME_RDMA_PORT
from pynvmf.tcp.psk import ConfiguredPsk, PskError

log = logging.getLogger(__name__)

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130  # what a shell reports for a command ended by SIGINT
NSID_MAX = 0xFFFFFFFE


class CommandError(Exception):
    """A failure worth exactly one line on stderr: the message says it all."""


def error_text(exc: BaseException) -> str:
    """An exception as a command's one line on stderr says it: its message, and for a
    file's OSError the file and the error (not "[Errno 2] ..." with a repr)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


# -- option types: each raises ArgumentTypeError, which argparse reports as a usage error


def port_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 1 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"port {value} not in 1..65535")
    return value


def positive_seconds(text: str) -> float:
    """A time in seconds, finite and above 0 (an interval, a wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            # Base 0 so LBAs may be given in hex (0x...), as nvme-cli accepts them.
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def size(minimum: int = 1) -> Callable[[str], int]:
    """A size in bytes, in the one grammar of pynvmf.units (a bare number is bytes)."""

    def parse(text: str) -> int:
        try:
            value = units.parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is less than {units.format_size(minimum)}")
        return value

    return parse


def namespace_id(text: str) -> int:
    """-n/--namespace-id, as nvme-cli's: refuses an NQN there with the option it belongs to."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace ID: -n is --namespace-id, as in nvme id-ns, read "
            "and write; the subsystem NQN is --nqn (nvme connect's -n)"
        ) from None
    if not 1 <= value <= NSID_MAX:
        raise argparse.ArgumentTypeError(f"namespace ID {value} is not in 1..{NSID_MAX}")
    return value


def nqn(text: str) -> str:
    problem = nqn_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid NQN: {problem}")
    return text


def hostid_arg(text: str) -> bytes:
    try:
        return uuid.UUID(text).bytes
    except ValueError:
        raise argparse.ArgumentTypeError(f"host ID {text!r} is not a UUID") from None


# -- option groups ---------------------------------------------------------------------------


def target_options(p: argparse.ArgumentParser, *, default_port: int) -> None:
    """Where the controller is: nvme connect's -t, -a and -s."""
    p.add_argument(
        "-t",
        "--transport",
        choices=TRTYPES,
        default="tcp",
        help="transport: tcp, or rdma (needs rdma-core's pyverbs; no TLS or digests there)",
    )
    p.add_argument("-a", "--traddr", required=True, metavar="ADDR", help="target address")
    p.add_argument(
        "-s",
        "--trsvcid",
        type=port_number,
        metavar="PORT",
        help=f"target port (default {default_port} with tcp, {NVME_RDMA_PORT} with rdma)",
    )
    # Resolved by resolve_target() once -t is known: nvme-cli's defaults differ by transport.
    p.set_defaults(default_trsvcid=default_port)


def resolve_target(args: argparse.Namespace) -> None:
    """Fill in -s where it was not given, once -t is known: nvme-cli's default for the
    transport (the command's own port with tcp; 4420 with rdma, where the discovery
    controller shares the I/O controllers' port)."""
    if args.trsvcid is None:
        args.trsvcid = NVME_RDMA_PORT if args.transport == "rdma" else args.default_trsvcid


def subsystem_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nqn",
        required=True,
        type=nqn,
        help="subsystem NQN (nvme connect's -n; -n is the namespace ID here)",
    )


def namespace_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n",
        "--namespace-id",
        type=namespace_id,
        default=1,
        metavar="NSID",
        help="namespace ID (default 1)",
    )


def host_identity_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-q",
        "--hostnqn",
        type=nqn,
        help="host NQN (default: /etc/nvme/hostnqn as nvme-cli reads it, else one pynvmf "
        "stores on first use; see docs/cli.md)",
    )
    p.add_argument(
        "-I",
        "--hostid",
        type=hostid_arg,
        metavar="UUID",
        help="host identifier (default: /etc/nvme/hostid, else the UUID of a UUID host NQN)",
    )


def connect_options(p: argparse.ArgumentParser) -> None:
    """The options of the connection itself, beyond where and who: digests,
    DH-HMAC-CHAP and TLS. Every command that connects takes all of them, and
    connect_arguments turns them into connect()'s arguments: one option added here is
    one option of every such command."""
    p.add_argument("-g", "--hdr-digest", action="store_true", help="enable header digest")
    p.add_argument("-G", "--data-digest", action="store_true", help="enable data digest")
    p.add_argument(
        "-S",
        "--dhchap-secret",
        metavar="DHHC-1:...",
        help="DH-HMAC-CHAP host secret (as nvme gen-dhchap-key writes it), used when "
        "the controller asks to authenticate",
    )
    p.add_argument(
        "-C",
        "--dhchap-ctrl-secret",
        metavar="DHHC-1:...",
        help="DH-HMAC-CHAP controller secret: authenticate the controller too",
    )
    tls_options(p)


def verbose_option(p: argparse.ArgumentParser) -> None:
    # pynvmf.cli.main configures logging from args.verbose for every subcommand.
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeatable)")


def connection_options(
    p: argparse.ArgumentParser, *, default_port: int, subsystem: bool = True
) -> None:
    """Everything a host command needs to reach a controller."""
    target_options(p, default_port=default_port)
    if subsystem:
        subsystem_option(p)
    host_identity_options(p)
    if subsystem:
        # pynvmf.host.discover() takes no digest, secret or TLS options: discover neither.
        connect_options(p)
    verbose_option(p)


def tls_options(p: argparse.ArgumentParser) -> None:
    """TLS 1.3 with a PSK, as nvme-cli's ``--tls`` / ``--tls-key`` (pynvmf has no keyring:
    the key is given, in the interchange format ``nvme gen-tls-key`` prints)."""
    p.add_argument("--tls", action="store_true", help="connect with TLS 1.3 (needs --tls-key)")
    p.add_argument(
        "--tls-key",
        metavar="KEY|@FILE",
        help="TLS PSK in the NVMeTLSkey-1 interchange format, or @FILE holding it (implies --tls)",
    )
    p.add_argument(
        "--tls-identity",
        type=int,
        choices=(0, 1),
        default=0,
        help="PSK identity version: 0 NVMe0R0x (default, what Linux 6.12 offers), 1 NVMe1R0x",
    )
    p.add_argument(
        "--tls-compat",
        action="store_true",
        help="derive the TLS PSK as libnvme < 1.14 / nvme-cli 2.13 did (a target whose keyring "
        "that nvme-cli filled)",
    )
    p.add_argument(
        "--no-ktls",
        action="store_true",
        help="keep the TLS record layer in user space even where the kernel has kTLS",
    )
    p.add_argument(
        "--concat",
        action="store_true",
        help="secure channel concatenation: authenticate the admin queue (--dhchap-secret) "
        "for a generated TLS PSK, then connect every queue over TLS with it",
    )


def tls_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """connect()'s TLS keyword arguments from tls_options' options."""
    key = getattr(args, "tls_key", None)
    ktls = "off" if getattr(args, "no_ktls", False) else "auto"
    if getattr(args, "concat", False):
        if key is not None or getattr(args, "tls", False):
            # As nvme-cli and Linux: the concatenation generates the channel's PSK.
            raise ValueError("--concat generates its TLS PSK: no --tls or --tls-key with it")
        return {"concat": True, "ktls": ktls}
    if key is None:
        if getattr(args, "tls", False):
            raise ValueError("--tls needs --tls-key (pynvmf reads no keyring)")
        return {}
    if key.startswith("@"):
        try:
            key = Path(key[1:]).read_text().strip()
        except OSError as exc:
            raise ValueError(f"--tls-key: cannot read {key[1:]}: {exc.strerror}") from None
    try:
        psk = ConfiguredPsk.parse(key)
    except PskError as exc:
        raise ValueError(f"--tls-key: {exc}") from None
    return {
        "tls_psk": psk,
        "tls_identity": args.tls_identity,
        "tls_compat": args.tls_compat,
        "ktls": ktls,
    }


def connect_arguments(args: argparse.Namespace, identity: CommandIdentity) -> dict[str, Any]:
    """connect()'s keyword arguments from the options of host_identity_options and
    connect_options, for the host identity `identity` (host_identity(args))."""
    return {
        "hostnqn": identity.hostnqn,
        "hostid": identity.hostid,
        "header_digest": args.hdr_digest,
        "data_digest": args.data_digest,
        "dhchap_secret": args.dhchap_secret,
        "dhchap_ctrl_secret": args.dhchap_ctrl_secret,
        **tls_arguments(args),
    }


def host_identity(args: argparse.Namespace) -> CommandIdentity:
    """The identity the command presents: -q and -I, else the machine's (cli.identity)."""
    try:
        identity = resolve(args.hostnqn, args.hostid)
    except IdentityError as exc:
        raise CommandError(str(exc)) from None
    log.info(
        "host %s (from %s), host ID %s (from %s)",
        identity.hostnqn,
        identity.hostnqn_source,
        identity.hostid_text,
        identity.hostid_source,
    )
    return identity


def output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output-format",
        choices=("normal", "json"),
        default="normal",
        help="output format (default normal)",
    )


def where(args: argparse.Namespace) -> str:
    return f"{args.traddr} port {args.trsvcid}"


def active_namespace(ctrl: Controller, args: argparse.Namespace) -> RemoteNamespace:
    ns = ctrl.namespaces.get(args.namespace_id)
    if ns is None:
        active = ", ".join(str(n) for n in sorted(ctrl.namespaces)) or "none"
        raise CommandError(
            f"namespace {args.namespace_id} is not active on {args.nqn} (active: {active})"
        )
    return ns
