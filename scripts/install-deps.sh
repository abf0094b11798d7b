#!/usr/bin/env bash
# Idempotent, non-interactive install of Debian packages (Debian 12, root).
# Usage: scripts/install-deps.sh [--build] [--lint] [--unit] [--guest] [PKG...]
#   --build  the packages needed to build the crate: pkg-config, the verbs
#            and rdma_cm headers, and libclang 14 for rdma-sys's bindgen
#            (bindgen 0.59 breaks with clang >= 16).
#   --lint   what `make lint` needs beyond those: shellcheck.
#   --unit   what `make unit` needs beyond them: systemd-analyze (systemd)
#            and groff (groff-base), which check the installed unit and man
#            pages (tests/install.rs).
#   --guest  the host side of the SoftRoCE test guest (QEMU, busybox, kmod,
#            xz/zstd for the kernels, the rdma-core tools, perftest, tmux for
#            the progress-bar test, the ssh client of the one-command tests,
#            rsync and netcat for the peers' test, tests/rdma/peers.rs):
#            scripts/guest/prepare.sh.
# Skips apt entirely when everything is installed; `apt-get update` runs at
# most once; one retry after `dpkg --configure -a` (scripts/lib.sh). Without
# root (and without sudo that asks no password) it names what is missing
# and the command that installs it, and fails. Off Debian (no dpkg) it
# checks nothing: --build, --lint and --unit say so and go on (the build
# names what it lacks), the others fail.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILD_PKGS=(pkg-config libibverbs-dev librdmacm-dev libclang1-14 libclang-common-14-dev
  ibverbs-providers)
LINT_PKGS=(shellcheck)
UNIT_PKGS=(systemd groff-base)
GUEST_PKGS=(qemu-system-x86 kmod xz-utils zstd busybox-static rdma-core ibverbs-utils
  ibverbs-providers rdmacm-utils perftest iproute2 cpio util-linux coreutils tmux
  openssh-client rsync netcat-openbsd)
pkgs=()
# Whether going on without these packages is possible (a build says itself
# what it lacks; the guest's tools are not optional).
optional=1
for a in "$@"; do
  case $a in
    --build) pkgs+=("${BUILD_PKGS[@]}") ;;
    --lint) pkgs+=("${LINT_PKGS[@]}") ;;
    --unit) pkgs+=("${UNIT_PKGS[@]}") ;;
    --guest) pkgs+=("${GUEST_PKGS[@]}"); optional=0 ;;
    -*) rx_usage 2 ;;
    *) pkgs+=("$a"); optional=0 ;;
  esac
done
[[ ${#pkgs[@]} -gt 0 ]] || exit 0
status=0
rx_apt_install "${pkgs[@]}" || status=$?
if [[ $status == 2 && $optional == 1 ]]; then
  rx_apt_say "install your distribution's equivalents of these (the README lists them); going on"
  exit 0
fi
exit "$status"
