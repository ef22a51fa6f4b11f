"""The peers booted from a Debian suite's own root filesystem: Linux 6.12 (Debian 13,
trixie) and the newest Linux (Debian unstable, sid: 7.x).

A suite's programs need its C library, so they cannot be copied into an initramfs from the
machine (bookworm) as the 6.1 peer's are. Instead, for each :class:`Suite`:

- ``debootstrap --variant=minbase SUITE`` builds a root filesystem with nvme-cli, fio,
  ktls-utils (tlshd), keyutils, kmod, util-linux, xfsprogs, e2fsprogs, iproute2 and busybox
  (for ``nc``), and the whole module tree of the suite's ``linux-image-amd64`` (nvme-auth,
  nvme-keyring and tls among them: DH-HMAC-CHAP and TLS load what they need on demand).
  ``mkfs.ext4 -d`` writes it to a raw ext4 image (no loop mount). QEMU opens the image with
  ``snapshot=on``: the guest may write to it, the image never changes.
  (python3-cryptography is not among them: debootstrap failed to configure it when tried
  on trixie (2026-12); `python_bundle` fetches it and python3-cffi-backend for tests that
  run pynvmf in the guest with the suite's Python.)
- The kernel package is what the suite's ``linux-image-amd64`` depends on, with the
  packages it is split into where it is (sid's 7.x: ``linux-base-V``, ``linux-binary-V``,
  ``linux-modules-V``, all under ``usr/lib/modules/V``; guest_assets.kernel_parts).
- A small busybox (the machine's busybox-static) stage-1 initramfs loads virtio_blk and
  ext4, mounts the image, copies the guest scripts (and Guest(extra_files=...), which
  travel under ``/overlay`` in the initramfs) over it and switches root to the same init and
  command server the 6.1 guest runs. Linux 7.x has CRC32C in its library (no
  crc32c_generic module): stage 1 loads that module where the kernel has it.
- The kernel boots as the PVH ``vmlinux`` inside the vmlinuz (zstd-compressed in trixie and
  sid).

A suite's package lists live under ``<cache>/<suite>/apt`` and apt-get runs with options
that point it there (sources, lists, cache, status), so the machine's own apt configuration
never sees the suite. The mirror is the one the machine's apt uses for Debian (``apt-get
indextargets``), or ``PYNVMF_GUEST_DEBIAN_MIRROR``. The lists are refreshed when older than
a week (or with ``PYNVMF_GUEST_REFRESH=1``); a new kernel in them rebuilds the image. sid
moves: the lists a week old may name a kernel the archive has dropped, which refreshes them.

Cache (``<cache>/<suite>``): ``kernel/<package>`` (the unpacked kernel), ``debs/``
(debootstrap's downloads, reused by a rebuild), ``rootfs-<kver>-<key>.ext4`` (key: suite,
mirror, packages, kernel package and the text of the functions that build it) with
``rootfs-<kver>-<key>.json`` (the version of every package in it), and
``stage1-<kver>-<key>.cpio.gz`` (key: its builder's text and the scripts). Building the
root filesystem needs root (debootstrap, chroot); booting a built one does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import lzma
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support import guest_assets as A
from tests.support.guest_assets import GuestAssets, GuestError, GuestPrerequisiteError, log


@dataclasses.dataclass(frozen=True)
class Suite:
    """A Debian suite a peer is built from."""

    # The peer's name (tests/support/guest.py's PEERS, PYNVMF_GUEST_PEERS).
    peer: str
    # debootstrap's and the archive's name for the suite.
    name: str
    # What the kernel's version must start with (and a "."): the peer is named after it, so
    # a suite whose linux-image-amd64 moved past it fails the build rather than mislabel it.
    kernel: str

    @property
    def kernel_package_variable(self) -> str:
        """Environment variable that names the kernel package instead of the one the suite's
        ``linux-image-amd64`` depends on."""
        return f"PYNVMF_GUEST_{self.name.upper()}_KERNEL_PACKAGE"


TRIXIE = Suite(peer="linux-6.12", name="trixie", kernel="6.12")
# Debian unstable: whatever 7.x its linux-image-amd64 is (7.2.13 on 2026-12-03); the peer's
# name stays linux-7 as the minor moves, and the run prints the exact version.
SID = Suite(peer="linux-7", name="sid", kernel="7")
SUITES: tuple[Suite, ...] = (TRIXIE, SID)

# NVMe/RDMA over soft-RoCE (tests/support/guest_rdma.py); the kernel's modules are in the
# module tree every image carries.
RDMA_PACKAGES: tuple[str, ...] = (
    "rdma-core",  # udev rules, rdma-ndd, the rdma_rxe module options
    "ibverbs-providers",  # librxe: user-space verbs on a soft-RoCE device
    "ibverbs-utils",  # ibv_devices, ibv_devinfo: what the device offers
    "python3-pyverbs",  # rdma-core's Python bindings, for pynvmf on the guest's Python
)

# Installed by debootstrap (with their dependencies) into the minbase system.
PACKAGES: tuple[str, ...] = (
    "nvme-cli",
    "fio",
    "ktls-utils",
    "keyutils",
    "kmod",
    "util-linux",
    "mount",
    "xfsprogs",
    "e2fsprogs",
    "iproute2",
    # nc (write_file/read_file move bulk data over the network) and poweroff: minbase has
    # neither an init system nor a netcat.
    "busybox",
    # One image per suite: the image opens snapshot=on, so its size costs no boot time.
    *RDMA_PACKAGES,
)

# Tools this peer needs on the machine besides guest_assets.REQUIRED_TOOLS.
TOOLS: dict[str, str] = {
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "zstd": "zstd",
    "chroot": "coreutils",
}
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

# Stage 1 loads these (with their modules.dep closure) to mount the root filesystem; True
# when the build must fail if the kernel has neither the module nor a builtin.
STAGE1_MODULES: dict[str, bool] = {
    # ext4's checksums ask the crypto API for crc32c on 6.12, which stage 1 cannot modprobe;
    # 7.x has no such module (CRC32C is a library function ext4 calls directly).
    "crc32c_generic": False,
    "crc32c_intel": False,
    "virtio_pci": True,
    "virtio_blk": True,
    "ext4": True,
}

LISTS_MAX_AGE = 7 * 24 * 3600
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Left free in the root filesystem for what tests write outside /tmp (a tmpfs).
ROOTFS_FREE_MIB = 512

_STAGE2_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
_STAGE2_INIT = "/usr/lib/pynvmf/init"

_STAGE1_SCRIPT = r"""#!/bin/sh
# Stage 1 of a pynvmf guest booted from a Debian suite's root filesystem (generated by
# tests/support/guest_debootstrap.py):
# mount the root filesystem from the virtio disk and switch to it.
export PATH=/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
dmesg -n 1
for m in @MODULES@; do
    insmod "/lib/modules/$m.ko" || echo "pynvmf-stage1: insmod $m failed"
