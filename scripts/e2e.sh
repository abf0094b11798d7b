#!/usr/bin/env bash
# Runs the end-to-end test binary (tests/e2e.rs) on a real RDMA stack: on
# this host if it has one, else in the SoftRoCE guest. The binary must be
# built already (make build). Tests run one at a time: the guest has 2 vCPUs
# and parallel transfers would only measure contention.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exe=$(cargo test --release --locked --test e2e --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep '/e2e-' | tail -1)
[[ -x $exe ]] || { echo "e2e: test binary not found; run make build first" >&2; exit 1; }
exec scripts/with-rdma.sh -t 2400 "$exe --test-threads=1 $*"
