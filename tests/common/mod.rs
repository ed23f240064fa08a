//! Helpers shared by the end-to-end tests that drive the `roll-tui` binary against a store.

#![allow(dead_code)] // each test crate uses a subset
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Lines};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};

use serde_json::Value;

pub mod pty;

/// The tiny model, the two synthetic domains and the short SFT stage of the end-to-end tests; a test
/// adds `name`, `seed`, its `rl:` section and `output_dir`.
pub const TINY_MODEL_AND_DATA: &str = r#"
model:
  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=abc>" }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 40, digits: 1, demo_noise: 0.5 }, reward: math_rule }
    - { name: rev, synthetic: { task: reversal, count: 40, min_len: 2, max_len: 3, alphabet: abc }, reward: exact_match }
"#;

/// Write `DIR/NAME.yaml`: the tiny model and data, then `rest` (YAML), with its output in `DIR/NAME`.
pub fn write_config(dir: &Path, name: &str, rest: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let out = dir.join(name);
    let text = format!(
        "{TINY_MODEL_AND_DATA}{rest}\noutput_dir: {}\n",
        out.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

pub fn bin() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("roll-tui"))
}

/// `roll-tui --store STORE ARGS…`, run to completion.
pub fn roll(store: &Path, args: &[&str]) -> Output {
    bin().arg("--store").arg(store).args(args).output().unwrap()
}

/// Stdout of a command that must succeed.
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Stderr of a command that must fail.
pub fn refused(out: Output) -> String {
    assert!(
        !out.status.success(),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// The values of `key` in `run`'s RL stage, by step.
pub fn rl_series(store: &Path, run: &str, key: &str) -> Vec<f64> {
    stage_series(store, run, "rl", key)
}

/// The values of `key` in `run`'s stage `stage`, by step.
pub fn stage_series(store: &Path, run: &str, stage: &str, key: &str) -> Vec<f64> {
    let out = ok(roll(store, &["metrics", run, "--key", key, "--json"]));
    let all: Vec<Value> = serde_json::from_str(&out).unwrap();
    let s = all
        .iter()
        .find(|s| s["stage"] == stage)
        .unwrap_or_else(|| panic!("no {stage} {key} in {all:?}"));
    s["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// A teacher for distillation tests: the tiny model after 30 SFT steps on the tiny data, written
/// under `dir`; its last checkpoint (a model directory).
pub fn sft_teacher(dir: &Path) -> std::path::PathBuf {
    run_quiet(
        dir,
        "teach",
        "name: teach\nseed: 2\nsft: { steps: 30, batch_size: 8, optimizer: { lr: 0.01 } }\n",
        &[],
    );
    dir.join("teach/checkpoints/sft-step30")
}

/// Every metric series of `run` except those that measure the machine or the process layout
/// (timings, throughput and rates, store back-pressure, worker restarts), without wall times.
pub fn deterministic_metrics(store: &Path, run: &str) -> Vec<Value> {
    let out = ok(roll(store, &["metrics", run, "--json"]));
    let all: Vec<Value> = serde_json::from_str(&out).unwrap();
    all.into_iter()
        .filter(|s| {
            let key = s["key"].as_str().unwrap();
            // Rates (`rollout/turns_per_s`) measure the machine too.
            !["time/", "system/", "store/", "workers/"]
                .iter()
                .any(|p| key.starts_with(p))
                && !key.ends_with("_per_s")
        })
        .map(|mut s| {
            s.as_object_mut().unwrap().remove("wall_time");
            s
        })
        .collect()
}

/// Start `roll-tui --store STORE ARGS…` and return once it prints a line starting with `prefix`,
/// with the lines still to come. Panics if the process ends first.
pub fn spawn_until<I, S>(
    store: &Path,
    args: I,
    prefix: &str,
) -> (Child, Lines<BufReader<ChildStdout>>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = bin()
        .arg("--store")
        .arg(store)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let seen = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with(prefix));
    assert!(seen.is_some(), "the run ended before printing '{prefix}…'");
    (child, lines)
}

/// Pids of the `role` worker processes of `parent` (from /proc).
pub fn workers_of(parent: u32, role: &str) -> Vec<u32> {
    let (role, parent) = (format!("worker\0{role}\0"), format!("--parent\0{parent}\0"));
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains(&role) && c.contains(&parent)
            })
        })
        .collect()
}

