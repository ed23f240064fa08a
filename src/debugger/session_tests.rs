use super::*;
use crate::debugger::open::{env_config, session};

fn lake() -> Session {
    let env = env_config(
        "frozen_lake",
        &[
            ("map".into(), "SFF/FHF/FFG".into()),
            ("legend".into(), "false".into()),
        ],
    )
    .unwrap();
    session(&env, 0).unwrap()
}

#[test]
fn a_person_walks_to_the_goal_undoes_and_forks() {
    let mut s = lake();
    assert_eq!(s.observation(), "PFF\nFHF\nFFG");
    for a in ["Down", "Down", "Right"] {
        let t = s.take(a, Actor::Human).unwrap();
        assert_eq!((t.parsed_action(), t.valid()), (Some(a), true));
        assert_eq!(t.output, format!("<answer>{a}</answer>"));
    }
    let before_last = s.observation().to_string();
    assert_eq!(before_last, "SFF\nFHF\nFPG");
    let t = s.take("Right", Actor::Human).unwrap();
    assert_eq!((t.step.reward, t.step.done), (1.0, true));
    assert!(s.done() && s.success());
    assert_eq!(s.take("Left", Actor::Human).err(), Some(SessionError::Over));
    // Undo twice: back before the third move, the state shown then.
    assert!(s.undo().unwrap() && s.undo().unwrap());
    assert_eq!(s.turns.len(), 2);
    assert_eq!(s.observation(), "SFF\nFHF\nPFG");
    assert!(!s.done());
    // Fork at the second turn with another move: Right from (1,0) is the hole.
    s.fork(1).unwrap();
    assert_eq!((s.turns.len(), s.forked_at), (1, Some(1)));
    let t = s.take("Right", Actor::Human).unwrap();
    assert_eq!((t.step.reward, t.step.done), (0.0, true));
    assert!(!s.success());
    // A typed output without an action is penalised and changes nothing.
    s.reset(0).unwrap();
    let t = s.act("go left".into(), Actor::Human, None).unwrap();
    assert_eq!((t.valid(), t.step.reward), (false, -0.1));
    assert!(
        t.invalid_reason()
            .unwrap_or_default()
            .contains("no action found")
    );
    assert_eq!(t.step.observation, "PFF\nFHF\nFFG");
    assert!(s.undo().unwrap() && s.turns.is_empty());
    assert!(!s.undo().unwrap());
}

#[test]
fn random_actions_are_valid_and_drawn_from_the_seed_and_turn() {
    let mut a = lake();
    let mut b = lake();
    for _ in 0..3 {
        if a.done() {
            break;
        }
        let x = a.random_action().unwrap();
        assert!(a.env().actions().contains(&x));
        assert_eq!(Some(x.clone()), b.random_action());
        a.take(&x, Actor::Random).unwrap();
        b.take(&x, Actor::Random).unwrap();
    }
}

#[test]
fn a_custom_pattern_writes_what_it_reads() {
    let mut env = env_config("frozen_lake", &[("map".into(), "SF/FG".into())]).unwrap();
    env.action_pattern = Some(r"Action: (\w+)".into());
    let mut s = session(&env, 0).unwrap();
    assert!(s.written("Right").is_err(), "neither form parses");
    env.action_pattern = Some(r"(?s)^(.*)$".into());
    s = session(&env, 0).unwrap();
    assert_eq!(s.written("Right").unwrap(), "Right");
}

/// Record an episode as a rollout stores it: the observation before each turn and the output.
fn recorded(outputs: &[&str]) -> Vec<(String, String)> {
    let mut s = lake();
    let mut out = vec![];
    for o in outputs {
        out.push((s.observation().to_string(), o.to_string()));
        s.act(o.to_string(), Actor::Model, None).unwrap();
    }
    out
}

#[test]
fn a_stored_episode_opens_at_any_turn_and_its_divergence_is_found() {
    let turns = recorded(&[
        "<answer>Down</answer>",
        "nothing",
        "<answer>Down</answer>",
        "<answer>Right</answer>",
    ]);
    let s = lake().open_recorded(&turns, 2).unwrap();
    assert_eq!(s.divergence, None);
    assert_eq!(s.turns.len(), 2);
    assert_eq!(s.observation(), turns[2].0);
    assert_eq!(s.turns[1].actor, Actor::Stored);
    assert!(!s.turns[1].valid());
    // Past the end: every stored turn, and the episode goes on from there.
    let mut s = lake().open_recorded(&turns, 99).unwrap();
    assert_eq!(s.turns.len(), 4);
    assert_eq!(s.take("Right", Actor::Human).unwrap().step.reward, 1.0);
    // An observation the env does not produce: the replay stops before that turn.
    let mut edited = turns.clone();
    edited[3].0 = "SFF\nFHF\nPFF".into();
    let s = lake().open_recorded(&edited, 99).unwrap();
    let d = s.divergence.clone().unwrap();
    assert_eq!((d.turn, s.turns.len()), (3, 3));
    assert_eq!(d.replayed, turns[3].0);
}

#[test]
fn undo_rebuilds_a_program_backed_env() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/external/guess_number.py");
    let env = env_config(
        "external",
        &[
            ("command".into(), format!("python3 {script}")),
            ("high".into(), "20".into()),
        ],
    )
    .unwrap();
    let mut s = session(&env, 5).unwrap();
    let first = s.take("10", Actor::Human).unwrap().step.observation.clone();
    s.take("15", Actor::Human).unwrap();
    s.undo().unwrap();
    assert_eq!(s.observation(), first);
    let again = s.take("15", Actor::Human).unwrap().step.clone();
    s.undo().unwrap();
    assert_eq!(s.take("15", Actor::Human).unwrap().step, again);
}
