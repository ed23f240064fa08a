//! `roll-tui reward score` end to end: one response, a JSONL file with bad lines among good ones,
//! parameters that change the verdict, a config's domain reward with its breakdown, and a reader
//! that goes away.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::{bin, ok, refused};
use serde_json::Value;

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn one_response_scores_as_text_and_as_json() {
    let args = [
        "reward",
        "score",
        "--kind",
        "math_verify",
        "--response",
        "Thus $\\boxed{2\\sqrt3}$.",
        "--truth",
        "$\\sqrt{12}$",
    ];
    let text = ok(bin().args(args).output().unwrap());
    assert!(
        text.starts_with("score 1  correct yes  format ok yes  extracted \"2\\\\sqrt3\""),
        "{text}"
    );
    let json: Value =
        serde_json::from_str(&ok(bin().args(args).arg("--json").output().unwrap())).unwrap();
    assert_eq!(json["score"], 1.0);
    assert_eq!(json["breakdown"]["math_verify"], 1.0);
    // The old rule only compares numbers: the same pair is wrong under math_rule.
    let mut rule = args;
    rule[3] = "math_rule";
    let json: Value =
        serde_json::from_str(&ok(bin().args(rule).arg("--json").output().unwrap())).unwrap();
    assert_eq!(json["correct"], false);
}

#[test]
fn a_file_scores_every_good_line_in_order_and_names_the_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"id": 1, "response": "The answer is 50%.", "ground_truth": "0.5"}"#,
            "\n",
            "not json\n",
            "\n",
            r#"{"id": "b", "response": "so $x = 2$ or $x = 7$", "ground_truth": "\\{7, 2\\}"}"#,
            "\n",
            r#"{"id": 3, "response": 5, "ground_truth": "5"}"#,
            "\n",
            r#"{"id": 4, "prompt": "p", "response": "\\boxed{(0, 1]}", "ground_truth": "[0, 1]"}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = bin()
        .args(["reward", "score", "--kind", "math_verify", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "bad lines make the exit status 1"
    );
    let got = lines(&out.stdout);
    assert_eq!(got.len(), 5, "one output line per non-blank input line");
    assert_eq!(
        (got[0]["id"].clone(), got[0]["correct"].clone()),
        (1.into(), true.into())
    );
    assert!(
        got[1]["error"]
            .as_str()
            .unwrap()
            .ends_with("line 2: not JSON: expected ident at line 1 column 2")
    );
    assert_eq!(got[1]["line"], 2);
    assert_eq!(
        (got[2]["id"].clone(), got[2]["correct"].clone()),
        ("b".into(), true.into())
    );
    assert_eq!(got[3]["id"], 3, "a line that is JSON keeps its id");
    assert!(
        got[3]["error"]
            .as_str()
            .unwrap()
            .contains("line 5: \"response\" must be a string")
    );
    assert_eq!(got[4]["correct"], false, "(0, 1] is not [0, 1]");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 of 5 lines could not be scored"), "{err}");

    // A parameter changes the verdict: 50% is not 0.5 when percentages are not fractions.
    let out = bin()
        .args([
            "reward",
            "score",
            "--kind",
            "math_verify",
            "--params",
            r#"{"percent_is_fraction": false}"#,
            "--input",
        ])
        .arg(&input)
        .output()
        .unwrap();
    assert_eq!(lines(&out.stdout)[0]["correct"], false);
}

#[test]
fn a_domain_of_a_config_scores_with_its_weighted_reward() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.yaml");
    std::fs::write(
        &cfg,
        r#"
name: scored
model:
  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=" }
rl: { steps: 1, prompts_per_step: 2, group_size: 2 }
data:
  domains:
    - name: add
      synthetic: { task: addition, count: 10 }
      reward:
        combine:
          - { kind: math_verify, weight: 0.75 }
          - { kind: exact_match, weight: 0.25 }
"#,
    )
    .unwrap();
    let score = |response: &str| -> Value {
        let out = bin()
            .args(["reward", "score", "--config"])
            .arg(&cfg)
            .args([
                "--domain",
                "add",
                "--json",
                "--response",
                response,
                "--truth",
                "12",
            ])
            .output()
            .unwrap();
        serde_json::from_str(&ok(out)).unwrap()
    };
    // "12.0": math right (1), not the same string (0): 0.75·1 + 0.25·0.
    let v = score("12.0");
    assert_eq!(v["score"], 0.75);
    assert_eq!(v["breakdown"]["math_verify"], 1.0);
    assert_eq!(v["breakdown"]["exact_match"], 0.0);
    assert_eq!(score("12")["score"], 1.0);

    let err = refused(
        bin()
            .args(["reward", "score", "--config"])
            .arg(&cfg)
            .args(["--domain", "mul", "--response", "1", "--truth", "1"])
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("has no domain 'mul' (its domains: add)"),
        "{err}"
    );
}

