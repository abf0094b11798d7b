#!/usr/bin/env bash
# Builds the Debian package (`make deb` runs it after building):
#   target/deb/rdma-xfer_VERSION_ARCH.deb
# VERSION is Cargo.toml's, ARCH `dpkg --print-architecture`'s. Its tree is
# what `make install PREFIX=/usr` installs (scripts/install.sh, the one file
# list), man pages gzipped, plus /etc/rdma-xfer (mode 0700, no token: the
# postinst says to run `rdma-xfer-gen token /etc/rdma-xfer/token`, where
# both tools and the unit look by default). Depends: what dpkg-shlibdeps
# finds for the binaries, which must be rdma-core's libraries and the C
# runtime only (checked: anything else fails the build), and
# ibverbs-providers (loaded with dlopen, so no binary names it).
# Maintainer: $DEBFULLNAME <$DEBEMAIL>, else git's user.name and user.email,
# else "rdma-xfer local build <USER@HOST>".
# Usage: scripts/deb.sh [BUILD_DIR]   (default target/release)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
die() { echo "deb: $*" >&2; exit 1; }
[[ ${1:-} != -* ]] || rx_usage 2
build=${1:-target/release}
build=$(cd "$build" && pwd) || die "build directory ${1:-target/release} not found: run make build-bins"

RX_APT_WHO=deb rx_apt_install dpkg-dev || die "needs dpkg-dev (dpkg-deb, dpkg-shlibdeps)"

# The package's runtime dependencies may only be these (the binaries'
# DT_NEEDED libraries as dpkg-shlibdeps maps them to packages).
allowed=(libc6 libgcc-s1 libibverbs1 librdmacm1)

version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -1)
[[ -n $version ]] || die "no version in Cargo.toml's [package]"
arch=$(dpkg --print-architecture)
name=${DEBFULLNAME:-$(git -C "$root" config user.name 2>/dev/null || true)}
email=${DEBEMAIL:-$(git -C "$root" config user.email 2>/dev/null || true)}
[[ -n $name ]] || name="rdma-xfer local build"
[[ -n $email ]] || email="$(id -un)@$(hostname)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# dpkg-shlibdeps expects the tree at debian/PACKAGE (with its DEBIAN/) next
# to a debian/control.
stage=$tmp/debian/rdma-xfer
DESTDIR=$stage PREFIX=/usr "$here/install.sh" "$build" >/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1
install -d -m 0700 "$stage/etc/rdma-xfer"
mkdir "$stage/DEBIAN"

printf 'Source: rdma-xfer\n\nPackage: rdma-xfer\nArchitecture: any\n' >"$tmp/debian/control"
shlibs=$(cd "$tmp" && dpkg-shlibdeps -O "${stage#"$tmp"/}"/usr/bin/*) ||
  die "dpkg-shlibdeps failed"
depends=${shlibs#shlibs:Depends=}
[[ $depends != "$shlibs" ]] || die "unexpected dpkg-shlibdeps output: $shlibs"
while read -r pkg; do
  [[ " ${allowed[*]} " == *" $pkg "* ]] ||
    die "a binary needs $pkg: the package may depend only on ${allowed[*]} (readelf -d shows NEEDED)"
done < <(tr ',|' '\n' <<<"$depends" | sed 's/^ *//; s/[ (].*//')

installed_kib=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: rdma-xfer
Version: $version
Architecture: $arch
Maintainer: $name <$email>
Installed-Size: $installed_kib
Depends: $depends, ibverbs-providers
Section: net
Priority: optional
Description: files over RDMA between two hosts
 sender and receiver move files host to host over RDMA (InfiniBand,
 RoCE, iWARP) with end-to-end checksums; rdma-xfer-gen makes their
 shared token. The receiver's systemd unit is installed, not enabled:
 make the token first: rdma-xfer-gen token /etc/rdma-xfer/token
EOF
install -m 0755 "$root/dist/debian/postinst" "$root/dist/debian/postrm" "$stage/DEBIAN/"
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"

out=$root/target/deb/rdma-xfer_${version}_$arch.deb
mkdir -p "$root/target/deb"
dpkg-deb --build --root-owner-group "$stage" "$out" >/dev/null
echo "built $out"
echo "install with: apt install $out   (then: rdma-xfer-gen token /etc/rdma-xfer/token)"
