#!/usr/bin/env bash
# Relay chain benchmark, run INSIDE the SoftRoCE guest (`make bench`, part
# "relay"): one SIZE_MiB file from B to 1, 2 and 3 hosts with
# `sender --relay` (A; A then C; A, C then D: each host forwards over the
# next host's own wire, from its sending end), every wire rate-limited to
# RATE so that the links and not the emulated CPUs are the limit, then the
# same without a limit. Each run's copies are checked with SHA-256.
# Prints each makespan (sender start to exit), the ratios to one host
# (the model: one transfer plus a chunk per further host; direct copies
# would take 2x and 3x) and the bytes that left B per byte of the file.
# Usage: scripts/bench-relay.sh [-s SIZE_MiB] [-r RUNS]
# Env: RXFER_BENCH_RELAY_RATE (default 10mibps, as tc takes it).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZE_MIB=128 RUNS=1
rx_size_runs_opts "$@"
RATE=${RXFER_BENCH_RELAY_RATE:-10mibps}
here=$(cd "$(dirname "$0")" && pwd)
rx_xfer_init 7600 rxfer-relay
: "${RXFER_ADDR_C:?run inside the guest (wires C and D)}" "${RXFER_ADDR_D:?}"
A=$RX_A C=$RXFER_ADDR_C D=$RXFER_ADDR_D
SRC_C=$RXFER_SRC_C SRC_D=$RXFER_SRC_D NETDEV_B=$RXFER_NETDEV_B

token=$RX_WORK/token
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token"
chmod 600 "$token"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$RX_WORK/file.bin"
want=$(sha256sum <"$RX_WORK/file.bin" | cut -d' ' -f1)

pids=()
# shellcheck disable=SC2317  # invoked from the EXIT trap
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for w in ab c d; do "$here/guest/wire.sh" "$w" unlimit 2>/dev/null || true; done
  rx_xfer_cleanup
}
trap stop_all EXIT

# A serving receiver on $1:$2 into $3, forwarding from $4 (or nothing).
start_hop() {
  local addr=$1 port=$2 dir=$3 src=${4:-} log w extra=()
  log=$RX_WORK/receiver-$addr.log
  mkdir -p "$dir"
  [[ -n $src ]] && extra=(--relay-source "$src")
  "$RX_BIN/receiver" --bind "$addr" --port "$port" --dir "$dir" --token-file "$token" --allow-relay \
    "${extra[@]}" -v </dev/null >/dev/null 2>"$log" &
  pids+=($!)
  for ((w = 0; w < 600; w++)); do
    grep -q listening "$log" && return 0
    sleep 0.05
  done
  echo "bench-relay: the receiver on $addr did not start:" >&2
  cat "$log" >&2
  exit 1
}
start_hop "$A" 7601 "$RX_WORK/a" "$SRC_C"
start_hop "$C" 7602 "$RX_WORK/c" "$SRC_D"
start_hop "$D" 7603 "$RX_WORK/d"

tx_b() { cat "/sys/class/net/$NETDEV_B/statistics/tx_bytes"; }

# One run to the first $1 hosts: prints "SECONDS BYTES_FROM_B".
run_chain() {
  local n=$1 chain t0 t1 before after dir
  chain=$(printf '%s\n' "$A:7601" "$C:7602" "$D:7603" | head -n "$n" | paste -sd,)
  for dir in a c d; do rm -f "$RX_WORK/$dir/file.bin"; done
  before=$(tx_b)
  rx_now_us t0
  if ! "$RX_BIN/sender" "${RX_SOURCE[@]}" --token-file "$token" --relay "$chain" \
      "$RX_WORK/file.bin" </dev/null >/dev/null 2>"$RX_WORK/sender.log"; then
    echo "bench-relay: the sender failed:" >&2
    cat "$RX_WORK/sender.log" "$RX_WORK"/receiver-*.log >&2
    exit 1
  fi
  rx_now_us t1
  after=$(tx_b)
  for dir in a c d; do
    [[ $n == 1 && $dir != a ]] && continue
    [[ $n == 2 && $dir == d ]] && continue
    [[ $(sha256sum <"$RX_WORK/$dir/file.bin" | cut -d' ' -f1) == "$want" ]] ||
      { echo "bench-relay: host $dir's copy DIFFERS" >&2; exit 1; }
  done
  awk -v us="$((t1 - t0))" -v b="$((after - before))" 'BEGIN { printf "%.2f %d\n", us / 1e6, b }'
}

# The median over RUNS of run_chain $1: "SECONDS BYTES".
median_chain() {
  local i
  for ((i = 0; i < RUNS; i++)); do run_chain "$1"; done | sort -n |
    awk '{ s[NR] = $1; b[NR] = $2 } END { m = int((NR + 1) / 2); print s[m], b[m] }'
}

measure() {
  local label=$1 one two three s1 s2 s3 b1 b2 b3 size=$((SIZE_MIB << 20))
  one=$(median_chain 1) two=$(median_chain 2) three=$(median_chain 3)
  read -r s1 b1 <<<"$one"
  read -r s2 b2 <<<"$two"
  read -r s3 b3 <<<"$three"
  echo "relay $label: ${SIZE_MIB} MiB to 1 host ${s1} s, to 2 hosts ${s2} s, to 3 hosts ${s3} s (median of $RUNS)"
  awk -v s1="$s1" -v s2="$s2" -v s3="$s3" -v b1="$b1" -v b2="$b2" -v b3="$b3" -v size="$size" -v l="$label" \
    'BEGIN { printf "RESULT relay %s: makespan 2 hosts/1 host=%.2f 3 hosts/1 host=%.2f source wire bytes/file bytes: 1 host %.3f, 2 hosts %.3f, 3 hosts %.3f\n",
      l, s2 / s1, s3 / s1, b1 / size, b2 / size, b3 / size }'
}

echo "bench-relay: host load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in ab c d; do "$here/guest/wire.sh" "$w" limit "$RATE"; done
measure "wires limited to $RATE"
for w in ab c d; do "$here/guest/wire.sh" "$w" unlimit; done
measure "wires unlimited (CPU-bound guest)"
echo "bench-relay: load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# Each host's peak RSS over every run (the receiver says it as it exits,
# -v): bounded by its buffers, whatever the file's size.
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
for host in "$A" "$C" "$D"; do
  rss=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' "$RX_WORK/receiver-$host.log" | tail -1)
  echo "RESULT relay peak RSS $host: $((${rss:-0} >> 20)) MiB (its ring and staging registered)"
done
