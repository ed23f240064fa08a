#!/usr/bin/env bash
# Two nodes on one machine (issue: a small cluster, tested in CI): network namespaces roll-a and
# roll-b, each on a bridge with the head through a veth pair and running its own OpenSSH server.
# A run whose workers are started by ssh on both nodes (`cluster.launcher: ssh`) must give exactly
# the curves of the same run with its workers on the head's machine, its workers must connect
# from the nodes' addresses, no worker port may stay open once its worker is connected, and
# no worker may outlive its head killed with SIGKILL.
# Needs root (namespaces), iproute2 and openssh-server; bounded by `timeout`; removes its
# namespaces, bridge and daemons whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=.ci/nodes.sh
source .ci/nodes.sh
trap nodes_cleanup EXIT
nodes_up
sshd_up

net_config > "$W/net.yaml"
ssh_list=$(printf '%s, ' ssh "${SSH_OPTS[@]}")
CLUSTER="cluster={launcher: ssh, listen: 10.77.0.1, hosts: [10.77.0.2, 10.77.0.3], role_hosts: {reference: 10.77.0.3}, ssh: [${ssh_list%, }], shared_dir: $W/shared}"
STORE="$W/s.db"
cd "$W"
timeout 300 "$BIN" --store "$STORE" run --quiet net.yaml output_dir="$W/local"
timeout 300 "$BIN" --store "$STORE" run --quiet net.yaml name=nodes output_dir="$W/nodes" "$CLUSTER"
# Without shared_dir: the nodes do not see the head's /dev/shm, so each worker keeps a mirror of
# its role's host area there, over TCP.
MIRRORED="${CLUSTER%, shared_dir: *}}"
timeout 300 "$BIN" --store "$STORE" run --quiet net.yaml name=mirrored output_dir="$W/mirrored" "$MIRRORED"

"$BIN" --store "$STORE" metrics net --json > local.json
for run in nodes mirrored; do
    "$BIN" --store "$STORE" metrics $run --json > $run.json
    "$BIN" --store "$STORE" runs show $run > $run.txt
done
python3 - <<'PY' || fail "see above"
import json, re
# What measures the machine or the process layout (timings, rates, store back-pressure, worker
# restarts) differs between runs; every other series must be identical.
def series(path):
    return {(s["stage"], s["key"]): s["values"] for s in json.load(open(path))
            if not s["key"].startswith(("time/", "system/", "store/", "workers/"))
            and not s["key"].endswith("_per_s")}
local = series("local.json")
for run, mirror in [("nodes", ""), ("mirrored", ", mirroring its host area")]:
    nodes = series(f"{run}.json")
    assert local.keys() == nodes.keys(), (sorted(local.keys() ^ nodes.keys()))
    differ = [k for k in local if local[k] != nodes[k]]
    assert not differ, f"{run}: series differ between one machine and two nodes: {differ}"
    text = open(f"{run}.txt").read()
    started = [l for l in text.splitlines() if "worker_started" in l]
    assert len(started) == 3, text
    for role, node in [("actor_train", "10.77.0.2"), ("actor_infer", "10.77.0.2"), ("reference", "10.77.0.3")]:
        line = next(l for l in started if f"{role}-0" in l)
        assert re.search(rf"over tcp 10\.77\.0\.1:\d+ from {re.escape(node)}:\d+, started by ssh on {re.escape(node)}{mirror}$", line), line
moved = {s["key"]: s["values"][-1] for s in json.load(open("mirrored.json")) if s["key"].endswith("/mirror_mb")}
assert sorted(moved) == [f"workers/{w}-0/mirror_mb" for w in ("actor_infer", "actor_train", "reference")], moved
print(f"two nodes: {len(local)} series identical to one machine's, with shared_dir and with mirrors "
      f"({', '.join(f'{k} {v:.1f}' for k, v in moved.items())}); workers connected from their nodes")
PY

# A longer run: its worker ports are closed once the workers are connected, and killing the head
# with SIGKILL leaves no worker on either node.
sed -i 's/steps: 6/steps: 2000/' net.yaml
"$BIN" --store "$STORE" run net.yaml name=killed output_dir="$W/killed" "$CLUSTER" > killed.out 2>&1 &
head_pid=$!
for _ in $(seq 300); do grep -q "rl *3/" killed.out && break; sleep 0.1; done
grep -q "rl *3/" killed.out || fail "the long run did not reach step 3: $(tail -5 killed.out)"
if ss -ltnpH | grep -q "pid=$head_pid,"; then fail "a worker port is still open: $(ss -ltnp | grep "pid=$head_pid,")"; fi
# The workers on the nodes, and the ssh clients on the head that started them.
workers() { pgrep -f -- "^$BIN worker .*--secret-stdin" || true; }
clients() { pgrep -f -- "^ssh .*--secret-stdin" || true; }
[ "$(workers | wc -l)" -eq 3 ] || fail "expected 3 workers, found: $(workers)"
# A pause from the workbench (SIGSTOP) longer than the heartbeat limit is the head's stall, not
# its workers' silence: after SIGCONT the run goes on with the same workers.
kill -STOP "$head_pid"
sleep 7
kill -CONT "$head_pid"
steps_before=$(grep -c "rl *[0-9]*/" killed.out || true)
for _ in $(seq 300); do [ "$(grep -c "rl *[0-9]*/" killed.out || true)" -ge $((steps_before + 3)) ] && break; sleep 0.1; done
[ "$(grep -c "rl *[0-9]*/" killed.out || true)" -ge $((steps_before + 3)) ] || fail "no progress after the pause: $(tail -3 killed.out)"
if grep -q "no heartbeat" killed.out; then fail "a paused head took its workers for lost: $(grep "no heartbeat" killed.out)"; fi
[ "$(workers | wc -l)" -eq 3 ] || fail "the workers changed over the pause: $(workers)"
kill -9 "$head_pid"
wait "$head_pid" 2>/dev/null || true
head_pid=""
for _ in $(seq 100); do [ -z "$(workers)$(clients)" ] && break; sleep 0.1; done
[ -z "$(workers)" ] || fail "workers outlived their head: $(workers)"
[ -z "$(clients)" ] || fail "ssh clients outlived their head: $(clients)"
echo "two nodes: no open worker port during the run; a 7 s pause lost no worker; no worker left 10 s after the head's SIGKILL"

# Node b drops off the network mid-run: its reference worker falls silent, is given up within
# seconds (heartbeats), and the run stops with an error that says so, since node b cannot take a
# replacement either; nothing hangs.
"$BIN" --store "$STORE" run net.yaml name=partitioned output_dir="$W/partitioned" "$CLUSTER" > cut.out 2>&1 &
head_pid=$!
for _ in $(seq 300); do grep -q "rl *3/" cut.out && break; sleep 0.1; done
grep -q "rl *3/" cut.out || fail "the partitioned run did not reach step 3: $(tail -5 cut.out)"
ip link set roll-b-h down
cut_at=$SECONDS
status=0
for _ in $(seq 600); do kill -0 "$head_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$head_pid" 2>/dev/null && fail "the run still runs 60 s after node b dropped off: $(tail -3 cut.out)"
wait "$head_pid" || status=$?
head_pid=""
[ "$status" -ne 0 ] || fail "the run ended well without node b: $(tail -3 cut.out)"
grep -q "no heartbeat answer" cut.out || fail "no word of the lost heartbeat: $(tail -5 cut.out)"
grep -q "reference worker 0" cut.out || fail "the lost role is not named: $(tail -5 cut.out)"
echo "two nodes: node b lost mid-run: the run stopped after $((SECONDS - cut_at)) s:"; tail -3 cut.out
