//! One RL optimisation step on a scored rollout batch: reward shaping, KL, advantages, masks, then
//! the actor's (and under GAE the critic's) epochs in `rl_epochs`.

use candle_core::{Device, Tensor};

use crate::algo::advantage::{AdvantageParams, compute_advantages};
use crate::algo::kl::{KlController, KlMode, kl_in_reward, kl_penalty};
use crate::algo::mask::max_length_mask;
use crate::algo::normalize::{RunningStats, clip_tensor, clip_values, normalize_rewards, whiten};
use crate::config::RlConfig;
use crate::metrics::Metrics;
use crate::model::LoadedModel;

use super::opd::{OpdTeachers, TeacherScores};
use super::{RunError, TensorContext};
use crate::role::actor_train::ActorTrain;
use crate::role::critic::Critic;
use crate::role::epochs::{ActorStep, CriticStep, EpochRows, PolicyTargets, Targets, mean_of};
use crate::role::reference::Reference;
use crate::role::rows::Rows;

/// A scored rollout batch; rows of a group are consecutive.
pub struct RlBatch {
    pub prompts: Vec<Vec<u32>>,
    pub responses: Vec<Vec<u32>>,
    /// Behaviour-policy log-probs from generation (the PPO "old" log-probs).
    pub gen_logprobs: Vec<Vec<f32>>,
    /// Raw rule rewards.
    pub rewards: Vec<f32>,
    /// Cut at max_new_tokens.
    pub truncated: Vec<bool>,
    /// 0/1 correctness, for the difficulty mask.
    pub correct: Vec<f32>,
    /// Which response tokens the policy wrote (1) and which are context it read (0, e.g. an
    /// environment's observations between turns); `None`: every response token is the policy's.
    /// Only the policy's tokens are steps of the advantage recursions and terms of the losses.
    pub response_masks: Option<Vec<Vec<f32>>>,
    /// Advantages already computed per response token (agentic estimators, from env steps);
    /// `None`: computed here from `rewards` by `rl.adv_estimator`.
    pub advantages: Option<Vec<Vec<f32>>>,
    pub group_size: usize,
    /// Each row's tag — its domain (RLVR) or its environment's tag (agentic) — which routes it
    /// to on-policy distillation's teachers; empty when the rows carry none.
    pub tags: Vec<String>,
}

pub struct UpdateOutput {
    pub metrics: Metrics,
    /// Advantage of each sample (its first response token).
    pub sample_advantages: Vec<f32>,
    /// Each row's sampled tokens with the student's and the teachers' log-probs (on-policy
    /// distillation only).
    pub traces: Option<Vec<RowTrace>>,
}

/// A row's sampled tokens (its response mask's: the policy's, not an environment's), the log-prob
/// the student sampled each with, and each teacher's that scored the row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowTrace {
    pub ids: Vec<u32>,
    pub student: Vec<f32>,
    pub teachers: std::collections::BTreeMap<String, Vec<f32>>,
}

/// The rows' traces from the teachers' `scores`: the positions each row's `masks` marks.
fn row_traces(batch: &RlBatch, masks: &[Vec<f32>], scores: &[TeacherScores]) -> Vec<RowTrace> {
    let mut traces: Vec<RowTrace> = batch
        .responses
        .iter()
        .zip(&batch.gen_logprobs)
        .zip(masks)
        .map(|((ids, logp), mask)| {
            let kept = |j: &usize| mask.get(*j).is_some_and(|m| *m > 0.0);
            let at: Vec<usize> = (0..ids.len()).filter(kept).collect();
            RowTrace {
                ids: at.iter().map(|&j| ids[j]).collect(),
                student: at
                    .iter()
                    .map(|&j| logp.get(j).copied().unwrap_or(f32::NAN))
                    .collect(),
                teachers: Default::default(),
            }
        })
        .collect();
    for t in scores {
        for (&row, logp) in t.rows.iter().zip(&t.logp) {
            let (ids, mask) = (&batch.responses[row as usize], &masks[row as usize]);
            let kept = (0..ids.len()).filter(|j| mask.get(*j).is_some_and(|m| *m > 0.0));
            traces[row as usize]
                .teachers
                .insert(t.name.clone(), kept.map(|j| logp[j]).collect());
        }
    }
    traces
}

