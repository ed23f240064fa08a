//! `roll-tui eval` end to end: a run's checkpoint scored on a test file gives what the run's own
//! `rl.eval` measured of the same policy on the same prompts, the stored evaluation run holds
//! exactly those prompts' answers, and the options change what is evaluated.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{TINY_MODEL_AND_DATA, ok, refused, roll, stage_series, write_config};
use serde_json::Value;

/// Held-out addition prompts: their ground truths are right, so accuracy is the share the model
/// gets right.
const TEST_FILE: &str = r#"{"prompt": "1+2=", "ground_truth": "3"}
{"prompt": "4+4=", "ground_truth": "8"}
{"prompt": "7+5=", "ground_truth": "12"}
{"prompt": "9+9=", "ground_truth": "18"}
{"prompt": "6+3=", "ground_truth": "9"}
"#;

/// The tiny model and data with `add`'s held-out prompts in `test.jsonl`, evaluated greedily
/// before RL and after its last step.
fn evaluated_run(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let test = dir.join("test.jsonl");
    std::fs::write(&test, TEST_FILE).unwrap();
    let store = dir.join("eval.db");
    let rest = r#"
name: judged
seed: 5
sft: { steps: 20, batch_size: 16, optimizer: { lr: 0.01 } }
rl:
  steps: 4
  prompts_per_step: 8
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.03 }
  eval: { every: 4 }
"#;
    let cfg = write_config(dir, "judged", rest);
    // The add domain's held-out prompts are the test file's.
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "reward: math_rule }",
        &format!("reward: math_rule, val_path: {} }}", test.display()),
    );
    assert!(text.contains("val_path"), "{TINY_MODEL_AND_DATA}");
    std::fs::write(&cfg, text).unwrap();
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    (store, test)
}

fn eval_json(store: &Path, args: &[&str]) -> Value {
    let mut all = vec!["eval"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(roll(store, &all))).unwrap()
}

