//! The reward role's handle: scoring in this process or in a pool of worker processes, and, when
//! the run's rewards include judge models, moving those models off and onto their devices.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::mpsc;

use super::{RewardCall, RewardProtocol, RewardReply, ScoreItem, call_timeout, judges};
use crate::config::PlacementMode;
use crate::reward::RewardOutcome;
use crate::role::remote::{call_typed, drain};
use crate::role::{HostCopy, ResidentRole, RunError, WorkerNote, setup_err};
use crate::worker::{Role, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec};

/// Loading a judge model (or moving one) that takes longer than this is a hung worker.
const MODEL_TIMEOUT: Duration = Duration::from_secs(600);

pub enum RewardScorer {
    /// Scoring in this process; `judges` are the judge models it loaded for the run.
    InProcess {
        judges: Vec<PathBuf>,
    },
    Pool(Box<RewardPool>),
}

pub struct RewardPool {
    rt: tokio::runtime::Runtime,
    specs: Vec<WorkerSpec>,
    workers: Vec<WorkerProcess>,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    /// The judge models every worker holds.
    judges: Vec<PathBuf>,
    /// Workers replaced after dying or hanging.
    pub restarts: usize,
}

impl RewardScorer {
    /// Scoring in this process, with no judge models.
    pub fn in_process() -> RewardScorer {
        RewardScorer::InProcess { judges: vec![] }
    }

    /// Scoring in this process with the judge models `judges`, loaded now (a command outside a
    /// run: `roll-tui eval`).
    pub fn in_process_with(judges: &[PathBuf]) -> Result<RewardScorer, RunError> {
        super::load_judges(judges).map_err(RunError::Setup)?;
        Ok(RewardScorer::InProcess {
            judges: judges.to_vec(),
        })
    }

