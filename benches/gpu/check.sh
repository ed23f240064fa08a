#!/usr/bin/env bash
# The GPU check: run on a lent GPU machine from the repository root, with the CUDA build of
# roll-tui carried there (built on any machine, see README "GPU"):
#
#   here:  source .cuda-toolkit/env.sh && cargo build --release --features cuda,nccl \
#          && mkdir -p target/gpu && strip -o target/gpu/roll-tui target/release/roll-tui \
#          && gzip -9 target/gpu/roll-tui
#   there: bash benches/gpu/check.sh target/gpu/roll-tui.gz   (carry: target/gpu)
#
# Stripped, the binary is 79 MB (candle's CUDA kernels are most of it), over the 64 MiB a carry
# takes; gzipped it is 23 MB, and this script unpacks it.
#
# Each step runs under its own time limit and the script goes on past a failure; everything is
# logged under $OUT (or benches/gpu/out). About 6 minutes on an H200 (an estimate: it has never
# run). What it runs:
#   1. the GPUs and the driver (nvidia-smi), and `roll-tui devices`;
#   2. `roll-tui devices --check`: our CUDA kernels against candle's ops, host-copy offload and
#      reload by DMA bit for bit with their GB/s beside a page-locked memcpy, and small Qwen2 /
#      Qwen3 / Llama models on the GPU against the CPU (logits, training log-probs and gradients,
#      samples);
#   3. Hugging Face log-prob parity with roll-tui scoring on cuda:0 (tests/hf_compat.py, f32);
#   4. the quickstart on cuda:0 beside the same run on the CPU (it must learn as on the CPU), and
#      again with actor_infer in a worker process time-sharing cuda:0 with the trainer (offloads
#      and reloads by DMA; weight sync by CUDA IPC, taken at actor_infer's reload: the events say
#      so, with each move's MB and seconds);
#   5. the Qwen2.5-0.5B shape in bf16: generation (64 x 128 new tokens) and forward+backward
#      (16 x 512) tokens/s and peak device memory, roll-tui against transformers on the same GPU.
# Not in it yet: NCCL weight sync between GPUs (not built), the time-shared RL step against
# dedicated GPUs (needs two).
set -uo pipefail
BIN="${1:-target/gpu/roll-tui.gz}"
OUT="${OUT:-benches/gpu/out}"
mkdir -p "$OUT"
if [[ "$BIN" == *.gz ]]; then
    gunzip -c "$BIN" > "$OUT/roll-tui" && chmod +x "$OUT/roll-tui" && BIN="$OUT/roll-tui"
fi
BIN="$(realpath "$BIN")"
log() { echo "== $*" | tee -a "$OUT/check.log"; }
step() {  # step NAME SECONDS CMD...
    local name="$1" limit="$2"; shift 2
    log "$name"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.txt" | tee -a "$OUT/check.log"
    log "$name: exit $rc after $((SECONDS - t0)) s"
}
# The CUDA 13 runtime libraries (cuBLAS, cuRAND, NVRTC, NCCL) of this machine's PyTorch.
NV="$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)"
export LD_LIBRARY_PATH="$NV/cu13/lib:$NV/nccl/lib:$NV/cublas/lib:$NV/cuda_runtime/lib:$NV/curand/lib:$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "roll-tui $BIN, LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$BIN" | grep -E "not found|cuda|cublas|curand|nvrtc|nccl" | tee -a "$OUT/check.log"
step gpus 30 bash -c "nvidia-smi; lscpu | head -20"
step devices 60 "$BIN" devices
step devices-check 180 "$BIN" devices --check
step hf-parity 180 env ROLL_DEVICE=cuda:0 python3 tests/hf_compat.py "$BIN"
Q="experiments/quickstart.yaml"
step quickstart-cpu 240 "$BIN" --store "$OUT/q.db" run "$Q" --overwrite name=q-cpu "output_dir=$OUT/q-cpu"
step quickstart-cuda 240 "$BIN" --store "$OUT/q.db" run "$Q" --overwrite name=q-cuda "output_dir=$OUT/q-cuda" workers.devices.kind=cuda
step quickstart-cuda-workers 300 "$BIN" --store "$OUT/q.db" run "$Q" --overwrite name=q-cuda-workers \
    "output_dir=$OUT/q-cuda-workers" workers.devices.kind=cuda workers.actor_infer.mode=process
step quickstart-cuda-workers-events 30 "$BIN" --store "$OUT/q.db" runs show q-cuda-workers --events 40
step quickstart-compare 30 bash -c "'$BIN' --store '$OUT/q.db' runs; '$BIN' --store '$OUT/q.db' metrics q-cpu | tail -n 30; '$BIN' --store '$OUT/q.db' metrics q-cuda | tail -n 30; '$BIN' --store '$OUT/q.db' metrics q-cuda-workers | tail -n 30"
step bench-roll 300 env ROLL_DEVICE=cuda:0 "$BIN" model bench --shape qwen2.5-0.5b --dtype bf16 \
    --batch 64 --new-tokens 128 --train-batch 16 --train-len 512 --runs 3 --json
step bench-hf 300 python3 benches/gpu/hf_bench.py --device cuda --dtype bfloat16 \
    --batch 64 --new-tokens 128 --train-batch 16 --train-len 512 --runs 3
log "done: $OUT"
