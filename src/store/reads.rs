//! Reading samples, trajectories, checkpoints and events back (for the CLI, export, replay and resume).

use std::collections::BTreeMap;
use std::path::PathBuf;

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::records::{EventKind, EventRecord, TrajectoryRecord, TurnRecord};
use super::{RunId, Store, StoreError};
use crate::metrics::{CheckpointRecord, SampleRecord};

/// Which samples to read.
#[derive(Debug, Clone, Default)]
pub struct SampleFilter {
    pub stage: Option<String>,
    pub step: Option<u64>,
    pub domain: Option<String>,
    /// Only the samples of this exact prompt (to follow one prompt across steps).
    pub prompt: Option<String>,
    pub limit: Option<u64>,
    /// Within each step, every prompt's first sample before any prompt's second (a page then
    /// shows what the policy wrote to many prompts, not one group's samples); otherwise in the
    /// order they were recorded.
    pub spread: bool,
}

/// The samples of one stage and domain: their step range and count.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleCoverage {
    pub stage: String,
    pub domain: String,
    pub first_step: u64,
    pub last_step: u64,
    pub count: u64,
}

/// Events read from the store, and the last one's id to read on from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventsRead {
    pub events: Vec<StoredEvent>,
    pub last: Option<i64>,
}

/// An event as stored, with its time (Unix ms).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoredEvent {
    pub at: i64,
    #[serde(flatten)]
    pub event: EventRecord,
}

fn sample_from_row(r: &SqliteRow) -> SampleRecord {
    let breakdown: String = r.get("reward_breakdown");
    SampleRecord {
        stage: r.get("stage"),
        step: r.get::<i64, _>("step") as usize,
        domain: r.get("domain"),
        prompt: r.get("prompt"),
        response: r.get("response"),
        ground_truth: r.get("ground_truth"),
        reward: r.get::<Option<f64>, _>("reward").unwrap_or(f64::NAN) as f32,
        correct: r.get("correct"),
        breakdown: serde_json::from_str::<BTreeMap<String, f64>>(&breakdown).unwrap_or_default(),
        advantage: r.get::<Option<f64>, _>("advantage").unwrap_or(f64::NAN) as f32,
        prompt_tokens: r.get::<i64, _>("prompt_tokens") as usize,
        response_tokens: r.get::<i64, _>("response_tokens") as usize,
        finish_reason: r.get("finish_reason"),
        policy_version: r.get::<i64, _>("policy_version") as usize,
        // A trace that does not parse is shown as none rather than hiding the sample.
        tokens: r
            .get::<Option<String>, _>("tokens")
            .and_then(|t| serde_json::from_str(&t).ok()),
    }
}

impl Store {
    /// Samples in the order they were recorded, or spread over prompts ([`SampleFilter::spread`]).
    pub async fn samples(
        &self,
        run: RunId,
        f: &SampleFilter,
    ) -> Result<Vec<SampleRecord>, StoreError> {
        // The same filter either way; spread orders a step's samples by their rank within their
        // prompt (1, 2, …), each rank in recorded order, steps in the order they were recorded.
        let sql = match f.spread {
            false => concat!(
                "SELECT * FROM samples s WHERE run_id = ?1 AND (?2 IS NULL OR stage = ?2) ",
                "AND (?3 IS NULL OR step = ?3) AND (?4 IS NULL OR domain = ?4) ",
                "AND (?6 IS NULL OR prompt = ?6) ORDER BY id LIMIT ?5"
            ),
            true => concat!(
                "SELECT * FROM samples s WHERE run_id = ?1 AND (?2 IS NULL OR stage = ?2) ",
                "AND (?3 IS NULL OR step = ?3) AND (?4 IS NULL OR domain = ?4) ",
                "AND (?6 IS NULL OR prompt = ?6) ORDER BY ",
                "(SELECT MIN(id) FROM samples f WHERE f.run_id = s.run_id AND f.stage = s.stage ",
                "AND f.step = s.step), ",
                "ROW_NUMBER() OVER (PARTITION BY stage, step, prompt ORDER BY id), id LIMIT ?5"
            ),
        };
        let rows = sqlx::query(sql)
            .bind(run.0)
            .bind(&f.stage)
            .bind(f.step.map(|s| s as i64))
            .bind(&f.domain)
            .bind(f.limit.map(|l| l as i64).unwrap_or(-1))
            .bind(&f.prompt)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading samples"))?;
        Ok(rows.iter().map(sample_from_row).collect())
    }

