//! The quickstart through the scheduler must still learn, whichever way the roles are placed: its SFT
//! stage runs once, then a shortened GRPO stage (40 of 150 steps) starts from the SFT checkpoint with
//! colocated roles (α = 0, time-sharing device 0), separate roles (α = 0), and separate roles with
//! asynchronous rollout (α = 2). In each, the mean reward of the last 10 GRPO steps exceeds that of the
//! first 10 by at least `SYNC_GAIN` (0.05 for the asynchronous run, whose batches depend on timing). The
//! colocated and asynchronous runs have actor_infer and reward in worker processes (`roll-tui
//! worker ROLE`); the separate run keeps every role in this process, and computes the same numbers
//! as the colocated one.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use roll::config::RunConfig;
use roll::metrics::{MemorySink, WorkerNotice};
use roll::pipeline::{RunStatus, Silent, run};

const RL_STEPS: usize = 40;

fn quickstart(out: &Path, overrides: &[&str]) -> RunConfig {
    let mut all = vec![
        format!("rl.steps={RL_STEPS}"),
        format!("output_dir={}", out.display()),
    ];
    all.extend(overrides.iter().map(|s| s.to_string()));
    RunConfig::load(Path::new("experiments/quickstart.yaml"), &all).unwrap()
}

fn run_to_end(cfg: &RunConfig) -> (MemorySink, Option<PathBuf>) {
    let mut sink = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(cfg, &mut Silent, stop, &mut sink, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);
    (sink, outcome.last_checkpoint)
}

/// GRPO from `sft` (the SFT checkpoint) with the given placement; returns (first 10, last 10) mean
/// reward and the sink.
fn grpo(
    dir: &Path,
    sft: &Path,
    name: &str,
    overrides: &[&str],
    min_gain: f64,
) -> (f64, f64, MemorySink) {
    let mut cfg = quickstart(&dir.join(name), overrides);
    cfg.sft = None;
    cfg.model.init = None;
    cfg.model.path = Some(sft.to_path_buf());
    let (sink, _) = run_to_end(&cfg);
    let reward: Vec<f64> = sink
        .records
        .iter()
        .filter(|r| r.stage == "rl")
        .map(|r| {
            // An asynchronous step's batch holds the groups that finished first, which can all
            // be of one domain: average the domains the step has.
            let means: Vec<f64> = ["reward/add/mean", "reward/reverse/mean"]
                .iter()
                .filter_map(|k| r.metrics.get(*k).copied())
                .collect();
            means.iter().sum::<f64>() / means.len() as f64
        })
        .collect();
    assert!(
        reward.iter().all(|r| r.is_finite()),
        "{name}: a step without rewards"
    );
    assert_eq!(reward.len(), RL_STEPS, "{name}");
    let first = reward[..10].iter().sum::<f64>() / 10.0;
    let last = reward[RL_STEPS - 10..].iter().sum::<f64>() / 10.0;
    eprintln!("{name}: mean reward first 10 steps {first:.3}, last 10 {last:.3}");
    assert!(
        last >= first + min_gain,
        "{name}: mean reward over the first 10 GRPO steps {first:.3}, last 10 {last:.3}: {reward:?}"
    );
    (first, last, sink)
}

/// The least gain in mean reward, last 10 steps over the first 10, of a synchronous run.
const SYNC_GAIN: f64 = 0.06;

#[test]
fn shortened_quickstart_learns_colocated_separate_and_asynchronous() {
    // Worker processes run the real binary, not this test harness.
    roll::worker::process::set_worker_program(env!("CARGO_BIN_EXE_roll-tui"));
    let dir = tempfile::tempdir().unwrap();
    let mut sft_only = quickstart(&dir.path().join("sft"), &[]);
    sft_only.rl = None;
    let (_, sft) = run_to_end(&sft_only);
    let sft = sft.unwrap();

    let processes = [
        "workers.actor_infer.mode=process",
        "workers.actor_train.mode=process",
        "workers.reward.mode=process",
        "workers.reward.num_workers=2",
    ];
    // A synchronous run's 40 steps follow one path of the seed; a change in the last bits of
    // the numerics takes another: these runs gained 0.127, then 0.096 after the vectorised exp
    // and the streamed product, then 0.079 with packed training batches (issue 18), with the
    // full quickstart learning as before (benches/RESULTS.md). The same 40 steps from seeds 8,
    // 9 and 10 gained 0.154-0.168; with no learning (`rl.optimizer.lr=1e-12`) the reward fell
    // by 0.05. `SYNC_GAIN` sits below that spread and above no learning's drift.
    let (_, _, colocated) = grpo(dir.path(), &sft, "colocated", &processes, SYNC_GAIN);
    assert!(
        !colocated.transfers.is_empty(),
        "time-sharing moved nothing"
    );
    let mut started: Vec<String> = colocated
        .worker_notices
        .iter()
        .filter(|n| n.notice == WorkerNotice::Started)
        .map(|n| n.worker())
        .collect();
    started.sort_unstable();
    assert_eq!(
        started,
        ["actor_infer-0", "actor_train-0", "reward-0", "reward-1"]
    );

    let separate = [
        "workers.devices.count=2",
        "workers.actor_infer.device_mapping=[1]",
    ];
    let (_, _, sep) = grpo(dir.path(), &sft, "separate", &separate, SYNC_GAIN);
    assert!(sep.transfers.is_empty(), "{:?}", sep.transfers);
    // Neither placement nor processes are part of the algorithm: synchronous runs compute the same
    // numbers.
    for key in ["reward/add/mean", "reward/reverse/mean", "actor/pg_loss"] {
        assert_eq!(colocated.values("rl", key), sep.values("rl", key), "{key}");
    }

    let asynchronous = [
        separate[0],
        separate[1],
        processes[0],
        processes[1],
        "rl.async_generation_ratio=2",
    ];
    // The asynchronous run learns from samples up to 2 versions old, and each step's batch is the
    // groups that finished first, which depends on timing: its gain over 40 steps is smaller and
    // varies between runs of the same seed (+0.095 to above +0.1 in four runs of this build).
    let (_, _, asy) = grpo(dir.path(), &sft, "async", &asynchronous, 0.05);
    let staleness = asy.values("rl", "async/staleness_max");
    assert!(staleness.iter().all(|s| *s <= 2.0), "{staleness:?}");
    assert!(staleness.iter().any(|s| *s >= 1.0), "{staleness:?}");
}
