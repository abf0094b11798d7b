#!/usr/bin/env bash
# `make demo`: one real transfer over SoftRoCE. On this host if it has (or
# can load) rdma_rxe, else in the QEMU guest across its veth wire. Prints the
# throughput and the SHA-256 check.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
size=${DEMO_SIZE_MIB:-256}
echo "demo: sending a ${size} MiB random file from B to A over RDMA and verifying it ..."
RXFER_SETUP_RXE=1 scripts/with-rdma.sh -t 1800 "scripts/transfer.sh -s $size -r 1"
