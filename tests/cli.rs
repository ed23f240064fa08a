//! The binary end to end: model init/score, and config errors that name file, line and key.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;

use assert_cmd::Command;

fn roll() -> Command {
    Command::cargo_bin("roll-tui").unwrap()
}

fn stderr_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        !out.status.success(),
        "expected failure, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn model_init_then_score_prints_per_token_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    roll()
        .args([
            "model", "init", "--arch", "qwen3", "--hidden", "32", "--layers", "1", "--heads", "2",
        ])
        .args([
            "--kv-heads",
            "1",
            "--intermediate",
            "64",
            "--seed",
            "5",
            "--out",
        ])
        .arg(&model)
        .assert()
        .success();
    // Every file as readable as the others (a shared model directory): the weights too.
    use std::os::unix::fs::PermissionsExt;
    let mode = |f: &str| {
        std::fs::metadata(model.join(f))
            .unwrap()
            .permissions()
            .mode()
    };
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(model.join(f).is_file(), "{f} missing");
        assert_eq!(mode(f), mode("config.json"), "{f}");
    }
    let out = roll()
        .args(["model", "score"])
        .arg(&model)
        .args(["--prompt", "12+3=", "--completion", "15", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The char tokenizer: ids are 3 + position in the default alphabet "0123456789+=abcdefgh>".
    assert_eq!(json["completion_ids"], serde_json::json!([4, 8]));
    assert_eq!(json["prompt_ids"], serde_json::json!([4, 5, 13, 6, 14]));
    let lps: Vec<f64> = json["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(lps.len(), 2);
    assert!(lps.iter().all(|&l| l < 0.0 && l > -20.0), "{lps:?}");
    let total = json["total_logprob"].as_f64().unwrap();
    assert!((total - lps.iter().sum::<f64>()).abs() < 1e-5);
    // That text was all in the vocabulary: no warning.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Characters outside the vocabulary are read as <unk>, with a warning that names them;
    // --strict refuses them.
    let score = |completion: &str, strict: bool| {
        let mut cmd = roll();
        cmd.args(["model", "score"]).arg(&model);
        cmd.args(["--prompt", "12+3=", "--completion", completion]);
        if strict {
            cmd.arg("--strict");
        }
        cmd.output().unwrap()
    };
    let out = score("1x!", false);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: the completion has 2 character(s) outside the model's vocabulary, read as <unk>: \"x\", \"!\""),
        "{err}"
    );
    let out = score("1x!", true);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error: the completion has 2 character(s)")
    );
}

#[test]
fn score_of_a_missing_directory_names_it() {
    let err = stderr_of(roll().args([
        "model",
        "score",
        "/nonexistent/model",
        "--prompt",
        "a",
        "--completion",
        "b",
    ]));
    assert!(
        err.contains("model directory '/nonexistent/model': no such directory"),
        "{err}"
    );
}

/// A broken model directory's errors name the file once and say what is wrong with it.
#[test]
fn a_broken_model_directory_names_each_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    roll()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "16", "--layers", "1",
        ])
        .args(["--heads", "2"])
        .args(["--kv-heads", "1", "--intermediate", "32", "--out"])
        .arg(&model)
        .assert()
        .success();
    let score = || {
        stderr_of(roll().args(["model", "score"]).arg(&model).args([
            "--prompt",
            "1",
            "--completion",
            "2",
        ]))
    };
    let file = model.join("model.safetensors");
    let err = stderr_of(roll().args(["model", "score"]).arg(&file).args([
        "--prompt",
        "1",
        "--completion",
        "2",
    ]));
    assert!(
        err.contains(&format!(
            "model directory '{}': not a directory",
            file.display()
        )),
        "{err}"
    );
    std::fs::remove_file(model.join("tokenizer.json")).unwrap();
    let err = score();
    let tokenizer = model.join("tokenizer.json").display().to_string();
    assert_eq!(err.matches(&tokenizer).count(), 1, "{err}");
    assert!(!err.contains("tokenizer: tokenizer"), "{err}");
    std::fs::write(model.join("config.json"), "{\n").unwrap();
    let err = score();
    let config = model.join("config.json").display().to_string();
    assert_eq!(err.matches(&config).count(), 1, "{err}");
    assert!(err.contains("invalid JSON"), "{err}");
}

