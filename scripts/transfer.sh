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
#        the wire in the guest), SENDER_OPTS, RECEIVER_OPTS (with --discard
#        nothing is written: the receiver's verdict is the check),
#        RXFER_OUT_DIR (where the receiver writes; default a tmpfs dir), RXFER_BIN_DIR,
#        RXFER_SENDER_LOGS (a directory: each run's sender log is kept there
#        as sender-<run>.log; scripts/bench.sh reads the ACK timeout from it).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZE_MIB=256 RUNS=1
rx_size_runs_opts "$@"

read -r -a sender_opts <<<"${SENDER_OPTS:-}"
read -r -a receiver_opts <<<"${RECEIVER_OPTS:-}"
rx_xfer_init 7471 rxfer-transfer

head -c "$((SIZE_MIB << 20))" /dev/urandom >"$RX_WORK/random.bin"
want=$(sha256sum <"$RX_WORK/random.bin" | cut -d' ' -f1)
out=${RXFER_OUT_DIR:-$RX_WORK/out}
mkdir -p "$out"
discard=0
[[ " ${receiver_opts[*]} " == *" --discard "* ]] && discard=1

rates=()
for ((i = 1; i <= RUNS; i++)); do
  rm -f "$out/random.bin"
  rx_start_receiver --dir "$out" -v "${receiver_opts[@]}"
  rx_send_timed -v "${sender_opts[@]}" "$RX_A" "$RX_WORK/random.bin"
  if [[ -n ${RXFER_SENDER_LOGS:-} ]]; then cp "$RX_WORK/sender.log" "$RXFER_SENDER_LOGS/sender-$i.log"; fi
  checked='sha256 OK,'
  if ((discard)); then
    checked='verified and discarded,'
    [[ ! -e $out/random.bin ]] || { echo "transfer: --discard wrote a file" >&2; exit 1; }
    grep -q 'random.bin: .*discarded' "$RX_WORK/receiver.log" ||
      { echo "transfer: the receiver did not verify and discard:" >&2; cat "$RX_WORK/receiver.log" >&2; exit 1; }
  else
    got=$(sha256sum <"$out/random.bin" | cut -d' ' -f1)
    [[ $got == "$want" ]] || { echo "transfer: OUTPUT DIFFERS FROM INPUT" >&2; exit 1; }
    rm -f "$out/random.bin"
  fi
  rate=$(awk -v b="$((SIZE_MIB << 20))" -v us="$RX_TOOK_US" \
    'BEGIN { printf "%.1f", b / 1048576 / (us / 1e6) }')
  rss_s=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' "$RX_WORK/sender.log")
  rss_r=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' "$RX_WORK/receiver.log")
  # CPU seconds (user + system) per GiB moved, each side's whole process.
  cpu_per_gib() {
    sed -n 's/.*(cpu_s=\([0-9.]*\)).*/\1/p' "$1" |
      awk -v mib="$SIZE_MIB" '{ printf "%.2f", $1 / (mib / 1024) }'
  }
  cpu_s=$(cpu_per_gib "$RX_WORK/sender.log")
  cpu_r=$(cpu_per_gib "$RX_WORK/receiver.log")
  echo "run $i: ${SIZE_MIB} MiB ${RX_A}: $rate MiB/s start to ACK" \
    "(data phase $(grep -o '[0-9.]* MiB/s' "$RX_WORK/sender.log" | head -1))," \
    "$checked" \
    "peak RSS sender $((rss_s >> 20)) MiB, receiver $((rss_r >> 20)) MiB," \
    "CPU per GiB sender $cpu_s s, receiver $cpu_r s"
  rates+=("$rate")
done
median=$(printf '%s\n' "${rates[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "median_MiBps=$median"
