"""nvme-cli style host commands of `pynvmf`: discover, list, id-ctrl, id-ns, read, write.

Each command makes one short-lived association with a remote controller through
pynvmf.host, prints what nvme-cli prints for a local device (or JSON), and turns
every failure into a one-line message on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, BinaryIO

from pynvmf.aio import uvloop_factory
from pynvmf.block.device import Capabilities
from pynvmf.cli import identify_fields as F
from pynvmf.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CommandError,
    active_namespace,
    connect_arguments,
    connection_options,
    host_identity,
    int_at_least,
    namespace_option,
    output_option,
    resolve_target,
    size,
    where,
)
from pynvmf.cli.failures import Attempt, connect_failure
from pynvmf.cli.identity import CommandIdentity
from pynvmf.host import (
    Controller,
    DiscoveryLogEntry,
    NvmeError,
    connect,
    read_discovery_log,
)
from pynvmf.spec import identify as I
from pynvmf.spec import logpages as L
from pynvmf.spec.ports import DISCOVERY_PORT, NVME_TCP_PORT

# -- argument parsing ------------------------------------------------------------------------

# nvme connect's -n names the subsystem; here -n is the namespace ID (nvme id-ns, read,
# write), so a command without a namespace does not know it at all.
_NQN_HABIT = {
    "-n": "the subsystem NQN is --nqn (nvme connect's -n): -n means the namespace ID in "
    "pynvmf, as in nvme id-ns, read and write"
}
_DISCOVER_HABITS = {
    "-n": "discover reads the discovery subsystem's log: it takes no NQN",
    "--nqn": "discover reads the discovery subsystem's log: it takes no NQN",
}


def add_host_commands(subparsers: Any) -> None:
    """Register discover, list, id-ctrl, id-ns, read and write on the `pynvmf` parser."""
    p = subparsers.add_parser(
        "discover",
        help="print the discovery log of a discovery controller",
        description="Read the discovery log page, like `nvme discover -t tcp` (or -t rdma).",
        habits=_DISCOVER_HABITS,
    )
    connection_options(p, default_port=DISCOVERY_PORT, subsystem=False)
    output_option(p)

    p = subparsers.add_parser(
        "list",
        help="list the namespaces of a remote subsystem",
        description="The subsystem's active namespaces with size, format and usage, "
        "and its controller's serial number, model and firmware revision.",
        habits=_NQN_HABIT,
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    output_option(p)

    p = subparsers.add_parser(
        "id-ctrl",
        help="print a remote controller's Identify Controller data",
        description="Identify Controller, field by field like `nvme id-ctrl`.",
        habits=_NQN_HABIT,
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    output_option(p)
    _human_readable_option(p)

    p = subparsers.add_parser(
        "id-ns",
        help="print a remote namespace's Identify Namespace data",
        description="Identify Namespace, field by field like `nvme id-ns`.",
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    namespace_option(p)
    output_option(p)
    _human_readable_option(p)

    p = subparsers.add_parser(
        "read",
        help="read blocks from a remote namespace",
        description="Read -c/--block-count + 1 blocks (or -z/--data-size bytes) from "
        "--start-block on and write them to --data FILE, or to standard output (binary).",
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    namespace_option(p)
    _io_range_options(p, reading=True)
    p.add_argument(
        "-d", "--data", metavar="FILE", help="data file: where the blocks go (default: stdout)"
    )

    p = subparsers.add_parser(
        "write",
        help="write blocks to a remote namespace",
        description="Write --data FILE (or standard input) from --start-block on. The input "
        "must be a whole number of blocks unless --pad is given.",
    )
    connection_options(p, default_port=NVME_TCP_PORT)
    namespace_option(p)
    _io_range_options(p, reading=False)
    p.add_argument(
        "-d", "--data", metavar="FILE", help="data file: what is written (default: stdin)"
    )
    p.add_argument(
        "--pad",
        action="store_true",
        help="pad the input with zeroes to a whole number of blocks (or to the count given)",
    )
    p.add_argument(
        "-f", "--force-unit-access", "--fua", action="store_true", help="Force Unit Access"
    )


def _human_readable_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-H",
        "--human-readable",
        action="store_true",
        help="decode the bit fields in words under each field, as nvme-cli's -H (normal output)",
    )


def _io_range_options(p: argparse.ArgumentParser, *, reading: bool) -> None:
    p.add_argument(
        "--start-block",
        type=int_at_least(0),
        default=0,
        metavar="LBA",
        help="first logical block (default 0; nvme-cli's -s, which is the TCP port here)",
    )
    default = "" if reading else "; default: the whole input"
    p.add_argument(
        "-c",
        "--block-count",
        type=int_at_least(0),
        metavar="N",
        help=f"number of blocks, 0's based as nvme-cli's: 0 is one block{default}",
    )
    p.add_argument(
        "-z",
        "--data-size",
        type=size(),
        metavar="SIZE",
        help=f"data size in bytes (e.g. 4096, 64K): a whole number of blocks{default}",
    )


# -- running a command -----------------------------------------------------------------------


def run_host_command(args: argparse.Namespace) -> int:
    """Run the subcommand `args.command` parsed by add_host_commands' parsers; the exit status."""
    name = f"pynvmf {args.command}"
    command = _COMMANDS[args.command]
    resolve_target(args)
    try:
        identity = host_identity(args)
        with asyncio.Runner(loop_factory=uvloop_factory()) as runner:
            return runner.run(command(args, identity))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`... | head -c 512`): say nothing more on stdout, and
        # point it at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILURE
    except (CommandError, NvmeError, OSError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


async def _open(args: argparse.Namespace, identity: CommandIdentity, *, queues: int) -> Controller:
    try:
        return await connect(
            args.traddr,
            args.trsvcid,
            args.nqn,
            queues=queues,
            trtype=args.transport,
            **connect_arguments(args, identity),
        )
    except NvmeError as exc:
        failure = connect_failure(_attempt(args, identity), exc)
        refused = isinstance(exc.__cause__, ConnectionRefusedError)
        if refused and args.command in ("read", "write"):
            # nvme read's -s is the first block: a user who meant that learns it here.
            hint = "-s is the TCP port; the first block is --start-block"
            failure = CommandError(f"{failure} ({hint})")
        raise failure from exc


def _attempt(args: argparse.Namespace, identity: CommandIdentity) -> Attempt:
    return Attempt(args.traddr, args.trsvcid, identity, args.transport)


def _blocks(args: argparse.Namespace, block_size: int) -> int | None:
    """The blocks -c/--block-count (0's based) and -z/--data-size ask for, if any."""
    counted = None if args.block_count is None else args.block_count + 1
    sized = None
    if args.data_size is not None:
        if args.data_size % block_size:
            raise CommandError(
                f"--data-size {args.data_size} is not a whole number of {block_size}-byte blocks"
            )
        sized = args.data_size // block_size
    if counted is not None and sized is not None and counted != sized:
        raise CommandError(
            f"--block-count {args.block_count} is {counted} blocks ({counted * block_size} "
            f"bytes), --data-size {args.data_size} is {sized}: give one, or agreeing ones"
        )
    return counted if counted is not None else sized


def _check_range(args: argparse.Namespace, caps: Capabilities, nblocks: int) -> None:
    """Refuse a range outside the namespace before anything is sent or written."""
    last = args.start_block + nblocks - 1
    if last >= caps.num_blocks:
        raise CommandError(
            f"LBA range {args.start_block}..{last} is outside namespace {args.namespace_id} "
            f"(LBAs 0..{caps.num_blocks - 1})"
        )


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


# -- discover --------------------------------------------------------------------------------

_TRTYPES: dict[int, str] = {
    L.TrType.RDMA: "rdma",
    L.TrType.FC: "fc",
    L.TrType.TCP: "tcp",
    L.TrType.LOOP: "loop",
}
_ADRFAMS: dict[int, str] = {
    L.AdrFam.PCI: "pci",
    L.AdrFam.IPV4: "ipv4",
    L.AdrFam.IPV6: "ipv6",
    L.AdrFam.IB: "infiniband",
    L.AdrFam.FC: "fibre-channel",
    L.AdrFam.LOOP: "loop",
}
_SUBTYPES: dict[int, str] = {
    L.SubType.DISCOVERY: "discovery subsystem referral",
    L.SubType.NVME: "nvme subsystem",
    L.SubType.CURRENT_DISCOVERY: "current discovery subsystem",
}
_SECURE_CHANNEL: dict[int, str] = {
    L.Treq.NOT_SPECIFIED: "not specified",
    L.Treq.REQUIRED: "required",
    L.Treq.NOT_REQUIRED: "not required",
}
_SECTYPES: dict[int, str] = {
    L.TcpSecType.NONE: "none",
    L.TcpSecType.TLS12: "tls",
    L.TcpSecType.TLS13: "tls13",
}
# libnvme's wording and order for the flags.
_EFLAGS = (
    (L.DiscEflags.EPCSD, "explicit discovery connections"),
    (L.DiscEflags.DUPRETINFO, "duplicate discovery information"),
    (L.DiscEflags.NCC, "no cdc connectivity"),
)
_UNRECOGNIZED = "unrecognized"


def _treq_str(treq: int) -> str:
    text = _SECURE_CHANNEL.get(treq & L.Treq.SECURE_CHANNEL_MASK, _UNRECOGNIZED)
    if treq & L.Treq.DISABLE_SQFLOW:
        text += ", sq flow control disable supported"
    return text


def _eflags_str(eflags: int) -> str:
    return ", ".join(text for flag, text in _EFLAGS if eflags & flag) or "none"


def _entry_fields(entry: DiscoveryLogEntry) -> dict[str, str | int]:
    fields: dict[str, str | int] = {
        "trtype": _TRTYPES.get(entry.trtype, _UNRECOGNIZED),
        "adrfam": _ADRFAMS.get(entry.adrfam, _UNRECOGNIZED),
        "subtype": _SUBTYPES.get(entry.subtype, _UNRECOGNIZED),
        "treq": _treq_str(entry.treq),
        "portid": entry.portid,
        "trsvcid": entry.trsvcid,
        "subnqn": entry.subnqn,
        "traddr": entry.traddr,
        "eflags": _eflags_str(entry.eflags),
    }
    if entry.trtype == L.TrType.TCP:
        fields["sectype"] = _SECTYPES.get(entry.tcp_sectype, _UNRECOGNIZED)
    return fields


async def _discover(args: argparse.Namespace, identity: CommandIdentity) -> int:
    try:
        page = await read_discovery_log(
            args.traddr,
            args.trsvcid,
            hostnqn=identity.hostnqn,
            hostid=identity.hostid,
            trtype=args.transport,
        )
    except NvmeError as exc:
        raise connect_failure(_attempt(args, identity), exc) from exc
    records = [_entry_fields(entry) for entry in page.entries]
    if args.output_format == "json":
        _print_json({"genctr": page.genctr, "records": records})
        return 0
    # nvme-cli's header line, generation counter included: it changes with every change
    # to the log, so two listings with the same counter show the same log.
    print(f"\nDiscovery Log Number of Records {len(records)}, Generation counter {page.genctr}")
    for i, record in enumerate(records):
        print(f"=====Discovery Log Entry {i}======")
        for key, value in record.items():
            print(f"{key + ':':<8} {value}")
    return 0


# -- list ------------------------------------------------------------------------------------

_IEC_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _human(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in _IEC_UNITS:
        value /= 1024
        if value < 1024 or unit == _IEC_UNITS[-1]:
            break
    return f"{value:.2f} {unit}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return " ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))

    return [
        line(header).rstrip(),
        line(["-" * w for w in widths]),
        *(line(row).rstrip() for row in rows),
    ]


