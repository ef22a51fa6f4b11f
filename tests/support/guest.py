"""Debian's Linux kernel under QEMU as an NVMe/TCP peer for interoperability tests.

The machines running the tests have no NVMe kernel modules, so a real Linux NVMe/TCP host
(nvme-tcp) or target (nvmet-tcp) means booting a kernel in a VM. This module boots one of
three peers with QEMU (TCG, user-mode networking) and drives a command server on a
virtio-serial port (the serial console only carries the kernel's log):

- ``linux-6.1`` (:data:`LINUX_6_1`, the default): Debian 12 (bookworm)'s kernel with a
  busybox initramfs that holds nvme-cli 2.3, fio 3.33 and the NVMe modules copied from the
  machine (guest_bookworm.py); boots in ~5-10 s.
- ``linux-6.12`` (:data:`LINUX_6_12`): Debian 13 (trixie)'s kernel booted from a trixie
  root filesystem (debootstrap) with nvme-cli 2.13, fio 3.39, ktls-utils (tlshd), keyutils
  and the kernel's whole module tree (nvme-auth, nvme-keyring, tls: DH-HMAC-CHAP and TLS
  work in it) (guest_debootstrap.py); boots in ~15-30 s. Building it needs root.
- ``linux-7`` (:data:`LINUX_7`): Debian unstable (sid)'s kernel, whatever 7.x it is (7.2.13
  on 2026-12-03), built the same way from a sid root filesystem (nvme-cli 2.16, fio 3.41,
  tlshd 1.4 then). The name stays ``linux-7`` as sid moves from 7.2 to 7.3, so
  ``PYNVMF_GUEST_PEERS=linux-7`` keeps working; the exact versions are in the guest's
  assets (``GuestAssets.versions``), on the first line of its console log and in pytest's
  summary ("Linux peers booted"). A sid kernel 8.x fails the build with a message that asks
  for a peer of its own.

Each is built once and cached (guest_assets.py has what they share). ``Guest.run``,
``write_file``, ``read_file`` and the kernel target helpers behave the same on all; the
guest's ``/tmp`` is in RAM on all.

Typical use (``free_tcp_port``: tests.support.ports)::

    port = free_tcp_port()
    with Guest(hostfwd=[port], peer=LINUX_6_12) as guest:
        setup_kernel_target(guest, port=port, nqn="nqn.2014-08.org.example:t1")
        ...  # connect to 127.0.0.1:port from the test process
        guest.run(f"nvme discover -t tcp -a {guest.host_address} -s {other_port}")

The guest is 10.0.2.15 and reaches the machine's 127.0.0.1 as ``guest.host_address``
(10.0.2.2). Ports in ``hostfwd`` are forwarded from 127.0.0.1:P on the machine to P in the guest.

Running a test module on several peers: tests/interop/conftest.py has a module-scoped
fixture ``linux_peer`` parametrized over :data:`PEERS` (ids ``linux-6.1``, ``linux-6.12``,
``linux-7``). Make the module's guest fixture take it and pass it on; pytest then runs the
module's tests once per peer, booting each guest once::

    @pytest.fixture(scope="module")
    def guest(linux_peer: Peer) -> Iterator[Guest]:
        with Guest(peer=linux_peer) as g:
            yield g

A module-scoped fixture that does not depend on ``linux_peer`` (a pynvmf target process, say)
is shared by the peers' tests. Where the peers differ, branch on what the :class:`Peer`
says (``guest.peer.tls``, ``.cli_copy_formats_2_3``, ``.nvmet_reservations``...), not on
which peer it is, and assert what each must do.

Which peers a module runs on. Each peer a module runs on costs its guest boot and the
module's tests under TCG again (1-4 minutes a module on this 2-core machine), and `make
test` has to stay under 40 minutes. The rule: the newest peer (``linux-7``) runs every
module; an older peer runs a module where it behaves differently from the newest (a
:class:`Peer` field the module's tests branch on, or a status they expect), or where the
newest cannot stand for it:

- every peer: the harness's smoke tests (each peer is built differently);
- ``linux-6.1`` and ``linux-7`` (6.1's nvme-cli 2.3, busybox and kernel differ from 7 in
  Copy formats, Host Behavior Support, Write Zeroes, the reservation ioctls' statuses;
  these modules expect the same of 6.12 as of 7, the Peer fields they branch on being
  equal): ``test_linux_host.py``, ``test_linux_host_reservations.py``,
  ``test_linux_host_compare.py`` (nvme-cli's own compare and verify),
  ``test_linux_multipath.py`` (each kernel's multipath and ANA handling),
  ``test_linux_target.py``, ``test_linux_target_copy.py`` (6.1's nvmet against 7's),
  ``test_linux_discovery_referrals.py`` (nvme-cli follows referrals: 2.3's libnvme and
  2.16's) and ``test_linux_control_plane.py`` (namespaces that come, go, appear to one
  host and grow, seen by each kernel's rescan);
- ``linux-7`` alone (:data:`NEWEST`), for what the target does whatever the host's kernel,
  the host's part being what ``test_linux_host.py`` already checks on 6.1:
  ``test_linux_host_cores.py``, ``test_linux_host_rbd.py``,
  ``test_linux_multipath_rbd.py`` (Ceph-backed failover; the host's multipath is
  ``test_linux_multipath.py``'s), the fault modules and ``test_linux_record_replay.py``;
- ``linux-6.12`` and ``linux-7``: ``test_linux_auth.py`` and ``test_linux_tls.py`` (6.1
  has neither; 6.12's nvmet authenticates every queue, its nvme-cli derives TLS keys the
  "compat" way and its tlshd cannot do SHA-384 keys: ``Peer.nvmet_auth_admin_only``,
  ``.tls_compat_keys``, ``.tlshd_sha384``);
- the peers whose nvmet has reservations (``linux-7``):
  ``test_linux_target_reservations.py``;
- ``linux-7``, and ``linux-6.12`` under PYNVMF_GUEST_EVERY_PEER=1 (both images carry
  rdma-core and pyverbs: tests/support/guest_rdma.py): ``test_linux_rdma_smoke.py``
  (soft-RoCE, nvme-rdma against nvmet-rdma in one guest), ``test_linux_rdma_host.py``
  (the kernel's nvme-rdma host, and a host that breaks the rules, against pynvmf's
  target) and ``test_linux_rdma_host_library.py`` (pynvmf's host library against
  nvmet-rdma and pynvmf's target; docs/rdma.md);
- ``linux-6.1`` alone (the default peer): ``test_linux_nvmetcli.py`` (nvmetcli's
  configfs layout).

So 6.12 (Debian stable) drives I/O with fio verify in the DH-HMAC-CHAP and TLS modules,
and 7 stands for it in the others. ``PYNVMF_GUEST_EVERY_PEER=1`` runs every module on
every peer that can run it (6.12 on the host and kernel-target modules, ~1-4 minutes
each), for a change that may tell the peers apart.

A module states its peers with a :class:`PeerSet` of this module (:data:`OLDEST_AND_NEWEST`,
:data:`NEWEST`, :data:`SECURE_CHANNEL`, :data:`NVMET_RESERVATIONS`, :data:`EVERY_PEER`):
``pytestmark = OLDEST_AND_NEWEST.mark()`` parametrizes ``linux_peer`` over those of its peers
PYNVMF_GUEST_PEERS selects; ``.peers()`` gives the list for a module that parametrizes a
fixture of its own.

Environment variables:

- ``PYNVMF_GUEST_CACHE``: cache directory (default ``<repo>/.cache/guest``).
- ``PYNVMF_GUEST_PEERS``: comma-separated peer names ``linux_peer`` runs (default all) —
  for a quick local run; CI runs every peer (each module on the peers it names).
- ``PYNVMF_GUEST_EVERY_PEER=1``: each module also on the peers the rule above leaves out.
- ``PYNVMF_GUEST_DEFERRED``: ``MODULE:PEER`` pairs left out of this run (`make test`'s pure
  pass leaves the modules its compiled pass runs on linux-7: tests/interop/conftest.py).
- ``PYNVMF_GUEST_KVM=1``: try KVM first (with a short deadline), then fall back to TCG.
- ``PYNVMF_GUEST_KVM_CPU``: CPU model for the KVM attempt (default ``host``).
- ``PYNVMF_GUEST_BZIMAGE=1``: boot the compressed vmlinuz instead of the extracted vmlinux.
- ``PYNVMF_GUEST_BOOT_ATTEMPTS``: boots tried under TCG before giving up (default 3).
- ``PYNVMF_GUEST_KERNEL_PACKAGE``: kernel package of the 6.1 peer instead of what
  ``linux-image-amd64`` depends on; ``PYNVMF_GUEST_TRIXIE_KERNEL_PACKAGE`` the same for 6.12,
  ``PYNVMF_GUEST_SID_KERNEL_PACKAGE`` for 7.
- ``PYNVMF_GUEST_DEBIAN_MIRROR``: Debian archive the 6.12 and 7 peers are built from
  (default: the one the machine's apt uses); ``PYNVMF_GUEST_REFRESH=1`` refreshes trixie's
  and sid's package lists (otherwise weekly).
- ``PYNVMF_GUEST_VERBOSE=1``: copy the console and the command channel to stderr as they
  arrive.
"""

