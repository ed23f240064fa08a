//! The single writer: one task owns all writes, takes whatever is queued (up to a batch limit) and
//! writes it in one `BEGIN IMMEDIATE` transaction, so throughput grows with load while an idle queue is
//! committed at once (group commit). Producers hold a [`WriterHandle`]; its queue is bounded, and the
//! time a producer waits for room is counted, so back-pressure shows up as a metric instead of as
//! unbounded memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::liveness::HEARTBEAT_EVERY_MS;
use super::series::{CHUNK_POINTS, Point, encode};
use super::{RunId, RunStatus, Store, StoreError, now_ms};
use crate::metrics::{CheckpointRecord, SampleRecord};

/// Queue length in messages (a message is one step's metrics, one batch of samples, ...).
pub const QUEUE_CAPACITY: usize = 1024;
/// A transaction stops taking messages after this many metric points or rows.
const MAX_BATCH_ROWS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RunStarted,
    RunResumed,
    RunEnded,
    WorkerStarted,
    WorkerExited,
    WorkerFailed,
    Offload,
    Reload,
    Info,
    Warning,
    Error,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run_started",
            EventKind::RunResumed => "run_resumed",
            EventKind::RunEnded => "run_ended",
            EventKind::WorkerStarted => "worker_started",
            EventKind::WorkerExited => "worker_exited",
            EventKind::WorkerFailed => "worker_failed",
            EventKind::Offload => "offload",
            EventKind::Reload => "reload",
            EventKind::Info => "info",
            EventKind::Warning => "warning",
            EventKind::Error => "error",
        }
    }
}

/// A scheduler, worker or run event (offload/reload carry bytes and duration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub kind: EventKind,
    pub worker: Option<String>,
    pub device: Option<String>,
    pub bytes: Option<u64>,
    pub duration_s: Option<f64>,
    pub message: String,
}

impl EventRecord {
    pub fn message(kind: EventKind, message: impl Into<String>) -> Self {
        EventRecord {
            kind,
            worker: None,
            device: None,
            bytes: None,
            duration_s: None,
            message: message.into(),
        }
    }
}

/// One turn of an agentic episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub observation: String,
    pub action_text: String,
    /// `None` when the action text could not be parsed.
    pub parsed_action: Option<String>,
    pub reward: f64,
    pub done: bool,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
}

/// One agentic episode, turn by turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub stage: String,
    pub step: usize,
    pub env: String,
    pub env_seed: u64,
    pub policy_version: usize,
    pub success: bool,
    pub turns: Vec<TurnRecord>,
}

enum Op {
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
    fn rows(&self) -> usize {
        match self {
            Op::Metrics { points, .. } => points.len(),
            Op::Samples(_, s) => s.len(),
            Op::Trajectory(_, t) => 1 + t.turns.len(),
            _ => 1,
        }
    }
}

#[derive(Default)]
struct Shared {
    /// Nanoseconds producers spent waiting for room in the queue.
    blocked_ns: AtomicU64,
    /// The first write error; every later call reports it.
    failure: Mutex<Option<String>>,
}

/// Cheap to clone; usable from plain threads (`*_blocking`) and from async code.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Op>,
    shared: Arc<Shared>,
}

impl WriterHandle {
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
                sent.map_err(|_| StoreError::Writer("the writer task has exited".into()))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(StoreError::Writer("the writer task has exited".into()))
            }
        }
    }

    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.check()?;
        let t0 = Instant::now();
        let sent = self.tx.send(op).await;
        self.shared
            .blocked_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        sent.map_err(|_| StoreError::Writer("the writer task has exited".into()))
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
            .map_err(|_| StoreError::Writer("the writer task has exited".into()))?
            .map_err(StoreError::Writer)
    }

    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Flush(tx)).await?;
        rx.await
            .map_err(|_| StoreError::Writer("the writer task has exited".into()))?
            .map_err(StoreError::Writer)
    }
}

/// The tail chunk of a series: rewritten in place until it holds [`CHUNK_POINTS`] points.
struct Tail {
    chunk_id: Option<i64>,
    points: Vec<Point>,
}

