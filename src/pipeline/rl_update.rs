//! One RL optimisation step on a scored rollout batch: reward shaping, KL, advantages, masks, then
//! PPO-style epochs over mini-batches and micro-batches for the actor (and the critic under GAE).

use candle_core::{DType, Device, Tensor};

use crate::algo::advantage::{AdvantageEstimator, AdvantageParams, compute_advantages};
use crate::algo::aggregate::{LossAgg, aggregate, masked_mean};
use crate::algo::kl::{KlController, KlMode, kl_in_reward, kl_penalty};
use crate::algo::loss::{entropy_bonus, policy_loss, value_loss};
use crate::algo::mask::max_length_mask;
use crate::algo::normalize::{RunningStats, clip_tensor, clip_values, normalize_rewards, whiten};
use crate::config::RlConfig;
use crate::metrics::Metrics;
use crate::model::{LoadedModel, Numerics, Transformer};
use crate::train::batch::response_hidden;
use crate::train::{AdamW, GradAccumulator, TrainBatch, ValueHead, response_forward};

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::{PipelineError, TensorContext, mix_seed};

/// The critic of GAE runs: a transformer (initialised from the policy) with a value head.
pub struct Critic {
    pub model: Transformer,
    pub head: ValueHead,
    pub opt: AdamW,
}

impl Critic {
    /// values: (b, R) for the positions that predict response tokens.
    fn values(&self, tb: &TrainBatch, numerics: Numerics) -> candle_core::Result<Tensor> {
        let hidden = response_hidden(&self.model, tb, numerics)?;
        self.head.forward(&hidden)? * &tb.response_mask
    }
}

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
    pub group_size: usize,
}

pub struct UpdateOutput {
    pub metrics: Metrics,
    /// Advantage of each sample (its first response token).
    pub sample_advantages: Vec<f32>,
}

/// Mutable state that outlives a step.
pub struct UpdateState<'a> {
    pub opt: &'a mut AdamW,
    pub reference: Option<&'a Transformer>,
    pub critic: Option<&'a mut Critic>,
    pub kl_ctl: &'a mut KlController,
    pub running: &'a mut RunningStats,
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

/// Run `f` over micro-batches of rows and stitch the (rows, r) results into (n, R).
fn chunked(
    policy: &LoadedModel,
    batch: &RlBatch,
    micro: usize,
    width: usize,
    f: &dyn Fn(&TrainBatch) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    let mut parts = vec![];
    let groups = policy.config().kv_groups();
    for start in (0..batch.prompts.len()).step_by(micro) {
        let end = (start + micro).min(batch.prompts.len());
        let pairs: Vec<(&[u32], &[u32])> = (start..end)
            .map(|i| (batch.prompts[i].as_slice(), batch.responses[i].as_slice()))
            .collect();
        let tb = TrainBatch::new(&pairs, policy.pad_id, groups, policy.transformer.device())?;
        let out = f(&tb)?;
        let r = out.dim(1)?;
        parts.push(out.pad_with_zeros(1, 0, width - r)?);
    }
    Tensor::cat(&parts, 0)
}

