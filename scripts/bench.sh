#!/usr/bin/env bash
# Benchmark: ib_write_bw vs sender -> receiver over the same path in the same
# guest boot. Run INSIDE the SoftRoCE guest (`make bench` does that).
#   1. ib_write_bw RC, 1 MiB messages, B -> A across the veth wire, IPv4
#      RoCEv2 GID (scripts/guest/ib-write-bw.sh), before the tool runs;
#   2. scripts/transfer.sh: a 256 MiB random file tmpfs -> tmpfs, RUNS times,
#      then a 1 GiB one BIG_RUNS times;
#   3. ib_write_bw again, after;
#   4. scripts/small-files.sh: 1000 x 4 KiB files as a tree vs one file;
#   5. 1% packet loss each way (netem on both ends of the wire): ib_write_bw
#      (perftest's defaults, ACK timeout 2^14) before and after, the tool
#      with its defaults (LOSS_RUNS runs of LOSS_MIB) in between;
#   6. (part "relay") scripts/bench-relay.sh: a RELAY_MIB file to 1, 2 and 3
#      hosts by `sender --relay`, wires limited to 10 MiB/s, then not;
#   7. (part "sinks", not in the default parts; `make bench-sinks`) disk or
#      network: the same SINK_MIB file SINK_RUNS times into tmpfs, into
#      RXFER_BENCH_DISK (a directory on a real disk, if given) and with
#      `receiver --discard`.
# Software RDMA under emulation drifts by 10-20% within one boot, so the
# baseline is the mean of the measurements before and after, and the tool's
# figure is the median of its runs.
# Prints both throughputs and ratio = median tool throughput / ib_write_bw.
# Usage: scripts/bench.sh [-s SIZE_MiB] [-r RUNS]
# Env (RXFER_* pass into the guest): RXFER_BENCH_PARTS (default
#   "file small loss relay lanes": which of 1-3, 4, 5, 6, 7 "sinks" and 8
#   "lanes" to run),
#   RXFER_BENCH_RELAY_MIB (RELAY_MIB, default 128), RXFER_BENCH_BIG_MIB
#   (BIG_MIB, default 1024), RXFER_BENCH_BIG_RUNS (BIG_RUNS, default 3; 0
#   skips it), RXFER_BENCH_LOSS_MIB
#   (LOSS_MIB, default 64), RXFER_BENCH_LOSS_RUNS (LOSS_RUNS, default 3),
#   RXFER_BENCH_SINK_MIB (SINK_MIB, default 1024), RXFER_BENCH_SINK_RUNS
#   (SINK_RUNS, default 3), RXFER_BENCH_DISK.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZE_MIB=256 RUNS=5
rx_size_runs_opts "$@"
here=$(cd "$(dirname "$0")" && pwd)

PARTS=" ${RXFER_BENCH_PARTS:-file small loss relay lanes} "
BIG_MIB=${RXFER_BENCH_BIG_MIB:-1024} BIG_RUNS=${RXFER_BENCH_BIG_RUNS:-3}
LOSS_MIB=${RXFER_BENCH_LOSS_MIB:-64} LOSS_RUNS=${RXFER_BENCH_LOSS_RUNS:-3}
SINK_MIB=${RXFER_BENCH_SINK_MIB:-1024} SINK_RUNS=${RXFER_BENCH_SINK_RUNS:-3}
for part in $PARTS; do
  [[ $part == @(file|small|loss|relay|sinks|lanes) ]] || { echo "bench: unknown part '$part' in RXFER_BENCH_PARTS (file, small, loss, relay, sinks, lanes)" >&2; exit 2; }
done
for n in "$SIZE_MIB" "$RUNS" "$BIG_MIB" "$LOSS_MIB" "$LOSS_RUNS" "$SINK_MIB" "$SINK_RUNS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench: sizes and run counts must be whole numbers >= 1, got '$n'" >&2; exit 2; }
done
[[ $BIG_RUNS =~ ^(0|[1-9][0-9]*)$ ]] || { echo "bench: RXFER_BENCH_BIG_RUNS must be a whole number (0 skips), got '$BIG_RUNS'" >&2; exit 2; }

# The median of the numbers on stdin (of an even count, the lower middle).
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

