"""`pynvmf copy SRC DST`: copy blocks between remote namespaces, files and block devices.

An endpoint is one of

    nvme://HOST[:PORT]/NQN/NSID[@LBA][+COUNT]   a namespace of an NVMe/TCP subsystem
    file:PATH[@LBA][+COUNT]                     a regular file or block device
    PATH                                        the same, whole, from block 0

HOST is a name or an IPv4 address, or an IPv6 address in brackets
(`nvme://[fe80::1%eth0]:4420/...`); PORT defaults to 4420. The NQN is everything
between the address and the last `/`. LBA is decimal or 0x-prefixed hex (default 0).
COUNT is a number of blocks, or a size with a unit in pynvmf.units' grammar: `+64M`,
`+1MB`, `+2GiB` (powers of 1024; B: bytes). `file:///abs/path` works too.

A copy that is interrupted (Ctrl-C) or fails leaves a destination file that it
created or extended ending where the copied data ends without a gap, as an
interrupted cp or dd leaves it: the file was made full size up front (so that chunks
can land in any order), and left so, it would look like a finished copy whose end is
zeroes. A block device, or a file that was already large enough, keeps its size.

The copy runs through the copy engine (pynvmf.block.copier): chunks, several in
flight, each offloaded, copied natively or emulated as the copy planner decides. So
a copy whose two ends are namespaces of one remote controller with the NVMe Copy
command never moves its data through this host; the command only makes sure both
ends share one connection and one namespace object, so the planner can tell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import os
import re
import signal
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from pynvmf import units
from pynvmf.aio import uvloop_factory
from pynvmf.block.copier import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DEPTH,
    Copier,
    CopyJob,
    CopyStatus,
    JobState,
)
from pynvmf.block.device import BlockDevice
from pynvmf.block.file import FileDevice
from pynvmf.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CommandError,
    connect_arguments,
    connect_options,
    error_text,
    host_identity,
    host_identity_options,
    int_at_least,
    output_option,
    verbose_option,
)
from pynvmf.cli.failures import Attempt, connect_failure
from pynvmf.cli.identity import CommandIdentity
from pynvmf.host import Controller, NvmeError, connect
from pynvmf.spec.ports import NVME_TCP_PORT

DEFAULT_FILE_BLOCK_SIZE = 512
_MAX_NQN = 223  # NVMe: an NQN is at most 223 bytes
_MAX_QUEUES = 4

# -- endpoint syntax -----------------------------------------------------------------------


class EndpointError(ValueError):
    """An endpoint or size that does not parse; the message says what is expected."""


@dataclass(frozen=True, slots=True)
class Amount:
    """A COUNT or SIZE: `value` blocks, or `value` bytes when `in_bytes`."""

    value: int
    in_bytes: bool
    text: str

    def blocks(self, block_size: int, what: str) -> int:
        if not self.in_bytes:
            return self.value
        if self.value % block_size:
            raise CommandError(
                f"{what} {self.text} is not a whole number of {block_size}-byte blocks"
            )
        return self.value // block_size


@dataclass(frozen=True, slots=True)
class RemoteEndpoint:
    host: str
    port: int
    nqn: str
    nsid: int
    lba: int
    count: Amount | None
    text: str


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    path: str
    lba: int
    count: Amount | None
    text: str


Endpoint = RemoteEndpoint | LocalEndpoint

_LBA = r"0[xX][0-9a-fA-F]+|\d+"
_REMOTE_TAIL = re.compile(rf"(?P<nsid>\d+)(?:@(?P<lba>{_LBA}))?(?:\+(?P<count>.+))?")
# The path is lazy so that a trailing @LBA / +COUNT is taken as such; a name that
# merely contains '@' or '+' stays whole unless its end parses as one.
_LOCAL = re.compile(
    rf"(?P<path>.+?)(?:@(?P<lba>{_LBA}))?(?:\+(?P<count>\d+(?:[kmgtp](?:i?b)?|b)?))?",
    re.IGNORECASE,
)
_REMOTE_FORM = "nvme://HOST[:PORT]/NQN/NSID[@LBA][+COUNT]"


def parse_amount(text: str, what: str = "size") -> Amount:
    """`8` (blocks), or a size in pynvmf.units' grammar: `4096B`, `64K`, `1MB`, `2GiB`."""
    try:
        quantity = units.parse_quantity(text)
    except ValueError:
        raise EndpointError(
            f"{what} {text!r} is neither a number of blocks nor a size like 64K, 1M, 4096B"
        ) from None
    if quantity.number <= 0:
        raise EndpointError(f"{what} {text!r} must be at least one block")
    return Amount(quantity.value, quantity.has_unit, text)


