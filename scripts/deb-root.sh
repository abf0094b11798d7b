#!/usr/bin/env bash
# A clean Debian 12 root with `make deb`'s package installed in it, for
# tests/rdma/deb.rs to transfer with (`make e2e` runs it after `make deb`):
#   target/deb-root: debootstrap --variant=minbase bookworm (made once,
#   kept while its stamp is there), then the package installed with
#   apt-get from inside it, which takes its Depends from the Debian
#   mirror and nothing else: a dependency the package forgot to declare
#   shows as a transfer that fails in there.
# Usage: scripts/deb-root.sh [DEB]  (default: target/deb/rdma-xfer_*.deb)
# Env: RXFER_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
die() { echo "deb-root: $*" >&2; exit 1; }
[[ ${1:-} != -* ]] || rx_usage 2
deb=${1:-}
if [[ -z $deb ]]; then
  debs=("$root"/target/deb/rdma-xfer_*.deb)
  [[ -f ${debs[0]} ]] || die "no target/deb/rdma-xfer_*.deb: run make deb"
  deb=${debs[0]}
fi
[[ -f $deb ]] || die "$deb not found"
[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot)"
mirror=${RXFER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
dir=$root/target/deb-root
stamp=$dir/.rxfer-base

RX_APT_WHO=deb-root rx_apt_install debootstrap || die "needs debootstrap"
if [[ ! -f $stamp ]]; then
  rm -rf "$dir"
  echo "deb-root: debootstrap bookworm into $dir (once; about 200 MB)" >&2
  for attempt in 1 2; do
    if debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$root/target/deb-root.log" 2>&1; then
      touch "$stamp"
      break
    fi
    echo "deb-root: debootstrap failed (attempt $attempt): $(tail -3 "$root/target/deb-root.log")" >&2
    rm -rf "$dir"
    sleep 2
  done
  [[ -f $stamp ]] || die "cannot make the Debian root (see target/deb-root.log)"
fi
# Installed afresh each time: the package may have changed.
cp "$deb" "$dir/tmp/rdma-xfer.deb"
in_root() { chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
in_root dpkg --purge rdma-xfer >/dev/null 2>&1 || true
rm -f "$dir/etc/rdma-xfer/token"
for attempt in 1 2; do
  if in_root apt-get update -q >/dev/null &&
      in_root apt-get install -y -q --no-install-recommends /tmp/rdma-xfer.deb >"$root/target/deb-root.log" 2>&1; then
    # shellcheck disable=SC2016  # dpkg-query's format, not the shell's
    echo "deb-root: $(basename "$deb") installed in $dir with: $(in_root dpkg-query -W -f='${Package} ' libibverbs1 librdmacm1 ibverbs-providers rdma-xfer)" >&2
    exit 0
  fi
  echo "deb-root: apt-get install failed (attempt $attempt): $(tail -3 "$root/target/deb-root.log")" >&2
  sleep 2
done
die "cannot install the package in the Debian root (see target/deb-root.log)"
