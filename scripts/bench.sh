#!/usr/bin/env bash
# Benchmark: ib_write_bw vs sender -> receiver over the same path in the same
# guest boot. Run INSIDE the SoftRoCE guest (`make bench` does that).
#   1. ib_write_bw RC, 1 MiB messages, B -> A across the veth wire, IPv4
#      RoCEv2 GID (scripts/guest/ib-write-bw.sh), before the tool runs;
#   2. scripts/transfer.sh: a 256 MiB random file tmpfs -> tmpfs, RUNS times;
#   3. ib_write_bw again, after;
#   4. scripts/small-files.sh: 1000 x 4 KiB files as a tree vs one file;
#   5. 1% packet loss each way (netem on both ends of the wire): ib_write_bw
#      (perftest's defaults, ACK timeout 2^14) before and after, the tool
#      with its defaults (LOSS_RUNS runs of LOSS_MIB) in between.
# Software RDMA under emulation drifts by 10-20% within one boot, so the
# baseline is the mean of the measurements before and after, and the tool's
# figure is the median of its runs.
# Prints both throughputs and ratio = median tool throughput / ib_write_bw.
# Usage: scripts/bench.sh [-s SIZE_MiB] [-r RUNS]
# Env (RXFER_* pass into the guest): RXFER_BENCH_PARTS (default
#   "file small loss": which of 1-3, 4 and 5 to run), RXFER_BENCH_LOSS_MIB
#   (LOSS_MIB, default 32), RXFER_BENCH_LOSS_RUNS (LOSS_RUNS, default 3).
set -euo pipefail

SIZE_MIB=256 RUNS=5
while getopts 's:r:h' o; do
  case $o in
    s) SIZE_MIB=$OPTARG ;;
    r) RUNS=$OPTARG ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)

ib_write_bw() {
  local v
  v=$("$here/guest/ib-write-bw.sh" "$@" | sed -n 's/^ib_write_bw_MiBps=//p')
  [[ -n $v ]] || { echo "bench: ib_write_bw gave no result" >&2; exit 1; }
  echo "$v"
}

PARTS=" ${RXFER_BENCH_PARTS:-file small loss} "
if [[ $PARTS == *" file "* ]]; then
  before=$(ib_write_bw)
  echo "ib_write_bw before (RC, 1 MiB, B->A wire): $before MiB/s"
  out=$("$here/transfer.sh" -s "$SIZE_MIB" -r "$RUNS")
  grep -v '^median_MiBps=' <<<"$out"
  after=$(ib_write_bw)
  echo "ib_write_bw after: $after MiB/s"
  tool=$(sed -n 's/^median_MiBps=//p' <<<"$out")
  ibw=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", (a + b) / 2 }')
  ratio=$(awk -v t="$tool" -v i="$ibw" 'BEGIN { printf "%.2f", t / i }')
  echo "RESULT ib_write_bw=$ibw MiB/s (mean of before/after) rdma-xfer=$tool MiB/s (median of $RUNS, ${SIZE_MIB} MiB) ratio=$ratio"
  
fi

# Many small files against one file of the same size (files per second).
if [[ $PARTS == *" small "* ]]; then "$here/small-files.sh"; fi
[[ $PARTS == *" loss "* ]] || exit 0

# Under 1% loss each way. The ratio compares what each gets start to end
# of its own measurement (ib_write_bw: its data phase; the tool: process
# start to ACK, connection set-up under loss included).
LOSS_MIB=${RXFER_BENCH_LOSS_MIB:-32} LOSS_RUNS=${RXFER_BENCH_LOSS_RUNS:-3}
wire=("${RXFER_NETDEV_A:-veth0}" "${RXFER_NETDEV_B:-veth1}")
lossy() {
  local d
  for d in "${wire[@]}"; do
    if [[ $1 == on ]]; then tc qdisc replace dev "$d" root netem loss 1%; else tc qdisc del dev "$d" root 2>/dev/null || true; fi
  done
}
trap 'lossy off' EXIT
lossy on
before=$(ib_write_bw -n "$LOSS_MIB")
echo "loss 1%: ib_write_bw before: $before MiB/s"
out=$("$here/transfer.sh" -s "$LOSS_MIB" -r "$LOSS_RUNS")
grep -v '^median_MiBps=' <<<"$out" | sed 's/^/loss 1%: /'
after=$(ib_write_bw -n "$LOSS_MIB")
echo "loss 1%: ib_write_bw after: $after MiB/s"
lossy off
tool=$(sed -n 's/^median_MiBps=//p' <<<"$out")
ibw=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", (a + b) / 2 }')
ratio=$(awk -v t="$tool" -v i="$ibw" 'BEGIN { printf "%.2f", t / i }')
echo "RESULT loss=1% kernel=$(uname -r) ib_write_bw=$ibw MiB/s rdma-xfer=$tool MiB/s (median of $LOSS_RUNS, ${LOSS_MIB} MiB, default ACK timeout) ratio=$ratio"
