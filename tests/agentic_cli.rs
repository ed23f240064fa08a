//! An agentic run through the binary: no dataset, no SFT, an untrained tiny model acting on a
//! 1x3 lake for one step; `roll-tui trajectories` prints its episodes from the store, and a model
//! whose tokenizer cannot write the observations is refused with a clear error.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{ok, refused, roll};
use serde_json::Value;

fn config(dir: &std::path::Path, name: &str, chars: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nseed: 3\noutput_dir: {}\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"{chars}\", max_positions: 128 }} }}\n\
             rl:\n  steps: 1\n  prompts_per_step: 2\n  group_size: 2\n  sampling: {{ max_new_tokens: 4 }}\n\
             \x20 env: {{ name: frozen_lake, tag: tiny, params: {{ map: SFG, legend: false }}, max_turns: 3, action_pattern: '(\\w+)' }}\n",
            dir.join(name).display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn an_agentic_run_records_episodes_that_the_trajectories_command_prints() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let cfg = config(dir.path(), "lake", "SFGPWXLeftRighDowUp\\n");
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    let json = ok(roll(&store, &["trajectories", "lake", "--json"]));
    let episodes: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(episodes.len(), 4, "{json}");
    assert_eq!(episodes[0]["env_seed"], episodes[1]["env_seed"]);
    assert_ne!(episodes[0]["env_seed"], episodes[2]["env_seed"]);
    for e in &episodes {
        let turns = e["turns"].as_array().unwrap();
        assert!((1..=3).contains(&turns.len()), "{e}");
        assert_eq!(turns[0]["observation"], "PFG");
        assert!(turns[0]["info"]["state_hash"].is_u64());
    }
    let text = ok(roll(&store, &["trajectories", "lake", "--group", "1"]));
    assert!(
        text.contains("group 1 episode 0") && text.contains("group 1 episode 1"),
        "{text}"
    );
    assert!(!text.contains("group 0 "), "{text}");
    assert!(text.contains("turn 1: observation \"PFG\""), "{text}");
    // The step's metrics are in the store under the env's tag.
    let metrics = ok(roll(&store, &["metrics", "lake", "--key", "env/tiny/*"]));
    assert!(metrics.contains("env/tiny/success"), "{metrics}");

    // Step-wise GiGPO on the same run: one training row per turn, still one record per episode.
    let step = dir.path().join("step.db");
    ok(roll(
        &step,
        &[
            "run",
            "--quiet",
            cfg.to_str().unwrap(),
            "rl.adv_estimator=gigpo",
            "rl.env.mode=step",
            "rl.std_normalize=false",
            &format!("output_dir={}", dir.path().join("step").display()),
        ],
    ));
    let samples: Value =
        serde_json::from_str(&ok(roll(&step, &["samples", "lake", "--json"]))).unwrap();
    assert_eq!(samples.as_array().unwrap().len(), 4, "{samples}");
    let adv = ok(roll(&step, &["metrics", "lake", "--key", "adv/mean"]));
    assert!(adv.contains("adv/mean"), "{adv}");

    // A model that cannot write 'P' cannot read the lake: refused, naming what and where.
    let bad = config(dir.path(), "blind", "SFGLeftRighDowUp\\n");
    let err = refused(roll(&store, &["run", "--quiet", bad.to_str().unwrap()]));
    assert!(err.contains("rl.env") && err.contains("'P'"), "{err}");
}
