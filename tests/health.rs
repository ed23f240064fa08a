//! Run health from the core, end to end on the binary: a run whose groups have no reward signal
//! warns on `roll-tui run` as soon as the rule fires, and `runs show` (text and JSON) reports the
//! same alarm from the store.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{bin, ok, roll};
use serde_json::Value;

/// An untrained tiny model answering two-digit additions: every sampled answer is wrong, so every
/// group's rewards are all equal (`group/frac_zero_std` = 1) from the first step.
const HOPELESS: &str = r#"
name: hopeless
seed: 5
model:
  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=" }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 20, digits: 2 }, reward: math_rule }
rl: { steps: 4, prompts_per_step: 4, group_size: 4, sampling: { temperature: 1.0, max_new_tokens: 3 } }
"#;

#[test]
fn a_run_without_reward_signal_warns_while_it_runs_and_runs_show_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hopeless.yaml");
    let text = format!(
        "{HOPELESS}output_dir: {}\n",
        dir.path().join("out").display()
    );
    std::fs::write(&cfg, text).unwrap();
    let store = dir.path().join("roll.db");
    let out = bin()
        .arg("--store")
        .arg(&store)
        .args(["run", "--quiet", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let metrics = ok(roll(
        &store,
        &[
            "metrics",
            "hopeless",
            "--key",
            "group/frac_zero_std",
            "--csv",
        ],
    ));
    assert!(
        metrics.lines().skip(1).all(|l| l.ends_with(",1")),
        "the scenario needs every group flat:\n{metrics}"
    );
    // Fires once, at the third flat step (FLAT_STEPS), with the streak's first step.
    let warning = "warning: all-equal rewards · group/frac_zero_std · since step 1: 100% of groups";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");

    let show = ok(roll(&store, &["runs", "show", "hopeless"]));
    assert!(
        show.contains("health:\n  ▲ all-equal rewards · group/frac_zero_std · since step 1"),
        "{show}"
    );
    let json: Value =
        serde_json::from_str(&ok(roll(&store, &["runs", "show", "hopeless", "--json"]))).unwrap();
    let alarms = json["alarms"].as_array().unwrap();
    assert_eq!(alarms.len(), 1, "{alarms:?}");
    assert_eq!(alarms[0]["kind"], "flat_rewards");
    assert_eq!(alarms[0]["since"]["step"], 1);
}
