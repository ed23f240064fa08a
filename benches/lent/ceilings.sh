#!/usr/bin/env bash
# On a lent device machine's CPU (benches/RESULTS.md's git history): the cores' FMA peak, our
# products alone (kernels/cpu/benches/ceiling.rs), MKL's (benches/peer_products.py) and our
# forward+backward, with and without AVX-512, two cores pinned. Carried beside it in .dev/ (see
# tiny_rounds.sh): engine_v4, engine_avx2, ceiling_v4, ceiling_avx2 (`cargo bench -p
# roll-cpu-kernels --bench ceiling --no-run`, both ways), peer_products.py, and `peak`, an FMA
# loop in C: twelve independent chains of `_mm256_fmadd_ps` / `_mm512_fmadd_ps`, one thread then
# two (gcc -O2 -mavx2 -mfma -mavx512f -pthread).
# and our forward+backward, AVX-512 and AVX2 builds, two cores pinned.
set -u
cd "$(dirname "$0")"
LOG=${OUT:-/tmp}/sit2.log
exec > >(tee -a "$LOG") 2>&1
lscpu | sed -n 's/^Model name: *//p; s/^CPU max MHz: *//p; s/^Model: *//p'; uptime
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl && export PYTHONPATH=/tmp/site
PIN="taskset -c 0,1"
AVX2=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
for r in 1 2; do
  echo "== round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  $PIN ./peak
  for b in v4 avx2; do $PIN ./ceiling_$b fma; $PIN ./ceiling_$b products; $PIN ./ceiling_$b shapes | tail -1; done 2>&1 | sed 's/^/ceiling /'
  $PIN python3 peer_products.py 2>/dev/null | tail -2 | sed 's/^/mkl_native /'
  $PIN env "${AVX2[@]}" python3 peer_products.py 2>/dev/null | tail -2 | sed 's/^/mkl_avx2 /'
  for b in v4 avx2; do $PIN ./engine_$b fwd_bwd 2>/dev/null | grep tokens/s | sed "s/^/$b /"; done
  ROLL_LANES=1 $PIN ./engine_avx2 fwd_bwd 2>/dev/null | grep tokens/s | sed "s/^/avx2_one_lane /"
done
echo "== done $(date +%T)"
