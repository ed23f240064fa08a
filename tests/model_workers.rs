//! actor_train, the KL reference and the critic in worker processes (`workers.<role>.mode:
//! process`), end to end on the binary: they compute exactly what the trainer's process computes
//! (GAE with a critic, a refreshed KL reference, offloads through their host copies). A reference
//! killed with SIGKILL is replaced from its host copy and the run goes on unchanged; an actor_train
//! or critic killed with SIGKILL stops the run with an error naming the role, the worker and the
//! phase, and `roll-tui resume` continues from the last checkpoint to exactly the result of an
//! undisturbed run.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same_metrics, kill_9_worker, of_kind, ok, roll, run_events, run_quiet, sample_rows,
    spawn_until, transfers, workers_of, write_config,
};
use serde_json::Value;

const RL: &str = r#"
name: train
seed: 8
sft: { steps: 4, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 12
  prompts_per_step: 6
  group_size: 4
  adv_estimator: gae
  critic: { optimizer: { lr: 0.001 }, value_clip: 0.5 }
  kl: { mode: in_loss, coef: 0.05, refresh_every: 4 }
  ppo_epochs: 2
  mini_batches: 2
  micro_batch_size: 5
  sampling: { temperature: 1.0, max_new_tokens: 12 }
  optimizer: { lr: 0.001 }
checkpoint: { every: 3 }
"#;

const PROCESS: &str = "workers.actor_train.mode=process";
const REFERENCE: &str = "workers.reference.mode=process";
const CRITIC: &str = "workers.critic.mode=process";

fn run(dir: &Path, name: &str, overrides: &[&str]) -> PathBuf {
    run_quiet(dir, name, RL, overrides)
}

#[test]
fn actor_train_reference_and_critic_in_worker_processes_compute_exactly_as_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let here = run(dir.path(), "here", &[]);
    let there = run(dir.path(), "there", &[PROCESS, REFERENCE, CRITIC]);
    assert_same_metrics(&here, &there, "train");
    assert_eq!(sample_rows(&here, "train"), sample_rows(&there, "train"));

    let (ev_here, ev_there) = (run_events(&here, "train"), run_events(&there, "train"));
    // Colocated on device 0, the workers offload and reload the same weights and moments.
    assert_eq!(transfers(&ev_here), transfers(&ev_there));
    for role in ["actor_train", "reference", "critic"] {
        assert!(
            transfers(&ev_there)
                .iter()
                .any(|(k, w, b)| k == "reload" && w == role && *b > 0)
        );
    }
    for kind in ["worker_started", "worker_exited"] {
        let mut workers: Vec<&str> = of_kind(&ev_there, kind)
            .iter()
            .map(|e| e["worker"].as_str().unwrap())
            .collect();
        workers.sort();
        // SFT trains through actor_train too: its worker serves the SFT stage and goes with
        // it, and the RL stage starts its own.
        assert_eq!(
            workers,
            ["actor_train-0", "actor_train-0", "critic-0", "reference-0"],
            "{ev_there:#?}"
        );
    }
    assert!(
        of_kind(&ev_there, "worker_failed").is_empty(),
        "{ev_there:#?}"
    );
    // The checkpoints hold the workers' optimizers, reference and critic: identical files.
    let file = |store: &Path, name: &str| {
        let show: Value =
            serde_json::from_str(&ok(roll(store, &["runs", "show", "train", "--json"]))).unwrap();
        let last = show["checkpoints"].as_array().unwrap().last().unwrap()["path"]
            .as_str()
            .unwrap()
            .to_string();
        std::fs::read(Path::new(&last).join(name)).unwrap()
    };
    for name in [
        "optimizer.safetensors",
        "reference.safetensors",
        "critic.safetensors",
        "critic_optimizer.safetensors",
    ] {
        assert_eq!(file(&here, name), file(&there, name), "{name}");
    }
}

#[test]
fn actor_train_and_actor_infer_both_in_processes_run_asynchronously() {
    let dir = tempfile::tempdir().unwrap();
    let store = run(
        dir.path(),
        "async",
        &[
            PROCESS,
            "workers.actor_infer.mode=process",
            "workers.devices.count=2",
            "workers.actor_infer.device_mapping=[1]",
            "rl.async_generation_ratio=1",
            "checkpoint.every=0",
            "checkpoint.every_minutes=0",
        ],
    );
    let ev = run_events(&store, "train");
    // The optimizer state lives only in the worker, and nothing checkpoints it during the stage.
    let warnings: Vec<&str> = of_kind(&ev, "warning")
        .iter()
        .filter_map(|w| w["message"].as_str())
        .collect();
    assert!(
        warnings.iter().any(|m| m.starts_with(
            "actor_train in a worker process with checkpoint.every: 0 and \
             checkpoint.every_minutes: 0: if that worker dies"
        )),
        "{warnings:?}"
    );
    let started: Vec<&str> = of_kind(&ev, "worker_started")
        .iter()
        .map(|e| e["worker"].as_str().unwrap())
        .collect();
    assert!(started.contains(&"actor_train-0"), "{started:?}");
    assert!(started.contains(&"actor_infer-0"), "{started:?}");
    assert!(of_kind(&ev, "worker_failed").is_empty(), "{ev:#?}");
    let steps = sample_rows(&store, "train").last().unwrap().0;
    assert_eq!(steps, 12);
}

