//! Rewards as data, end to end on the binary: a domain's reward can be a kind with parameters or a
//! weighted combination, whose terms land in every sample's breakdown and whose weighted sum is the
//! sample's reward; and a reward name the build does not know is a config error with a suggestion,
//! reported with the other problems, never a default.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{bin, ok, roll};
use serde_json::Value;

const MODEL: &str = r#"
name: combined
seed: 3
model:
  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=abc>" }
rl: { steps: 2, prompts_per_step: 4, group_size: 4, sampling: { temperature: 1.0, max_new_tokens: 4 } }
"#;

#[test]
fn a_weighted_reward_scores_the_weighted_sum_and_keeps_each_term() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("combined.yaml");
    let text = format!(
        "{MODEL}data:\n  domains:\n    - name: add\n      synthetic: {{ task: addition, count: 20, digits: 1 }}\n      \
         reward:\n        combine:\n          - {{ kind: math_rule, weight: 0.75 }}\n          - {{ kind: exact_match, weight: 0.25 }}\n\
         output_dir: {}\n",
        dir.path().join("out").display()
    );
    std::fs::write(&cfg, text).unwrap();
    let store = dir.path().join("roll.db");
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    let samples: Vec<Value> = serde_json::from_str(&ok(roll(
        &store,
        &["samples", "combined", "--json", "--limit", "1000"],
    )))
    .unwrap();
    assert_eq!(samples.len(), 2 * 4 * 4);
    for s in &samples {
        let b = &s["breakdown"];
        let (math, exact) = (
            b["math_rule"].as_f64().unwrap(),
            b["exact_match"].as_f64().unwrap(),
        );
        // Each term is a 0/1 rule; the reward is 0.75·math + 0.25·exact (exact in f32 and f64).
        assert!(
            [0.0, 1.0].contains(&math) && [0.0, 1.0].contains(&exact),
            "{s}"
        );
        assert_eq!(
            s["reward"].as_f64().unwrap(),
            0.75 * math + 0.25 * exact,
            "{s}"
        );
        // Correct only when every term is.
        assert_eq!(
            s["correct"].as_bool().unwrap(),
            math == 1.0 && exact == 1.0,
            "{s}"
        );
    }
}

#[test]
fn unknown_reward_names_and_parameters_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    let text = format!(
        "{MODEL}data:\n  domains:\n    - {{ name: add, synthetic: {{ task: addition, count: 20 }}, reward: math_rul }}\n    \
         - {{ name: rev, synthetic: {{ task: reversal, count: 20, alphabet: abc }}, reward: {{ combine: [ {{ kind: exact }} ] }} }}\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let out = bin().args(["run", cfg.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "data.domains[0] ('add').reward: unknown reward 'math_rul' (did you mean 'math_rule'?)",
        "data.domains[1] ('rev').reward.combine[0]: unknown reward 'exact' (did you mean 'exact_match'?)",
    ] {
        assert!(err.contains(needle), "missing '{needle}' in:\n{err}");
    }

    let text = format!(
        "{MODEL}data:\n  domains:\n    - name: add\n      synthetic: {{ task: addition, count: 20 }}\n      \
         reward: {{ kind: exact_match, ignor_case: true }}\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let out = bin().args(["run", cfg.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 11: unknown field 'ignor_case'")
            && err.contains("(did you mean 'ignore_case'?)"),
        "{err}"
    );
}

#[test]
fn a_reward_that_cannot_read_its_ground_truth_is_said_once_per_run() {
    // An IFEval ground truth with a misspelt instruction id: every response scores 0, and the run
    // says why once (not at every step).
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("if.jsonl");
    let line = r#"{"prompt": "abc", "ground_truth": "{\"instruction_id_list\": [\"punctuation:no_coma\"], \"kwargs\": [{}]}", "response": "cba"}"#;
    std::fs::write(&data, format!("{line}\n{line}\n")).unwrap();
    let cfg = dir.path().join("if.yaml");
    std::fs::write(
        &cfg,
        format!(
            "{MODEL}data:\n  domains:\n    - {{ name: inst, path: {}, reward: ifeval }}\noutput_dir: {}\n",
            data.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let store = dir.path().join("roll.db");
    let out = roll(&store, &["run", cfg.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let warning = "domain 'inst': ifeval: unknown instruction id 'punctuation:no_coma' (did you mean 'punctuation:no_comma'?)";
    assert_eq!(text.matches(warning).count(), 1, "{text}");
}
