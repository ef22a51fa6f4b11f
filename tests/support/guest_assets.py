"""What the guest peers' boot assets are made of (tests/support/guest.py boots them).

Shared by the peers (guest_bookworm.py, guest_debootstrap.py): the errors, the tools the
harness needs on the machine, the cache directory and its lock, a writer for the cpio
archives the kernel unpacks, Debian kernel packages unpacked from the archive, and the
scripts that run in every guest (its init and the command server on virtio-serial).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import json
import logging
import lzma
import os
import re
import shlex
import shutil
import struct
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger("tests.support.guest")

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = "scripts/install-system-deps.sh"

HOST_ADDRESS = "10.0.2.2"
GUEST_ADDRESS = "10.0.2.15"

# Name of the virtio-serial port that carries the command server (the guest finds its
# /dev/vportNpM through /sys/class/virtio-ports/*/name).
COMMAND_PORT = "pynvmf.cmd"

# Where the command server lives in every guest.
SERVE_PATH = "/usr/lib/pynvmf/serve"

# /etc/tlshd.conf for a guest whose NVMe/TCP TLS handshakes tlshd does (host and target
# roles): PSKs from the kernel's .nvme keyring, quiet logs.
TLSHD_CONF = """[debug]
loglevel=0
tls=0
nl=0
[authenticate]
keyrings=.nvme
[authenticate.client]
[authenticate.server]
"""


# --------------------------------------------------------------------------------------------
# Errors


class GuestError(RuntimeError):
    """The guest could not be built, booted or driven."""


class GuestPrerequisiteError(GuestError):
    """A tool or package the harness needs is missing on the machine."""


class GuestTimeoutError(GuestError):
    """A command (or the boot) did not finish in time."""


class GuestBootError(GuestError):
    """Every attempt to boot the guest failed (each attempt's reason is in the message)."""


class GuestCommandError(GuestError):
    """A command run with check=True exited with a non-zero status."""

    def __init__(self, cmd: str, rc: int, output: str) -> None:
        self.cmd = cmd
        self.rc = rc
        self.output = output
        super().__init__(f"guest command {cmd!r} exited with status {rc}; output:\n{output}")


@dataclasses.dataclass(frozen=True)
class GuestAssets:
    """What QEMU boots for one peer."""

    peer: str
    cache_dir: Path
    kernel_package: str
    kernel_version: str
    vmlinuz: Path
    # The kernel's build configuration (boot/config-V, or usr/lib/modules/V/config in a
    # split kernel package).
    config: Path
    # None when the payload could not be extracted (or the kernel lacks CONFIG_PVH).
    vmlinux: Path | None
    # Unpacked kernel package; <root>/lib/modules/<kernel_version> holds all modules.
    kernel_root: Path
    initramfs: Path
    # A raw ext4 image the guest boots as its root (virtio-blk, writes discarded), or None
    # when the initramfs is the whole guest.
    root_disk: Path | None = None
    # Folder of the initramfs where Guest(extra_files=...) go: "" when the initramfs is the
    # guest's root, else a folder that stage 1 copies over the root filesystem.
    overlay_prefix: str = ""
    # Debian package -> version of what the guest runs (the kernel's packages, nvme-cli,
    # libnvme, fio...), recorded by the build so that a test run can say which ran.
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def kernel(self) -> Path:
        """The image to pass to ``qemu -kernel``."""
        if self.vmlinux is not None and os.environ.get("PYNVMF_GUEST_BZIMAGE") != "1":
            return self.vmlinux
        return self.vmlinuz

    @property
    def modules_dir(self) -> Path:
        return self.kernel_root / "lib" / "modules" / self.kernel_version


# --------------------------------------------------------------------------------------------
# Prerequisites

# Tools every peer needs on the machine, with the Debian package that provides them.
REQUIRED_TOOLS: dict[str, str] = {
    "qemu-system-x86_64": "qemu-system-x86",
    "busybox": "busybox-static",
    "cpio": "cpio",
    "depmod": "kmod",
    "kmod": "kmod",
    "dpkg": "dpkg",
    "apt-get": "apt",
    "apt-cache": "apt",
    "ldd": "libc-bin",
}


def which(tool: str) -> str | None:
    # Non-root PATHs often lack the sbin directories where depmod and nvme live.
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(tool, path=path)


def tool(name: str, package: str | None = None) -> str:
    found = which(name)
    if found is None:
        pkg = package or REQUIRED_TOOLS.get(name, name)
        raise GuestPrerequisiteError(
            f"{name!r} (Debian package {pkg}) is missing: run {INSTALL_SCRIPT} as root"
        )
    return found


def require_tools(tools: Mapping[str, str], what: str) -> None:
    """Raise GuestPrerequisiteError naming every missing tool; the tests must not skip."""
    missing = [f"{t} ({p})" for t, p in tools.items() if which(t) is None]
    if missing:
        raise GuestPrerequisiteError(
            f"{what} needs tools that are missing: "
            + ", ".join(missing)
            + f"; install them with {INSTALL_SCRIPT} (as root)"
        )


# --------------------------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    env = os.environ.get("PYNVMF_GUEST_CACHE")
    return Path(env) if env else REPO_ROOT / ".cache" / "guest"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def run_tool(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    timeout: float = 600,
    input: bytes | None = None,
) -> str:
    proc = subprocess.run(
        list(args), cwd=cwd, capture_output=True, check=False, timeout=timeout, input=input
    )
    out = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise GuestError(
            f"{shlex.join(args)} failed with status {proc.returncode}:\n"
            f"{out}{proc.stderr.decode(errors='replace')}"
        )
    return out


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Debian kernel packages


def _kernel_payload(image: bytes) -> bytes | None:
    """The compressed kernel inside a bzImage, as its setup header locates it (the trailing
    4-byte uncompressed size left off)."""
    if image[0x202:0x206] != b"HdrS":
        return None
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if not length or start + length > len(image):
        return None
    return image[start : start + length - 4]


def extract_vmlinux(vmlinuz: Path, config: Path, dest: Path) -> bool:
    """Write the uncompressed ELF kernel; PVH-capable ELF boots several seconds faster.

    Bookworm's kernels are xz-compressed, trixie's zstd (which Python 3.11 cannot decode:
    the zstd tool does).
    """
    try:
        if "CONFIG_PVH=y" not in config.read_text().splitlines():
            log.warning("%s lacks CONFIG_PVH; booting the bzImage", config)
            return False
        payload = _kernel_payload(vmlinuz.read_bytes())
        if payload is None:
            log.warning("%s has no payload in its setup header; booting the bzImage", vmlinuz)
            return False
        if payload.startswith(b"\xfd7zXZ\x00"):
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        elif payload.startswith(b"\x28\xb5\x2f\xfd"):
            zstd = which("zstd")
            if zstd is None:
                raise GuestPrerequisiteError(
                    f"'zstd' (Debian package zstd) is missing: run {INSTALL_SCRIPT} as root"
                )
            proc = subprocess.run(
                [zstd, "-dcq"], input=payload, capture_output=True, check=False, timeout=120
            )
            if proc.returncode != 0:
                log.warning("zstd -d of %s failed: %s", vmlinuz, proc.stderr.decode()[:200])
                return False
            elf = proc.stdout
        else:
            log.warning("unknown compression in %s; booting the bzImage", vmlinuz)
            return False
        if elf[:4] != b"\x7fELF":
            log.warning("the payload of %s is not an ELF image; booting the bzImage", vmlinuz)
            return False
        atomic_write(dest, elf)
        return True
    except (OSError, lzma.LZMAError) as exc:
        log.warning("cannot extract vmlinux from %s (%s); booting the bzImage", vmlinuz, exc)
        return False


def kernel_parts(package: str, apt_options: Sequence[str] = ()) -> list[str]:
    """``package`` and the packages it is split into, when it is.

    Debian's kernels from 7.x on (sid, 2026) split ``linux-image-V`` into ``linux-base-V``
    (config, System.map), ``linux-binary-V`` (vmlinuz) and ``linux-modules-V``, all under
    ``usr/lib/modules/V/``; the image package itself is empty but for its dependencies.
    Older ones (bookworm, trixie) ship everything in ``linux-image-V``.
    """
    suffix = package.removeprefix("linux-image-")
    out = run_tool([tool("apt-cache"), *apt_options, "depends", package])
    parts = re.findall(
        rf"^\s*Depends:\s*(linux-(?:base|binary|modules)-{re.escape(suffix)})$", out, re.MULTILINE
    )
    return [package, *dict.fromkeys(parts)]


def _find_in_package(root: Path, names: Sequence[str]) -> Path:
    for name in names:
        if (root / name).is_file():
            return root / name
    raise GuestError(f"the kernel package unpacked in {root} has none of {', '.join(names)}")


def unpack_kernel(kernels: Path, package: str, apt_options: Sequence[str] = ()) -> Path:
    """Download a linux-image package (and the packages it is split into, kernel_parts)
    with apt-get (``apt_options`` choose its sources), unpack it under
    ``kernels/<package>`` and index its modules; return that directory.

    The tree is ``root/`` (the packages' files, with ``root/lib`` linking to ``usr/lib``
    when they are merged-/usr), ``vmlinux`` and ``info.json`` (the kernel version, where
    vmlinuz and the config are in ``root/``, each package's version).
    """
    dest = kernels / package
    tmp = kernels / f".tmp-{package}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        parts = kernel_parts(package, apt_options)
        log.info("downloading %s", " ".join(parts))
        run_tool([tool("apt-get"), *apt_options, "download", "-q", *parts], cwd=tmp)
        debs = sorted(tmp.glob("*.deb"))
        if len(debs) != len(parts):
            raise GuestError(f"apt-get download {' '.join(parts)} produced {debs}")
        root = tmp / "root"
        versions: dict[str, str] = {}
        for deb in debs:
            name, version = run_tool(
                [tool("dpkg-deb", "dpkg"), "-f", str(deb), "Package", "Version"]
            ).split("\n")[:2]
            versions[name.removeprefix("Package: ")] = version.removeprefix("Version: ")
            run_tool([tool("dpkg"), "-x", str(deb), str(root)])
            deb.unlink()
        if not (root / "lib").exists() and (root / "usr" / "lib" / "modules").is_dir():
            # depmod -b looks under <base>/lib/modules (bookworm's kmod predates /usr/lib).
            (root / "lib").symlink_to("usr/lib")
        kvers = sorted(p.name for p in (root / "lib" / "modules").iterdir())
        if len(kvers) != 1:
            raise GuestError(f"{package} ships modules for {kvers}, expected one version")
        kver = kvers[0]
        run_tool([tool("depmod"), "-b", str(root), kver])
        in_modules = f"usr/lib/modules/{kver}"
        vmlinuz = _find_in_package(root, [f"boot/vmlinuz-{kver}", f"{in_modules}/vmlinuz"])
        config = _find_in_package(root, [f"boot/config-{kver}", f"{in_modules}/config"])
        has_vmlinux = extract_vmlinux(vmlinuz, config, tmp / "vmlinux")
        info = {
            "package": package,
            "kernel_version": kver,
            "vmlinux": has_vmlinux,
            "vmlinuz": str(vmlinuz.relative_to(root)),
            "config": str(config.relative_to(root)),
            "versions": versions,
        }
        (tmp / "info.json").write_text(json.dumps(info))
        shutil.rmtree(dest, ignore_errors=True)
        # The rename publishes the tree; a directory under the final name is complete.
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def record_versions(kdir: Path, apt_options: Sequence[str] = ()) -> None:
    """Add the packages' versions to the info.json of a tree that an earlier unpack_kernel
    left without them (a shared cache outlives this code), as apt's lists name them."""
    path = kdir / "info.json"
    info = json.loads(path.read_text())
    if info.get("versions"):
        return
    try:
        parts = kernel_parts(info["package"], apt_options)
        out = run_tool([tool("apt-cache"), *apt_options, "show", "--no-all-versions", *parts])
    except GuestError as exc:
        log.warning("cannot tell the versions of %s: %s", info["package"], exc)
        return
    versions: dict[str, str] = {}
    for stanza in out.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Version): (\S+)$", stanza, re.MULTILINE))
        if "Package" in fields and "Version" in fields:
            versions[fields["Package"]] = fields["Version"]
    atomic_write(path, json.dumps({**info, "versions": versions}).encode())


