//! actor_infer in a worker process (`workers.actor_infer.mode: process`), end to end on the binary:
//! it computes exactly what the in-process engine computes, time-shares device 0 through its host
//! copy, and survives being killed with SIGKILL in the middle of generation — the requests it held
//! are generated again, so every step trains on the same samples as an undisturbed run.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};

use common::{
    deterministic_metrics, kill_9_worker, of_kind, rl_series, run_events, run_quiet, sample_rows,
    spawn_until, transfers, workers_of, write_config,
};

const RL: &str = r#"
name: infer
seed: 6
sft: { steps: 4, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 12
  prompts_per_step: 8
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 24 }
  optimizer: { lr: 0.001 }
"#;

const SEPARATE: [&str; 2] = [
    "workers.devices.count=2",
    "workers.actor_infer.device_mapping=[1]",
];
const PROCESS: &str = "workers.actor_infer.mode=process";

fn run(dir: &Path, name: &str, overrides: &[&str]) -> PathBuf {
    run_quiet(dir, name, RL, overrides)
}

#[test]
fn a_worker_process_actor_infer_computes_the_same_and_time_shares_device_0() {
    let dir = tempfile::tempdir().unwrap();
    let here = run(dir.path(), "here", &[]);
    let there = run(dir.path(), "there", &[PROCESS]);
    assert_eq!(
        deterministic_metrics(&here, "infer"),
        deterministic_metrics(&there, "infer")
    );
    assert_eq!(sample_rows(&here, "infer"), sample_rows(&there, "infer"));

    let (ev_here, ev_there) = (run_events(&here, "infer"), run_events(&there, "infer"));
    // The worker moves the same tensors as the in-process replica, in the same order.
    assert_eq!(transfers(&ev_here), transfers(&ev_there));
    assert!(
        transfers(&ev_there)
            .iter()
            .any(|(k, w, b)| k == "offload" && w == "actor_infer" && *b > 0)
    );
    assert_eq!(
        of_kind(&ev_there, "worker_started").len(),
        1,
        "{ev_there:#?}"
    );
    assert_eq!(
        of_kind(&ev_there, "worker_exited").len(),
        1,
        "{ev_there:#?}"
    );
    assert!(
        of_kind(&ev_there, "worker_failed").is_empty(),
        "{ev_there:#?}"
    );
    // How weight sync reaches the worker is said once (on the CPU: the host copy).
    let said: Vec<&str> = of_kind(&ev_there, "info")
        .iter()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.starts_with("weight sync to actor_infer"))
        .collect();
    assert_eq!(
        said,
        ["weight sync to actor_infer goes through the host copy in shared memory"],
        "{ev_there:#?}"
    );
}

#[test]
fn actor_infer_killed_9_mid_generation_is_replaced_and_no_sample_is_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let calm = run(dir.path(), "calm", &SEPARATE);

    let store = dir.path().join("killed.db");
    let cfg = write_config(dir.path(), "killed", RL);
    let mut args = vec!["run", cfg.to_str().unwrap(), PROCESS];
    args.extend_from_slice(&SEPARATE);
    // Kill the worker three times, each right after a step ends, when the next step's generation
    // begins.
    let (mut child, mut lines) = spawn_until(&store, &args, "rl      3/");
    // The worker computes with the threads its placement gives it: in a synchronous run, where
    // roles take turns, every core (workers.actor_infer.threads unset).
    let cores = std::thread::available_parallelism().unwrap().get();
    let pids = workers_of(child.id(), "actor_infer");
    assert_eq!(pids.len(), 1, "one actor_infer worker");
    for pid in pids {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        // And candle's elementwise pool runs on the calling thread (the binary's default, passed
        // down from the trainer), so no spinning helper thread takes a core from the products.
        for wanted in [
            format!("RAYON_NUM_THREADS={cores}"),
            "CANDLE_NUM_THREADS=1".to_string(),
        ] {
            assert!(
                environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()),
                "{wanted} not in the worker's environment"
            );
        }
    }
    let mut killed = vec![];
    for next in ["rl      6/", "rl      9/", ""] {
        killed.push(kill_9_worker(child.id(), "actor_infer"));
        if !next.is_empty() {
            let seen = lines
                .by_ref()
                .map(|l| l.unwrap())
                .find(|l| l.starts_with(next));
            assert!(seen.is_some(), "the run ended before '{next}'");
        }
    }
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success(), "{rest:?}");
    assert!(workers_of(child.id(), "actor_infer").is_empty());

    let ev = run_events(&store, "infer");
    let failed = of_kind(&ev, "worker_failed");
    assert_eq!(failed.len(), 3, "{ev:#?}");
    for (f, pid) in failed.iter().zip(&killed) {
        let text = f["message"].as_str().unwrap();
        assert_eq!(text, format!("pid {pid} died (killed by signal 9)"));
    }
    assert_eq!(of_kind(&ev, "worker_started").len(), 4, "{ev:#?}");
    let resubmitted: Vec<usize> = of_kind(&ev, "warning")
        .iter()
        .filter_map(|w| {
            let text = w["message"].as_str()?;
            let tail = text.strip_suffix(" requests in flight submitted again")?;
            tail.rsplit(' ').next()?.parse().ok()
        })
        .collect();
    assert_eq!(resubmitted.len(), 3, "{ev:#?}");
    // At least one kill caught requests half-generated (or not yet started) in the worker.
    assert!(resubmitted.iter().any(|n| *n > 0), "{ev:#?}");
    let restarts = rl_series(&store, "infer", "workers/actor_infer_restarts");
    assert_eq!(restarts.last(), Some(&3.0), "{restarts:?}");

    // Generated again with their own seeds, the lost requests produce the same tokens: every step
    // trains on the same samples. Only log-probabilities can differ in their last bits, because a
    // batch of different composition rounds differently.
    assert_eq!(sample_rows(&calm, "infer"), sample_rows(&store, "infer"));
    let (a, b) = (
        deterministic_metrics(&calm, "infer"),
        deterministic_metrics(&store, "infer"),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let key = x["key"].as_str().unwrap();
        let rounding_only = key == "actor/approx_kl" || key.starts_with("train_infer/");
        if !rounding_only {
            assert_eq!(x, y, "{key}");
            continue;
        }
        let (xs, ys) = (
            x["values"].as_array().unwrap(),
            y["values"].as_array().unwrap(),
        );
        assert_eq!(xs.len(), ys.len(), "{key}");
        for (u, v) in xs.iter().zip(ys) {
            let (u, v) = (u.as_f64().unwrap(), v.as_f64().unwrap());
            assert!((u - v).abs() <= 1e-6, "{key}: {u} vs {v}");
        }
    }
}
