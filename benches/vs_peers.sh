#!/usr/bin/env bash
# The engine against Hugging Face transformers and TRL, back to back in one run, with the ratios.
#
#   benches/vs_peers.sh [--qwen05] [--no-tiny] [--rounds N] [--pairs N] [--cpus LIST] [--torch-isa avx2] [--avx2]
#
# --cpus LIST pins every run, theirs and ours, to those CPUs (`taskset -c LIST`, e.g. 0,1: two
# cores of a bigger machine standing for this project's 2-core kind) and gives the peers that many
# threads; ours reads the pinned count itself. --torch-isa avx2 holds PyTorch's own kernels,
# oneDNN and MKL to AVX2, to compare like with like on an AVX-512 machine; --avx2 does that and
# builds ours without its AVX-512 code too (`--no-default-features`): both sides as an AVX2-only
# machine would run them.
#
# Each round runs the peers' tiny-model workloads, then ours (`cargo bench --bench engine`), so
# both sides see the same machine state; the ratios are ours / theirs (for the GRPO step, whose
# figure is a time, theirs / ours), so above 1 means we are faster; ours in one lane
# (`ROLL_LANES=1`, the engine before lanes) is shown beside. With several rounds the median
# ratio and the range follow: on a shared machine one round says little. Each round also times
# the tiny forward+backward's matrix products alone, on cold operands
# (kernels/cpu/benches/ceiling.rs: an estimate of what the step's arithmetic costs with gemm as
# it is, not a strict bound), and shows both sides as a share of it.
# `--pairs N` times the tiny forward+backward in N pairs of runs back to back (HF's bench, whose
# forward+backward figure is taken, then ours at once; the order swapped every pair so that a
# machine slowing or speeding up over the pairs favours neither side), and prints each pair's
# ratio and their median and quartiles. In a round HF's forward+backward and ours are ~20-30 s
# apart, with TRL and our generation between, and this host's speed moves by a third over
# minutes (benches/RESULTS.md); a pair's two runs are a few seconds apart. Each run's share of
# CPU time stolen by the hypervisor is shown (HF's over its whole process, ~6 s; of the pinned
# CPUs with --cpus, else of the machine), and the pairs with at most STEAL_MAX percent (default
# 2) on both sides are summarised apart. With --pairs, --rounds defaults to 0 (the pairs alone;
# --qwen05 then needs --rounds N).
# `--qwen05` adds the Qwen2.5-0.5B shape to every round (~7 minutes a round, 5-8 GB of memory
# each side) and its ratios to the medians; `--no-tiny` leaves the tiny workloads out (with
# `--qwen05`: rounds of the 0.5B shape alone).
#
# Needs the peers' venv (../shared/peers/README.md):
#   python3 -m venv /tmp/peervenv && /tmp/peervenv/bin/pip install -r ../shared/peers/requirements-lock.txt
# PEER_PYTHON and PEERS override where the venv's python and the peer scripts are.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_PYTHON=${PEER_PYTHON:-/tmp/peervenv/bin/python}
PEERS=${PEERS:-$(cd .. && pwd)/shared/peers}
ROUNDS=
PAIRS=0
QWEN05=0
TINY=1
CPUS=
TORCH_ISA=
# Our build's cargo flags (--avx2: without the AVX-512 code).
OURS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --qwen05) QWEN05=1 ;;
        --no-tiny) TINY=0 ;;
        --rounds) ROUNDS=${2:?"--rounds needs a count"}; shift ;;
        --pairs) PAIRS=${2:?"--pairs needs a count"}; shift ;;
        --cpus) CPUS=${2:?"--cpus needs a CPU list, e.g. 0,1"}; shift ;;
        --torch-isa) TORCH_ISA=${2:?"--torch-isa needs an instruction set: avx2"}; shift ;;
        --avx2) TORCH_ISA=avx2; OURS=(--no-default-features) ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "vs_peers.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
