//! A debug session as data: a trajectory for the store (the env named `debug/<env>`, so it shows
//! beside a run's episodes and never counts as one of them), and JSON lines for other tools.

use serde_json::{Value, json};

use super::policy::ModelTurn;
use super::session::Session;
use crate::config::EnvConfig;
use crate::metrics::{TrajectoryRecord, TurnRecord};
use crate::store::runs::NewRun;
use crate::store::{RunId, Store, StoreError};

/// The stage and env prefix of saved debug sessions.
pub const DEBUG_STAGE: &str = "debug";

/// Where a saved session goes.
#[derive(Debug, Clone)]
pub enum SaveTarget {
    /// Beside a run's episodes of `step` (a session opened from that run).
    Run {
        run: RunId,
        step: usize,
        group: usize,
    },
    /// A run of its own, created at the first save (`debug-<env>`, numbered when taken).
    NewRun,
}

/// What saving a session writes: its trajectory (step, group and episode set when saved) and
/// what a run of its own records. Owned, so that it can be saved on another thread.
#[derive(Debug, Clone)]
pub struct SaveRequest {
    pub record: TrajectoryRecord,
    /// The env's whole config (parser, penalty, turns), so the saved episode replays as played.
    pub env: EnvConfig,
    pub seed: u64,
}

impl SaveRequest {
    /// `session`, an episode of `env`.
    pub fn of(session: &Session, env: &EnvConfig) -> SaveRequest {
        SaveRequest {
            record: to_record(session, 0, 0, 0),
            env: env.clone(),
            seed: session.seed,
        }
    }
}

/// Where a session was saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub run: RunId,
    pub run_name: String,
    pub step: usize,
    pub episode: usize,
}

/// The session's turns as a stored trajectory.
pub fn to_record(session: &Session, step: usize, group: usize, episode: usize) -> TrajectoryRecord {
    TrajectoryRecord {
        stage: DEBUG_STAGE.into(),
        step,
        env: format!("{DEBUG_STAGE}/{}", session.env_name),
        env_seed: session.seed,
        policy_version: 0,
        success: session.success(),
        group,
        episode,
        end_reason: if session.done() { "done" } else { "stopped" }.into(),
        turns: session
            .turns
            .iter()
            .map(|t| {
                let mut info = t.step.info.clone();
                info.insert("actor".into(), t.actor.as_str().into());
                TurnRecord {
                    observation: t.observation.clone(),
                    action_text: t.output.clone(),
                    parsed_action: t.parsed_action().map(str::to_string),
                    reward: t.step.reward,
                    done: t.step.done,
                    prompt_tokens: t.model.as_ref().map_or(0, |m| m.prompt_tokens),
                    response_tokens: t.model.as_ref().map_or(0, |m| m.output_ids.len()),
                    info,
                    tokens: None,
                }
            })
            .collect(),
    }
}

/// One JSON object per turn: the env, seed and turn, what the policy saw and wrote, the parsed
/// action, reward, done and info; for a model's turn also the prompt and per-token log-probs.
pub fn to_jsonl(session: &Session) -> String {
    let mut out = String::new();
    for (i, t) in session.turns.iter().enumerate() {
        let mut line = json!({
            "env": session.env_name,
            "params": session.params.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "seed": session.seed,
            "turn": i + 1,
            "actor": t.actor.as_str(),
            "observation": t.observation,
            "output": t.output,
            "parsed_action": t.parsed_action(),
            "valid": t.valid(),
            "reward": t.step.reward,
            "done": t.step.done,
            "info": Value::Object(t.step.info.clone()),
            "next_observation": t.step.observation,
        });
        if let Some(m) = &t.model {
            add_model_turn(&mut line, m);
        }
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// A model's turn in a JSON line: its prompt, token count and per-token log-probs and entropy.
pub fn add_model_turn(line: &mut Value, m: &ModelTurn) {
    line["prompt"] = m.prompt_text.clone().into();
    line["prompt_tokens"] = m.prompt_tokens.into();
    line["tokens"] = m
        .tokens
        .iter()
        .map(|k| json!({"token": k.text, "logprob": k.logprob, "entropy": k.entropy}))
        .collect();
}

/// The config a debug run records: enough for `env replay` and the views to rebuild its env.
fn debug_run_config(name: &str, request: &SaveRequest) -> String {
    json!({
        "name": name,
        "seed": request.seed,
        "model": {},
        "rl": {
            "steps": 1, "prompts_per_step": 1, "group_size": 1,
            "env": request.env,
        },
    })
    .to_string()
}

/// Save a session to `store`; `target` is updated to the run it went to, so later saves of the
/// same session go beside the first.
pub async fn save(
    store: &Store,
    request: &SaveRequest,
    target: &mut SaveTarget,
) -> Result<Saved, StoreError> {
    let (run, step, group) = match *target {
        SaveTarget::Run { run, step, group } => (run, step, group),
        SaveTarget::NewRun => {
            let base = format!("debug-{}", request.env.name);
            let mut name = base.clone();
            let mut n = 1;
            while store.find_run(&name).await.is_ok_and(|r| r.name == name) {
                n += 1;
                name = format!("{base}-{n}");
            }
            let config_json = debug_run_config(&name, request);
            let new = NewRun {
                config_hash: format!("{:016x}", crate::env::stable_hash(config_json.as_bytes())),
                config_json,
                name: name.clone(),
                git_revision: None,
                seed: request.seed,
                output_dir: String::new(),
            };
            let run = store.create_debug_run(&new).await?;
            *target = SaveTarget::Run {
                run,
                step: 1,
                group: 0,
            };
            (run, 1, 0)
        }
    };
    let env = format!("{DEBUG_STAGE}/{}", request.env.name);
    let episode = store
        .trajectories(run, Some(step as u64))
        .await?
        .iter()
        .filter(|t| t.env == env && t.group == group)
        .map(|t| t.episode + 1)
        .max()
        .unwrap_or(0);
    let record = TrajectoryRecord {
        step,
        group,
        episode,
        ..request.record.clone()
    };
    store.add_trajectory(run, &record).await?;
    Ok(Saved {
        run,
        run_name: store.run(run).await?.name,
        step,
        episode,
    })
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
