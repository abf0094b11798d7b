#!/usr/bin/env bash
# The tuning table: throughput and CPU per GiB for chunk size x slots/depth
# x CQ waiting, one 256 MiB transfer tmpfs -> tmpfs per run (scripts/
# transfer.sh), RUNS runs per setting, ib_write_bw before and after for
# scale. Run INSIDE the SoftRoCE guest (`make bench-tune` does that).
# Prints a Markdown table for docs/performance.md.
# Usage: scripts/bench-tune.sh [-s SIZE_MiB] [-r RUNS]
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZE_MIB=256 RUNS=2
rx_size_runs_opts "$@"
for n in "$SIZE_MIB" "$RUNS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-tune: -s and -r must be whole numbers >= 1, got '$n'" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)

# chunk size, slots (= depth), which side busy-polls (none|sender|receiver)
settings=(
  "1M 16 none" "2M 16 none" "4M 8 none" "1M 8 none" "1M 32 none"
  "256K 64 none" "1M 16 sender" "1M 16 receiver"
)
# shellcheck disable=SC2119  # its defaults
before=$(rx_ib_write_bw)
echo "ib_write_bw before: $before MiB/s"
echo "| chunk x slots (= depth) | CQ waiting | MiB/s (each run) | CPU s/GiB sender | CPU s/GiB receiver |"
echo "| --- | --- | --- | --- | --- |"
for s in "${settings[@]}"; do
  read -r chunk slots poll <<<"$s"
  sopts="--chunk-size $chunk --depth $slots" ropts="--chunk-size $chunk --slots $slots"
  waiting=events
  case $poll in
    sender) sopts+=" --busy-poll" waiting="sender --busy-poll" ;;
    receiver) ropts+=" --busy-poll" waiting="receiver --busy-poll" ;;
  esac
  out=$(SENDER_OPTS=$sopts RECEIVER_OPTS=$ropts "$here/transfer.sh" -s "$SIZE_MIB" -r "$RUNS")
  rates=$(sed -n 's/^run [0-9]*: .*: \([0-9.]*\) MiB\/s start to ACK.*/\1/p' <<<"$out" | paste -sd, - | sed 's/,/, /g')
  cpu_s=$(sed -n 's/.*CPU per GiB sender \([0-9.]*\) s.*/\1/p' <<<"$out" | paste -sd/ -)
  cpu_r=$(sed -n 's/.*CPU per GiB .*receiver \([0-9.]*\) s.*/\1/p' <<<"$out" | paste -sd/ -)
  label="$chunk x $slots"
  [[ $s == "1M 16 none" ]] && label+=" (default)"
  echo "| $label | $waiting | $rates | $cpu_s | $cpu_r |"
done
# shellcheck disable=SC2119
# The table is printed already: a failed baseline does not lose it.
after=$(rx_ib_write_bw) || after="(no result)"
echo "ib_write_bw after: $after MiB/s"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