/// (prompt, domain) of every stored answer of `run`, sorted.
fn answers(store: &Path, run: &str) -> Vec<(String, String)> {
    let out = ok(roll(store, &["samples", run, "--json", "--limit", "0"]));
    let all: Vec<Value> = serde_json::from_str(&out).unwrap();
    let mut rows: Vec<(String, String)> = all
        .iter()
        .map(|s| {
            assert_eq!(s["stage"], "eval");
            (
                s["prompt"].as_str().unwrap().to_string(),
                s["domain"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_checkpoint_scores_as_the_run_evaluated_it_and_is_stored_as_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let (store, test) = evaluated_run(dir.path());
    // The run evaluated its policy before RL (step 0) and after step 4, greedily.
    let in_run = stage_series(&store, "judged", "rl", "val/add/accuracy");
    let lengths = stage_series(&store, "judged", "rl", "val/add/response_length");
    assert_eq!(in_run.len(), 2, "{in_run:?}");
    // RL moved the policy (its answers' lengths differ), so scoring the wrong one shows.
    assert_ne!(lengths[0], lengths[1]);
    let data = format!("add={}", test.display());
    // The same policies scored outside the run, on the same prompts, greedily: the same
    // answers, so the same accuracy. `@rl-0` is the policy RL started from (SFT's last).
    for (at, spec) in ["judged@rl-0", "judged@rl-4"].into_iter().enumerate() {
        let out = eval_json(&store, &[spec, "--data", &data]);
        assert_eq!(out["evaluated"], spec);
        let m = &out["metrics"];
        assert_eq!(
            m["val/add/accuracy"].as_f64().unwrap(),
            in_run[at],
            "{spec}"
        );
        let length = m["val/add/response_length"].as_f64().unwrap();
        assert_eq!(length, lengths[at], "{spec}");
        assert_eq!(m["val/add/prompts"].as_f64().unwrap(), 5.0);
        // One greedy answer per prompt: mean@1 and pass@1 are its accuracy.
        assert_eq!(m["val/add/pass@1"], m["val/add/accuracy"]);
        // Only the domain the file was given to.
        assert!(m.get("val/rev/accuracy").is_none(), "{m}");
    }
    // Stored as runs named after the checkpoints, tagged eval, holding each prompt's answer.
    let runs: Vec<Value> = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    let eval_runs: Vec<&str> = runs
        .iter()
        .filter(|r| r["tags"].as_array().unwrap().iter().any(|t| t == "eval"))
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(eval_runs, ["eval-judged-rl-4", "eval-judged-rl-0"]);
    let prompts: Vec<(String, String)> = TEST_FILE
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["prompt"].as_str().unwrap().to_string(), "add".to_string())
        })
        .collect();
    let mut sorted = prompts.clone();
    sorted.sort();
    assert_eq!(answers(&store, "eval-judged-rl-4"), sorted);
    assert_eq!(
        stage_series(&store, "eval-judged-rl-4", "eval", "val/add/accuracy"),
        [in_run[1]]
    );

    // k samples per prompt at a temperature: k answers each, and pass@k at least the accuracy.
    let out = eval_json(
        &store,
        &[
            "judged",
            "--data",
            &data,
            "--samples",
            "3",
            "--temperature",
            "1",
            "--name",
            "k3",
        ],
    );
    assert_eq!(out["evaluated"], "judged@rl-4", "the latest checkpoint");
    let m = &out["metrics"];
    assert!(m["val/add/pass@3"].as_f64().unwrap() >= m["val/add/accuracy"].as_f64().unwrap());
    let k3 = answers(&store, "k3");
    assert_eq!(k3.len(), 15);
    let mut thrice: Vec<(String, String)> = sorted
        .iter()
        .flat_map(|p| [p.clone(), p.clone(), p.clone()])
        .collect();
    thrice.sort();
    assert_eq!(k3, thrice);
    // A page of text shows every prompt's first answer before any second; JSON keeps the
    // recorded order (each prompt's three answers together).
    let text = ok(roll(&store, &["samples", "k3", "--limit", "5"]));
    let shown: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  prompt:   "))
        .map(|p| serde_json::from_str::<String>(p).unwrap())
        .collect();
    let in_file: Vec<String> = prompts.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(shown, in_file);
    let json = ok(roll(&store, &["samples", "k3", "--json", "--limit", "3"]));
    let recorded: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert!(recorded.iter().all(|s| s["prompt"] == in_file[0].as_str()));
    // --max-prompts takes each domain's first prompts.
    eval_json(
        &store,
        &[
            "judged",
            "--data",
            &data,
            "--max-prompts",
            "2",
            "--name",
            "two",
        ],
    );
    let mut first_two = prompts[..2].to_vec();
    first_two.sort();
    assert_eq!(answers(&store, "two"), first_two);
    // A name in use is refused unless replaced.
    let err = refused(roll(
        &store,
        &["eval", "judged", "--data", &data, "--name", "two"],
    ));
    assert!(
        err.contains("run 'two' already exists") && err.contains("--overwrite"),
        "{err}"
    );
    ok(roll(
        &store,
        &[
            "eval",
            "judged",
            "--data",
            &data,
            "--name",
            "two",
            "--overwrite",
        ],
    ));
    // model score takes the checkpoint as RUN@STEP too, and scores as its directory does.
    let score = |model: &str| {
        ok(roll(
            &store,
            &[
                "model",
                "score",
                model,
                "--prompt",
                "1+2=",
                "--completion",
                "3",
            ],
        ))
    };
    let checkpoint = dir.path().join("judged/checkpoints/rl-step4");
    assert_eq!(score("judged@rl-4"), score(checkpoint.to_str().unwrap()));
    // --overwrite replaces an evaluation, never a training run (it deleted the run evaluated).
    let overwrite_judged = || {
        let args = [
            "eval",
            "judged",
            "--data",
            &data,
            "--name",
            "judged",
            "--overwrite",
        ];
        refused(roll(&store, &args))
    };
    let err = overwrite_judged();
    assert!(err.contains("is not an evaluation (it trains)"), "{err}");
    // A tag alone does not make a training run an evaluation.
    ok(roll(&store, &["runs", "tag", "judged", "eval"]));
    let err = overwrite_judged();
    assert!(err.contains("is not an evaluation (it trains)"), "{err}");
    ok(roll(&store, &["runs", "tag", "judged", "eval", "--remove"]));
    assert_eq!(
        stage_series(&store, "judged", "rl", "val/add/accuracy"),
        in_run
    );
    // Where a directory has the run's name (its output, here), the run is named by its id.
    let out = common::bin()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["eval", "judged"])
        .output()
        .unwrap();
    let err = refused(out);
    assert!(
        err.contains("a run 'judged' is in the store too: #1 names it"),
        "{err}"
    );
    // What cannot be evaluated says why: an evaluation has no model, a step must be a number.
    let err = refused(roll(&store, &["eval", "eval-judged-rl-4"]));
    assert!(
        err.contains("none: it is an evaluation, which trains nothing"),
        "{err}"
    );
    let err = refused(roll(&store, &["eval", "judged@abc"]));
    assert!(err.contains("(a checkpoint is RUN@STEP"), "{err}");
    // Without --data: the run's own held-out prompts (val_path).
    let own = eval_json(&store, &["judged@rl-4"]);
    assert_eq!(
        own["metrics"]["val/add/accuracy"].as_f64().unwrap(),
        in_run[1]
    );
}