#[test]
fn unknown_kinds_and_parameters_are_clear_errors() {
    let run = |extra: &[&str]| {
        refused(
            bin()
                .args(["reward", "score", "--response", "1", "--truth", "1"])
                .args(extra)
                .output()
                .unwrap(),
        )
    };
    // The kinds come from the registry the rewards are built from, listed with the nearest.
    let err = run(&["--kind", "math_verif"]);
    assert!(
        err.contains("invalid value 'math_verif' for '--kind <KIND>'")
            && err.contains("llm_judge")
            && err.contains("a similar value exists: 'math_verify'"),
        "{err}"
    );
    let err = run(&[
        "--kind",
        "exact_match",
        "--params",
        r#"{"ignore_cas": true}"#,
    ]);
    assert!(err.contains("unknown field `ignore_cas`"), "{err}");
    let err = run(&[
        "--kind",
        "math_rule",
        "--params",
        r#"{"ignore_case": true}"#,
    ]);
    assert!(
        err.contains("'ignore_case' is a parameter of exact_match, not of math_rule"),
        "{err}"
    );
    let err = run(&["--kind", "math_verify", "--params", "[1]"]);
    assert!(err.contains("--params must be a JSON object"), "{err}");
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("many.jsonl");
    let line = r#"{"id": 1, "response": "\\boxed{1}", "ground_truth": "1"}"#;
    std::fs::write(&input, format!("{line}\n").repeat(200_000)).unwrap();
    let mut child = bin()
        .args(["reward", "score", "--kind", "math_verify", "--input"])
        .arg(&input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("\"correct\":true"), "{first}");
    // The reader (and the pipe) are gone now, like `| head -1`.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn code_rewards_refuse_to_run_without_bubblewrap() {
    // A PATH with setpriv and prlimit but no bwrap: a clear refusal, never an unsandboxed run.
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .env("PATH", dir.path())
        .args([
            "reward",
            "score",
            "--kind",
            "code_sandbox",
            "--response",
            "```python\nprint(1)\n```",
        ])
        .args(["--truth", r#"{"tests": [{"stdin": "", "stdout": "1"}]}"#])
        .output()
        .unwrap();
    let err = refused(out);
    assert!(
        err.contains("code rewards need bubblewrap ('bwrap' on PATH)")
            && err.contains("never run unsandboxed"),
        "{err}"
    );

    // `run` refuses at set-up, naming the domain, before any step.
    let data = dir.path().join("code.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"add\", \"ground_truth\": \"{\\\"tests\\\": [{\\\"stdin\\\": \\\"1 2\\\", \\\"stdout\\\": \\\"3\\\"}]}\"}\n",
    )
    .unwrap();
    let cfg = dir.path().join("code.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: code\nmodel:\n  init: {{ arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: \"abcdefghijklmnopqrstuvwxyz0123456789{{}}[]:,\\\" \" }}\n\
             rl: {{ steps: 1, prompts_per_step: 1, group_size: 2 }}\n\
             data:\n  domains:\n    - {{ name: code, path: {}, reward: code_sandbox }}\noutput_dir: {}\n",
            data.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let store = dir.path().join("roll.db");
    let out = bin()
        .env("PATH", dir.path())
        .arg("--store")
        .arg(&store)
        .args(["run", "--quiet"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = refused(out);
    assert!(
        err.contains("domain 'code' reward code_sandbox: code rewards need bubblewrap"),
        "{err}"
    );
}
