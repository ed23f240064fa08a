//! The RL stage on a real model (the quickstart's, after its SFT stage) with a heavy-tailed response
//! length: most responses end in a few tokens, a few run to `max_new_tokens`. Each setup runs 20 GRPO
//! steps through the scheduler from the same SFT checkpoint and reports wall time, decoded tokens,
//! response lengths and staleness: α = 0 colocated (time-sharing one device) with actor_infer in this
//! process and in a worker process, α = 0 on separate devices, α = 1 and α = 2 on separate devices.
//!
//! Run: `cargo bench --bench rollout` (`ROLLOUT_BENCH_QUICK=1`: 5 steps, a shorter SFT). Record the
//! figures in benches/RESULTS.md.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use roll::config::RunConfig;
use roll::metrics::MemorySink;
use roll::pipeline::{RunStatus, Silent, run};

fn config(out: &Path, overrides: &[String]) -> RunConfig {
    let mut all = vec![format!("output_dir={}", out.display())];
    all.extend(overrides.iter().cloned());
    RunConfig::load(Path::new("experiments/quickstart.yaml"), &all).expect("quickstart config")
}

fn run_to_end(cfg: &RunConfig) -> (MemorySink, Option<std::path::PathBuf>, f64) {
    let mut sink = MemorySink::default();
    let t0 = Instant::now();
    let outcome = run(
        cfg,
        &mut Silent,
        Arc::new(AtomicBool::new(false)),
        &mut sink,
        None,
    )
    .expect("run");
    assert_eq!(outcome.status, RunStatus::Finished);
    (sink, outcome.last_checkpoint, t0.elapsed().as_secs_f64())
}

fn sum(xs: &[f64]) -> f64 {
    // `Sum` of no floats is -0.0.
    xs.iter().sum::<f64>() + 0.0
}

fn main() {
    roll::worker::process::set_worker_program(env!("CARGO_BIN_EXE_roll-tui"));
    let quick = std::env::var_os("ROLLOUT_BENCH_QUICK").is_some();
    let (steps, sft_steps) = if quick { (5, 100) } else { (20, 400) };
    let dir = tempfile::tempdir().expect("tempdir");

    let mut sft = config(&dir.path().join("sft"), &[format!("sft.steps={sft_steps}")]);
    sft.rl = None;
    let (_, checkpoint, sft_s) = run_to_end(&sft);
    let checkpoint = checkpoint.expect("an SFT checkpoint");
    println!("SFT: {sft_steps} steps in {sft_s:.1} s");

    let separate = [
        "workers.devices.count=2",
        "workers.actor_infer.device_mapping=[1]",
    ];
    let process = "workers.actor_infer.mode=process";
    let setups: Vec<(&str, Vec<&str>)> = vec![
        ("α=0 colocated, in-process", vec![]),
        ("α=0 colocated, worker process", vec![process]),
        ("α=0 separate, in-process", separate.to_vec()),
        (
            "α=0 separate, worker process",
            vec![separate[0], separate[1], process],
        ),
        (
            "α=1 separate, in-process",
            vec![separate[0], separate[1], "rl.async_generation_ratio=1"],
        ),
        (
            "α=2 separate, in-process",
            vec![separate[0], separate[1], "rl.async_generation_ratio=2"],
        ),
        (
            "α=2 separate, worker process",
            vec![
                separate[0],
                separate[1],
                process,
                "rl.async_generation_ratio=2",
            ],
        ),
    ];
    // Temperature 2 makes the SFT model's end-of-sequence uncertain: a heavier length tail.
    for temperature in [1.0, 2.0] {
        println!(
            "\n{steps} GRPO steps, 16 prompts x 8, max_new_tokens 40, temperature {temperature}\n\n\
             | setup | wall | s/step | decoded tok/s | mean / max response | at max length | time offload+reload | staleness mean |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        grpo_table(dir.path(), &checkpoint, &setups, steps, temperature);
    }
}

fn grpo_table(
    dir: &Path,
    checkpoint: &Path,
    setups: &[(&str, Vec<&str>)],
    steps: usize,
    temperature: f64,
) {
    let mut base = None;
    for (i, (name, overrides)) in setups.iter().enumerate() {
        let mut all = vec![
            format!("rl.steps={steps}"),
            "rl.sampling.max_new_tokens=40".to_string(),
            format!("rl.sampling.temperature={temperature}"),
        ];
        all.extend(overrides.iter().map(|s| s.to_string()));
        let mut cfg = config(&dir.join(format!("grpo{i}-t{temperature}")), &all);
        cfg.sft = None;
        cfg.model.init = None;
        cfg.model.path = Some(checkpoint.to_path_buf());
        let (sink, _, wall) = run_to_end(&cfg);
        let v = |k: &str| sink.values("rl", k);
        let tok_s = v("system/tokens_per_s");
        let mean_len = sum(&v("response_length/mean")) / steps as f64;
        let max_len = v("response_length/max").iter().copied().fold(0.0, f64::max);
        let clip = sum(&v("response_length/clip_ratio")) / steps as f64;
        let moves = sum(&v("time/offload")) + sum(&v("time/reload"));
        let stale = sum(&v("async/staleness_mean")) / steps as f64;
        let base_wall = *base.get_or_insert(wall);
        println!(
            "| {name} | {wall:.1} s ({:.2}x) | {:.2} | {:.0} | {mean_len:.1} / {max_len:.0} | {:.1}% | {moves:.2} s | {stale:.2} |",
            base_wall / wall,
            wall / steps as f64,
            sum(&tok_s) / tok_s.len().max(1) as f64,
            clip * 100.0,
        );
    }
}
