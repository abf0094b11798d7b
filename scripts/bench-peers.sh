#!/usr/bin/env bash
# The peers, measured: the same random file from B to A with scp, rsync
# over ssh, a TCP netcat pipe, rdma-core's rcopy and rdma-xfer, in one
# guest boot. Run INSIDE the SoftRoCE guest (`make bench-peers` does that,
# after installing rsync and netcat-openbsd on the host, whose / the guest
# shares).
#   - scp, rsync (-e ssh) and nc bind their client to B's address, so their
#     TCP crosses the veth wire "ab" to A (the guest's sshd listens on A;
#     ssh logs in as the test user rxfer, whose shell reads no startup files:
#     root's ~/.bashrc is the host's, whose start-up took ~20 s under TCG;
#     scp -O, the scp protocol: the guest's sshd has no SFTP subsystem);
#   - rdma-xfer runs `sender --source B` to the receiver on A: the same wire;
#   - rcopy (rsockets) cannot choose its source address: it copies to A from
#     A itself (rxe loopback), and rdma-xfer runs that path too (sender
#     without --source) so that the rcopy ratio compares like with like.
# Each tool runs RUNS times; the order of the tools rotates run by run, so
# the guest's drift spreads over all of them. Each time is the client's wall
# time from process start to exit (connection set-up, ssh's key exchange
# included), and each copy is compared with the source (cmp) after its run.
# Prints a table (median MiB/s, each run, rdma-xfer's time / the tool's:
# below 1, rdma-xfer was faster) and one RESULT line per peer.
# Caveat: the guest's NICs are emulated in software (veth, rxe under QEMU
# TCG): TCP gets the kernel's offloads (GSO/GRO, checksum), RDMA gets none,
# which favours the TCP tools there; on hardware RDMA NICs the balance differs.
# Usage: scripts/bench-peers.sh [-s SIZE_MiB] [-r RUNS]   (defaults 256, 3)
# Env: RXFER_ADDR_A, RXFER_ADDR_B, RXFER_SSHD_DIR (run.sh sets them),
#   RXFER_HOST_UPTIME (`uptime` of the host, printed with the guest's load).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SIZE_MIB=256 RUNS=3
rx_size_runs_opts "$@"
for n in "$SIZE_MIB" "$RUNS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-peers: size and runs must be whole numbers >= 1, got '$n'" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "bench-peers: $*" >&2; exit 1; }
[[ -n ${RXFER_ADDR_B:-} && -n ${RXFER_SSHD_DIR:-} ]] ||
  die "run it inside the SoftRoCE guest (make bench-peers): RXFER_ADDR_B and RXFER_SSHD_DIR are not set"
for t in scp ssh rsync nc rcopy cmp; do
  command -v "$t" >/dev/null || die "$t not found (make bench-peers installs rsync and netcat-openbsd on the host; rcopy is in rdmacm-utils)"
done

rx_xfer_init 7493 rxfer-peers
A=$RX_A B=$RXFER_ADDR_B
NC_PORT=7494 RCOPY_PORT=7495
src=$RX_WORK/src/peers.bin dst=$RX_WORK/dst
mkdir -p "$RX_WORK/src" "$dst"
# ssh's user (scripts/guest/sshd.sh) writes there too.
chmod 755 "$RX_WORK"
chown 4242:4242 "$dst"
RCOPY_PID='' NC_PID=''
# shellcheck disable=SC2317  # invoked from the EXIT trap
peers_cleanup() {
  [[ -n $RCOPY_PID ]] && kill "$RCOPY_PID" 2>/dev/null
  [[ -n $NC_PID ]] && kill "$NC_PID" 2>/dev/null
  rx_xfer_cleanup
}
trap peers_cleanup EXIT

echo "bench-peers: ${SIZE_MIB} MiB, $RUNS runs each, B=$B -> A=$A"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
[[ -n ${RXFER_HOST_UPTIME:-} ]] && echo "host before the guest booted: $RXFER_HOST_UPTIME"

"$here/guest/sshd.sh" start "$RXFER_SSHD_DIR" "$A" || die "cannot start the guest's sshd"
ssh_b=(ssh -b "$B")
cipher=$("${ssh_b[@]}" -v "rxfer@$A" true 2>&1 | sed -n 's/.*kex: client->server cipher: \([^ ]*\).*/\1/p' | head -1) ||
  true