# Counts: up to six digits, read as decimal (10#: a leading zero is not octal).
[[ "$PAIRS" =~ ^[0-9]{1,6}$ ]] || { echo "vs_peers.sh: --pairs takes a count, not '$PAIRS'" >&2; exit 2; }
PAIRS=$((10#$PAIRS))
if [ -z "$ROUNDS" ]; then if [ "$PAIRS" -gt 0 ]; then ROUNDS=0; else ROUNDS=1; fi; fi
[[ "$ROUNDS" =~ ^[0-9]{1,6}$ ]] || { echo "vs_peers.sh: --rounds takes a count, not '$ROUNDS'" >&2; exit 2; }
ROUNDS=$((10#$ROUNDS))
[ "$ROUNDS" -gt 0 ] || [ "$PAIRS" -gt 0 ] || { echo "vs_peers.sh: --rounds 0 without --pairs leaves nothing to run" >&2; exit 2; }
[ "$PAIRS" -eq 0 ] || [ "$TINY" = 1 ] || { echo "vs_peers.sh: --pairs times the tiny model, which --no-tiny leaves out" >&2; exit 2; }
[ "$QWEN05" = 0 ] || [ "$ROUNDS" -gt 0 ] || { echo "vs_peers.sh: --qwen05 runs in rounds, and --pairs alone makes none: add --rounds N" >&2; exit 2; }
STEAL_MAX=${STEAL_MAX:-2}
if [ "$PAIRS" -gt 0 ]; then
    [[ "$STEAL_MAX" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "vs_peers.sh: STEAL_MAX takes a percentage such as 2 or 0.5, not '$STEAL_MAX'" >&2; exit 2; }
fi
[ "$TINY" = 1 ] || [ "$QWEN05" = 1 ] || { echo "vs_peers.sh: --no-tiny leaves nothing to run without --qwen05" >&2; exit 2; }
[ -x "$PEER_PYTHON" ] || { echo "vs_peers.sh: no peer python at '$PEER_PYTHON' (see the header)" >&2; exit 1; }
[ -f "$PEERS/hf_generate_bench.py" ] || { echo "vs_peers.sh: no peer scripts in '$PEERS'" >&2; exit 1; }
# PIN prefixes every run; PEER_ARGS and PEER_ENV go to the peers alone.
PIN=(); PEER_ARGS=(); PEER_ENV=(); STEAL_CPUS=
if [ -n "$CPUS" ]; then
    n=$(taskset -c "$CPUS" nproc) || { echo "vs_peers.sh: --cpus '$CPUS' is not a CPU list taskset takes" >&2; exit 2; }
    # The pinned CPUs as the kernel lists them (ranges and commas, no strides), for their steal.
    STEAL_CPUS=$(taskset -c "$CPUS" sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)
    PIN=(taskset -c "$CPUS"); PEER_ARGS=(--threads "$n")
fi
case "${TORCH_ISA,,}" in
    "") ;;
    # The names each library takes for AVX2 (each names AVX-512's variants its own way).
    avx2) PEER_ENV=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2) ;;
    *) echo "vs_peers.sh: --torch-isa takes avx2, not '$TORCH_ISA'" >&2; exit 2 ;;
esac
# A peer script, run in the peers' directory, pinned, with the peers' environment and arguments;
# with RSS_TO=FILE, its peak RSS (kB, /usr/bin/time's %M) is written to FILE.
peer() {
    (
        timer=()
        if [ -n "${RSS_TO:-}" ]; then timer=(/usr/bin/time -f '%M' -o "$RSS_TO"); fi
        cd "$PEERS" && "${PIN[@]}" env "${PEER_ENV[@]}" "${timer[@]}" "$PEER_PYTHON" "$@" "${PEER_ARGS[@]}"
    )
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
json() { "$PEER_PYTHON" -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
# The number before a unit in our bench's line for a workload: `ours WORKLOAD 'tokens/s'`.
ours() { grep -m1 "^$1" "$WORK/${WORK_FILE:-ours.txt}" | grep -oE "[0-9.]+ $2" | head -1 | cut -d' ' -f1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else printf "n/a" }'; }
# The median of its arguments (ratios such as 1.92x), and their range: one round on a shared
# machine says little, the rounds' median more.
# Its arguments (ratios such as 1.92x) as numbers, one a line, smallest first, n/a left out.
sorted_ratios() { printf '%s\n' "$@" | { grep -v n/a || true; } | tr -d x | sort -g; }
median() { sorted_ratios "$@" | awk '{ v[NR] = $1 } END { if (!NR) { printf "n/a"; exit } m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2fx (%.2fx-%.2fx over %d rounds)", m, v[1], v[NR], NR }'; }
GEN=(); FB=(); STEP=(); GEN1=(); FB1=(); STEP1=(); Q_GEN=(); Q_FB=(); Q_RSS=()

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, avx512: $(grep -q avx512f /proc/cpuinfo && echo yes || echo no); load: $(cut -d' ' -f1-3 /proc/loadavg)${CPUS:+; pinned to CPUs $CPUS}${TORCH_ISA:+; torch held to $TORCH_ISA}${OURS[*]:+; ours built $OURS}"
cargo bench "${OURS[@]}" --bench engine --no-run >/dev/null 2>&1 || cargo bench "${OURS[@]}" --bench engine --no-run
cargo bench "${OURS[@]}" -p roll-cpu-kernels --bench ceiling --no-run >/dev/null 2>&1 || cargo bench "${OURS[@]}" -p roll-cpu-kernels --bench ceiling --no-run
if [ "$TINY" = 1 ]; then
    "$PEER_PYTHON" "$PEERS/make_tiny.py" --out "$WORK/tiny" >/dev/null 2>&1 \
        || { echo "vs_peers.sh: make_tiny.py failed to write the tiny model" >&2; exit 1; }
fi
if [ "$QWEN05" = 1 ] && [ "$ROUNDS" -gt 0 ]; then
    "$PEER_PYTHON" "$PEERS/make_tiny.py" --shape qwen2.5-0.5b --out "$WORK/qwen05" >/dev/null 2>&1
fi

# One round of the Qwen2.5-0.5B shape (its model directory made once, before the rounds).
# /usr/bin/time's %M is in kB; GB here are 10^6 kB, as benches/RESULTS.md counts them.
gb() { awk -v k="$(tail -1 "$1")" 'BEGIN { printf "%.2f GB", k / 1e6 }'; }
qwen05_round() {
    hf=$(RSS_TO="$WORK/hf_rss" peer hf_generate_bench.py --model "$WORK/qwen05" --batch 16 --train_len 64 --runs 3 2>/dev/null)
    # Ours as two processes, the forward+backward and the generation, without `qwen05`'s AdamW
    # steps (HF's script has no optimizer; AdamW's moments alone are 4 GB at this shape): the
    # peak to set beside HF's is the larger of the two.
    "${PIN[@]}" /usr/bin/time -f '%M' -o "$WORK/our_rss_fb" cargo bench "${OURS[@]}" --bench engine -- qwen05-fwd_bwd >"$WORK/ours.txt" 2>/dev/null
    "${PIN[@]}" /usr/bin/time -f '%M' -o "$WORK/our_rss_gen" cargo bench "${OURS[@]}" --bench engine -- qwen05-generation >>"$WORK/ours.txt" 2>/dev/null
    sort -n <(tail -1 "$WORK/our_rss_fb") <(tail -1 "$WORK/our_rss_gen") | tail -1 >"$WORK/our_rss"
    hf_gen=$(echo "$hf" | json gen_tokens_per_s)
    hf_fb=$(echo "$hf" | json fwd_bwd_tokens_per_s)
    # The second run of each: the first pays the allocator's first touch of every buffer (HF's
    # bench times its runs after a warm-up too).
    our_gen=$(grep "generation" "$WORK/ours.txt" | tail -1 | grep -oE "[0-9.]+ tokens/s" | cut -d' ' -f1)
    our_fb=$(grep "forward+backward" "$WORK/ours.txt" | tail -1 | grep -oE "[0-9.]+ tokens/s" | cut -d' ' -f1)
    Q_GEN+=("$(ratio "$our_gen" "$hf_gen")"); Q_FB+=("$(ratio "$our_fb" "$hf_fb")")
    Q_RSS+=("$(ratio "$(tail -1 "$WORK/our_rss")" "$(tail -1 "$WORK/hf_rss")")")
    echo "round $1, Qwen2.5-0.5B shape:"
    echo "  generation, batch 16, 32 new tokens: ours $our_gen tokens/s, HF $hf_gen -> ${Q_GEN[-1]}"
    echo "  forward+backward 16 x 64:           ours $our_fb tokens/s, HF $hf_fb -> ${Q_FB[-1]}"
    echo "  peak RSS: ours $(gb "$WORK/our_rss") (forward+backward $(gb "$WORK/our_rss_fb"), generation $(gb "$WORK/our_rss_gen")), HF $(gb "$WORK/hf_rss") -> ${Q_RSS[-1]} HF's"
}

# The tiny workloads of one round.
tiny_round() {
    hf=$(peer hf_generate_bench.py --model "$WORK/tiny" 2>/dev/null)
    trl=$(peer grpo_trl.py --model "$WORK/tiny" --lr 1e-3 --beta 0.0 --steps 30 2>/dev/null | tail -1)
    "${PIN[@]}" cargo bench "${OURS[@]}" --bench engine -- generation >"$WORK/ours.txt" 2>/dev/null
    "${PIN[@]}" cargo bench "${OURS[@]}" --bench engine -- fwd_bwd >>"$WORK/ours.txt" 2>/dev/null
    "${PIN[@]}" cargo bench "${OURS[@]}" --bench engine -- grpo >>"$WORK/ours.txt" 2>/dev/null
    # Ours again in one lane (the engine before lanes), for its own ratio.
    for w in generation fwd_bwd grpo; do
        ROLL_LANES=1 "${PIN[@]}" cargo bench "${OURS[@]}" --bench engine -- $w 2>/dev/null
    done >"$WORK/one_lane.txt"
    # The step's matrix products alone in this round, on cold operands (kernels/cpu/benches/ceiling.rs).
    "${PIN[@]}" cargo bench "${OURS[@]}" -p roll-cpu-kernels --bench ceiling -- products >"$WORK/ceiling.txt" 2>/dev/null \
        || { echo "vs_peers.sh: the ceiling bench failed (cargo bench -p roll-cpu-kernels --bench ceiling)" >&2; exit 1; }
    hf_gen=$(echo "$hf" | json gen_tokens_per_s)
    hf_fb=$(echo "$hf" | json fwd_bwd_tokens_per_s)
    trl_step=$(echo "$trl" | json median_step_s)
    our_gen=$(ours generation "tokens/s")
    our_fb=$(ours forward "tokens/s")
    our_step=$(ours grpo "s median")
    one_gen=$(WORK_FILE=one_lane.txt ours generation "tokens/s")
    one_fb=$(WORK_FILE=one_lane.txt ours forward "tokens/s")
    one_step=$(WORK_FILE=one_lane.txt ours grpo "s median")
    ceiling=$(grep -oE "[0-9.]+ tokens/s" "$WORK/ceiling.txt" | tail -1 | cut -d' ' -f1 || true)
    GEN+=("$(ratio "$our_gen" "$hf_gen")"); FB+=("$(ratio "$our_fb" "$hf_fb")"); STEP+=("$(ratio "$trl_step" "$our_step")")
    GEN1+=("$(ratio "$one_gen" "$hf_gen")"); FB1+=("$(ratio "$one_fb" "$hf_fb")"); STEP1+=("$(ratio "$trl_step" "$one_step")")
    echo "round $1, tiny model:"
    echo "  generation, batch 64, 32 new tokens: ours $our_gen tokens/s, HF $hf_gen -> ${GEN[-1]} (one lane: $one_gen, ${GEN1[-1]})"
    echo "  forward+backward 64 x 16:           ours $our_fb tokens/s, HF $hf_fb -> ${FB[-1]} (one lane: $one_fb, ${FB1[-1]})"
    echo "  GRPO step 8 x 8, <= 8 tokens:        ours $our_step s, TRL $trl_step s -> ${STEP[-1]} (one lane: $one_step s, ${STEP1[-1]})"
    echo "  forward+backward's matrix products alone, cold operands: ${ceiling:-n/a} tokens/s (ours at $(ratio "$our_fb" "$ceiling"), HF at $(ratio "$hf_fb" "$ceiling") of it)"
}

# The quartiles of its arguments (ratios such as 1.92x) by the median-of-halves rule, with the
# median: the middle half of the pairs' ratios.
quartiles() { [ $# -gt 0 ] || { printf "none"; return; }; sorted_ratios "$@" | awk '
    function med(lo, hi,   n) { n = hi - lo + 1; return n % 2 ? v[lo + (n - 1) / 2] : (v[lo + n / 2 - 1] + v[lo + n / 2]) / 2 }
    { v[NR] = $1 }
    END { if (!NR) { printf "n/a"; exit }
          h = int(NR / 2)
          q1 = NR > 1 ? med(1, h) : v[1]; q3 = NR > 1 ? med(NR - h + 1, NR) : v[1]
          printf "median %.2fx, quartiles %.2fx-%.2fx, range %.2fx-%.2fx over %d pair%s", med(1, NR), q1, q3, v[1], v[NR], NR, NR == 1 ? "" : "s" }'; }
# CPU ticks from /proc/stat as "STEAL TOTAL" (user through steal; guest time is already in
# user): of the machine (its "cpu" line), or of the pinned CPUs (theirs summed; STEAL_CPUS is
# the kernel's list such as 0-1,4). Steal is time the hypervisor gave this VM's CPUs to other
# guests; on this project's shared hosts it has reached a third of a run and halved its speed,
# so a run during it measures the neighbours, not the code. The total counts idle time too: a
# run that leaves a CPU idle reads as less stolen than its busy CPU was.
ticks() {
    awk -v list="$STEAL_CPUS" '
        BEGIN { if (list == "") want["cpu"] = 1
                n = split(list, part, ",")
                for (i = 1; i <= n; i++) {
                    if (split(part[i], r, "-") == 2) { for (c = r[1] + 0; c <= r[2] + 0; c++) want["cpu" c] = 1 }
                    else want["cpu" part[i]] = 1 } }
        ($1 in want) { for (i = 2; i <= 9; i++) t += $i; s += $9 }
        END { print s + 0, t + 0 }' /proc/stat
}
# The share of the CPU time stolen between two `ticks` readings, in percent (one decimal).
stolen() { awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); d = y[2] - x[2]; printf "%.1f", (d > 0 ? 100 * (y[1] - x[1]) / d : 0) }'; }
# Whether both shares are at most STEAL_MAX.
calm() { awk -v a="$1" -v b="$2" -v m="$STEAL_MAX" 'BEGIN { exit !(a + 0 <= m + 0 && b + 0 <= m + 0) }'; }
# One pair of the tiny forward+backward, HF's and ours back to back, in the order $2 (hf or ours).
# PAIR has every pair's ratio, CALM those of the pairs with at most STEAL_MAX percent stolen
# during each side's run.
PAIR=(); CALM=()
fb_pair() {
    local side hf_fb our_fb hf_st our_st t0 fma
    # One core's multiply-add rate just before (kernels/cpu/benches/ceiling.rs, 0.6 s): this
    # host's has moved between 130 and 245 GFLOP/s from one hour to the next with no steal.
    # Only context: a failed probe shows as n/a.
    fma=$("${PIN[@]}" cargo bench "${OURS[@]}" -p roll-cpu-kernels --bench ceiling -- fma 2>/dev/null | grep -oE "[0-9.]+ GFLOP/s" | tail -1) || fma=
    for side in $2; do
        t0=$(ticks)
        case $side in
            hf) peer hf_generate_bench.py --model "$WORK/tiny" >"$WORK/pair_hf.txt" 2>"$WORK/pair_hf.err" \
                    || { echo "vs_peers.sh: HF's bench failed in pair $1:" >&2; tail -5 "$WORK/pair_hf.err" >&2; exit 1; }
                hf_st=$(stolen "$t0" "$(ticks)")
                hf_fb=$(json fwd_bwd_tokens_per_s <"$WORK/pair_hf.txt" 2>/dev/null) \
                    || { echo "vs_peers.sh: no forward+backward figure in HF's output in pair $1" >&2; exit 1; } ;;
            ours) "${PIN[@]}" cargo bench "${OURS[@]}" --bench engine -- fwd_bwd >"$WORK/pair.txt" 2>"$WORK/pair.err" \
                    || { echo "vs_peers.sh: our bench failed in pair $1:" >&2; tail -5 "$WORK/pair.err" >&2; exit 1; }
                  our_st=$(stolen "$t0" "$(ticks)")
                  our_fb=$(WORK_FILE=pair.txt ours forward "tokens/s") \
                    || { echo "vs_peers.sh: no forward+backward figure in our bench's output in pair $1" >&2; exit 1; } ;;
        esac
    done
    PAIR+=("$(ratio "$our_fb" "$hf_fb")")
    if calm "$hf_st" "$our_st"; then CALM+=("${PAIR[-1]}"); fi
    echo "pair $1 ($2; one core's FMA ${fma:-n/a}): forward+backward 64 x 16, ours $our_fb tokens/s (${our_st}% stolen), HF $hf_fb (${hf_st}% stolen) -> ${PAIR[-1]}"
}
for pair in $(seq 1 "$PAIRS"); do
    if [ $((pair % 2)) = 1 ]; then fb_pair "$pair" "hf ours"; else fb_pair "$pair" "ours hf"; fi
done
if [ "$PAIRS" -gt 0 ]; then
    echo "tiny forward+backward, ours / HF over the pairs: $(quartiles "${PAIR[@]}")"
    echo "  the pairs with at most ${STEAL_MAX}% stolen on both sides: $(quartiles "${CALM[@]}")"
fi

for round in $(seq 1 "$ROUNDS"); do
    if [ "$TINY" = 1 ]; then tiny_round "$round"; fi
    if [ "$QWEN05" = 1 ]; then qwen05_round "$round"; fi
done

if [ "$ROUNDS" -gt 1 ] && [ "$TINY" = 1 ]; then
    echo "median of the rounds' ratios, tiny model (one lane in brackets):"
    echo "  generation:       $(median "${GEN[@]}")  [$(median "${GEN1[@]}")]"
    echo "  forward+backward: $(median "${FB[@]}")  [$(median "${FB1[@]}")]"
    echo "  GRPO step:        $(median "${STEP[@]}")  [$(median "${STEP1[@]}")]"
fi
if [ "$ROUNDS" -gt 1 ] && [ "$QWEN05" = 1 ]; then
    echo "median of the rounds' ratios, Qwen2.5-0.5B shape:"
    echo "  generation:       $(median "${Q_GEN[@]}")"
    echo "  forward+backward: $(median "${Q_FB[@]}")"
    echo "  peak RSS:         $(median "${Q_RSS[@]}") of HF's"
fi
