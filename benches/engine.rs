//! Engine benchmarks on the tiny Qwen2 shape (hidden 128, intermediate 512, 4 layers, 4 heads, 2 KV
//! heads, head_dim 32, 24-token character vocab, tied embeddings, f32), random weights:
//!   1. one GRPO step: 8 prompts x 8 samples of up to 8 tokens, score, advantages, fwd+bwd+AdamW;
//!   2. batched generation: batch 64, 6-token prompts, exactly 32 new tokens, sampling;
//!   3. forward+backward tokens/s at 64 x 16;
//!   4. co-scheduling: two processes running (3) at once, as colocated worker processes do, with
//!      every core each (oversubscribed) and with the cores shared as `workers.<role>.threads`
//!      shares them by default; their summed tokens/s against one process alone;
//!   5. only when asked (`-- qwen05`, minutes): the Qwen2.5-0.5B shape (hidden 896, intermediate
//!      4864, 14 heads, 2 KV heads, tied 151,936-token vocabulary; `QWEN05_LAYERS` of its 24
//!      layers, default 24), forward+backward at 16 x 64 and generation at batch 16
//!      and an AdamW step over its parameters (`-- qwen05-fwd_bwd`, `-- qwen05-generation` or
//!      `-- qwen05-adamw` for one of them).
//!   6. the skinny product of decoding (few rows times a weight) against candle's GEMM, at the
//!      shapes of a decode step and a prefill of both models: where `skinny::MAX_ROWS` comes from.
//!
//! Generation and forward+backward split their batches into the model's lanes, as the engine and
//! training do (`roll::model::threads::lanes`); `ROLL_LANES=1` measures them in one lane.
//!
//! `BENCH_DTYPE=bfloat16` builds both models in bf16 (on the CPU a bf16 model computes in f32
//! through the fused kernels, its weights widened as they are read: `Transformer::compute_dtype`,
//! benches/RESULTS.md's git history).
//!
//! Run: `cargo bench --bench engine` (prints medians after untimed warm-up repetitions, as the
//! peers' scripts time theirs; record them in benches/RESULTS.md). The 0.5B workloads print each
//! of their two runs: the second is the warm one.

use std::time::Instant;

// The allocator of the `roll-tui` binary (src/main.rs), so the bench measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use candle_core::{Device, Tensor};
use roll::config::{RunConfig, load::from_yaml_str};
use roll::model::init_model;
use roll::model::threads::side_by_side;
use roll::pipeline::rl_update::{RlBatch, UpdateState, update};
use roll::role::actor_train::ActorTrain;
use roll::rollout::{Request, SamplingParams, generate};
use roll::train::{AdamW, GradAccumulator, OptimizerConfig};

#[path = "common/workloads.rs"]
mod workloads;
use workloads::{
    bench_dtype, forward_backward, lanes_of, peak_note, qwen05_layers, qwen05_options,
    reset_peak_rss, tiny_options,
};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median of `runs` repetitions after `warmups` untimed ones, as the peers' scripts time
/// theirs (HF's bench times its runs after one warm-up, TRL's steps after two): at the tiny shape
/// a process's first calls take 1.2-2.5x a later one (the first two or three of seven
/// generations 25-50 ms where the rest took ~20: the kernel clearing the fresh pages the
/// allocator grows into, under a VM that backs them on first touch too), and a median of the
/// cold and the warm ones measures neither.
/// `rep(i)` runs repetition i and returns the seconds it timed, so it may leave its setup out.
/// `BENCH_RUNS=N` times N repetitions instead: a profile (`perf record -D`) then sees mostly the
/// steady state rather than the process's start.
fn median_after_warmup(warmups: u64, runs: u64, mut rep: impl FnMut(u64) -> f64) -> f64 {
    let runs = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(runs);
    for i in 0..warmups {
        rep(i);
    }
    median((warmups..warmups + runs).map(rep).collect())
}

