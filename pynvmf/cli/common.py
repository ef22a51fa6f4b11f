"""What the `pynvmf` commands share: exit statuses, the one-line error, option parsers
and the connection options of the host-side commands, the event loop they run in."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pynvmf.host import Controller, NvmeConnectionError, NvmeError, RemoteNamespace
from pynvmf.tcp.psk import ConfiguredPsk, PskError

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130  # what a shell reports for a command ended by SIGINT


class CommandError(Exception):
    """A failure worth exactly one line on stderr: the message says it all."""


def port_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 1 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"port {value} not in 1..65535")
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


def hostid_arg(text: str) -> bytes:
    try:
        return uuid.UUID(text).bytes
    except ValueError:
        raise argparse.ArgumentTypeError(f"host ID {text!r} is not a UUID") from None


def connection_options(
    p: argparse.ArgumentParser, *, default_port: int, subsystem: bool = True
) -> None:
    p.add_argument(
        "-t", "--transport", choices=("tcp",), default="tcp", help="transport (only tcp)"
    )
    p.add_argument("-a", "--traddr", required=True, metavar="ADDR", help="target address")
    p.add_argument(
        "-s",
        "--trsvcid",
        type=port_number,
        default=default_port,
        metavar="PORT",
        help=f"target TCP port (default {default_port})",
    )
    if subsystem:
        p.add_argument("-n", "--nqn", required=True, help="subsystem NQN")
    p.add_argument("-q", "--hostnqn", help="host NQN (default: a UUID NQN for this process)")
    p.add_argument("-I", "--hostid", type=hostid_arg, metavar="UUID", help="host identifier")
    if subsystem:
        # pynvmf.host.discover() takes no digest options, so discover offers none.
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
    # pynvmf.cli.main configures logging from args.verbose for every subcommand.
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeatable)")


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


def output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output-format",
        choices=("normal", "json"),
        default="normal",
        help="output format (default normal)",
    )


def namespace_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namespace-id",
        type=int_at_least(1),
        default=1,
        metavar="NSID",
        help="namespace ID (default 1)",
    )


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    # A loop factory rather than uvloop's event loop policy: that policy is global and
    # would outlive the command in a process that goes on to use asyncio otherwise.
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def where(args: argparse.Namespace) -> str:
    return f"{args.traddr} port {args.trsvcid}"


def connect_failure(args: argparse.Namespace, exc: NvmeError) -> CommandError:
    if not isinstance(exc, NvmeConnectionError):
        return CommandError(f"{where(args)}: {exc}")
    cause = exc.__cause__
    if isinstance(cause, socket.gaierror):
        return CommandError(f"cannot resolve {args.traddr}: {cause.strerror}")
    if isinstance(cause, OSError) and cause.errno:
        # asyncio words a refused connection "Connect call failed (addr, port)";
        # the errno's own text ("Connection refused") is what a user recognises.
        return CommandError(f"cannot connect to {where(args)}: {os.strerror(cause.errno)}")
    return CommandError(f"cannot connect: {exc}")


def active_namespace(ctrl: Controller, args: argparse.Namespace) -> RemoteNamespace:
    ns = ctrl.namespaces.get(args.namespace_id)
    if ns is None:
        active = ", ".join(str(n) for n in sorted(ctrl.namespaces)) or "none"
        raise CommandError(
            f"namespace {args.namespace_id} is not active on {args.nqn} (active: {active})"
        )
    return ns