async def _list(args: argparse.Namespace, identity: CommandIdentity) -> int:
    # No I/O queues: Identify on the admin queue is all a listing needs.
    async with await _open(args, identity, queues=0) as ctrl:
        await ctrl.refresh_namespaces()
        info = ctrl.info
        assert info is not None  # set by connect()
        namespaces = [ctrl.namespaces[nsid] for nsid in sorted(ctrl.namespaces)]
    devices = []
    for ns in namespaces:
        ident = ns.identify
        block = ident.block_size
        devices.append(
            {
                "NameSpace": ns.nsid,
                "SubsystemNQN": args.nqn,
                "Address": args.traddr,
                "Port": args.trsvcid,
                "Firmware": info.fr,
                "ModelNumber": info.mn,
                "SerialNumber": info.sn,
                "UsedBytes": ident.nuse * block,
                "MaximumLBA": ident.nsze,
                "PhysicalSize": ident.nsze * block,
                "SectorSize": block,
                "MetadataSize": ident.metadata_size,
            }
        )
    if args.output_format == "json":
        _print_json({"Devices": devices})
        return 0
    print(f"Subsystem {args.nqn} at {where(args)}")
    rows = [
        [
            str(d["NameSpace"]),
            f"{d['PhysicalSize']} B ({_human(d['PhysicalSize'])})",
            f"{d['SectorSize']} B + {d['MetadataSize']} B",
            f"{_human(d['UsedBytes'])} / {_human(d['PhysicalSize'])}",
            info.sn,
            info.mn,
            info.fr,
        ]
        for d in devices
    ]
    header = ["Namespace", "Size", "Format", "Usage", "SN", "Model", "FW Rev"]
    for text in _table(header, rows):
        print(text)
    return 0


