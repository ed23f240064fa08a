//! A step's episodes as the learner takes them: the RL batch (trajectory-wise, StarPO: one row per
//! episode, its return as the sequence reward, only the policy's tokens trained), the step's
//! metrics per environment tag, and a sample record per episode for the store.

use std::collections::BTreeMap;

use super::episodes::{Cut, StepEpisodes, Trajectory};
use crate::algo::AdvantageEstimator;
use crate::algo::agentic::{EpisodeSteps, GigpoParams, gigpo, step_returns};
use crate::config::{EnvConfig, RlConfig};
use crate::metrics::{Metrics, SampleRecord, TrajectoryRecord, TurnRecord};
use crate::pipeline::rl_update::RlBatch;

use super::super::setup::Tokenizing;

/// The step's batch as `rl.adv_estimator` wants it: one row per episode (trajectory-wise; with
/// `agentic_reinforce` each turn's tokens carry the turn's discounted return), or one row per turn
/// (step-wise, `gigpo` and `step_reinforce`, advantages computed here from the episodes).
pub(crate) fn agentic_batch(cfg: &RlConfig, env: &EnvConfig, trajs: &[Trajectory]) -> RlBatch {
    let mut batch = estimator_batch(cfg, env, trajs);
    // Every row comes from the stage's one environment.
    batch.tags = vec![env.tag().to_string(); batch.prompts.len()];
    batch
}

fn estimator_batch(cfg: &RlConfig, env: &EnvConfig, trajs: &[Trajectory]) -> RlBatch {
    let steps: Vec<EpisodeSteps> = trajs
        .iter()
        .map(|t| EpisodeSteps {
            group: t.group,
            rewards: t.turns.iter().map(|u| u.reward).collect(),
            state_hashes: t.turns.iter().map(|u| u.state_hash).collect(),
        })
        .collect();
    let gamma = env.step_reward_gamma;
    match cfg.adv_estimator {
        AdvantageEstimator::Gigpo => {
            let params = GigpoParams {
                gamma,
                episode_weight: env.episode_reward_weight,
                step_weight: env.step_reward_weight,
                std_normalize: cfg.std_normalize,
                eps: 1e-6,
            };
            step_batch(trajs, &gigpo(&steps, &params))
        }
        AdvantageEstimator::StepReinforce => step_batch(trajs, &step_returns(&steps, gamma)),
        AdvantageEstimator::AgenticReinforce => {
            let mut batch = rl_batch(trajs, cfg.group_size);
            let per_turn = step_returns(&steps, gamma);
            batch.advantages = Some(
                trajs
                    .iter()
                    .zip(&per_turn)
                    .map(|(t, returns)| {
                        let mut row = vec![0f32; t.response.len()];
                        for ((start, turn), g) in t.turn_starts.iter().zip(&t.turns).zip(returns) {
                            row[*start..start + turn.tokens].fill(*g as f32);
                        }
                        row
                    })
                    .collect(),
            );
            batch
        }
        _ => rl_batch(trajs, cfg.group_size),
    }
}

/// Whether the batch has a row per turn rather than per episode.
pub(crate) fn is_step_wise(cfg: &RlConfig) -> bool {
    matches!(
        cfg.adv_estimator,
        AdvantageEstimator::Gigpo | AdvantageEstimator::StepReinforce
    )
}

/// One row per turn: the turn's own prompt and output, its advantage on each of its tokens.
fn step_batch(trajs: &[Trajectory], advantages: &[Vec<f64>]) -> RlBatch {
    let turns: Vec<(&Trajectory, usize)> = trajs
        .iter()
        .flat_map(|t| (0..t.turns.len()).map(move |k| (t, k)))
        .collect();
    RlBatch {
        prompts: turns
            .iter()
            .map(|(t, k)| t.turns[*k].prompt_ids.clone())
            .collect(),
        responses: turns
            .iter()
            .map(|(t, k)| t.turns[*k].token_ids.clone())
            .collect(),
        gen_logprobs: turns
            .iter()
            .map(|(t, k)| t.turns[*k].logprobs.clone())
            .collect(),
        rewards: turns
            .iter()
            .map(|(t, k)| t.turns[*k].reward as f32)
            .collect(),
        truncated: vec![false; turns.len()],
        correct: turns
            .iter()
            .map(|(t, _)| f32::from(u8::from(t.success)))
            .collect(),
        response_masks: None,
        tags: vec![],
        advantages: Some(
            trajs
                .iter()
                .zip(advantages)
                .flat_map(|(t, a)| {
                    t.turns
                        .iter()
                        .zip(a)
                        .map(|(u, a)| vec![*a as f32; u.tokens])
                })
                .collect(),
        ),
        // Rows are turns, not groups of episodes: each is its own unit for mini-batches.
        group_size: 1,
    }
}