#[test]
fn data_lines_go_to_their_domains_and_bad_ones_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let cfg = write_config(
        dir.path(),
        "fresh",
        "name: fresh\nseed: 1\nrl: { steps: 1, prompts_per_step: 2, group_size: 2 }\n",
    );
    let cfg = cfg.to_str().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    // Lines naming their domain go to it; a config's model is scored as it starts.
    let mixed = file(
        "mixed.jsonl",
        "{\"prompt\": \"1+1=\", \"ground_truth\": \"2\", \"domain\": \"add\"}\n\
         {\"prompt\": \"ab>\", \"ground_truth\": \"ba\", \"domain\": \"rev\"}\n\
         {\"prompt\": \"ca>\", \"ground_truth\": \"ac\", \"domain\": \"rev\"}\n",
    );
    let out = eval_json(&store, &[cfg, "--data", &mixed]);
    assert_eq!(out["run"], "eval-fresh");
    assert_eq!(out["metrics"]["val/add/prompts"], 1.0);
    assert_eq!(out["metrics"]["val/rev/prompts"], 2.0);
    let bare = file(
        "bare.jsonl",
        "{\"prompt\": \"1+1=\", \"ground_truth\": \"2\"}\n",
    );
    let err = refused(roll(&store, &["eval", cfg, "--data", &bare]));
    assert!(
        err.contains("line 1 names no domain") && err.contains("--data DOMAIN="),
        "{err}"
    );
    // DOMAIN=FILE counts every line towards DOMAIN, whatever the line says.
    let out = eval_json(&store, &[cfg, "--data", &format!("rev={mixed}")]);
    assert_eq!(out["run"], "eval-fresh-2", "numbered when taken");
    assert_eq!(out["metrics"]["val/rev/prompts"], 3.0);
    let err = refused(roll(
        &store,
        &["eval", cfg, "--data", &format!("mul={bare}")],
    ));
    assert!(
        err.contains("no domain 'mul' (its domains: add, rev)"),
        "{err}"
    );
    let other = file(
        "other.jsonl",
        "{\"prompt\": \"1+1=\", \"ground_truth\": \"2\", \"domain\": \"mul\"}\n",
    );
    let err = refused(roll(&store, &["eval", cfg, "--data", &other]));
    assert!(
        err.contains("line 1: domain 'mul' is not one of the config's (add, rev)"),
        "{err}"
    );
    // A character the tokenizer does not know is refused with its place.
    let odd = file(
        "odd.jsonl",
        "{\"prompt\": \"1+é=\", \"ground_truth\": \"2\", \"domain\": \"add\"}\n",
    );
    let err = refused(roll(&store, &["eval", cfg, "--data", &odd]));
    assert!(err.contains("odd.jsonl' line 1"), "{err}");
    // Answers that cannot fit beside a prompt in the model's positions: refused before any
    // generation (the engine failed at the first such request), and a run's before its SFT.
    let err = refused(roll(
        &store,
        &["eval", cfg, "--data", &mixed, "--max-tokens", "1000"],
    ));
    assert!(
        err.contains("answers may take 1000 more") && err.contains("new tokens or fewer"),
        "{err}"
    );
    let out = roll(
        &store,
        &[
            "run",
            cfg,
            "name=room",
            "rl.sampling.max_new_tokens=1000",
            "sft={steps: 40, batch_size: 4}",
        ],
    );
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let err = refused(out);
    assert!(
        err.contains("rl.sampling.max_new_tokens 1000 more"),
        "{err}"
    );
    assert!(!printed.contains("sft      1/"), "{printed}");
    // Greedy decoding gives one answer: k samples need a temperature.
    let err = refused(roll(
        &store,
        &["eval", cfg, "--data", &mixed, "--samples", "2"],
    ));
    assert!(
        err.contains("--samples is 2") && err.contains("--temperature"),
        "{err}"
    );
    // One prompt with two ground truths is a mistake, not a choice of the first.
    let twice = file(
        "twice.jsonl",
        "{\"prompt\": \"3+4=\", \"ground_truth\": \"8\", \"domain\": \"add\"}\n\
         {\"prompt\": \"3+4=\", \"ground_truth\": \"7\", \"domain\": \"add\"}\n",
    );
    let err = refused(roll(&store, &["eval", cfg, "--data", &twice]));
    assert!(
        err.contains("line 2: prompt '3+4=' is already in domain 'add' with ground truth '8'"),
        "{err}"
    );
    // Held-out files alone: the training data is not read (it may be elsewhere now).
    let train = file(
        "train.jsonl",
        "{\"prompt\": \"1+1=\", \"ground_truth\": \"2\"}\n",
    );
    let held = file(
        "held.jsonl",
        "{\"prompt\": \"2+2=\", \"ground_truth\": \"4\"}\n",
    );
    let own = dir.path().join("own.yaml");
    std::fs::write(
        &own,
        std::fs::read_to_string(cfg).unwrap().replace(
            "- { name: add, synthetic: { task: addition, count: 40, digits: 1, demo_noise: 0.5 }, reward: math_rule }",
            &format!("- {{ name: add, path: {train}, val_path: {held}, reward: math_rule }}"),
        ),
    )
    .unwrap();
    std::fs::remove_file(&train).unwrap();
    let out = eval_json(&store, &[own.to_str().unwrap(), "--name", "own"]);
    assert_eq!(out["metrics"]["val/add/prompts"], 1.0);
    // A long name widens the runs table's column instead of pushing the rest of its row.
    let long = "an-evaluation-named-at-some-length";
    eval_json(&store, &[own.to_str().unwrap(), "--name", long]);
    let table = ok(roll(&store, &["runs"]));
    let status_at = |line: &str| {
        ["STATUS", "finished", "failed"]
            .iter()
            .filter_map(|w| line.find(w))
            .min()
    };
    // The header and the runs' rows (not a failed run's reason under its row).
    let rows = table.lines().filter(|l| {
        l.trim_start()
            .starts_with(|c: char| c.is_ascii_digit() || c == 'I')
    });
    let columns: Vec<Option<usize>> = rows.map(status_at).collect();
    assert!(
        columns.iter().all(|c| *c == columns[0] && c.is_some()),
        "{table}"
    );
    ok(roll(&store, &["runs", "rm", long, "--yes"]));
    // An agentic config is evaluated on episodes, and says how.
    let lake = dir.path().join("lake.yaml");
    std::fs::write(
        &lake,
        std::fs::read_to_string(cfg)
            .unwrap()
            .replace("rl: {", "rl: { env: { name: frozen_lake }, "),
    )
    .unwrap();
    let err = refused(roll(
        &store,
        &["eval", lake.to_str().unwrap(), "--data", &mixed],
    ));
    assert!(
        err.contains("evaluated on episodes") && err.contains("env play"),
        "{err}"
    );
    // The config holds nothing out and no file is given.
    let err = refused(roll(&store, &["eval", cfg]));
    assert!(
        err.contains("holds out no prompts: pass --data FILE"),
        "{err}"
    );
    // Failed evaluations stored nothing (the run refused at set-up keeps its failed row, as such
    // a run does, replaced by the next of its name).
    let runs: Vec<Value> = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["own", "room", "eval-fresh-2", "eval-fresh"],
        "{runs:?}"
    );
}

