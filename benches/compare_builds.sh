#!/usr/bin/env bash
# Behaviour check across a restructuring: run the same short trainings with two builds of roll-tui
# and compare every metric series (except time/, system/ and store/, which measure the machine) and
# every stored sample, byte for byte.
#
#   benches/compare_builds.sh OLD_BINARY NEW_BINARY [OUT_DIR]
#
# Build the old binary from the commit to compare against (e.g. `git worktree add /tmp/old COMMIT &&
# cargo build --manifest-path /tmp/old/Cargo.toml`), the new one from the working tree. Each build
# runs: the quickstart shortened (SFT 30 steps, RL 6) in-process, with every role in worker
# processes, and asynchronously (α = 1, actor_infer in a worker on its own device); and a GAE run
# with a KL reference refreshed every 3 steps, in-process and with every role in worker processes.
# Exits non-zero when anything differs.
set -euo pipefail
OLD=$(realpath "$1"); NEW=$(realpath "$2"); OUT=${3:-$(mktemp -d)}
mkdir -p "$OUT"
# The quickstart written out whole (tests/configs.rs checks it equals experiments/quickstart.yaml),
# so that builds from before `include:` read it too.
cp "$(dirname "$0")/../tests/fixtures/quickstart_inline.yaml" "$OUT/quickstart.yaml"
cat > "$OUT/gae.yaml" <<'Y'
name: gae
seed: 8
model: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=abcdefgh>", max_positions: 64 } }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 200, digits: 1 }, reward: math_rule }
    - { name: rev, synthetic: { task: reversal, count: 200, min_len: 3, max_len: 4, alphabet: abcd }, reward: exact_match }
sft: { steps: 4, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 8
  prompts_per_step: 6
  group_size: 4
  adv_estimator: gae
  critic: { optimizer: { lr: 0.001 }, value_clip: 0.5 }
  kl: { mode: in_loss, coef: 0.05, refresh_every: 3 }
  ppo_epochs: 2
  mini_batches: 2
  micro_batch_size: 5
  sampling: { temperature: 1.0, max_new_tokens: 8 }
  optimizer: { lr: 0.001 }
checkpoint: { every: 3 }
Y
ALL="workers.actor_train.mode=process workers.actor_infer.mode=process workers.reward.mode=process workers.reference.mode=process workers.critic.mode=process"
QUICK="$OUT/quickstart.yaml sft.steps=30 rl.steps=6"
runs() {
  local bin=$1 dir=$2
  mkdir -p "$dir"
  run() { local name=$1; shift; "$bin" --store "$dir/s.db" run "$@" name=$name output_dir="$dir/runs/$name" --quiet --overwrite > "$dir/$name.log" 2>&1; }
  run q_in $QUICK
  run q_proc $QUICK $ALL
  run q_async $QUICK rl.async_generation_ratio=1 workers.devices.count=2 'workers.actor_infer.device_mapping=[1]' workers.actor_infer.mode=process
  run g_in "$OUT/gae.yaml"
  run g_proc "$OUT/gae.yaml" $ALL
  for n in q_in q_proc q_async g_in g_proc; do
    "$bin" --store "$dir/s.db" metrics $n --csv | grep -v ',time/\|,system/\|,store/' | cut -d, -f1,2,3,5 > "$dir/$n.metrics.csv"
    "$bin" --store "$dir/s.db" samples $n --limit 1000000 --json > "$dir/$n.samples.json"
  done
}
runs "$OLD" "$OUT/old"
runs "$NEW" "$OUT/new"
status=0
for f in "$OUT"/old/*.metrics.csv "$OUT"/old/*.samples.json; do
  n=$(basename "$f")
  if cmp -s "$f" "$OUT/new/$n"; then echo "same      $n ($(wc -l < "$f") lines)"; else echo "DIFFERENT $n"; status=1; fi
done
exit $status