pub fn update(
    cfg: &RlConfig,
    policy: &LoadedModel,
    st: UpdateState<'_>,
    batch: &RlBatch,
) -> Result<UpdateOutput, PipelineError> {
    let n = batch.prompts.len();
    let dev = policy.transformer.device().clone();
    let width = batch.responses.iter().map(|r| r.len()).max().unwrap_or(1);
    let micro = cfg.micro_batch_size.unwrap_or(n).max(1);
    let temperature = if cfg.sampling.temperature > 0.0 {
        cfg.sampling.temperature
    } else {
        1.0
    };
    let lens: Vec<Vec<f32>> = batch
        .responses
        .iter()
        .map(|r| vec![1f32; r.len()])
        .collect();
    let resp_mask = pad_rows(&lens, width, &dev).during("rl masks")?;
    let old_logp = pad_rows(&batch.gen_logprobs, width, &dev).during("rl old log-probs")?;
    let mut m = Metrics::new();

    // Rewards: normalise, clip, place at the last response token.
    let shaped = normalize_rewards(
        cfg.reward_norm,
        &batch.rewards,
        batch.group_size,
        st.running,
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
    let mut token_rewards = pad_rows(&token_rows, width, &dev).during("rl rewards")?;

    let t_ref = std::time::Instant::now();
    let ref_logp = match st.reference {
        Some(reference) => Some(
            chunked(policy, batch, micro, width, &|tb| {
                Ok(response_forward(reference, tb, temperature, Numerics::Fast, false)?.0)
            })
            .during("reference log-probs")?,
        ),
        None => None,
    };
    m.insert("time/ref".into(), t_ref.elapsed().as_secs_f64());
    let kl_coef = st.kl_ctl.coef();
    if let Some(r) = &ref_logp {
        let kl = kl_penalty(cfg.kl.estimator, &old_logp, r).during("kl")?;
        m.insert("actor/kl".into(), mean_of(&kl, &resp_mask)?);
        m.insert("actor/kl_coef".into(), kl_coef);
        if cfg.kl.mode == KlMode::InReward {
            token_rewards = kl_in_reward(
                &token_rewards,
                &old_logp,
                r,
                &resp_mask,
                cfg.kl.estimator,
                kl_coef,
            )
            .during("kl in reward")?;
        }
    }

    let t_adv = std::time::Instant::now();
    let old_values = match st.critic.as_deref() {
        Some(c) => Some(
            chunked(policy, batch, micro, width, &|tb| {
                c.values(tb, Numerics::Fast)
            })
            .during("critic values")?,
        ),
        None => None,
    };
    let params = AdvantageParams {
        gamma: cfg.gamma,
        lambda: cfg.lambda,
        group_size: batch.group_size,
        std_normalize: cfg.std_normalize,
        eps: 1e-6,
    };
    let (mut adv, returns) = compute_advantages(
        cfg.adv_estimator,
        &params,
        &token_rewards,
        old_values.as_ref(),
        &resp_mask,
    )
    .during("advantages")?;
    if cfg.adv_whiten {
        adv = whiten(&adv, &resp_mask, true, 1e-8).during("advantage whitening")?;
    }
    adv = (clip_tensor(&adv, cfg.adv_clip).during("advantage clipping")? * &resp_mask)
        .during("advantages")?;
    let adv_mean = mean_of(&adv, &resp_mask)?;
    let adv_sq = mean_of(&adv.sqr().during("adv")?, &resp_mask)?;
    m.insert("adv/mean".into(), adv_mean);
    m.insert(
        "adv/std".into(),
        (adv_sq - adv_mean * adv_mean).max(0.0).sqrt(),
    );
    if let Some(v) = &old_values {
        m.insert(
            "critic/vf_explained_var".into(),
            explained_variance(&returns, v, &resp_mask)?,
        );
    }

    // Loss mask: response tokens, minus truncated rows and prompts outside the difficulty band.
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
            (n, 1),
            &dev,
        )
        .during("difficulty mask")?;
        loss_mask = loss_mask.broadcast_mul(&rows).during("difficulty mask")?;
    }
    m.insert("time/adv".into(), t_adv.elapsed().as_secs_f64());
    let sample_advantages = adv
        .narrow(1, 0, 1)
        .and_then(|a| a.flatten_all()?.to_vec1())
        .during("advantages")?;

    let t_train = std::time::Instant::now();
    let train = TrainInputs {
        policy,
        batch,
        micro,
        temperature,
        adv: &adv,
        returns: &returns,
        old_logp: &old_logp,
        ref_logp: ref_logp.as_ref(),
        old_values: old_values.as_ref(),
        loss_mask: &loss_mask,
        kl_coef,
        seed: st.seed,
    };
    train_epochs(cfg, &train, st.opt, st.critic, &mut m)?;
    m.insert("time/train".into(), t_train.elapsed().as_secs_f64());
    if let Some(kl) = m.get("actor/kl") {
        st.kl_ctl.update(*kl, n);
    }
    Ok(UpdateOutput {
        metrics: m,
        sample_advantages,
    })
}

struct TrainInputs<'a> {
    policy: &'a LoadedModel,
    batch: &'a RlBatch,
    micro: usize,
    temperature: f64,
    adv: &'a Tensor,
    returns: &'a Tensor,
    old_logp: &'a Tensor,
    ref_logp: Option<&'a Tensor>,
    old_values: Option<&'a Tensor>,
    loss_mask: &'a Tensor,
    kl_coef: f64,
    /// Seeds the mini-batch order.
    seed: u64,
}

