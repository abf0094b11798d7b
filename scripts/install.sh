#!/usr/bin/env bash
# Installs the built tools with their man pages and shell completions
# (`make install` runs it after `make build`):
#   $DESTDIR$PREFIX/bin/sender, receiver
#   $DESTDIR$PREFIX/share/man/man1/sender.1, receiver.1
#   $DESTDIR$PREFIX/share/bash-completion/completions/sender, receiver
#   $DESTDIR$PREFIX/share/zsh/site-functions/_sender, _receiver
#   $DESTDIR$PREFIX/share/fish/vendor_completions.d/sender.fish, receiver.fish
# Usage: [PREFIX=/usr/local] [DESTDIR=] scripts/install.sh [BUILD_DIR]
# BUILD_DIR (default target/release) holds sender, receiver and
# rdma-xfer-gen, which writes the man pages and completions from the same
# clap definitions the tools parse with.
set -euo pipefail
build=${1:-target/release}
prefix=${PREFIX:-/usr/local}
root="${DESTDIR:-}$prefix"
for b in sender receiver rdma-xfer-gen; do
  [[ -x $build/$b ]] || { echo "install: $build/$b not found: run make build first" >&2; exit 1; }
done
# Generate everything first, so that a failure installs nothing.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/man" "$tmp/bash" "$tmp/zsh" "$tmp/fish"
"$build/rdma-xfer-gen" man "$tmp/man" >/dev/null
for sh in bash zsh fish; do
  "$build/rdma-xfer-gen" completions "$sh" "$tmp/$sh" >/dev/null
done
install -d "$root/bin" "$root/share/man/man1" "$root/share/bash-completion/completions" \
  "$root/share/zsh/site-functions" "$root/share/fish/vendor_completions.d"
install -m 0755 "$build/sender" "$build/receiver" "$root/bin/"
install -m 0644 "$tmp/man/sender.1" "$tmp/man/receiver.1" "$root/share/man/man1/"
install -m 0644 "$tmp/bash/sender" "$tmp/bash/receiver" "$root/share/bash-completion/completions/"
install -m 0644 "$tmp/zsh/_sender" "$tmp/zsh/_receiver" "$root/share/zsh/site-functions/"
install -m 0644 "$tmp/fish/sender.fish" "$tmp/fish/receiver.fish" "$root/share/fish/vendor_completions.d/"
echo "installed sender and receiver (binaries, man pages, bash/zsh/fish completions) under $root"
