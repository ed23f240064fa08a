//! Preparing a stored run for `roll-tui resume`: take it over and drop what was recorded after the
//! checkpoint it continues from (those steps are about to be recomputed, identically).

use sqlx::{Row, Sqlite, Transaction};

use super::inserts::insert_event;
use super::liveness::ProcessIdentity;
use super::records::{EventKind, EventRecord};
use super::runs::RunInfo;
use super::series::{Point, decode_into, encode};
use super::{Store, StoreError, now_ms};
use crate::metrics::Series;
use crate::names::Stage;

impl Store {
    /// Take over `run` for a resume from the checkpoint at (`stage`, `step`): mark it running by this
    /// process and delete what was recorded after that point (those steps are about to be recomputed).
    /// Returns how many metric points were dropped.
    pub async fn begin_resume(
        &self,
        run: &RunInfo,
        stage: &str,
        step: u64,
        owner: &ProcessIdentity,
    ) -> Result<u64, StoreError> {
        if run.is_active() {
            return Err(StoreError::Run(format!(
                "run '{}' is still running (pid {}); it cannot be resumed twice",
                run.name,
                run.pid.unwrap_or_default()
            )));
        }
        let later: Vec<&str> = match Stage::parse(stage) {
            Some(s) => s.later().iter().map(|l| l.as_str()).collect(),
            None => {
                return Err(StoreError::Run(format!(
                    "run '{}': its checkpoint is of stage '{stage}', unknown to this version",
                    run.name
                )));
            }
        };
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.err("preparing a resume"))?;
        self.still_as_checked(&mut tx, run).await?;
        let mut dropped = 0u64;
        let series = sqlx::query("SELECT id, stage, points FROM metric_series WHERE run_id = ?")
            .bind(run.id.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err("preparing a resume"))?;
        for s in series {
            let (sid, s_stage, points): (i64, String, i64) = (s.get(0), s.get(1), s.get(2));
            if later.contains(&s_stage.as_str()) {
                dropped += points as u64;
                sqlx::query("DELETE FROM metric_series WHERE id = ?")
                    .bind(sid)
                    .execute(&mut *tx)
                    .await
                    .map_err(self.err("preparing a resume"))?;
                continue;
            }
            if s_stage != stage {
                continue;
            }
            dropped += self.truncate_series(&mut tx, sid, step).await?;
        }
        for table in ["samples", "trajectories", "checkpoints"] {
            let mut sql =
                format!("DELETE FROM {table} WHERE run_id = ? AND ((stage = ? AND step > ?)");
            for s in &later {
                sql.push_str(&format!(" OR stage = '{s}'"));
            }
            sql.push(')');
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(run.id.0)
                .bind(stage)
                .bind(step as i64)
                .execute(&mut *tx)
                .await
                .map_err(self.err("preparing a resume"))?;
        }
        let now = now_ms();
        sqlx::query(
            "UPDATE runs SET status = 'running', error = NULL, updated_at = ?, heartbeat_at = ?, host = ?, \
             pid = ?, process_token = ?, last_stage = ?, last_step = ? WHERE id = ?",
        )
        .bind(now)
        .bind(now)
        .bind(&owner.host)
        .bind(owner.pid as i64)
        .bind(&owner.token)
        .bind(stage)
        .bind(step as i64)
        .bind(run.id.0)
        .execute(&mut *tx)
        .await
        .map_err(self.err("preparing a resume"))?;
        let event = EventRecord::message(
            EventKind::RunResumed,
            format!(
                "resumed from {stage} step {step}; {dropped} metric points recorded after it were dropped \
                 and will be recomputed"
            ),
        );
        insert_event(self, &mut tx, Some(run.id), &event, now).await?;
        tx.commit().await.map_err(self.err("preparing a resume"))?;
        Ok(dropped)
    }

    /// Under the write lock, the row must still be what the caller checked: otherwise another
    /// `resume` (or the run itself) got there first, and two processes would train one run.
    async fn still_as_checked(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        run: &RunInfo,
    ) -> Result<(), StoreError> {
        let now_row = sqlx::query("SELECT status, heartbeat_at, pid FROM runs WHERE id = ?")
            .bind(run.id.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(self.err("preparing a resume"))?;
        let unchanged = now_row.is_some_and(|r| {
            r.get::<String, _>(0) == run.status.as_str()
                && r.get::<i64, _>(1) == run.heartbeat_at
                && r.get::<Option<i64>, _>(2) == run.pid.map(i64::from)
        });
        if !unchanged {
            return Err(StoreError::Run(format!(
                "run '{}' changed while this resume was getting ready (another process resumed or \
                 deleted it); check 'roll-tui runs'",
                run.name
            )));
        }
        Ok(())
    }

    /// Drop the points of series `sid` after `step` (rewriting the chunk that straddles it) and
    /// refresh the series' summary; returns how many points were dropped.
    async fn truncate_series(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        sid: i64,
        step: u64,
    ) -> Result<u64, StoreError> {
        let mut dropped = 0u64;
        let chunks =
            sqlx::query("SELECT id, data FROM metric_chunks WHERE series_id = ? AND last_step > ?")
                .bind(sid)
                .bind(step as i64)
                .fetch_all(&mut **tx)
                .await
                .map_err(self.err("preparing a resume"))?;
        for c in chunks {
            let (cid, data): (i64, Vec<u8>) = (c.get(0), c.get(1));
            let mut decoded = Series::default();
            decode_into(&data, &mut decoded).ok_or_else(|| StoreError::Corrupt {
                path: self.path().into(),
                detail: format!("metric chunk {cid} has a partial point"),
            })?;
            let kept: Vec<Point> = (0..decoded.len())
                .filter(|&i| decoded.steps[i] <= step)
                .map(|i| Point {
                    step: decoded.steps[i],
                    wall_time: decoded.wall_time[i],
                    value: decoded.values[i],
                })
                .collect();
            dropped += (decoded.len() - kept.len()) as u64;
            let q = match (kept.first(), kept.last()) {
                (Some(first), Some(last)) => sqlx::query(
                    "UPDATE metric_chunks SET first_step = ?, last_step = ?, points = ?, data = ? WHERE id = ?",
                )
                .bind(first.step as i64)
                .bind(last.step as i64)
                .bind(kept.len() as i64)
                .bind(encode(&kept))
                .bind(cid),
                _ => sqlx::query("DELETE FROM metric_chunks WHERE id = ?").bind(cid),
            };
            q.execute(&mut **tx)
                .await
                .map_err(self.err("preparing a resume"))?;
        }
        // Refresh the series summary from what is left.
        let last = sqlx::query(
            "SELECT data FROM metric_chunks WHERE series_id = ? ORDER BY last_step DESC, id DESC LIMIT 1",
        )
        .bind(sid)
        .fetch_optional(&mut **tx)
        .await
        .map_err(self.err("preparing a resume"))?;
        let mut tail = Series::default();
        if let Some(row) = last {
            decode_into(row.get::<&[u8], _>(0), &mut tail);
        }
        sqlx::query(
            "UPDATE metric_series SET points = (SELECT COALESCE(SUM(points), 0) FROM metric_chunks \
             WHERE series_id = ?1), last_step = ?2, last_value = ?3 WHERE id = ?1",
        )
        .bind(sid)
        .bind(tail.steps.last().map(|s| *s as i64))
        .bind(tail.values.last().copied())
        .execute(&mut **tx)
        .await
        .map_err(self.err("preparing a resume"))?;
        Ok(dropped)
    }
}