def _amount_option(what: str) -> Callable[[str], Amount]:
    def parse(text: str) -> Amount:
        try:
            return parse_amount(text, what)
        except EndpointError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _block_size(text: str) -> int:
    value = int_at_least(512)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value} is not a power of two")
    return value


def parse_endpoint(text: str) -> Endpoint:
    """An endpoint as described in the module docstring; EndpointError if malformed."""
    if not text:
        raise EndpointError("empty endpoint")
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() == "nvme":
        return _parse_remote(text, rest)
    if sep and scheme.lower() != "file":
        raise EndpointError(
            f"unknown scheme {scheme!r} in {text!r}: use {_REMOTE_FORM}, file:PATH or a path"
        )
    if text.lower().startswith("nvme:"):
        raise EndpointError(f"{text!r}: a remote namespace is {_REMOTE_FORM}")
    if text.lower().startswith("file:"):
        return _parse_file(text, text[len("file:") :])
    if text == "-":
        raise EndpointError("standard input and output cannot be copied to or from: give a file")
    return LocalEndpoint(text, 0, None, text)


def _parse_file(text: str, rest: str) -> LocalEndpoint:
    if rest.startswith("//"):
        if not rest.startswith("///"):
            raise EndpointError(f"{text!r}: a file URL has no host; use file:/PATH or file:///PATH")
        rest = rest[2:]
    m = _LOCAL.fullmatch(rest)
    if m is None:
        raise EndpointError(f"{text!r}: expected file:PATH[@LBA][+COUNT]")
    count = m["count"]
    return LocalEndpoint(
        m["path"],
        int(m["lba"], 0) if m["lba"] else 0,
        parse_amount(count, f"count in {text!r}") if count else None,
        text,
    )


def _parse_remote(text: str, rest: str) -> RemoteEndpoint:
    authority, slash, path = rest.partition("/")
    if not slash:
        raise EndpointError(f"{text!r}: expected {_REMOTE_FORM}")
    host, port = _parse_authority(text, authority)
    nqn, slash, tail = path.rpartition("/")
    if not slash or not nqn:
        raise EndpointError(f"{text!r}: expected NQN/NSID after the address ({_REMOTE_FORM})")
    if len(nqn.encode()) > _MAX_NQN:
        raise EndpointError(f"{text!r}: the NQN is longer than {_MAX_NQN} bytes")
    m = _REMOTE_TAIL.fullmatch(tail)
    if m is None:
        raise EndpointError(
            f"{text!r}: {tail!r} is not NSID[@LBA][+COUNT] (e.g. 1, 1@2048, 1@0+64M)"
        )
    nsid = int(m["nsid"])
    if not 1 <= nsid <= 0xFFFFFFFE:
        raise EndpointError(f"{text!r}: namespace ID {nsid} is not in 1..4294967294")
    count = m["count"]
    return RemoteEndpoint(
        host,
        port,
        nqn,
        nsid,
        int(m["lba"], 0) if m["lba"] else 0,
        parse_amount(count, f"count in {text!r}") if count else None,
        text,
    )


