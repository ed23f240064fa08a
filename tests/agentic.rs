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

/// Run `cfg` to its end; what it recorded.
fn run_to_end(cfg: &RunConfig) -> MemorySink {
    let mut sink = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(cfg, &mut Silent, stop, &mut sink, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);
    sink
}

/// Run `fixture` to its end (output in a temporary directory) and require that the success rate
/// of its last 5 RL steps exceeds that of its first 5 by at least 0.2; returns what it recorded.
fn learns(fixture: &str) -> MemorySink {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [format!("output_dir={}", dir.path().display())];
    let cfg = RunConfig::load(Path::new(fixture), &overrides).unwrap();
    let sink = run_to_end(&cfg);
    let success = sink.values("rl", "env/lake/success");
    assert_eq!(success.len(), RL_STEPS);
    let first = success[..5].iter().sum::<f64>() / 5.0;
    let last = success[RL_STEPS - 5..].iter().sum::<f64>() / 5.0;
    eprintln!("{fixture}: success first 5 steps {first:.3}, last 5 {last:.3}: {success:?}");
    assert!(
        last >= first + 0.2,
        "{fixture}: success over the first 5 RL steps {first:.3}, last 5 {last:.3}: {success:?}"
    );
    sink
}

/// A tiny env-only run (no dataset, no SFT) of 4 RL steps on a 1x3 lake, written to `dir`.
fn tiny_env_run(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny.yaml");
    std::fs::write(
        &path,
        "name: tiny\nseed: 5\n\
         model: { init: { arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFGPWXLeftRighDowUp\\n\", max_positions: 128 } }\n\
         rl:\n  steps: 4\n  prompts_per_step: 2\n  group_size: 4\n  sampling: { max_new_tokens: 4 }\n\
         \x20 optimizer: { lr: 0.01 }\n\
         \x20 env: { name: frozen_lake, params: { map: SFG, legend: false }, max_turns: 3, action_pattern: '(\\w+)' }\n",
    )
    .unwrap();
    path
}