#[allow(unsafe_code)] // the binary's thread settings, before any thread exists
fn main() {
    for (key, value) in roll::model::threads::env_defaults() {
        // SAFETY: main's first statement: no other thread exists to read the environment.
        unsafe { std::env::set_var(key, value) };
    }
    roll::allocator::configure();
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let model = init_model(&tiny_options()).expect("init");
    if bench_dtype() != "float32" {
        println!("models in {}", bench_dtype());
    }
    let vocab = model.config().vocab_size as u32;
    // Six tokens, distinct for every i below (vocab - 3)^2 (the first two are i's digits in that
    // base), as the peers' random prompts are: the engine prefills a prompt that several
    // requests share only once, and a batch of few distinct prompts would time that instead.
    let prompt = |i: u32| -> Vec<u32> {
        let base = vocab - 3;
        let digits = [i % base, (i / base) % base];
        (0..6)
            .map(|k| {
                3 + digits
                    .get(k as usize)
                    .copied()
                    .unwrap_or((i * 7 + k * 3) % base)
            })
            .collect()
    };

    if wants("generation") {
        // Random weights rarely emit EOS, and no EOS ids are passed: exactly 32 tokens per row.
        let params = SamplingParams {
            temperature: 1.0,
            max_new_tokens: 32,
            ..Default::default()
        };
        let secs = median_after_warmup(1, 7, |rep| {
            let reqs = (0..64u32)
                .map(|i| Request {
                    id: i as u64,
                    prompt_ids: prompt(i),
                    params: params.clone(),
                    seed: rep * 100 + i as u64,
                })
                .collect();
            let t = Instant::now();
            let out = generate(&model.transformer, &[], reqs, 64, None).expect("generate");
            let secs = t.elapsed().as_secs_f64();
            assert!(out.iter().all(|c| c.token_ids.len() == 32));
            secs
        });
        println!(
            "generation: batch 64, prompt 6, 32 new tokens ({} lanes): {:.4} s, {:.0} tokens/s",
            model.transformer.lanes(),
            secs,
            64.0 * 32.0 / secs
        );
    }

    if wants("fwd_bwd") {
        let vars: Vec<_> = model.transformer.params().named_vars();
        let pairs_owned: Vec<(Vec<u32>, Vec<u32>)> = (0..64u32)
            .map(|i| {
                (
                    prompt(i)[..1].to_vec(),
                    (0..15).map(|k| 3 + (i + k) % (vocab - 3)).collect(),
                )
            })
            .collect();
        // In lanes, as training cuts its micro-batches (`ROLL_LANES=1`: one batch).
        let lanes = model.transformer.lanes();
        let tbs = lanes_of(&pairs_owned, lanes, 2);
        let secs = median_after_warmup(1, 9, |_| {
            let t = Instant::now();
            let grads = side_by_side(&tbs, |tb| forward_backward(&model.transformer, tb));
            let mut acc = GradAccumulator::default();
            for g in grads {
                acc.add(&vars, g).expect("acc");
            }
            t.elapsed().as_secs_f64()
        });
        println!(
            "forward+backward: 64 x 16 tokens ({lanes} lanes): {:.4} s, {:.0} tokens/s",
            secs,
            64.0 * 16.0 / secs
        );
    }

    if wants("grpo") {
        let cfg: RunConfig = from_yaml_str(
            r#"
name: bench
model: { init: { arch: qwen2, hidden: 128, layers: 4, heads: 4, kv_heads: 2, intermediate: 512, chars: "x" } }
data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }
rl:
  steps: 1
  prompts_per_step: 8
  group_size: 8
  sampling: { temperature: 1.0, max_new_tokens: 8 }
"#,
            "<bench>",
        )
        .expect("config");
        let rl = cfg.rl.expect("rl section");
        let vars: Vec<_> = model.transformer.params().named_vars();
        let mut actor = ActorTrain::Local {
            opt: AdamW::new(
                vars,
                OptimizerConfig {
                    lr: 1e-5,
                    ..Default::default()
                },
                100,
            )
            .expect("opt"),
            recipe: Box::new(rl.actor_recipe()),
        };
        let mut kl = roll::algo::kl::KlController::new(Default::default(), 0.0, 0.1, 1e4);
        let mut running = roll::algo::normalize::RunningStats::new();
        let eos = model.eos_ids.clone();
        let secs = median_after_warmup(2, 9, |rep| {
            let t = Instant::now();
            let reqs: Vec<Request> = (0..64u32)
                .map(|i| Request {
                    id: i as u64,
                    prompt_ids: prompt(i / 8),
                    params: rl.sampling.clone(),
                    seed: rep * 1000 + i as u64,
                })
                .collect();
            let out = generate(&model.transformer, &eos, reqs, 64, None).expect("generate");
            // Score: a stand-in rule (even last token) gives mixed groups, like a real reward.
            let rewards: Vec<f32> = out
                .iter()
                .map(|c| (c.token_ids[c.token_ids.len() - 1] % 2) as f32)
                .collect();
            let batch = RlBatch {
                prompts: out.iter().map(|c| c.prompt_ids.clone()).collect(),
                responses: out.iter().map(|c| c.token_ids.clone()).collect(),
                gen_logprobs: out.iter().map(|c| c.logprobs.clone()).collect(),
                truncated: out.iter().map(|c| c.token_ids.len() == 8).collect(),
                correct: rewards.clone(),
                rewards,
                response_masks: None,
                advantages: None,
                group_size: 8,
                tags: vec![],
            };
            let state = UpdateState {
                actor: &mut actor,
                reference: None,
                critic: None,
                kl_ctl: &mut kl,
                running: &mut running,
                opd: None,
                seed: rep,
            };
            update(&rl, &model, state, &batch).expect("update");
            t.elapsed().as_secs_f64()
        });
        println!("grpo step: 8 prompts x 8 samples, <= 8 new tokens: {secs:.4} s median");
    }

    if wants("cosched") {
        cosched();
    }
    if wants("skinny") {
        skinny();
    }
    if let Some(part) = filter.as_deref().and_then(|f| f.strip_prefix("qwen05")) {
        // `qwen05` runs both workloads; `qwen05-fwd_bwd` or `qwen05-generation` one of them.
        qwen05(part.trim_start_matches('-'));
    }
}