/// Mutable state that outlives a step.
pub struct UpdateState<'a> {
    pub actor: &'a mut ActorTrain,
    pub reference: Option<&'a mut Reference>,
    pub critic: Option<&'a mut Critic>,
    pub kl_ctl: &'a mut KlController,
    pub running: &'a mut RunningStats,
    /// On-policy distillation's teachers (`rl.opd`).
    pub opd: Option<&'a mut OpdTeachers>,
    /// Seed of this step's random choices (mini-batch order).
    pub seed: u64,
}

fn pad_rows(rows: &[Vec<f32>], width: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mut data = Vec::with_capacity(rows.len() * width);
    for r in rows {
        data.extend(r.iter().copied().take(width));
        data.extend(std::iter::repeat_n(0f32, width.saturating_sub(r.len())));
    }
    Tensor::from_vec(data, (rows.len(), width), device)
}

/// The shaped rewards (normalised, clipped) placed at each row's last response token: (n, width).
fn token_rewards(
    cfg: &RlConfig,
    batch: &RlBatch,
    running: &mut RunningStats,
    width: usize,
    dev: &Device,
) -> Result<Tensor, RunError> {
    let shaped = normalize_rewards(
        cfg.reward_norm,
        &batch.rewards,
        batch.group_size,
        running,
        1e-6,
    );
    let shaped = clip_values(&shaped, cfg.reward_clip);
    let token_rows: Vec<Vec<f32>> = shaped
        .iter()
        .zip(&batch.responses)
        .map(|(r, resp)| {
            let mut row = vec![0f32; resp.len()];
            row[resp.len() - 1] = *r;
            row
        })
        .collect();
    pad_rows(&token_rows, width, dev).during("rl rewards")
}

/// The KL to the reference as metrics; with `kl.mode: in_reward` the token rewards minus the
/// penalty, else the token rewards as they were.
fn kl_terms(
    cfg: &RlConfig,
    kl_coef: f64,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    resp_mask: &Tensor,
    token_rewards: Tensor,
    m: &mut Metrics,
) -> Result<Tensor, RunError> {
    let kl = kl_penalty(cfg.kl.estimator, old_logp, ref_logp).during("kl")?;
    m.insert("actor/kl".into(), mean_of(&kl, resp_mask)?);
    m.insert("actor/kl_coef".into(), kl_coef);
    if cfg.kl.mode != KlMode::InReward {
        return Ok(token_rewards);
    }
    kl_in_reward(
        &token_rewards,
        old_logp,
        ref_logp,
        resp_mask,
        cfg.kl.estimator,
        kl_coef,
    )
    .during("kl in reward")
}

/// Advantages (whitened when asked, clipped, masked) and returns, with their metrics.
fn advantages(
    cfg: &RlConfig,
    group_size: usize,
    token_rewards: &Tensor,
    old_values: Option<&Tensor>,
    resp_mask: &Tensor,
    opd_kl: Option<&Tensor>,
    m: &mut Metrics,
) -> Result<(Tensor, Tensor), RunError> {
    let params = AdvantageParams {
        gamma: cfg.gamma,
        lambda: cfg.lambda,
        group_size,
        std_normalize: cfg.std_normalize,
        eps: 1e-6,
    };
    let (adv, returns) = compute_advantages(
        cfg.adv_estimator,
        &params,
        token_rewards,
        old_values,
        resp_mask,
    )
    .during("advantages")?;
    let adv = finish_advantages(cfg, minus_opd(adv, opd_kl)?, resp_mask, m)?;
    if let Some(v) = old_values {
        m.insert(
            "critic/vf_explained_var".into(),
            explained_variance(&returns, v, resp_mask)?,
        );
    }
    Ok((adv, returns))
}