/// The run's events, after checking they record exactly one worker failure: `pid`'s SIGKILL.
fn one_worker_killed(store: &Path, pid: u32) -> Vec<Value> {
    let ev = run_events(store, "train");
    let failed = of_kind(&ev, "worker_failed");
    assert_eq!(failed.len(), 1, "{ev:#?}");
    assert_eq!(
        failed[0]["message"].as_str().unwrap(),
        format!("pid {pid} died (killed by signal 9)")
    );
    ev
}

/// Kill the one `role` worker (which alone holds an optimizer's state, `what`) of a run with
/// `overrides` after step 5: the run must fail with a clear error, and a resume must end exactly
/// where an undisturbed in-process run does.
fn a_trainer_killed_9_stops_the_run_and_resume_finishes_it_exactly(
    role: &str,
    what: &str,
    overrides: [&str; 2],
) {
    let dir = tempfile::tempdir().unwrap();
    let calm = run(dir.path(), "calm", &[]);

    let store = dir.path().join("killed.db");
    let cfg = write_config(dir.path(), "killed", RL);
    let [a, b] = overrides;
    let args = ["run", cfg.to_str().unwrap(), a, b];
    let (mut child, lines) = spawn_until(&store, args, "rl      5/");
    let pid = kill_9_worker(child.id(), role);
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert!(!status.success(), "{rest:?}");
    assert!(workers_of(child.id(), role).is_empty());

    let runs: Value = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert_eq!(runs[0]["status"], "failed", "{runs}");
    let error = runs[0]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("{role} worker 0 died during '")),
        "{error}"
    );
    assert!(error.contains("(killed by signal 9)"), "{error}");
    assert!(
        error.contains(&format!("{what} lived only in that worker")),
        "{error}"
    );
    assert!(
        error.contains("`roll-tui resume train` continues from its last checkpoint"),
        "{error}"
    );
    assert!(
        error.contains("rl-step3") || error.contains("rl-step6"),
        "{error}"
    );
    one_worker_killed(&store, pid);

    // Resumed (with a fresh worker), the run ends exactly where the undisturbed one did.
    let resumed = ok(roll(&store, &["resume", "train", "--quiet"]));
    assert!(
        resumed.contains("resumed run 'train' from rl step"),
        "{resumed}"
    );
    assert_same_metrics(&calm, &store, "train");
    assert_eq!(sample_rows(&calm, "train"), sample_rows(&store, "train"));
}

#[test]
fn actor_train_killed_9_stops_the_run_with_a_clear_error_and_resume_finishes_it_exactly() {
    // The reference runs in a worker too: resuming must give it the refreshed weights.
    a_trainer_killed_9_stops_the_run_and_resume_finishes_it_exactly(
        "actor_train",
        "the policy's optimizer state",
        [PROCESS, REFERENCE],
    );
}

#[test]
fn a_critic_killed_9_stops_the_run_with_a_clear_error_and_resume_finishes_it_exactly() {
    // The resumed critic loads its network, head and moments from the checkpoint's files.
    a_trainer_killed_9_stops_the_run_and_resume_finishes_it_exactly(
        "critic",
        "the critic's optimizer state",
        [CRITIC, PROCESS],
    );
}

#[test]
fn a_reference_killed_9_is_replaced_from_its_host_copy_and_the_run_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let calm = run(dir.path(), "calm", &[]);

    let store = dir.path().join("killed.db");
    let cfg = write_config(dir.path(), "killed", RL);
    let args = ["run", cfg.to_str().unwrap(), REFERENCE];
    // After step 5 the reference has been refreshed once (refresh_every: 4): its replacement must
    // load the refreshed weights, not the stage's starting policy.
    let (mut child, lines) = spawn_until(&store, args, "rl      5/");
    let pid = kill_9_worker(child.id(), "reference");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success(), "{rest:?}");
    assert!(workers_of(child.id(), "reference").is_empty());

    let ev = one_worker_killed(&store, pid);
    assert_eq!(of_kind(&ev, "worker_started").len(), 2, "{ev:#?}");
    let notes: Vec<&str> = of_kind(&ev, "warning")
        .iter()
        .filter_map(|w| w["message"].as_str())
        .filter(|m| m.ends_with("; weights reloaded from its host copy"))
        .collect();
    assert_eq!(notes.len(), 1, "{ev:#?}");
    // The events carry their facts as fields: the killed worker's pid on its start and its death,
    // the successor's pid, and the call the loss was noticed in on the replacement note.
    let field = |e: &Value, k: &str| e[k].as_u64();
    let started: Vec<u64> = of_kind(&ev, "worker_started")
        .iter()
        .filter_map(|e| field(e, "pid"))
        .collect();
    assert_eq!(started.len(), 2, "{ev:#?}");
    assert_eq!(started[0], u64::from(pid), "{ev:#?}");
    let failed = of_kind(&ev, "worker_failed");
    assert!(
        failed
            .iter()
            .any(|e| field(e, "pid") == Some(u64::from(pid))
                && e["role"] == "reference"
                && field(e, "worker_index") == Some(0)),
        "{ev:#?}"
    );
    let note = of_kind(&ev, "warning")
        .into_iter()
        .find(|w| {
            w["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("replaced ("))
        })
        .unwrap();
    assert_eq!(
        (&note["role"], field(note, "pid"), note["phase"].is_string()),
        (&Value::from("reference"), Some(started[1]), true),
        "{note:#?}"
    );
    let restarts = common::rl_series(&store, "train", "workers/reference_restarts");
    assert_eq!(restarts.last(), Some(&1.0), "{restarts:?}");
    assert_same_metrics(&calm, &store, "train");
    assert_eq!(sample_rows(&calm, "train"), sample_rows(&store, "train"));
}
