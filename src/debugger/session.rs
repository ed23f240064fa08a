//! One episode under the debugger: its environment, seed and turns. Every change goes through the
//! environment's own `reset`/`step`, so what the debugger shows is what a rollout would see.
//!
//! Going back (undo, fork at an earlier turn) rebuilds the environment: a fresh copy is reset from
//! the seed and the kept turns' outputs are stepped again, each observation checked against the one
//! shown before. That works for every environment, a program behind the external protocol
//! included, because an environment is deterministic given its seed and actions; one that is not
//! is reported (the divergence), and the session stays as it was.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::policy::ModelTurn;
use crate::env::replay::{Divergence, RecordedTurn, Replayed, replay_steps};
use crate::env::{ActionParser, Env, EnvFailure, Episode, Step};
use crate::seed::mix_seed;

/// Who wrote a turn's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// Typed or chosen by a person.
    Human,
    Random,
    Model,
    /// Replayed from a stored episode.
    Stored,
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Human => "human",
            Actor::Random => "random",
            Actor::Model => "model",
            Actor::Stored => "stored",
        }
    }
}

/// One turn played.
#[derive(Debug, Clone)]
pub struct DebugTurn {
    /// What the policy saw before acting.
    pub observation: String,
    pub actor: Actor,
    /// The raw output, as the action parser read it.
    pub output: String,
    /// What the step did; `info` holds `parsed_action`, `action_is_valid` and, for an output
    /// without a valid action, `invalid_reason`.
    pub step: Step,
    /// The prompt, sampled ids and per-token detail of a model's turn.
    pub model: Option<ModelTurn>,
}

impl DebugTurn {
    pub fn parsed_action(&self) -> Option<&str> {
        self.step.info.get("parsed_action").and_then(Value::as_str)
    }

    pub fn valid(&self) -> bool {
        self.step.info.get("action_is_valid") == Some(&Value::Bool(true))
    }

    /// Why the output was not a valid action.
    pub fn invalid_reason(&self) -> Option<&str> {
        self.step.info.get("invalid_reason").and_then(Value::as_str)
    }
}

/// Why a debugger command did nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    #[error("the episode is over: undo, fork at an earlier turn, or reset")]
    Over,
    #[error("{0}")]
    Env(#[from] EnvFailure),
    #[error(
        "the environment did not reproduce turn {}: it showed a different observation than \
         before, so it is not deterministic given its seed and actions",
        .0.turn + 1
    )]
    Diverged(Divergence),
    #[error("{0}")]
    Action(String),
}

