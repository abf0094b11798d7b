#!/usr/bin/env bash
# Prepare everything needed to boot the SoftRoCE test guest (see run.sh):
#   - host packages (QEMU, rdma-core tools, busybox, ...),
#   - a stock Debian 12 generic kernel unpacked into a private cache dir,
#   - an uncompressed vmlinux (QEMU PVH boot skips in-guest decompression),
#   - a tiny initramfs that mounts the host's / over 9p and switch_roots.
# Idempotent; a re-run with everything in place takes well under a second.
#
# Usage: scripts/guest/prepare.sh [-q]
# Env:   RXFER_GUEST_DIR   cache dir (default <repo>/target/guest)
#        RXFER_GUEST_KPKG  kernel package to use instead of the newest
#                          linux-image-6.1.0-N-amd64[-unsigned]
set -euo pipefail

QUIET=0
[[ "${1:-}" == "-q" ]] && QUIET=1

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
GDIR=${RXFER_GUEST_DIR:-$REPO/target/guest}
# Bump when the layout of the cache or the initramfs changes.
LAYOUT=4

HOST_PKGS=(qemu-system-x86 kmod xz-utils busybox-static rdma-core ibverbs-utils
  ibverbs-providers rdmacm-utils perftest iproute2 cpio util-linux coreutils)

log() { [[ $QUIET == 1 ]] || echo "prepare: $*" >&2; }
die() { echo "prepare: ERROR: $*" >&2; exit 1; }

SUDO=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null && SUDO=(sudo -n)
fi

missing_pkgs() {
  # One dpkg-query call (fast path); packages dpkg doesn't know print nothing.
  dpkg-query -W -f='${Package} ${Status}\n' "${HOST_PKGS[@]}" 2>/dev/null |
    awk -v want="${HOST_PKGS[*]}" '
      $2 == "install" && $3 == "ok" && $4 == "installed" { ok[$1] = 1 }
      END { n = split(want, w, " "); for (i = 1; i <= n; i++) if (!(w[i] in ok)) print w[i] }'
}

APT_UPDATED=0
apt_update_once() {
  [[ $APT_UPDATED == 1 ]] && return 0
  log "apt-get update"
  "${SUDO[@]}" apt-get update -qq </dev/null >&2 || die "apt-get update failed"
  APT_UPDATED=1
}

install_pkgs() {
  local missing
  mapfile -t missing < <(missing_pkgs)
  [[ ${#missing[@]} == 0 ]] && return 0
  [[ $(id -u) == 0 || ${#SUDO[@]} -gt 0 ]] || die "missing packages (${missing[*]}) and not root"
  apt_update_once
  log "installing: ${missing[*]}"
  local i
  # One retry: a dpkg hiccup on a fresh machine's first install was seen once.
  for i in 1 2; do
    if "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}" </dev/null >&2; then
      return 0
    fi
    log "apt-get install failed (attempt $i)"
    [[ $i == 1 ]] && { "${SUDO[@]}" dpkg --configure -a </dev/null >&2 || true; sleep 2; }
  done
  die "apt-get install failed: ${missing[*]}"
}

# Newest generic 6.1.0-N-amd64 image package (never -cloud, -rt or -dbg).
pick_kernel_pkg() {
  local names
  names=$(apt-cache pkgnames linux-image-6.1.0- 2>/dev/null |
    grep -E '^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$' | sort -V || true)
  if [[ -z $names ]]; then
    apt_update_once
    names=$(apt-cache pkgnames linux-image-6.1.0- |
      grep -E '^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$' | sort -V || true)
  fi
  [[ -n $names ]] || die "no linux-image-6.1.0-N-amd64 package in the apt lists"
  # sort -V puts "...-56-amd64" before "...-56-amd64-unsigned": the last
  # line is the newest ABI, preferring -unsigned (same kernel, no signature).
  tail -n1 <<<"$names"
}

# Little-endian unsigned integer of $3 bytes at offset $2 of file $1.
read_le() { od -An -t "u$3" -j "$2" -N "$3" "$1" | tr -d ' '; }

# Extract the ELF vmlinux from a bzImage: the compressed payload sits at
# (setup_sects+1)*512 + payload_offset (boot protocol >= 2.08).
extract_vmlinux() {
  local bz=$1 out=$2 setup poff plen start magic tmp
  [[ $(od -An -c -j 514 -N 4 "$bz" | tr -d ' ') == HdrS ]] || return 1
  setup=$(read_le "$bz" $((0x1f1)) 1)
  [[ $setup == 0 ]] && setup=4
  poff=$(read_le "$bz" $((0x248)) 4)
  plen=$(read_le "$bz" $((0x24c)) 4)
  start=$(((setup + 1) * 512 + poff))
  magic=$(od -An -t x1 -j "$start" -N 6 "$bz" | tr -d ' \n')
  tmp=$out.tmp
  # Kernel's make appends the 4-byte uncompressed size to every format but
  # gzip; strip it so strict decompressors don't choke on trailing bytes.
  case $magic in
    1f8b*) tail -c +$((start + 1)) "$bz" | head -c "$plen" | gzip -dc >"$tmp" 2>/dev/null || true ;;
    fd377a585a00) tail -c +$((start + 1)) "$bz" | head -c $((plen - 4)) | xz -dc --single-stream >"$tmp" ;;
    28b52ffd*) tail -c +$((start + 1)) "$bz" | head -c $((plen - 4)) | zstd -dcq >"$tmp" ;;
    02214c18*) tail -c +$((start + 1)) "$bz" | head -c $((plen - 4)) | lz4 -dcq >"$tmp" ;;
    425a68*) tail -c +$((start + 1)) "$bz" | head -c $((plen - 4)) | bzip2 -dc >"$tmp" ;;
    5d0000*) tail -c +$((start + 1)) "$bz" | head -c $((plen - 4)) | xz -dc --format=lzma >"$tmp" ;;
    *) return 1 ;;
  esac
  [[ $(od -An -t x1 -N 4 "$tmp" | tr -d ' \n') == 7f454c46 ]] || { rm -f "$tmp"; return 1; }
  mv "$tmp" "$out"
}