def _parse_authority(text: str, authority: str) -> tuple[str, int]:
    if authority.startswith("["):
        host, bracket, after = authority[1:].partition("]")
        if not bracket:
            raise EndpointError(f"{text!r}: '[' without ']' around the IPv6 address")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise EndpointError(f"{text!r}: {host!r} is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise EndpointError(f"{text!r}: expected ':PORT' after ']', not {after!r}")
        port_text = after[1:] if after else None
    else:
        if authority.count(":") > 1:
            raise EndpointError(
                f"{text!r}: an IPv6 address goes in brackets: nvme://[ADDR]:PORT/NQN/NSID"
            )
        host, colon, port_text_ = authority.partition(":")
        port_text = port_text_ if colon else None
    if not host:
        raise EndpointError(f"{text!r}: no host address ({_REMOTE_FORM})")
    if port_text is None:
        return host, NVME_TCP_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 0xFFFF:
        raise EndpointError(f"{text!r}: port {port_text!r} is not in 1..65535")
    return host, int(port_text)


# -- argument parsing ----------------------------------------------------------------------


_HABITS = {
    "-q": "-q is --hostnqn, as in nvme connect; no progress bar and no summary is --quiet",
    "-c": "how much to copy is --count (-c is nvme read's 0's based --block-count)",
}


def add_copy_command(subparsers: Any) -> None:
    """Register `copy` on the `pynvmf` parser."""
    p = subparsers.add_parser(
        "copy",
        help="copy blocks between remote namespaces, files and block devices",
        description="Copy COUNT blocks from SRC to DST. An endpoint is "
        "nvme://HOST[:PORT]/NQN/NSID[@LBA][+COUNT] (IPv6 in brackets, port 4420 by default), "
        "file:PATH[@LBA][+COUNT], or a PATH (a regular file or block device, whole). COUNT is "
        "blocks, or a size such as 64M or 1MB (K, M, G, T are powers of 1024; B is bytes). "
        "Without --count or +COUNT the copy runs to the end of the source. A missing or "
        "shorter destination file is created or extended; if the copy is interrupted or "
        "fails, it is cut back to end with the last block copied without a gap. Copies "
        "between namespaces of one remote controller that supports Copy are offloaded: the "
        "data never crosses the network.",
        habits=_HABITS,
    )
    p.add_argument("source", metavar="SRC", help="what to copy from")
    p.add_argument("destination", metavar="DST", help="where to copy to")
    p.add_argument(
        "--count",
        type=_amount_option("--count"),
        metavar="BLOCKS|SIZE",
        help="how much to copy (default: to the end)",
    )
    p.add_argument(
        "--chunk",
        type=_amount_option("--chunk"),
        metavar="BLOCKS|SIZE",
        help=f"unit of work and progress (default {DEFAULT_CHUNK_BYTES >> 20}M)",
    )
    p.add_argument(
        "--depth",
        type=int_at_least(1),
        default=DEFAULT_DEPTH,
        metavar="N",
        help=f"chunks in flight (default {DEFAULT_DEPTH})",
    )
    p.add_argument(
        "--block-size",
        type=_block_size,
        metavar="BYTES",
        help="block size of local files (default: the remote end's, else 512)",
    )
    p.add_argument(
        "-f",
        "--force-unit-access",
        "--fua",
        action="store_true",
        help="make the copy durable before finishing",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    output_option(p)
    host_identity_options(p)
    connect_options(p)
    verbose_option(p)


@dataclass(frozen=True, slots=True)
class _Options:
    source: Endpoint
    destination: Endpoint
    count: Amount | None
    chunk: Amount | None
    depth: int
    block_size: int | None


def _options(args: argparse.Namespace) -> _Options:
    try:
        source = parse_endpoint(args.source)
        destination = parse_endpoint(args.destination)
    except EndpointError as exc:
        raise CommandError(f"bad endpoint: {exc}") from None
    return _Options(source, destination, args.count, args.chunk, args.depth, args.block_size)


# -- running -------------------------------------------------------------------------------


def run_copy_command(args: argparse.Namespace) -> int:
    """Run `pynvmf copy` as parsed by add_copy_command's parser; the exit status."""
    try:
        with asyncio.Runner(loop_factory=uvloop_factory()) as runner:
            return runner.run(_copy(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (CommandError, NvmeError, OSError, ValueError) as exc:
        print(f"pynvmf copy: {error_text(exc)}", file=sys.stderr)
        return EXIT_FAILURE


class _Devices:
    """Opens endpoints, sharing what two endpoints have in common: one connection per
    subsystem (so the planner sees two namespaces of one controller, or one namespace
    object for both ends) and one FileDevice per file."""

    def __init__(
        self, args: argparse.Namespace, opts: _Options, stack: contextlib.AsyncExitStack
    ) -> None:
        self._args = args
        self._opts = opts
        self._stack = stack
        self._controllers: dict[tuple[str, int, str], Controller] = {}
        # Found when the first remote endpoint needs it: a local copy has no host.
        self._identity: CommandIdentity | None = None

    async def remote(self, ep: RemoteEndpoint) -> BlockDevice:
        key = (ep.host, ep.port, ep.nqn)
        ctrl = self._controllers.get(key)
        if ctrl is None:
            ctrl = await self._connect(ep)
            await self._stack.enter_async_context(ctrl)
            self._controllers[key] = ctrl
        ns = ctrl.namespaces.get(ep.nsid)
        if ns is None:
            active = ", ".join(str(n) for n in sorted(ctrl.namespaces)) or "none"
            raise CommandError(f"namespace {ep.nsid} is not active on {ep.nqn} (active: {active})")
        return ns

    async def _connect(self, ep: RemoteEndpoint) -> Controller:
        if self._identity is None:
            self._identity = host_identity(self._args)
        try:
            return await connect(
                ep.host,
                ep.port,
                ep.nqn,
                queues=min(self._opts.depth, _MAX_QUEUES),
                **connect_arguments(self._args, self._identity),
            )
        except NvmeError as exc:
            raise connect_failure(Attempt(ep.host, ep.port, self._identity), exc) from exc

    async def file(
        self, path: str, block_size: int, *, read_only: bool, size_bytes: int | None = None
    ) -> FileDevice:
        device = FileDevice(
            path,
            block_size,
            read_only=read_only,
            size_bytes=size_bytes,
            create=size_bytes is not None,
        )
        self._stack.push_async_callback(device.close)
        return device


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def _resolve_count(opts: _Options, block_size: int) -> int | None:
    """The one count that --count, the source's +COUNT and the destination's agree on."""
    given: list[tuple[str, int]] = []
    if opts.count is not None:
        given.append((f"--count {opts.count.text}", opts.count.blocks(block_size, "--count")))
    for role, ep in (("source", opts.source), ("destination", opts.destination)):
        if ep.count is not None:
            what = f"the {role}'s +{ep.count.text}"
            given.append((what, ep.count.blocks(block_size, what)))
    if not given:
        return None
    first_what, first = given[0]
    for what, blocks in given[1:]:
        if blocks != first:
            raise CommandError(
                f"counts disagree: {first_what} is {first} blocks, {what} is {blocks} "
                f"({block_size}-byte blocks)"
            )
    return first


def _check_fits(ep: Endpoint, device: BlockDevice, count: int, role: str) -> None:
    n = device.capabilities.num_blocks
    if ep.lba + count > n:
        raise CommandError(
            f"{role} range LBA {ep.lba}..{ep.lba + count - 1} is outside {ep.text} "
            f"(LBAs 0..{n - 1})"
        )


@dataclass(frozen=True, slots=True)
class _Grown:
    """A destination file this copy created (`before` None) or extended from `before`
    bytes, to hold the range from byte `start` on."""

    path: str
    before: int | None
    start: int
    block_size: int

    def cut(self, copied_blocks: int) -> int:
        """Make the file end where the data copied without a gap ends (never shorter
        than it was before); its new size."""
        end = self.start + copied_blocks * self.block_size if copied_blocks else 0
        size = max(end, self.before or 0)
        os.truncate(self.path, size)
        return size


def _size_before(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


async def _open(
    opts: _Options, devices: _Devices
) -> tuple[BlockDevice, BlockDevice, int, _Grown | None]:
    """(source, destination, blocks to copy, the destination file if this copy makes it
    larger); nothing is created or extended until both ranges are known to be valid."""
    src_ep, dst_ep = opts.source, opts.destination
    src = await devices.remote(src_ep) if isinstance(src_ep, RemoteEndpoint) else None
    dst = await devices.remote(dst_ep) if isinstance(dst_ep, RemoteEndpoint) else None
    remote_sizes = {d.capabilities.block_size for d in (src, dst) if d is not None}
    if src is not None and dst is not None and len(remote_sizes) > 1:
        raise CommandError(
            f"block sizes differ: source {src.capabilities.block_size}, "
            f"destination {dst.capabilities.block_size}"
        )
    block_size = next(iter(remote_sizes), opts.block_size or DEFAULT_FILE_BLOCK_SIZE)
    if opts.block_size is not None and opts.block_size != block_size:
        raise CommandError(
            f"--block-size {opts.block_size} differs from the remote namespace's {block_size}"
        )
    same_file = (
        isinstance(src_ep, LocalEndpoint)
        and isinstance(dst_ep, LocalEndpoint)
        and _same_file(src_ep.path, dst_ep.path)
    )
    if isinstance(src_ep, LocalEndpoint):
        # Opened writable only when it is the destination too: one device for both
        # ends lets the planner copy within the file (copy_file_range).
        src = await devices.file(src_ep.path, block_size, read_only=not same_file)
    assert src is not None
    available = src.capabilities.num_blocks - src_ep.lba
    if available <= 0:
        raise CommandError(
            f"source LBA {src_ep.lba} is past the end of {src_ep.text} "
            f"({src.capabilities.num_blocks} blocks)"
        )
    count = _resolve_count(opts, block_size)
    if count is None:
        count = available
    _check_fits(src_ep, src, count, "source")
    grown = None
    if same_file:
        dst = src
    elif isinstance(dst_ep, LocalEndpoint):
        # A regular file (or a new one) grows to hold the range, as dd's output does.
        grow = not _is_block_device(dst_ep.path)
        size = (dst_ep.lba + count) * block_size if grow else None
        before = _size_before(dst_ep.path) if grow else None
        dst = await devices.file(dst_ep.path, block_size, read_only=False, size_bytes=size)
        if size is not None and (before is None or before < size):
            grown = _Grown(dst_ep.path, before, dst_ep.lba * block_size, block_size)
    assert dst is not None
    _check_fits(dst_ep, dst, count, "destination")
    return src, dst, count, grown


async def _copy(args: argparse.Namespace) -> int:
    opts = _options(args)
    async with contextlib.AsyncExitStack() as stack:
        src, dst, count, grown = await _open(opts, _Devices(args, opts, stack))
        bs = src.capabilities.block_size
        chunk = opts.chunk.blocks(bs, "--chunk") if opts.chunk is not None else None
        show_bar = not args.quiet and sys.stderr.isatty()
        bar = ProgressBar(sys.stderr) if show_bar else None
        job = Copier().submit(
            src,
            opts.source.lba,
            dst,
            opts.destination.lba,
            count,
            chunk_blocks=chunk,
            depth=opts.depth,
            fua=args.force_unit_access,
            on_progress=bar.update if bar is not None else None,
        )
        status = await _wait_interruptible(job)
        if bar is not None:
            bar.clear()
    cut = None
    if grown is not None and status.state is not JobState.COMPLETED:
        cut = (grown.path, grown.cut(status.prefix_blocks))
    # Reported once everything is closed: with --fua, closing is part of the copy.
    return _report(args, opts, status, cut)


async def _wait_interruptible(job: CopyJob) -> CopyStatus:
    """Wait for the job; SIGINT cancels it cleanly (the chunks in flight finish)."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, job.cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
        return await job.wait()
    try:
        return await job.wait()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


# -- output --------------------------------------------------------------------------------

_IEC_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
_BAR_WIDTH = 24
_REPORT_FIELDS = ("offloaded_blocks", "native_blocks", "emulated_blocks")


def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in _IEC_UNITS:
        n /= 1024
        if n < 1024 or unit == _IEC_UNITS[-1]:
            break
    return f"{n:.1f} {unit}"


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def format_progress(done: int, total: int, bytes_per_second: float) -> str:
    """One progress line: bar, bytes done / total, percent, MB/s (10**6), ETA."""
    fraction = done / total if total else 1.0
    filled = int(fraction * _BAR_WIDTH)
    eta = _clock((total - done) / bytes_per_second) if bytes_per_second > 0 else "-:--:--"
    return (
        f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
        f"{human_bytes(done)} / {human_bytes(total)} {fraction:4.0%} "
        f"{bytes_per_second / 1e6:8.1f} MB/s  ETA {eta}"
    )


class ProgressBar:
    """Redraws one line of `stream` (a terminal) in place."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._width = 0

    def update(self, job: CopyJob) -> None:
        line = format_progress(job.done_bytes, job.total_bytes, job.bytes_per_second)
        self._width = max(self._width, len(line))
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()

    def clear(self) -> None:
        if self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


def summary(
    opts: _Options, status: CopyStatus, cut: tuple[str, int] | None = None
) -> dict[str, Any]:
    report = dataclasses.asdict(status.report)
    return {
        "status": str(status.state),
        "source": opts.source.text,
        "destination": opts.destination.text,
        "source_lba": opts.source.lba,
        "destination_lba": opts.destination.lba,
        "block_size": status.block_size,
        "blocks": status.done_blocks,
        "total_blocks": status.total_blocks,
        "bytes": status.done_bytes,
        "seconds": round(status.seconds, 6),
        "bytes_per_second": round(status.bytes_per_second, 1),
        **report,
        "error": error_text(status.error) if status.error is not None else None,
        # A destination file cut back to the data copied without a gap (module docstring).
        "destination_size": cut[1] if cut is not None else None,
    }


def summary_line(status: CopyStatus, cut: tuple[str, int] | None = None) -> str:
    verb = "copied" if status.state is JobState.COMPLETED else f"{status.state}: copied"
    done = status.done_bytes
    amount = f"{done} bytes ({human_bytes(done)})"
    if status.state is not JobState.COMPLETED:
        amount += f" of {status.total_blocks * status.block_size}"
    ways = ", ".join(
        f"{getattr(status.report, f)} {f.removesuffix('_blocks')}"
        for f in _REPORT_FIELDS
        if hasattr(status.report, f)
    )
    line = (
        f"{verb} {amount} in {status.seconds:.2f} s, "
        f"{status.bytes_per_second / 1e6:.1f} MB/s; blocks: {ways}"
    )
    if cut is not None:
        line += f"; {cut[0]} cut to {cut[1]} bytes, the end of the data copied without a gap"
    return line


def _report(
    args: argparse.Namespace, opts: _Options, status: CopyStatus, cut: tuple[str, int] | None
) -> int:
    if args.output_format == "json":
        print(json.dumps(summary(opts, status, cut), indent=2))
    elif not args.quiet and status.state is not JobState.FAILED:
        print(summary_line(status, cut))
    if status.state is JobState.FAILED:
        assert status.error is not None
        where = "" if cut is None else f" ({cut[0]} cut to {cut[1]} bytes)"
        print(f"pynvmf copy: {error_text(status.error)}{where}", file=sys.stderr)
        return EXIT_FAILURE
    if status.state is JobState.CANCELLED:
        return EXIT_INTERRUPTED
    return 0