from __future__ import annotations

import atexit
import base64
import codecs
import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.support import guest_assets, guest_bookworm, guest_debootstrap
from tests.support.guest_assets import (
    COMMAND_PORT,
    GUEST_ADDRESS,
    HOST_ADDRESS,
    GuestAssets,
    GuestBootError,
    GuestCommandError,
    GuestError,
    GuestPrerequisiteError,
    GuestTimeoutError,
    build_overlay_cpio,
    cache_dir,
    log,
)

__all__ = [
    "EVERY_PEER",
    "LINUX_6_1",
    "LINUX_6_12",
    "LINUX_7",
    "NVMET_RESERVATIONS",
    "OLDEST_AND_NEWEST",
    "PEERS",
    "SECURE_CHANNEL",
    "CommandResult",
    "Guest",
    "GuestAssets",
    "GuestBootError",
    "GuestCommandError",
    "GuestError",
    "GuestPrerequisiteError",
    "GuestTimeoutError",
    "KernelTarget",
    "Peer",
    "PeerSet",
    "build_overlay_cpio",
    "cache_dir",
    "prepare_assets",
    "require_guest_prerequisites",
    "selected_peers",
    "setup_kernel_target",
    "teardown_kernel_target",
]

# Per-request bound on script + stdin: the guest stages both in its RAM-backed /tmp.
_MAX_REQUEST = 512 * 1024
# Files up to this size travel over the command channel; larger ones over the network.
_CHANNEL_TRANSFER_MAX = 64 * 1024


# --------------------------------------------------------------------------------------------
# Peers


