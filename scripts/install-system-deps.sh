#!/usr/bin/env bash
# Install the Debian packages the test suite needs (QEMU guest peer, NVMe tools).
#
# Idempotent: when everything is already installed it only asks dpkg, so it is
# cheap enough to run before every `make test`.
set -euo pipefail

PACKAGES=(
    qemu-system-x86   # runs Debian's kernel as an NVMe/TCP peer (tests/interop/guest.py)
    busybox-static    # the guest's userland
    nvme-cli          # copied into the guest initramfs
    fio               # copied into the guest initramfs
    cpio
    kmod              # depmod on the unpacked kernel, modprobe inside the guest
    iproute2
    xfsprogs
    xz-utils
    zstd
    coreutils         # GNU dd (oflag=direct) is copied into the guest
    ca-certificates   # apt-get download over https mirrors
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
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

echo "install-system-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