/// Advantages computed outside (per env step), finished as `advantages` finishes its own; the
/// returns are the advantages (there is no critic for these estimators).
fn given_advantages(
    cfg: &RlConfig,
    given: &[Vec<f32>],
    width: usize,
    resp_mask: &Tensor,
    opd_kl: Option<&Tensor>,
    m: &mut Metrics,
) -> Result<(Tensor, Tensor), RunError> {
    let adv = pad_rows(given, width, resp_mask.device()).during("advantages")?;
    let adv = finish_advantages(cfg, minus_opd(adv, opd_kl)?, resp_mask, m)?;
    Ok((adv.clone(), adv))
}

/// The RL advantage minus the teachers' weighted KL (`rl.opd`, before whitening and clipping,
/// as ROLL subtracts it).
fn minus_opd(adv: Tensor, opd_kl: Option<&Tensor>) -> Result<Tensor, RunError> {
    match opd_kl {
        Some(kl) => (adv - kl).during("opd advantages"),
        None => Ok(adv),
    }
}

/// Whiten (when asked), clip and mask advantages however they were computed, and record their
/// mean and std.
fn finish_advantages(
    cfg: &RlConfig,
    mut adv: Tensor,
    resp_mask: &Tensor,
    m: &mut Metrics,
) -> Result<Tensor, RunError> {
    if cfg.adv_whiten {
        adv = whiten(&adv, resp_mask, true, 1e-8).during("advantage whitening")?;
    }
    adv = (clip_tensor(&adv, cfg.adv_clip).during("advantage clipping")? * resp_mask)
        .during("advantages")?;
    let adv_mean = mean_of(&adv, resp_mask)?;
    let adv_sq = mean_of(&adv.sqr().during("adv")?, resp_mask)?;
    m.insert("adv/mean".into(), adv_mean);
    m.insert(
        "adv/std".into(),
        (adv_sq - adv_mean * adv_mean).max(0.0).sqrt(),
    );
    Ok(adv)
}

/// The loss mask: response tokens, minus truncated rows and prompts outside the difficulty band.
fn loss_mask(
    cfg: &RlConfig,
    batch: &RlBatch,
    resp_mask: &Tensor,
    dev: &Device,
) -> Result<Tensor, RunError> {
    let mut loss_mask = resp_mask.clone();
    if cfg.max_length_mask {
        loss_mask = max_length_mask(&batch.truncated, &loss_mask).during("max-length mask")?;
    }
    if let Some(band) = &cfg.difficulty_mask {
        let keep = band.keep(&batch.correct, batch.group_size);
        let rows = Tensor::from_vec(
            keep.iter()
                .map(|&k| if k { 1f32 } else { 0.0 })
                .collect::<Vec<_>>(),
            (batch.prompts.len(), 1),
            dev,
        )
        .during("difficulty mask")?;
        loss_mask = loss_mask.broadcast_mul(&rows).during("difficulty mask")?;
    }
    Ok(loss_mask)
}

