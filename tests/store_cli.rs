//! The store's commands through the binary on a real (tiny) run: `runs`, `runs show|tag|note|rm`,
//! `metrics`, `samples`, `export`, the ROLL_STORE variable, and a refused second run of the same name.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::Output;

use assert_cmd::Command;
use serde_json::Value;

const CONFIG: &str = r#"
name: small
seed: 2
model:
  init: { arch: llama, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: "0123456789+=abc>" }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 16, digits: 1 }, reward: math_rule }
    - { name: rev, synthetic: { task: reversal, count: 16, min_len: 2, max_len: 3, alphabet: abc }, reward: exact_match }
sft: { steps: 3, batch_size: 4, optimizer: { lr: 0.01 } }
rl:
  steps: 4
  prompts_per_step: 4
  group_size: 2
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
"#;

/// `DIR/small.yaml`: [`CONFIG`] with its output in `DIR/out`.
fn small_config(dir: &Path) -> std::path::PathBuf {
    let cfg = dir.join("small.yaml");
    let text = format!("{CONFIG}output_dir: {}\n", dir.join("out").display());
    std::fs::write(&cfg, text).unwrap();
    cfg
}

fn roll(store: &Path) -> Command {
    let mut c = Command::cargo_bin("roll-tui").unwrap();
    c.arg("--store").arg(store);
    c
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(out: Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn store_commands_on_a_real_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("exp.db");
    let cfg = small_config(dir.path());

    // Reading commands need an existing store and say so.
    let err = fails(roll(&store).arg("runs").output().unwrap());
    assert!(
        err.contains("does not exist") && err.contains("--store"),
        "{err}"
    );

    let out = ok(roll(&store)
        .args(["run", cfg.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap());
    assert!(out.contains("run 'small' (id 1) finished"), "{out}");

    // The same name again is refused without touching the first run; --overwrite replaces it.
    let err = fails(
        roll(&store)
            .args(["run", cfg.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("run 'small' already exists") && err.contains("--overwrite"),
        "{err}"
    );

    let table = ok(roll(&store).arg("runs").output().unwrap());
    assert!(
        table.lines().next().unwrap().starts_with("  ID  NAME"),
        "{table}"
    );
    assert!(
        table.contains("small") && table.contains("finished") && table.contains("rl 4"),
        "{table}"
    );
    assert!(table.contains("add=") && table.contains("rev="), "{table}");

    // The environment variable names the store when --store is absent.
    let listed = Command::cargo_bin("roll-tui")
        .unwrap()
        .env("ROLL_STORE", &store)
        .args(["runs", "--json"])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&ok(listed)).unwrap();
    assert_eq!(runs[0]["name"], "small");
    assert_eq!(runs[0]["status"], "finished");
    assert!(runs[0]["last_rewards"]["add"].is_number(), "{runs}");

    // Metrics: a summary table, a glob, CSV and JSON.
    let summary = ok(roll(&store)
        .args(["metrics", "small", "--key", "reward/*/mean"])
        .output()
        .unwrap());
    assert_eq!(summary.lines().count(), 3, "{summary}");
    let csv = ok(roll(&store)
        .args(["metrics", "small", "--key", "sft/loss", "--csv"])
        .output()
        .unwrap());
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "stage,key,step,wall_time,value");
    assert_eq!(rows.len(), 1 + 3);
    assert!(rows[1].starts_with("sft,sft/loss,1,"), "{csv}");
    let json: Value = serde_json::from_str(&ok(roll(&store)
        .args(["metrics", "small", "--key", "actor/lr", "--json"])
        .output()
        .unwrap()))
    .unwrap();
    let stages: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["sft", "rl"]);
    assert_eq!(json[1]["steps"], serde_json::json!([1, 2, 3, 4]));
    let err = fails(
        roll(&store)
            .args(["metrics", "small", "--key", "nothing/*"])
            .output()
            .unwrap(),
    );
    assert!(err.contains("no metrics matching 'nothing/*'"), "{err}");
    // A plain word matches whole keys only: the error points at the glob that was meant.
    let err = fails(
        roll(&store)
            .args(["metrics", "small", "--key", "pg_loss", "--csv"])
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("'*pg_loss*' matches 1: actor/pg_loss"),
        "{err}"
    );

    // Samples: 4 prompts x 2 per step.
    let all: Value = serde_json::from_str(&ok(roll(&store)
        .args(["samples", "small", "--json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 4 * 4 * 2);
    let step2: Value = serde_json::from_str(&ok(roll(&store)
        .args([
            "samples", "small", "--step", "2", "--domain", "add", "--json",
        ])
        .output()
        .unwrap()))
    .unwrap();
    for s in step2.as_array().unwrap() {
        assert_eq!(
            (s["step"].as_u64(), s["domain"].as_str()),
            (Some(2), Some("add"))
        );
        assert_eq!(s["policy_version"], 1);
    }
    let text = ok(roll(&store)
        .args(["samples", "small", "--limit", "1"])
        .output()
        .unwrap());
    assert!(
        text.starts_with("[rl step 1 ·") && text.contains("prompt:"),
        "{text}"
    );
    // Text shows a page of 20 by default and says how to see the rest; --limit 0 shows all 32.
    let out = roll(&store).args(["samples", "small"]).output().unwrap();
    let paged = ok(out.clone());
    assert_eq!(paged.matches("\n  prompt:").count(), 20, "{paged}");
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("the first 20") && note.contains("--limit 0"),
        "{note}"
    );
    let whole = roll(&store)
        .args(["samples", "small", "--limit", "0"])
        .output()
        .unwrap();
    assert_eq!(ok(whole.clone()).matches("\n  prompt:").count(), 32);
    assert!(whole.stderr.is_empty());
    // Filters that match nothing say which values exist.
    for (args, said) in [
        (
            &["--domain", "nope"][..],
            "--domain nope: its domains are add, rev",
        ),
        (&["--stage", "foo"][..], "--stage foo: its stages are rl"),
        (
            &["--step", "9999"][..],
            "--step 9999: its sampled steps are rl 1 to 4",
        ),
    ] {
        let err = fails(
            roll(&store)
                .args(["samples", "small"])
                .args(args)
                .output()
                .unwrap(),
        );
        assert!(err.contains(said), "{args:?}: {err}");
    }

    // Export: plots and CSV that round-trips to what the store holds.
    let out_dir = dir.path().join("plots");
    ok(roll(&store)
        .args(["export", "small", "--format", "png,csv", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap());
    let png = png::Decoder::new(std::fs::File::open(out_dir.join("reward.png")).unwrap())
        .read_info()
        .unwrap();
    assert_eq!((png.info().width, png.info().height), (1200, 700));
    assert!(!out_dir.join("reward.svg").exists());
    let exported = roll::plot::read_csv(&out_dir.join("metrics.csv")).unwrap();
    let all_csv = ok(roll(&store)
        .args(["metrics", "small", "--csv"])
        .output()
        .unwrap());
    let direct = dir.path().join("direct.csv");
    std::fs::write(&direct, all_csv).unwrap();
    assert_eq!(exported, roll::plot::read_csv(&direct).unwrap());
    let err = fails(
        roll(&store)
            .args(["export", "small", "--format", "jpeg", "--out"])
            .arg(&out_dir)
            .output()
            .unwrap(),
    );
    assert!(err.contains("jpeg"), "{err}");

    // Tags and notes; show.
    ok(roll(&store)
        .args(["runs", "tag", "small", "baseline", "tiny"])
        .output()
        .unwrap());
    ok(roll(&store)
        .args(["runs", "tag", "small", "tiny", "--remove"])
        .output()
        .unwrap());
    ok(roll(&store)
        .args(["runs", "note", "small", "first try"])
        .output()
        .unwrap());
    // Offloads and reloads are summed up per role, not listed one by one; --events N lists the
    // raw tail.
    let text = ok(roll(&store)
        .args(["runs", "show", "small"])
        .output()
        .unwrap());
    assert!(text.contains("offloads and reloads"), "{text}");
    assert!(!text.contains("offload actor_infer"), "{text}");
    let moved = |role: &str, kind: &str| {
        text.lines()
            .find(|l| l.split_whitespace().take(2).eq([role, kind]))
            .and_then(|l| l.split_whitespace().nth(2)?.parse::<usize>().ok())
    };
    // 4 RL steps, colocated: actor_infer leaves for each train phase, comes back for 3 generates.
    assert_eq!(moved("actor_infer", "offload"), Some(4), "{text}");
    assert_eq!(moved("actor_infer", "reload"), Some(3), "{text}");
    let tail = ok(roll(&store)
        .args(["runs", "show", "small", "--events", "2"])
        .output()
        .unwrap());
    let after = tail.split("last 2 events:\n").nth(1).unwrap_or_default();
    assert_eq!(after.lines().count(), 2, "{tail}");
    let show: Value = serde_json::from_str(&ok(roll(&store)
        .args(["runs", "show", "1", "--json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(show["run"]["tags"], serde_json::json!(["baseline"]));
    assert_eq!(show["run"]["notes"], "first try");
    assert_eq!(show["config"]["name"], "small");
    assert_eq!(show["checkpoints"].as_array().unwrap().len(), 2, "{show}");

    // Deleting needs --yes; without it, a dry run that says so and succeeds.
    let dry = ok(roll(&store).args(["runs", "rm", "small"]).output().unwrap());
    assert!(
        dry.contains("would delete run 'small'") && dry.contains("nothing was deleted: pass --yes"),
        "{dry}"
    );
    assert!(ok(roll(&store).arg("runs").output().unwrap()).contains("small"));
    ok(roll(&store)
        .args(["runs", "rm", "small", "--yes"])
        .output()
        .unwrap());
    let empty = ok(roll(&store).arg("runs").output().unwrap());
    assert!(empty.contains("no runs in"), "{empty}");
}

/// `roll-tui --store STORE ARGS…` with `dir` mounted read-only (bubblewrap, which CI installs for
/// the code sandbox): a store on a read-only filesystem, even for root.
fn roll_read_only(dir: &Path, store: &Path, args: &[&str]) -> Output {
    std::process::Command::new("bwrap")
        .args(["--dev-bind", "/", "/", "--ro-bind"])
        .arg(dir)
        .arg(dir)
        .arg(assert_cmd::cargo::cargo_bin("roll-tui"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("bwrap runs (apt-get install bubblewrap)")
}

#[test]
fn reading_commands_work_on_a_read_only_filesystem_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("exp.db");
    let cfg = small_config(dir.path());
    ok(roll(&store)
        .args(["run", cfg.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap());
    let files = |d: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = (files(dir.path()), std::fs::read(&store).unwrap());
    // The sandbox itself works here (a read-only mount refuses writes).
    let probe = std::process::Command::new("bwrap")
        .args(["--dev-bind", "/", "/", "--ro-bind"])
        .arg(dir.path())
        .arg(dir.path())
        .args(["touch"])
        .arg(dir.path().join("probe"))
        .output()
        .unwrap();
    assert!(!probe.status.success(), "the mount is not read-only");

    let listed = ok(roll_read_only(dir.path(), &store, &["runs"]));
    assert!(
        listed.contains("small") && listed.contains("finished"),
        "{listed}"
    );
    // Progress against the stage's total steps.
    assert!(listed.contains("rl 4/4"), "{listed}");
    let shown = ok(roll_read_only(
        dir.path(),
        &store,
        &["runs", "show", "small"],
    ));
    assert!(shown.contains("run 'small' (id 1): finished"), "{shown}");
    let metrics = ok(roll_read_only(dir.path(), &store, &["metrics", "small"]));
    assert!(metrics.contains("reward/add/mean"), "{metrics}");
    // Exported elsewhere (a writable directory).
    let elsewhere = tempfile::tempdir().unwrap();
    let out = elsewhere.path().join("plots");
    ok(roll_read_only(
        dir.path(),
        &store,
        &[
            "export",
            "small",
            "--format",
            "csv",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    assert!(std::fs::read_dir(&out).unwrap().count() > 0);
    // Nothing was created or changed beside the store.
    assert_eq!((files(dir.path()), std::fs::read(&store).unwrap()), before);

    // Changes still in a -wal file (a copy taken while a run wrote) are read, or refused with the
    // reason when SQLite cannot read them without writing; never read stale.
    let pending = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let live = roll::store::Store::open(&store, roll::store::OpenMode::Existing)
            .await
            .unwrap();
        let run = live.find_run("small").await.unwrap();
        live.add_tags(run.id, &["late".into()]).await.unwrap();
        // Copied while still open: the tag is in the -wal file only.
        for suffix in ["", "-wal", "-shm"] {
            let from = format!("{}{suffix}", store.display());
            let to = pending.path().join(format!("exp.db{suffix}"));
            std::fs::copy(&from, &to).unwrap();
        }
        live.close().await;
    });
    let copy = pending.path().join("exp.db");
    // With its -shm file SQLite reads the -wal read-only: the tag is there.
    let listed = ok(roll_read_only(pending.path(), &copy, &["runs"]));
    assert!(listed.contains("late"), "{listed}");
    // Without it, reading would need writing: refused, not read without the tag.
    std::fs::remove_file(pending.path().join("exp.db-shm")).unwrap();
    let err = fails(roll_read_only(pending.path(), &copy, &["runs"]));
    assert!(err.contains("changes are still in"), "{err}");

    // A write is refused with the reason, said once.
    let err = fails(roll_read_only(
        dir.path(),
        &store,
        &["runs", "tag", "small", "x"],
    ));
    assert_eq!(err.lines().count(), 1, "{err}");
    // In words, with what to do, not SQLite's error code.
    assert!(
        err.contains("is read-only here (adding a tag)") && err.contains("writable --store"),
        "{err}"
    );
    assert!(!err.contains("(code: "), "{err}");
}

#[test]
fn timed_checkpoints_replace_each_other_and_stage_ends_stay() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("exp.db");
    let cfg = small_config(dir.path());
    let out = dir.path().join("out");
    // Every step is "30 minutes" after the last checkpoint.
    ok(roll(&store)
        .args([
            "run",
            cfg.to_str().unwrap(),
            "--quiet",
            "checkpoint.every_minutes=1e-9",
        ])
        .output()
        .unwrap());
    let mut kept: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    // Each stage's end stays; the timed ones before it were replaced one by one.
    assert_eq!(kept, ["rl-step4", "sft-step3"]);
    let shown = ok(roll(&store)
        .args(["runs", "show", "small"])
        .output()
        .unwrap());
    let removed = shown.lines().filter(|l| l.ends_with("(removed)")).count();
    // sft steps 1-2 and rl steps 1-3 were timed checkpoints.
    assert_eq!(removed, 5, "{shown}");
}

/// A run that failed says why under its line in `runs`, without `runs show`.
#[test]
fn the_runs_list_says_why_a_run_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let cfg = small_config(dir.path());
    let out = roll(&store)
        .args(["run", cfg.to_str().unwrap(), "--quiet"])
        .args(["model.path=/nonexistent/model", "model.init=null"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let listed = ok(roll(&store).arg("runs").output().unwrap());
    assert!(
        listed.contains("failed: model directory '/nonexistent/model': no such directory"),
        "{listed}"
    );
    // Resuming it says why it failed, not how to checkpoint.
    let err = fails(roll(&store).args(["resume", "small"]).output().unwrap());
    assert!(
        err.contains("it failed before its first step (model directory '/nonexistent/model'")
            && !err.contains("checkpoint.every"),
        "{err}"
    );
}