#[test]
fn unknown_config_key_names_file_line_and_suggestion() {
    let err = stderr_of(roll().args(["run", "tests/fixtures/misspelt_key.yaml"]));
    assert!(err.contains("tests/fixtures/misspelt_key.yaml"), "{err}");
    assert!(err.contains("line 12"), "{err}");
    assert!(
        err.contains(
            "unknown field 'warmup_step' in 'sft.optimizer' (did you mean 'warmup_steps'?)"
        ),
        "{err}"
    );
}

#[test]
fn invalid_config_lists_every_problem() {
    let err = stderr_of(roll().args(["run", "tests/fixtures/invalid_values.yaml"]));
    for needle in [
        "rl.adv_estimator 'gae' needs an rl.critic section",
        "data.domains[1] ('add'): duplicate domain name 'add'",
        "rl.sampling.top_p must be in (0, 1], got 1.5",
        "rl.optimizer.lr must be positive, got -0.1",
    ] {
        assert!(err.contains(needle), "missing '{needle}' in:\n{err}");
    }
}

#[test]
fn override_of_unknown_key_is_refused() {
    let err = stderr_of(roll().args(["run", "experiments/quickstart.yaml", "rl.stepz=3"]));
    assert!(err.contains("rl.stepz=3") && err.contains("steps"), "{err}");
}

#[test]
fn ctrl_c_stops_after_the_step_with_a_checkpoint_and_status_130() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let store = dir.path().join("roll.db");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("roll-tui"))
        .arg("--store")
        .arg(&store)
        .args([
            "run",
            "experiments/quickstart.yaml",
            "sft.steps=100000",
            "sft.batch_size=4",
        ])
        .args([
            "model.init.hidden=32",
            "model.init.layers=1",
            "model.init.intermediate=64",
            // Only the Ctrl-C checkpoint: none by time, however slow the first step.
            "checkpoint.every_minutes=0",
        ])
        .arg(format!("output_dir={}", out.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first step is reported (stdout is not a terminal: one plain line per step).
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // First what the run is about to do: model, parameters, device, stages, where it writes.
    let header = lines.next().unwrap().unwrap();
    let plan = "on cpu · sft 100000 steps, then rl 150 steps · output";
    assert!(
        header.starts_with("qwen2 of ")
            && header.contains("(random init, seed 7)")
            && header.contains(plan),
        "{header}"
    );
    let first = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("sft "));
    assert!(first.is_some(), "the run ended before its first step");
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    // The hint can be pasted as it is: it names the store the run was in.
    let hint = format!(
        "continue it with: roll-tui --store {} resume quickstart",
        store.display()
    );
    assert!(rest.iter().any(|l| l == &hint), "{rest:?}");
    let ckpts: Vec<_> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(ckpts.len(), 1, "{ckpts:?}");
    let name = ckpts[0].to_string_lossy().into_owned();
    assert!(name.starts_with("sft-step"), "{name}");
    assert!(
        out.join("checkpoints")
            .join(&name)
            .join("model.safetensors")
            .is_file()
    );
    // The store knows the run stopped, and where.
    let runs = roll()
        .arg("--store")
        .arg(&store)
        .args(["runs", "--json"])
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(runs[0]["status"], "interrupted");
    assert_eq!(runs[0]["name"], "quickstart");
}

#[test]
fn the_workbench_without_a_terminal_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = stderr_of(
        roll()
            .current_dir(dir.path())
            .write_stdin("")
            .env_remove("ROLL_STORE"),
    );
    assert!(
        err.contains(
            "roll-tui with no command opens the interactive workbench, which needs a terminal"
        ),
        "{err}"
    );
    // Nothing was created: the store stays absent until a run writes one.
    assert!(!dir.path().join("roll.db").exists());
}