    /// The reward role where `placement` puts it, holding the judge models `judges` (loaded now, so
    /// that a bad judge directory stops the run at setup).
    /// Each worker's judges compute on its share of the role's `device_mapping`.
    pub fn start(
        workers: &crate::config::WorkersConfig,
        judges: &[PathBuf],
    ) -> Result<RewardScorer, RunError> {
        let placement = &workers.reward;
        if placement.mode == PlacementMode::InProcess {
            return RewardScorer::in_process_with(judges);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("roll-reward-pool")
            .enable_all()
            .build()
            .map_err(setup_err)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let specs = (0..placement.num_workers)
            .map(|i| {
                WorkerSpec::new(Role::Reward, i)
                    .map(|s| s.with_device(workers.device_of(Role::Reward, i)))
            })
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
        let mut pool = RewardPool {
            rt,
            specs,
            workers,
            events_tx,
            events,
            judges: judges.to_vec(),
            restarts: 0,
        };
        if !judges.is_empty() {
            let load = RewardCall::LoadJudges {
                models: judges.to_vec(),
            };
            pool.on_every_worker(|_| load.clone())?;
        }
        Ok(RewardScorer::Pool(Box::new(pool)))
    }

    /// Score `items` in order.
    pub fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, RunError> {
        match self {
            RewardScorer::InProcess { .. } => Ok(super::score_all(&items)),
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
            RewardScorer::InProcess { .. } => 0,
            RewardScorer::Pool(pool) => pool.restarts,
        }
    }

    /// Stop the workers (asking first), or let go of this process's judges; returns the events
    /// not yet drained, exits included. The scorer scores nothing afterwards.
    pub fn shutdown(&mut self) -> Vec<WorkerNote> {
        let mut events = self.drain_events();
        match std::mem::replace(self, RewardScorer::in_process()) {
            RewardScorer::InProcess { judges } => {
                // Their memory goes back now rather than at the process's end (the workbench
                // runs many stages in one process).
                let mut held = crate::reward::llm_judge::judges();
                for model in &judges {
                    held.remove(model);
                }
            }
            RewardScorer::Pool(pool) => {
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
        }
        events
    }

    /// Move the judges off their devices into host copies under `area`; bytes moved.
    fn offload(&mut self, area: &std::path::Path) -> Result<u64, RunError> {
        match self {
            RewardScorer::InProcess { judges } if judges.is_empty() => Ok(0),
            RewardScorer::InProcess { judges: models } => {
                let dir = area.join("reward");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| RunError::Setup(format!("creating '{}': {e}", dir.display())))?;
                judges::offload(&dir, models).map_err(RunError::Setup)
            }
            RewardScorer::Pool(pool) if pool.judges.is_empty() => Ok(0),
            RewardScorer::Pool(pool) => {
                let models = pool.judges.clone();
                pool.on_every_worker(|_| RewardCall::Offload {
                    dir: area.join("reward"),
                    models: models.clone(),
                })
            }
        }
    }

    fn reload(&mut self) -> Result<u64, RunError> {
        match self {
            RewardScorer::InProcess { judges } if judges.is_empty() => Ok(0),
            RewardScorer::InProcess { judges: models } => {
                judges::reload(models).map_err(RunError::Setup)
            }
            RewardScorer::Pool(pool) if pool.judges.is_empty() => Ok(0),
            RewardScorer::Pool(pool) => {
                let models = pool.judges.clone();
                pool.on_every_worker(|_| RewardCall::Reload {
                    models: models.clone(),
                })
            }
        }
    }
}

impl RewardPool {
    fn score(&mut self, items: Vec<ScoreItem>) -> Result<Vec<RewardOutcome>, RunError> {
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
            if lost(result) {
                // Replace the worker (dropping the old one kills it) and give it the same share.
                self.replace(i)?;
                *result = self.rt.block_on(call_typed::<RewardProtocol>(
                    &self.workers[i],
                    &call(&chunks[i]),
                    call_timeout(&chunks[i]),
                ));
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for result in results {
            match result.map_err(setup_err)? {
                RewardReply::Scores(s) => out.extend(s),
                other => return Err(unexpected(&other)),
            }
        }
        if out.len() != items.len() {
            return Err(RunError::Setup(format!(
                "reward workers returned {} scores for {} responses",
                out.len(),
                items.len()
            )));
        }
        Ok(out)
    }

    /// A fresh worker in place of worker `i`, holding the pool's judges.
    fn replace(&mut self, i: usize) -> Result<(), RunError> {
        let fresh = self
            .rt
            .block_on(WorkerProcess::spawn(&self.specs[i], self.events_tx.clone()))
            .map_err(setup_err)?;
        self.workers[i] = fresh;
        self.restarts += 1;
        if !self.judges.is_empty() {
            let load = RewardCall::LoadJudges {
                models: self.judges.clone(),
            };
            let reply = self
                .rt
                .block_on(call_typed::<RewardProtocol>(
                    &self.workers[i],
                    &load,
                    MODEL_TIMEOUT,
                ))
                .map_err(setup_err)?;
            moved(reply)?;
        }
        Ok(())
    }

    /// `make(i)` on every worker `i` at once; the bytes they moved. A worker lost on the way is
    /// replaced by a fresh one holding its judges, which is where a reload would have left it; an
    /// offload then repeats on it.
    fn on_every_worker(&mut self, make: impl Fn(usize) -> RewardCall) -> Result<u64, RunError> {
        let calls: Vec<RewardCall> = (0..self.workers.len()).map(&make).collect();
        // The workers' judges are the same weights, offloaded to one host copy: the first worker
        // writes it, then the others find it written and only drop theirs.
        let first_alone = matches!(calls.first(), Some(RewardCall::Offload { .. }));
        let mut results = vec![];
        if first_alone && let (Some(w), Some(c)) = (self.workers.first(), calls.first()) {
            results.push(
                self.rt
                    .block_on(call_typed::<RewardProtocol>(w, c, MODEL_TIMEOUT)),
            );
        }
        let skip = results.len();
        results.extend(
            self.rt.block_on(join_all(
                self.workers
                    .iter()
                    .zip(&calls)
                    .skip(skip)
                    .map(|(w, c)| call_typed::<RewardProtocol>(w, c, MODEL_TIMEOUT)),
            )),
        );
        let mut bytes = 0;
        for (i, result) in results.into_iter().enumerate() {
            let result = if lost(&result) {
                self.replace(i)?;
                match &calls[i] {
                    RewardCall::Offload { .. } => self.rt.block_on(call_typed::<RewardProtocol>(
                        &self.workers[i],
                        &calls[i],
                        MODEL_TIMEOUT,
                    )),
                    _ => Ok(RewardReply::Moved { bytes: 0 }),
                }
            } else {
                result
            };
            bytes += moved(result.map_err(setup_err)?)?;
        }
        Ok(bytes)
    }
}

fn lost(result: &Result<RewardReply, WorkerError>) -> bool {
    matches!(
        result,
        Err(WorkerError::Died { .. } | WorkerError::Timeout { .. } | WorkerError::Protocol { .. })
    )
}

fn moved(reply: RewardReply) -> Result<u64, RunError> {
    match reply {
        RewardReply::Moved { bytes } => Ok(bytes),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(reply: &RewardReply) -> RunError {
    RunError::Setup(format!(
        "a reward worker gave an unexpected reply: {reply:?}"
    ))
}

/// The reward role shared by the rollout, which scores through it, and time-sharing, which moves
/// its judges: both run on the trainer's side, one after the other, so the lock is never
/// contended for long; it only keeps a move from overlapping a scoring call.
#[derive(Clone)]
pub struct SharedScorer(Arc<Mutex<RewardScorer>>);

impl SharedScorer {
    pub fn new(scorer: RewardScorer) -> SharedScorer {
        SharedScorer(Arc::new(Mutex::new(scorer)))
    }

    pub fn lock(&self) -> MutexGuard<'_, RewardScorer> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ResidentRole for SharedScorer {
    fn role(&self) -> Role {
        Role::Reward
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        self.lock().offload(host.area.dir())
    }

    fn reload(&mut self, _host: &HostCopy<'_>) -> Result<u64, RunError> {
        self.lock().reload()
    }

    fn in_worker_process(&self) -> bool {
        matches!(*self.lock(), RewardScorer::Pool(_))
    }

    // Events, restarts and shutdown go through the rollout's score link, which owns the scoring.
    fn drain_events(&mut self) -> Vec<WorkerNote> {
        vec![]
    }

    fn restarts(&self) -> usize {
        0
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        vec![]
    }
}