@dataclasses.dataclass(frozen=True)
class Peer:
    """One kind of guest: a Debian release's kernel and tools, and what tests may expect of
    them. The exact versions are the build's (``GuestAssets.versions``)."""

    name: str
    debian: str
    # The kernel's version as far as the peer fixes it ("6.1", "6.12", "7"): the version the
    # build finds starts with it and a dot.
    kernel: str
    # The guest can do NVMe/TCP with TLS (kernel NVME_TCP_TLS, tlshd, nvme-cli --tls) and
    # DH-HMAC-CHAP (NVME_HOST_AUTH/NVME_TARGET_AUTH, nvme gen-dhchap-key).
    tls: bool
    dhchap: bool
    # nvme-cli builds Copy descriptor formats 2h/3h itself (`nvme copy --format 2|3
    # --snsids`, 2.13+); 2.3 knows formats 0 and 1 only.
    cli_copy_formats_2_3: bool
    # The kernel passes Set Features of Host Behavior Support (16h) from user space: 6.1
    # does; later kernels keep it to themselves (nvme_admin_cmd_allowed, EACCES).
    user_host_behavior: bool
    # The guest's tools are Debian's util-linux (blkdiscard -z...), not busybox's.
    util_linux: bool
    # nvmet implements Reservations (6.13+).
    nvmet_reservations: bool
    # nvmet asks for DH-HMAC-CHAP on the admin queue only (Connect's AUTHREQ is clear on the
    # I/O queues: 6.16+); 6.12 asks on every queue.
    nvmet_auth_admin_only: bool
    # The TLS PSKs nvme-cli derives and inserts use libnvme's "compat" label encoding
    # (libnvme 1.13, nvme-cli 2.13: the host library's tls_compat=True); sid's libnvme 1.16
    # derives them as the specification says.
    tls_compat_keys: bool
    # tlshd binds an NVMe0R02 (SHA-384) PSK with SHA-384 (ktls-utils 1.4); trixie's tlshd
    # 1.0 binds it with SHA-256, so no NVMe/TCP cipher suite fits.
    tlshd_sha384: bool
    # Host and nvmet do secure channel concatenation (TLS after DH-HMAC-CHAP, 6.15+).
    concat: bool
    prepare: Callable[[], GuestAssets] = dataclasses.field(repr=False, compare=False)
    require: Callable[[], None] = dataclasses.field(repr=False, compare=False)
    # A tar.gz of the guest's Debian python3-cryptography and python3-cffi-backend, for
    # running pynvmf itself in the guest (guest_debootstrap.python_bundle); None where the
    # guest has no Python (6.1).
    python_bundle: Callable[[], Path] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def __str__(self) -> str:
        return self.name


LINUX_6_1 = Peer(
    name=guest_bookworm.PEER,
    debian="12 (bookworm)",
    kernel="6.1",
    tls=False,
    dhchap=False,
    cli_copy_formats_2_3=False,
    user_host_behavior=True,
    util_linux=False,
    nvmet_reservations=False,
    nvmet_auth_admin_only=False,
    tls_compat_keys=False,
    tlshd_sha384=False,
    concat=False,
    prepare=guest_bookworm.prepare_assets,
    require=guest_bookworm.require_prerequisites,
)


def _debootstrapped(suite: guest_debootstrap.Suite, debian: str, **expect: bool) -> Peer:
    return Peer(
        name=suite.peer,
        debian=debian,
        kernel=suite.kernel,
        tls=True,
        dhchap=True,
        cli_copy_formats_2_3=True,
        user_host_behavior=False,
        util_linux=True,
        prepare=functools.partial(guest_debootstrap.prepare_assets, suite),
        require=functools.partial(guest_debootstrap.require_prerequisites, suite),
        python_bundle=functools.partial(guest_debootstrap.python_bundle, suite),
        **expect,
    )


LINUX_6_12 = _debootstrapped(
    guest_debootstrap.TRIXIE,
    "13 (trixie)",
    nvmet_reservations=False,
    nvmet_auth_admin_only=False,
    tls_compat_keys=True,
    tlshd_sha384=False,
    concat=False,
)
LINUX_7 = _debootstrapped(
    guest_debootstrap.SID,
    "unstable (sid)",
    nvmet_reservations=True,
    nvmet_auth_admin_only=True,
    tls_compat_keys=False,
    tlshd_sha384=True,
    concat=True,
)
PEERS: dict[str, Peer] = {p.name: p for p in (LINUX_6_1, LINUX_6_12, LINUX_7)}

# Debian packages named in a peer's description (describe_peer), when the guest has them.
_DESCRIBED = (
    "nvme-cli",
    "libnvme1t64",
    "libnvme1",
    "fio",
    "ktls-utils",
    "python3",
    # NVMe/RDMA's (tests/support/guest_rdma.py).
    "rdma-core",
    "python3-pyverbs",
)


def describe_peer(assets: GuestAssets) -> str:
    """One line naming what a peer's guest runs, from what its build recorded."""
    versions = assets.versions
    kernel = versions.get(assets.kernel_package)
    parts = [
        f"{assets.peer}: kernel {assets.kernel_version}"
        + (f" ({assets.kernel_package} {kernel})" if kernel else "")
    ]
    parts += [f"{name} {versions[name]}" for name in _DESCRIBED if name in versions]
    return ", ".join(parts)


# describe_peer() of every peer booted in this process, for pytest's summary.
BOOTED: dict[str, str] = {}