@dataclasses.dataclass(frozen=True)
class UnpackedKernel:
    """What unpack_kernel left in a directory (info.json)."""

    package: str
    version: str
    root: Path
    vmlinuz: Path
    config: Path
    vmlinux: Path | None
    # Debian package -> version of the packages unpacked.
    packages: Mapping[str, str]

    @classmethod
    def load(cls, kdir: Path) -> UnpackedKernel:
        info = json.loads((kdir / "info.json").read_text())
        kver = str(info["kernel_version"])
        root = kdir / "root"
        # Trees unpacked before the split kernel packages name neither path: both in boot/.
        return cls(
            package=str(info["package"]),
            version=kver,
            root=root,
            vmlinuz=root / info.get("vmlinuz", f"boot/vmlinuz-{kver}"),
            config=root / info.get("config", f"boot/config-{kver}"),
            vmlinux=(kdir / "vmlinux") if info["vmlinux"] else None,
            packages=dict(info.get("versions", {})),
        )

    def assets(
        self,
        *,
        peer: str,
        cache_dir: Path,
        initramfs: Path,
        versions: Mapping[str, str],
        root_disk: Path | None = None,
        overlay_prefix: str = "",
    ) -> GuestAssets:
        """What a peer boots with this kernel; ``versions`` of its other packages."""
        return GuestAssets(
            peer=peer,
            cache_dir=cache_dir,
            kernel_package=self.package,
            kernel_version=self.version,
            vmlinuz=self.vmlinuz,
            config=self.config,
            vmlinux=self.vmlinux,
            kernel_root=self.root,
            initramfs=initramfs,
            root_disk=root_disk,
            overlay_prefix=overlay_prefix,
            versions={**versions, **self.packages},
        )


