#!/usr/bin/env bash
# Prepare everything needed to boot the SoftRoCE test guest (see run.sh):
#   - host packages (QEMU, rdma-core tools, busybox, ...: install-deps.sh --guest),
#   - a stock Debian generic kernel unpacked into a private cache dir, one
#     dir per kernel: 6.1 (Debian 12, from the machine's own apt sources) or
#     6.12 (Debian 13, fetched through a private apt configuration that only
#     knows `trixie main`; the machine's apt sources are never changed),
#   - an uncompressed vmlinux (QEMU PVH boot skips in-guest decompression),
#   - a tiny initramfs that mounts the host's / over 9p and switch_roots.
# Idempotent; a re-run with everything in place takes well under a second.
#
# Usage: scripts/guest/prepare.sh [-q] [-k 6.1|6.12]
#   -k       the kernel (default: $RXFER_GUEST_KERNEL, else 6.1)
# Env:   RXFER_GUEST_DIR   cache dir (default <repo>/target/guest); kernel K
#                          goes to $RXFER_GUEST_DIR/K, with K/current.env
#        RXFER_GUEST_KERNEL  6.1 or 6.12 (see -k)
#        RXFER_GUEST_KPKG  kernel package to use instead of the newest
#                          linux-image-6.1.0-N-amd64[-unsigned] (or 6.12's)
#        RXFER_GUEST_MIRROR  Debian mirror for 6.12 (default
#                          http://deb.debian.org/debian)
set -euo pipefail

QUIET=0 KSEL=${RXFER_GUEST_KERNEL:-6.1}
while getopts 'qk:h' o; do
  case $o in
    q) QUIET=1 ;;
    k) KSEL=$OPTARG ;;
    *) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
  esac
done

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
# shellcheck source=scripts/lib.sh
. "$REPO/scripts/lib.sh"
RX_APT_WHO=prepare
GROOT=${RXFER_GUEST_DIR:-$REPO/target/guest}
GDIR=$GROOT/$KSEL
# Bump when the layout of the cache or the initramfs changes.
LAYOUT=5

log() { [[ $QUIET == 1 ]] || echo "prepare: $*" >&2; }
die() { echo "prepare: ERROR: $*" >&2; exit 1; }

case $KSEL in
  6.1 | 6.12) ;;
  *) die "unknown guest kernel '$KSEL' (RXFER_GUEST_KERNEL / -k): 6.1 or 6.12" ;;
esac

# apt for the kernel package: the machine's own configuration for 6.1;
# for 6.12 a private one (sources, lists and cache under $GDIR/apt) that only
# adds Debian 13's `trixie main` for this one download.
APT_OPTS=(-o APT::Sandbox::User=root)
if [[ $KSEL == 6.12 ]]; then
  APT_DIR=$GDIR/apt
  APT_OPTS+=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o Dir::Etc::sourceparts=/dev/null
    -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
    -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
    -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
    -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false
    -o Acquire::IndexTargets::deb::CNF::DefaultEnabled=false)
