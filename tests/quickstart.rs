//! A shortened quickstart (the experiment file itself, with fewer GRPO steps) must still learn: the
//! mean reward of the last 10 GRPO steps exceeds that of the first 10 by at least 0.1.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use roll::config::RunConfig;
use roll::metrics::MemorySink;
use roll::pipeline::{RunStatus, Silent, run};

/// The quickstart's own model, data and SFT; only the GRPO stage is shortened (40 of 150 steps).
const RL_STEPS: usize = 40;

#[test]
fn shortened_quickstart_raises_reward() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [
        format!("rl.steps={RL_STEPS}"),
        format!("output_dir={}", dir.path().display()),
    ];
    let cfg = RunConfig::load(Path::new("experiments/quickstart.yaml"), &overrides).unwrap();
    let mut sink = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(&cfg, &mut Silent, stop, &mut sink, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);

    let reward: Vec<f64> = sink
        .records
        .iter()
        .filter(|r| r.stage == "rl")
        .map(|r| (r.metrics["reward/add/mean"] + r.metrics["reward/reverse/mean"]) / 2.0)
        .collect();
    assert_eq!(reward.len(), RL_STEPS);
    let first = reward[..10].iter().sum::<f64>() / 10.0;
    let last = reward[RL_STEPS - 10..].iter().sum::<f64>() / 10.0;
    assert!(
        last >= first + 0.1,
        "mean reward over the first 10 GRPO steps {first:.3}, last 10 {last:.3}: {reward:?}"
    );
}
