//! Experiment-store benchmarks (`cargo bench --bench store`), printed as figures:
//! - ingest: metric points per second through the public writer API, from a plain thread as the
//!   pipeline sends them (one message per step), including the final flush;
//! - load: time to read every series of a 100k-step run (the TUI's replay path), median of 5.

use std::time::Instant;

use roll::store::liveness::ProcessIdentity;
use roll::store::{NewRun, OpenMode, Store};

/// Keys per step: about what an RL step with two domains records.
const KEYS: usize = 40;

fn new_run(name: &str) -> NewRun {
    NewRun {
        name: name.into(),
        config_json: "{}".into(),
        config_hash: "bench".into(),
        git_revision: None,
        seed: 0,
        output_dir: "runs/bench".into(),
    }
}

fn keys() -> Vec<String> {
    (0..KEYS)
        .map(|k| match k % 4 {
            0 => format!("reward/domain{k}/mean"),
            1 => format!("actor/metric{k}"),
            2 => format!("time/phase{k}"),
            _ => format!("score/domain{k}/accuracy"),
        })
        .collect()
}

fn ingest(rt: &tokio::runtime::Runtime, store: &Store, name: &str, steps: u64) -> (f64, u64) {
    let run = rt
        .block_on(store.create_run(&new_run(name), false, &ProcessIdentity::current()))
        .expect("create run");
    let (writer, task) = {
        let _guard = rt.enter();
        store.spawn_writer()
    };
    let keys = keys();
    let t0 = Instant::now();
    for step in 1..=steps {
        let points = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), (step as f64).sin() * i as f64))
            .collect();
        writer
            .metrics_blocking(run, "rl", step, step as f64 * 0.5, points)
            .expect("queue metrics");
    }
    writer.flush_blocking().expect("flush");
    let secs = t0.elapsed().as_secs_f64();
    let blocked = writer.take_blocked_secs();
    drop(writer);
    rt.block_on(task).expect("writer task");
    println!(
        "ingest {name}: {steps} steps x {KEYS} keys = {} points in {secs:.2} s = {:.0} points/s \
         (producer blocked on a full queue {blocked:.2} s)",
        steps * KEYS as u64,
        (steps * KEYS as u64) as f64 / secs
    );
    ((steps * KEYS as u64) as f64 / secs, run.0 as u64)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let store = rt
        .block_on(Store::open(&path, OpenMode::Create))
        .expect("open store");

    ingest(&rt, &store, "ingest-25k", 25_000);
    let (_, run) = ingest(&rt, &store, "run-100k", 100_000);
    let run = roll::store::RunId(run as i64);
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("store file: {:.1} MB", bytes as f64 / 1e6);

    let mut times = vec![];
    for _ in 0..5 {
        let t0 = Instant::now();
        let series = rt
            .block_on(store.load_series(run, None))
            .expect("load series");
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        assert_eq!(series.len(), KEYS);
        assert!(series.iter().all(|s| s.len() == 100_000));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "load all series of a 100k-step run ({KEYS} keys, {} points): median {:.0} ms (min {:.0}, max {:.0})",
        100_000 * KEYS,
        times[2],
        times[0],
        times[4]
    );
    rt.block_on(store.close());
}
