#!/usr/bin/env bash
# The unsafe fence: `unsafe` code is allowed only in sys::rdma and sys::os
# (src/sys/mod.rs says so); every other module of the library, and every
# binary, forbids it at its root (forbid cannot be lifted by an inner
# allow or expect).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
if grep -rnE '(allow|expect|warn)\([^)]*unsafe_code' src --include='*.rs' | grep -v '^src/sys/mod.rs:'; then
  echo "lint: unsafe_code may be allowed only in src/sys/mod.rs (for sys::rdma and sys::os)" >&2
  fail=1
fi
# The root file of each module declared in lib.rs and sys/mod.rs, except
# the fenced ones, and of each binary.
roots=()
for decl in src/lib.rs src/sys/mod.rs; do
  dir=$(dirname "$decl")
  while read -r name; do
    case "$decl:$name" in
      src/lib.rs:sys | src/sys/mod.rs:os | src/sys/mod.rs:rdma) continue ;;
    esac
    if [[ -f "$dir/$name.rs" ]]; then roots+=("$dir/$name.rs"); else roots+=("$dir/$name/mod.rs"); fi
  done < <(sed -nE 's/^(pub(\([a-z]+\))? )?mod ([a-z_0-9]+);.*/\3/p' "$decl")
done
for bin in src/bin/*.rs src/bin/*/main.rs; do roots+=("$bin"); done
for root in "${roots[@]}"; do
  if ! grep -q '^#!\[forbid(unsafe_code)\]' "$root"; then
    echo "lint: $root does not start with #![forbid(unsafe_code)]" >&2
    fail=1
  fi
done
echo "unsafe fence: ${#roots[@]} module and binary roots forbid unsafe code"
exit "$fail"