    /// What a run's samples cover: per stage and domain, the first and last step and the count
    /// (to tell a user which filter values exist).
    pub async fn sample_coverage(&self, run: RunId) -> Result<Vec<SampleCoverage>, StoreError> {
        let rows = sqlx::query(
            "SELECT stage, domain, MIN(step) AS first, MAX(step) AS last, COUNT(*) AS n \
             FROM samples WHERE run_id = ? GROUP BY stage, domain ORDER BY MIN(id)",
        )
        .bind(run.0)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading which samples a run has"))?;
        Ok(rows
            .iter()
            .map(|r| SampleCoverage {
                stage: r.get("stage"),
                domain: r.get("domain"),
                first_step: r.get::<i64, _>("first") as u64,
                last_step: r.get::<i64, _>("last") as u64,
                count: r.get::<i64, _>("n") as u64,
            })
            .collect())
    }

    /// The stage that recorded `run`'s newest sample (`None`: the run has recorded none).
    pub async fn latest_sample_stage(&self, run: RunId) -> Result<Option<String>, StoreError> {
        // Per stage its newest row id, from the (run, stage, step) index (its entries hold
        // the row id): no scan of the table.
        let row = sqlx::query(
            "SELECT stage, MAX(id) AS newest FROM samples WHERE run_id = ? GROUP BY stage \
             ORDER BY newest DESC LIMIT 1",
        )
        .bind(run.0)
        .fetch_optional(self.pool())
        .await
        .map_err(self.err("reading which stage recorded samples"))?;
        Ok(row.map(|r| r.get("stage")))
    }

