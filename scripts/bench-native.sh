#!/usr/bin/env bash
# `make bench-native`: benches/per_byte.rs at native speed, with an ext4
# file system for the lane figures (buffered and O_DIRECT writes into one
# file). The ext4 is on a loop device over a file in /dev/shm, so no disk
# bounds the figures; the loop driver's own copy runs in a kernel thread
# (see docs/performance.md). That needs root, mkfs.ext4 and a loop
# device; without them (or with RXFER_BENCH_EXT4_DIR naming an ext4
# directory already) the bench runs as it can and says what it skipped.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cargo=${CARGO:-cargo}
bench() { "$cargo" bench --locked --bench per_byte; }
if [[ -n ${RXFER_BENCH_EXT4_DIR:-} ]]; then
  bench
  exit
fi
skip() {
  echo "bench-native: no ext4 figures: $*" >&2
  bench
  exit
}
[[ $(id -u) -eq 0 ]] || skip "a loop device needs root (or set RXFER_BENCH_EXT4_DIR=DIR on ext4)"
RX_APT_WHO=bench-native rx_apt_install e2fsprogs || true
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 is missing (e2fsprogs)"
img=$(mktemp /dev/shm/rxfer-bench-ext4.XXXXXX)
mnt=$(mktemp -d /tmp/rxfer-bench-ext4.XXXXXX)
mounted=0
cleanup() {
  if [[ $mounted -eq 1 ]] && ! umount "$mnt"; then
    echo "bench-native: cannot unmount $mnt: $img (1 GiB of memory) stays; umount it, then remove both" >&2
    return
  fi
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$img"
}
trap cleanup EXIT
# One input and one output of 256 MiB, with room; the image's pages taken
# now, not while the loop driver writes the figures' blocks.
fallocate -l 1G "$img"
# No lazy initialisation: its kernel thread would run during the figures.
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img"
if ! mount -o loop "$img" "$mnt"; then
  cleanup
  trap - EXIT
  skip "cannot mount an ext4 image on a loop device here"
fi
mounted=1
RXFER_BENCH_EXT4_DIR=$mnt bench
