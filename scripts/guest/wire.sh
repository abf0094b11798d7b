#!/usr/bin/env bash
# Cuts, restores, rate-limits or counts one of the guest's veth wires (run
# INSIDE the guest, as the fault tests and benchmarks do).
#
# Usage: scripts/guest/wire.sh [WIRE] down|up|limit RATE|unlimit|bytes
#   WIRE     ab (default: A-B), c (C and its upstream SRC_C), d (D and
#            SRC_D) or ab2 (A2-B2, the second A-B rail); see run.sh.
#   down|up  cut or restore the wire (see below).
#   limit RATE  rate-limit both ends with tbf (RATE as tc takes it:
#            10mibps = 10 MiB/s, 80mbit, ...; burst $RXFER_WIRE_BURST,
#            default 512kb, latency 100ms). A cut wire stays cut.
#   unlimit  remove the limit (a cut wire stays cut).
#   bytes    print each end's counters, one line each:
#            NETDEV tx_bytes=N rx_bytes=N (from /sys/class/net).
#
# By default the wire is cut by dropping every packet on both ends (netem
# loss 100%: the root qdisc, or under a limit's tbf): no carrier change, so
# the rxe ports stay ACTIVE, as when a cable between two switches is cut. A
# link flap instead (RXFER_WIRE_CUT=link: `ip link set B down`, later up,
# B being the wire's sending end) hits kernel rxe bugs after a flap with
# traffic in flight, different per kernel (measured, see docs/kernels.md,
# "Tested kernels"):
#   6.1:  B's rxe silently drops incoming connection replies for minutes;
#         re-creating B's rxe device clears it (done by `up` in link mode);
#   6.12: A's rxe, whose netdev only lost carrier, is left with its GSI QP
#         (QP1, the one rdma_cm's connection messages use) in state ERR:
#         every connection to A times out, also from a new process, and
#         only re-creating A's device (killing the receiver's listener)
#         would clear it.
set -euo pipefail
usage() {
  echo "usage: [RXFER_WIRE_CUT=drop|link] wire.sh [ab|c|d|ab2] down|up|limit RATE|unlimit|bytes" >&2
  exit 2
}

# Wire W of run.sh: listening end veth<2W> (10.77.W.1, rxe<2W>), sending end
# veth<2W+1> (10.77.W.2, rxe<2W+1>), policy tables 100+2W and 101+2W.
WIRE=ab
case ${1:-} in ab | c | d | ab2) WIRE=$1; shift ;; esac
case $WIRE in
  ab) W=0 EA=A EB=B VB=RXFER_ADDR_B ;;
  c) W=1 EA=C EB=SRC_C VB=RXFER_SRC_C ;;
  d) W=2 EA=D EB=SRC_D VB=RXFER_SRC_D ;;
  ab2) W=3 EA=A2 EB=B2 VB=RXFER_ADDR_B2 ;;
esac
# run.sh's environment names them; the defaults are the same (no forks).
VA=RXFER_ADDR_$EA NA=RXFER_NETDEV_$EA NB=RXFER_NETDEV_$EB RB=RXFER_DEV_$EB
A=${!VA:-10.77.$W.1} B=${!VB:-10.77.$W.2}
DEV_A=${!NA:-veth$((2 * W))} DEV_B=${!NB:-veth$((2 * W + 1))} RDEV_B=${!RB:-rxe$((2 * W + 1))}
TABLE_A=$((100 + 2 * W)) TABLE_B=$((101 + 2 * W))
MODE=${RXFER_WIRE_CUT:-drop}

# The qdiscs of one end. A limit is the root tbf (handle 1:); a cut is netem
# loss 100%, as the root or, under a limit, as the tbf's child (handle 10:),
# so the two compose in either order.
limited() { [[ $(tc qdisc show dev "$1" root) == *"qdisc tbf 1: root"* ]]; }
cut() { [[ $(tc qdisc show dev "$1") == *"qdisc netem"*"loss 100%"* ]]; }
cut_end() {
  if limited "$1"; then
    tc qdisc replace dev "$1" parent 1:1 handle 10: netem loss 100%
  else
    tc qdisc replace dev "$1" root netem loss 100%
  fi
}
restore_end() {
  if limited "$1"; then
    tc qdisc del dev "$1" parent 1:1 handle 10: 2>/dev/null || true
  else
    tc qdisc del dev "$1" root 2>/dev/null || true
  fi
}
limit_end() {
  local was_cut=0
  cut "$1" && was_cut=1
  tc qdisc del dev "$1" root 2>/dev/null || true
  tc qdisc add dev "$1" root handle 1: tbf rate "$2" burst "${RXFER_WIRE_BURST:-512kb}" latency 100ms
  [[ $was_cut == 0 ]] || cut_end "$1"
}
unlimit_end() {
  local was_cut=0
  cut "$1" && was_cut=1
  tc qdisc del dev "$1" root 2>/dev/null || true
  [[ $was_cut == 0 ]] || cut_end "$1"
}
counters() {
  local d tx rx
  for d in "$DEV_A" "$DEV_B"; do
    read -r tx <"/sys/class/net/$d/statistics/tx_bytes"
    read -r rx <"/sys/class/net/$d/statistics/rx_bytes"
    echo "$d tx_bytes=$tx rx_bytes=$rx"
  done
}

case ${1:-} in
  limit)
    [[ $# == 2 && -n $2 ]] || usage
    limit_end "$DEV_B" "$2"
    limit_end "$DEV_A" "$2"
    exit 0 ;;
  unlimit)
    unlimit_end "$DEV_B"
    unlimit_end "$DEV_A"
    exit 0 ;;
  bytes) counters; exit 0 ;;
  down | up) [[ $# == 1 ]] || usage ;;
  *) usage ;;
esac
case $MODE:$1 in
  drop:down)
    cut_end "$DEV_B"
    cut_end "$DEV_A" ;;
  drop:up)
    restore_end "$DEV_B"
    restore_end "$DEV_A" ;;
  link:down) ip link set "$DEV_B" down ;;
  link:up)
    ip link set "$DEV_B" up
    ip link set "$DEV_A" up
    # Taking a link down deletes the routes through it: restore run.sh's
    # policy routes and static neighbours (TABLE_A: A -> B via DEV_A,
    # TABLE_B: B -> A via DEV_B).
    mac_a=$(<"/sys/class/net/$DEV_A/address") mac_b=$(<"/sys/class/net/$DEV_B/address")
    ip -batch - <<EOT
route replace $B dev $DEV_A src $A table $TABLE_A
route replace $A dev $DEV_B src $B table $TABLE_B
neigh replace $B lladdr $mac_b dev $DEV_A nud permanent
neigh replace $A lladdr $mac_a dev $DEV_B nud permanent
EOT
    if [[ ${RXFER_WIRE_RECREATE:-1} == 1 ]]; then
      rdma link delete "$RDEV_B"
      rdma link add "$RDEV_B" type rxe netdev "$DEV_B"
    fi
    # Wait (bounded) for every RDMA port to be ACTIVE again.
    for ((i = 0; i < 100; i++)); do
      if grep -q ACTIVE /sys/class/infiniband/*/ports/1/state 2>/dev/null &&
        ! grep -qv ACTIVE /sys/class/infiniband/*/ports/1/state; then
        exit 0
      fi
      sleep 0.1
    done
    echo "wire.sh: RDMA ports not ACTIVE after link up" >&2
    exit 1 ;;
  *) usage ;;
esac