# -- id-ctrl, id-ns --------------------------------------------------------------------------

# Fields nvme-cli prints in hex; the rest are decimal (or text).
_CTRL_HEX = frozenset(
    {
        "vid", "ssvid", "cmic", "cntlid", "ver", "rtd3r", "rtd3e", "oaes", "ctratt", "rrls",
        "oacs", "frmw", "lpa", "avscc", "apsta", "rpmbs", "hctma", "sanicap", "sqes", "cqes",
        "oncs", "fuses", "fna", "vwc", "ocfs", "sgls", "fcatt",
    }
)  # fmt: skip
_NS_HEX = frozenset(
    {"nsze", "ncap", "nuse", "nsfeat", "flbas", "mc", "dpc", "dps", "nmic", "rescap", "fpi"}
)
_PSD_MXPS = 1 << 0
_PSD_NOPS = 1 << 1


def _c_hex(value: int) -> str:
    # C's "%#x" prints zero as "0", not "0x0"; nvme-cli's output inherits that.
    return f"{value:#x}" if value else "0"


def _ps_power(value: int, scale: int) -> str:
    """A power value as nvme-cli shows it; `scale` is the 2-bit scale field."""
    if scale == 0:
        return "-"  # not reported
    if scale == 1:
        return f"{value // 10000}.{value % 10000:04d}W"  # 0.0001 W units
    if scale == 2:
        return f"{value // 100}.{value % 100:02d}W"  # 0.01 W units
    return "reserved"


