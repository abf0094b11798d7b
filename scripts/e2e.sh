#!/usr/bin/env bash
# Runs the RDMA test suites (tests/rdma/: one binary, a module per suite,
# listed in tests/rdma/main.rs) on a real RDMA stack: on this host if it has
# one, else in the SoftRoCE guest, once on each tested guest kernel: Debian
# 12's 6.1 and Debian 13's 6.12 (one boot per kernel; RXFER_GUEST_KERNELS="6.1"
# or "6.12" picks one). The binary must be built already (make build).
# Tests run one at a time: the guest has 2 vCPUs and parallel transfers
# would only measure contention. Extra arguments go to the test binary (e.g.
# a name filter such as `resume::`, or --nocapture).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exe=$(cargo test --release --locked --test rdma --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep -E '/deps/rdma-[0-9a-f]+$' | tail -1)
[[ -x $exe ]] || { echo "e2e: test binary rdma not found; run make build first" >&2; exit 1; }
# Everything: faults runs last, and its wire-cut cases last within it
# (libtest runs tests in name order): cutting the wire (every packet dropped
# both ways, scripts/guest/wire.sh) is the most disruptive thing the suites
# do to the guest. With arguments (a filter): one run with just those.
if (($# == 0)); then
  cmd="$exe --test-threads=1 --skip faults:: && $exe --test-threads=1 faults::"
else
  cmd="$exe --test-threads=1 $*"
fi
RXFER_GUEST_KERNELS=${RXFER_GUEST_KERNELS:-6.1 6.12} exec scripts/with-rdma.sh -t 1800 "$cmd"
