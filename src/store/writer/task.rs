//! The writer task: group commit of whatever is queued, chunked metric appends, heartbeats.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Sqlite, Transaction};
use tokio::sync::mpsc;

use super::super::inserts::{insert_event, insert_samples, insert_trajectory};
use super::super::liveness::HEARTBEAT_EVERY_MS;
use super::super::series::{CHUNK_POINTS, Point, encode};
use super::super::{RunId, RunStatus, Store, StoreError, now_ms};
use super::{MAX_BATCH_ROWS, Op, Shared};

/// The tail chunk of a series: rewritten in place until it holds [`CHUNK_POINTS`] points.
struct Tail {
    chunk_id: Option<i64>,
    points: Vec<Point>,
}

struct SeriesState {
    id: i64,
    tail: Tail,
}

pub(crate) struct WriterState {
    store: Store,
    series: HashMap<(RunId, String, String), SeriesState>,
    owned: Vec<RunId>,
}

pub(crate) async fn run_writer(
    mut state: WriterState,
    mut rx: mpsc::Receiver<Op>,
    shared: Arc<Shared>,
) {
    let mut heartbeat = tokio::time::interval(Duration::from_millis(HEARTBEAT_EVERY_MS));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            op = rx.recv() => match op {
                Some(op) => op,
                None => break,
            },
            _ = heartbeat.tick() => {
                // A missed heartbeat only delays dead-run detection; a lasting problem surfaces
                // in the next real write.
                let _ = state.beat().await;
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
        // Flush requests are answered after the batch, with its outcome.
        let (mut acks, mut ops) = (vec![], Vec::with_capacity(batch.len()));
        for op in batch {
            match op {
                Op::Flush(ack) => acks.push(ack),
                op => ops.push(op),
            }
        }
        let earlier = shared.failure.lock().ok().and_then(|f| f.clone());
        let result = match earlier {
            Some(e) => Err(StoreError::Writer(format!("an earlier write failed: {e}"))),
            None => state.write_retrying(&ops).await,
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

/// Attempts for a batch that finds the store busy (each after SQLite's own busy timeout).
const BUSY_ATTEMPTS: u32 = 3;

fn fail(shared: &Shared, e: &StoreError) {
    if let Ok(mut f) = shared.failure.lock() {
        f.get_or_insert_with(|| e.to_string());
    }
}

impl WriterState {
    pub(crate) fn new(store: Store) -> Self {
        WriterState {
            store,
            series: HashMap::new(),
            owned: vec![],
        }
    }

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

    /// Write `ops` in one transaction; a busy store (another process holding the write lock past the
    /// busy timeout) is retried, anything else fails the writer.
    async fn write_retrying(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let mut attempt = 1;
        loop {
            match self.write(ops).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // The transaction rolled back: forget tails and series ids it may have created.
                    self.series.clear();
                    if !matches!(e, StoreError::Busy { .. }) || attempt == BUSY_ATTEMPTS {
                        return Err(e);
                    }
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
            }
        }
    }

    async fn write(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        // Metric points are gathered per series so each series gets one chunk write per batch.
        let mut pending: Vec<((RunId, String, String), Vec<Point>)> = vec![];
        let mut pending_at: HashMap<(RunId, String, String), usize> = HashMap::new();
        let mut touched_runs: HashMap<RunId, (String, u64)> = HashMap::new();
        for op in ops {
            match op {
                Op::Metrics {
                    run,
                    stage,
                    step,
                    wall_time,
                    points,
                } => {
                    let (run, step, wall_time) = (*run, *step, *wall_time);
                    touched_runs.insert(run, (stage.clone(), step));
                    for (key, value) in points {
                        let id = (run, stage.clone(), key.clone());
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
                            value: *value,
                        });
                    }
                }
                Op::Samples(run, samples) => {
                    insert_samples(&self.store, &mut tx, *run, samples).await?
                }
                Op::Trajectory(run, t) => insert_trajectory(&self.store, &mut tx, *run, t).await?,
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
                Op::Event(run, e) => insert_event(&self.store, &mut tx, *run, e, now).await?,
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
                    if *status != RunStatus::Running {
                        self.owned.retain(|r| r != run);
                    }
                }
                Op::Own(run) => {
                    if !self.owned.contains(run) {
                        self.owned.push(*run);
                    }
                }
                // Answered by the caller after the commit.
                Op::Flush(_) => {}
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
                    let updated = sqlx::query(
                        "UPDATE metric_chunks SET last_step = ?, points = ?, data = ? WHERE id = ?",
                    )
                    .bind(last_step)
                    .bind(n)
                    .bind(data)
                    .bind(chunk)
                    .execute(&mut **tx)
                    .await
                    .map_err(store.err("writing metric points"))?;
                    if updated.rows_affected() != 1 {
                        // Deleted underneath us (a resume or `runs rm` by another process).
                        return Err(StoreError::Writer(format!(
                            "metric chunk {chunk} of '{}' disappeared while the run was writing",
                            id.2
                        )));
                    }
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
