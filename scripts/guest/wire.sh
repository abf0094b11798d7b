#!/usr/bin/env bash
# Cuts or restores the guest's veth wire (run INSIDE the guest, as the fault
# tests do). `up` also restores the policy routes and static neighbours that
# run.sh set up, because taking a link down deletes the routes through it,
# and re-creates B's rxe device: after a flap with traffic in flight, the
# rxe on the side that went down silently drops incoming connection replies
# for minutes (A's device, where receivers listen, is left alone). Both
# tested kernels need this: 6.1 and 6.12 (measured: without it the wire-cut
# test's next connect from B times out; see README "Tested kernels").
# Usage: scripts/guest/wire.sh down|up
# Env:   RXFER_WIRE_RECREATE=0 leaves B's rxe device as it is on `up` (to
#        see whether a kernel still needs the re-creation).
set -euo pipefail
A=${RXFER_ADDR_A:-10.77.0.1} B=${RXFER_ADDR_B:-10.77.0.2}
DEV_A=${RXFER_NETDEV_A:-veth0} DEV_B=${RXFER_NETDEV_B:-veth1} RDEV_B=${RXFER_DEV_B:-rxe1}
case ${1:-} in
  down) ip link set "$DEV_B" down ;;
  up)
    ip link set "$DEV_B" up
    ip link set "$DEV_A" up
    mac_a=$(<"/sys/class/net/$DEV_A/address") mac_b=$(<"/sys/class/net/$DEV_B/address")
    # Same tables as run.sh: 100 = A -> B via DEV_A, 101 = B -> A via DEV_B.
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
  *) echo "usage: wire.sh down|up" >&2; exit 2 ;;
esac
