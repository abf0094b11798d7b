#!/usr/bin/env bash
# SoftRoCE (rdma_rxe) on an ordinary Linux host that has, or can load, it.
#
# Usage: scripts/rxe-setup.sh [NETDEV]   load rdma_rxe and add rxe_<NETDEV>
#                                        (default NETDEV: the default-route
#                                        interface), then list RDMA devices
#        scripts/rxe-setup.sh --check    exit 0 iff an RDMA port is ACTIVE and
#                                        ibv_devices lists a device
# Needs root for the set-up (modprobe, rdma link add); packages: kmod,
# iproute2 (rdma), rdma-core, ibverbs-providers (librxe), ibverbs-utils.
# Machines whose kernel lacks RDMA/modules: use scripts/guest/run.sh instead.
set -euo pipefail

say() { echo "rxe-setup: $*" >&2; }

# ACTIVE ports from sysfs, as "dev/port" words.
active_ports() {
  local f st out=()
  for f in /sys/class/infiniband/*/ports/*/state; do
    [[ -r $f ]] || continue
    read -r st <"$f" || continue
    if [[ $st == *ACTIVE* ]]; then
      f=${f#/sys/class/infiniband/}
      out+=("${f%%/*}/$(basename "$(dirname "$f")")")
    fi
  done
  echo "${out[*]}"
}

# Device names from ibv_devices (skips its two header lines).
ibv_list() {
  command -v ibv_devices >/dev/null || return 0
  ibv_devices 2>/dev/null | awk 'NR > 2 && NF { print $1 }'
}

check() {
  local ports devs
  if [[ ! -d /sys/class/infiniband ]]; then
    say "no RDMA on this host: /sys/class/infiniband does not exist (kernel $(uname -r) without InfiniBand/RDMA support or ib_core not loaded)"
    return 1
  fi
  ports=$(active_ports)
  devs=$(ibv_list | tr '\n' ' ')
  if [[ -z $ports ]]; then
    say "no ACTIVE RDMA port under /sys/class/infiniband/*/ports/*/state"
    return 1
  fi
  if [[ -z ${devs// /} ]]; then
    say "ACTIVE port(s) $ports, but ibv_devices lists no device (is ibverbs-providers installed?)"
    return 1
  fi
  say "OK: ACTIVE port(s): $ports; ibv_devices: $devs"
  return 0
}

if [[ ${1:-} == --check ]]; then
  check
  exit
fi
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '4,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi

NETDEV=${1:-}
if [[ -z $NETDEV ]]; then
  NETDEV=$(ip -o route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
  [[ -n $NETDEV ]] || { say "no NETDEV given and no default route to pick one from"; exit 2; }
fi
[[ -e /sys/class/net/$NETDEV ]] || { say "network device '$NETDEV' does not exist"; exit 2; }

if [[ ! -d /sys/module/rdma_rxe ]]; then
  if [[ ! -d /lib/modules/$(uname -r) ]]; then
    say "cannot load rdma_rxe: kernel $(uname -r) has no /lib/modules/$(uname -r) (no loadable modules on this host)"
    say "no RDMA here; run the tests in the SoftRoCE guest: scripts/guest/run.sh 'COMMAND'"
    exit 1
  fi
  if ! err=$(modprobe rdma_rxe 2>&1); then
    say "cannot load rdma_rxe: ${err:-modprobe failed}"
    say "no RDMA here; run the tests in the SoftRoCE guest: scripts/guest/run.sh 'COMMAND'"
    exit 1
  fi
fi
command -v rdma >/dev/null || { say "the 'rdma' tool (iproute2) is missing"; exit 1; }

# One rxe device per netdev: reuse any that already sits on NETDEV.
existing=$(rdma link show 2>/dev/null | awk -v nd="$NETDEV" '$0 ~ (" netdev " nd "( |$)") { split($2, a, "/"); print a[1]; exit }')
if [[ -n $existing ]]; then
  say "$existing already exists on $NETDEV"
else
  rdma link add "rxe_$NETDEV" type rxe netdev "$NETDEV"
  say "added rxe_$NETDEV on $NETDEV"
fi
rdma link show
if command -v ibv_devices >/dev/null; then ibv_devices; fi
