//! The RL stage through the scheduler, end to end on the binary: colocated roles time-share device 0
//! (offload/reload events with bytes and durations), separate roles never move, asynchronous
//! rollout stays within its staleness bound, and placements that cannot work are refused up front.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};

use common::{ok, refused, rl_series, roll, write_config};
use serde_json::Value;

/// Added to the tiny model and data of `common::write_config`.
const REST: &str = r#"
name: sched
seed: 5
sft: { steps: 4, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 6
  prompts_per_step: 4
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
"#;

fn config(dir: &Path) -> PathBuf {
    write_config(dir, "out", REST)
}

/// `roll-tui run` of the test config with `overrides`, in `dir/roll.db`.
fn run_output(dir: &Path, overrides: &[&str]) -> (PathBuf, std::process::Output) {
    let store = dir.join("roll.db");
    let cfg = config(dir);
    let mut args = vec!["run", cfg.to_str().unwrap()];
    args.extend_from_slice(overrides);
    let out = roll(&store, &args);
    (store, out)
}

fn run(dir: &Path, overrides: &[&str]) -> PathBuf {
    let (store, out) = run_output(dir, overrides);
    ok(out);
    store
}

/// The error of a run that must be refused.
fn refused_run(dir: &Path, overrides: &[&str]) -> String {
    refused(run_output(dir, overrides).1)
}

fn events(store: &Path) -> Vec<Value> {
    let out = ok(roll(store, &["runs", "show", "sched", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["events"].as_array().unwrap().clone()
}

/// The values of `key` in the RL stage, by step.
fn series(store: &Path, key: &str) -> Vec<f64> {
    rl_series(store, "sched", key)
}

#[test]
fn colocated_roles_offload_and_reload_around_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let store = run(dir.path(), &[]);
    let ev = events(&store);
    let moves: Vec<&Value> = ev
        .iter()
        .filter(|e| e["kind"] == "offload" || e["kind"] == "reload")
        .collect();
    // Each step after the first placement: actor_infer out and actor_train in, then back.
    let offloads = moves.iter().filter(|e| e["kind"] == "offload").count();
    let reloads = moves.len() - offloads;
    assert_eq!(offloads, 2 * 6 - 1, "{moves:#?}");
    assert_eq!(reloads, 2 * 6 - 2, "{moves:#?}");
    for e in &moves {
        assert!(e["bytes"].as_u64().unwrap() > 10_000, "{e}");
        assert!(e["duration_s"].as_f64().unwrap() >= 0.0, "{e}");
        assert_eq!(e["device"], "0", "{e}");
        assert!(["actor_train", "actor_infer"].contains(&e["worker"].as_str().unwrap()));
    }
    // actor_train carries its AdamW moments: three times the bytes of actor_infer's weights.
    let bytes_of = |role: &str| {
        moves
            .iter()
            .find(|e| e["worker"] == role)
            .map(|e| e["bytes"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(bytes_of("actor_train"), 3 * bytes_of("actor_infer"));
    assert_eq!(series(&store, "time/offload").len(), 6);
    assert_eq!(series(&store, "async/staleness_max"), vec![0.0; 6]);
}

#[test]
fn separate_roles_never_move_and_asynchronous_rollout_stays_within_alpha() {
    let dir = tempfile::tempdir().unwrap();
    let store = run(
        dir.path(),
        &[
            "workers.devices.count=2",
            "workers.actor_infer.device_mapping=[1]",
            "rl.async_generation_ratio=2",
        ],
    );
    let ev = events(&store);
    assert!(
        !ev.iter()
            .any(|e| e["kind"] == "offload" || e["kind"] == "reload"),
        "{ev:#?}"
    );
    let max = series(&store, "async/staleness_max");
    assert_eq!(max.len(), 6);
    assert!(max.iter().all(|s| *s <= 2.0), "{max:?}");
    // Rollout ran ahead: the groups dispatched before the first update trained later steps.
    assert!(max.iter().any(|s| *s >= 1.0), "{max:?}");
    let out = ok(roll(
        &store,
        &["samples", "sched", "--json", "--limit", "1000"],
    ));
    let samples: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(samples.len(), 6 * 4 * 4);
    for s in samples.iter().filter(|s| s["stage"] == "rl") {
        let (step, version) = (
            s["step"].as_u64().unwrap(),
            s["policy_version"].as_u64().unwrap(),
        );
        assert!(version < step && step - 1 - version <= 2, "{s}");
    }
}

#[test]
fn a_placement_that_cannot_fit_is_refused_naming_device_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_run(dir.path(), &["workers.devices.memory_mb=0.25"]);
    assert!(
        err.contains("placement does not fit: device 0 has 0.2 MiB (262144 bytes)"),
        "{err}"
    );
    // actor_infer's weights plus the KV cache of 64 sequences of 64 positions.
    assert!(
        err.contains("phase 'generate' needs 2.0 MiB (2137088 bytes) there: actor_infer"),
        "{err}"
    );
    // Nothing trained: the refusal came before the SFT stage.
    assert!(!dir.path().join("out/checkpoints").exists());
}

#[test]
fn asynchronous_rollout_on_shared_devices_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_run(dir.path(), &["rl.async_generation_ratio=1"]);
    assert!(
        err.contains("asynchronous rollout needs its own devices"),
        "{err}"
    );
    // Training must not offload actor_infer through the reference's device either.
    let err = refused_run(
        dir.path(),
        &[
            "rl.async_generation_ratio=1",
            "workers.devices.count=2",
            "workers.actor_infer.device_mapping=[1]",
            "workers.reference.device_mapping=[1]",
        ],
    );
    assert!(
        err.contains("overlaps workers.reference.device_mapping [1]"),
        "{err}"
    );
}

#[test]
fn the_kl_reference_is_refreshed_every_n_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = run(
        dir.path(),
        &[
            "rl.kl.mode=in_loss",
            "rl.kl.coef=0.05",
            "rl.kl.refresh_every=2",
            // A policy that gets some answers right, so that groups have a learning signal.
            "sft.steps=40",
        ],
    );
    assert_eq!(
        series(&store, "actor/reference_version"),
        [0.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    );
    // One PPO epoch measures KL before its update: right after a refresh the reference is the
    // policy itself, so the k3 estimate is 0 up to f32 rounding (the reference scores its rows
    // in other batches than training cuts, and a row's log-probs move in the last bit with the
    // rows it is batched with: below 1e-7 here). One step later it is clearly above 0 if that
    // step's update moved the policy, which it does when some group's rewards differ. (After a
    // flat step the policy may or may not have moved: AdamW's momentum carries earlier steps'
    // gradients.)
    let kl = series(&store, "actor/kl");
    let flat = series(&store, "group/frac_zero_std");
    assert_eq!(kl.len(), 6);
    let mut moved_steps = 0;
    for (i, k) in kl.iter().enumerate() {
        if i % 2 == 0 {
            assert!(k.abs() < 1e-7, "step {}: {kl:?}", i + 1);
        } else if flat[i - 1] < 1.0 {
            moved_steps += 1;
            assert!(*k > 1e-5, "step {}: {kl:?}, flat groups {flat:?}", i + 1);
        }
    }
    assert!(moved_steps > 0, "no update moved the policy: {flat:?}");
}

#[test]
fn actor_infer_runs_as_one_worker_process() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_run(
        dir.path(),
        &[
            "workers.actor_infer.mode=process",
            "workers.actor_infer.num_workers=2",
        ],
    );
    assert!(
        err.contains("workers.actor_infer.num_workers is 2 but actor_infer runs as one worker"),
        "{err}"
    );
}
