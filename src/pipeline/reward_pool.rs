//! Rule-reward scoring for the RL stage, in this process or in a pool of `roll-tui worker reward`
//! processes (`workers.reward.mode: process`). A pool splits each batch across its workers, runs the
//! calls concurrently, and replaces a worker that dies or stops answering, retrying its share once:
//! rewards are pure functions, so a retry cannot count a sample twice or change a result.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::mpsc;

use super::{PipelineError, PipelineEvent, RunContext};
use crate::config::{PlacementMode, RolePlacement};
use crate::metrics::WorkerNotice;
use crate::reward::{self, RewardOutcome};
use crate::worker::{
    Reply, Request, Role, ScoreItem, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec,
};

/// A reward call that takes longer than this is a hung worker.
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

fn setup_err(e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Setup(e.to_string())
}

impl RewardScorer {
    pub fn start(placement: &RolePlacement) -> Result<RewardScorer, PipelineError> {
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
    pub fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, PipelineError> {
        match self {
            RewardScorer::InProcess => Ok(items
                .iter()
                .map(|i| reward::score(i.kind, &i.response, &i.ground_truth))
                .collect()),
            RewardScorer::Pool(pool) => pool.score(items),
        }
    }

    /// Worker events since the last call, as (worker name, notice, text).
    pub fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
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
    pub fn shutdown(mut self) -> Vec<(String, WorkerNotice, String)> {
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

/// Record worker events with the run; failures are also shown to the user.
pub fn report_workers(
    ctx: &mut RunContext<'_>,
    events: Vec<(String, WorkerNotice, String)>,
) -> Result<(), PipelineError> {
    for (worker, notice, text) in events {
        ctx.sink.worker(&worker, notice, &text)?;
        if matches!(notice, WorkerNotice::Failed | WorkerNotice::Restarted) {
            ctx.emit(PipelineEvent::Message(format!("worker {worker}: {text}")));
        }
    }
    Ok(())
}

/// The worker events queued in `rx`, described for the run's record.
pub(super) fn drain(
    rx: &mut mpsc::UnboundedReceiver<WorkerEvent>,
) -> Vec<(String, WorkerNotice, String)> {
    let mut out = vec![];
    while let Ok(e) = rx.try_recv() {
        out.push(describe(&e));
    }
    out
}

fn describe(e: &WorkerEvent) -> (String, WorkerNotice, String) {
    match e {
        WorkerEvent::Started { role, index, pid } => (
            format!("{role}-{index}"),
            WorkerNotice::Started,
            format!("started, pid {pid}"),
        ),
        WorkerEvent::Log {
            role,
            index,
            stream,
            line,
        } => (
            format!("{role}-{index}"),
            WorkerNotice::Log,
            format!("{stream}: {line}"),
        ),
        WorkerEvent::Unresponsive {
            role,
            index,
            silent_s,
        } => (
            format!("{role}-{index}"),
            WorkerNotice::Failed,
            format!("no heartbeat answer for {silent_s:.1} s"),
        ),
        WorkerEvent::Exited {
            role,
            index,
            pid,
            status,
            expected,
        } => {
            let notice = if *expected {
                WorkerNotice::Exited
            } else {
                WorkerNotice::Failed
            };
            let what = if *expected { "exited" } else { "died" };
            (
                format!("{role}-{index}"),
                notice,
                format!("pid {pid} {what} ({status})"),
            )
        }
    }
}

impl RewardPool {
    fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, PipelineError> {
        let per = items.len().div_ceil(self.workers.len()).max(1);
        let chunks: Vec<Vec<ScoreItem>> = items.chunks(per).map(<[ScoreItem]>::to_vec).collect();
        let mut results: Vec<Result<Reply, WorkerError>> = self.rt.block_on(join_all(
            self.workers
                .iter()
                .zip(&chunks)
                .map(|(w, c)| w.call(Request::Score { items: c.clone() }, CALL_TIMEOUT)),
        ));
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
                *result = self.rt.block_on(self.workers[i].call(
                    Request::Score {
                        items: chunks[i].clone(),
                    },
                    CALL_TIMEOUT,
                ));
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for result in results {
            match result.map_err(setup_err)? {
                Reply::Scores(s) => out.extend(s),
                other => {
                    return Err(PipelineError::Setup(format!(
                        "a reward worker answered a score call with {other:?}"
                    )));
                }
            }
        }
        if out.len() != items.len() {
            return Err(PipelineError::Setup(format!(
                "reward workers returned {} scores for {} responses",
                out.len(),
                items.len()
            )));
        }
        Ok(out)
    }
}