# transfer.sh's output ($1) for $2 MiB x $3 runs against baseline $4:
# prints one RESULT line (throughput ratio, median CPU per GiB).
report() {
  local out=$1 mib=$2 runs=$3 ibw=$4 tool ratio cpu_s cpu_r
  tool=$(sed -n 's/^median_MiBps=//p' <<<"$out")
  ratio=$(awk -v t="$tool" -v i="$ibw" 'BEGIN { printf "%.2f", t / i }')
  cpu_s=$(sed -n 's/.*CPU per GiB sender \([0-9.]*\) s.*/\1/p' <<<"$out" | median)
  cpu_r=$(sed -n 's/.*CPU per GiB .*receiver \([0-9.]*\) s.*/\1/p' <<<"$out" | median)
  echo "RESULT ib_write_bw=$ibw MiB/s (mean of before/after) rdma-xfer=$tool MiB/s" \
    "(median of $runs, ${mib} MiB, process start to exit) ratio=$ratio" \
    "cpu_per_GiB sender=${cpu_s}s receiver=${cpu_r}s"
}

if [[ $PARTS == *" file "* ]]; then
  before=$(rx_ib_write_bw)
  echo "ib_write_bw before (RC, 1 MiB, B->A wire): $before MiB/s"
  out=$("$here/transfer.sh" -s "$SIZE_MIB" -r "$RUNS")
  grep -v '^median_MiBps=' <<<"$out"
  big=
  if ((BIG_RUNS > 0)); then
    big=$("$here/transfer.sh" -s "$BIG_MIB" -r "$BIG_RUNS")
    grep -v '^median_MiBps=' <<<"$big"
  fi
  after=$(rx_ib_write_bw)
  echo "ib_write_bw after: $after MiB/s"
  ibw=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", (a + b) / 2 }')
  report "$out" "$SIZE_MIB" "$RUNS" "$ibw"
  if [[ -n $big ]]; then report "$big" "$BIG_MIB" "$BIG_RUNS" "$ibw"; fi
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
fi

# Many small files against one file of the same size (files per second).
if [[ $PARTS == *" small "* ]]; then "$here/small-files.sh"; fi

# One file to 1, 2 and 3 hosts by relay (makespan ratios, source wire bytes).
if [[ $PARTS == *" relay "* ]]; then "$here/bench-relay.sh" -s "${RXFER_BENCH_RELAY_MIB:-128}"; fi

# Disk or network: the same file into tmpfs, onto a disk, and discarded
# (verified, not written). Equal rates: the disk is not the limit.
if [[ $PARTS == *" sinks "* ]]; then
  sinks=()
  for sink in tmpfs disk discard; do
    case $sink in
      tmpfs) out=$(RXFER_OUT_DIR='' "$here/transfer.sh" -s "$SINK_MIB" -r "$SINK_RUNS") ;;
      disk)
        [[ -n ${RXFER_BENCH_DISK:-} ]] || continue
        dir=$(mktemp -d "$RXFER_BENCH_DISK/rxfer-bench.XXXXXX")
        out=$(RXFER_OUT_DIR=$dir "$here/transfer.sh" -s "$SINK_MIB" -r "$SINK_RUNS")
        rm -rf "$dir" ;;
      discard) out=$(RECEIVER_OPTS="--discard ${RECEIVER_OPTS:-}" "$here/transfer.sh" -s "$SINK_MIB" -r "$SINK_RUNS") ;;
    esac
    grep -v '^median_MiBps=' <<<"$out" | sed "s/^/$sink: /"
    sinks+=("$sink=$(sed -n 's/^median_MiBps=//p' <<<"$out") MiB/s")
  done
  echo "RESULT sinks ${SINK_MIB} MiB (median of $SINK_RUNS, process start to exit): ${sinks[*]}"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
