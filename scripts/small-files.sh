#!/usr/bin/env bash
# Many small files vs one file of the same total size: N files of SIZE bytes
# in a tree (10 directories) sent with `sender -r`, then one file holding the
# same bytes, each to a `receiver --once`, each checked (diff -r / cmp).
# Prints files per second for the tree and the time ratio against the single
# file (medians of RUNS runs of each, alternating), and a RESULT line with
# the target (at most 2x). Used by scripts/bench.sh; run it where RDMA exists
# (inside the guest).
# Usage: scripts/small-files.sh [-n FILES] [-s SIZE_BYTES] [-r RUNS]
# Env:   RXFER_ADDR_A (receiver), RXFER_ADDR_B (sender's source), RXFER_BIN_DIR.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FILES=1000 SIZE=4096 RUNS=3
while getopts 'n:s:r:h' o; do
  case $o in
    n) FILES=$OPTARG ;;
    s) SIZE=$OPTARG ;;
    r) RUNS=$OPTARG ;;
    *) rx_usage 2 ;;
  esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "small-files: -r wants a count of runs, got '$RUNS'" >&2; exit 2; }

rx_xfer_init 7472 rxfer-small
work=$RX_WORK
mkdir -p "$work/tree" "$work/one"
head -c "$((FILES * SIZE))" /dev/urandom >"$work/one/all.bin"
# Few processes: each one is slow to start under emulation.
per_dir=$(((FILES + 9) / 10))
split -b "$((per_dir * SIZE))" -d -a 1 "$work/one/all.bin" "$work/part"
for part in "$work"/part*; do
  d="$work/tree/d${part##*part}"
  mkdir -p "$d"
  split -b "$SIZE" -d -a 4 "$part" "$d/f"
  rm "$part"
done

# One receiver --once into $1, then the sender with the remaining arguments;
# sets `took` to the sender's wall time in seconds.
timed_transfer() {
  local out=$1
  shift
  mkdir -p "$out"
  rx_start_receiver --dir "$out" -v
  rx_send_timed -q "$@"
  took=$(awk -v us="$RX_TOOK_US" 'BEGIN { printf "%.3f", us / 1e6 }')
}

# The median of the numbers on stdin (of an even count, the lower middle).
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

trees=() ones=()
for ((run = 1; run <= RUNS; run++)); do
  rm -rf "$work/out-tree" "$work/out-one"
  timed_transfer "$work/out-tree" -r "$RX_A" "$work/tree"
  trees+=("$took")
  diff -r "$work/tree" "$work/out-tree/tree" >/dev/null || { echo "small-files: tree differs" >&2; exit 1; }
  timed_transfer "$work/out-one" "$RX_A" "$work/one/all.bin"
  ones+=("$took")
  cmp -s "$work/one/all.bin" "$work/out-one/all.bin" || { echo "small-files: file differs" >&2; exit 1; }
  echo "small-files run $run: tree ${trees[-1]} s, one file $took s"
done
tree_s=$(printf '%s\n' "${trees[@]}" | median)
one_s=$(printf '%s\n' "${ones[@]}" | median)

awk -v n="$FILES" -v sz="$SIZE" -v t="$tree_s" -v o="$one_s" -v runs="$RUNS" 'BEGIN {
  printf "SMALL-FILES %d files of %d B (%.1f MiB) as a tree: %.2f s, %.0f files/s; as one file: %.2f s (medians of %d)\n",
    n, sz, n * sz / 1048576, t, n / t, o, runs
  r = t / o
  printf "RESULT small-files tree/file time ratio=%.2f (target <= 2: %s)\n", r, (r <= 2 ? "met" : "not met")
}'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
