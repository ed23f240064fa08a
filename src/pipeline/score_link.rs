//! The rollout's path to reward scoring. In-process rewards are scored on the spot; a pool of reward
//! worker processes is driven from its own thread, so the samples that finished at one decode step
//! are scored while the next step decodes. Results come back in the order the batches were sent,
//! and the rollout collects each batch before its next dispatch decision, which keeps a run's
//! choices independent of timing.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::RunError;
use crate::metrics::WorkerNote;
use crate::reward::RewardOutcome;
use crate::role::reward::ScoreItem;
use crate::role::reward::{RewardScorer, SharedScorer};

type WorkerEvents = Vec<WorkerNote>;

/// One scored batch: outcomes in order, seconds spent, worker events, restarts so far.
pub(super) struct Scored {
    outcomes: Result<Vec<RewardOutcome>, String>,
    seconds: f64,
    events: WorkerEvents,
    restarts: usize,
}

pub(super) enum ScoreLink {
    Inline {
        scorer: SharedScorer,
        ready: Option<Scored>,
    },
    Thread {
        tx: Option<mpsc::Sender<Vec<ScoreItem>>>,
        rx: mpsc::Receiver<Scored>,
        handle: Option<JoinHandle<WorkerEvents>>,
    },
}

/// What [`ScoreLink::recv`] hands back besides the outcomes.
#[derive(Default)]
pub(super) struct ScoreReport {
    pub seconds: f64,
    pub events: WorkerEvents,
    pub restarts: usize,
}

impl ScoreLink {
    pub fn start(scorer: SharedScorer) -> Result<ScoreLink, RunError> {
        let in_process = matches!(*scorer.lock(), RewardScorer::InProcess { .. });
        if in_process {
            return Ok(ScoreLink::Inline {
                scorer,
                ready: None,
            });
        }
        let (tx, jobs) = mpsc::channel::<Vec<ScoreItem>>();
        let (done, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("roll-reward-link".into())
            .spawn(move || {
                for items in jobs {
                    let scored = score(&scorer, items);
                    if done.send(scored).is_err() {
                        break;
                    }
                }
                scorer.lock().shutdown()
            })
            .map_err(|e| RunError::Setup(format!("starting the reward thread: {e}")))?;
        Ok(ScoreLink::Thread {
            tx: Some(tx),
            rx,
            handle: Some(handle),
        })
    }

    /// Send one batch for scoring; collect it with [`ScoreLink::recv`] before sending the next.
    pub fn send(&mut self, items: Vec<ScoreItem>) -> Result<(), RunError> {
        match self {
            ScoreLink::Inline { scorer, ready } => {
                *ready = Some(score(scorer, items));
                Ok(())
            }
            ScoreLink::Thread { tx, .. } => tx
                .as_ref()
                .and_then(|tx| tx.send(items).ok())
                .ok_or_else(|| RunError::Setup("the reward thread has stopped".into())),
        }
    }

    /// The outcomes of the batch sent last, in order.
    pub fn recv(&mut self) -> Result<(Vec<RewardOutcome>, ScoreReport), RunError> {
        let scored = match self {
            ScoreLink::Inline { ready, .. } => ready.take(),
            ScoreLink::Thread { rx, .. } => rx.recv().ok(),
        }
        .ok_or_else(|| RunError::Setup("the reward thread has stopped".into()))?;
        let outcomes = scored.outcomes.map_err(RunError::Setup)?;
        Ok((
            outcomes,
            ScoreReport {
                seconds: scored.seconds,
                events: scored.events,
                restarts: scored.restarts,
            },
        ))
    }

    /// Stop scoring; returns the worker events not reported yet (exits included).
    pub fn shutdown(self) -> WorkerEvents {
        match self {
            ScoreLink::Inline { scorer, .. } => scorer.lock().shutdown(),
            ScoreLink::Thread {
                mut tx, mut handle, ..
            } => {
                drop(tx.take());
                handle
                    .take()
                    .and_then(|h| h.join().ok())
                    .unwrap_or_default()
            }
        }
    }
}

fn score(scorer: &SharedScorer, items: Vec<ScoreItem>) -> Scored {
    let t0 = Instant::now();
    let mut scorer = scorer.lock();
    let outcomes = scorer.score(items).map_err(|e| e.to_string());
    Scored {
        outcomes,
        seconds: t0.elapsed().as_secs_f64(),
        events: scorer.drain_events(),
        restarts: scorer.restarts(),
    }
}
