//! Kill -9 in the middle of a run, then `roll-tui resume`: the store opens cleanly, the run is marked
//! interrupted, every step up to its last checkpoint is stored, and the resumed run ends with exactly
//! the metrics and samples of an uninterrupted run. Also: resume refuses loudly when nothing would run
//! or the checkpoint is unusable.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{
    assert_same_metrics, deterministic_metrics, ok, refused, roll, spawn_until, write_config,
};
use serde_json::Value;

/// Added to the tiny model and data of `common::write_config`.
const REST: &str = r#"
name: tiny
seed: 5
sft: { steps: 6, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 14
  prompts_per_step: 4
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
  kl: { mode: in_loss, coef: 0.05, controller: adaptive, target: 0.01, horizon: 100, refresh_every: 2 }
  dynamic_sampling: { enabled: true, max_rounds: 2 }
checkpoint: { every: 3 }
"#;

fn samples(store: &Path, run: &str) -> Value {
    serde_json::from_str(&ok(roll(store, &["samples", run, "--json"]))).unwrap()
}

#[test]
fn kill_9_then_resume_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    // The uninterrupted reference run.
    let ref_store = dir.path().join("ref.db");
    let ref_cfg = write_config(dir.path(), "ref", REST);
    ok(roll(
        &ref_store,
        &["run", ref_cfg.to_str().unwrap(), "--quiet"],
    ));

    // The same run, killed with SIGKILL after its 5th RL step is reported.
    let store = dir.path().join("roll.db");
    let cfg = write_config(dir.path(), "run", REST);
    let (mut child, _) = spawn_until(&store, ["run", cfg.to_str().unwrap()], "rl      5/");
    child.kill().unwrap();
    child.wait().unwrap();

    // The store opens cleanly and knows the run died; at most the last batch is missing.
    let runs: Value = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert_eq!(runs[0]["status"], "interrupted", "{runs}");
    assert!(
        runs[0]["error"].as_str().unwrap().contains("is gone"),
        "{runs}"
    );
    let killed = deterministic_metrics(&store, "tiny");
    // The latest RL step any series reached (a step without an update records no `actor/kl`).
    let last = killed
        .iter()
        .filter(|s| s["stage"] == "rl")
        .filter_map(|s| s["steps"].as_array()?.last()?.as_u64())
        .max()
        .expect("rl metrics recorded before the kill");
    // What is guaranteed durable: every step up to the last checkpoint (step 3; a checkpoint
    // flushes the metrics before it is recorded). Steps after it may still sit in the writer's
    // queue when SIGKILL lands — under load it lags more than a step, which the resume replays.
    assert!(
        last >= 3,
        "only {last} RL steps stored after step 5 was reported (checkpoint at step 3)"
    );

    let resumed = ok(roll(&store, &["resume", "tiny", "--quiet"]));
    // Said first: what the lines after it continue.
    assert!(
        resumed.starts_with("resumed run 'tiny' from rl step 3"),
        "{resumed}"
    );
    let runs: Value = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["last_step"], 14);

    assert_same_metrics(&ref_store, &store, "tiny");
    assert_eq!(samples(&ref_store, "tiny"), samples(&store, "tiny"));

    // Nothing left to do: a second resume refuses.
    let err = refused(roll(&store, &["resume", "tiny"]));
    assert!(
        err.contains("cannot resume run 'tiny': it already finished"),
        "{err}"
    );
    // It says how to train on: a new run from its last checkpoint.
    assert!(
        err.contains("model.path=") && err.contains("rl-step14 model.init=null"),
        "{err}"
    );
}

#[test]
fn resume_refuses_a_missing_or_corrupt_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    let cfg = write_config(dir.path(), "run", REST);
    let args = ["run", cfg.to_str().unwrap(), "checkpoint.every=1"];
    let (mut child, _) = spawn_until(&store, args, "checkpoint step 2");
    child.kill().unwrap();
    child.wait().unwrap();

    let err = refused(roll(&store, &["resume", "tinny"]));
    assert!(
        err.contains("no run 'tinny'") && err.contains("did you mean 'tiny'"),
        "{err}"
    );

    let show: Value =
        serde_json::from_str(&ok(roll(&store, &["runs", "show", "tiny", "--json"]))).unwrap();
    let ckpt = show["checkpoints"].as_array().unwrap().last().unwrap()["path"]
        .as_str()
        .unwrap()
        .to_string();
    let weights = Path::new(&ckpt).join("model.safetensors");
    let good = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &good[..good.len() / 3]).unwrap();
    let err = refused(roll(&store, &["resume", "tiny"]));
    assert!(
        err.contains("its last checkpoint cannot be loaded"),
        "{err}"
    );

    std::fs::remove_dir_all(&ckpt).unwrap();
    let err = refused(roll(&store, &["resume", "tiny"]));
    assert!(err.contains("is missing on disk"), "{err}");
    // Refusals change nothing: the run is still interrupted and resumable once fixed.
    let runs: Value = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert_eq!(runs[0]["status"], "interrupted");
}

/// A run killed before its first checkpoint cannot be resumed, and the refusal says what to do.
#[test]
fn a_run_killed_before_its_first_checkpoint_says_how_to_start_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    let cfg = write_config(dir.path(), "run", REST);
    let args = [
        "run",
        cfg.to_str().unwrap(),
        "checkpoint.every=0",
        "checkpoint.every_minutes=0",
        // Long enough that the kill lands in it, however slow the machine.
        "sft.steps=100000",
    ];
    // (Its SFT stage checkpoints at its end: killed during it.)
    let (mut child, _) = spawn_until(&store, args, "sft ");
    child.kill().unwrap();
    child.wait().unwrap();
    let err = refused(roll(&store, &["resume", "tiny"]));
    assert!(
        err.contains("it stopped before its first checkpoint, so there is nothing to resume from")
            && err.contains("--overwrite")
            && err.contains("checkpoint.every"),
        "{err}"
    );
}

/// A live run's output directory is its own: another run there, of another name and another
/// store, is refused even with --overwrite, before anything in it is removed (--overwrite
/// deleted a running run's checkpoints).
#[test]
fn overwrite_never_takes_the_output_directory_of_a_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "tiny", REST);
    let cfg = cfg.to_str().unwrap();
    let store = dir.path().join("live.db");
    // Long enough to be running while the others try.
    let (mut child, _lines) = spawn_until(&store, ["run", cfg, "rl.steps=100000"], "rl      1/");
    let out_dir = dir.path().join("tiny");
    assert!(out_dir.join("resolved_config.json").exists());
    let other = dir.path().join("other.db");
    for args in [
        vec!["run", cfg, "name=other", "--overwrite"],
        vec!["run", cfg, "--overwrite"],
    ] {
        let err = refused(roll(&other, &args));
        assert!(
            err.contains("is in use by a running run (pid ") && err.contains("stop it first"),
            "{args:?}: {err}"
        );
    }
    // Its files are all there.
    assert!(out_dir.join("resolved_config.json").exists());
    let _ = child.kill();
    let _ = child.wait();
    // Once it is gone (even killed), the directory is free again.
    let out = roll(
        &other,
        &["run", cfg, "rl.steps=1", "sft.steps=1", "--overwrite", "-q"],
    );
    ok(out);
}
