#!/usr/bin/env bash
# Idempotent, non-interactive install of Debian packages (Debian 12, root).
# Usage: scripts/install-deps.sh [--build] [PKG...]
#   --build  the packages needed to build the crate: pkg-config, the verbs
#            and rdma_cm headers, and libclang 14 for rdma-sys's bindgen
#            (bindgen 0.59 breaks with clang >= 16).
# Skips apt entirely when everything is installed; `apt-get update` runs at
# most once; one retry after `dpkg --configure -a` (a dpkg hiccup on a fresh
# machine's first install was seen once).
set -euo pipefail

BUILD_PKGS=(pkg-config libibverbs-dev librdmacm-dev libclang1-14 libclang-common-14-dev
  ibverbs-providers)
pkgs=()
for a in "$@"; do
  case $a in
    --build) pkgs+=("${BUILD_PKGS[@]}") ;;
    *) pkgs+=("$a") ;;
  esac
done
[[ ${#pkgs[@]} -gt 0 ]] || exit 0

say() { echo "install-deps: $*" >&2; }

missing() {
  dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null |
    awk -v want="${pkgs[*]}" '
      $2 == "install" && $3 == "ok" && $4 == "installed" { ok[$1] = 1 }
      END { n = split(want, w, " "); for (i = 1; i <= n; i++) if (!(w[i] in ok)) print w[i] }'
}

mapfile -t todo < <(missing)
[[ ${#todo[@]} -eq 0 ]] && exit 0
SUDO=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { say "need root to install: ${todo[*]}"; exit 1; }
  SUDO=(sudo -n)
fi
say "installing: ${todo[*]}"
"${SUDO[@]}" apt-get update -qq </dev/null >&2 || { say "apt-get update failed"; exit 1; }
for attempt in 1 2; do
  if "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${todo[@]}" </dev/null >&2; then
    exit 0
  fi
  say "apt-get install failed (attempt $attempt)"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a </dev/null >&2 || true
  sleep 2
done
say "could not install: ${todo[*]}"
exit 1