[[ -n $cipher ]] || die "ssh from $B to rxfer@$A does not work: $("${ssh_b[@]}" "rxfer@$A" true 2>&1 | tail -3)"
echo "ssh: OpenSSH's defaults as rxfer@$A, cipher $cipher; scp -O (the scp protocol)"

head -c "$((SIZE_MIB << 20))" /dev/urandom >"$src"

# rcopy's server: one for the whole run (it serves one client after another).
(cd "$dst" && exec rcopy -p "$RCOPY_PORT") </dev/null >"$RX_WORK/rcopy-server.log" 2>&1 &
RCOPY_PID=$!
# A small untimed copy until it answers: it shows the server listens and works.
head -c 1048576 /dev/urandom >"$RX_WORK/src/warm.bin"
for ((w = 0; ; w++)); do
  rcopy "$RX_WORK/src/warm.bin" "$A:$dst/warm.bin" -p "$RCOPY_PORT" </dev/null >"$RX_WORK/rcopy.log" 2>&1 &&
    cmp -s "$RX_WORK/src/warm.bin" "$dst/warm.bin" && break
  kill -0 "$RCOPY_PID" 2>/dev/null || die "rcopy's server exited: $(cat "$RX_WORK/rcopy-server.log")"
  ((w < 30)) || die "rcopy's warm-up copy failed 30 times: $(cat "$RX_WORK/rcopy.log")"
  sleep 1
done
rm -f "$dst/warm.bin" "$RX_WORK/src/warm.bin"

# Waits (bounded, 30 s) until a TCP socket listens on port $1.
tcp_listening() {
  local hex w
  printf -v hex '%04X' "$1"
  for ((w = 0; w < 600; w++)); do
    grep -q "^ *[0-9]*: [0-9A-F]*:$hex [0-9A-F:]* 0A " /proc/net/tcp && return 0
    sleep 0.05
  done
  return 1
}

# One timed copy of $src by tool $1 into $dst/peers.bin (rdma-xfer's
# receiver names it so too). Sets TOOK_US; on failure prints why and
# returns 1.
TOOK_US=0
copy_once() {
  local tool=$1 t0 t1 log=$RX_WORK/$1.log
  case $tool in
    scp)
      rx_now_us t0
      scp -O -q -o BindAddress="$B" "$src" "rxfer@$A:$dst/peers.bin" </dev/null >"$log" 2>&1 ||
        { echo "scp failed: $(cat "$log")" >&2; return 1; }
      rx_now_us t1 ;;
    rsync)
      rx_now_us t0
      rsync -e "ssh -b $B" "$src" "rxfer@$A:$dst/peers.bin" </dev/null >"$log" 2>&1 ||
        { echo "rsync failed: $(cat "$log")" >&2; return 1; }
      rx_now_us t1 ;;
    nc)
      nc -l "$A" "$NC_PORT" </dev/null >"$dst/peers.bin" 2>"$RX_WORK/nc-server.log" &
      NC_PID=$!
      tcp_listening "$NC_PORT" || { echo "nc: the listener on $A:$NC_PORT did not start: $(cat "$RX_WORK/nc-server.log")" >&2; return 1; }
      rx_now_us t0
      nc -N -s "$B" "$A" "$NC_PORT" <"$src" >"$log" 2>&1 ||
        { echo "nc (client) failed: $(cat "$log")" >&2; return 1; }
      rx_now_us t1
      wait "$NC_PID" || { NC_PID=; echo "nc (listener) failed: $(cat "$RX_WORK/nc-server.log")" >&2; return 1; }
      NC_PID= ;;
    rcopy)
      rx_now_us t0
      rcopy "$src" "$A:$dst/peers.bin" -p "$RCOPY_PORT" </dev/null >"$log" 2>&1 ||
        { echo "rcopy failed: $(cat "$log" "$RX_WORK/rcopy-server.log")" >&2; return 1; }
      rx_now_us t1 ;;
    rdma-xfer | rdma-xfer-lo)
      # lib.sh's receiver and timed sender in a subshell: their failure
      # (an exit there) ends this copy, not the script.
      t1=$(
        trap '[[ -n ${RX_RPID:-} ]] && kill "$RX_RPID" 2>/dev/null' EXIT
        [[ $tool == rdma-xfer-lo ]] && RX_SOURCE=()
        rx_start_receiver --dir "$dst"
        rx_send_timed "$A" "$src"
        echo "$RX_TOOK_US"
      ) || { echo "$tool failed (its logs are above)" >&2; return 1; }
      t0=0 ;;
    *) echo "unknown tool $tool" >&2; return 1 ;;
  esac
  TOOK_US=$((t1 - t0))
  cmp -s "$src" "$dst/peers.bin" || { echo "$tool: THE COPY DIFFERS FROM THE SOURCE" >&2; return 1; }
  rm -f "$dst/peers.bin"
}

