#!/usr/bin/env bash
# Lanes over two rails (the guest's A-B and A2-B2 wires), each
# rate-limited to RATE: one rail against two, twice each, SIZE_MIB; then
# the second rail cut at about a third of SIZE2_MIB (CUT_ONLY=1: that
# alone), with the time the remaining rail allows beside it: the cut's
# time, plus what two rails had not delivered by then, at one rail's
# goodput (measured by the one-rail runs; RATE_MIB with CUT_ONLY).
# The cut drops every packet, carrier up (RXFER_WIRE_CUT=link: the link
# taken down instead). Run INSIDE the SoftRoCE guest (scripts/guest/run.sh). Binaries
# from RXFER_BIN (default target/release).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${RXFER_BIN:-$here/target/release}
W=$here/scripts/guest/wire.sh
RATE_MIB=${RATE_MIB:-10}
RATE=${RATE_MIB}mibps
# One rail's goodput in MiB/s (set by the one-rail runs).
goodput=$RATE_MIB
SIZE_MIB=${SIZE_MIB:-128}
work=$(mktemp -d /dev/shm/rails.XXXX)
mkdir -p "$work/dst"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$work/file.bin"
want=$(sha256sum < "$work/file.bin" | cut -d' ' -f1)
echo "rails: A=$RXFER_ADDR_A B=$RXFER_ADDR_B A2=$RXFER_ADDR_A2 B2=$RXFER_ADDR_B2 rate=$RATE size=${SIZE_MIB}MiB loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
"$W" ab limit "$RATE"; "$W" ab2 limit "$RATE"
"$bin/receiver" --bind 0.0.0.0 --port 7999 --dir "$work/dst" --insecure > "$work/recv.log" 2>&1 &
rpid=$!
sleep 1
run() {
  rm -f "$work/dst/file.bin"
  local t0 t1
  t0=$(date +%s.%N)
  "$bin/sender" --port 7999 -v "$@" "$RXFER_ADDR_A" "$work/file.bin" > "$work/send.log" 2>&1 || { echo "sender failed:"; cat "$work/send.log"; }
  t1=$(date +%s.%N)
  got=$(sha256sum < "$work/dst/file.bin" | cut -d' ' -f1)
  took=$(echo "$t1 - $t0" | bc -l)
  [[ $* == *--lanes* ]] || goodput=$(echo "$SIZE_MIB / $took" | bc -l)
  echo "rails: $* -> $(echo "$t1 - $t0" | bc) s sha256 $([[ $got == "$want" ]] && echo equal || echo DIFFERS) lane_down=$(grep -c lane_down "$work/send.log" || true)"
}
if [[ -z ${CUT_ONLY:-} ]]; then
run --source "$RXFER_ADDR_B"
run --source "$RXFER_ADDR_B" --lanes 2 --rails "$RXFER_ADDR_B2=$RXFER_ADDR_A2"
run --source "$RXFER_ADDR_B"
run --source "$RXFER_ADDR_B" --lanes 2 --rails "$RXFER_ADDR_B2=$RXFER_ADDR_A2"
fi
# A rail cut at about a third of the transfer.
SIZE2=${SIZE2_MIB:-256}
head -c $((SIZE2 << 20)) /dev/urandom > "$work/file.bin"
want=$(sha256sum < "$work/file.bin" | cut -d' ' -f1)
rm -f "$work/dst/file.bin"
t0=$(date +%s.%N)
"$bin/sender" --port 7999 ${SENDER_LOG:+-vv} --source "$RXFER_ADDR_B" --lanes 2 --rails "$RXFER_ADDR_B2=$RXFER_ADDR_A2" "$RXFER_ADDR_A" "$work/file.bin" > "$work/send.log" 2>&1 &
spid=$!
# Two rails at RATE_MIB: a third of the file in about SIZE2/(6 RATE_MIB) s.
sleep "$(echo "$SIZE2 / (6 * $RATE_MIB)" | bc -l)"
tc_=$(date +%s.%N)
"$W" ab2 down
echo "rails: ab2 cut at $(echo "$tc_ - $t0" | bc) s"
wait "$spid" && rc=0 || rc=$?
t1=$(date +%s.%N)
got=$(sha256sum < "$work/dst/file.bin" 2>/dev/null | cut -d' ' -f1 || true)
cut_at=$(echo "$tc_ - $t0" | bc -l)
ideal=$(echo "$cut_at + ($SIZE2 - 2 * $goodput * $cut_at) / $goodput" | bc -l)
printf 'rails: the remaining rail allows %.2f s (cut at %.2f s, one rail %.2f MiB/s)\n' "$ideal" "$cut_at" "$goodput"
echo "rails: cut run rc=$rc took $(echo "$t1 - $t0" | bc) s sha256 $([[ $got == "$want" ]] && echo equal || echo DIFFERS) lane_down=$(grep -c lane_down "$work/send.log" || true)"
grep -E "lane_down|lane on|sending in pieces" "$work/send.log" | head -5; [[ -z ${SENDER_LOG:-} ]] || grep -iE "keepalive|probe|lane=1|error|retry|completion" "$work/send.log" | tail -20
"$W" ab2 up
kill "$rpid"; wait "$rpid" 2>/dev/null || true
"$W" ab unlimit; "$W" ab2 unlimit
rm -rf "$work"
