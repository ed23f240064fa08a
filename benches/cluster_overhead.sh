#!/usr/bin/env bash
# The control plane's cost on the quickstart's RL step (issue 64's target: a two-node step within
# 5% of a one-node step): the quickstart without its SFT stage, every model role in a worker
# process, run in turns over Unix sockets (one machine), over TCP on loopback (`cluster.listen`),
# and over ssh on two nodes made of network namespaces (as .ci/two_nodes.sh makes them); prints
# each run's mean `time/step` past its first two steps. Needs root, iproute2, openssh-server and a
# release build: `cargo build --release && sudo bash benches/cluster_overhead.sh [STEPS] [ROUNDS]`.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30}
ROUNDS=${2:-2}
export BIN=target/release/roll-tui
QUICKSTART="$PWD/experiments/quickstart.yaml"
BIN="$PWD/${BIN:-target/debug/roll-tui}"
W=$(mktemp -d /tmp/roll-two-nodes.XXXXXX)
NODES=(a b)
head_pid=""
cleanup() {
    # A run still going (a failed check), then anything it started, then the nodes.
    if [ -n "$head_pid" ]; then kill -9 "$head_pid" 2>/dev/null || true; fi
    pkill -9 -f -- "^$BIN worker .*--secret-stdin" 2>/dev/null || true
    for n in "${NODES[@]}"; do
        if [ -f "$W/sshd-$n.pid" ]; then kill "$(cat "$W/sshd-$n.pid")" 2>/dev/null || true; fi
        ip netns del "roll-$n" 2>/dev/null || true
    done
    ip link del roll-br 2>/dev/null || true
    for n in "${NODES[@]}"; do ip link del "roll-$n-h" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT
fail() { echo "two nodes: FAILED: $*" >&2; exit 1; }

ip link add roll-br type bridge
ip addr add 10.77.0.1/24 dev roll-br
ip link set roll-br up
i=2
for n in "${NODES[@]}"; do
    ip netns add "roll-$n"
    ip link add "roll-$n-h" type veth peer name eth0 netns "roll-$n"
    ip link set "roll-$n-h" master roll-br up
    ip netns exec "roll-$n" ip addr add "10.77.0.$i/24" dev eth0
    ip netns exec "roll-$n" ip link set eth0 up
    ip netns exec "roll-$n" ip link set lo up
    i=$((i + 1))
done

ssh-keygen -q -t ed25519 -N '' -f "$W/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$W/userkey"
cp "$W/userkey.pub" "$W/authorized_keys"
chmod 600 "$W/authorized_keys"
mkdir -p /run/sshd
i=2
for n in "${NODES[@]}"; do
    ip netns exec "roll-$n" /usr/sbin/sshd -o "ListenAddress=10.77.0.$i" -o "HostKey=$W/hostkey" \
        -o "AuthorizedKeysFile=$W/authorized_keys" -o PermitRootLogin=prohibit-password \
        -o PasswordAuthentication=no -o StrictModes=no -o UsePAM=no -o "PidFile=$W/sshd-$n.pid"
    i=$((i + 1))
done
SSH_OPTS=(-i "$W/userkey" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
    -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5)
for host in 10.77.0.2 10.77.0.3; do
    for _ in $(seq 50); do
        if ssh "${SSH_OPTS[@]}" "$host" true 2>/dev/null; then continue 2; fi
        sleep 0.2
    done
    fail "no ssh to $host"
done


WORKERS=(workers.actor_train.mode=process workers.reference.mode=process workers.actor_infer.mode=process)
ssh_list=$(printf '%s, ' ssh "${SSH_OPTS[@]}")
SSH_CLUSTER="cluster={launcher: ssh, listen: 10.77.0.1, hosts: [10.77.0.2, 10.77.0.3], role_hosts: {reference: 10.77.0.3}, ssh: [${ssh_list%, }], shared_dir: $W/shared}"
TCP_CLUSTER="cluster={listen: 127.0.0.1}"
STORE="$W/b.db"
cd "$W"
for round in $(seq "$ROUNDS"); do
    for how in unix tcp nodes; do
        extra=()
        [ "$how" = tcp ] && extra=("$TCP_CLUSTER")
        [ "$how" = nodes ] && extra=("$SSH_CLUSTER")
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
print("round  unix (s)  tcp (s)  two nodes (s)  tcp/unix  nodes/unix")
for r in range(1, rounds + 1):
    u, t, n = mean(f"unix{r}"), mean(f"tcp{r}"), mean(f"nodes{r}")
    print(f"{r:5}  {u:8.4f}  {t:7.4f}  {n:13.4f}  {t / u:8.3f}  {n / u:10.3f}")
PY
