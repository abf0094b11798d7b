#!/usr/bin/env bash
# Idempotent, non-interactive install of Debian packages (Debian 12, root).
# Usage: scripts/install-deps.sh [--build] [--lint] [--guest] [PKG...]
#   --build  the packages needed to build the crate: pkg-config, the verbs
#            and rdma_cm headers, and libclang 14 for rdma-sys's bindgen
#            (bindgen 0.59 breaks with clang >= 16).
#   --lint   what `make lint` needs beyond those: shellcheck.
#   --guest  the host side of the SoftRoCE test guest (QEMU, busybox, kmod,
#            xz/zstd for the kernels, the rdma-core tools, perftest):
#            scripts/guest/prepare.sh.
# Skips apt entirely when everything is installed; `apt-get update` runs at
# most once; one retry after `dpkg --configure -a` (scripts/lib.sh).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD_PKGS=(pkg-config libibverbs-dev librdmacm-dev libclang1-14 libclang-common-14-dev
  ibverbs-providers)
LINT_PKGS=(shellcheck)
GUEST_PKGS=(qemu-system-x86 kmod xz-utils zstd busybox-static rdma-core ibverbs-utils
  ibverbs-providers rdmacm-utils perftest iproute2 cpio util-linux coreutils)
pkgs=()
for a in "$@"; do
  case $a in
    --build) pkgs+=("${BUILD_PKGS[@]}") ;;
    --lint) pkgs+=("${LINT_PKGS[@]}") ;;
    --guest) pkgs+=("${GUEST_PKGS[@]}") ;;
    -*) rx_usage 2 ;;
    *) pkgs+=("$a") ;;
  esac
done
[[ ${#pkgs[@]} -gt 0 ]] || exit 0
rx_apt_install "${pkgs[@]}"