def _psd_lines(index: int, psd: I.PowerStateDescriptor) -> list[str]:
    max_power = _ps_power(psd.max_power, 1 if psd.flags & _PSD_MXPS else 2)
    kind = "non-operational" if psd.flags & _PSD_NOPS else "operational"
    idle = _ps_power(psd.idle_power, psd.idle_scale >> 6)
    active = _ps_power(psd.active_power, psd.active_work_scale >> 6)
    return [
        f"ps   {index:4d} : mp:{max_power} {kind} enlat:{psd.entry_lat} exlat:{psd.exit_lat} "
        f"rrt:{psd.read_tput} rrl:{psd.read_lat}",
        f"            rwt:{psd.write_tput} rwl:{psd.write_lat} "
        f"idle_power:{idle} active_power:{active}",
    ]


def _id_ctrl_lines(info: I.IdentifyController, human: bool = False) -> list[str]:
    lines = ["NVME Identify Controller:"]
    for field in dataclasses.fields(info):
        name = field.name
        if name == "psd":
            continue
        value = getattr(info, name)
        if name == "ieee":
            text = f"{value:06x}"
        elif name == "fguid":
            text = str(uuid.UUID(bytes=value))
        elif name in _CTRL_HEX:
            text = _c_hex(value)
        else:
            text = str(value)
        lines.append(f"{name:<10}: {text}")
        if human and isinstance(value, int):
            lines.extend(F.explain(F.CONTROLLER, name, value))
        if name == "elpe":
            # NPSS is derived from the descriptor list, so it is not a dataclass field.
            lines.append(f"{'npss':<10}: {info.npss}")
    for i, psd in enumerate(info.psd):
        lines.extend(_psd_lines(i, psd))
    return lines