def _peer(peer: Peer | str) -> Peer:
    if isinstance(peer, Peer):
        return peer
    try:
        return PEERS[peer]
    except KeyError:
        raise ValueError(f"unknown guest peer {peer!r}; known: {', '.join(PEERS)}") from None


def selected_peers() -> list[Peer]:
    """The peers ``linux_peer`` runs: all, or those PYNVMF_GUEST_PEERS names."""
    env = os.environ.get("PYNVMF_GUEST_PEERS", "").strip()
    if not env:
        return list(PEERS.values())
    return [_peer(name.strip()) for name in env.split(",") if name.strip()]


@dataclasses.dataclass(frozen=True)
class PeerSet:
    """The peers a group of test modules runs on (the rule in this module's docstring), and
    the ``others`` that can run them too, which PYNVMF_GUEST_EVERY_PEER=1 adds."""

    chosen: tuple[Peer, ...]
    others: tuple[Peer, ...] = ()

    def peers(self) -> list[Peer]:
        """Those of them PYNVMF_GUEST_PEERS selects."""
        wanted = set(self.chosen)
        if os.environ.get("PYNVMF_GUEST_EVERY_PEER") == "1":
            wanted.update(self.others)
        return [p for p in selected_peers() if p in wanted]

    def params(self) -> list[Any]:
        """``pytest.param`` per peer, with the peer's name as the test id."""
        import pytest

        return [pytest.param(p, id=p.name) for p in self.peers()]

    def mark(self) -> Any:
        """A module's ``pytestmark`` that runs its ``linux_peer`` tests on these peers."""
        import pytest

        return pytest.mark.parametrize("linux_peer", self.params(), indirect=True, scope="module")


EVERY_PEER = PeerSet(tuple(PEERS.values()))
# 6.1 differs from 7 in the host modules' checks; 6.12 does not (the rule, above).
OLDEST_AND_NEWEST = PeerSet((LINUX_6_1, LINUX_7), others=(LINUX_6_12,))
# What the target does whatever the host's kernel (faults, RBD, Compare, workers, replay).
NEWEST = PeerSet((LINUX_7,), others=(LINUX_6_1, LINUX_6_12))
# DH-HMAC-CHAP and TLS: 6.1 has neither.
SECURE_CHANNEL = PeerSet(tuple(p for p in PEERS.values() if p.tls and p.dhchap))
NVMET_RESERVATIONS = PeerSet(tuple(p for p in PEERS.values() if p.nvmet_reservations))
CONCATENATION = PeerSet(tuple(p for p in PEERS.values() if p.concat))


# --------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class CommandResult:
    rc: int
    output: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclasses.dataclass(frozen=True)
class KernelTarget:
    nqn: str
    port: int
    port_id: int
    device: str
    # configfs directory of the null_blk device created for this target, if any.
    nullb: str | None


# --------------------------------------------------------------------------------------------
# Prerequisites and assets


def require_guest_prerequisites(peer: Peer | str | None = None) -> None:
    """Raise GuestPrerequisiteError naming every missing tool of ``peer`` (default: every
    peer's); the tests must not skip."""
    peers = [_peer(peer)] if peer is not None else list(PEERS.values())
    for p in peers:
        p.require()


def prepare_assets(peer: Peer | str = LINUX_6_1) -> GuestAssets:
    """Build (once, cached) and return what ``peer``'s guest boots."""
    return _peer(peer).prepare()


# --------------------------------------------------------------------------------------------
# The guest


_LIVE_GUESTS: weakref.WeakSet[Guest] = weakref.WeakSet()


@atexit.register
def _kill_leftover_guests() -> None:
    for guest in list(_LIVE_GUESTS):
        guest.kill()


