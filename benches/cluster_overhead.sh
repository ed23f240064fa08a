#!/usr/bin/env bash
# The control plane's cost on the quickstart's RL step (issue 64's target: a two-node step within
# 5% of a one-node step): the quickstart without its SFT stage, every model role in a worker
# process, run in turns over Unix sockets (one machine), over TCP on loopback (`cluster.listen`),
# over ssh on two nodes made of network namespaces (as .ci/two_nodes.sh makes them), with the host
# areas in a shared directory and then mirrored over TCP (no shared_dir); prints
# each run's mean `time/step` past its first two steps. Needs root, iproute2, openssh-server and a
# release build: `cargo build --release && sudo bash benches/cluster_overhead.sh [STEPS] [ROUNDS]`.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30}
ROUNDS=${2:-2}
export BIN=target/release/roll-tui
QUICKSTART="$PWD/experiments/quickstart.yaml"
# shellcheck source=.ci/nodes.sh
source .ci/nodes.sh
trap nodes_cleanup EXIT
nodes_up
sshd_up

WORKERS=(workers.actor_train.mode=process workers.reference.mode=process workers.actor_infer.mode=process)
ssh_list=$(printf '%s, ' ssh "${SSH_OPTS[@]}")
SSH_CLUSTER="cluster={launcher: ssh, listen: 10.77.0.1, hosts: [10.77.0.2, 10.77.0.3], role_hosts: {reference: 10.77.0.3}, ssh: [${ssh_list%, }], shared_dir: $W/shared}"
MIRROR_CLUSTER="${SSH_CLUSTER%, shared_dir: *}}"
TCP_CLUSTER="cluster={listen: 127.0.0.1}"
STORE="$W/b.db"
cd "$W"
for round in $(seq "$ROUNDS"); do
    for how in unix tcp nodes mirrored; do
        extra=()
        [ "$how" = tcp ] && extra=("$TCP_CLUSTER")
        [ "$how" = nodes ] && extra=("$SSH_CLUSTER")
        [ "$how" = mirrored ] && extra=("$MIRROR_CLUSTER")
        "$BIN" --store "$STORE" run --quiet "$QUICKSTART" name="$how$round" sft=null \
            rl.steps="$STEPS" output_dir="$W/$how$round" "${WORKERS[@]}" "${extra[@]}" >/dev/null
        "$BIN" --store "$STORE" metrics "$how$round" --key time/step --json > "$how$round.json"
    done
done
python3 - "$ROUNDS" <<'PY'
import json, sys
rounds = int(sys.argv[1])
def mean(name):
    v = json.load(open(f"{name}.json"))[0]["values"][2:]
    return sum(v) / len(v)
print("round  unix (s)  tcp (s)  two nodes (s)  mirrored (s)  tcp/unix  nodes/unix  mirrored/unix")
for r in range(1, rounds + 1):
    u, t, n, m = (mean(f"{how}{r}") for how in ("unix", "tcp", "nodes", "mirrored"))
    print(f"{r:5}  {u:8.4f}  {t:7.4f}  {n:13.4f}  {m:12.4f}  {t / u:8.3f}  {n / u:10.3f}  {m / u:13.3f}")
PY