def _id_ns_lines(nsid: int, ident: I.IdentifyNamespace, human: bool = False) -> list[str]:
    lines = [f"NVME Identify Namespace {nsid}:"]
    for field in dataclasses.fields(ident):
        name = field.name
        if name == "lbaf":
            continue
        value = getattr(ident, name)
        if isinstance(value, bytes):
            text = value.hex()
        elif name in _NS_HEX:
            text = _c_hex(value)
        else:
            text = str(value)
        lines.append(f"{name:<8}: {text}")
        if human and isinstance(value, int):
            lines.extend(F.explain(F.NAMESPACE, name, value))
        if name == "nsfeat":
            lines.append(f"{'nlbaf':<8}: {ident.nlbaf}")
    current = ident.lbaf_index
    for i, fmt in enumerate(ident.lbaf):
        if human:
            lines.append(F.lba_format_line(i, fmt.ms, fmt.lbads, fmt.rp, i == current))
            continue
        in_use = " (in use)" if i == current else ""
        lines.append(
            f"lbaf {i:2d} : ms:{fmt.ms:<3d} lbads:{fmt.lbads:<2d} rp:{_c_hex(fmt.rp)}{in_use}"
        )
    return lines


async def _id_ctrl(args: argparse.Namespace, identity: CommandIdentity) -> int:
    async with await _open(args, identity, queues=0) as ctrl:
        info = await ctrl.identify_controller()
    if args.output_format == "json":
        _print_json({**_jsonable(dataclasses.asdict(info)), "npss": info.npss})
    else:
        print("\n".join(_id_ctrl_lines(info, args.human_readable)))
    return 0


async def _id_ns(args: argparse.Namespace, identity: CommandIdentity) -> int:
    async with await _open(args, identity, queues=0) as ctrl:
        ident = await ctrl.identify_namespace(args.namespace_id)
    if not ident.nsze:
        # Controllers answer Identify for an inactive NSID with zeroes, not an error.
        raise CommandError(f"namespace {args.namespace_id} is not active on {args.nqn}")
    if args.output_format == "json":
        _print_json({**_jsonable(dataclasses.asdict(ident)), "nlbaf": ident.nlbaf})
    else:
        print("\n".join(_id_ns_lines(args.namespace_id, ident, args.human_readable)))
    return 0


# -- read, write -----------------------------------------------------------------------------


