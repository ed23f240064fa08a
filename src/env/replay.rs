//! Rebuilding a recorded episode: the environment is reset from the episode's seed and every
//! recorded output is stepped again through the same action parser, and each observation the
//! policy saw is checked against the recorded one. An environment that is deterministic given
//! its seed reproduces every turn; the first turn that does not is the divergence — a bug in the
//! environment (or a run recorded with other parameters), and the start of a bug report.

use super::{ActionParser, Env, EnvFailure, Episode, Step};

/// One recorded turn: what the policy saw, and what it wrote.
#[derive(Debug, Clone, Copy)]
pub struct RecordedTurn<'a> {
    pub observation: &'a str,
    pub output: &'a str,
}

/// The first turn whose replayed observation differs from the recorded one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// 0-based turn.
    pub turn: usize,
    pub recorded: String,
    pub replayed: String,
}

/// Replay `turns` in `env` from `seed`; `Ok(None)` when every observation is reproduced. The
/// episode is left where the replay ended (a debugger continues from there).
pub fn replay(
    env: Box<dyn Env>,
    parser: ActionParser,
    format_penalty: f64,
    seed: u64,
    turns: &[RecordedTurn<'_>],
) -> Result<(Episode, Option<Divergence>), EnvFailure> {
    let replayed = replay_steps(env, parser, format_penalty, seed, turns)?;
    Ok((replayed.episode, replayed.divergence))
}

/// A replay with what each reproduced turn did.
pub struct Replayed {
    pub episode: Episode,
    /// The first observation of the episode.
    pub first: String,
    /// One step per turn replayed before the divergence (all of them without one).
    pub steps: Vec<Step>,
    pub divergence: Option<Divergence>,
}

/// [`replay`], keeping every step: the turns before a divergence are played, the diverging one
/// and those after it are not.
pub fn replay_steps(
    env: Box<dyn Env>,
    parser: ActionParser,
    format_penalty: f64,
    seed: u64,
    turns: &[RecordedTurn<'_>],
) -> Result<Replayed, EnvFailure> {
    let mut episode = Episode::new(env, parser, format_penalty);
    let first = episode.reset(seed)?;
    let mut observation = first.clone();
    let mut steps = vec![];
    for (turn, recorded) in turns.iter().enumerate() {
        if observation != recorded.observation {
            let divergence = Divergence {
                turn,
                recorded: recorded.observation.to_string(),
                replayed: observation,
            };
            return Ok(Replayed {
                episode,
                first,
                steps,
                divergence: Some(divergence),
            });
        }
        let step = episode.step(recorded.output)?;
        observation = step.observation.clone();
        steps.push(step);
    }
    Ok(Replayed {
        episode,
        first,
        steps,
        divergence: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::make;

    /// Play `outputs` in a fresh `name` env from `seed`, recording each turn as a rollout does.
    fn record(
        name: &str,
        params: &[(&str, &str)],
        seed: u64,
        outputs: &[&str],
    ) -> Vec<(String, String)> {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = make(name, &params).unwrap();
        let mut ep = Episode::new(env, ActionParser::default(), 0.1);
        let mut observation = ep.reset(seed).unwrap();
        let mut turns = vec![];
        for output in outputs {
            turns.push((observation.clone(), output.to_string()));
            let step = ep.step(output).unwrap();
            observation = step.observation;
            if step.done {
                break;
            }
        }
        turns
    }

    fn replays(
        name: &str,
        params: &[(&str, &str)],
        seed: u64,
        turns: &[(String, String)],
    ) -> Option<Divergence> {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let recorded: Vec<RecordedTurn> = turns
            .iter()
            .map(|(o, a)| RecordedTurn {
                observation: o,
                output: a,
            })
            .collect();
        let env = make(name, &params).unwrap();
        replay(env, ActionParser::default(), 0.1, seed, &recorded)
            .unwrap()
            .1
    }

    #[test]
    fn every_env_reproduces_its_recorded_observations() {
        let a = |x: &str| format!("<answer>{x}</answer>");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/external/guess_number.py");
        let command = format!("python3 {script}");
        // (env, parameters, outputs played)
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<String>);
        let cases: Vec<Case> = vec![
            // Slippery: the moves taken come from the env's own seeded stream.
            (
                "frozen_lake",
                vec![("size", "5"), ("slippery", "true")],
                ["Down", "Right", "oops", "Down", "Right", "Down"]
                    .map(a)
                    .to_vec(),
            ),
            (
                "sokoban",
                vec![],
                ["Up", "Left", "Down", "Right", "Right", "Up"]
                    .map(a)
                    .to_vec(),
            ),
            (
                "webshop",
                vec![],
                [
                    "search[coffee organic]",
                    "click[next >]",
                    "click[< prev]",
                    "click[back to search]",
                ]
                .map(a)
                .to_vec(),
            ),
            (
                "external",
                vec![("command", command.as_str()), ("high", "20")],
                ["10", "5", "x", "15"].map(a).to_vec(),
            ),
        ];
        for (name, params, outputs) in cases {
            let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
            let turns = record(name, &params, 7, &outputs);
            assert!(turns.len() >= 3, "{name}: {turns:?}");
            assert_eq!(replays(name, &params, 7, &turns), None, "{name}");
            // A recorded observation that the env does not produce is found at its turn.
            let mut changed = turns.clone();
            changed[2].0.push_str(" (edited)");
            let d = replays(name, &params, 7, &changed).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(d.turn, 2, "{name}");
            assert!(d.recorded.ends_with(" (edited)") && !d.replayed.ends_with(" (edited)"));
            // Another seed: the very first observation differs (or a later one, for a map
            // that happens to look alike).
            assert!(
                replays(name, &params, 8, &turns).is_some() || name == "external",
                "{name}"
            );
        }
    }
}