/// One RL update on a scored batch: shaped rewards, reference log-probs and KL, values and
/// advantages, masks, then the actor's (and the critic's) epochs.
pub fn update(
    cfg: &RlConfig,
    policy: &LoadedModel,
    mut st: UpdateState<'_>,
    batch: &RlBatch,
) -> Result<UpdateOutput, RunError> {
    let n = batch.prompts.len();
    let dev = policy.transformer.device().clone();
    let width = batch.responses.iter().map(|r| r.len()).max().unwrap_or(1);
    let micro = cfg.micro_batch_size.unwrap_or(n).max(1);
    let temperature = if cfg.sampling.temperature > 0.0 {
        cfg.sampling.temperature
    } else {
        1.0
    };
    let lens: Vec<Vec<f32>> = match &batch.response_masks {
        Some(masks) => masks.clone(),
        None => batch
            .responses
            .iter()
            .map(|r| vec![1f32; r.len()])
            .collect(),
    };
    let resp_mask = pad_rows(&lens, width, &dev).during("rl masks")?;
    let old_logp = pad_rows(&batch.gen_logprobs, width, &dev).during("rl old log-probs")?;
    let mut m = Metrics::new();
    let token_rewards = token_rewards(cfg, batch, st.running, width, &dev)?;

    let t_ref = std::time::Instant::now();
    let rows = Rows {
        prompts: &batch.prompts,
        responses: &batch.responses,
        micro,
        width,
    };
    let ref_logp = match st.reference {
        Some(r) => Some(r.logprobs(policy.pad_id, &rows, temperature, &dev)?),
        None => None,
    };
    // Only a run with a reference spends time on it: no noise series without one.
    if ref_logp.is_some() {
        m.insert("time/ref".into(), t_ref.elapsed().as_secs_f64());
    }
    let kl_coef = st.kl_ctl.coef();
    let token_rewards = match &ref_logp {
        Some(r) => kl_terms(
            cfg,
            kl_coef,
            &old_logp,
            r,
            &resp_mask,
            token_rewards,
            &mut m,
        )?,
        None => token_rewards,
    };

    let t_opd = std::time::Instant::now();
    let (opd_kl, pure, traces) = match st.opd {
        Some(teachers) => {
            let (kl, scores) = teachers.penalty(
                batch,
                &rows,
                &old_logp,
                &resp_mask,
                temperature,
                &dev,
                &mut m,
            )?;
            let traces = row_traces(batch, &lens, &scores);
            (Some(kl), teachers.pure, Some(traces))
        }
        None => (None, false, None),
    };
    if opd_kl.is_some() {
        m.insert("time/teacher".into(), t_opd.elapsed().as_secs_f64());
    }

    let t_adv = std::time::Instant::now();
    let old_values = match st.critic.as_deref_mut() {
        Some(c) => Some(c.values(policy.pad_id, &rows, &dev)?),
        None => None,
    };
    let (adv, returns) = match (&batch.advantages, &opd_kl) {
        // Pure on-policy distillation: the advantage is the teachers' KL alone.
        (_, Some(kl)) if pure => {
            let raw = kl.neg().during("opd advantages")?;
            let adv = finish_advantages(cfg, raw, &resp_mask, &mut m)?;
            (adv.clone(), adv)
        }
        (Some(given), _) => {
            given_advantages(cfg, given, width, &resp_mask, opd_kl.as_ref(), &mut m)?
        }
        (None, _) => advantages(
            cfg,
            batch.group_size,
            &token_rewards,
            old_values.as_ref(),
            &resp_mask,
            opd_kl.as_ref(),
            &mut m,
        )?,
    };
    let loss_mask = loss_mask(cfg, batch, &resp_mask, &dev)?;
    m.insert("time/adv".into(), t_adv.elapsed().as_secs_f64());
    let sample_advantages = adv
        .narrow(1, 0, 1)
        .and_then(|a| a.flatten_all()?.to_vec1())
        .during("advantages")?;

    let t_train = std::time::Instant::now();
    let step = ActorStep {
        rows: EpochRows {
            prompts: batch.prompts.clone(),
            responses: batch.responses.clone(),
            group_size: batch.group_size,
            micro,
            loss_mask,
            seed: st.seed,
        },
        targets: Targets::Policy(PolicyTargets {
            temperature,
            kl_coef,
            adv,
            old_logp,
            ref_logp,
        }),
    };
    m.extend(st.actor.train(&step, policy)?.metrics);
    if let (Some(critic), Some(old_values)) = (st.critic, old_values) {
        let step = CriticStep {
            rows: step.rows,
            returns,
            old_values,
        };
        m.extend(critic.train(cfg, &step, policy.pad_id)?);
    }
    m.insert("time/train".into(), t_train.elapsed().as_secs_f64());
    if let Some(kl) = m.get("actor/kl") {
        st.kl_ctl.update(*kl, n);
    }
    Ok(UpdateOutput {
        metrics: m,
        sample_advantages,
        traces,
    })
}

/// 1 - Var(returns - values) / Var(returns) over valid tokens.
fn explained_variance(returns: &Tensor, values: &Tensor, mask: &Tensor) -> Result<f64, RunError> {
    let var = |x: &Tensor| -> Result<f64, RunError> {
        let mean = mean_of(x, mask)?;
        let sq = mean_of(&x.sqr().during("var")?, mask)?;
        Ok(sq - mean * mean)
    };
    let resid = (returns - values).during("explained variance")?;
    let vr = var(returns)?;
    Ok(if vr > 0.0 {
        1.0 - var(&resid)? / vr
    } else {
        0.0
    })
}