class Guest:
    """A QEMU VM running Debian's kernel, driven through a command server on virtio-serial.

    ``peer`` chooses the kernel and tools (:data:`LINUX_6_1` by default, :data:`LINUX_6_12`
    or :data:`LINUX_7`; a name works too).
    """

    host_address: str = HOST_ADDRESS
    guest_address: str = GUEST_ADDRESS

    def __init__(
        self,
        *,
        hostfwd: Sequence[int] = (),
        memory_mb: int = 1024,
        boot_timeout: float = 180,
        smp: int = 2,
        extra_files: Mapping[str, bytes | str | Path] | None = None,
        kernel_args: Sequence[str] = (),
        console_log: str | os.PathLike[str] | None = None,
        peer: Peer | str = LINUX_6_1,
    ) -> None:
        self.peer: Peer = _peer(peer)
        self.hostfwd: tuple[int, ...] = tuple(int(p) for p in hostfwd)
        self.memory_mb = memory_mb
        self.boot_timeout = boot_timeout
        self.smp = smp
        self.extra_files = dict(extra_files or {})
        self.kernel_args = tuple(kernel_args)
        if console_log is None:
            fd, name = tempfile.mkstemp(prefix="pynvmf-guest-", suffix=".log")
            os.close(fd)
            console_log = name
        self.console_log: Path = Path(console_log)
        self.assets: GuestAssets | None = None
        self.accel: str | None = None
        self.boot_seconds: float | None = None
        # One line per boot that failed before the command server was ready.
        self.failed_boots: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._channel: socket.socket | None = None
        self._log_lock = threading.Lock()
        self._log_file: IO[bytes] | None = None
        self._cond = threading.Condition()
        self._pending = ""
        self._eof = False
        self._seq = 0
        self._token = ""
        self._run_lock = threading.Lock()
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Guest:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Boot the VM and wait until its command server is ready.

        A boot that dies or hangs before the command server is ready (the 6.12 kernel oopses
        in about 1 boot of 25 under TCG) is retried, up to PYNVMF_GUEST_BOOT_ATTEMPTS times;
        then GuestBootError names every attempt's reason.
        """
        if self._proc is not None:
            raise GuestError("guest already started")
        self.peer.require()
        self.assets = self.peer.prepare()
        initrd = self.assets.initramfs
        if self.extra_files:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="pynvmf-guest-")
            tmp = Path(self._tmpdir.name)
            build_overlay_cpio(
                self.extra_files, tmp / "extra.cpio.gz", prefix=self.assets.overlay_prefix
            )
            initrd = tmp / "initrd.cpio.gz"
            # The kernel unpacks concatenated archives in order, later files winning.
            with open(initrd, "wb") as out:
                for part in (self.assets.initramfs, tmp / "extra.cpio.gz"):
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="pynvmf-guest-")
        self._log_file = open(self.console_log, "ab")  # noqa: SIM115 - closed in stop()
        # Which kernel and tools ran, first thing in the log (linux-7's move with sid).
        description = describe_peer(self.assets)
        BOOTED[self.peer.name] = description
        log.info("booting %s", description)
        self._log_raw(f"### {description}\n".encode())
        attempts: list[tuple[str, float]] = []
        if os.environ.get("PYNVMF_GUEST_KVM") == "1" and os.path.exists("/dev/kvm"):
            # KVM is known not to run the stock kernel on some hosts: give it a short leash.
            attempts.append(("kvm", min(self.boot_timeout, 30.0)))
        tcg_attempts = max(1, int(os.environ.get("PYNVMF_GUEST_BOOT_ATTEMPTS", "3")))
        attempts += [("tcg", self.boot_timeout)] * tcg_attempts
        errors: list[str] = []
        for n, (accel, deadline) in enumerate(attempts, 1):
            try:
                self._boot(accel, initrd, deadline)
                return
            except GuestError as exc:
                self._teardown(graceful=False)
                reason = f"attempt {n}/{len(attempts)} [{accel}]: {exc}"
                errors.append(reason)
                self.failed_boots.append(reason.splitlines()[0])
                log.warning("%s guest boot %s", self.peer.name, reason)
        self._cleanup_files()
        raise GuestBootError(
            f"the {self.peer.name} guest failed to boot {len(attempts)} times, giving up"
            f" (console log: {self.console_log}):\n" + "\n".join(errors)
        )

    def _qemu_command(self, accel: str, initrd: Path, channel: Path) -> list[str]:
        assert self.assets is not None
        netdev = "user,id=n0" + "".join(f",hostfwd=tcp:127.0.0.1:{p}-:{p}" for p in self.hostfwd)
        cpu = os.environ.get("PYNVMF_GUEST_KVM_CPU", "host") if accel == "kvm" else "max"
        append = " ".join(
            [
                "console=ttyS0",
                "loglevel=1",
                "quiet",
                "panic=-1",
                # An oops before the command server is up ends the boot at once (panic=-1,
                # -no-reboot), so start() retries it instead of waiting for its deadline.
                "oops=panic",
                # No need for the mitigations' cost in a throwaway VM (TCG is slow enough).
                "mitigations=off",
                "8250.nr_uarts=1",
                f"pynvmf_token={self._token}",
                *self.kernel_args,
            ]
        )
        return [
            guest_assets.tool("qemu-system-x86_64"),
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-smp",
            str(self.smp),
            "-m",
            str(self.memory_mb),
            "-no-reboot",
            "-kernel",
            str(self.assets.kernel),
            "-initrd",
            str(initrd),
            "-append",
            append,
            "-chardev",
            "stdio,id=con0,signal=off",
            "-serial",
            "chardev:con0",
            # QEMU connects to the harness's socket before the guest runs, so the port's host
            # side is connected by the time the guest first reads it (else it reads EOF).
            "-chardev",
            f"socket,id=cmd0,path={channel}",
            "-device",
            "virtio-serial-pci,id=vser0",
            "-device",
            f"virtserialport,bus=vser0.0,chardev=cmd0,name={COMMAND_PORT}",
            "-netdev",
            netdev,
            "-device",
            "virtio-net-pci,netdev=n0",
            *self._disk_args(),
        ]

    def _disk_args(self) -> list[str]:
        assert self.assets is not None
        if self.assets.root_disk is None:
            return []
        # snapshot=on: the guest's writes go to a temporary overlay QEMU deletes at exit, so
        # guests share the cached image (cache=unsafe: the overlay need not survive a crash).
        drive = f"file={self.assets.root_disk},format=raw,if=none,id=root0,snapshot=on"
        return ["-drive", drive + ",cache=unsafe", "-device", "virtio-blk-pci,drive=root0"]

    def _boot(self, accel: str, initrd: Path, timeout: float) -> None:
        self._token = secrets.token_hex(6)
        self._pending = ""
        self._eof = False
        self._seq = 0
        assert self._tmpdir is not None
        channel_path = Path(self._tmpdir.name) / f"cmd-{self._token}.sock"
        cmd = self._qemu_command(accel, initrd, channel_path)
        self._log_raw(f"\n### {shlex.join(cmd)}\n".encode())
        started = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(channel_path))
            listener.listen(1)
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            _LIVE_GUESTS.add(self)
            assert self._proc.stdout is not None
            console = self._proc.stdout
            self._start_reader("console", lambda: os.read(console.fileno(), 65536), False)
            self._channel = self._accept_channel(listener, started + timeout)
        channel = self._channel
        self._start_reader("channel", lambda: channel.recv(65536), True)
        ready = re.compile(rf"__PYNVMF_READY_{self._token}__\r?\n")
        deadline = started + timeout
        with self._cond:
            while True:
                match = ready.search(self._pending)
                if match is not None:
                    self._pending = self._pending[match.end() :]
                    break
                if self._eof:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=5)
                    raise GuestError(
                        f"QEMU exited during boot (status {self._proc.returncode}):\n"
                        + self.console_tail()
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GuestTimeoutError(
                        f"guest not ready within {timeout:.0f} s:\n" + self.console_tail()
                    )
                self._cond.wait(remaining)
        self.accel = accel
        self.boot_seconds = time.monotonic() - started
        log.info("guest booted with %s in %.1f s", accel, self.boot_seconds)

    def _accept_channel(self, listener: socket.socket, deadline: float) -> socket.socket:
        """The command channel: QEMU connects at start-up, before the guest runs."""
        assert self._proc is not None
        listener.settimeout(0.5)
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if self._proc.poll() is not None:
                    raise GuestError(
                        f"QEMU exited during start-up (status {self._proc.returncode}):\n"
                        + self.console_tail()
                    ) from None
                if time.monotonic() > deadline:
                    raise GuestTimeoutError(
                        "QEMU never connected its command channel:\n" + self.console_tail()
                    ) from None
                continue
            conn.settimeout(None)
            return conn

    def _log_raw(self, data: bytes) -> None:
        with self._log_lock:
            if self._log_file is not None:
                self._log_file.write(data)
                self._log_file.flush()

    def _start_reader(self, name: str, read: Callable[[], bytes], commands: bool) -> None:
        thread = threading.Thread(
            target=self._read_stream,
            args=(read, commands),
            name=f"pynvmf-guest-{name}",
            daemon=True,
        )
        self._readers.append(thread)
        thread.start()

    def _read_stream(self, read: Callable[[], bytes], commands: bool) -> None:
        """Copy the console or the command channel into the log; the channel's text also
        feeds the command parser. Either ending means QEMU is gone (or going)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        verbose = os.environ.get("PYNVMF_GUEST_VERBOSE") == "1"
        try:
            while True:
                try:
                    data = read()
                except OSError:
                    break
                if not data:
                    break
                with contextlib.suppress(ValueError, OSError):
                    self._log_raw(data)
                if verbose:
                    sys.stderr.buffer.write(data)
                    sys.stderr.flush()
                if commands:
                    text = decoder.decode(data)
                    with self._cond:
                        self._pending += text
                        self._cond.notify_all()
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def stop(self) -> None:
        """Power the guest off (killing QEMU if it does not comply). Always safe to call."""
        self._teardown(graceful=True)
        self._cleanup_files()

    def kill(self) -> None:
        """Kill QEMU at once."""
        self._teardown(graceful=False)
        self._cleanup_files()

    def _teardown(self, *, graceful: bool) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None and graceful:
                with contextlib.suppress(OSError, ValueError, GuestError):
                    self._send("poweroff -f", 10)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            # QEMU is gone, so the readers see EOF; join them before closing what they read.
            for thread in self._readers:
                thread.join(timeout=5)
            self._readers = []
            with contextlib.suppress(OSError, ValueError):
                if proc.stdout is not None:
                    proc.stdout.close()
            if self._channel is not None:
                with contextlib.suppress(OSError):
                    self._channel.close()
                self._channel = None
            self._proc = None
            _LIVE_GUESTS.discard(self)

    def _cleanup_files(self) -> None:
        with self._log_lock:
            if self._log_file is not None:
                with contextlib.suppress(OSError):
                    self._log_file.close()
                self._log_file = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # -- console -----------------------------------------------------------------------------

    def console_text(self) -> str:
        """The whole log of this guest so far: kernel console and command channel."""
        try:
            return self.console_log.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def console_tail(self, lines: int = 40) -> str:
        tail = self.console_text().splitlines()[-lines:]
        return f"--- last {len(tail)} console lines ({self.console_log}) ---\n" + "\n".join(tail)

    # -- commands ----------------------------------------------------------------------------

    def _send(self, cmd: str, timeout: float, stdin: bytes = b"") -> int:
        channel = self._channel
        if self._proc is None or channel is None:
            raise GuestError("guest is not running")
        script = cmd.encode()
        if len(script) + len(stdin) > _MAX_REQUEST:
            # The guest's tty buffers a bounded backlog; bulk data goes through write_file.
            raise ValueError(
                f"request of {len(script) + len(stdin)} bytes exceeds {_MAX_REQUEST};"
                " use write_file() or extra_files for bulk data"
            )
        self._seq += 1
        header = f"{self._seq} {max(1, math.ceil(timeout))} {len(script)} {len(stdin)}\n"
        try:
            channel.sendall(header.encode() + script + stdin)
        except OSError as exc:
            raise GuestError(f"QEMU is gone: {exc}\n" + self.console_tail()) from exc
        return self._seq

    def run(
        self,
        cmd: str,
        timeout: float = 120,
        check: bool = True,
        *,
        input: bytes | str | None = None,
    ) -> CommandResult:
        """Run a shell command line (any shell script) in the guest, in a fresh ``sh``.

        ``input`` is the command's stdin (default /dev/null), at most 512 KiB with the
        script (ValueError beyond); bulk data goes through write_file(). The output is
        stdout and stderr interleaved as the guest wrote them (byte for byte: the channel
        is not a tty, so no CR is added). State such as the working directory or variables
        does not carry over between calls; files and background processes do. On timeout
        the guest kills the command's shell (not its children) and stays usable;
        GuestTimeoutError is raised.
        """
        stdin = input.encode() if isinstance(input, str) else (input or b"")
        with self._run_lock:
            if not self.running:
                raise GuestError("guest is not running\n" + self.console_tail())
            started = time.monotonic()
            seq = self._send(cmd, timeout, stdin)
            # The guest kills the command at `timeout`; the grace covers a slow (TCG) guest
            # reporting that, beyond it the guest is considered wedged.
            deadline = started + timeout + 30
            end = re.compile(rf"\r?\n__PYNVMF_END_{self._token}_(\d+)_(\d+)__\r?\n")
            with self._cond:
                while True:
                    match = end.search(self._pending)
                    if match is not None:
                        output = self._pending[: match.start()]
                        self._pending = self._pending[match.end() :]
                        if int(match.group(1)) < seq:
                            continue  # the late end of a command that timed out earlier
                        rc = int(match.group(2))
                        break
                    if self._eof:
                        raise GuestError(
                            f"QEMU exited while running {cmd!r}:\n" + self.console_tail()
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise GuestTimeoutError(
                            f"guest command {cmd!r} gave no answer within {timeout + 30:.0f} s"
                            " (guest wedged?):\n" + self.console_tail()
                        )
                    self._cond.wait(remaining)
        if rc == 137 and time.monotonic() - started >= timeout:
            raise GuestTimeoutError(
                f"guest command {cmd!r} timed out after {timeout} s and was killed;"
                f" output so far:\n{output}\n" + self.console_tail()
            )
        if check and rc != 0:
            raise GuestCommandError(cmd, rc, output)
        return CommandResult(rc, output)

    def write_file(
        self, path: str, data: bytes | str, mode: int = 0o644, timeout: float = 120
    ) -> None:
        """Create a file in the guest (bulk data travels over the network, not the console)."""
        raw = data.encode() if isinstance(data, str) else data
        q = shlex.quote(path)
        if len(raw) <= _CHANNEL_TRANSFER_MAX:
            self.run(f"cat > {q} && chmod {mode:o} {q}", timeout=timeout, input=raw)
            return
        # Each request is staged whole in the guest's /tmp and base64 doubles reads; user-mode
        # networking streams bulk data at tens of MB/s.
        self._transfer(
            f"nc {self.host_address} {{port}} > {q} && chmod {mode:o} {q}"
            f' && test "$(stat -c %s {q})" = {len(raw)}',
            send=raw,
            timeout=timeout,
        )

    def read_file(self, path: str, timeout: float = 120) -> bytes:
        q = shlex.quote(path)
        size = int(self.run(f"stat -L -c %s {q}").output.strip())
        if size <= _CHANNEL_TRANSFER_MAX:
            out = self.run(f"base64 {q}", timeout=timeout).output
            return base64.b64decode("".join(out.split()))
        data = self._transfer(f"nc {self.host_address} {{port}} < {q}", send=None, timeout=timeout)
        if len(data) != size:
            raise GuestError(f"read {len(data)} bytes of {path}, expected {size}")
        return data

    def _transfer(self, cmd: str, *, send: bytes | None, timeout: float) -> bytes:
        """Run ``cmd`` (with ``{port}``) while a one-shot server on the machine's 127.0.0.1
        sends ``send`` to the guest's connection, or collects what the guest sends."""
        received: list[bytes] = []
        errors: list[OSError] = []
        with socket.create_server(("127.0.0.1", 0)) as srv:
            srv.settimeout(timeout)
            port = int(srv.getsockname()[1])

            def serve() -> None:
                try:
                    conn, _ = srv.accept()
                    with conn:
                        conn.settimeout(timeout)
                        if send is not None:
                            conn.sendall(send)
                            return
                        chunks = []
                        while chunk := conn.recv(1 << 20):
                            chunks.append(chunk)
                        received.append(b"".join(chunks))
                except OSError as exc:
                    errors.append(exc)

            thread = threading.Thread(target=serve, name="pynvmf-guest-transfer", daemon=True)
            thread.start()
            try:
                self.run(cmd.format(port=port), timeout=timeout)
            finally:
                # Wakes a still-pending accept() when the guest never connected.
                with contextlib.suppress(OSError):
                    srv.shutdown(socket.SHUT_RDWR)
                thread.join(timeout)
        if errors:
            raise GuestError(f"transfer for {cmd!r} failed: {errors[0]}")
        return received[0] if received else b""


# --------------------------------------------------------------------------------------------
# The kernel's NVMe/TCP target (nvmet) inside the guest

_NVMET = "/sys/kernel/config/nvmet"


def _nullb_name(nqn: str, nsid: int) -> str:
    return "nullb-" + hashlib.sha1(f"{nqn}/{nsid}".encode()).hexdigest()[:10]


def setup_kernel_target(
    guest: Guest,
    *,
    port: int,
    nqn: str,
    size_mb: int = 256,
    block_size: int = 512,
    traddr: str = "0.0.0.0",
    device: str | None = None,
    nsid: int = 1,
    inline_data_size: int | None = None,
    reservations: bool = False,
    trtype: str = "tcp",
) -> KernelTarget:
    """Export a namespace through the guest kernel's nvmet-tcp on ``traddr:port`` (or
    nvmet-rdma with ``trtype="rdma"``, on a soft-RoCE link the caller has added: see
    tests/support/guest_rdma.py).

    Without ``device``, a memory-backed null_blk device of ``size_mb`` MiB and ``block_size``
    byte logical blocks backs the namespace (data written is read back). Any host may
    connect. Several targets may share a port (``inline_data_size`` only applies when this
    call creates the port). ``reservations`` enables the namespace's reservations (nvmet
    6.13+, ``Peer.nvmet_reservations``). Listening starts before this returns, so a host may
    connect (through ``hostfwd`` from the machine) right away. Returns where things ended up.
    """
    if block_size not in (512, 1024, 2048, 4096):
        raise ValueError(f"unsupported block size {block_size}")
    nullb = None
    if trtype not in ("tcp", "rdma"):
        raise ValueError(f"unsupported transport type {trtype!r}")
    script = ["set -e", "modprobe nvmet", f"modprobe nvmet-{trtype}"]
    if device is None:
        nullb = f"/sys/kernel/config/nullb/{_nullb_name(nqn, nsid)}"
        script += [
            "[ -d /sys/kernel/config/nullb ] || modprobe null_blk nr_devices=0",
            f"B={nullb}",
            'mkdir "$B"',
            f'echo {size_mb} > "$B/size"',
            f'echo {block_size} > "$B/blocksize"',
            'echo 1 > "$B/memory_backed"',
            'echo 1 > "$B/discard" 2>/dev/null || true',
            'echo 1 > "$B/power"',
            # 6.1 names the disk after the configfs item; older kernels use nullb<index>.
            "DEV=/dev/${B##*/}",
            '[ -b "$DEV" ] || DEV=/dev/nullb$(cat "$B/index")',
        ]
    else:
        script.append(f"DEV={shlex.quote(device)}")
    s = f"{_NVMET}/subsystems/{nqn}"
    ns = f"{s}/namespaces/{nsid}"
    link = shlex.quote(nqn)
    script += [
        '[ -b "$DEV" ] || { echo "no block device $DEV"; exit 1; }',
        f"S={shlex.quote(s)}",
        f"NS={shlex.quote(ns)}",
        '[ -d "$S" ] || mkdir "$S"',
        'echo 1 > "$S/attr_allow_any_host"',
        'mkdir "$NS"',
        'printf %s "$DEV" > "$NS/device_path"',
        # Only a disabled namespace takes it.
        *(['echo 1 > "$NS/resv_enable"'] if reservations else []),
        'echo 1 > "$NS/enable"',
        # Reuse a port already listening on the same address, else take the next free id.
        "P=",
        "max=0",
        f"for p in {_NVMET}/ports/*; do",
        '  [ -d "$p" ] || continue',
        '  id=${p##*/}; [ "$id" -gt "$max" ] && max=$id',
        f'  if [ "$(cat $p/addr_trsvcid)" = {port} ] && [ "$(cat $p/addr_traddr)" = {traddr} ]'
        f' && [ "$(cat $p/addr_trtype)" = {trtype} ]; then P=$p; fi',
        "done",
        'if [ -z "$P" ]; then',
        f"  P={_NVMET}/ports/$((max + 1))",
        '  mkdir "$P"',
        f'  echo {trtype} > "$P/addr_trtype"',
        '  echo ipv4 > "$P/addr_adrfam"',
        f'  echo {traddr} > "$P/addr_traddr"',
        f'  echo {port} > "$P/addr_trsvcid"',
    ]
    if inline_data_size is not None:
        script.append(f'  echo {inline_data_size} > "$P/param_inline_data_size"')
    script += [
        "fi",
        f'[ -e "$P/subsystems/"{link} ] || ln -s "$S" "$P/subsystems/"{link}',
        'echo "DEV=$DEV"',
        'echo "PORT=${P##*/}"',
    ]
    out = guest.run("\n".join(script) + "\n").output
    values = dict(re.findall(r"^(DEV|PORT)=(\S+)$", out, re.MULTILINE))
    if "DEV" not in values or "PORT" not in values:
        raise GuestError(f"unexpected output from the nvmet setup:\n{out}")
    return KernelTarget(
        nqn=nqn, port=port, port_id=int(values["PORT"]), device=values["DEV"], nullb=nullb
    )


def teardown_kernel_target(guest: Guest, target: KernelTarget) -> None:
    """Undo setup_kernel_target: unexport the subsystem, drop empty ports, free the device."""
    s = f"{_NVMET}/subsystems/{target.nqn}"
    link = shlex.quote(target.nqn)
    script = [
        f"S={shlex.quote(s)}",
        f"for p in {_NVMET}/ports/*; do",
        f'  [ -L "$p/subsystems/"{link} ] && rm "$p/subsystems/"{link}',
        '  if [ -d "$p" ] && [ -z "$(ls "$p/subsystems")" ] && [ -z "$(ls "$p/referrals")" ];'
        ' then rmdir "$p"; fi',
        "done",
        'for ns in "$S"/namespaces/*; do',
        '  [ -d "$ns" ] || continue',
        '  echo 0 > "$ns/enable"; rmdir "$ns"',
        "done",
        '[ -d "$S" ] && rmdir "$S"',
    ]
    if target.nullb is not None:
        script += [
            f"B={target.nullb}",
            'if [ -d "$B" ]; then echo 0 > "$B/power"; rmdir "$B"; fi',
        ]
    script.append("true")
    guest.run("\n".join(script) + "\n")
