//! The agentic quickstart, shortened (`tests/fixtures/agentic_small.yaml`: a 3x3 lake, 40 SFT steps
//! on imperfect demonstrations, 20 RL steps of 4 groups x 8 episodes): trajectory-wise GRPO
//! (StarPO) over multi-turn episodes. The success rate of the last 5 steps must exceed that of the
//! first 5 by at least 0.2, every episode is recorded turn by turn, and the metrics are there.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use roll::config::RunConfig;
use roll::metrics::MemorySink;
use roll::pipeline::{RunStatus, Silent, run};

const RL_STEPS: usize = 20;
const EPISODES: usize = 4 * 8;

#[test]
fn shortened_agentic_frozenlake_learns_to_reach_the_goal() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [format!("output_dir={}", dir.path().display())];
    let cfg = RunConfig::load(Path::new("tests/fixtures/agentic_small.yaml"), &overrides).unwrap();
    let mut sink = MemorySink::default();
    let outcome = run(
        &cfg,
        &mut Silent,
        Arc::new(AtomicBool::new(false)),
        &mut sink,
        None,
    )
    .unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);

    let success = sink.values("rl", "env/lake/success");
    assert_eq!(success.len(), RL_STEPS);
    let first = success[..5].iter().sum::<f64>() / 5.0;
    let last = success[RL_STEPS - 5..].iter().sum::<f64>() / 5.0;
    eprintln!("success first 5 steps {first:.3}, last 5 {last:.3}: {success:?}");
    assert!(
        last >= first + 0.2,
        "success over the first 5 RL steps {first:.3}, last 5 {last:.3}: {success:?}"
    );
    for key in [
        "env/lake/return",
        "env/lake/steps",
        "env/lake/invalid_action_frac",
        "env/lake/format_penalty",
        "trajectory/tokens/mean",
        "trajectory/cut_max_turns",
        "actor/pg_loss",
    ] {
        assert_eq!(sink.values("rl", key).len(), RL_STEPS, "{key}");
    }

    // Every episode of every step, turn by turn, in group order; a group's episodes share a seed.
    assert_eq!(sink.trajectories.len(), RL_STEPS * EPISODES);
    let step1: Vec<_> = sink.trajectories.iter().filter(|t| t.step == 1).collect();
    assert_eq!(step1.len(), EPISODES);
    for t in &step1 {
        assert_eq!(t.env, "lake");
        assert_eq!(t.env_seed, step1[t.group * 8].env_seed);
        assert!(!t.turns.is_empty() && t.turns.len() <= 6);
        let last = &t.turns[t.turns.len() - 1];
        assert_eq!(t.end_reason == "done", last.done, "{t:?}");
        assert_eq!(t.success, last.info["success"] == true);
        assert!(t.turns.iter().all(|u| u.info.contains_key("state_hash")));
        // Each turn reads the whole conversation so far.
        for w in t.turns.windows(2) {
            assert!(w[1].prompt_tokens > w[0].prompt_tokens + w[0].response_tokens);
        }
    }
    assert_ne!(step1[0].env_seed, step1[8].env_seed);
    // The samples view gets one record per episode with its return.
    let samples: Vec<_> = sink.samples.iter().filter(|s| s.stage == "rl").collect();
    assert_eq!(samples.len(), RL_STEPS * EPISODES);
    assert!(samples.iter().all(|s| s.domain == "lake"));
}
