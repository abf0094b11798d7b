#!/usr/bin/env bash
# Installs the built tools with their man pages, shell completions and the
# receiver's systemd unit (`make install` runs it after building):
#   $DESTDIR$PREFIX/bin/sender, receiver, rdma-xfer-gen (makes tokens)
#   $DESTDIR$PREFIX/share/man/man1/sender.1, receiver.1
#   $DESTDIR$PREFIX/share/bash-completion/completions/sender, receiver
#   $DESTDIR$PREFIX/share/zsh/site-functions/_sender, _receiver
#   $DESTDIR$PREFIX/share/fish/vendor_completions.d/sender.fish, receiver.fish
#   rdma-xfer-receiver.service (ExecStart=$PREFIX/bin/receiver), never
#     enabled or started: in $DESTDIR$PREFIX/lib/systemd/system for PREFIX
#     /usr or /usr/local (where systemd looks), else in
#     $DESTDIR$PREFIX/share/rdma-xfer/systemd (to copy to /etc/systemd/system).
# Needs no root when PREFIX (or DESTDIR) is writable: PREFIX=$HOME/.local.
# Usage: [PREFIX=/usr/local] [DESTDIR=] scripts/install.sh [BUILD_DIR]
#        [PREFIX=/usr/local] [DESTDIR=] scripts/install.sh --uninstall
# BUILD_DIR (default target/release) holds sender, receiver and
# rdma-xfer-gen, which writes the man pages and completions from the same
# clap definitions the tools parse with. --uninstall removes exactly the
# files an install with the same PREFIX and DESTDIR puts there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "install: $*" >&2; exit 1; }
uninstall=0
if [[ ${1:-} == --uninstall ]]; then
  uninstall=1
  shift
fi
[[ ${1:-} != -* ]] || { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }
build=${1:-target/release}
prefix=${PREFIX:-/usr/local}
prefix=${prefix%/}
# The prefix is written into the unit's ExecStart=, where whitespace, quotes,
# % (specifiers), $ (variables) and \ (escapes) would change its meaning.
[[ $prefix == /* ]] || die "PREFIX must be an absolute path, got '$prefix'"
[[ $prefix != *[[:space:]\"\'%\$\\]* ]] ||
  die "PREFIX must not contain whitespace, quotes, %, \$ or \\ (it goes into the systemd unit): '$prefix'"
root="${DESTDIR:-}$prefix"
unit=rdma-xfer-receiver.service
case $prefix in
  /usr | /usr/local) unit_dir=lib/systemd/system ;;
  *) unit_dir=share/rdma-xfer/systemd ;;
esac

# Every installed file, relative to $root (the one list install and
# uninstall share).
files=(
  bin/sender bin/receiver bin/rdma-xfer-gen
  share/man/man1/sender.1 share/man/man1/receiver.1
  share/bash-completion/completions/sender share/bash-completion/completions/receiver
  share/zsh/site-functions/_sender share/zsh/site-functions/_receiver
  share/fish/vendor_completions.d/sender.fish share/fish/vendor_completions.d/receiver.fish
  "$unit_dir/$unit"
)

if [[ $uninstall == 1 ]]; then
  for f in "${files[@]}"; do
    if [[ -e $root/$f || -L $root/$f ]]; then
      rm -f "$root/$f"
      echo "removed $root/$f"
    fi
  done
  # Only the directories that are rdma-xfer's own, and only when empty.
  rmdir "$root/share/rdma-xfer/systemd" "$root/share/rdma-xfer" 2>/dev/null || true
  exit 0
fi

for b in sender receiver rdma-xfer-gen; do
  [[ -x $build/$b ]] || die "$build/$b not found: run make build first"
done
# Everything is generated into a staging tree first, so that a failure
# installs nothing.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/tree
mkdir -p "$stage/bin" "$stage/share/man/man1" "$stage/share/bash-completion/completions" \
  "$stage/share/zsh/site-functions" "$stage/share/fish/vendor_completions.d" "$stage/$unit_dir"
cp "$build/sender" "$build/receiver" "$build/rdma-xfer-gen" "$stage/bin/"
"$build/rdma-xfer-gen" man --unit "$prefix/$unit_dir/$unit" "$stage/share/man/man1" >/dev/null
"$build/rdma-xfer-gen" completions bash "$stage/share/bash-completion/completions" >/dev/null
"$build/rdma-xfer-gen" completions zsh "$stage/share/zsh/site-functions" >/dev/null
"$build/rdma-xfer-gen" completions fish "$stage/share/fish/vendor_completions.d" >/dev/null
# The prefix has no character sed treats specially in a replacement but &
# and | (checked above for the others).
bindir=$prefix/bin
bindir=${bindir//&/\\&}
bindir=${bindir//|/\\|}
sed "s|@BINDIR@|$bindir|g" "$here/../dist/systemd/$unit.in" >"$stage/$unit_dir/$unit"
! grep -n '@[A-Z]*@' "$stage/$unit_dir/$unit" || die "unsubstituted placeholder in $unit"
for f in "${files[@]}"; do
  [[ -f $stage/$f ]] || die "$f was not generated"
  mode=0644
  [[ $f == bin/* ]] && mode=0755
  install -D -m "$mode" "$stage/$f" "$root/$f"
done
echo "installed sender and receiver (binaries, man pages, bash/zsh/fish completions) and rdma-xfer-gen under $root"
echo "systemd unit (not enabled): $root/$unit_dir/$unit"
if [[ $unit_dir != lib/systemd/system ]]; then
  echo "  systemd does not look there: copy it to /etc/systemd/system to use it"
fi
# ProtectHome=yes hides these from the service, its ExecStart= binary too.
case $prefix in
  /home/* | /root | /root/* | /run/user/*)
    echo "  but the service cannot run $prefix/bin/receiver (ProtectHome=yes hides $prefix):"
    echo "  for the service, install with PREFIX=/usr/local"
    ;;
esac
