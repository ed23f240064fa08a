//! The reward role: reward scoring for the RL stage, in this process or in a pool of
//! `roll-tui worker reward` processes (`workers.reward.mode: process`). A pool splits each batch
//! across its workers, runs the calls concurrently, and replaces a worker that dies or stops
//! answering, retrying its share once: rewards are pure functions, so a retry cannot count a sample
//! twice or change a result.
//!
//! With `llm_judge` rewards the role hosts judge models: it is placed on devices
//! (`workers.reward.device_mapping`) and time-shared like every model role — resident while the
//! rollout scores, offloaded while colocated training runs ([`judges`]). The scorer is shared
//! ([`SharedScorer`]) between the rollout, which scores through it, and time-sharing, which moves it.

pub mod judges;
mod scorer;

pub use scorer::{RewardScorer, SharedScorer};

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Calls, Protocol, RoleCall};
use crate::reward::{Reward, RewardOutcome};
use crate::worker::Role;
use crate::worker::serve::CallQueue;

/// One response to score, with everything a reward may read: the domain's reward, the domain,
/// the prompt as the dataset gave it, the ground truth and the example's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreItem {
    pub reward: Reward,
    pub domain: String,
    pub prompt: String,
    pub response: String,
    pub ground_truth: String,
    /// The dataset line's `metadata` object, if it had one.
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

/// The reward role's calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardCall {
    /// Load these judge models now (at setup, so a bad one stops the run before it starts).
    LoadJudges { models: Vec<PathBuf> },
    /// Score responses, in order.
    Score { items: Vec<ScoreItem> },
    /// Move the weights of the judges from `models` to host copies in `dir` and free them.
    Offload { dir: PathBuf, models: Vec<PathBuf> },
    /// Bring them back.
    Reload { models: Vec<PathBuf> },
}

impl RoleCall for RewardCall {
    fn phase(&self) -> &'static str {
        match self {
            RewardCall::LoadJudges { .. } => "load",
            RewardCall::Score { .. } => "score",
            RewardCall::Offload { .. } => "offload",
            RewardCall::Reload { .. } => "reload",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardReply {
    Scores(Vec<RewardOutcome>),
    /// Bytes moved (offload, reload) or 0 (load).
    Moved {
        bytes: u64,
    },
}

pub struct RewardProtocol;

impl Protocol for RewardProtocol {
    const ROLE: Role = Role::Reward;
    type Request = RewardCall;
    type Reply = RewardReply;
}

/// Score `items` in order, here. Items that run programs are scored on threads of their own, one
/// sandbox each at a time (the pool of sandboxes): they wait on child processes, and must not
/// block the rayon threads that the model's matrix products use in this process. Rule rewards
/// take microseconds and are scored in place.
pub fn score_all(items: &[ScoreItem]) -> Vec<RewardOutcome> {
    // Judge models score the whole call in one batch per judge, before the per-item scoring.
    let judged: Vec<_> = items
        .iter()
        .flat_map(|i| {
            let item = (
                i.prompt.as_str(),
                i.response.as_str(),
                i.ground_truth.as_str(),
            );
            i.reward.judges().into_iter().map(move |p| (p, item))
        })
        .collect();
    if !judged.is_empty() {
        crate::reward::llm_judge::prejudge(&judged);
    }
    let one = |i: &ScoreItem| i.reward.score(&i.prompt, &i.response, &i.ground_truth);
    if !items.iter().any(|i| i.reward.runs_programs()) {
        return items.iter().map(one).collect();
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = items.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|chunk| {
                let h = scope.spawn(move || chunk.iter().map(one).collect::<Vec<_>>());
                (chunk.len(), h)
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|(len, h)| {
                // Rewards are total, so a scoring thread does not panic; if one did, its items
                // get outcomes that say so rather than taking the worker down.
                h.join().unwrap_or_else(|_| {
                    let failed = RewardOutcome {
                        error: Some("a scoring thread panicked".into()),
                        ..RewardOutcome::unformatted()
                    };
                    vec![failed; len]
                })
            })
            .collect()
    })
}

/// How long a worker may take on `items` before it counts as hung: [`CALL_TIMEOUT`] plus the time
/// the code rewards among them may take if every program runs to its deadline.
fn call_timeout(items: &[ScoreItem]) -> Duration {
    let programs: f64 = items
        .iter()
        .map(|i| i.reward.worst_case_seconds(&i.ground_truth))
        .sum();
    CALL_TIMEOUT + Duration::from_secs_f64(programs)
}

/// Loads each judge model in this process (see [`crate::reward::llm_judge::load`]).
fn load_judges(models: &[PathBuf]) -> Result<(), String> {
    models
        .iter()
        .try_for_each(|m| crate::reward::llm_judge::load(m))
}

/// The reward worker's compute loop.
pub fn serve(queue: CallQueue) {
    let calls = Calls::<RewardCall>::new(queue);
    while let Some((id, call)) = calls.recv() {
        let reply = match call {
            RewardCall::LoadJudges { models } => {
                load_judges(&models).map(|()| RewardReply::Moved { bytes: 0 })
            }
            RewardCall::Score { items } => Ok(RewardReply::Scores(score_all(&items))),
            RewardCall::Offload { dir, models } => std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating '{}': {e}", dir.display()))
                .and_then(|()| judges::offload(&dir, &models))
                .map(|bytes| RewardReply::Moved { bytes }),
            RewardCall::Reload { models } => {
                judges::reload(&models).map(|bytes| RewardReply::Moved { bytes })
            }
        };
        calls.reply(id, reply);
    }
}

/// A reward call that takes longer than this (plus its programs' deadlines) is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
