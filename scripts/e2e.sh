#!/usr/bin/env bash
# Runs the RDMA test binaries (tests/verbs.rs, e2e.rs, faults.rs, sessions.rs, auth.rs,
# hostile.rs, json.rs, pipes.rs, resume.rs, policies.rs, memlock.rs, ssh.rs)
# on a real RDMA stack: on this host if it has one, else in the SoftRoCE
# guest, once on each tested guest kernel: Debian 12's 6.1 and Debian 13's
# 6.12 (one boot per kernel, all test binaries in
# it; RXFER_GUEST_KERNELS="6.1" or "6.12" picks one). They must be built
# already (make build). Tests run one at a time:
# the guest has 2 vCPUs and parallel transfers would only measure contention.
# Extra arguments go to each test binary (e.g. a name filter, --nocapture).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmd=""
# faults runs last, and its wire-cut case last within it: cutting the wire
# (every packet dropped both ways, scripts/guest/wire.sh) is the most
# disruptive thing the suite does to the guest.
for t in verbs e2e sessions auth hostile json pipes resume policies memlock ssh faults; do
  exe=$(cargo test --release --locked --test "$t" --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep "/$t-" | tail -1)
  [[ -x $exe ]] || { echo "e2e: test binary $t not found; run make build first" >&2; exit 1; }
  cmd+="${cmd:+ && }$exe --test-threads=1 $*"
done
RXFER_GUEST_KERNELS=${RXFER_GUEST_KERNELS:-6.1 6.12} exec scripts/with-rdma.sh -t 1800 "$cmd"
