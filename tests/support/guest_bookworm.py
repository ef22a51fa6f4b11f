"""The Linux 6.1 peer: Debian 12 (bookworm)'s kernel with a busybox initramfs that holds the
whole guest (nvme-cli 2.3, fio 3.33, GNU dd and mkfs.xfs copied from the machine, which is
itself bookworm, with their shared libraries).

The kernel package is what the machine's ``linux-image-amd64`` depends on, downloaded with
the machine's own apt configuration and unpacked into ``<cache>/kernel/<package>``. The
initramfs is ``<cache>/initramfs-<kver>-<key>.cpio.gz``; its key covers this file, the shared
scripts and the copied binaries, so any change rebuilds it (~10 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support import guest_assets as A
from tests.support.guest_assets import GuestAssets, GuestError, log

PEER = "linux-6.1"

# Bump when the initramfs layout changes in a way the cache key (which already covers the
# builder's text and the copied binaries) would not notice.
_ASSET_FORMAT = 3

# Tools this peer needs on the machine besides guest_assets.REQUIRED_TOOLS.
TOOLS: dict[str, str] = {
    "nvme": "nvme-cli",
    "fio": "fio",
    "dd": "coreutils",
}

# Kernel modules shipped in the initramfs (with their modules.dep closure);
# value: True when the build must fail if the kernel has neither the module nor a builtin.
GUEST_MODULES: dict[str, bool] = {
    "virtio_pci": True,
    "virtio_net": True,
    "virtio_console": True,
    "virtio_blk": False,
    "crc32c_generic": True,
    "crc32c_intel": False,
    "configfs": True,
    "nvme_core": True,
    "nvme_fabrics": True,
    "nvme_tcp": True,
    "nvmet": True,
    "nvmet_tcp": True,
    "null_blk": True,
    "brd": True,
    "loop": True,
    "xfs": False,
}

_KMOD_TOOLS = ("modprobe", "insmod", "rmmod", "lsmod", "depmod", "modinfo")
# The machine's packages the guest's tools come from, reported with the peer's versions.
_VERSIONED = ("nvme-cli", "libnvme1", "fio", "xfsprogs", "busybox-static")


def require_prerequisites() -> None:
    A.require_tools({**A.REQUIRED_TOOLS, **TOOLS}, "the Linux 6.1 guest")


# --------------------------------------------------------------------------------------------
# The kernel


def _kernel_package(cache: Path) -> str | None:
    """The package linux-image-amd64 depends on, or None when apt cannot tell."""
    env = os.environ.get("PYNVMF_GUEST_KERNEL_PACKAGE")
    if env:
        return env
    # apt-cache takes ~0.6 s without a pkgcache; remember its answer until the lists change.
    lists = Path("/var/lib/apt/lists")
    try:
        stamp = lists.stat().st_mtime_ns
    except OSError:
        stamp = 0
    memo = cache / "kernel-package.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        data = json.loads(memo.read_text())
        if data["lists_mtime_ns"] == stamp:
            return str(data["package"])
    try:
        out = A.run_tool([A.tool("apt-cache"), "depends", "linux-image-amd64"])
    except GuestError as exc:
        log.warning("cannot resolve linux-image-amd64: %s", exc)
        return None
    match = re.search(r"^\s*Depends:\s*(linux-image-\S+)", out, re.MULTILINE)
    if match is None:
        return None
    package = match.group(1)
    A.atomic_write(memo, json.dumps({"lists_mtime_ns": stamp, "package": package}).encode())
    return package


def _kernel_dir(cache: Path) -> Path:
    kernels = cache / "kernel"
    package = _kernel_package(cache)
    if package is None:
        # Offline or no apt lists: any kernel built earlier will do.
        existing = sorted(p for p in kernels.glob("linux-image-*") if (p / "info.json").exists())
        if not existing:
            raise GuestError(
                "cannot tell which kernel package to use (apt-cache depends linux-image-amd64"
                " failed) and none is cached; run apt-get update"
            )
        return existing[-1]
    dest = kernels / package
    if (dest / "info.json").exists():
        return dest
    with A.locked(cache / ".build.lock"):
        if (dest / "info.json").exists():
            return dest
        return A.unpack_kernel(kernels, package)


# --------------------------------------------------------------------------------------------
# The initramfs


def _add_modules(tree: A.Tree, moddir: Path, kver: str, staging: Path) -> None:
    # depmod on a copy holding only the shipped modules, so modprobe in the guest sees a
    # consistent modules.dep/modules.alias instead of entries for files that are absent.
    subset = staging / "lib" / "modules" / kver
    for rel in A.module_load_order(moddir, GUEST_MODULES):
        (subset / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(moddir / rel, subset / rel)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (moddir / name).exists():
            shutil.copyfile(moddir / name, subset / name)
    A.run_tool([A.tool("depmod"), "-b", str(staging), kver])
    for path in sorted(subset.rglob("*")):
        if path.is_file():
            tree.add_file(f"usr/lib/modules/{kver}/{path.relative_to(subset)}", path)


def _guest_binaries() -> list[tuple[str, str]]:
    """(host path, guest path) of the programs copied into the guest besides busybox."""
    out = [
        (A.tool("nvme", "nvme-cli"), "/usr/sbin/nvme"),
        (A.tool("fio", "fio"), "/usr/bin/fio"),
        (A.tool("kmod"), "/usr/bin/kmod"),
        # GNU dd: busybox's lacks some flags (iflag=direct, status=...).
        (A.tool("dd", "coreutils"), "/usr/bin/dd"),
    ]
    mkfs_xfs = A.which("mkfs.xfs")
    if mkfs_xfs is not None:
        out.append((mkfs_xfs, "/usr/sbin/mkfs.xfs"))
    return out


def _init_script() -> str:
    return A.init_script(path="/usr/sbin:/usr/bin")


def _initramfs_key(kver: str, busybox: str, binaries: Sequence[tuple[str, str]]) -> str:
    stats = []
    for host, _guest in [(busybox, ""), *binaries]:
        st = os.stat(host)
        stats.append([host, st.st_size, st.st_mtime_ns])
    # The builders' own text is in the key so a change to how the image is built rebuilds it.
    builder = hashlib.sha256(
        Path(__file__).read_bytes() + Path(A.__file__).read_bytes()
    ).hexdigest()
    blob = json.dumps(
        [_ASSET_FORMAT, builder, kver, _init_script(), A.SERVE_SCRIPT, GUEST_MODULES, stats],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _build_initramfs(dest: Path, kernel_root: Path, kver: str, busybox: str) -> None:
    tree = A.Tree()
    for top in ("bin", "sbin", "lib", "lib64"):
        tree.add_link(top, f"usr/{top}")
    tree.dirs.update(
        {"dev", "proc", "sys", "tmp", "run", "root", "etc", "mnt", "var/tmp", "usr/lib64"}
    )
    tree.add_file("/usr/bin/busybox", Path(os.path.realpath(busybox)), 0o755)
    for lib in A.shared_libraries(busybox):
        tree.add_file(A.usr(lib), Path(os.path.realpath(lib)), 0o755)
    applets = A.run_tool([busybox, "--list-full"]).split()
    for applet in applets:
        if applet.rsplit("/", 1)[-1] != "busybox":
            tree.add_link(A.usr("/" + applet), "/usr/bin/busybox")
    for host, guest in _guest_binaries():
        A.add_binary(tree, host, guest)
    for name in _KMOD_TOOLS:
        for d in ("/usr/bin/", "/usr/sbin/"):
            tree.links.pop((d + name).strip("/"), None)
        tree.add_link(f"/usr/sbin/{name}", "/usr/bin/kmod")
    tree.add_file("/init", _init_script().encode(), 0o755)
    tree.add_file(A.SERVE_PATH, A.SERVE_SCRIPT.encode(), 0o755)
    tree.add_file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    tree.add_file("/etc/group", b"root:x:0:\n")
    tree.add_file("/etc/hostname", b"pynvmf-guest\n")
    with tempfile.TemporaryDirectory(prefix=".modules-", dir=dest.parent) as staging:
        _add_modules(tree, kernel_root / "lib" / "modules" / kver, kver, Path(staging))
        tree.write_gzip(dest, devices=True)


def prepare_assets() -> GuestAssets:
    """Build (once, cached) and return the kernel and initramfs the guest boots."""
    require_prerequisites()
    cache = A.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    kdir = _kernel_dir(cache)
    A.record_versions(kdir)
    kernel = A.UnpackedKernel.load(kdir)
    kver = kernel.version
    busybox = A.tool("busybox")
    key = _initramfs_key(kver, busybox, _guest_binaries())
    initramfs = cache / f"initramfs-{kver}-{key}.cpio.gz"
    if not initramfs.exists():
        with A.locked(cache / ".build.lock"):
            if not initramfs.exists():
                started = time.monotonic()
                _build_initramfs(initramfs, kernel.root, kver, busybox)
                log.info("built %s in %.1f s", initramfs, time.monotonic() - started)
                # Older images are dead weight (~35 MiB each); a process still on an older
                # version of this file rebuilds its own on its next prepare_assets().
                for stale in cache.glob("initramfs-*.cpio.gz"):
                    if stale != initramfs:
                        with contextlib.suppress(OSError):
                            stale.unlink()
    return kernel.assets(
        peer=PEER, cache_dir=cache, initramfs=initramfs, versions=_machine_versions()
    )


def _machine_versions() -> dict[str, str]:
    """Versions of the machine's packages whose programs the initramfs copies."""
    proc = subprocess.run(
        [A.tool("dpkg-query", "dpkg"), "-W", "-f=${Package}\t${Version}\n", *_VERSIONED],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    # dpkg-query fails for names it does not know (libnvme's soname changed across
    # releases) but still prints the others.
    return dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
