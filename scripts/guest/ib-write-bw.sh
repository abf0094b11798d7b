#!/usr/bin/env bash
# Baseline RDMA bandwidth inside the SoftRoCE guest (run it via run.sh):
# perftest's ib_write_bw server on side A (rxe0, 10.77.0.1) in the
# background, client on side B (rxe1) writing to 10.77.0.1, so the data
# crosses the veth wire B->A. Prints exactly one line on stdout:
#   ib_write_bw_MiBps=<float>
# Usage: scripts/guest/ib-write-bw.sh [-n ITERS] [-s BYTES] [-p PORT] [-t TIMEOUT_S] [-q QPS]
#   defaults: -n 2000 -s 1048576 -p 18515 -t 600 -q 1 (queue pairs, each
#   ITERS writes); diagnostics go to stderr.
# Unit: perftest (4.5-0.17, Debian 12) reports "BW average[MB/sec]" with
# format_factor 0x100000 (unless --report_gbits), i.e. MB here means MiB,
# so the value is already MiB/s and is printed unchanged.
set -euo pipefail

ITERS=2000 SIZE=1048576 PORT=18515 TMO=600 QPS=1
while getopts 'n:s:p:t:q:h' o; do
  case $o in
    n) ITERS=$OPTARG ;;
    s) SIZE=$OPTARG ;;
    p) PORT=$OPTARG ;;
    t) TMO=$OPTARG ;;
    q) QPS=$OPTARG ;;
    *) sed -n '7,9p' "$0" >&2; exit 2 ;;
  esac
done

ADDR_A=${RXFER_ADDR_A:-10.77.0.1}
DEV_A=${RXFER_DEV_A:-rxe0} DEV_B=${RXFER_DEV_B:-rxe1}
# GID index 1 is the IPv4 (RoCEv2) GID on rxe; index 0 is link-local.
COMMON=(-F -x 1 -s "$SIZE" -n "$ITERS" -p "$PORT" -c RC -q "$QPS")

command -v ib_write_bw >/dev/null || { echo "ib-write-bw: ib_write_bw not installed (perftest)" >&2; exit 1; }
tmp=$(mktemp -d)
SPID=
cleanup() {
  [[ -n $SPID ]] && kill "$SPID" 2>/dev/null
  rm -rf "$tmp"
  return 0
}
trap cleanup EXIT

timeout "$TMO" ib_write_bw -d "$DEV_A" "${COMMON[@]}" >"$tmp/server.out" 2>&1 &
SPID=$!

# Wait (bounded) until the server's TCP control port is listening; reading
# /proc/net/tcp with builtins avoids slow process starts in the guest.
hexport=$(printf ':%04X' "$PORT")
listening=0
for ((i = 0; i < 100; i++)); do
  while read -r _ local _ st _; do
    [[ $local == *"$hexport" && $st == 0A ]] && { listening=1; break; }
  done </proc/net/tcp
  [[ $listening == 1 ]] && break
  kill -0 "$SPID" 2>/dev/null || break
  sleep 0.1
done
if [[ $listening != 1 ]]; then
  echo "ib-write-bw: server did not start listening on port $PORT" >&2
  cat "$tmp/server.out" >&2
  exit 1
fi

if ! timeout "$TMO" ib_write_bw -d "$DEV_B" "${COMMON[@]}" "$ADDR_A" >"$tmp/client.out" 2>&1; then
  echo "ib-write-bw: client failed" >&2
  cat "$tmp/client.out" "$tmp/server.out" >&2
  exit 1
fi
wait "$SPID" || { echo "ib-write-bw: server failed" >&2; cat "$tmp/server.out" >&2; exit 1; }
SPID=

# Result row: "#bytes #iterations BW-peak BW-average MsgRate".
# (With several queue pairs it counts the iterations of all.)
bw=$(awk -v s="$SIZE" -v n="$((ITERS * QPS))" '$1 == s && $2 == n && NF >= 5 { print $4; exit }' "$tmp/client.out")
if [[ ! $bw =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
  echo "ib-write-bw: could not parse result" >&2
  cat "$tmp/client.out" >&2
  exit 1
fi
grep -i -E 'warn|conflict' "$tmp/client.out" >&2 || true
echo "ib_write_bw_MiBps=$bw"
