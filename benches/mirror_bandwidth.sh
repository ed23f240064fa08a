#!/usr/bin/env bash
# The mirror's bandwidth (issue 64's target: files over TCP between two nodes at >= 50% of
# loopback TCP measured minutes apart): benches/mirror.rs on loopback, then with its
# worker in node roll-a of .ci/nodes.sh (a network namespace behind a veth pair and a bridge).
# Needs root and iproute2: `sudo bash benches/mirror_bandwidth.sh` (MB=512 ROUNDS=5 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench mirror --no-run --locked 2>/dev/null
BENCH=$(ls -t target/release/deps/mirror-* | grep -v '\.d$' | head -1)
# shellcheck source=.ci/nodes.sh
source .ci/nodes.sh
trap nodes_cleanup EXIT
nodes_up
ROLL_BENCH_NODE=roll-a ROLL_BENCH_LISTEN=10.77.0.1 "$BENCH"