def modname(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", base)
    return base.replace("-", "_")


def _modules_dep(moddir: Path) -> tuple[dict[str, list[str]], dict[str, str], set[str]]:
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        mod, sep, rest = line.partition(":")
        if sep:
            deps[mod] = rest.split()
            by_name[modname(mod)] = mod
    builtin = {modname(p) for p in (moddir / "modules.builtin").read_text().split()}
    return deps, by_name, builtin


def module_load_order(moddir: Path, wanted: Mapping[str, bool]) -> list[str]:
    """Paths (relative to moddir) of the wanted modules and everything they depend on, each
    after its dependencies (the order insmod needs). ``wanted`` maps a module name to
    whether the build must fail when the kernel has neither the module nor a builtin."""
    deps, by_name, builtin = _modules_dep(moddir)
    order: list[str] = []
    seen: set[str] = set()

    def visit(mod: str) -> None:
        if mod in seen:
            return
        seen.add(mod)
        for dep in deps.get(mod, []):
            visit(dep)
        order.append(mod)

    for name, required in wanted.items():
        key = name.replace("-", "_")
        if key in by_name:
            visit(by_name[key])
        elif key not in builtin and required:
            raise GuestError(f"kernel module {name} is neither in {moddir} nor builtin")
    return order


# --------------------------------------------------------------------------------------------
# cpio archives


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


class _Cpio:
    """Writer for the newc cpio format the kernel unpacks (no root needed for device nodes)."""

    def __init__(self, out: _Writable) -> None:
        self._out = out
        self._ino = 1

    def _entry(self, name: str, mode: int, data: bytes | Path, rdev: tuple[int, int]) -> None:
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, size, 0, 0, rdev[0], rdev[1], len(encoded), 0)
        self._ino += 1
        header = b"070701" + b"".join(b"%08X" % v for v in fields)
        self._out.write(header + encoded + b"\0" * (-(len(header) + len(encoded)) % 4))
        if isinstance(data, Path):
            with open(data, "rb") as f:
                shutil.copyfileobj(f, self._out, 1 << 20)
        else:
            self._out.write(data)
        self._out.write(b"\0" * (-size % 4))

    def directory(self, name: str, mode: int = 0o755) -> None:
        self._entry(name, 0o040000 | mode, b"", (0, 0))

    def file(self, name: str, data: bytes | Path, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data, (0, 0))

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, 0o120777, target.encode(), (0, 0))

    def chardev(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        self._entry(name, 0o020000 | mode, b"", (major, minor))

    def finish(self) -> None:
        self._entry("TRAILER!!!", 0, b"", (0, 0))


@dataclasses.dataclass
class Tree:
    """Files for an initramfs, keyed by path without the leading slash."""

    files: dict[str, tuple[bytes | Path, int]] = dataclasses.field(default_factory=dict)
    links: dict[str, str] = dataclasses.field(default_factory=dict)
    dirs: set[str] = dataclasses.field(default_factory=set)

    def add_file(self, path: str, data: bytes | Path, mode: int = 0o644) -> None:
        path = path.strip("/")
        self.links.pop(path, None)
        self.files[path] = (data, mode)

    def add_link(self, path: str, target: str) -> None:
        path = path.strip("/")
        self.files.pop(path, None)
        self.links[path] = target

    def write(self, out: _Writable, *, devices: bool) -> None:
        names = set(self.files) | set(self.links) | {d.strip("/") for d in self.dirs}
        parents: set[str] = set()
        for name in names:
            parts = name.split("/")
            parents.update("/".join(parts[:i]) for i in range(1, len(parts)))
        cpio = _Cpio(out)
        # Sorted order puts every directory before its contents.
        for name in sorted(names | parents):
            if name in self.files:
                data, mode = self.files[name]
                cpio.file(name, data, mode)
            elif name in self.links:
                cpio.symlink(name, self.links[name])
            else:
                cpio.directory(name, 0o1777 if name == "tmp" else 0o755)
        if devices:
            # The kernel opens /dev/console for init's stdio before init can mount devtmpfs.
            cpio.chardev("dev/console", 5, 1)
            cpio.chardev("dev/null", 1, 3, 0o666)
        cpio.finish()

    def write_gzip(self, dest: Path, *, devices: bool) -> None:
        """Write the tree as a gzip'd cpio at ``dest``, atomically."""
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            with (
                open(tmp, "wb") as raw,
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz,
            ):
                self.write(gz, devices=devices)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def usr(path: str) -> str:
    """Where a host path lives in the guest, whose /bin, /sbin, /lib, /lib64 link into /usr."""
    for top in ("/bin/", "/sbin/", "/lib/", "/lib64/"):
        if path.startswith(top):
            return "/usr" + path
    return path


def shared_libraries(binary: str) -> list[str]:
    proc = subprocess.run(
        [tool("ldd", "libc-bin"), binary], capture_output=True, text=True, check=False, timeout=60
    )
    if "not a dynamic executable" in proc.stdout + proc.stderr:
        return []
    if proc.returncode != 0:
        raise GuestError(f"ldd {binary} failed: {proc.stdout}{proc.stderr}")
    libs: list[str] = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            name, _, rest = line.partition("=>")
            path = rest.strip().split(" (", 1)[0].strip()
            if path == "not found":
                raise GuestError(f"{binary} needs {name.strip()}, which ldd cannot find")
        else:
            path = line.split(" (", 1)[0].strip()
        if path.startswith("/"):
            libs.append(path)
    return libs


def add_binary(tree: Tree, host: str, guest: str) -> None:
    tree.add_file(guest, Path(os.path.realpath(host)), 0o755)
    for lib in shared_libraries(host):
        # Keep the name the loader asks for (e.g. libc.so.6) with the real file's content.
        tree.add_file(usr(lib), Path(os.path.realpath(lib)), 0o755)


def build_overlay_cpio(
    files: Mapping[str, bytes | str | Path], dest: Path, *, prefix: str = ""
) -> None:
    """A gzip'd cpio with extra files; appended to the base initramfs it adds or replaces them.

    Values are file contents (bytes or str) or a host path to copy. Files are executable.
    Paths under /bin, /sbin, /lib and /lib64 land in /usr, where those link to. With
    ``prefix``, the files land under that folder of the initramfs instead of its root.
    """
    tree = Tree()
    top = prefix.strip("/")
    for path, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        # A directory entry named like one of the base image's top-level symlinks would
        # make the kernel replace that symlink with an empty directory.
        name = usr("/" + path.lstrip("/"))
        tree.add_file(f"{top}/{name}" if top else name, data, 0o755)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        tree.write(gz, devices=False)


# --------------------------------------------------------------------------------------------
# Scripts every guest runs

# Loaded by the guest's init, in this order. brd is left out because loading it creates 16
# RAM disks; null_blk gets nr_devices=0 so setup_kernel_target() can create memory-backed
# devices. Names a kernel has built in (or lacks) only print a line on the console.
BOOT_MODULES: tuple[str, ...] = (
    "virtio_pci",
    "virtio_net",
    "virtio_console",
    "crc32c_generic",
    "crc32c_intel",
    "configfs",
    "nvme_tcp",
    "nvmet_tcp",
    "null_blk nr_devices=0",
    "loop",
)

_INIT_SCRIPT = r"""#!/bin/sh
# init of the pynvmf test guest (generated by tests/support/guest_assets.py).
export PATH=@PATH@
export HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
@MOUNTS@
# printk on the 8250 console is slow under TCG; tests read `dmesg` when they need it.
dmesg -n 1
while read -r mod args; do
    [ -n "$mod" ] || continue
    # shellcheck disable=SC2086
    modprobe "$mod" $args 2>/dev/null || echo "pynvmf-init: modprobe $mod failed"
done <<EOF
@BOOT_MODULES@
EOF
mount -t configfs configfs /sys/kernel/config
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
ip link set eth0 up
ip addr add @GUEST_ADDRESS@/24 dev eth0
ip route add default via @HOST_ADDRESS@
mkdir -p /etc/nvme
uuid=$(cat /proc/sys/kernel/random/uuid)
echo "nqn.2014-08.org.nvmexpress:uuid:$uuid" > /etc/nvme/hostnqn
echo "$uuid" > /etc/nvme/hostid
# Hook for files a test adds with Guest(extra_files=...).
if [ -x /etc/pynvmf/boot.sh ]; then /etc/pynvmf/boot.sh; fi
cd /root
# Commands travel over a virtio-serial port rather than the 8250 console: no tty layer
# (no line discipline, no flip-buffer limit) and no UART receive FIFO, whose emulation
# once left a request's bytes undelivered until more input arrived. The port appears
# asynchronously after virtio_console loads (the device announces it by a control message).
port=
i=0
while [ -z "$port" ] && [ "$i" -lt 200 ]; do
    for name in /sys/class/virtio-ports/*/name; do
        [ -r "$name" ] && [ "$(cat "$name")" = @COMMAND_PORT@ ] || continue
        dev=/dev/${name%/name}
        dev=/dev/${dev##*/}
        [ -c "$dev" ] && port=$dev
    done
    [ -n "$port" ] || sleep 0.05
    i=$((i + 1))
done
if [ -z "$port" ]; then
    echo "pynvmf-init: no virtio-serial port named @COMMAND_PORT@"
    exec poweroff -f
fi
# One open (the driver allows one at a time), shared by stdin, stdout and stderr.
exec 0<>"$port" 1>&0 2>&0
printf '%s_%s__\n' '__PYNVMF_READY' "$pynvmf_token"
exec @SERVE_PATH@
"""

# A request is a line "<seq> <timeout> <script length> <stdin length>" followed by the script
# and the command's stdin as raw bytes (the port is not a tty, so no byte is special).
# GNU dd reads exactly that many bytes: busybox `head -c` reads ahead and would swallow the
# next request. Each script runs in its own shell so `exit` or `set -e` cannot end the server.
SERVE_SCRIPT = r"""#!/bin/sh
# Command server on a virtio-serial port, driven by tests/support/guest.py.
while IFS=' ' read -r seq tmo len inlen; do
    [ -n "$inlen" ] || continue
    f=/tmp/.pynvmf-cmd-$seq
    dd of="$f" bs=65536 count="$len" iflag=count_bytes,fullblock status=none
    in=/dev/null
    if [ "$inlen" -gt 0 ]; then
        in=/tmp/.pynvmf-in-$seq
        dd of="$in" bs=65536 count="$inlen" iflag=count_bytes,fullblock status=none
    fi
    timeout -s KILL "$tmo" sh "$f" < "$in"
    rc=$?
    rm -f "$f" "/tmp/.pynvmf-in-$seq"
    printf '\n__PYNVMF_END_%s_%s_%s__\n' "$pynvmf_token" "$seq" "$rc"
done
"""


def init_script(*, path: str, mounts: Sequence[str] = ()) -> str:
    """The guest's init once its root filesystem is in place: modules, network, host NQN,
    then the command server. ``mounts`` are extra shell lines run after /dev is mounted."""
    return (
        _INIT_SCRIPT.replace("@PATH@", path)
        .replace("@MOUNTS@", "\n".join(mounts))
        .replace("@BOOT_MODULES@", "\n".join(BOOT_MODULES))
        .replace("@GUEST_ADDRESS@", GUEST_ADDRESS)
        .replace("@HOST_ADDRESS@", HOST_ADDRESS)
        .replace("@COMMAND_PORT@", COMMAND_PORT)
        .replace("@SERVE_PATH@", SERVE_PATH)
    )