tools=(scp rsync nc rcopy rdma-xfer rdma-xfer-lo)
declare -A rates=() failed=()
for ((run = 1; run <= RUNS; run++)); do
  order=()
  for ((i = 0; i < ${#tools[@]}; i++)); do order+=("${tools[(i + run - 1) % ${#tools[@]}]}"); done
  for tool in "${order[@]}"; do
    [[ -n ${failed[$tool]:-} ]] && continue
    rm -f "$dst/peers.bin"
    if ! copy_once "$tool"; then
      failed[$tool]=1
      echo "bench-peers: $tool FAILED in run $run; it is left out of the following runs" >&2
      continue
    fi
    rate=$(awk -v b="$((SIZE_MIB << 20))" -v us="$TOOK_US" 'BEGIN { printf "%.1f", b / 1048576 / (us / 1e6) }')
    rates[$tool]+="$rate "
    echo "run $run: $tool $rate MiB/s (copy checked)"
  done
done

median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
declare -A med
for tool in "${tools[@]}"; do med[$tool]=$(median <<<"${rates[$tool]:-}"); done

# rdma-xfer's time over the peer's, for the same bytes: peer rate / ours.
ratio() { awk -v p="$1" -v x="$2" 'BEGIN { printf "%.2f", p / x }'; }
path_of() {
  case $1 in
    rcopy | rdma-xfer-lo) echo "A -> A (rxe loopback)" ;;
    *) echo "B -> A (veth wire)" ;;
  esac
}
echo
printf '%-13s %-22s %12s  %-24s %s\n' tool path "MiB/s (med)" "runs (MiB/s)" "rdma-xfer time / tool time"
for tool in "${tools[@]}"; do
  mine=rdma-xfer
  [[ $tool == rcopy || $tool == rdma-xfer-lo ]] && mine=rdma-xfer-lo
  r=-
  if [[ -n ${med[$tool]} && -n ${med[$mine]} && $tool != "$mine" ]]; then
    r="$(ratio "${med[$tool]}" "${med[$mine]}") (against $mine)"
  fi
  printf '%-13s %-22s %12s  %-24s %s\n' "$tool" "$(path_of "$tool")" "${med[$tool]:-FAILED}" "${rates[$tool]:-}" "$r"
done
echo
for tool in scp rsync nc rcopy; do
  mine=rdma-xfer
  [[ $tool == rcopy ]] && mine=rdma-xfer-lo
  if [[ -z ${med[$tool]} || -z ${med[$mine]} ]]; then
    echo "RESULT peer=$tool FAILED (${failed[$tool]:+$tool failed}${failed[$mine]:+ $mine failed})"
    continue
  fi
  path=wire
  [[ $tool == rcopy ]] && path=loopback
  echo "RESULT peer=$tool path=$path ${SIZE_MIB}MiB median_of=$RUNS" \
    "$tool=${med[$tool]} MiB/s rdma-xfer=${med[$mine]} MiB/s" \
    "time_ratio=$(ratio "${med[$tool]}" "${med[$mine]}") (rdma-xfer's time / $tool's; below 1: rdma-xfer faster)"
done
echo "caveat: the guest emulates its NICs in software (veth + rxe under QEMU TCG); TCP's kernel offloads favour the TCP tools there"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg) (inside the guest)"
((${#failed[@]} == 0)) || die "failed: ${!failed[*]}"
