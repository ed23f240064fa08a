//! A rollout in an external environment program: the same scripted episodes as with the built-in
//! lake give the same trajectories, and a program that crashes or hangs mid-episode costs that
//! episode (discarded, counted, played again from its seed in a new program), never the rollout.

use super::*;

/// A one-row lake `SFG` as a program: Right and Left move, the goal ends the episode with reward
/// 1, anything else is an invalid action. The first valid step of all its instances (one marker
/// file, created atomically) crashes (`crash`), hangs (`hang`) or goes through (`fine`).
const WALK: &str = r#"
import json, os, sys, time
mode, marker = sys.argv[1], sys.argv[2]
pos = 0
def obs():
    return "".join("P" if i == pos else c for i, c in enumerate("SFG"))
for line in sys.stdin:
    r = json.loads(line)
    if r["cmd"] == "close":
        break
    if r["cmd"] == "reset":
        pos = 0
        reply = {"observation": obs(), "info": {"success": False}}
    elif r["action"] not in ("Left", "Right"):
        reply = {"invalid": repr(r["action"]) + " is not Left or Right"}
    else:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            first = True
        except FileExistsError:
            first = False
        if first and mode == "crash":
            sys.stderr.write("flaky crash\n")
            sys.exit(1)
        if first and mode == "hang":
            time.sleep(60)
        pos = min(2, pos + 1) if r["action"] == "Right" else max(0, pos - 1)
        reply = {"observation": obs(), "reward": 1.0 if pos == 2 else 0.0, "done": pos == 2,
                 "info": {"success": pos == 2}}
    print(json.dumps(reply), flush=True)
"#;

fn external(mode: &str, dir: &std::path::Path, overlap: bool) -> (RlConfig, EnvConfig) {
    let script = dir.join("walk.py");
    std::fs::write(&script, WALK).unwrap();
    let marker = dir.join(format!("marker-{mode}-{overlap}"));
    // Long enough for a program to start on a loaded machine; the hang is cut after 3 s.
    let timeout = if mode == "hang" { 3 } else { 30 };
    let text = format!(
        "name: t\nmodel: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFG\" }} }}\n\
         rl: {{ steps: 1, prompts_per_step: 2, group_size: 2, sampling: {{ max_new_tokens: 6 }}, \
         env: {{ name: external, params: {{ command: 'python3 {} {mode} {}', step_timeout: {timeout} }}, \
         max_turns: 3, action_pattern: '(\\w+)', overlap_steps: {overlap} }} }}\n",
        script.display(),
        marker.display()
    );
    let cfg: RunConfig = from_yaml_str(&text, "test").expect("a config");
    let rl = cfg.rl.expect("an rl section");
    let env = rl.env.clone().expect("an env");
    (rl, env)
}

type Summary = Vec<(usize, usize, bool, Option<Cut>, usize)>;

fn summary(t: &[super::super::episodes::Trajectory]) -> Summary {
    t.iter()
        .map(|t| (t.group, t.turns.len(), t.success, t.cut, t.invalid_actions))
        .collect()
}

#[test]
fn a_program_env_plays_as_the_builtin_and_a_lost_episode_is_played_again() {
    let m = model(64);
    let answer = |r: &Request| scripted_policy(&m, r);
    let (cfg, env) = rl("map: SFG", 3);
    let builtin = EpisodeRunner::new(&cfg, &env, plain(&m), 1)
        .run(1, &mut Scripted::new(&answer))
        .expect("a rollout");
    // As in scripted_episodes_end_by_goal_turn_limit_or_budget_with_only_policy_tokens_trainable.
    let expected: Summary = vec![
        (0, 2, true, None, 0),
        (0, 3, false, Some(Cut::Turns), 3),
        (1, 2, true, None, 0),
        (1, 3, false, Some(Cut::Turns), 0),
    ];
    assert_eq!(summary(&builtin.trajectories), expected);
    let dir = tempfile::tempdir().unwrap();
    for mode in ["fine", "crash", "hang"] {
        for overlap in [false, true] {
            let (cfg, env) = external(mode, dir.path(), overlap);
            let out = EpisodeRunner::new(&cfg, &env, plain(&m), 1)
                .run(1, &mut Scripted::new(&answer))
                .unwrap_or_else(|e| panic!("{mode}, overlap {overlap}: {e}"));
            assert_eq!(summary(&out.trajectories), expected, "{mode} {overlap}");
            for (a, b) in out.trajectories.iter().zip(&builtin.trajectories) {
                assert_eq!(a.response, b.response, "{mode} {overlap}");
                assert_eq!(a.episode_return, b.episode_return, "{mode} {overlap}");
            }
            let says = match mode {
                "fine" => None,
                "crash" => Some("flaky crash"),
                _ => Some("did not answer 'step' within 3 s"),
            };
            match says {
                None => assert!(out.failures.is_empty(), "{:?}", out.failures),
                Some(says) => {
                    assert_eq!(
                        out.failures.len(),
                        1,
                        "{mode} {overlap}: {:?}",
                        out.failures
                    );
                    assert!(out.failures[0].contains(says), "{}", out.failures[0]);
                }
            }
        }
    }
}

#[test]
fn a_program_that_always_fails_ends_the_rollout_with_its_stderr() {
    let m = model(64);
    let answer = |r: &Request| scripted_policy(&m, r);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("broken.py");
    std::fs::write(
        &script,
        "import sys\nsys.stderr.write('no levels here\\n')\nsys.exit(2)\n",
    )
    .unwrap();
    let (cfg, mut env) = rl("map: SFG", 3);
    env.name = "external".into();
    env.params = [(
        "command".to_string(),
        format!("python3 {}", script.display()).into(),
    )]
    .into_iter()
    .collect();
    let err = EpisodeRunner::new(&cfg, &env, plain(&m), 1)
        .run(1, &mut Scripted::new(&answer))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("lost its environment 4 times in a row"),
        "{err}"
    );
    assert!(err.contains("no levels here"), "{err}");
}
