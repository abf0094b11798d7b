#!/usr/bin/env bash
# A real transfer: a random file, sender (from B) -> receiver (on A), RUNS
# times, each output checked with SHA-256 against the input. Prints one line
# per run and finally `median_MiBps=<x>`. Used by `make demo` and by
# scripts/bench.sh; run it where RDMA exists (inside the guest, or on a host
# with an ACTIVE RDMA device).
#
# Throughput = file size / the sender's wall time from process start to its
# exit after the receiver's ACK (connection set-up included).
#
# Usage: scripts/transfer.sh [-s SIZE_MiB] [-r RUNS]
# Env:   RXFER_ADDR_A (receiver) and RXFER_ADDR_B (sender's source; crossing
#        the wire in the guest), SENDER_OPTS, RECEIVER_OPTS, RXFER_BIN_DIR.
set -euo pipefail

SIZE_MIB=256 RUNS=1
while getopts 's:r:h' o; do
  case $o in
    s) SIZE_MIB=$OPTARG ;;
    r) RUNS=$OPTARG ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${RXFER_BIN_DIR:-$root/target/release}
A=${RXFER_ADDR_A:?set RXFER_ADDR_A (receiver address) or run inside the guest}
source_opt=()
[[ -n ${RXFER_ADDR_B:-} ]] && source_opt=(--source "$RXFER_ADDR_B")
read -r -a sender_opts <<<"${SENDER_OPTS:-}"
read -r -a receiver_opts <<<"${RECEIVER_OPTS:-}"
port=${RXFER_PORT:-7471}

# tmpfs when possible, so the disk does not limit the measurement.
work=$(mktemp -d "${TMPDIR:-/tmp}/rxfer-transfer.XXXXXX")
rpid=
cleanup() {
  [[ -n $rpid ]] && kill "$rpid" 2>/dev/null
  rm -rf "$work"
  return 0
}
trap cleanup EXIT

head -c "$((SIZE_MIB << 20))" /dev/urandom >"$work/random.bin"
want=$(sha256sum <"$work/random.bin" | cut -d' ' -f1)
mkdir "$work/out"

rates=()
for ((i = 1; i <= RUNS; i++)); do
  rm -f "$work/out/random.bin"
  "$bin/receiver" --once --bind "$A" --port "$port" --dir "$work/out" -v "${receiver_opts[@]}" \
    2>"$work/receiver.log" &
  rpid=$!
  for ((w = 0; w < 600; w++)); do
    grep -q listening "$work/receiver.log" && break
    sleep 0.05
  done
  t0=$(date +%s%N)
  if ! "$bin/sender" "${source_opt[@]}" --port "$port" -v "${sender_opts[@]}" "$A" \
      "$work/random.bin" 2>"$work/sender.log"; then
    echo "transfer: sender failed:" >&2
    cat "$work/sender.log" "$work/receiver.log" >&2
    exit 1
  fi
  t1=$(date +%s%N)
  wait "$rpid" || { echo "transfer: receiver failed:" >&2; cat "$work/receiver.log" >&2; exit 1; }
  rpid=
  got=$(sha256sum <"$work/out/random.bin" | cut -d' ' -f1)
  [[ $got == "$want" ]] || { echo "transfer: OUTPUT DIFFERS FROM INPUT" >&2; exit 1; }
  rate=$(awk -v b="$((SIZE_MIB << 20))" -v ns="$((t1 - t0))" \
    'BEGIN { printf "%.1f", b / 1048576 / (ns / 1e9) }')
  rss_s=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' "$work/sender.log")
  rss_r=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' "$work/receiver.log")
  echo "run $i: ${SIZE_MIB} MiB ${A}: $rate MiB/s start to ACK" \
    "(data phase $(grep -o '[0-9.]* MiB/s' "$work/sender.log" | head -1)), sha256 OK," \
    "peak RSS sender $((rss_s >> 20)) MiB, receiver $((rss_r >> 20)) MiB"
  rates+=("$rate")
done
median=$(printf '%s\n' "${rates[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "median_MiBps=$median"
