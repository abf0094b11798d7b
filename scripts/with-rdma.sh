#!/usr/bin/env bash
# Runs a command where a real RDMA stack exists:
#   - on this host if it has an ACTIVE RDMA device (scripts/rxe-setup.sh
#     --check), or can get one by loading rdma_rxe (with RXFER_SETUP_RXE=1);
#   - otherwise inside the SoftRoCE QEMU guest (scripts/guest/run.sh), which
#     exports RXFER_ADDR_A/RXFER_ADDR_B (the two ends of a veth wire): once
#     per kernel in RXFER_GUEST_KERNELS (space-separated, e.g. "6.1 6.12";
#     default: RXFER_GUEST_KERNEL, else 6.1), one guest boot each, one after
#     the other. Every kernel runs even if an earlier one failed; a summary
#     line per kernel (exit status, wall time) ends the output, and the exit
#     status is the first failure's (0 if all passed).
# Usage: scripts/with-rdma.sh [-t TIMEOUT_S] 'COMMAND STRING'
#   TIMEOUT_S applies to each run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
timeout=3600
if [[ ${1:-} == -t ]]; then timeout=$2; shift 2; fi
cmd=${1:?usage: with-rdma.sh [-t TIMEOUT_S] 'COMMAND'}

host_ok=0
if "$here/rxe-setup.sh" --check >/dev/null 2>&1; then
  host_ok=1
elif [[ ${RXFER_SETUP_RXE:-0} == 1 ]] && "$here/rxe-setup.sh" >/dev/null 2>&1 &&
  "$here/rxe-setup.sh" --check >/dev/null 2>&1; then
  host_ok=1
fi

if [[ $host_ok == 1 ]]; then
  # On a host, address A is the IPv4 address of the first RDMA port's netdev.
  if [[ -z ${RXFER_ADDR_A:-} ]]; then
    ndev=$(cat /sys/class/infiniband/*/ports/1/gid_attrs/ndevs/1 2>/dev/null | head -1 || true)
    [[ -n $ndev ]] && RXFER_ADDR_A=$(ip -4 -o addr show dev "$ndev" | awk '{ split($4, a, "/"); print a[1]; exit }')
    export RXFER_ADDR_A
  fi
  echo "with-rdma: running on this host (RDMA device present, A=${RXFER_ADDR_A:-?})" >&2
  exec timeout "$timeout" bash -c "ulimit -l unlimited 2>/dev/null; $cmd"
fi
read -r -a kernels <<<"${RXFER_GUEST_KERNELS:-${RXFER_GUEST_KERNEL:-6.1}}"
[[ ${#kernels[@]} -gt 0 ]] || kernels=(6.1)
if [[ ${#kernels[@]} == 1 ]]; then
  echo "with-rdma: no RDMA device on this host; running inside the SoftRoCE guest (kernel ${kernels[0]})" >&2
  exec "$here/guest/run.sh" -k "${kernels[0]}" -t "$timeout" "$cmd"
fi
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"
first_rc=0 summary=()
for k in "${kernels[@]}"; do
  echo "with-rdma: no RDMA device on this host; running inside the SoftRoCE guest, kernel $k" >&2
  rx_now_us t0
  rc=0
  "$here/guest/run.sh" -k "$k" -t "$timeout" "$cmd" || rc=$?
  rx_now_us t1
  s=$(((t1 - t0) / 1000000))
  if [[ $rc == 0 ]]; then
    summary+=("with-rdma: kernel $k: PASSED in ${s} s")
  else
    summary+=("with-rdma: kernel $k: FAILED (exit $rc) in ${s} s")
    [[ $first_rc == 0 ]] && first_rc=$rc
  fi
  echo "${summary[-1]}" >&2
done
printf '%s\n' "${summary[@]}" >&2
exit "$first_rc"