build_initramfs() {
  local kroot=$1 kver=$2 out=$3 d m
  d=$(mktemp -d "$GDIR/initramfs.XXXXXX")
  mkdir -p "$d"/{bin,dev,proc,sys,lower,upper,newroot,io,mod}
  cp /bin/busybox "$d/bin/busybox"
  for m in sh mount umount mkdir insmod switch_root ln sleep cat echo; do
    ln -s busybox "$d/bin/$m"
  done
  # Dependency order from the unpacked kernel's modules.dep, first seen wins.
  modprobe -d "$kroot" -S "$kver" -a --show-depends virtio_pci 9pnet_virtio 9p overlay |
    awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$d/mods.list"
  [[ -s $d/mods.list ]] || die "could not resolve initramfs modules"
  : >"$d/mod/order"
  while read -r m; do
    cp "$m" "$d/mod/"
    echo "${m##*/}" >>"$d/mod/order"
  done <"$d/mods.list"
  rm "$d/mods.list"
  write_init "$d/init"
  chmod 755 "$d/init"
  # Uncompressed: unpacking gzip under TCG costs more than copying ~3 MB.
  (cd "$d" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$out.tmp"
  mv "$out.tmp" "$out"
  rm -rf "$d"
}

# /init of the initramfs (busybox sh): load virtio/9p/overlay, mount the host's
# / read-only with a tmpfs overlay, mount the per-run writable share, then
# switch_root into bash running run.sh --guest-init (paths from /io/boot.conf).
write_init() {
  cat >"$1" <<'EOF'
#!/bin/sh
/bin/busybox mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
fail() { echo "rxfer-initramfs: FATAL: $*"; echo o >/proc/sysrq-trigger; sleep 5; exit 1; }
for m in $(cat /mod/order); do insmod "/mod/$m" || fail "insmod $m"; done
# virtio devices probe asynchronously-ish: retry the first mount briefly.
i=0
until mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none rxio /io 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 50 ] && fail "cannot mount 9p share rxio"; sleep 0.1
done
. /io/boot.conf || fail "no /io/boot.conf"
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=$ROOT_CACHE rxroot /lower || fail "mount 9p root"
mount -t tmpfs -o mode=0755,size=50% upper /upper || fail "mount upper"
mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w rootfs /newroot || fail "mount overlay"
mount -t tmpfs -o mode=1777,size=75% tmp /newroot/tmp
if [ -n "$SHOW_HOST_DIR" ]; then
  mkdir -p "/newroot$SHOW_HOST_DIR" && mount --bind "/lower$SHOW_HOST_DIR" "/newroot$SHOW_HOST_DIR" ||
    fail "cannot show $SHOW_HOST_DIR in the guest"
fi
mount -t tmpfs -o mode=0755,size=10% run /newroot/run
mkdir -p /newroot/run/rxfer-io /newroot/lib/modules
mount --move /io /newroot/run/rxfer-io
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o mode=0620,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
ln -sfn "$MODDIR" "/newroot/lib/modules/$KVER"
exec switch_root /newroot /bin/bash "$GUEST_INIT" --guest-init
fail "switch_root"
EOF
}

