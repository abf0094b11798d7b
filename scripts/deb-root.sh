#!/usr/bin/env bash
# A clean Debian 12 root with `make deb`'s package installed in it, for
# tests/rdma/deb.rs to transfer with (`make e2e` runs it after `make deb`):
#   target/deb-root: debootstrap --variant=minbase bookworm (made once,
#   kept while its stamp is there), then the package installed with
#   apt-get from inside it, which takes its Depends from the Debian
#   mirror. Each run first purges the package and every dependency it
#   pulled in (--autoremove), so the root holds only minbase and what this
#   package declares: a dependency it forgot shows as a transfer that
#   fails in there.
# Usage: scripts/deb-root.sh [DEB]  (default: target/deb's package of
#   Cargo.toml's version)
# Env: RXFER_DEBIAN_MIRROR (default http://deb.debian.org/debian; a change
#   makes the root again), http_proxy/https_proxy (passed to apt inside).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
die() { echo "deb-root: $*" >&2; exit 1; }
[[ ${1:-} != -* ]] || rx_usage 2
if [[ $(id -u) != 0 ]]; then
  echo "deb-root: needs root (debootstrap, chroot): not made, so the guest's clean-root test is skipped" >&2
  exit 0
fi
deb=${1:-}
if [[ -z $deb ]]; then
  version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -1)
  deb=$root/target/deb/rdma-xfer_${version}_$(dpkg --print-architecture).deb
fi
[[ -f $deb ]] || die "$deb not found: run make deb"
mirror=${RXFER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
dir=$root/target/deb-root
stamp=$dir/.rxfer-base
log=$root/target/deb-root.log

# Mounts a killed debootstrap or test left inside, then the tree, never
# crossing into another file system.
remove_root() {
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    findmnt -rn -o TARGET | grep -F "$dir/" | sort -r || true)
  rm -rf --one-file-system "$dir"
}

RX_APT_WHO=deb-root rx_apt_install debootstrap || die "needs debootstrap"
if [[ ! -f $stamp || $(cat "$stamp") != "$mirror" ]]; then
  remove_root
  echo "deb-root: debootstrap bookworm into $dir (once; about 200 MB from $mirror)" >&2
  for attempt in 1 2; do
    if debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$log" 2>&1; then
      echo "$mirror" >"$stamp"
      break
    fi
    echo "deb-root: debootstrap failed (attempt $attempt): $(tail -3 "$log")" >&2
    remove_root
    sleep 2
  done
  [[ -f $stamp ]] || die "cannot make the Debian root (see $log)"
fi
# The host's name servers of today.
cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
cp "$deb" "$dir/tmp/rdma-xfer.deb"
in_root() {
  chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} "$@"
}
# An install cut short before, then the package and what it pulled in.
in_root dpkg --configure -a >>"$log" 2>&1 || true
if in_root dpkg-query -W rdma-xfer >/dev/null 2>&1; then
  in_root apt-get purge -y -q --autoremove rdma-xfer >>"$log" 2>&1 ||
    die "cannot purge the last package from the root (see $log)"
fi
rm -rf "$dir/etc/rdma-xfer"
for attempt in 1 2; do
  if in_root apt-get update -q >>"$log" 2>&1 &&
      in_root apt-get install -y -q --no-install-recommends /tmp/rdma-xfer.deb >>"$log" 2>&1; then
    # shellcheck disable=SC2016  # dpkg-query's format, not the shell's
    echo "deb-root: $(basename "$deb") installed in $dir with: $(in_root dpkg-query -W -f='${Package} ' libibverbs1 librdmacm1 ibverbs-providers rdma-xfer)" >&2
    exit 0
  fi
  echo "deb-root: apt-get install failed (attempt $attempt): $(tail -3 "$log")" >&2
  in_root dpkg --configure -a >>"$log" 2>&1 || true
  sleep 2
done
die "cannot install the package in the Debian root (see $log)"