    /// The steps of `stage` that recorded samples, in order.
    pub async fn sample_steps(&self, run: RunId, stage: &str) -> Result<Vec<u64>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT step FROM samples WHERE run_id = ? AND stage = ? ORDER BY step",
        )
        .bind(run.0)
        .bind(stage)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading sample steps"))?;
        Ok(rows
            .iter()
            .map(|r| r.get::<i64, _>("step") as u64)
            .collect())
    }

    /// The steps that recorded agentic episodes, in order, each with whether they are
    /// evaluation episodes (env `val/<tag>`) or training ones.
    pub async fn trajectory_steps(&self, run: RunId) -> Result<Vec<(u64, bool)>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT step, env LIKE 'val/%' AS val FROM trajectories WHERE run_id = ? \
             ORDER BY step, val",
        )
        .bind(run.0)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading trajectory steps"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<i64, _>("step") as u64, r.get::<bool, _>("val")))
            .collect())
    }

    /// Checkpoints in the order a run made them (stage, then step).
    pub async fn checkpoints(&self, run: RunId) -> Result<Vec<CheckpointRecord>, StoreError> {
        let rows = sqlx::query("SELECT stage, step, path, bytes FROM checkpoints WHERE run_id = ?")
            .bind(run.0)
            .fetch_all(self.pool())
            .await
            .map_err(self.err("reading checkpoints"))?;
        let mut out: Vec<CheckpointRecord> = rows
            .iter()
            .map(|r| CheckpointRecord {
                stage: r.get("stage"),
                step: r.get::<i64, _>("step") as usize,
                path: PathBuf::from(r.get::<String, _>("path")),
                bytes: r.get::<i64, _>("bytes") as u64,
            })
            .collect();
        out.sort_by_key(|c| (crate::names::Stage::rank_of(&c.stage), c.step));
        Ok(out)
    }

    pub async fn events(&self, run: RunId) -> Result<Vec<StoredEvent>, StoreError> {
        Ok(self.events_after(run, None).await?.events)
    }

    /// The run's events recorded after the event `after` (all without it), by time. Events are
    /// only ever added while a run exists, so a reader following a run asks with the `last`
    /// of its previous read and gets only the new ones.
    pub async fn events_after(
        &self,
        run: RunId,
        after: Option<i64>,
    ) -> Result<EventsRead, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, kind, role, worker_index, pid, phase, run_status, worker, device, bytes, \
             duration_s, node, message FROM events WHERE run_id = ? AND id > ? ORDER BY at, id",
        )
        .bind(run.0)
        .bind(after.unwrap_or(i64::MIN))
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading events"))?;
        let last = rows.iter().map(|r| r.get::<i64, _>("id")).max().or(after);
        let events = rows
            .iter()
            .map(|r| StoredEvent {
                at: r.get("at"),
                event: EventRecord {
                    kind: EventKind::parse(r.get("kind")).unwrap_or(EventKind::Info),
                    role: r.get("role"),
                    worker_index: r
                        .get::<Option<i64>, _>("worker_index")
                        .and_then(|i| u32::try_from(i).ok()),
                    pid: r
                        .get::<Option<i64>, _>("pid")
                        .and_then(|p| u32::try_from(p).ok()),
                    phase: r.get("phase"),
                    run_status: r.get("run_status"),
                    worker: r.get("worker"),
                    device: r.get("device"),
                    bytes: r.get::<Option<i64>, _>("bytes").map(|b| b as u64),
                    duration_s: r.get("duration_s"),
                    node: r.get("node"),
                    message: r.get("message"),
                },
            })
            .collect();
        Ok(EventsRead { events, last })
    }

    /// Trajectories of one step (all steps when `None`), turns in order.
    pub async fn trajectories(
        &self,
        run: RunId,
        step: Option<u64>,
    ) -> Result<Vec<TrajectoryRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT t.id, t.stage, t.step, t.env, t.env_seed, t.policy_version, t.success, \
             t.group_index, t.episode_index, t.end_reason, u.observation, u.action_text, \
             u.parsed_action, u.reward, u.done, u.prompt_tokens, u.response_tokens, u.info, \
             u.tokens \
             FROM trajectories t LEFT JOIN turns u ON u.trajectory_id = t.id \
             WHERE t.run_id = ?1 AND (?2 IS NULL OR t.step = ?2) ORDER BY t.id, u.turn",
        )
        .bind(run.0)
        .bind(step.map(|s| s as i64))
        .fetch_all(self.pool())
        .await
        .map_err(self.err("reading trajectories"))?;
        let mut out: Vec<(i64, TrajectoryRecord)> = vec![];
        for r in rows {
            let id: i64 = r.get("id");
            if out.last().is_none_or(|(last, _)| *last != id) {
                out.push((
                    id,
                    TrajectoryRecord {
                        stage: r.get("stage"),
                        step: r.get::<i64, _>("step") as usize,
                        env: r.get("env"),
                        env_seed: r.get::<i64, _>("env_seed") as u64,
                        policy_version: r.get::<i64, _>("policy_version") as usize,
                        success: r.get("success"),
                        group: r.get::<i64, _>("group_index") as usize,
                        episode: r.get::<i64, _>("episode_index") as usize,
                        end_reason: r.get("end_reason"),
                        turns: vec![],
                    },
                ));
            }
            if let (Some(observation), Some((_, t))) =
                (r.get::<Option<String>, _>("observation"), out.last_mut())
            {
                t.turns.push(TurnRecord {
                    observation,
                    action_text: r.get("action_text"),
                    parsed_action: r.get("parsed_action"),
                    reward: r.get::<Option<f64>, _>("reward").unwrap_or(f64::NAN),
                    done: r.get("done"),
                    prompt_tokens: r.get::<i64, _>("prompt_tokens") as usize,
                    response_tokens: r.get::<i64, _>("response_tokens") as usize,
                    // Written by this store as a JSON object; anything else reads as no info.
                    info: r
                        .get::<Option<String>, _>("info")
                        .and_then(|text| serde_json::from_str(&text).ok())
                        .unwrap_or_default(),
                    tokens: r
                        .get::<Option<String>, _>("tokens")
                        .and_then(|t| serde_json::from_str(&t).ok()),
                });
            }
        }
        Ok(out.into_iter().map(|(_, t)| t).collect())
    }
}