/// The debugged episode.
pub struct Session {
    /// The environment's registered name and parameters (what a saved trajectory names).
    pub env_name: String,
    pub params: Vec<(String, String)>,
    prototype: Box<dyn Env>,
    parser: ActionParser,
    format_penalty: f64,
    pub seed: u64,
    episode: Episode,
    first_observation: String,
    pub turns: Vec<DebugTurn>,
    /// The turn the last fork went back to (0-based: the first turn played after it).
    pub forked_at: Option<usize>,
    /// Set when the session was opened from a stored episode that the environment does not
    /// reproduce: the first turn whose observation differs.
    pub divergence: Option<Divergence>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("env", &self.env_name)
            .field("seed", &self.seed)
            .field("turns", &self.turns.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A new episode of `prototype` (a fresh, never reset environment) from `seed`.
    pub fn start(
        env_name: &str,
        params: Vec<(String, String)>,
        prototype: Box<dyn Env>,
        parser: ActionParser,
        format_penalty: f64,
        seed: u64,
    ) -> Result<Session, EnvFailure> {
        let mut episode = Episode::new(prototype.clone_box(), parser.clone(), format_penalty);
        let first_observation = episode.reset(seed)?;
        Ok(Session {
            env_name: env_name.to_string(),
            params,
            prototype,
            parser,
            format_penalty,
            seed,
            episode,
            first_observation,
            turns: vec![],
            forked_at: None,
            divergence: None,
        })
    }

    /// A stored episode (its observations and outputs), replayed from its seed and checked turn
    /// by turn, then left at turn `at` (0-based: the turn to play next; at most the turns stored).
    /// A divergence stops the replay there and is kept in [`Session::divergence`].
    pub fn open_recorded(
        mut self,
        recorded: &[(String, String)],
        at: usize,
    ) -> Result<Session, EnvFailure> {
        let turns: Vec<RecordedTurn> = recorded
            .iter()
            .map(|(observation, output)| RecordedTurn {
                observation,
                output,
            })
            .collect();
        let replayed = self.replay(&turns)?;
        let at = at.min(replayed.steps.len());
        self.divergence = replayed.divergence;
        self.turns = recorded
            .iter()
            .zip(replayed.steps)
            .map(|((observation, output), step)| DebugTurn {
                observation: observation.clone(),
                actor: Actor::Stored,
                output: output.clone(),
                step,
                model: None,
            })
            .collect();
        self.first_observation = replayed.first;
        self.episode = replayed.episode;
        if at < self.turns.len() {
            self.truncate(at).map_err(|e| EnvFailure(e.to_string()))?;
        }
        Ok(self)
    }

    pub fn env(&self) -> &dyn Env {
        self.episode.env()
    }

    pub fn parser(&self) -> &ActionParser {
        &self.parser
    }

    pub fn first_observation(&self) -> &str {
        &self.first_observation
    }

    /// What the policy acts on now.
    pub fn observation(&self) -> &str {
        self.turns
            .last()
            .map_or(&self.first_observation, |t| &t.step.observation)
    }

    pub fn done(&self) -> bool {
        self.episode.done
    }

    pub fn total_reward(&self) -> f64 {
        self.turns.iter().map(|t| t.step.reward).sum()
    }

    pub fn success(&self) -> bool {
        self.turns
            .last()
            .is_some_and(|t| t.step.info.get("success") == Some(&Value::Bool(true)))
    }

    /// Play one turn whose raw output is `output`.
    pub fn act(
        &mut self,
        output: String,
        actor: Actor,
        model: Option<ModelTurn>,
    ) -> Result<&DebugTurn, SessionError> {
        if self.done() {
            return Err(SessionError::Over);
        }
        let observation = self.observation().to_string();
        let step = self.episode.step(&output)?;
        self.turns.push(DebugTurn {
            observation,
            actor,
            output,
            step,
            model,
        });
        Ok(self.turns.last().expect("a turn was just pushed"))
    }

    /// Take `action` (an action of the environment, as a person picks it): it is written as the
    /// policy would write it, so that the action parser reads it back.
    pub fn take(&mut self, action: &str, actor: Actor) -> Result<&DebugTurn, SessionError> {
        let output = self.written(action).map_err(SessionError::Action)?;
        self.act(output, actor, None)
    }

    /// `action` as a policy's output the parser reads back as `action`: inside `<answer>…</answer>`,
    /// or bare when the configured pattern takes it that way.
    pub fn written(&self, action: &str) -> Result<String, String> {
        let candidates = [format!("<answer>{action}</answer>"), action.to_string()];
        candidates
            .into_iter()
            .find(|c| self.parser.parse(c) == Some(action.trim()))
            .ok_or_else(|| {
                format!(
                    "the action pattern does not read '{action}' back from '<answer>{action}</answer>' \
                     or '{action}': type the whole output instead"
                )
            })
    }

    /// A uniformly random valid action, drawn from the seed and the turn (the same turn of the same
    /// episode draws the same action); `None` when the environment lists none.
    pub fn random_action(&self) -> Option<String> {
        let actions = self.env().actions();
        if actions.is_empty() {
            return None;
        }
        let mut rng = StdRng::seed_from_u64(mix_seed(&[self.seed, 0xdb, self.turns.len() as u64]));
        Some(actions[rng.random_range(0..actions.len())].clone())
    }

    /// Back one turn; `false` when there was none.
    pub fn undo(&mut self) -> Result<bool, SessionError> {
        if self.turns.is_empty() {
            return Ok(false);
        }
        self.truncate(self.turns.len() - 1)?;
        Ok(true)
    }

    /// Go back to before turn `turn` (0-based) to play it differently: the turns from it on are
    /// dropped and the environment rebuilt. On failure nothing changes.
    pub fn fork(&mut self, turn: usize) -> Result<(), SessionError> {
        self.truncate(turn.min(self.turns.len()))?;
        self.forked_at = Some(turn.min(self.turns.len()));
        Ok(())
    }

    /// Keep the first `keep` turns.
    fn truncate(&mut self, keep: usize) -> Result<(), SessionError> {
        let recorded: Vec<RecordedTurn> = self.turns[..keep]
            .iter()
            .map(|t| RecordedTurn {
                observation: &t.observation,
                output: &t.output,
            })
            .collect();
        let replayed = self.replay(&recorded)?;
        if let Some(d) = replayed.divergence {
            return Err(SessionError::Diverged(d));
        }
        self.episode = replayed.episode;
        self.turns.truncate(keep);
        Ok(())
    }

    /// `turns` replayed in a fresh copy of the environment from the session's seed.
    fn replay(&self, turns: &[RecordedTurn<'_>]) -> Result<Replayed, EnvFailure> {
        replay_steps(
            self.prototype.clone_box(),
            self.parser.clone(),
            self.format_penalty,
            self.seed,
            turns,
        )
    }

    /// Start again from `seed` (the same seed replays the same start).
    pub fn reset(&mut self, seed: u64) -> Result<(), SessionError> {
        let mut episode = Episode::new(
            self.prototype.clone_box(),
            self.parser.clone(),
            self.format_penalty,
        );
        self.first_observation = episode.reset(seed)?;
        self.episode = episode;
        self.seed = seed;
        self.turns.clear();
        self.forked_at = None;
        self.divergence = None;
        Ok(())
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
