#!/usr/bin/env bash
# Cuts or restores the guest's veth wire (run INSIDE the guest, as the fault
# tests do).
#
# By default the wire is cut by dropping every packet on both ends (netem
# loss 100% as the root qdisc of both veths): no carrier change, so the rxe
# ports stay ACTIVE, as when a cable between two switches is cut. A link
# flap instead (RXFER_WIRE_CUT=link: `ip link set B down`, later up) hits
# kernel rxe bugs after a flap with traffic in flight, different per kernel
# (measured, see README "Tested kernels"):
#   6.1:  B's rxe silently drops incoming connection replies for minutes;
#         re-creating B's rxe device clears it (done by `up` in link mode);
#   6.12: A's rxe, whose netdev only lost carrier, is left with its GSI QP
#         (QP1, the one rdma_cm's connection messages use) in state ERR:
#         every connection to A times out, also from a new process, and
#         only re-creating A's device (killing the receiver's listener)
#         would clear it.
# Usage: scripts/guest/wire.sh down|up
set -euo pipefail
A=${RXFER_ADDR_A:-10.77.0.1} B=${RXFER_ADDR_B:-10.77.0.2}
DEV_A=${RXFER_NETDEV_A:-veth0} DEV_B=${RXFER_NETDEV_B:-veth1} RDEV_B=${RXFER_DEV_B:-rxe1}
MODE=${RXFER_WIRE_CUT:-drop}
case $MODE:${1:-} in
  drop:down)
    tc qdisc replace dev "$DEV_B" root netem loss 100%
    tc qdisc replace dev "$DEV_A" root netem loss 100% ;;
  drop:up)
    tc qdisc del dev "$DEV_B" root 2>/dev/null || true
    tc qdisc del dev "$DEV_A" root 2>/dev/null || true ;;
  link:down) ip link set "$DEV_B" down ;;
  link:up)
    ip link set "$DEV_B" up
    ip link set "$DEV_A" up
    # Taking a link down deletes the routes through it: restore run.sh's
    # policy routes and static neighbours. Same tables as run.sh:
    # 100 = A -> B via DEV_A, 101 = B -> A via DEV_B.
    mac_a=$(<"/sys/class/net/$DEV_A/address") mac_b=$(<"/sys/class/net/$DEV_B/address")
    ip -batch - <<EOT
route replace $B dev $DEV_A src $A table 100
route replace $A dev $DEV_B src $B table 101
neigh replace $B lladdr $mac_b dev $DEV_A nud permanent
neigh replace $A lladdr $mac_a dev $DEV_B nud permanent
EOT
    if [[ ${RXFER_WIRE_RECREATE:-1} == 1 ]]; then
      rdma link delete "$RDEV_B"
      rdma link add "$RDEV_B" type rxe netdev "$DEV_B"
    fi
    # Wait (bounded) for both RDMA ports to be ACTIVE again.
    for ((i = 0; i < 100; i++)); do
      if grep -q ACTIVE /sys/class/infiniband/*/ports/1/state 2>/dev/null &&
        ! grep -qv ACTIVE /sys/class/infiniband/*/ports/1/state; then
        exit 0
      fi
      sleep 0.1
    done
    echo "wire.sh: RDMA ports not ACTIVE after link up" >&2
    exit 1 ;;
  *) echo "usage: [RXFER_WIRE_CUT=drop|link] wire.sh down|up" >&2; exit 2 ;;
esac
