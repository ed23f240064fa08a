//! Commands whose reader has gone away (`roll-tui metrics RUN | head -1`) end quietly with status
//! 0, as Unix tools do, instead of panicking with a backtrace.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{bin, ok, roll, write_config};

/// Runs `args` with stdout a pipe whose reading end is already closed, so the first write fails.
fn with_closed_stdout(store: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    bin()
        .arg("--store")
        .arg(store)
        .args(args)
        .stdout(writer)
        .output()
        .unwrap()
}

#[test]
fn printing_commands_end_quietly_when_their_reader_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    let cfg = write_config(
        dir.path(),
        "piped",
        "name: piped\nrl: { steps: 2, prompts_per_step: 2, group_size: 2 }",
    );
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    for args in [
        &["env", "list"][..],
        &["runs", "--json"],
        &["runs"],
        &["runs", "show", "piped"],
        &["runs", "show", "piped", "--json"],
        &["metrics", "piped"],
        &["metrics", "piped", "--csv"],
        &["samples", "piped"],
        &[
            "reward",
            "score",
            "--kind",
            "math_verify",
            "--response",
            "\\boxed{1}",
            "--truth",
            "1",
        ],
        &["--help"],
    ] {
        let out = with_closed_stdout(&store, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// `roll-tui run CONFIG | head -3`: the run outlives its reader and ends as it would have,
/// checkpoint and all (it was killed at its next line, with status 0 and no checkpoint).
#[test]
fn a_run_outlives_the_reader_of_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    let cfg = write_config(
        dir.path(),
        "headless",
        "name: headless\nsft: { steps: 3, batch_size: 4 }\nrl: { steps: 2, prompts_per_step: 2, group_size: 2 }",
    );
    let out = with_closed_stdout(&store, &["run", cfg.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: serde_json::Value =
        serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert_eq!(runs[0]["status"], "finished", "{runs}");
    assert_eq!(runs[0]["last_step"], 2);
    assert!(dir.path().join("headless/checkpoints/rl-step2").is_dir());
}
