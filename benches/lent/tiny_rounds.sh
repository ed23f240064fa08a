#!/usr/bin/env bash
# Rounds of the tiny workloads on a lent device machine's CPU (benches/RESULTS.md's git history):
# HF transformers natively and held to AVX2, our engine built with and without AVX-512,
# TRL both ways, every run pinned to two cores to stand for this project's 2-core machines.
#
# The device machine has python3 with torch and transformers but no Rust and no network, so build
# here and carry (the device tool's `carry`, both folders listed in .git/info/exclude):
#   .dev/engine_v4, .dev/engine_avx2   `cargo bench --bench engine --no-run` with and without
#                                      `--no-default-features`, the printed executables copied
#   .dev/peers/                        ../shared/peers/*.py
#   .dev/run.sh                        this script
#   .whl/                              trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19
#                                      (`pip download --no-deps --only-binary=:all: --python-version 3.12 ...`)
# then run `ROUNDS=5 TRL_ROUNDS=3 bash .dev/run.sh`; the log lands in $OUT/sit.log.
set -u
cd "$(dirname "$0")"
LOG=${OUT:-/tmp}/sit.log
exec > >(tee -a "$LOG") 2>&1
lscpu | sed -n 's/^Model name: *//p'; nproc; uptime; grep -o -w -E 'avx512f|avx512_bf16|amx_tile|avx2' /proc/cpuinfo | sort | uniq -c
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl && export PYTHONPATH=/tmp/site
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.backends.cpu.get_cpu_capability())"
python3 -c "import trl; print('trl', trl.__version__)" || echo "no trl"
python3 peers/make_tiny.py --out /tmp/tiny >/dev/null 2>&1 || { echo "make_tiny failed"; python3 peers/make_tiny.py --out /tmp/tiny; exit 1; }
PIN="taskset -c 0,1"
AVX2=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
ROUNDS=${ROUNDS:-3}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd peers && $PIN python3 hf_generate_bench.py --model /tmp/tiny --threads 2 2>/dev/null | tail -1 | sed 's/^/hf_native /')
  (cd peers && $PIN env "${AVX2[@]}" python3 hf_generate_bench.py --model /tmp/tiny --threads 2 2>/dev/null | tail -1 | sed 's/^/hf_avx2 /')
  for w in generation fwd_bwd grpo; do $PIN ./engine_v4 $w 2>/dev/null | grep -E "tokens/s|median" | sed 's/^/v4 /'; done
  for w in generation fwd_bwd grpo; do $PIN ./engine_avx2 $w 2>/dev/null | grep -E "tokens/s|median" | sed 's/^/avx2 /'; done
  if [ "$r" -le "${TRL_ROUNDS:-2}" ]; then
    (cd peers && $PIN python3 grpo_trl.py --model /tmp/tiny --lr 1e-3 --beta 0.0 --steps 30 --threads 2 2>/dev/null | tail -1 | sed 's/^/trl_native /')
    (cd peers && $PIN env "${AVX2[@]}" python3 grpo_trl.py --model /tmp/tiny --lr 1e-3 --beta 0.0 --steps 30 --threads 2 2>/dev/null | tail -1 | sed 's/^/trl_avx2 /')
  fi
done
echo "== done $(date +%T)"