fi
# Lanes: one file over 1 and 2 lanes on the one B->A wire against
# ib_write_bw on 2 queue pairs (no target under emulation: rxe's kernel
# threads share the guest's two CPUs); then two rails at 10 MiB/s each,
# one rail against two, and one rail cut mid-file (bench-lanes.sh).
if [[ $PARTS == *" lanes "* ]]; then
  q2=$(rx_ib_write_bw -q 2)
  echo "lanes: ib_write_bw -q 2 (RC, 1 MiB, B->A wire): $q2 MiB/s"
  one=$("$here/transfer.sh" -s "$SIZE_MIB" -r "$RUNS" | sed -n 's/^median_MiBps=//p')
  two=$(SENDER_OPTS="--lanes 2 ${SENDER_OPTS:-}" "$here/transfer.sh" -s "$SIZE_MIB" -r "$RUNS" | sed -n 's/^median_MiBps=//p')
  echo "RESULT lanes ${SIZE_MIB} MiB one wire (median of $RUNS, process start to exit):" \
    "1 lane=$one MiB/s 2 lanes=$two MiB/s ib_write_bw -q 2=$q2 MiB/s" \
    "2 lanes/1=$(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", a / b }')" \
    "2 lanes/ib_write_bw -q 2=$(awk -v a="$two" -v b="$q2" 'BEGIN { printf "%.2f", a / b }')"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
  RXFER_BIN=${RXFER_BIN_DIR:-$here/../target/release} "$here/bench-lanes.sh"
fi
[[ $PARTS == *" loss "* ]] || exit 0

# Under 1% loss each way. The ratio compares what each gets start to end
# of its own measurement (ib_write_bw: its data phase; the tool: process
# start to ACK, connection set-up under loss included).
wire=("${RXFER_NETDEV_A:-veth0}" "${RXFER_NETDEV_B:-veth1}")
lossy() {
  local d
  for d in "${wire[@]}"; do
    if [[ $1 == on ]]; then tc qdisc replace dev "$d" root netem loss 1%; else tc qdisc del dev "$d" root 2>/dev/null || true; fi
  done
}
# The senders' logs, for the ACK timeout exponent they used.
logs=$(mktemp -d "${TMPDIR:-/tmp}/rxfer-bench.XXXXXX")
trap 'lossy off; rm -rf "$logs"' EXIT
# Prints the ACK timeout exponent of the loss runs and where it came from,
# e.g. "15 (default)", from the senders' debug lines (engine::
# tune_ack_timeout: "ACK timeout 4.096 us * 2^exp exp=15"); "unknown" when
# they have none (no log, or RDMA_XFER_ACK_TIMEOUT=0: the kernel's) or the
# exponent was not applied.
ack_exponent() {
  local exp from=${RDMA_XFER_ACK_TIMEOUT:+RDMA_XFER_ACK_TIMEOUT=$RDMA_XFER_ACK_TIMEOUT}
  exp=$(sed -n '/ACK timeout/s/.* exp=\([0-9][0-9]*\).*/\1/p' "$logs"/sender-*.log 2>/dev/null |
    sort -un | paste -sd/ -) || true
  if [[ -z $exp ]]; then
    echo "unknown${from:+ ($from)}"
  elif grep -q 'ACK timeout .*not applied' "$logs"/sender-*.log; then
    echo "unknown (2^$exp not applied; ${from:-default})"
  else
    echo "$exp (${from:-default})"
  fi
}
lossy on
before=$(rx_ib_write_bw -n "$LOSS_MIB")
echo "loss 1%: ib_write_bw before: $before MiB/s"
# -vv (transfer.sh passes one -v): the debug line with the exponent.
out=$(SENDER_OPTS="-v ${SENDER_OPTS:-}" RXFER_SENDER_LOGS=$logs \
  "$here/transfer.sh" -s "$LOSS_MIB" -r "$LOSS_RUNS")
grep -v '^median_MiBps=' <<<"$out" | sed 's/^/loss 1%: /'
after=$(rx_ib_write_bw -n "$LOSS_MIB")
echo "loss 1%: ib_write_bw after: $after MiB/s"
lossy off
tool=$(sed -n 's/^median_MiBps=//p' <<<"$out")
ibw=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.1f", (a + b) / 2 }')
ratio=$(awk -v t="$tool" -v i="$ibw" 'BEGIN { printf "%.2f", t / i }')
echo "RESULT loss=1% kernel=$(uname -r) ib_write_bw=$ibw MiB/s rdma-xfer=$tool MiB/s (median of $LOSS_RUNS, ${LOSS_MIB} MiB, ACK timeout exponent $(ack_exponent)) ratio=$ratio"
