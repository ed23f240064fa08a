//! The reward role: rule-reward scoring for the RL stage, in this process or in a pool of
//! `roll-tui worker reward` processes (`workers.reward.mode: process`). A pool splits each batch
//! across its workers, runs the calls concurrently, and replaces a worker that dies or stops
//! answering, retrying its share once: rewards are pure functions, so a retry cannot count a sample
//! twice or change a result.

use std::time::Duration;

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::remote::{call_typed, drain};
use super::{Calls, Protocol, RoleCall, RoleError, WorkerNote, setup_err};
use crate::config::{PlacementMode, RolePlacement};
use crate::reward::{Reward, RewardOutcome};
use crate::worker::serve::CallQueue;
use crate::worker::{Role, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec};

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
    /// Score responses, in order.
    Score { items: Vec<ScoreItem> },
}

impl RoleCall for RewardCall {
    fn phase(&self) -> &'static str {
        "score"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardReply {
    Scores(Vec<RewardOutcome>),
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

/// The reward worker's compute loop.
pub fn serve(queue: CallQueue) {
    let calls = Calls::<RewardCall>::new(queue);
    while let Some((id, RewardCall::Score { items })) = calls.recv() {
        calls.reply(id, Ok(RewardReply::Scores(score_all(&items))));
    }
}

/// A reward call that takes longer than this (plus its programs' deadlines) is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub enum RewardScorer {
    InProcess,
    Pool(Box<RewardPool>),
}

pub struct RewardPool {
    rt: tokio::runtime::Runtime,
    specs: Vec<WorkerSpec>,
    workers: Vec<WorkerProcess>,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    /// Workers replaced after dying or hanging.
    pub restarts: usize,
}

impl RewardScorer {
    pub fn start(placement: &RolePlacement) -> Result<RewardScorer, RoleError> {
        if placement.mode == PlacementMode::InProcess {
            return Ok(RewardScorer::InProcess);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("roll-reward-pool")
            .enable_all()
            .build()
            .map_err(setup_err)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let specs = (0..placement.num_workers)
            .map(|i| WorkerSpec::new(Role::Reward, i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(setup_err)?;
        let workers = rt
            .block_on(async {
                let started = join_all(
                    specs
                        .iter()
                        .map(|s| WorkerProcess::spawn(s, events_tx.clone())),
                );
                started.await.into_iter().collect::<Result<Vec<_>, _>>()
            })
            .map_err(setup_err)?;
        Ok(RewardScorer::Pool(Box::new(RewardPool {
            rt,
            specs,
            workers,
            events_tx,
            events,
            restarts: 0,
        })))
    }

    /// Score `items` in order.
    pub fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, RoleError> {
        match self {
            RewardScorer::InProcess => Ok(score_all(&items)),
            RewardScorer::Pool(pool) => pool.score(items),
        }
    }

    /// Worker events since the last call, as (worker name, notice, text).
    pub fn drain_events(&mut self) -> Vec<WorkerNote> {
        let RewardScorer::Pool(pool) = self else {
            return vec![];
        };
        drain(&mut pool.events)
    }

    pub fn restarts(&self) -> usize {
        match self {
            RewardScorer::InProcess => 0,
            RewardScorer::Pool(pool) => pool.restarts,
        }
    }

    /// Stop the workers (asking first); returns the events not yet drained, exits included.
    pub fn shutdown(mut self) -> Vec<WorkerNote> {
        let mut events = self.drain_events();
        if let RewardScorer::Pool(pool) = self {
            let RewardPool {
                rt,
                workers,
                events: mut rx,
                ..
            } = *pool;
            rt.block_on(join_all(
                workers
                    .into_iter()
                    .map(|w| w.shutdown(Duration::from_secs(5))),
            ));
            events.extend(drain(&mut rx));
        }
        events
    }
}

impl RewardPool {
    fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, RoleError> {
        let per = items.len().div_ceil(self.workers.len()).max(1);
        let chunks: Vec<Vec<ScoreItem>> = items.chunks(per).map(<[ScoreItem]>::to_vec).collect();
        let call = |items: &[ScoreItem]| RewardCall::Score {
            items: items.to_vec(),
        };
        let mut results: Vec<Result<RewardReply, WorkerError>> =
            self.rt
                .block_on(join_all(self.workers.iter().zip(&chunks).map(|(w, c)| {
                    let (timeout, c) = (call_timeout(c), call(c));
                    async move { call_typed::<RewardProtocol>(w, &c, timeout).await }
                })));
        for (i, result) in results.iter_mut().enumerate() {
            let retry = matches!(
                result,
                Err(WorkerError::Died { .. }
                    | WorkerError::Timeout { .. }
                    | WorkerError::Protocol { .. })
            );
            if retry {
                // Replace the worker (dropping the old one kills it) and give it the same share.
                let fresh = self
                    .rt
                    .block_on(WorkerProcess::spawn(&self.specs[i], self.events_tx.clone()))
                    .map_err(setup_err)?;
                self.workers[i] = fresh;
                self.restarts += 1;
                *result = self.rt.block_on(call_typed::<RewardProtocol>(
                    &self.workers[i],
                    &call(&chunks[i]),
                    call_timeout(&chunks[i]),
                ));
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for result in results {
            let RewardReply::Scores(s) = result.map_err(setup_err)?;
            out.extend(s);
        }
        if out.len() != items.len() {
            return Err(RoleError::Setup(format!(
                "reward workers returned {} scores for {} responses",
                out.len(),
                items.len()
            )));
        }
        Ok(out)
    }
}
