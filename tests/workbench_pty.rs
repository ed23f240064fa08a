//! The workbench end to end, in a pseudo-terminal: the real binary, driven by keys, its screen
//! read back through a terminal emulator (vt100). From the Runs view it starts the quickstart
//! config (shrunk by overrides typed into the form), sees the dashboard update, opens the samples,
//! stops the run, and quits; the run is then in the store, stopped by the user after a checkpoint.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::io::Write;
use std::path::Path;

use common::pty::{Term, dump};

/// Overrides that keep the quickstart's shape but make it run in seconds: a tiny model, few SFT
/// steps, and more small RL steps than any machine gets through before the test stops the run
/// (400 were done in 31 s on a Zen 5 host, before the test had reached its stop). The test
/// stops the run itself, or [`KillLiveRuns`] does when it fails first.
fn overrides(out: &Path) -> String {
    format!(
        "name=e2e output_dir={} model.init.hidden=32 model.init.layers=1 model.init.heads=2 \
         model.init.kv_heads=1 model.init.intermediate=64 sft.steps=10 sft.batch_size=8 \
         rl.steps=100000 rl.prompts_per_step=4 rl.group_size=4 checkpoint.every=0",
        out.display()
    )
}

/// On a failed wait, kills the runs of `store` still running: the workbench starts its runs
/// detached (they outlive it on purpose), and this test's run has steps for hours.
struct KillLiveRuns<'a>(&'a Path);

impl Drop for KillLiveRuns<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let out = common::roll(self.0, &["runs", "--json"]);
        let runs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        for run in runs.iter().filter(|r| r["status"] == "running") {
            if let Some(pid) = run["pid"].as_u64().and_then(|p| u32::try_from(p).ok()) {
                common::kill_9(pid);
            }
        }
    }
}

#[test]
fn start_the_quickstart_watch_it_open_samples_stop_it_and_quit() {
    let dir = tempfile::tempdir().unwrap();
    let experiments = dir.path().join("experiments");
    std::fs::create_dir(&experiments).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        root.join("experiments/quickstart.yaml"),
        experiments.join("quickstart.yaml"),
    )
    .unwrap();
    // The fragments the quickstart includes (`../configs/…`).
    for fragment in ["models/tiny-qwen2.yaml", "data/add-and-reverse.yaml"] {
        let to = dir.path().join("configs").join(fragment);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join("configs").join(fragment), to).unwrap();
    }
    let store = dir.path().join("roll.db");
    let _kill_live_runs = KillLiveRuns(&store);

    let mut t = Term::start(&store, dir.path(), &[]);
    t.wait_for("1 Runs", 60);
    t.wait_for("no store at", 30);

    // The new-run form lists the config; the overrides are typed in.
    t.keys("n");
    t.wait_for("experiments/quickstart.yaml", 30);
    for c in overrides(&dir.path().join("out")).chars() {
        t.input.write_all(c.to_string().as_bytes()).unwrap();
    }
    t.keys("");
    t.wait_for("rl.steps=100000", 10);
    t.keys("\r");

    // The run shows up and its dashboard opens by itself, live; it fills as the run goes.
    t.wait_for("● live", 120);
    t.wait_for("loss (sft)", 120);
    let first = t.wait_for("reward (rl)", 300);
    assert!(first.contains("e2e"), "{first}");
    let curves = |s: &str| s.lines().skip(2).collect::<Vec<_>>().join("\n");
    let later = t.wait_until("the curves to change", 120, |s| curves(s) != curves(&first));
    dump("dashboard", &later);

    // Enter drills down into the samples of the newest step.
    t.keys("\r");
    let screen = t.wait_until("the samples of a step", 60, |s| {
        s.lines()
            .any(|l| l.trim_start().starts_with("Samples · rl step "))
            && s.contains("reward")
    });
    dump("samples", &screen);

    // Back on the runs list the run is live; X asks, y stops it after its step.
    t.keys("1");
    t.wait_for("running", 30);
    t.keys("X");
    dump("stop", &t.wait_for("Stop 'e2e'", 10));
    t.keys("y");
    dump("stopped", &t.wait_for("interrupted", 120));

    // Nothing started here is running any more: q quits at once.
    t.keys("q");
    let status = t.wait_exit(30);
    assert!(status.success(), "{status}");

    // The run is in the store: stopped by the user, with its steps and samples recorded.
    let runs: serde_json::Value =
        serde_json::from_str(&common::ok(common::roll(&store, &["runs", "--json"]))).unwrap();
    let run = &runs.as_array().unwrap()[0];
    assert_eq!(run["name"], "e2e");
    assert_eq!(run["status"], "interrupted");
    assert_eq!(run["last_stage"], "rl");
    let last_step = run["last_step"].as_u64().unwrap();
    assert!((1..100_000).contains(&last_step), "{run}");
    let samples = common::ok(common::roll(&store, &["samples", "e2e", "--json"]));
    let samples: serde_json::Value = serde_json::from_str(&samples).unwrap();
    assert!(samples.as_array().unwrap().len() >= 16);
    // A stop by the user writes a checkpoint, so the run can be resumed.
    let shown = common::ok(common::roll(&store, &["runs", "show", "e2e", "--json"]));
    assert!(shown.contains("checkpoint"), "{shown}");
}
