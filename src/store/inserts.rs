//! Row inserts shared by the writer task and by the few direct writes (run creation, resume).

use sqlx::{Sqlite, Transaction};

use super::records::{EventRecord, TrajectoryRecord};
use super::{RunId, Store, StoreError};
use crate::metrics::SampleRecord;

pub(crate) async fn insert_samples(
    store: &Store,
    tx: &mut Transaction<'static, Sqlite>,
    run: RunId,
    samples: &[SampleRecord],
) -> Result<(), StoreError> {
    for s in samples {
        let breakdown = serde_json::to_string(&s.breakdown)
            .map_err(|e| StoreError::Writer(format!("encoding a reward breakdown: {e}")))?;
        let tokens = match &s.tokens {
            Some(t) => Some(
                serde_json::to_string(t)
                    .map_err(|e| StoreError::Writer(format!("encoding a sample's tokens: {e}")))?,
            ),
            None => None,
        };
        sqlx::query(
            "INSERT INTO samples (run_id, stage, step, domain, prompt, response, ground_truth, \
             prompt_tokens, response_tokens, reward, correct, reward_breakdown, advantage, \
             policy_version, finish_reason, tokens) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        .bind(tokens)
        .execute(&mut **tx)
        .await
        .map_err(store.err("writing samples"))?;
    }
    Ok(())
}

pub(crate) async fn insert_trajectory(
    store: &Store,
    tx: &mut Transaction<'static, Sqlite>,
    run: RunId,
    t: &TrajectoryRecord,
) -> Result<(), StoreError> {
    let total: f64 = t.turns.iter().map(|u| u.reward).sum();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO trajectories (run_id, stage, step, env, env_seed, policy_version, total_reward, \
         success, group_index, episode_index, end_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         RETURNING id",
    )
    .bind(run.0)
    .bind(&t.stage)
    .bind(t.step as i64)
    .bind(&t.env)
    .bind(t.env_seed as i64)
    .bind(t.policy_version as i64)
    .bind(total)
    .bind(t.success)
    .bind(t.group as i64)
    .bind(t.episode as i64)
    .bind(&t.end_reason)
    .fetch_one(&mut **tx)
    .await
    .map_err(store.err("writing a trajectory"))?;
    for (i, u) in t.turns.iter().enumerate() {
        let tokens = match &u.tokens {
            Some(t) => Some(
                serde_json::to_string(t)
                    .map_err(|e| StoreError::Writer(format!("encoding a turn's tokens: {e}")))?,
            ),
            None => None,
        };
        sqlx::query(
            "INSERT INTO turns (trajectory_id, turn, observation, action_text, parsed_action, reward, \
             done, prompt_tokens, response_tokens, info, tokens) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        .bind(serde_json::Value::Object(u.info.clone()).to_string())
        .bind(tokens)
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
        "INSERT INTO events (run_id, at, kind, role, worker_index, pid, phase, run_status, worker, \
         device, bytes, duration_s, node, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(run.map(|r| r.0))
    .bind(at)
    .bind(e.kind.as_str())
    .bind(&e.role)
    .bind(e.worker_index.map(i64::from))
    .bind(e.pid.map(i64::from))
    .bind(&e.phase)
    .bind(&e.run_status)
    .bind(&e.worker)
    .bind(&e.device)
    .bind(e.bytes.map(|b| b as i64))
    .bind(e.duration_s)
    .bind(&e.node)
    .bind(&e.message)
    .execute(&mut **tx)
    .await
    .map_err(store.err("writing an event"))?;
    Ok(())
}