/// The Qwen2.5-0.5B shape with random weights ([`qwen05_options`]).
fn qwen05(only: &str) {
    let layers = qwen05_layers();
    let model = init_model(&qwen05_options(layers)).expect("init");
    let vocab = model.config().vocab_size as u32;
    let pairs_owned: Vec<(Vec<u32>, Vec<u32>)> = (0..16u32)
        .map(|i| {
            (
                (0..6).map(|k| 3 + (i * 7 + k * 3) % (vocab - 3)).collect(),
                (0..58).map(|k| 3 + (i + k * 11) % (vocab - 3)).collect(),
            )
        })
        .collect();
    let lanes = model.transformer.lanes();
    let tbs = lanes_of(&pairs_owned, lanes, 7);
    for rep in 0..2 {
        if !(only.is_empty() || only == "fwd_bwd") {
            break;
        }
        reset_peak_rss();
        let t = Instant::now();
        let vars = model.transformer.params().named_vars();
        let mut acc = GradAccumulator::default();
        for g in side_by_side(&tbs, |tb| forward_backward(&model.transformer, tb)) {
            acc.add(&vars, g).expect("acc");
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "qwen2.5-0.5b shape ({layers} layers, {lanes} lanes), forward+backward 16 x 64, run {rep}: {s:.2} s, {:.1} tokens/s{}",
            1024.0 / s,
            peak_note()
        );
    }
    if only.is_empty() || only == "adamw" {
        adamw_steps(&model);
    }
    if !(only.is_empty() || only == "generation") {
        return;
    }
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 32,
        ..Default::default()
    };
    // Twice, as the forward+backward: HF's bench times its runs after a warm-up.
    for rep in 0..2 {
        reset_peak_rss();
        let t = Instant::now();
        let reqs = (0..16u32)
            .map(|i| Request {
                id: i as u64,
                prompt_ids: pairs_owned[i as usize].0.clone(),
                params: params.clone(),
                seed: i as u64,
            })
            .collect();
        let out = generate(&model.transformer, &[], reqs, 16, None).expect("generate");
        let tokens: usize = out.iter().map(|c| c.token_ids.len()).sum();
        let s = t.elapsed().as_secs_f64();
        println!(
            "qwen2.5-0.5b shape ({layers} layers), generation batch 16, 32 new tokens, run {rep}: {s:.2} s, {:.1} tokens/s{}",
            tokens as f64 / s,
            peak_note()
        );
    }
}

/// Two AdamW steps over every parameter of `model` (random gradients, clipped), as the actor's
/// optimizer takes them after a batch: seconds and peak memory per step.
fn adamw_steps(model: &roll::model::LoadedModel) {
    let vars = model.transformer.params().named_vars();
    let params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let mut opt = AdamW::new(vars.clone(), OptimizerConfig::default(), 100).expect("adamw");
    for rep in 0..2 {
        // A gradient store (an empty backward's), filled with one random gradient per variable.
        let mut store = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu)
            .and_then(|t| t.backward())
            .expect("store");
        for (_, v) in &vars {
            let g = Tensor::randn(0f32, 1e-3, v.shape(), &Device::Cpu).expect("grad");
            store.insert(v.as_tensor(), g);
        }
        let mut acc = GradAccumulator::default();
        acc.add(&vars, store).expect("acc");
        reset_peak_rss();
        let t = Instant::now();
        opt.step(acc).expect("step");
        println!(
            "adamw step over {:.0}M parameters, run {rep}: {:.2} s{}",
            params as f64 / 1e6,
            t.elapsed().as_secs_f64(),
            peak_note()
        );
    }
}