struct SeriesState {
    id: i64,
    tail: Tail,
}

struct WriterState {
    store: Store,
    series: HashMap<(RunId, String, String), SeriesState>,
    owned: Vec<RunId>,
}

impl Store {
    /// Start the writer task on the current tokio runtime. It stops when every handle is dropped,
    /// after committing what was queued.
    pub fn spawn_writer(&self) -> (WriterHandle, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let shared = Arc::new(Shared::default());
        let state = WriterState {
            store: self.clone(),
            series: HashMap::new(),
            owned: vec![],
        };
        let task = tokio::spawn(run_writer(state, rx, shared.clone()));
        (WriterHandle { tx, shared }, task)
    }
}

async fn run_writer(mut state: WriterState, mut rx: mpsc::Receiver<Op>, shared: Arc<Shared>) {
    let mut heartbeat = tokio::time::interval(Duration::from_millis(HEARTBEAT_EVERY_MS));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            op = rx.recv() => match op {
                Some(op) => op,
                None => break,
            },
            _ = heartbeat.tick() => {
                if let Err(e) = state.beat().await {
                    fail(&shared, &e);
                }
                continue;
            }
        };
        let mut rows = first.rows();
        let mut batch = vec![first];
        while rows < MAX_BATCH_ROWS {
            match rx.try_recv() {
                Ok(op) => {
                    rows += op.rows();
                    batch.push(op);
                }
                Err(_) => break,
            }
        }
        let mut acks = vec![];
        let result = if shared.failure.lock().map(|f| f.is_some()).unwrap_or(true) {
            Err(StoreError::Writer("an earlier write failed".into()))
        } else {
            state.write(batch, &mut acks).await
        };
        if let Err(e) = &result {
            fail(&shared, e);
        }
        let outcome = result.map_err(|e| e.to_string());
        for ack in acks {
            let _ = ack.send(outcome.clone());
        }
    }
}

fn fail(shared: &Shared, e: &StoreError) {
    if let Ok(mut f) = shared.failure.lock() {
        f.get_or_insert_with(|| e.to_string());
    }
}