fi
KDEB_UPDATED=0
kernel_apt_update() {
  [[ $KDEB_UPDATED == 1 ]] && return 0
  KDEB_UPDATED=1
  if [[ $KSEL == 6.1 ]]; then
    rx_apt_update_once || die "apt-get update failed"
    return 0
  fi
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${RXFER_GUEST_MIRROR:-http://deb.debian.org/debian} trixie main" \
    >"$APT_DIR/sources.list"
  log "apt-get update (private: trixie main)"
  apt-get -q "${APT_OPTS[@]}" update </dev/null >"$APT_DIR/update.log" 2>&1 ||
    { cat "$APT_DIR/update.log" >&2; die "apt-get update (trixie) failed"; }
}

# Newest generic image package of the chosen kernel (never -cloud, -rt or
# -dbg); -unsigned preferred (same kernel, no signature).
pick_kernel_pkg() {
  local names re
  if [[ $KSEL == 6.1 ]]; then
    re='^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$'
    names=$(apt-cache pkgnames linux-image-6.1.0- 2>/dev/null | grep -E "$re" | sort -V || true)
    if [[ -z $names ]]; then
      kernel_apt_update
      names=$(apt-cache pkgnames linux-image-6.1.0- | grep -E "$re" | sort -V || true)
    fi
    [[ -n $names ]] || die "no linux-image-6.1.0-N-amd64 package in the apt lists"
    # sort -V puts "...-56-amd64" before "...-56-amd64-unsigned": the last
    # line is the newest ABI, preferring -unsigned.
    tail -n1 <<<"$names"
    return 0
  fi
  # 6.12: the suite's metapackage names the current image package.
  kernel_apt_update
  names=$(apt-cache "${APT_OPTS[@]}" depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-6\.12\.[0-9]*+deb13-amd64\)$/\1/p' | head -n1)
  [[ -n $names ]] || die "trixie's linux-image-amd64 does not depend on a linux-image-6.12.N+deb13-amd64"
  if apt-cache "${APT_OPTS[@]}" show "$names-unsigned" >/dev/null 2>&1; then
    echo "$names-unsigned"
  else
    echo "$names"
  fi
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
  # busybox insmod takes plain .ko only: decompress 6.12's .ko.xz (.ko.zst).
  local b
  while read -r m; do
    b=${m##*/}
    case $m in
      *.ko.xz) b=${b%.xz}; xz -dc "$m" >"$d/mod/$b" ;;
      *.ko.zst) b=${b%.zst}; zstd -dcq "$m" >"$d/mod/$b" ;;
      *.ko) cp "$m" "$d/mod/" ;;
      *) die "unexpected module file $m" ;;
    esac
    echo "$b" >>"$d/mod/order"
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
"$REPO/scripts/install-deps.sh" --guest || die "could not install the guest's host packages"
fast_ok && exit 0

mkdir -p "$GDIR"
# Serialise concurrent first runs; re-check under the lock.
exec 9>"$GDIR/.lock"
flock 9
if fast_ok; then exit 0; fi

KPKG=${RXFER_GUEST_KPKG:-}
if [[ -z $KPKG ]]; then
  # Reuse an already-unpacked kernel rather than fetching a newer one.
  for d in "$GDIR"/linux-image-*-amd64*/.unpacked; do
    [[ -f $d ]] && KPKG=$(basename "$(dirname "$d")")
  done
  [[ -n $KPKG ]] || KPKG=$(pick_kernel_pkg)
fi
KDIR=$GDIR/$KPKG
if [[ ! -f $KDIR/.unpacked ]]; then
  log "downloading $KPKG"
  dl=$(mktemp -d "$GDIR/dl.XXXXXX")
  # Sandbox user root: the _apt user may not be able to write the cache dir.
  if ! (cd "$dl" && apt-get download -q "${APT_OPTS[@]}" "$KPKG" </dev/null >"$dl/log" 2>&1); then
    kernel_apt_update
    (cd "$dl" && apt-get download -q "${APT_OPTS[@]}" "$KPKG" </dev/null >"$dl/log" 2>&1) ||
      { cat "$dl/log" >&2; rm -rf "$dl"; die "apt-get download $KPKG failed"; }
  fi
  log "unpacking $KPKG"
  rm -rf "$KDIR.tmp"
  mkdir -p "$KDIR.tmp/root"
  dpkg -x "$dl"/*.deb "$KDIR.tmp/root"
  rm -rf "$dl"
  # Merged /usr (6.12): modules under usr/lib/modules; depmod -b and
  # modprobe -d look under lib/modules.
  if [[ ! -e $KDIR.tmp/root/lib/modules && -d $KDIR.tmp/root/usr/lib/modules ]]; then
    mkdir -p "$KDIR.tmp/root/lib"
    ln -s ../usr/lib/modules "$KDIR.tmp/root/lib/modules"
  fi
  rm -rf "$KDIR"
  mv "$KDIR.tmp" "$KDIR"
  touch "$KDIR/.unpacked"
fi

KVER=
for d in "$KDIR"/root/lib/modules/*/modules.order; do
  [[ -f $d ]] && KVER=$(basename "$(dirname "$d")")
done
[[ -n $KVER ]] || die "no modules in $KDIR"
# The real directory (not through the lib/modules link): the guest links
# /lib/modules/KVER to it.
MODDIR=$(cd "$KDIR/root/lib/modules/$KVER" && pwd -P)
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
  echo "KSEL=$(sq "$KSEL")"
  echo "KVER=$(sq "$KVER")"
  echo "KERNEL=$(sq "$KERNEL")"
  echo "INITRD=$(sq "$INITRD")"
  echo "MODDIR=$(sq "$MODDIR")"
} >"$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "ready: $KVER ($KERNEL)"