/// Each episode's first row in the batch (its turns' rows follow it in step-wise batches).
pub(crate) fn first_rows(step_wise: bool, trajs: &[Trajectory]) -> Vec<usize> {
    let mut at = 0;
    trajs
        .iter()
        .map(|t| {
            let row = at;
            at += if step_wise { t.turns.len() } else { 1 };
            row
        })
        .collect()
}

/// One row per episode, groups consecutive (episodes come in (group, index) order).
pub(crate) fn rl_batch(trajs: &[Trajectory], group_size: usize) -> RlBatch {
    RlBatch {
        prompts: trajs.iter().map(|t| t.prompt_ids.clone()).collect(),
        responses: trajs.iter().map(|t| t.response.clone()).collect(),
        gen_logprobs: trajs.iter().map(|t| t.logprobs.clone()).collect(),
        rewards: trajs.iter().map(|t| t.episode_return as f32).collect(),
        truncated: trajs.iter().map(|t| t.cut == Some(Cut::Budget)).collect(),
        correct: trajs
            .iter()
            .map(|t| f32::from(u8::from(t.success)))
            .collect(),
        advantages: None,
        response_masks: Some(trajs.iter().map(|t| t.trainable.clone()).collect()),
        group_size,
        tags: vec![],
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// `env/<tag>/…` (success, return, steps, invalid_action_frac, discarded, format_penalty),
/// `reward/<tag>/…`,
/// trajectory lengths and cuts, groups whose episodes all scored alike, and rollout timing.
pub(crate) fn episode_metrics(
    m: &mut Metrics,
    tag: &str,
    format_penalty: f64,
    out: &StepEpisodes,
    group_size: usize,
) {
    let t = &out.trajectories;
    if t.is_empty() {
        return;
    }
    let n = t.len() as f64;
    let returns: Vec<f64> = t.iter().map(|t| t.episode_return).collect();
    let ret_mean = mean(returns.iter().copied());
    let ret_std = mean(returns.iter().map(|r| (r - ret_mean).powi(2))).sqrt();
    let turns: usize = t.iter().map(|t| t.turns.len()).sum();
    let invalid: usize = t.iter().map(|t| t.invalid_actions).sum();
    let e = |k: &str| format!("env/{tag}/{k}");
    m.insert(
        e("success"),
        mean(t.iter().map(|t| f64::from(u8::from(t.success)))),
    );
    m.insert(e("return"), ret_mean);
    m.insert(e("steps"), turns as f64 / n);
    m.insert(
        e("invalid_action_frac"),
        invalid as f64 / turns.max(1) as f64,
    );
    // Episodes whose environment failed and that were played again from their seed.
    m.insert(e("discarded"), out.failures.len() as f64);
    m.insert(
        e("format_penalty"),
        mean(t.iter().map(|t| t.invalid_actions as f64 * format_penalty)),
    );
    m.insert(format!("reward/{tag}/mean"), ret_mean);
    m.insert(format!("reward/{tag}/std"), ret_std);
    let tokens: Vec<f64> = t
        .iter()
        .map(|t| (t.prompt_ids.len() + t.response.len()) as f64)
        .collect();
    m.insert(
        "trajectory/tokens/mean".into(),
        mean(tokens.iter().copied()),
    );
    m.insert(
        "trajectory/tokens/max".into(),
        tokens.iter().copied().fold(0.0, f64::max),
    );
    m.insert(
        "trajectory/turns/max".into(),
        t.iter().map(|t| t.turns.len()).max().unwrap_or(0) as f64,
    );
    let cut = |c: Cut| t.iter().filter(|t| t.cut == Some(c)).count() as f64 / n;
    m.insert("trajectory/cut_max_turns".into(), cut(Cut::Turns));
    m.insert("trajectory/cut_token_budget".into(), cut(Cut::Budget));
    let policy_tokens: Vec<f64> = t
        .iter()
        .map(|t| t.turns.iter().map(|u| u.tokens).sum::<usize>() as f64)
        .collect();
    m.insert(
        "response_length/mean".into(),
        mean(policy_tokens.iter().copied()),
    );
    let groups: Vec<&[Trajectory]> = t.chunks(group_size.max(1)).collect();
    let flat = groups
        .iter()
        .filter(|g| g.iter().all(|t| t.episode_return == g[0].episode_return))
        .count();
    m.insert(
        "group/frac_zero_std".into(),
        flat as f64 / groups.len() as f64,
    );
    m.insert("time/rollout".into(), out.t_rollout);
    m.insert("time/env".into(), out.t_env);
    m.insert(
        "system/tokens_per_s".into(),
        out.gen_tokens as f64 / out.t_rollout.max(1e-9),
    );
    m.insert(
        "rollout/turns_per_s".into(),
        turns as f64 / out.t_rollout.max(1e-9),
    );
}

/// `val/env/<tag>/success|return|steps|invalid_action_frac` of evaluation episodes.
pub(crate) fn validation_metrics(m: &mut Metrics, tag: &str, out: &StepEpisodes) {
    let t = &out.trajectories;
    if t.is_empty() {
        return;
    }
    let turns: usize = t.iter().map(|t| t.turns.len()).sum();
    let invalid: usize = t.iter().map(|t| t.invalid_actions).sum();
    let v = |k: &str| format!("val/env/{tag}/{k}");
    m.insert(
        v("success"),
        mean(t.iter().map(|t| f64::from(u8::from(t.success)))),
    );
    m.insert(v("return"), mean(t.iter().map(|t| t.episode_return)));
    m.insert(v("steps"), turns as f64 / t.len() as f64);
    m.insert(
        v("invalid_action_frac"),
        invalid as f64 / turns.max(1) as f64,
    );
    m.insert("time/eval".into(), out.t_rollout);
}

/// The episode as the samples view shows it: each turn's output, then the observation it led to.
fn transcript(t: &Trajectory) -> String {
    let mut out = String::new();
    for (i, turn) in t.turns.iter().enumerate() {
        out.push_str(&turn.output);
        match &turn.parsed {
            Some(a) if turn.valid => out.push_str(&format!("\n[{a}: reward {}]\n", turn.reward)),
            _ => out.push_str(&format!("\n[no valid action: reward {}]\n", turn.reward)),
        }
        if let Some(next) = t.turns.get(i + 1) {
            out.push_str(&next.observation);
            out.push('\n');
        }
    }
    out
}

/// A sample record per episode: the first prompt, the transcript, the return and the outcome.
pub(crate) fn sample_records(
    step: usize,
    policy_version: usize,
    tag: &str,
    tok: Tokenizing<'_>,
    t: &[Trajectory],
    advantages: &[f32],
) -> Vec<SampleRecord> {
    t.iter()
        .zip(advantages)
        .map(|(t, a)| {
            let breakdown: BTreeMap<String, f64> = [
                ("success", f64::from(u8::from(t.success))),
                ("turns", t.turns.len() as f64),
                ("invalid_actions", t.invalid_actions as f64),
                ("group", t.group as f64),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            SampleRecord {
                stage: crate::config::Stage::Rl.as_str().into(),
                step,
                domain: tag.to_string(),
                prompt: tok.decode(&t.prompt_ids),
                response: transcript(t),
                ground_truth: format!("episode seed {}", t.seed),
                reward: t.episode_return as f32,
                correct: t.success,
                breakdown,
                advantage: *a,
                prompt_tokens: t.prompt_ids.len(),
                response_tokens: t.response.len(),
                finish_reason: end_reason(t).into(),
                policy_version,
                tokens: None,
            }
        })
        .collect()
}

/// Every episode with its turns, as the store keeps them (the Trajectories view, the debugger).
pub(crate) fn trajectory_records(
    step: usize,
    policy_version: usize,
    tag: &str,
    t: &[Trajectory],
) -> Vec<TrajectoryRecord> {
    t.iter()
        .map(|t| TrajectoryRecord {
            stage: crate::config::Stage::Rl.as_str().into(),
            step,
            env: tag.to_string(),
            env_seed: t.seed,
            policy_version,
            success: t.success,
            group: t.group,
            episode: t.index,
            end_reason: end_reason(t).into(),
            turns: t
                .turns
                .iter()
                .map(|u| {
                    let mut info = u.info.clone();
                    info.insert("state_hash".into(), u.state_hash.into());
                    TurnRecord {
                        observation: u.observation.clone(),
                        action_text: u.output.clone(),
                        parsed_action: u.parsed.clone(),
                        reward: u.reward,
                        done: u.done,
                        prompt_tokens: u.prompt_tokens,
                        response_tokens: u.tokens,
                        info,
                        tokens: None,
                    }
                })
                .collect(),
        })
        .collect()
}

fn end_reason(t: &Trajectory) -> &'static str {
    match t.cut {
        None => "done",
        Some(Cut::Turns) => "max_turns",
        Some(Cut::Budget) => "token_budget",
    }
}