impl WriterState {
    async fn beat(&mut self) -> Result<(), StoreError> {
        if self.owned.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        let now = now_ms();
        for run in &self.owned {
            sqlx::query("UPDATE runs SET heartbeat_at = ? WHERE id = ?")
                .bind(now)
                .bind(run.0)
                .execute(&mut *tx)
                .await
                .map_err(self.store.err("writing a heartbeat"))?;
        }
        tx.commit()
            .await
            .map_err(self.store.err("writing a heartbeat"))
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.store
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.store.err("starting a write"))
    }

    async fn write(
        &mut self,
        batch: Vec<Op>,
        acks: &mut Vec<oneshot::Sender<Result<(), String>>>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        // Metric points are gathered per series so each series gets one chunk write per batch.
        let mut pending: Vec<((RunId, String, String), Vec<Point>)> = vec![];
        let mut pending_at: HashMap<(RunId, String, String), usize> = HashMap::new();
        let mut touched_runs: HashMap<RunId, (String, u64)> = HashMap::new();
        for op in batch {
            match op {
                Op::Metrics {
                    run,
                    stage,
                    step,
                    wall_time,
                    points,
                } => {
                    let entry = touched_runs.entry(run).or_insert((stage.clone(), step));
                    *entry = (stage.clone(), step);
                    for (key, value) in points {
                        let id = (run, stage.clone(), key);
                        let at = match pending_at.get(&id) {
                            Some(&at) => at,
                            None => {
                                pending_at.insert(id.clone(), pending.len());
                                pending.push((id, vec![]));
                                pending.len() - 1
                            }
                        };
                        pending[at].1.push(Point {
                            step,
                            wall_time,
                            value,
                        });
                    }
                }
                Op::Samples(run, samples) => {
                    insert_samples(&self.store, &mut tx, run, &samples).await?
                }
                Op::Trajectory(run, t) => insert_trajectory(&self.store, &mut tx, run, &t).await?,
                Op::Checkpoint(run, c) => {
                    sqlx::query(
                        "INSERT INTO checkpoints (run_id, stage, step, path, bytes, created_at) \
                         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, stage, step) DO UPDATE SET \
                         path = excluded.path, bytes = excluded.bytes, created_at = excluded.created_at",
                    )
                    .bind(run.0)
                    .bind(&c.stage)
                    .bind(c.step as i64)
                    .bind(c.path.to_string_lossy().into_owned())
                    .bind(c.bytes as i64)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(self.store.err("recording a checkpoint"))?;
                }
                Op::Event(run, e) => insert_event(&self.store, &mut tx, run, &e, now).await?,
                Op::Status(run, status, error) => {
                    sqlx::query(
                        "UPDATE runs SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                    )
                    .bind(status.as_str())
                    .bind(error)
                    .bind(now)
                    .bind(run.0)
                    .execute(&mut *tx)
                    .await
                    .map_err(self.store.err("updating a run's status"))?;
                    if status != RunStatus::Running {
                        self.owned.retain(|r| *r != run);
                    }
                }
                Op::Own(run) => {
                    if !self.owned.contains(&run) {
                        self.owned.push(run);
                    }
                }
                Op::Flush(ack) => acks.push(ack),
            }
        }
        for (id, points) in pending {
            self.append_points(&mut tx, id, points).await?;
        }
        for (run, (stage, step)) in touched_runs {
            sqlx::query(
                "UPDATE runs SET last_stage = ?, last_step = ?, updated_at = ?, heartbeat_at = ? WHERE id = ?",
            )
            .bind(stage)
            .bind(step as i64)
            .bind(now)
            .bind(now)
            .bind(run.0)
            .execute(&mut *tx)
            .await
            .map_err(self.store.err("updating a run"))?;
        }
        tx.commit()
            .await
            .map_err(self.store.err("committing a batch"))
    }

    async fn append_points(
        &mut self,
        tx: &mut Transaction<'static, Sqlite>,
        id: (RunId, String, String),
        points: Vec<Point>,
    ) -> Result<(), StoreError> {
        if !self.series.contains_key(&id) {
            let (run, stage, key) = &id;
            let series_id: i64 = sqlx::query_scalar(
                "INSERT INTO metric_series (run_id, stage, key) VALUES (?, ?, ?) \
                 ON CONFLICT (run_id, stage, key) DO UPDATE SET key = excluded.key RETURNING id",
            )
            .bind(run.0)
            .bind(stage)
            .bind(key)
            .fetch_one(&mut **tx)
            .await
            .map_err(self.store.err("creating a metric series"))?;
            self.series.insert(
                id.clone(),
                SeriesState {
                    id: series_id,
                    tail: Tail {
                        chunk_id: None,
                        points: vec![],
                    },
                },
            );
        }
        let store = self.store.clone();
        let Some(state) = self.series.get_mut(&id) else {
            return Ok(());
        };
        let Some(last) = points.last().copied() else {
            return Ok(());
        };
        let added = points.len() as i64;
        let mut rest = &points[..];
        while !rest.is_empty() {
            if state.tail.points.len() >= CHUNK_POINTS {
                state.tail = Tail {
                    chunk_id: None,
                    points: vec![],
                };
            }
            let room = CHUNK_POINTS - state.tail.points.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            state.tail.points.extend_from_slice(now);
            rest = later;
            let data = encode(&state.tail.points);
            let first = state.tail.points[0].step as i64;
            let last_step = state.tail.points[state.tail.points.len() - 1].step as i64;
            let n = state.tail.points.len() as i64;
            match state.tail.chunk_id {
                Some(chunk) => {
                    sqlx::query(
                        "UPDATE metric_chunks SET last_step = ?, points = ?, data = ? WHERE id = ?",
                    )
                    .bind(last_step)
                    .bind(n)
                    .bind(data)
                    .bind(chunk)
                    .execute(&mut **tx)
                    .await
                    .map_err(store.err("writing metric points"))?;
                }
                None => {
                    let chunk: i64 = sqlx::query_scalar(
                        "INSERT INTO metric_chunks (series_id, first_step, last_step, points, data) \
                         VALUES (?, ?, ?, ?, ?) RETURNING id",
                    )
                    .bind(state.id)
                    .bind(first)
                    .bind(last_step)
                    .bind(n)
                    .bind(data)
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(store.err("writing metric points"))?;
                    state.tail.chunk_id = Some(chunk);
                }
            }
        }
        sqlx::query(
            "UPDATE metric_series SET points = points + ?, last_step = ?, last_value = ? WHERE id = ?",
        )
        .bind(added)
        .bind(last.step as i64)
        .bind(last.value)
        .bind(state.id)
        .execute(&mut **tx)
        .await
        .map_err(store.err("writing metric points"))?;
        Ok(())
    }
}