# ---------------------------------------------------------------- main
# Fast path: packages present and a complete cache of the current layout.
STAMP=$GDIR/current.env
fast_ok() {
  [[ -f $STAMP ]] || return 1
  local layout kernel initrd
  layout=$(sed -n 's/^LAYOUT=//p' "$STAMP")
  kernel=$(sed -n "s/^KERNEL='\(.*\)'$/\1/p" "$STAMP")
  initrd=$(sed -n "s/^INITRD='\(.*\)'$/\1/p" "$STAMP")
  [[ $layout == "$LAYOUT" && -f $kernel && -f $initrd && \
    $initrd -nt $SCRIPT_DIR/prepare.sh ]]
}
if fast_ok && [[ -z $(missing_pkgs) ]]; then
  exit 0
fi

install_pkgs
mkdir -p "$GDIR"
# Serialise concurrent first runs; re-check under the lock.
exec 9>"$GDIR/.lock"
flock 9
if fast_ok; then exit 0; fi

KPKG=${RXFER_GUEST_KPKG:-}
if [[ -z $KPKG ]]; then
  # Reuse an already-unpacked kernel rather than fetching a newer one.
  KPKG=
  for d in "$GDIR"/linux-image-6.1.0-*-amd64*/.unpacked; do
    [[ -f $d ]] && KPKG=$(basename "$(dirname "$d")")
  done
  [[ -n $KPKG ]] || KPKG=$(pick_kernel_pkg)
fi
KDIR=$GDIR/$KPKG
if [[ ! -f $KDIR/.unpacked ]]; then
  log "downloading $KPKG"
  dl=$(mktemp -d "$GDIR/dl.XXXXXX")
  # Sandbox user root: the _apt user may not be able to write the cache dir.
  if ! (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" </dev/null >"$dl/log" 2>&1); then
    apt_update_once
    (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" </dev/null >"$dl/log" 2>&1) ||
      { cat "$dl/log" >&2; rm -rf "$dl"; die "apt-get download $KPKG failed"; }
  fi
  log "unpacking $KPKG"
  rm -rf "$KDIR.tmp"
  mkdir -p "$KDIR.tmp/root"
  dpkg -x "$dl"/*.deb "$KDIR.tmp/root"
  rm -rf "$dl"
  rm -rf "$KDIR"
  mv "$KDIR.tmp" "$KDIR"
  touch "$KDIR/.unpacked"
fi

KVER=
for d in "$KDIR"/root/lib/modules/*/modules.order; do
  [[ -f $d ]] && KVER=$(basename "$(dirname "$d")")
done
[[ -n $KVER ]] || die "no modules in $KDIR"
MODDIR=$KDIR/root/lib/modules/$KVER
if [[ ! -f $MODDIR/modules.dep.bin || $MODDIR/modules.dep.bin -ot $KDIR/.unpacked ]]; then
  log "depmod $KVER"
  depmod -b "$KDIR/root" "$KVER"
fi

KERNEL=$KDIR/vmlinux
if [[ ! -f $KERNEL ]]; then
  log "extracting vmlinux"
  if ! extract_vmlinux "$KDIR/root/boot/vmlinuz-$KVER" "$KERNEL"; then
    log "vmlinux extraction failed; will boot the bzImage (slower)"
    KERNEL=$KDIR/root/boot/vmlinuz-$KVER
  fi
fi

INITRD=$KDIR/initramfs.cpio
log "building initramfs"
build_initramfs "$KDIR/root" "$KVER" "$INITRD"

sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
  echo "LAYOUT=$LAYOUT"
  echo "KVER=$(sq "$KVER")"
  echo "KERNEL=$(sq "$KERNEL")"
  echo "INITRD=$(sq "$INITRD")"
  echo "MODDIR=$(sq "$MODDIR")"
} >"$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "ready: $KVER ($KERNEL)"