done
i=0
while [ ! -b /dev/vda ] && [ "$i" -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
if ! mount -t ext4 -o noatime /dev/vda /newroot; then
    echo "pynvmf-stage1: cannot mount the root filesystem on /dev/vda"
    exec poweroff -f
fi
mkdir -p /newroot/usr/lib/pynvmf
cp /pynvmf/init /pynvmf/serve /newroot/usr/lib/pynvmf/
# Files a test added with Guest(extra_files=...).
if [ -d /overlay ]; then cp -a /overlay/. /newroot/; fi
umount /proc /sys /dev
exec switch_root /newroot @STAGE2_INIT@
"""


def require_prerequisites(suite: Suite) -> None:
    A.require_tools({**A.REQUIRED_TOOLS, **TOOLS}, f"the {suite.peer} guest ({suite.name})")
    if not KEYRING.exists():
        raise GuestPrerequisiteError(
            f"{KEYRING} (Debian package debian-archive-keyring) is missing:"
            f" run {A.INSTALL_SCRIPT} as root"
        )


# --------------------------------------------------------------------------------------------
# A suite's package lists, kept apart from the machine's apt configuration


def _stamp(paths: Sequence[Path]) -> int:
    """Newest modification time among ``paths`` (and the entries of those that are folders)."""
    newest = 0
    for path in paths:
        with contextlib.suppress(OSError):
            newest = max(newest, path.stat().st_mtime_ns)
            if path.is_dir():
                newest = max([newest, *(p.stat().st_mtime_ns for p in path.iterdir())])
    return newest


def _memo(memo: Path, key: str, stamp: int, compute: Callable[[], str]) -> str:
    """``compute()``, remembered in the JSON file ``memo`` until ``stamp`` changes (apt's
    answers take ~1 s each, on every guest start)."""
    data: dict[str, list[object]] = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(memo.read_text())
        if data[key][0] == stamp:
            return str(data[key][1])
    value = compute()
    data[key] = [stamp, value]
    A.atomic_write(memo, json.dumps(data).encode())
    return value


def debian_mirror(memo: Path | None = None) -> str:
    """The Debian archive the machine's apt uses (what debootstrap and apt-get fetch from)."""
    env = os.environ.get("PYNVMF_GUEST_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    if memo is not None:
        apt = [Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")]
        return _memo(memo, "mirror", _stamp(apt), debian_mirror)
    try:
        out = A.run_tool(
            [
                A.tool("apt-get"),
                "indextargets",
                "--format",
                "$(REPO_URI)|$(ORIGIN)|$(LABEL)|$(TARGET_OF)",
            ],
            timeout=60,
        )
    except GuestError as exc:
        log.warning("apt-get indextargets failed (%s); using %s", exc, DEFAULT_MIRROR)
        return DEFAULT_MIRROR
    for line in out.splitlines():
        uri, origin, label, target_of = [*line.split("|"), "", "", ""][:4]
        # The main archive: Debian-Security has its own layout and no kernels of its own.
        if origin == "Debian" and label == "Debian" and target_of == "deb" and uri:
            return uri.rstrip("/")
    log.warning("the machine's apt names no Debian archive; using %s", DEFAULT_MIRROR)
    return DEFAULT_MIRROR


class SuiteApt:
    """apt-get and apt-cache over one suite's lists only, all state under ``root``."""

    def __init__(self, root: Path, mirror: str, suite: Suite) -> None:
        self.root = root
        self.mirror = mirror
        self.suite = suite
        self.lists = root / "lists"
        for d in (self.lists / "partial", root / "cache" / "archives" / "partial", root / "empty"):
            d.mkdir(parents=True, exist_ok=True)
        sources = f"deb [signed-by={KEYRING}] {mirror} {suite.name} main\n"
        path = root / "sources.list"
        if not path.exists() or path.read_text() != sources:
            A.atomic_write(path, sources.encode())
            # Lists of another mirror would not match the new sources.
            for old in self.lists.glob("*_dists_*"):
                old.unlink()
        status = root / "status"
        if not status.exists():
            status.write_bytes(b"")

    @property
    def options(self) -> list[str]:
        r = self.root
        settings = {
            "Dir::Etc::SourceList": r / "sources.list",
            # Empty: the machine's sources.list.d, pins and preferences stay out.
            "Dir::Etc::SourceParts": r / "empty",
            "Dir::Etc::Preferences": r / "empty" / "preferences",
            "Dir::Etc::PreferencesParts": r / "empty",
            "Dir::State": r,
            "Dir::State::Lists": self.lists,
            "Dir::State::status": r / "status",
            "Dir::Cache": r / "cache",
            # sid's Release carries a Valid-Until a week ahead, and a mirror (or the snapshot
            # a machine's apt points at) may lag behind it: apt would then refuse the whole
            # suite. The signature is still checked; a test peer needs no freshness promise.
            "Acquire::Check-Valid-Until": "false",
        }
        return [arg for k, v in settings.items() for arg in ("-o", f"{k}={v}")]

    def lists_age(self) -> float | None:
        stamps = [p.stat().st_mtime for p in self.lists.glob("*_dists_*Release")]
        return time.time() - min(stamps) if stamps else None

    def update(self) -> None:
        started = time.monotonic()
        A.run_tool([A.tool("apt-get"), *self.options, "-q", "update"], timeout=600)
        # apt keeps the server's date on the files; the refresh time is what counts here.
        for p in self.lists.glob("*_dists_*Release"):
            os.utime(p)
        log.info("%s package lists updated in %.1f s", self.suite.name, time.monotonic() - started)

    def ensure_lists(self) -> bool:
        """Fetch the lists when missing, stale or asked to; True when they were fetched."""
        age = self.lists_age()
        if (
            age is not None
            and age < LISTS_MAX_AGE
            and os.environ.get("PYNVMF_GUEST_REFRESH") != "1"
        ):
            return False
        try:
            self.update()
        except GuestError:
            if age is None:
                raise
            log.warning("cannot refresh %s's package lists; using the ones cached", self.suite.name)
            return False
        return True

    def kernel_package(self) -> str:
        env = os.environ.get(self.suite.kernel_package_variable)
        if env:
            return env
        stamp = _stamp([self.lists])
        return _memo(self.root / "memo.json", "kernel_package", stamp, self._kernel_package)

    def _kernel_package(self) -> str:
        out = A.run_tool([A.tool("apt-cache"), *self.options, "depends", "linux-image-amd64"])
        match = re.search(r"^\s*Depends:\s*(linux-image-\S+)", out, re.MULTILINE)
        if match is None:
            raise GuestError(f"{self.suite.name}'s linux-image-amd64 depends on no kernel:\n{out}")
        return match.group(1)


# --------------------------------------------------------------------------------------------
# The root filesystem image


def _require_root(suite: Suite, what: str) -> None:
    if os.geteuid() != 0:
        raise GuestPrerequisiteError(
            f"building the {suite.peer} guest's {what} runs debootstrap and chroot, which need"
            " root: run the tests as root once (make test does), later runs reuse the cache"
        )


def _debootstrap(
    suite: Suite, root: Path, mirror: str, debs: Path, logfile: Path, packages: Sequence[str]
) -> None:
    debs.mkdir(parents=True, exist_ok=True)
    args = [
        A.tool("debootstrap", "debootstrap"),
        "--variant=minbase",
        f"--include={','.join(packages)}",
        f"--cache-dir={debs.resolve()}",
        f"--keyring={KEYRING}",
        suite.name,
        str(root),
        mirror,
    ]
    started = time.monotonic()
    try:
        out = A.run_tool(args, timeout=1800)
    except GuestError as exc:
        logfile.write_text(str(exc))
        raise GuestError(f"debootstrap failed (log in {logfile}):\n{str(exc)[-3000:]}") from exc
    logfile.write_text(out)
    log.info("debootstrap %s took %.1f s", suite.name, time.monotonic() - started)


def _installed_versions(root: Path) -> dict[str, str]:
    """Package -> version of everything debootstrap installed in ``root``."""
    out = A.run_tool(
        [
            A.tool("dpkg-query", "dpkg"),
            f"--admindir={root / 'var' / 'lib' / 'dpkg'}",
            "-W",
            "-f=${Package}\t${Version}\n",
        ]
    )
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def _furnish_rootfs(root: Path, kernel: A.UnpackedKernel) -> None:
    """Put the kernel's modules in and what the guest scripts expect; drop what no test
    reads (the image is smaller and mkfs faster)."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / sub).glob("*"):
            if p.is_file():
                p.unlink()
    for sub in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        shutil.rmtree(root / sub, ignore_errors=True)
        (root / sub).mkdir(parents=True)
    kver = kernel.version
    moddir = root / "usr" / "lib" / "modules" / kver
    shutil.rmtree(moddir, ignore_errors=True)
    shutil.copytree(
        kernel.root / "usr" / "lib" / "modules" / kver,
        moddir,
        symlinks=True,
        # A split kernel package keeps vmlinuz there: QEMU boots it from the cache.
        ignore=lambda _dir, names: [n for n in names if n == "vmlinuz"],
    )
    # The suite's own depmod, so the index is the format its modprobe reads.
    A.run_tool([A.tool("chroot"), str(root), "depmod", kver])
    (root / "boot").mkdir(exist_ok=True)
    shutil.copyfile(kernel.config, root / "boot" / f"config-{kver}")
    for d, applet in (("usr/local/bin", "nc"), ("usr/local/sbin", "poweroff")):
        (root / d).mkdir(parents=True, exist_ok=True)
        link = root / d / applet
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to("/usr/bin/busybox")
    (root / "etc" / "hostname").write_text("pynvmf-guest\n")
    (root / "etc" / "fstab").write_text("")
    (root / "usr" / "lib" / "pynvmf").mkdir(parents=True, exist_ok=True)


def _mkfs(root: Path, image: Path) -> None:
    used = sum(p.lstat().st_size for p in root.rglob("*"))
    size_mib = int(used * 1.25) // (1 << 20) + ROOTFS_FREE_MIB
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    A.run_tool(
        [
            A.tool("mkfs.ext4", "e2fsprogs"),
            "-q",
            "-F",
            "-L",
            "pynvmf-root",
            "-m",
            "0",
            # Initialise the inode tables now: the guest's lazy init would do it under TCG.
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            "-d",
            str(root),
            str(image),
        ],
        timeout=900,
    )


def _build_rootfs(
    suite: Suite,
    dest: Path,
    kernel: A.UnpackedKernel,
    mirror: str,
    work: Path,
    packages: Sequence[str],
) -> None:
    _require_root(suite, "root filesystem")
    tmp = work / f".rootfs-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        root = tmp / "root"
        started = time.monotonic()
        _debootstrap(suite, root, mirror, work / "debs", work / "debootstrap.log", packages)
        versions = _installed_versions(root)
        _furnish_rootfs(root, kernel)
        image = tmp / "rootfs.ext4"
        _mkfs(root, image)
        # The versions first: an image without its record is never published.
        A.atomic_write(dest.with_suffix(".json"), json.dumps(versions, sort_keys=True).encode())
        os.replace(image, dest)
        log.info("built %s in %.1f s", dest, time.monotonic() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _rootfs_key(suite: Suite, mirror: str, package: str, packages: Sequence[str]) -> str:
    builders = "".join(
        inspect.getsource(f)
        for f in (_debootstrap, _installed_versions, _furnish_rootfs, _mkfs, _build_rootfs)
    )
    blob = json.dumps([suite.name, mirror, list(packages), package, builders, ROOTFS_FREE_MIB])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Stage 1


def _stage2_init() -> str:
    return A.init_script(
        path=_STAGE2_PATH,
        mounts=[
            # What the 6.1 guest has in RAM: scratch files must not go to the virtio disk.
            "mount -t tmpfs -o mode=1777 tmpfs /tmp",
            "mount -t tmpfs -o mode=755 tmpfs /run",
        ],
    )


def _stage1_script(modules: Sequence[str]) -> str:
    return _STAGE1_SCRIPT.replace("@MODULES@", " ".join(modules)).replace(
        "@STAGE2_INIT@", _STAGE2_INIT
    )


def _build_stage1(dest: Path, moddir: Path, busybox: str) -> None:
    tree = A.Tree()
    for top in ("bin", "sbin", "lib", "lib64"):
        tree.add_link(top, f"usr/{top}")
    tree.dirs.update({"dev", "proc", "sys", "newroot", "usr/lib64"})
    tree.add_file("/usr/bin/busybox", Path(os.path.realpath(busybox)), 0o755)
    for lib in A.shared_libraries(busybox):
        tree.add_file(A.usr(lib), Path(os.path.realpath(lib)), 0o755)
    for applet in A.run_tool([busybox, "--list-full"]).split():
        if applet.rsplit("/", 1)[-1] != "busybox":
            tree.add_link(A.usr("/" + applet), "/usr/bin/busybox")
    names = []
    for rel in A.module_load_order(moddir, STAGE1_MODULES):
        name = A.modname(rel)
        data = (moddir / rel).read_bytes()
        # busybox insmod takes plain .ko files only.
        if rel.endswith(".xz"):
            data = lzma.decompress(data)
        elif not rel.endswith(".ko"):
            raise GuestError(f"stage 1 cannot load {rel}: only .ko and .ko.xz are handled")
        tree.add_file(f"/usr/lib/modules/{name}.ko", data)
        names.append(name)
    tree.add_file("/init", _stage1_script(names).encode(), 0o755)
    tree.add_file("/pynvmf/init", _stage2_init().encode(), 0o755)
    tree.add_file("/pynvmf/serve", A.SERVE_SCRIPT.encode(), 0o755)
    tree.write_gzip(dest, devices=True)


def _stage1_key(kver: str, busybox: str) -> str:
    st = os.stat(busybox)
    builder = hashlib.sha256(Path(__file__).read_bytes() + Path(A.__file__).read_bytes())
    blob = json.dumps([kver, busybox, st.st_size, st.st_mtime_ns, builder.hexdigest()])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------


def _prune(work: Path, pattern: str, keep: Path, spare: int) -> None:
    """Drop older builds but the ``spare`` most recently used: another checkout may still be
    on an older version of this file, and a root filesystem takes minutes to rebuild."""
    others = sorted(
        (p for p in work.glob(pattern) if p != keep), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for stale in others[spare:]:
        with contextlib.suppress(OSError):
            stale.unlink()


def _kernel_dir(work: Path, apt: SuiteApt, fetched: bool) -> Path:
    package = apt.kernel_package()
    kernels = work / "kernel"
    dest = kernels / package
    if (dest / "info.json").exists():
        A.record_versions(dest, apt.options)
        return dest
    try:
        return A.unpack_kernel(kernels, package, apt.options)
    except GuestError:
        if fetched:
            raise
        # Debian keeps only the current kernel in the archive: a list a week old may name
        # one that is gone (sid moves every few weeks).
        log.warning("downloading %s failed; refreshing %s's package lists", package, apt.suite.name)
        apt.update()
        return _kernel_dir(work, apt, True)


def _check_kernel(suite: Suite, kernel: A.UnpackedKernel) -> None:
    if not kernel.version.startswith(suite.kernel + "."):
        raise GuestError(
            f"{suite.name}'s kernel is now {kernel.version} ({kernel.package}), not Linux"
            f" {suite.kernel}.x: the peer {suite.peer} is named after {suite.kernel}. Give the"
            f" new kernel a peer of its own in tests/support/guest.py (or set"
            f" {suite.kernel_package_variable} to a {suite.kernel}.x package)"
        )


def prepare_assets(
    suite: Suite, variant: str = "", extra_packages: Sequence[str] = ()
) -> GuestAssets:
    """Build (once, cached) and return the kernel, stage-1 initramfs and root image.

    A `variant` (a name) is a root filesystem with `extra_packages` too, for a harness that
    needs more than the interoperability tests (blktests: tests/blktests/guest.py): cached
    as ``<variant>-rootfs-*.ext4``, apart from the plain image, which keeps its size and
    build time (and neither one's clean-up removes the other)."""
    packages = (*PACKAGES, *(p for p in extra_packages if p not in PACKAGES))
    prefix = f"{variant}-rootfs" if variant else "rootfs"
    require_prerequisites(suite)
    cache = A.cache_dir()
    work = cache / suite.name
    work.mkdir(parents=True, exist_ok=True)
    with A.locked(work / ".build.lock"):
        mirror = debian_mirror(work / "memo.json")
        apt = SuiteApt(work / "apt", mirror, suite)
        fetched = apt.ensure_lists()
        kdir = _kernel_dir(work, apt, fetched)
        kernel = A.UnpackedKernel.load(kdir)
        _check_kernel(suite, kernel)
        kver = kernel.version

        key = _rootfs_key(suite, mirror, kernel.package, packages)
        rootfs = work / f"{prefix}-{kver}-{key}.ext4"
        if not rootfs.exists():
            _build_rootfs(suite, rootfs, kernel, mirror, work, packages)
        busybox = A.tool("busybox")
        stage1 = work / f"stage1-{kver}-{_stage1_key(kver, busybox)}.cpio.gz"
        if not stage1.exists():
            _build_stage1(stage1, kernel.root / "lib" / "modules" / kver, busybox)
        for path in (rootfs, stage1):
            os.utime(path)
        _prune(work, f"{prefix}-*.ext4", rootfs, spare=1)
        _prune(work, f"{prefix}-*.json", rootfs.with_suffix(".json"), spare=1)
        _prune(work, "stage1-*.cpio.gz", stage1, spare=2)
        # Kernels no remaining image was built from.
        kvers = {
            p.stem.partition("rootfs-")[2].rsplit("-", 1)[0] for p in work.glob("*rootfs-*.ext4")
        }
        for old in (work / "kernel").glob("linux-image-*"):
            version = (
                json.loads((old / "info.json").read_text())["kernel_version"]
                if (old / "info.json").exists()
                else None
            )
            if old != kdir and version is not None and version not in kvers:
                shutil.rmtree(old, ignore_errors=True)
        try:
            installed = json.loads(rootfs.with_suffix(".json").read_text())
        except (OSError, ValueError):
            # An image built before its versions were recorded: they are unknown.
            installed = {}
    return kernel.assets(
        peer=suite.peer,
        cache_dir=work,
        initramfs=stage1,
        versions=installed,
        root_disk=rootfs,
        overlay_prefix="overlay",
    )


# --------------------------------------------------------------------------------------------
# Debian Python packages for pynvmf in the guest


def python_bundle(
    suite: Suite,
    packages: Sequence[str] = ("python3-cryptography", "python3-cffi-backend"),
) -> Path:
    """A tar.gz of the suite's builds of `packages` (their ``usr/lib/python3/dist-packages``),
    for running pynvmf itself in the guest with the guest's Python (trixie 3.13, sid 3.14),
    where a test needs the guest kernel's features on pynvmf's side of a connection (kTLS:
    the machine's kernel may have no tls module). Downloaded once with the suite's apt
    lists, cached."""
    require_prerequisites(suite)
    work = A.cache_dir() / suite.name
    work.mkdir(parents=True, exist_ok=True)
    with A.locked(work / ".build.lock"):
        mirror = debian_mirror(work / "memo.json")
        apt = SuiteApt(work / "apt", mirror, suite)
        apt.ensure_lists()
        key = hashlib.sha256(json.dumps([mirror, list(packages)]).encode()).hexdigest()[:16]
        dest = work / f"python-{key}.tar.gz"
        if dest.exists():
            return dest
        tmp = work / f".python-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "debs").mkdir(parents=True)
        try:
            A.run_tool(
                [A.tool("apt-get"), *apt.options, "-q", "download", *packages], cwd=tmp / "debs"
            )
            for deb in sorted((tmp / "debs").glob("*.deb")):
                A.run_tool([A.tool("dpkg-deb", "dpkg"), "-x", str(deb), str(tmp / "root")])
            site = tmp / "root" / "usr" / "lib" / "python3" / "dist-packages"
            A.run_tool([A.tool("tar"), "-C", str(site), "-czf", str(tmp / "bundle.tar.gz"), "."])
            os.replace(tmp / "bundle.tar.gz", dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("Python packages for the guest: %s", dest)
        return dest