async fn insert_samples(
    store: &Store,
    tx: &mut Transaction<'static, Sqlite>,
    run: RunId,
    samples: &[SampleRecord],
) -> Result<(), StoreError> {
    for s in samples {
        let breakdown = serde_json::to_string(&s.breakdown)
            .map_err(|e| StoreError::Writer(format!("encoding a reward breakdown: {e}")))?;
        sqlx::query(
            "INSERT INTO samples (run_id, stage, step, domain, prompt, response, ground_truth, \
             prompt_tokens, response_tokens, reward, correct, reward_breakdown, advantage, \
             policy_version, finish_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run.0)
        .bind(&s.stage)
        .bind(s.step as i64)
        .bind(&s.domain)
        .bind(&s.prompt)
        .bind(&s.response)
        .bind(&s.ground_truth)
        .bind(s.prompt_tokens as i64)
        .bind(s.response_tokens as i64)
        .bind(s.reward as f64)
        .bind(s.correct)
        .bind(breakdown)
        .bind(s.advantage as f64)
        .bind(s.policy_version as i64)
        .bind(&s.finish_reason)
        .execute(&mut **tx)
        .await
        .map_err(store.err("writing samples"))?;
    }
    Ok(())
}

async fn insert_trajectory(
    store: &Store,
    tx: &mut Transaction<'static, Sqlite>,
    run: RunId,
    t: &TrajectoryRecord,
) -> Result<(), StoreError> {
    let total: f64 = t.turns.iter().map(|u| u.reward).sum();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO trajectories (run_id, stage, step, env, env_seed, policy_version, total_reward, \
         success) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(run.0)
    .bind(&t.stage)
    .bind(t.step as i64)
    .bind(&t.env)
    .bind(t.env_seed as i64)
    .bind(t.policy_version as i64)
    .bind(total)
    .bind(t.success)
    .fetch_one(&mut **tx)
    .await
    .map_err(store.err("writing a trajectory"))?;
    for (i, u) in t.turns.iter().enumerate() {
        sqlx::query(
            "INSERT INTO turns (trajectory_id, turn, observation, action_text, parsed_action, reward, \
             done, prompt_tokens, response_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(i as i64)
        .bind(&u.observation)
        .bind(&u.action_text)
        .bind(&u.parsed_action)
        .bind(u.reward)
        .bind(u.done)
        .bind(u.prompt_tokens as i64)
        .bind(u.response_tokens as i64)
        .execute(&mut **tx)
        .await
        .map_err(store.err("writing a turn"))?;
    }
    Ok(())
}

pub(crate) async fn insert_event(
    store: &Store,
    tx: &mut Transaction<'static, Sqlite>,
    run: Option<RunId>,
    e: &EventRecord,
    at: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO events (run_id, at, kind, worker, device, bytes, duration_s, message) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(run.map(|r| r.0))
    .bind(at)
    .bind(e.kind.as_str())
    .bind(&e.worker)
    .bind(&e.device)
    .bind(e.bytes.map(|b| b as i64))
    .bind(e.duration_s)
    .bind(&e.message)
    .execute(&mut **tx)
    .await
    .map_err(store.err("writing an event"))?;
    Ok(())
}
