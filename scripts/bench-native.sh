#!/usr/bin/env bash
# `make bench-native`: benches/per_byte.rs at native speed, with an ext4
# file system for the lane figures (buffered and O_DIRECT writes into one
# file). The ext4 is on a loop device over a file in /dev/shm, so no disk
# bounds the figures; the loop driver's own copy runs in a kernel thread
# (see docs/performance.md). Needs root for the loop device, unless
# RXFER_BENCH_EXT4_DIR names an ext4 directory already.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cargo=${CARGO:-cargo}
if [[ -n ${RXFER_BENCH_EXT4_DIR:-} ]]; then
  exec "$cargo" bench --locked --bench per_byte
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "bench-native: the ext4 figures need root (a loop device), or RXFER_BENCH_EXT4_DIR=DIR on ext4" >&2
  exit 2
fi
RX_APT_WHO=bench-native rx_apt_install e2fsprogs
img=$(mktemp /dev/shm/rxfer-bench-ext4.XXXXXX)
mnt=$(mktemp -d /tmp/rxfer-bench-ext4.XXXXXX)
cleanup() {
  umount "$mnt" 2>/dev/null || true
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$img"
}
trap cleanup EXIT
# One input and one output of 256 MiB, with room; the image's pages taken
# now, not while the loop driver writes the figures' blocks.
fallocate -l 1G "$img"
# No lazy initialisation: its kernel thread would run during the figures.
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img"
mount -o loop "$img" "$mnt"
RXFER_BENCH_EXT4_DIR=$mnt "$cargo" bench --locked --bench per_byte
