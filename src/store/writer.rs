//! The single writer: one task owns all writes, takes whatever is queued (up to a batch limit) and
//! writes it in one `BEGIN IMMEDIATE` transaction, so throughput grows with load while an idle queue is
//! committed at once (group commit). Producers hold a [`WriterHandle`]; its queue is bounded, and the
//! time a producer waits for room is counted, so back-pressure shows up as a metric instead of as
//! unbounded memory.

mod task;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::records::{EventRecord, TrajectoryRecord};
use super::{RunId, RunStatus, Store, StoreError};
use crate::metrics::{CheckpointRecord, SampleRecord};
use task::{WriterState, run_writer};

/// Queue length in messages (a message is one step's metrics, one batch of samples, ...).
pub const QUEUE_CAPACITY: usize = 1024;
/// A transaction stops taking messages after this many metric points or rows.
pub(crate) const MAX_BATCH_ROWS: usize = 100_000;

pub(crate) enum Op {
    Metrics {
        run: RunId,
        stage: String,
        step: u64,
        wall_time: f64,
        points: Vec<(String, f64)>,
    },
    Samples(RunId, Vec<SampleRecord>),
    Trajectory(RunId, TrajectoryRecord),
    Checkpoint(RunId, CheckpointRecord),
    Event(Option<RunId>, EventRecord),
    Status(RunId, RunStatus, Option<String>),
    /// Heartbeats are written for these runs until their status leaves `running`.
    Own(RunId),
    Flush(oneshot::Sender<Result<(), String>>),
}

impl Op {
    pub(crate) fn rows(&self) -> usize {
        match self {
            Op::Metrics { points, .. } => points.len(),
            Op::Samples(_, s) => s.len(),
            Op::Trajectory(_, t) => 1 + t.turns.len(),
            _ => 1,
        }
    }
}

#[derive(Default)]
pub(crate) struct Shared {
    /// Nanoseconds producers spent waiting for room in the queue.
    pub(crate) blocked_ns: AtomicU64,
    /// The first write error; every later call reports it.
    pub(crate) failure: Mutex<Option<String>>,
}

/// Cheap to clone; usable from plain threads (`*_blocking`) and from async code.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Op>,
    shared: Arc<Shared>,
}

impl WriterHandle {
    /// The writer is gone: say why, if it recorded a failure.
    fn exited(&self) -> StoreError {
        match self.shared.failure.lock().ok().and_then(|f| f.clone()) {
            Some(e) => StoreError::Writer(e),
            None => StoreError::Writer("the writer task has exited".into()),
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        match self.shared.failure.lock().map(|f| f.clone()) {
            Ok(Some(e)) => Err(StoreError::Writer(e)),
            Ok(None) => Ok(()),
            Err(_) => Err(StoreError::Writer("writer state poisoned".into())),
        }
    }

    /// Queue `op` from a thread outside the async runtime, waiting for room if the queue is full.
    fn send_blocking(&self, op: Op) -> Result<(), StoreError> {
        self.check()?;
        match self.tx.try_send(op) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(op)) => {
                let t0 = Instant::now();
                let sent = self.tx.blocking_send(op);
                self.shared
                    .blocked_ns
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                sent.map_err(|_| self.exited())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.exited()),
        }
    }

    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.check()?;
        let t0 = Instant::now();
        let sent = self.tx.send(op).await;
        self.shared
            .blocked_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        sent.map_err(|_| self.exited())
    }

    /// Seconds producers have waited for queue room since the last call (the back-pressure metric).
    pub fn take_blocked_secs(&self) -> f64 {
        self.shared.blocked_ns.swap(0, Ordering::Relaxed) as f64 * 1e-9
    }

    /// Messages waiting in the queue.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub fn metrics_blocking(
        &self,
        run: RunId,
        stage: &str,
        step: u64,
        wall_time: f64,
        points: Vec<(String, f64)>,
    ) -> Result<(), StoreError> {
        self.send_blocking(Op::Metrics {
            run,
            stage: stage.into(),
            step,
            wall_time,
            points,
        })
    }

    pub async fn metrics(
        &self,
        run: RunId,
        stage: &str,
        step: u64,
        wall_time: f64,
        points: Vec<(String, f64)>,
    ) -> Result<(), StoreError> {
        self.send(Op::Metrics {
            run,
            stage: stage.into(),
            step,
            wall_time,
            points,
        })
        .await
    }

    pub fn samples_blocking(
        &self,
        run: RunId,
        samples: Vec<SampleRecord>,
    ) -> Result<(), StoreError> {
        self.send_blocking(Op::Samples(run, samples))
    }

    pub fn trajectory_blocking(&self, run: RunId, t: TrajectoryRecord) -> Result<(), StoreError> {
        self.send_blocking(Op::Trajectory(run, t))
    }

    pub fn checkpoint_blocking(&self, run: RunId, c: CheckpointRecord) -> Result<(), StoreError> {
        self.send_blocking(Op::Checkpoint(run, c))
    }

    pub fn event_blocking(&self, run: Option<RunId>, e: EventRecord) -> Result<(), StoreError> {
        self.send_blocking(Op::Event(run, e))
    }

    pub fn status_blocking(
        &self,
        run: RunId,
        status: RunStatus,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.send_blocking(Op::Status(run, status, error))
    }

    pub async fn status(&self, run: RunId, status: RunStatus) -> Result<(), StoreError> {
        self.send(Op::Status(run, status, None)).await
    }

    /// Keep `run`'s heartbeat fresh while this writer lives.
    pub fn own_blocking(&self, run: RunId) -> Result<(), StoreError> {
        self.send_blocking(Op::Own(run))
    }

    /// Wait until everything queued before this call is committed.
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send_blocking(Op::Flush(tx))?;
        rx.blocking_recv()
            .map_err(|_| self.exited())?
            .map_err(StoreError::Writer)
    }

    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Flush(tx)).await?;
        rx.await
            .map_err(|_| self.exited())?
            .map_err(StoreError::Writer)
    }
}

impl Store {
    /// Start the writer task on the current tokio runtime. It stops when every handle is dropped,
    /// after committing what was queued.
    pub fn spawn_writer(&self) -> (WriterHandle, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let shared = Arc::new(Shared::default());
        let state = WriterState::new(self.clone());
        let task = tokio::spawn(run_writer(state, rx, shared.clone()));
        (WriterHandle { tx, shared }, task)
    }
}