#[test]
fn answers_a_reward_cannot_judge_are_reported_and_stored_as_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    // ifeval reads its ground truth as a JSON list of instructions: "abc" is none, so every
    // answer scores 0 with an error, which the evaluation must say rather than show a flat 0.
    let data = dir.path().join("inst.jsonl");
    std::fs::write(&data, "{\"prompt\": \"ab>\", \"ground_truth\": \"abc\"}\n").unwrap();
    let cfg = dir.path().join("inst.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: inst\nseed: 1\nmodel:\n  init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, \
             kv_heads: 1, intermediate: 32, chars: \"0123456789+=abc>\" }}\ndata:\n  domains:\n    \
             - {{ name: inst, path: {}, reward: ifeval }}\nrl: {{ steps: 1, prompts_per_step: 1, \
             group_size: 2 }}\n",
            data.display()
        ),
    )
    .unwrap();
    let data_arg = data.display().to_string();
    let out = roll(
        &store,
        &["eval", cfg.to_str().unwrap(), "--data", &data_arg],
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    ok(out);
    assert!(
        err.contains("warning: domain 'inst': ") && err.contains("(1 answer scored 0)"),
        "{err}"
    );
    let shown = ok(roll(&store, &["runs", "show", "eval-inst", "--json"]));
    let run: Value = serde_json::from_str(&shown).unwrap();
    let warnings: Vec<&Value> = run["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "warning")
        .collect();
    assert_eq!(warnings.len(), 1, "{run}");
}