/// Run this bench's forward+backward in `n` processes at once (`RAYON_NUM_THREADS=threads` when
/// given) and return their summed tokens/s.
fn fwd_bwd_processes(n: usize, threads: Option<usize>) -> f64 {
    let exe = std::env::current_exe().expect("the bench's own executable");
    let children: Vec<_> = (0..n)
        .map(|_| {
            let mut c = std::process::Command::new(&exe);
            c.arg("fwd_bwd").stdout(std::process::Stdio::piped());
            if let Some(t) = threads {
                c.env("RAYON_NUM_THREADS", t.to_string());
            }
            c.spawn().expect("spawn the bench")
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("the bench ran");
            let text = String::from_utf8_lossy(&out.stdout);
            // "forward+backward: 64 x 16 tokens: 0.1553 s, 6594 tokens/s"
            text.lines()
                .find_map(|l| {
                    let rest = l.strip_suffix(" tokens/s")?;
                    rest.rsplit(' ').next()?.parse::<f64>().ok()
                })
                .unwrap_or_else(|| panic!("no tokens/s in: {text}"))
        })
        .sum()
}

fn cosched() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let alone = fwd_bwd_processes(1, None);
    let crowded = fwd_bwd_processes(2, None);
    let shared = fwd_bwd_processes(2, Some((cores / 2).max(1)));
    println!(
        "co-scheduling, forward+backward 64 x 16 on {cores} cores: one process {alone:.0} tokens/s; \
         two at once with every core each {crowded:.0} ({:.2}x one); two with {} thread(s) each \
         {shared:.0} ({:.2}x one)",
        crowded / alone,
        (cores / 2).max(1),
        shared / alone
    );
}

/// GFLOP/s of `y = x wᵀ` through candle's GEMM, the skinny kernel and the streamed kernel, x (m,
/// k), w (n, k): on the whole pool, and on one thread as inside a lane of a small model.
fn skinny() {
    use roll_cpu_kernels::skinny::skinny_matmul;
    use roll_cpu_kernels::streamed::streamed_matmul;
    let dev = Device::Cpu;
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    // (m, k, n): tiny decode lanes (32 rows, k = 128 or 512) and prefills (up to 96 rows); the
    // 0.5B decode at batch 16 (q/k/v, gate or up, down, the vocabulary); around the row bounds.
    for (m, k, n) in [
        (32, 128, 512),
        (32, 128, 128),
        (32, 512, 128),
        (64, 128, 512),
        (96, 128, 512),
        (16, 896, 1152),
        (16, 896, 4864),
        (16, 4864, 896),
        (16, 896, 151_936),
        (8, 896, 4864),
        (24, 896, 4864),
        (32, 896, 4864),
        (64, 896, 4864),
    ] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).expect("x");
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).expect("w");
        let reps = (2e9 / (2.0 * (m * k * n) as f64)).clamp(3.0, 2000.0) as usize;
        let time = |f: &(dyn Fn() -> Tensor + Sync)| {
            f();
            let t = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(f());
            }
            2.0 * (m * k * n) as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        let gemm = || x.matmul(&w.t().expect("t")).expect("gemm");
        let skinny = || skinny_matmul(&x, &w).expect("skinny");
        let streamed = || streamed_matmul(&x, &w).expect("streamed");
        let [g, s, t] = [&gemm as &(dyn Fn() -> Tensor + Sync), &skinny, &streamed].map(time);
        let [g1, s1, t1] = [&gemm as &(dyn Fn() -> Tensor + Sync), &skinny, &streamed]
            .map(|f| one.install(|| time(f)));
        println!(
            "product {m} x {k} x {n} (GFLOP/s, pool / one thread): gemm {g:.1} / {g1:.1}, \
             skinny {s:.1} / {s1:.1}, streamed {t:.1} / {t1:.1}"
        );
    }
}
