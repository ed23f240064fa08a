//! `roll-tui env list` and `roll-tui env play` on the binary: an episode of FrozenLake played by
//! hand reaches the goal with gymnasium's states and rewards, an invalid action is penalised and
//! changes nothing, a random policy is repeatable by seed, and mistakes are clear errors.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::bin;
use serde_json::Value;

fn play(args: &[&str]) -> (bool, String, String) {
    let out = bin().args(["env", "play"]).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_hand_played_episode_reaches_the_goal_as_gymnasium_scores_it() {
    let (ok, out, err) = play(&[
        "frozen_lake",
        "--set",
        "map=SFFF/FHFH/FFFH/HFFG",
        "--actions",
        "Down,Down,Right,Jump,Down,Right,Right",
        "--json",
    ]);
    assert!(ok, "{err}");
    let steps = lines(&out);
    // The reset line, then seven steps; the episode ends on the goal at the last one.
    assert_eq!(steps.len(), 8, "{out}");
    let states: Vec<u64> = steps[1..]
        .iter()
        .map(|s| s["info"]["state"].as_u64().unwrap())
        .collect();
    // 0 → 4 → 8 → 9, "Jump" changes nothing, → 13 → 14 → 15 (G).
    assert_eq!(states, [4, 8, 9, 9, 13, 14, 15]);
    let rewards: Vec<f64> = steps[1..]
        .iter()
        .map(|s| s["reward"].as_f64().unwrap())
        .collect();
    assert_eq!(rewards, [0.0, 0.0, 0.0, -0.1, 0.0, 0.0, 1.0]);
    assert_eq!(steps[4]["info"]["action_is_valid"], false);
    assert_eq!(steps[4]["state_hash"], steps[3]["state_hash"]);
    assert_eq!(steps[7]["done"], true);
    assert_eq!(steps[7]["info"]["success"], true);
}

#[test]
fn a_random_policy_is_repeatable_by_seed_and_mistakes_are_clear() {
    let random = |seed: &str| {
        let (ok, out, err) = play(&[
            "frozen_lake",
            "--set",
            "size=6",
            "--policy",
            "random",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(ok, "{err}");
        out
    };
    assert_eq!(random("5"), random("5"));
    assert_ne!(random("5"), random("6"));

    // The names come from the registry (`env::ENVS`): help lists them, a typo gets the closest.
    let (ok, _, err) = play(&["frozen_lak", "--actions", "Up"]);
    assert!(
        !ok && err.contains("invalid value 'frozen_lak'") && err.contains("'frozen_lake'"),
        "{err}"
    );
    assert!(
        err.contains("[possible values: frozen_lake, sokoban, webshop, external]"),
        "{err}"
    );
    let (ok, _, err) = play(&["frozen_lake", "--set", "size=x", "--actions", "Up"]);
    assert!(!ok && err.contains("size=x: expected an integer"), "{err}");
    let (ok, _, err) = play(&["frozen_lake"]);
    assert!(
        !ok && err.contains("--actions A,B,… or --policy random"),
        "{err}"
    );
    let out = bin().args(["env", "list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("frozen_lake"));
}

#[test]
fn the_python_example_plays_through_the_binary_and_a_crashing_program_is_named() {
    // Seed 1 hides 3 (Python: random.Random(1).randint(1, 10) == 3).
    let (ok, out, err) = play(&[
        "external",
        "--set",
        "command=python3 envs/external/guess_number.py",
        "--set",
        "high=10",
        "--seed",
        "1",
        "--actions",
        "five,5,3",
        "--json",
    ]);
    assert!(ok, "{err}");
    let steps = lines(&out);
    assert_eq!(steps.len(), 4, "{out}");
    assert_eq!(
        steps[0]["observation"],
        "Guess the number from 1 to 10. You have 7 guesses."
    );
    assert_eq!(steps[1]["info"]["action_is_valid"], false);
    assert_eq!(
        steps[2]["observation"],
        "5 is too high. It is between 1 and 4; 6 guesses left."
    );
    assert_eq!(
        (steps[3]["reward"].as_f64(), steps[3]["done"].as_bool()),
        (Some(1.0), Some(true))
    );
    // A random policy draws from the actions the program lists.
    let (ok, out, err) = play(&[
        "external",
        "--set",
        "command=python3 envs/external/guess_number.py",
        "--policy",
        "random",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(lines(&out).len() >= 2, "{out}");
    // A program that dies is an error naming it with its stderr, not a hang or a panic.
    let (ok, _, err) = play(&[
        "external",
        "--set",
        "command=python3 -c \"import sys; sys.stderr.write('cannot load the map\\n'); sys.exit(4)\"",
        "--actions",
        "1",
    ]);
    assert!(!ok);
    assert!(err.contains("cannot load the map"), "{err}");
    assert!(err.contains("exit status: 4"), "{err}");
}

/// A tiny random model whose alphabet covers FrozenLake's grid (no legend) and `<answer>` actions.
fn tiny_model(dir: &std::path::Path) -> String {
    let out = dir.join("model");
    let made = bin()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "32", "--layers", "1",
        ])
        .args(["--heads", "2", "--kv-heads", "1", "--intermediate", "64"])
        .args(["--chars", "SFHGP\n<>/answerDoRightLfUp", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    out.display().to_string()
}

#[test]
fn a_model_plays_showing_its_prompt_log_probs_and_action_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let policy = format!("model:{}", tiny_model(dir.path()));
    let args = [
        "frozen_lake",
        "--set",
        "map=SFF/FHF/FFG",
        "--set",
        "legend=false",
        "--policy",
        &policy,
        "--samples",
        "8",
        "--max-tokens",
        "4",
        "--max-steps",
        "3",
        "--json",
    ];
    let (ok, out, err) = play(&args);
    assert!(ok, "{err}");
    let steps = lines(&out);
    // A random model's turns rarely hold a valid action, and invalid ones leave the episode on,
    // so all three turns are played.
    assert_eq!(steps.len(), 4, "{out}");
    // Without a chat template the first prompt is the observation and a newline (plain transcript).
    assert_eq!(steps[1]["prompt"], "PFF\nFHF\nFFG\n");
    for s in &steps[1..] {
        let tokens = s["tokens"].as_array().unwrap();
        assert!((1..=4).contains(&tokens.len()), "{s}");
        assert!(tokens.iter().all(|k| k["logprob"].as_f64().unwrap() <= 0.0));
        let counts: u64 = s["samples"]["actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["count"].as_u64().unwrap())
            .sum();
        assert_eq!((s["samples"]["draws"].as_u64(), counts), (Some(8), 8));
    }
    // Each turn's prompt extends the last one by its output and the next observation.
    let second = steps[2]["prompt"].as_str().unwrap();
    let expected = format!("PFF\nFHF\nFFG\n{}", steps[1]["output"].as_str().unwrap());
    assert!(second.starts_with(&expected), "{second:?}");
    // The same seed plays the same episode.
    assert_eq!(play(&args).1, out);
    // Bad settings are named.
    let (ok, _, err) = play(&["frozen_lake", "--policy", &policy, "--temperature=-1"]);
    assert!(!ok && err.contains("--temperature must be >= 0"), "{err}");
    let (ok, _, err) = play(&["frozen_lake", "--policy", "model:no-such-run@3"]);
    assert!(!ok && err.contains("no-such-run"), "{err}");
    let (ok, _, err) = play(&["frozen_lake", "--policy", "random", "--samples", "3"]);
    assert!(
        !ok && err.contains("--samples draws a model's turns"),
        "{err}"
    );
}

/// Actions given after the episode ended are said to be unplayed, not silently dropped.
#[test]
fn actions_given_after_the_end_are_reported() {
    // Down from 0 onto the hole at 4 ends the episode; the two after it are never played.
    let (ok, out, err) = play(&[
        "frozen_lake",
        "--set",
        "map=SFFF/HFFF/FFFF/FFFG",
        "--actions",
        "Down,Right,Down",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("2 of the given actions not played (Right,Down): the episode ended first"),
        "{out}"
    );
    let (_, out, _) = play(&["frozen_lake", "--actions", "Right,Left"]);
    assert!(!out.contains("not played"), "{out}");
}