/// Every bad input in `tests/fixtures/invalid/` through the real binary: `NAME.yaml` (a run config,
/// with any datasets it names in `data/`, and the command-line overrides in `NAME.args`, one per
/// line, if there is one) must be refused with exit status 1 (never a panic), with
/// each line of `NAME.expect` in its message, on one `error:` line said once, and without leaving
/// anything that would block rerunning it once fixed. Add a case by adding the two files.
#[test]
fn every_invalid_fixture_is_refused_with_its_message() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = root.join("tests/fixtures/invalid");
    let mut cases: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 14, "{cases:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = vec![];
    for (i, case) in cases.iter().enumerate() {
        let name = case.file_stem().unwrap().to_string_lossy().into_owned();
        let expect = std::fs::read_to_string(case.with_extension("expect"))
            .unwrap_or_else(|e| panic!("{name}: its .expect file: {e}"));
        let out_dir = dir.path().join(&name);
        let store = dir.path().join(format!("{i}.db"));
        let overrides = std::fs::read_to_string(case.with_extension("args")).unwrap_or_default();
        let out = roll()
            .current_dir(root)
            .arg("--store")
            .arg(&store)
            .args(["run", "--quiet"])
            .arg(case)
            .args(overrides.lines().filter(|l| !l.trim().is_empty()))
            .arg(format!("output_dir={}", out_dir.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let mut wrong = vec![];
        if out.status.code() != Some(1) {
            wrong.push(format!("exit status {:?}", out.status.code()));
        }
        if err.contains("panicked") || err.matches("error:").count() != 1 {
            wrong.push("not one error".to_string());
        }
        for line in expect.lines().filter(|l| !l.trim().is_empty()) {
            if !err.contains(line) {
                wrong.push(format!("missing '{line}'"));
            }
        }
        if out_dir.join("resolved_config.json").exists() {
            wrong.push("left resolved_config.json, which blocks a rerun".to_string());
        }
        if !wrong.is_empty() {
            failures.push(format!("{name}: {}\n{err}", wrong.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every .expect and .args belongs to a case.
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "expect" || x == "args") {
            assert!(
                p.with_extension("yaml").exists(),
                "{} has no case",
                p.display()
            );
        }
    }
}

#[test]
fn env_serve_offers_only_the_built_in_environments() {
    // An external environment is a program of its own: there is nothing to serve.
    let out = roll().args(["env", "serve", "external"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[possible values: frozen_lake, sokoban, webshop]"),
        "{err}"
    );
}

#[test]
fn store_is_listed_only_by_the_commands_that_use_it() {
    let help = |args: &[&str]| {
        let out = roll().args(args).arg("--help").output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for args in [
        &["model", "init"][..],
        &["reward", "score"],
        &["env", "serve"],
    ] {
        assert!(!help(args).contains("--store"), "{args:?}");
    }
    for args in [
        &["run"][..],
        &["runs"],
        &["runs", "show"],
        &["metrics"],
        &["samples"],
        &["export"],
        &["model", "score"],
        &["eval"],
    ] {
        assert!(help(args).contains("--store"), "{args:?}");
    }
    // After the command it wins over the one before it (and over $ROLL_STORE).
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.db");
    let err = String::from_utf8_lossy(
        &roll()
            .env("ROLL_STORE", dir.path().join("env.db"))
            .args(["--store", "before.db", "runs", "show", "x", "--store"])
            .arg(&missing)
            .output()
            .unwrap()
            .stderr,
    )
    .into_owned();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

/// `model bench` on the CPU: one JSON line whose rates are positive and whose shape is what was
/// asked; without a model it says what to give.
#[test]
fn model_bench_measures_a_shape_and_names_what_is_missing() {
    let out = roll()
        .args([
            "model",
            "bench",
            "--shape",
            "tiny",
            "--batch",
            "3",
            "--new-tokens",
            "4",
        ])
        .args([
            "--train-batch",
            "2",
            "--train-len",
            "12",
            "--runs",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["device"], "cpu");
    assert_eq!(json["generation"]["batch"], 3);
    assert_eq!(json["forward_backward"]["len"], 12);
    for rate in [
        &json["generation"]["tokens_per_s"],
        &json["forward_backward"]["tokens_per_s"],
    ] {
        assert!(rate.as_f64().unwrap() > 0.0, "{json}");
    }
    assert!(
        json["forward_backward"]["peak_device_bytes"].is_null(),
        "the CPU has no driver"
    );
    let e = stderr_of(roll().args(["model", "bench"]));
    assert!(
        e.contains("give a model directory to benchmark, or --shape tiny|qwen2.5-0.5b"),
        "{e}"
    );
}

/// The examples `reward score --help` prints run as they are (an answers file in place of
/// `answers.jsonl`), and the kinds it lists are the ones the rewards are built from.
#[test]
fn the_reward_help_examples_run_and_list_every_kind() {
    let help = String::from_utf8(
        roll()
            .args(["reward", "score", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for kind in [
        "math_rule",
        "math_verify",
        "exact_match",
        "code_sandbox",
        "ifeval",
        "regex_match",
        "llm_judge",
    ] {
        assert!(help.contains(kind), "{kind} missing from:\n{help}");
    }
    let dir = tempfile::tempdir().unwrap();
    let answers = dir.path().join("answers.jsonl");
    std::fs::write(
        &answers,
        "{\"id\": 1, \"prompt\": \"2+2=\", \"response\": \"4\", \"ground_truth\": \"4\"}\n",
    )
    .unwrap();
    let examples: Vec<&str> = help
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("roll-tui reward score "))
        .collect();
    assert_eq!(examples.len(), 3, "{help}");
    for example in examples {
        let words = shlex::split(example).unwrap();
        let args: Vec<String> = words[1..]
            .iter()
            .map(|w| {
                if w == "configs/data/add-answers.jsonl" {
                    answers.display().to_string()
                } else {
                    w.clone()
                }
            })
            .collect();
        let out = roll()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // One response prints its score; a file prints a JSON line per answer.
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.starts_with("score 1 ") || text.contains("\"score\":1"),
            "{example}: {text}"
        );
    }
}

/// A run name too long for a directory is refused up front, its echo cut short: not a raw
/// "File name too long" with the 100 KB name in it.
#[test]
fn a_run_name_too_long_is_refused_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("name={}", "x".repeat(100_000));
    let err = stderr_of(
        roll()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .arg("--store")
            .arg(dir.path().join("s.db"))
            .args(["run", "experiments/quickstart.yaml", &name]),
    );
    assert!(
        err.contains("(100000 characters) must be non-empty, at most 100 characters"),
        "{}",
        &err[..err.len().min(500)]
    );
    assert!(
        err.contains("(set on the command line)"),
        "{}",
        &err[..err.len().min(500)]
    );
    assert!(err.len() < 1000, "{} bytes", err.len());
}

/// `model template` prints what transformers' `apply_chat_template(tokenize=False)` printed for
/// the real Qwen3 template (tests/fixtures/chat_templates/expected.json), with tools from the
/// messages file and options from --set or a run config; --ids encodes that text.
#[test]
fn model_template_prints_what_transformers_renders() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let read = |name: &str| std::fs::read_to_string(fixtures.join(name)).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&read("conversations.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&read("expected.json")).unwrap();
    let case = |name: &str| {
        let case = spec["cases"].as_array().unwrap().iter();
        case.clone().find(|c| c["name"] == name).unwrap().clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    roll()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "16", "--layers", "1", "--heads", "2",
        ])
        .args([
            "--kv-heads",
            "1",
            "--intermediate",
            "32",
            "--chars",
            "ab",
            "--out",
        ])
        .arg(&model)
        .assert()
        .success();
    let template = |args: &[&str]| {
        let out = roll()
            .args(["model", "template"])
            .arg(&model)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            stderr,
        )
    };
    let (ok, _, err) = template(&["--messages", "x.json"]);
    assert!(!ok && err.contains("has no chat template"), "{err}");
    std::fs::write(model.join("chat_template.jinja"), read("qwen3.jinja")).unwrap();

    let tools = dir.path().join("tools.json");
    let round_trip = case("tool_round_trip");
    let file = serde_json::json!({"messages": round_trip["messages"], "tools": spec["tools"]});
    std::fs::write(&tools, file.to_string()).unwrap();
    let (ok, text, err) = template(&[
        "--messages",
        tools.to_str().unwrap(),
        "--add-generation-prompt",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        text,
        expected["qwen3"]["rendered"]["tool_round_trip"]
            .as_str()
            .unwrap()
    );

    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, case("thinking_off")["messages"].to_string()).unwrap();
    let want = expected["qwen3"]["rendered"]["thinking_off"]
        .as_str()
        .unwrap();
    let args = [
        "--messages",
        plain.to_str().unwrap(),
        "--add-generation-prompt",
    ];
    let (ok, thinking, err) = template(&args);
    assert!(ok, "{err}");
    assert_ne!(thinking, want, "enable_thinking must change the text");
    let (_, off, _) = template(&[&args[..], &["--set", "enable_thinking=false"]].concat());
    assert_eq!(off, want);
    let config = dir.path().join("run.yaml");
    let inline = read("../quickstart_inline.yaml").replacen(
        "data:\n",
        "data:\n  chat_template_options: { enable_thinking: false }\n",
        1,
    );
    std::fs::write(&config, inline).unwrap();
    let (ok, from_config, err) =
        template(&[&args[..], &["--config", config.to_str().unwrap()]].concat());
    assert!(ok, "{err}");
    assert_eq!(from_config, want);

    // --ids: the text's token ids, in the text's order.
    let ab = dir.path().join("ab.json");
    let bare = dir.path().join("bare.jinja");
    std::fs::write(&bare, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let ids = |content: &str| {
        std::fs::write(
            &ab,
            serde_json::json!([{"role": "user", "content": content}]).to_string(),
        )
        .unwrap();
        let (ok, out, err) = template(&[
            "--messages",
            ab.to_str().unwrap(),
            "--template",
            bare.to_str().unwrap(),
            "--ids",
        ]);
        assert!(ok, "{err}");
        out.split_whitespace()
            .map(|i| i.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    let (a_b, b_a) = (ids("ab"), ids("ba"));
    assert_eq!(a_b.len(), 2);
    assert_ne!(a_b[0], a_b[1]);
    assert_eq!(b_a, vec![a_b[1], a_b[0]]);

    // Bad input names what and where.
    std::fs::write(&ab, r#"[{"content": "x"}]"#).unwrap();
    let (ok, _, err) = template(&["--messages", ab.to_str().unwrap()]);
    assert!(
        !ok && err.contains("message 1 is not an object with a string \"role\""),
        "{err}"
    );
    let (ok, _, err) = template(&[&args[..], &["--set", "messages=[]"]].concat());
    assert!(
        !ok && err.contains("'messages' is set by roll-tui itself"),
        "{err}"
    );
}

/// The `roll-tui …` lines of README's ```bash blocks (continuations joined, comments cut).
fn readme_commands() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_bash = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_bash = line.trim_start() == "```bash";
            continue;
        }
        if !in_bash {
            continue;
        }
        let line = cut_comment(line);
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(&line);
        let words = shlex::split(&pending).unwrap_or_else(|| panic!("README: {pending}"));
        pending.clear();
        if words.first().map(String::as_str) == Some("roll-tui") {
            commands.push(words[1..].to_vec());
        }
    }
    commands
}

/// `line` without a shell comment: a `#` that starts a word outside quotes.
fn cut_comment(line: &str) -> String {
    let (mut quote, mut prev) = (None, ' ');
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    line.to_string()
}

/// Every command README shows parses (its subcommand, flags and values exist: clap checks them
/// before it prints the help that `--help` at the end asks for), and the ones that need no run or
/// model (environments, rewards) run and succeed from the repository root.
#[test]
fn readme_commands_exist_and_the_self_contained_ones_run() {
    let commands = readme_commands();
    assert!(commands.len() > 20, "{commands:?}");
    assert_eq!(cut_comment("a 'b # c' # d"), "a 'b # c' ");
    let mut ran = 0;
    for args in &commands {
        let out = roll().args(args).arg("--help").output().unwrap();
        assert!(
            out.status.success(),
            "README: roll-tui {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        let runnable = matches!(
            args.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["env", "list", ..] | ["env", "play", ..] | ["reward", "score", ..]
        );
        if runnable {
            let out = roll()
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "README: roll-tui {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran >= 5, "{ran} README commands ran");
}