#[test]
fn shortened_agentic_frozenlake_learns_to_reach_the_goal() {
    let sink = learns("tests/fixtures/agentic_small.yaml");
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

/// Sets the stop flag once RL step `after` is reported, as Ctrl-C would.
struct StopAfter {
    after: usize,
    stop: Arc<AtomicBool>,
}

impl roll::pipeline::Observer for StopAfter {
    fn on_event(&mut self, event: &roll::pipeline::PipelineEvent) {
        if let roll::pipeline::PipelineEvent::StepFinished { stage, step, .. } = event
            && *stage == roll::config::Stage::Rl
            && *step == self.after
        {
            self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[test]
fn an_interrupted_agentic_run_resumes_to_the_same_numbers() {
    // A tiny env-only run (no dataset, no SFT): stopped after RL step 2 of 4 (it checkpoints and
    // returns), then resumed from that checkpoint; steps 3 and 4 must equal an uninterrupted run's.
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_env_run(dir.path());
    let load = |out: &str| {
        RunConfig::load(
            &path,
            &[format!("output_dir={}", dir.path().join(out).display())],
        )
        .unwrap()
    };
    let whole = load("whole");
    let mut reference = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    run(&whole, &mut Silent, stop, &mut reference, None).unwrap();

    let cfg = load("parts");
    let mut first = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut observer = StopAfter {
        after: 2,
        stop: stop.clone(),
    };
    let outcome = run(&cfg, &mut observer, stop, &mut first, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Interrupted);
    let ckpt = outcome.last_checkpoint.unwrap();
    let resume = roll::pipeline::Resume::load(&ckpt, &cfg).unwrap();
    // What `roll-tui resume` checks before it touches the store.
    let model = roll::pipeline::setup::load_checkpoint_policy(&cfg, &ckpt).unwrap();
    resume.check_setup(&cfg, &model).unwrap();
    let mut rest = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(&cfg, &mut Silent, stop, &mut rest, Some(&resume)).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);
    for key in [
        "env/frozen_lake/return",
        "actor/pg_loss",
        "trajectory/tokens/mean",
    ] {
        let whole = reference.values("rl", key);
        assert_eq!(whole.len(), 4, "{key}");
        assert_eq!(first.values("rl", key), whole[..2], "{key}");
        assert_eq!(rest.values("rl", key), whole[2..], "{key}");
    }
    assert_eq!(
        rest.trajectories.iter().map(|t| t.step).collect::<Vec<_>>(),
        [vec![3; 8], vec![4; 8]].concat()
    );
}

#[test]
fn evaluation_episodes_are_recorded_every_n_steps_and_leave_training_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_env_run(dir.path());
    let train = |out: &str, extra: &[&str]| {
        let mut overrides = vec![format!("output_dir={}", dir.path().join(out).display())];
        overrides.extend(extra.iter().map(|s| s.to_string()));
        run_to_end(&RunConfig::load(&path, &overrides).unwrap())
    };
    let plain = train("plain", &[]);
    let evaluated = train("eval", &["rl.env.eval={ every: 2, episodes: 3 }"]);
    let steps_with = |sink: &MemorySink, key: &str| -> Vec<usize> {
        sink.records
            .iter()
            .filter(|r| r.metrics.contains_key(key))
            .map(|r| r.step)
            .collect()
    };
    assert_eq!(
        steps_with(&evaluated, "val/env/frozen_lake/success"),
        [1, 3]
    );
    assert!(steps_with(&plain, "val/env/frozen_lake/success").is_empty());
    // The evaluation episodes are stored as `val/<tag>`, from the same seeds each time.
    let val: Vec<(usize, u64)> = evaluated
        .trajectories
        .iter()
        .filter(|t| t.env == "val/frozen_lake")
        .map(|t| (t.step, t.env_seed))
        .collect();
    assert_eq!(val.len(), 6, "{val:?}");
    let seeds =
        |step: usize| -> Vec<u64> { val.iter().filter(|v| v.0 == step).map(|v| v.1).collect() };
    assert_eq!(seeds(1).len(), 3);
    assert_eq!(seeds(1), seeds(3));
    assert_eq!(
        evaluated.trajectories.len() - val.len(),
        plain.trajectories.len(),
        "training episodes are stored as without evaluation"
    );
    // Evaluation samples its own seeds: the training numbers are the same with or without it.
    for key in ["env/frozen_lake/return", "actor/pg_loss"] {
        assert_eq!(
            plain.values("rl", key),
            evaluated.values("rl", key),
            "{key}"
        );
    }
}

#[test]
fn shortened_gigpo_frozenlake_learns_step_wise() {
    // tests/fixtures/agentic_small_gigpo.yaml: the same lake, observation-only prompts, one
    // training row per turn with GiGPO advantages.
    let sink = learns("tests/fixtures/agentic_small_gigpo.yaml");
    // Each turn's prompt is its observation alone: every turn reads the same few tokens.
    for t in sink.trajectories.iter().filter(|t| t.step == 1) {
        assert!(
            t.turns
                .iter()
                .all(|u| u.prompt_tokens == t.turns[0].prompt_tokens)
        );
    }
    let samples = sink.samples.iter().filter(|s| s.stage == "rl").count();
    assert_eq!(
        samples,
        RL_STEPS * EPISODES,
        "one record per episode, not per turn"
    );
}

#[test]
fn an_asynchronous_agentic_run_trains_on_episodes_at_most_alpha_versions_old() {
    // α = 1 with actor_infer on its own device: step s trains on episodes played by the policy
    // of version s − 2 (one step ahead), never older.
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_env_run(dir.path());
    let overrides: Vec<String> = [
        "rl.steps=6",
        "rl.async_generation_ratio=1",
        "workers.devices.count=2",
        "workers.actor_infer.device_mapping=[1]",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("output_dir={}", dir.path().join("out").display())])
    .collect();
    let cfg = RunConfig::load(&path, &overrides).unwrap();
    let sink = run_to_end(&cfg);
    // Step 1 is played by the initial policy; step s > 1 by version s − 2, one step ahead,
    // whatever the timing: the same seed gives the same numbers.
    let again = run_to_end(&cfg);
    for key in ["env/frozen_lake/return", "actor/pg_loss"] {
        assert_eq!(sink.values("rl", key), again.values("rl", key), "{key}");
    }
    let stale = sink.values("rl", "async/staleness_max");
    assert_eq!(stale, [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    // Every stored episode names the policy that played it.
    assert_eq!(sink.trajectories.len(), 6 * 8);
    for t in &sink.trajectories {
        assert_eq!(t.policy_version, t.step.saturating_sub(2), "{t:?}");
    }
    assert!(
        sink.values("rl", "actor/pg_loss")
            .iter()
            .all(|v| v.is_finite())
    );
}
