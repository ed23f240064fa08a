//! The env debugger end to end, in a pseudo-terminal: the real binary opens it on a fixed
//! FrozenLake map; arrow keys walk to the goal (reward 1, done); two undos go back; a fork at the
//! second turn takes another move; `w` saves the episode; after quitting, the store holds it as a
//! debug trajectory with its turns, and `env replay` reproduces it.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::pty::{Term, dump};

const DOWN: &str = "\x1b[B";
const RIGHT: &str = "\x1b[C";

#[test]
fn walk_to_the_goal_undo_fork_save_and_find_it_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    let mut t = Term::start(
        &store,
        dir.path(),
        &[
            "env",
            "debug",
            "frozen_lake",
            "--set",
            "map=SFF/FHF/FFG",
            "--set",
            "legend=false",
        ],
    );
    t.wait_for(
        "Env debugger · frozen_lake · seed 0 · human · 0 turns played",
        60,
    );
    for (n, key) in [DOWN, DOWN, RIGHT].into_iter().enumerate() {
        t.keys(key);
        let played = match n {
            0 => "1 turn played".to_string(),
            n => format!("{} turns played", n + 1),
        };
        t.wait_for(&format!("{played} · return 0.00"), 10);
    }
    t.keys(RIGHT);
    let goal = t.wait_for("4 turns played · return 1.00 · done ✓", 10);
    assert!(
        goal.contains("1.00  done"),
        "the turn's reward and done:\n{goal}"
    );

    // Back two turns: the agent stands where it was after the second move.
    t.keys("u");
    t.wait_for("3 turns played ·", 10);
    t.keys("u");
    let back = t.wait_for("2 turns played · return 0.00", 10);
    assert!(back.contains("│PFG"), "{back}");

    // Fork at the second turn (k selects it) and move Right instead: into the hole.
    t.keys("k");
    t.keys("f");
    t.wait_for("forked at turn 2", 10);
    t.keys(RIGHT);
    t.wait_for("2 turns played · return 0.00 · done", 10);

    t.keys("w");
    t.wait_for("saved as episode 0 of run 'debug-frozen_lake' step 1", 30);
    t.keys("q");
    let status = t.wait_exit(30);
    assert!(status.success(), "{status}");

    // The store holds the forked episode: Down, then Right into the hole.
    let out = common::ok(common::roll(
        &store,
        &["trajectories", "debug-frozen_lake", "--json"],
    ));
    let saved: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(saved.len(), 1, "{out}");
    let e = &saved[0];
    assert_eq!(
        (e["env"].as_str(), e["stage"].as_str()),
        (Some("debug/frozen_lake"), Some("debug"))
    );
    let actions: Vec<&str> = e["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["parsed_action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["Down", "Right"]);
    assert_eq!(e["turns"][1]["done"], true);
    assert_eq!(e["success"], false);
    // And it replays from its seed.
    let replayed = common::ok(common::roll(
        &store,
        &["env", "replay", "debug-frozen_lake"],
    ));
    assert!(replayed.contains("1 of 1 episodes reproduce"), "{replayed}");
}

/// A one-step agentic run on a 1×3 lake with a checkpoint, as `tests/agentic_cli.rs` runs it.
fn lake_run(dir: &std::path::Path, store: &std::path::Path) {
    let path = dir.join("lake.yaml");
    std::fs::write(
        &path,
        format!(
            "name: lake\nseed: 3\noutput_dir: {}\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFGPWXLeftRighDowUp\\n\", max_positions: 128 }} }}\n\
             rl:\n  steps: 1\n  prompts_per_step: 2\n  group_size: 2\n  sampling: {{ max_new_tokens: 4 }}\n\
             \x20 env: {{ name: frozen_lake, tag: tiny, params: {{ map: SFG, legend: false }}, max_turns: 3, action_pattern: '(\\w+)' }}\n\
             checkpoint: {{ every: 1 }}\n",
            dir.join("lake").display()
        ),
    )
    .unwrap();
    common::ok(common::roll(
        store,
        &["run", "--quiet", path.to_str().unwrap()],
    ));
}

#[test]
fn a_stored_episode_opens_at_a_turn_and_its_checkpoint_resamples_and_plays() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("roll.db");
    lake_run(dir.path(), &store);

    // Headless first: the checkpoint as the policy builds the prompt the rollout built.
    let out = common::ok(common::roll(
        &store,
        &[
            "env",
            "play",
            "frozen_lake",
            "--set",
            "map=SFG",
            "--set",
            "legend=false",
            "--policy",
            "model:lake@1",
            "--samples",
            "4",
            "--max-steps",
            "1",
            "--json",
        ],
    ));
    let turn: serde_json::Value = serde_json::from_str(out.lines().nth(1).unwrap()).unwrap();
    let stored = common::ok(common::roll(&store, &["trajectories", "lake", "--json"]));
    let first: serde_json::Value = serde_json::from_str(stored.lines().next().unwrap()).unwrap();
    assert_eq!(turn["prompt"], "PFG\n");
    assert_eq!(turn["prompt_tokens"], first["turns"][0]["prompt_tokens"]);
    assert_eq!(turn["samples"]["draws"], 4);
    // The run's own env settings: its `max_turns` (3) bounds the episode. With the defaults the
    // untrained model's outputs hold no `<answer>`, nothing ends the lake, and play goes on for
    // 100 steps.
    let out = common::ok(common::roll(
        &store,
        &[
            "env",
            "play",
            "frozen_lake",
            "--set",
            "map=SFG",
            "--set",
            "legend=false",
            "--policy",
            "model:lake@0",
            "--seed",
            "5",
            "--json",
        ],
    ));
    let turns: Vec<serde_json::Value> = out
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!((1..=3).contains(&turns.len()), "{out}");

    let mut t = Term::start(
        &store,
        dir.path(),
        &[
            "env",
            "debug",
            "--run",
            "lake",
            "--step",
            "1",
            "--group",
            "1",
            "--episode",
            "0",
            "--turn",
            "1",
        ],
    );
    t.wait_for("from run lake · step 1 · group 1 episode 0", 60);
    t.wait_for("0 turns played ·", 10);
    // The model input offers the policy that played the episode: step 1's episodes were played
    // before the first update, by the run's initial model.
    t.keys("m");
    t.wait_for("model (DIR or RUN@STEP): lake@rl-0", 10);
    t.keys("\r");
    t.wait_for("model lake@rl-0 loaded", 60);
    t.keys("d");
    dump("debugger_samples", &t.wait_for("32 draws of turn 1", 60));
    // A model turn: its output, parsed action and per-token log-probs.
    t.keys("s");
    t.wait_for("1 turn played ·", 60);
    dump("debugger_model_turn", &t.wait_for("tokens · log-prob", 10));
    t.keys("q");
    assert!(t.wait_exit(30).success());
}
