#!/usr/bin/env bash
# docs/architecture.md is the map of the tree: it names every file under
# src/, tests/ (the compile-fail cases as their directory), benches/ and
# scripts/ by its path, and names no such path that does not exist.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/architecture.md
fail=0
while read -r f; do
  case $f in tests/compile_fail/*) continue ;; esac
  if ! grep -qF "\`$f\`" "$doc"; then
    echo "check-architecture: $doc does not name $f (one table row: its path, its job)" >&2
    fail=1
  fi
done < <(git ls-files --cached --others --exclude-standard src tests benches scripts)
# Every path the map names (code spans: the backquotes are literal).
# shellcheck disable=SC2016
named=$(grep -oE '`(src|tests|benches|scripts)/[^` ]+`' "$doc" | tr -d '`' | sed 's/[*].*//' | sort -u)
while read -r p; do
  if [[ ! -e $p ]]; then
    echo "check-architecture: $doc names $p, which does not exist" >&2
    fail=1
  fi
done <<<"$named"
[[ $fail == 0 ]] && echo "check-architecture: $doc names every file of the tree"
exit "$fail"
