#!/usr/bin/env bash
# A SLURM cluster of two nodes on one machine (issue: a small cluster, tested in CI): the nodes
# of .ci/nodes.sh, each running a slurmd, with slurmctld on the head. A run started inside
# `salloc` with `cluster.launcher: slurm` must start each worker as an srun step on its role's
# node (which does not see the head's /dev/shm: each worker mirrors its role's host area over
# TCP), give exactly the curves of the same run with its workers on the head's machine, replace
# a worker killed mid-run on its node, and leave no worker and no step behind when its head is
# killed with SIGKILL.
# Needs root, iproute2, slurmd, slurmctld, slurm-client and munge; bounded by `timeout`; removes
# its namespaces, bridge and daemons whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=.ci/nodes.sh
source .ci/nodes.sh
trap nodes_cleanup EXIT
nodes_up
slurm_up

net_config > "$W/net.yaml"
# No shared_dir: the nodes do not see the head's /dev/shm, and the workers mirror their areas.
CLUSTER="cluster={launcher: slurm, listen: 10.77.0.1, role_hosts: {reference: node2}}"
STORE="$W/s.db"
cd "$W"
timeout 300 "$BIN" --store "$STORE" run --quiet net.yaml output_dir="$W/local"
# The allocation's node list as SLURM writes it (`node[1-2]`), which the head expands.
timeout 300 salloc --nodes=2 --quiet bash -c \
    'echo "$SLURM_JOB_NODELIST" > nodelist && exec "$0" "$@"' \
    "$BIN" --store "$STORE" run --quiet net.yaml name=slurm output_dir="$W/slurm" "$CLUSTER"
[ "$(cat nodelist)" = "node[1-2]" ] || fail "the allocation's node list: $(cat nodelist)"

"$BIN" --store "$STORE" metrics net --json > local.json
"$BIN" --store "$STORE" metrics slurm --json > slurm.json
"$BIN" --store "$STORE" runs show slurm > slurm.txt
python3 - <<'PY' || fail "see above"
import json, re
# What measures the machine or the process layout (timings, rates, store back-pressure, worker
# restarts) differs between runs; every other series must be identical.
def series(path):
    return {(s["stage"], s["key"]): s["values"] for s in json.load(open(path))
            if not s["key"].startswith(("time/", "system/", "store/", "workers/"))
            and not s["key"].endswith("_per_s")}
local, nodes = series("local.json"), series("slurm.json")
assert local.keys() == nodes.keys(), (sorted(local.keys() ^ nodes.keys()))
differ = [k for k in local if local[k] != nodes[k]]
assert not differ, f"series differ between one machine and two SLURM nodes: {differ}"
text = open("slurm.txt").read()
started = [l for l in text.splitlines() if "worker_started" in l]
assert len(started) == 3, text
for role, node, addr in [("actor_train", "node1", "10.77.0.2"), ("actor_infer", "node1", "10.77.0.2"),
                         ("reference", "node2", "10.77.0.3")]:
    line = next(l for l in started if f"{role}-0" in l)
    assert re.search(rf"over tcp 10\.77\.0\.1:\d+ from {re.escape(addr)}:\d+, started by srun on {node}, mirroring its host area$", line), line
print(f"slurm nodes: {len(local)} series identical to one machine's; workers were srun steps on their nodes, mirroring their host areas")
PY

# A longer run inside an allocation: a worker killed mid-run is replaced by a step on its node;
# killing the head with SIGKILL leaves no worker, no srun client and no job step.
sed -i 's/steps: 6/steps: 2000/' net.yaml
salloc --nodes=2 --quiet "$BIN" --store "$STORE" run net.yaml name=killed output_dir="$W/killed" \
    "$CLUSTER" > killed.out 2>&1 &
alloc_pid=$!
for _ in $(seq 600); do grep -q "rl *3/" killed.out && break; sleep 0.1; done
grep -q "rl *3/" killed.out || fail "the long run did not reach step 3: $(tail -5 killed.out)"
workers() { pgrep -f -- "^$BIN worker .*--secret-stdin" || true; }
clients() { pgrep -f -- "^srun .*--secret-stdin" || true; }
steps() { squeue --steps -h -o %i 2>/dev/null | grep -v '\.\(batch\|extern\|interactive\)$' || true; }
[ "$(workers | wc -l)" -eq 3 ] || fail "expected 3 workers, found: $(workers)"
[ "$(steps | wc -l)" -eq 3 ] || fail "expected 3 job steps, found: $(squeue --steps)"
# The reference worker on node2 killed: a new srun step on node2 replaces it and the run goes on.
reference=$(pgrep -f -- "^$BIN worker reference .*--secret-stdin") || fail "no reference worker"
kill -9 "$reference"
steps_before=$(grep -c "rl *[0-9]*/" killed.out || true)
for _ in $(seq 300); do [ "$(grep -c "rl *[0-9]*/" killed.out || true)" -ge $((steps_before + 3)) ] && break; sleep 0.1; done
[ "$(grep -c "rl *[0-9]*/" killed.out || true)" -ge $((steps_before + 3)) ] || fail "no progress after the reference worker was killed: $(tail -3 killed.out)"
replaced=$(pgrep -f -- "^$BIN worker reference .*--secret-stdin") || fail "the reference worker was not replaced"
[ "$replaced" != "$reference" ] || fail "the killed reference worker is still there"
[ "$(ip netns identify "$replaced")" = roll-b ] || fail "the new reference worker is not on node2"
# slurmctld hears of the killed step's end a moment after its replacement starts: wait for it.
for _ in $(seq 100); do [ "$(steps | wc -l)" -eq 3 ] && break; sleep 0.1; done
[ "$(steps | wc -l)" -eq 3 ] || fail "expected 3 job steps after the replacement, found: $(squeue --steps)"
head_pid=$(pgrep -f -- "^$BIN --store $STORE run net.yaml name=killed") || fail "no head"
kill -9 "$head_pid"
head_pid=""
for _ in $(seq 150); do [ -z "$(workers)$(clients)$(steps)" ] && break; sleep 0.1; done
[ -z "$(workers)" ] || fail "workers outlived their head: $(workers)"
[ -z "$(clients)" ] || fail "srun clients outlived their head: $(clients)"
[ -z "$(steps)" ] || fail "job steps outlived their head: $(squeue --steps)"
wait "$alloc_pid" 2>/dev/null || true
echo "slurm nodes: a killed worker was replaced on its node; no worker, srun client or job step left 15 s after the head's SIGKILL"