/// The scheduler and worker events of `run`.
pub fn run_events(store: &Path, run: &str) -> Vec<Value> {
    let out = ok(roll(store, &["runs", "show", run, "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["events"].as_array().unwrap().clone()
}

pub fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

/// (step, prompt, response, reward) of every stored RL sample of `run`, in a fixed order.
pub fn sample_rows(store: &Path, run: &str) -> Vec<(u64, String, String, f64)> {
    let out = ok(roll(store, &["samples", run, "--json", "--limit", "10000"]));
    let all: Vec<Value> = serde_json::from_str(&out).unwrap();
    let mut rows: Vec<_> = all
        .iter()
        .filter(|s| s["stage"] == "rl")
        .map(|s| {
            (
                s["step"].as_u64().unwrap(),
                s["prompt"].as_str().unwrap().to_string(),
                s["response"].as_str().unwrap().to_string(),
                s["reward"].as_f64().unwrap(),
            )
        })
        .collect();
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rows
}

/// (kind, role, bytes) of every offload and reload among `events`, in order.
pub fn transfers(events: &[Value]) -> Vec<(String, String, u64)> {
    events
        .iter()
        .filter(|e| e["kind"] == "offload" || e["kind"] == "reload")
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["worker"].as_str().unwrap().to_string(),
                e["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The deterministic metrics of `run` are the same in both stores, series by series (a mismatch
/// names the series instead of printing every value).
pub fn assert_same_metrics(a: &Path, b: &Path, run: &str) {
    let (a, b) = (deterministic_metrics(a, run), deterministic_metrics(b, run));
    let names = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|s| format!("{} {}", s["stage"], s["key"]))
            .collect()
    };
    assert_eq!(names(&a), names(&b));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "series {} {} differs", x["stage"], x["key"]);
    }
}

/// Run the tiny model and data with `rest` (see [`write_config`]) as `DIR/NAME.db`, quietly, with
/// `overrides`; returns the store.
pub fn run_quiet(dir: &Path, name: &str, rest: &str, overrides: &[&str]) -> std::path::PathBuf {
    let store = dir.join(format!("{name}.db"));
    let cfg = write_config(dir, name, rest);
    let mut args = vec!["run", "--quiet", cfg.to_str().unwrap()];
    args.extend_from_slice(overrides);
    ok(roll(&store, &args));
    store
}

/// Run `rest` with `overrides` as `DIR/killed.db` until its output shows `at`, kill it, and
/// resume `run` (the config's name) quietly: the store and what the resume printed.
pub fn killed_and_resumed(
    dir: &Path,
    run: &str,
    rest: &str,
    overrides: &[&str],
    at: &str,
) -> (std::path::PathBuf, String) {
    let store = dir.join("killed.db");
    let cfg = write_config(dir, "killed", rest);
    let mut args = vec!["run", cfg.to_str().unwrap()];
    args.extend_from_slice(overrides);
    let (mut child, _) = spawn_until(&store, args, at);
    child.kill().unwrap();
    child.wait().unwrap();
    let resumed = ok(roll(&store, &["resume", run, "--quiet"]));
    (store, resumed)
}

/// SIGKILL process `pid` (`kill -9`); whether it was sent.
pub fn kill_9(pid: u32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGKILL the one `role` worker of `parent`; returns its pid.
pub fn kill_9_worker(parent: u32, role: &str) -> u32 {
    let pids = workers_of(parent, role);
    assert_eq!(pids.len(), 1, "{role} workers: {pids:?}");
    assert!(kill_9(pids[0]));
    pids[0]
}

/// The small model the model-level tests build (`init_model_dir`): 2 layers of width 64, 4 heads
/// over 2 KV heads, f32, seed 3; tied embeddings but for Llama.
pub fn model_options(arch: roll::model::Arch) -> roll::model::hf_dir::InitOptions {
    roll::parity::small_options(arch, 3)
}
