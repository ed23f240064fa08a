//! The RL stage with its reward role in worker processes (`workers.reward.mode: process`): the same
//! numbers as in-process scoring, worker events in the store, and a reward worker killed with SIGKILL
//! mid-run is replaced without losing or double-counting a sample.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{bin, deterministic_metrics, ok, spawn_until, write_config};
use serde_json::Value;

/// Added to the tiny model and data of `common::write_config`.
const REST: &str = r#"
name: pool
seed: 8
sft: { steps: 4, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 10
  prompts_per_step: 4
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
"#;

fn config(dir: &Path, name: &str) -> std::path::PathBuf {
    write_config(dir, name, REST)
}

fn events(store: &Path) -> Vec<Value> {
    let out = ok(bin()
        .arg("--store")
        .arg(store)
        .args(["runs", "show", "pool", "--json"])
        .output()
        .unwrap());
    let v: Value = serde_json::from_str(&out).unwrap();
    v["events"].as_array().unwrap().clone()
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["kind"] == kind).count()
}

/// Pids of reward workers whose parent is `parent` (from their command lines).
fn reward_workers_of(parent: u32) -> Vec<u32> {
    let want = format!("--parent\0{parent}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.contains("worker\0reward\0") && c.contains(&want)
                })
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn a_reward_pool_gives_the_same_numbers_and_survives_a_killed_worker() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.db");
    ok(bin()
        .arg("--store")
        .arg(&reference)
        .args(["run", "--quiet"])
        .arg(config(dir.path(), "a"))
        .output()
        .unwrap());

    // Two reward workers, undisturbed.
    let pooled = dir.path().join("pooled.db");
    ok(bin()
        .arg("--store")
        .arg(&pooled)
        .args(["run", "--quiet"])
        .arg(config(dir.path(), "b"))
        .args([
            "workers.reward.mode=process",
            "workers.reward.num_workers=2",
        ])
        .output()
        .unwrap());
    assert_eq!(
        deterministic_metrics(&reference, "pool"),
        deterministic_metrics(&pooled, "pool")
    );
    let ev = events(&pooled);
    assert_eq!(
        (count(&ev, "worker_started"), count(&ev, "worker_exited")),
        (2, 2),
        "{ev:?}"
    );
    assert_eq!(count(&ev, "worker_failed"), 0, "{ev:?}");

    // Two reward workers, one killed with SIGKILL after RL step 2.
    let killed = dir.path().join("killed.db");
    let cfg = config(dir.path(), "c");
    let args = [
        "run",
        cfg.to_str().unwrap(),
        "workers.reward.mode=process",
        "workers.reward.num_workers=2",
    ];
    let (mut child, lines) = spawn_until(&killed, args, "rl      2/");
    let workers = reward_workers_of(child.id());
    assert_eq!(workers.len(), 2, "{workers:?}");
    assert!(common::kill_9(workers[0]));
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("died (killed by signal 9)")),
        "{rest:?}"
    );
    assert_eq!(
        deterministic_metrics(&reference, "pool"),
        deterministic_metrics(&killed, "pool")
    );
    let ev = events(&killed);
    assert_eq!(count(&ev, "worker_failed"), 1, "{ev:?}");
    assert_eq!(count(&ev, "worker_started"), 3, "{ev:?}");
    assert!(reward_workers_of(child.id()).is_empty());
}