/// Sums of per-micro-batch diagnostics, weighted by each micro-batch's share of its mini-batch.
#[derive(Default)]
struct Tally {
    pg_loss: f64,
    clip_low: f64,
    clip_high: f64,
    approx_kl: f64,
    entropy: f64,
    value_loss: f64,
    grad_norm: f64,
    critic_grad_norm: f64,
    lr: f64,
    minis: f64,
    infer_diff: Option<f64>,
}

fn train_epochs(
    cfg: &RlConfig,
    inp: &TrainInputs<'_>,
    opt: &mut AdamW,
    mut critic: Option<&mut Critic>,
    m: &mut Metrics,
) -> Result<(), PipelineError> {
    let g = inp.batch.group_size;
    let n_groups = inp.batch.prompts.len() / g;
    let groups_per_mini = n_groups.div_ceil(cfg.mini_batches);
    let groups_kv = inp.policy.config().kv_groups();
    let agg = cfg.policy_loss.agg;
    let dev = inp.policy.transformer.device();
    let mut t = Tally::default();
    for epoch in 0..cfg.ppo_epochs {
        // Mini-batches take whole groups in a seeded random order: batches arrive grouped by domain,
        // and consecutive optimizer steps on one domain at a time would pull the policy back and forth.
        let mut order: Vec<usize> = (0..n_groups).collect();
        order.shuffle(&mut StdRng::seed_from_u64(mix_seed(&[
            inp.seed,
            epoch as u64,
        ])));
        for (mini_idx, mini_groups) in order.chunks(groups_per_mini).enumerate() {
            let rows: Vec<usize> = mini_groups
                .iter()
                .flat_map(|&grp| grp * g..(grp + 1) * g)
                .collect();
            let rows_idx = index_tensor(&rows, dev)?;
            let mini_tokens = scalar(
                &inp.loss_mask
                    .index_select(&rows_idx, 0)
                    .and_then(|x| x.sum_all())
                    .during("mask")?,
            )?;
            if mini_tokens == 0.0 {
                continue;
            }
            let mut acc = GradAccumulator::default();
            let mut critic_acc = GradAccumulator::default();
            let (mut diff_sum, mut diff_tokens) = (0.0, 0.0);
            for chunk in rows.chunks(inp.micro) {
                let pairs: Vec<(&[u32], &[u32])> = chunk
                    .iter()
                    .map(|&i| {
                        (
                            inp.batch.prompts[i].as_slice(),
                            inp.batch.responses[i].as_slice(),
                        )
                    })
                    .collect();
                let tb = TrainBatch::new(&pairs, inp.policy.pad_id, groups_kv, dev)
                    .during("rl batch")?;
                let r = tb.response_width;
                let chunk_idx = index_tensor(chunk, dev)?;
                let slice = |x: &Tensor| {
                    x.index_select(&chunk_idx, 0)
                        .and_then(|x| x.narrow(1, 0, r))
                };
                let weight_rows = chunk.len() as f64 / rows.len() as f64;
                let mask = slice(inp.loss_mask).during("rl slice")?;
                let tokens = scalar(&mask.sum_all().during("mask")?)?;
                let weight = match agg {
                    LossAgg::TokenMean => tokens / mini_tokens,
                    _ => weight_rows,
                };
                let (logp, entropy) = response_forward(
                    &inp.policy.transformer,
                    &tb,
                    inp.temperature,
                    Numerics::Differentiable,
                    true,
                )
                .during("actor forward")?;
                let entropy = entropy
                    .ok_or_else(|| PipelineError::Setup("entropy was not computed".into()))?;
                let old = slice(inp.old_logp).during("rl slice")?;
                if epoch == 0 && mini_idx == 0 {
                    let d = ((logp.detach() - &old)
                        .during("diff")?
                        .abs()
                        .during("diff")?
                        * &tb.response_mask)
                        .during("diff")?;
                    diff_sum += scalar(&d.sum_all().during("diff")?)?;
                    diff_tokens += scalar(&tb.response_mask.sum_all().during("diff")?)?;
                }
                let adv = slice(inp.adv).during("rl slice")?;
                let out = policy_loss(&cfg.policy_loss, &logp, &old, &adv, &mask)
                    .during("policy loss")?;
                let mut loss = out.loss.clone();
                if cfg.entropy_coef != 0.0 {
                    let bonus = entropy_bonus(&entropy, &mask, agg).during("entropy bonus")?;
                    loss =
                        (loss - (bonus * cfg.entropy_coef).during("entropy")?).during("entropy")?;
                }
                if cfg.kl.mode == KlMode::InLoss
                    && let Some(ref_logp) = inp.ref_logp
                {
                    let kl = kl_penalty(
                        cfg.kl.estimator,
                        &logp,
                        &slice(ref_logp).during("rl slice")?,
                    )
                    .during("kl loss")?;
                    let kl =
                        aggregate(&kl, &mask, agg, cfg.policy_loss.norm_len).during("kl loss")?;
                    loss = (loss + (kl * inp.kl_coef).during("kl loss")?).during("kl loss")?;
                }
                let loss = (loss * weight).during("loss scaling")?;
                acc.add(opt.vars(), &loss.backward().during("actor backward")?)
                    .during("actor backward")?;
                t.pg_loss += weight * scalar(&out.loss)?;
                t.clip_low += weight * out.clip_frac_low as f64;
                t.clip_high += weight * out.clip_frac_high as f64;
                t.approx_kl += weight * out.approx_kl as f64;
                t.entropy += weight * mean_of(&entropy.detach(), &mask)?;

                if let Some(c) = critic.as_deref() {
                    let values = c
                        .values(&tb, Numerics::Differentiable)
                        .during("critic forward")?;
                    let old_v = slice(
                        inp.old_values
                            .ok_or_else(|| PipelineError::Setup("no old values".into()))?,
                    )
                    .during("rl slice")?;
                    let ret = slice(inp.returns).during("rl slice")?;
                    let clip = cfg.critic.as_ref().and_then(|c| c.value_clip);
                    let vl = (value_loss(&values, &old_v, &ret, &mask, clip, agg)
                        .during("value loss")?
                        * weight)
                        .during("value loss")?;
                    critic_acc
                        .add(c.opt.vars(), &vl.backward().during("critic backward")?)
                        .during("critic backward")?;
                    t.value_loss += scalar(&vl)?;
                }
            }
            if diff_tokens > 0.0 {
                t.infer_diff = Some(diff_sum / diff_tokens);
            }
            let stats = opt.step(acc).during("actor optimizer step")?;
            t.grad_norm += stats.grad_norm;
            t.lr = stats.lr;
            if let Some(c) = critic.as_deref_mut() {
                t.critic_grad_norm += c
                    .opt
                    .step(critic_acc)
                    .during("critic optimizer step")?
                    .grad_norm;
            }
            t.minis += 1.0;
        }
    }
    let per = t.minis.max(1.0);
    m.insert("actor/pg_loss".into(), t.pg_loss / per);
    m.insert("actor/clip_frac_low".into(), t.clip_low / per);
    m.insert("actor/clip_frac_high".into(), t.clip_high / per);
    m.insert("actor/approx_kl".into(), t.approx_kl / per);
    m.insert("actor/entropy".into(), t.entropy / per);
    m.insert("actor/grad_norm".into(), t.grad_norm / per);
    m.insert("actor/lr".into(), t.lr);
    if critic.is_some() {
        m.insert("critic/value_loss".into(), t.value_loss / per);
        m.insert("critic/grad_norm".into(), t.critic_grad_norm / per);
    }
    if let Some(d) = t.infer_diff {
        m.insert("train_infer/logprob_abs_diff".into(), d);
    }
    Ok(())
}

fn index_tensor(rows: &[usize], dev: &Device) -> Result<Tensor, PipelineError> {
    let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    Tensor::from_vec(ids, rows.len(), dev).during("row index")
}

fn scalar(t: &Tensor) -> Result<f64, PipelineError> {
    t.to_dtype(DType::F64)
        .and_then(|x| x.to_scalar::<f64>())
        .during("reading a scalar")
}

fn mean_of(x: &Tensor, mask: &Tensor) -> Result<f64, PipelineError> {
    scalar(&masked_mean(x, mask).during("metrics")?)
}

/// 1 - Var(returns - values) / Var(returns) over valid tokens.
fn explained_variance(
    returns: &Tensor,
    values: &Tensor,
    mask: &Tensor,
) -> Result<f64, PipelineError> {
    let var = |x: &Tensor| -> Result<f64, PipelineError> {
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

/// Whether this estimator needs the critic.
pub fn needs_critic(est: AdvantageEstimator) -> bool {
    est == AdvantageEstimator::Gae
}