@contextlib.contextmanager
def _binary_input(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as f:
        yield f


_READ_CHUNK = 1 << 20


def _read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes (all, if negative) from `fd`, until EOF."""
    chunks: list[bytes] = []
    total = 0
    while limit < 0 or total < limit:
        chunk = os.read(fd, _READ_CHUNK if limit < 0 else min(_READ_CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


async def _read_input(source: BinaryIO, limit: int) -> bytes:
    """Read the input in a daemon thread: the loop keeps sending keep-alives while a
    slow producer fills a pipe, and an interrupted command exits at once instead of
    waiting (as asyncio.to_thread's executor would) for an EOF that may never come.

    The thread reads the file descriptor, not `source`: a daemon thread blocked inside
    sys.stdin.buffer holds its lock, and the interpreter aborts when it finalizes stdin.
    """
    try:
        fd = source.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream
        return source.read(limit)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()

    def deliver(data: bytes, error: OSError | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(data)

    def work() -> None:
        data, error = b"", None
        try:
            data = _read_fd(fd, limit)
        except OSError as exc:
            error = exc
        # After an interrupt the loop may be closed already; then nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, data, error)

    threading.Thread(target=work, name="pynvmf input", daemon=True).start()
    return await done


def _emit(path: str | None, data: bytes | bytearray) -> None:
    if path is None or path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    with open(path, "wb") as f:
        f.write(data)


async def _read(args: argparse.Namespace, identity: CommandIdentity) -> int:
    if args.block_count is None and args.data_size is None:
        raise CommandError("how much to read: -c/--block-count (0's based) or -z/--data-size")
    async with await _open(args, identity, queues=1) as ctrl:
        ns = active_namespace(ctrl, args)
        caps = ns.capabilities
        nblocks = _blocks(args, caps.block_size)
        assert nblocks is not None
        _check_range(args, caps, nblocks)
        buf = bytearray(nblocks * caps.block_size)
        # One call: the library splits it into MDTS-sized commands, all in flight.
        await ns.read(args.start_block, memoryview(buf))
    # Only now is the output touched, so a failed read leaves an existing file intact.
    _emit(args.data, buf)
    print("read: Success", file=sys.stderr)
    return 0


def _whole_blocks(data: bytes, block_size: int, wanted_blocks: int | None, pad: bool) -> bytes:
    """`data` as a whole number of blocks (`wanted_blocks` of them if given), padded
    with zeroes only when `pad` allows it."""
    if wanted_blocks is not None:
        wanted = wanted_blocks * block_size
    else:
        wanted = -(-len(data) // block_size) * block_size
    if len(data) == wanted:
        return data
    if not pad:
        if wanted_blocks is not None:
            raise CommandError(
                f"the input ends after {len(data)} bytes; {wanted_blocks} blocks of "
                f"{block_size} bytes need {wanted}; --pad fills up with zeroes"
            )
        raise CommandError(
            f"{len(data)} bytes of input is not a whole number of {block_size}-byte blocks; "
            "--pad fills up the last block with zeroes"
        )
    return data + bytes(wanted - len(data))


async def _write(args: argparse.Namespace, identity: CommandIdentity) -> int:
    # The input is opened first so a missing file fails before any connection is made.
    with _binary_input(args.data) as source:
        async with await _open(args, identity, queues=1) as ctrl:
            ns = active_namespace(ctrl, args)
            caps = ns.capabilities
            nblocks = _blocks(args, caps.block_size)
            limit = -1
            if nblocks is not None:
                _check_range(args, caps, nblocks)
                limit = nblocks * caps.block_size
            data = await _read_input(source, limit)
            if not data:
                raise CommandError("no data to write: the input is empty")
            data = _whole_blocks(data, caps.block_size, nblocks, args.pad)
            _check_range(args, caps, len(data) // caps.block_size)
            await ns.write(args.start_block, data, fua=args.force_unit_access)
    print("write: Success", file=sys.stderr)
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace, CommandIdentity], Coroutine[Any, Any, int]]] = {
    "discover": _discover,
    "list": _list,
    "id-ctrl": _id_ctrl,
    "id-ns": _id_ns,
    "read": _read,
    "write": _write,
}
