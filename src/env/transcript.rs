//! How an episode is written as text for a model without a chat template, and demonstrations of
//! an environment in that form (the SFT warm start of an agentic run).
//!
//! Plain form: the instruction (when there is one) and the first observation, each followed by a
//! newline; then, every turn, the policy's output, the end of its turn (the model's end-of-sequence
//! token, whose text a tokenizer reads back as that token), and the next observation with a
//! newline. A rollout builds the same sequence in token ids, so a model warm-started on these
//! demonstrations sees at RL time exactly what it was taught on.

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::plan::shortest_plan;
use super::{Env, EnvFailure, StepError};
use crate::seed::mix_seed;

/// The text before the policy's first turn.
pub fn plain_first(instruction: Option<&str>, observation: &str) -> String {
    match instruction {
        Some(i) => format!("{i}\n{observation}\n"),
        None => format!("{observation}\n"),
    }
}

/// The text after a turn's end, before the policy's next turn.
pub fn plain_next(observation: &str) -> String {
    format!("{observation}\n")
}

/// How demonstrations are drawn.
pub struct DemoSpec<'a> {
    /// Episodes to play; each gives one example per turn.
    pub episodes: usize,
    /// Chance that a turn shows a random action instead of the planner's.
    pub noise: f64,
    pub max_turns: usize,
    /// How an action is written, `{action}` standing for it (`<answer>{action}</answer>`).
    pub answer_template: &'a str,
    pub instruction: Option<&'a str>,
    /// The text of the model's end-of-turn token.
    pub turn_end: &'a str,
    /// Prompt each turn with its observation alone (step-wise training without history) instead
    /// of the transcript so far.
    pub observation_only: bool,
    pub seed: u64,
}

/// One demonstrated turn: the transcript up to the policy's turn, and what it should write.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoTurn {
    pub prompt: String,
    pub answer: String,
}

/// Turns of `spec.episodes` episodes of `env`, each started from its own seed: the planner's
/// shortest-path action, or with probability `noise` a random one (then the planner recovers from
/// wherever that led, as long as the episode lasts).
pub fn demonstrations(env: &mut dyn Env, spec: &DemoSpec<'_>) -> Result<Vec<DemoTurn>, EnvFailure> {
    let mut rng = StdRng::seed_from_u64(mix_seed(&[spec.seed, 0xde]));
    let mut out = vec![];
    for e in 0..spec.episodes {
        let mut observation = env.reset(mix_seed(&[spec.seed, 0xe9, e as u64]))?;
        let mut transcript = plain_first(spec.instruction, &observation);
        for _ in 0..spec.max_turns {
            let actions = env.actions();
            if actions.is_empty() {
                break;
            }
            let planned = shortest_plan(env, spec.max_turns).and_then(|p| p.into_iter().next());
            let action = match planned {
                Some(a) if !rng.random_bool(spec.noise.clamp(0.0, 1.0)) => a,
                _ => actions[rng.random_range(0..actions.len())].clone(),
            };
            let answer = spec.answer_template.replace("{action}", &action);
            out.push(DemoTurn {
                prompt: match spec.observation_only {
                    true => plain_first(spec.instruction, &observation),
                    false => transcript.clone(),
                },
                answer: answer.clone(),
            });
            let step = match env.step(&action) {
                Ok(step) => step,
                Err(StepError::Invalid(_)) => break,
                Err(StepError::Failed(f)) => return Err(f),
            };
            if step.done {
                break;
            }
            transcript.push_str(&answer);
            transcript.push_str(spec.turn_end);
            transcript.push_str(&plain_next(&step.observation));
            observation = step.observation;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::make;

    #[test]
    fn noiseless_demonstrations_walk_the_planner_path_turn_by_turn() {
        let mut env = make(
            "frozen_lake",
            &[
                ("map".into(), "SFF/FHF/FFG".into()),
                ("legend".into(), "false".into()),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let spec = DemoSpec {
            episodes: 1,
            noise: 0.0,
            max_turns: 10,
            answer_template: "{action}",
            instruction: None,
            turn_end: "<eos>",
            seed: 3,
            observation_only: false,
        };
        let turns = demonstrations(env.as_mut(), &spec).unwrap();
        // The hole in the middle leaves two shortest paths of 4 moves; BFS tries Left, Down,
        // Right, Up in that order, so Down Down Right Right is found first.
        let answers: Vec<&str> = turns.iter().map(|t| t.answer.as_str()).collect();
        assert_eq!(answers, ["Down", "Down", "Right", "Right"]);
        assert_eq!(turns[0].prompt, "PFF\nFHF\nFFG\n");
        assert_eq!(
            turns[1].prompt, "PFF\nFHF\nFFG\nDown<eos>SFF\nPHF\nFFG\n",
            "each turn's prompt extends the last one by its answer, the turn end and the observation"
        );
        // Step-wise demonstrations: each prompt is the observation alone.
        let alone = DemoSpec {
            observation_only: true,
            ..spec
        };
        let prompts: Vec<String> = demonstrations(env.as_mut(), &alone)
            .unwrap()
            .into_iter()
            .map(|t| t.prompt)
            .collect();
        assert_eq!(prompts[1], "SFF\nPHF\nFFG\n");
        // All noise: random actions, and the same seed gives the same demonstrations.
        let noisy = DemoSpec {
            noise: 1.0,
            episodes: 3,
            ..spec
        };
        let a = demonstrations(env.as_mut(), &noisy).unwrap();
        assert_eq!(a, demonstrations(env.as_mut(), &noisy).unwrap());
        assert_ne!(
            a.iter().map(|t| t.answer.as_str()).collect::<Vec<_>>(),
            answers
        );
    }
}
