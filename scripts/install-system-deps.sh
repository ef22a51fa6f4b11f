#!/usr/bin/env bash
# Install the Debian packages the test suite needs (QEMU guest peers, NVMe tools).
# The Linux 6.12 and 7 peers' own packages (trixie's and sid's nvme-cli, fio,
# ktls-utils...) are not installed here: tests/support/guest_debootstrap.py debootstraps
# them into the guests' images.
#
# Idempotent: when everything is already installed it only asks dpkg, so it is
# cheap enough to run before every `make test`.
set -euo pipefail

PACKAGES=(
    qemu-system-x86   # runs Debian's kernel as an NVMe/TCP peer (tests/support/guest.py)
    busybox-static    # the guest's userland
    nvme-cli          # copied into the guest initramfs
    fio               # copied into the guest initramfs
    cpio
    kmod              # depmod on the unpacked kernel, modprobe inside the guest
    iproute2
    xfsprogs          # mkfs.xfs: copy offload as a reflink on a loop-mounted XFS image
    e2fsprogs         # filefrag: shows the shared extents of a reflinked copy
    xz-utils
    zstd              # the Linux 6.12 and 7 kernels (trixie, sid) are zstd-compressed
    coreutils         # GNU dd (oflag=direct) is copied into the guest
    ca-certificates   # apt-get download over https mirrors
    gcc               # builds tests/interop/prtool.c (static) for the guest, and the
    libc6-dev         #   compiled build's extensions (make compiled: mypyc)
    python3-dev       # Python's C headers, for the compiled build
    debootstrap       # the Linux 6.12 and 7 peers' root filesystems (trixie, sid)
    debian-archive-keyring  # checks trixie's and sid's signatures (debootstrap, apt-get)
    openssl           # its named FFDHE groups check pynvmf's RFC 7919 primes (tests/unit/test_auth.py);
                      # s_server/s_client are TLS 1.3 PSK peers (tests/unit/test_tls_engine.py)
    ceph-mon          # the RBD backend's tests start a one-monitor, one-OSD cluster
    ceph-osd          #   (tests/support/ceph_cluster.py), without systemd
    ceph-common       # the ceph CLI, ceph-authtool, monmaptool
    python3-rados     # the rados/rbd bindings (no PyPI wheels), linked into the venv
    python3-rbd       #   by scripts/link-ceph-bindings.py (make setup)
    prometheus        # a real Prometheus scrapes the metrics endpoint (tests/protocol/test_prometheus.py)
)

# `--python`: only what `make setup` needs to create a virtual environment.
if [[ "${1:-}" == "--python" ]]; then
    PACKAGES=(python3 python3-venv python3-pip)
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

# The guest harness downloads the kernel package with apt-get, which needs package lists.
need_lists=0
if [[ "${1:-}" != "--python" ]] && ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
    need_lists=1
fi

# kTLS on the machine (pynvmf's TLS record layer moves into the kernel where it can):
# load the kernel's tls module where it has one. Kernels built without it (CONFIG_TLS
# unset) make pynvmf use its user-space record layer; the guest tests cover kTLS.
if [[ "${1:-}" != "--python" ]] && [[ $(id -u) -eq 0 ]] && ! grep -qs '^tls ' /proc/modules; then
    modprobe tls 2>/dev/null || true
fi

if [[ ${#missing[@]} -eq 0 && $need_lists -eq 0 ]]; then
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install-system-deps.sh: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "install-system-deps.sh: installing ${missing[*]}" >&2
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
