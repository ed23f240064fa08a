//! The optimisation half of an RL step: PPO-style epochs over mini-batches and micro-batches, for
//! the actor (actor_train) and, under GAE, the critic. The two are independent — neither reads the
//! other's weights — so each runs its own pass over the same seeded mini-batch plan, and either pass
//! can run in a worker process ([`ActorStep`] and [`CriticStep`] are everything they need;
//! `step_file` carries each as one shared-memory safetensors file).

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::critic::CriticNet;
use super::{RoleError, TensorContext};
use crate::algo::aggregate::{LossAgg, aggregate, masked_mean};
use crate::algo::kl::{KlMode, kl_penalty};
use crate::algo::loss::{entropy_bonus, policy_loss, value_loss};
use crate::config::RlConfig;
use crate::data::mix_seed;
use crate::metrics::Metrics;
use crate::model::threads::micro_batches_in_lanes;
use crate::model::{Numerics, Tape, Transformer};
use crate::train::{AdamW, GradAccumulator, TrainBatch, response_forward};

/// The rows of a step and what decides how they are cut into mini- and micro-batches.
pub struct EpochRows {
    pub prompts: Vec<Vec<u32>>,
    pub responses: Vec<Vec<u32>>,
    /// Rows of a group are consecutive; mini-batches take whole groups.
    pub group_size: usize,
    pub micro: usize,
    /// (n, R) f32: the tokens that count in the losses.
    pub loss_mask: Tensor,
    /// Seeds the mini-batch order.
    pub seed: u64,
}

/// Everything the actor's epochs read: the rows and the per-token targets.
pub struct ActorStep {
    pub rows: EpochRows,
    pub temperature: f64,
    pub kl_coef: f64,
    pub adv: Tensor,
    /// Behaviour-policy log-probs (the PPO "old" log-probs).
    pub old_logp: Tensor,
    pub ref_logp: Option<Tensor>,
}

/// Everything the critic's epochs read: the rows and the value targets.
pub struct CriticStep {
    pub rows: EpochRows,
    /// (n, R) f32: GAE returns, the value targets.
    pub returns: Tensor,
    /// (n, R) f32: the values at rollout time (the centre of value clipping).
    pub old_values: Tensor,
}

/// One micro-batch of a mini-batch.
struct Micro {
    /// Epoch 0's first mini-batch: where the train/infer log-prob gap is measured.
    first: bool,
    tb: TrainBatch,
    idx: Tensor,
    /// This micro-batch's share of its mini-batch's loss.
    weight: f64,
    mask: Tensor,
}

impl Micro {
    /// The micro-batch's rows of a (n, R) tensor, cut to its response width.
    fn slice(&self, x: &Tensor) -> Result<Tensor, RoleError> {
        x.index_select(&self.idx, 0)
            .and_then(|x| x.narrow(1, 0, self.tb.response_width))
            .during("rl slice")
    }
}

trait MiniBatchLearner {
    /// The lanes of one micro-batch, each a part of its rows: their passes may run side by side.
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RoleError>;
    /// Every micro-batch of a mini-batch was seen: take the optimizer step.
    fn mini_done(&mut self) -> Result<(), RoleError>;
}

/// Drive `learner` through `cfg.ppo_epochs` passes, each micro-batch cut into `lanes` parts.
/// Returns the mini-batches stepped.
fn run_epochs(
    cfg: &RlConfig,
    rows: &EpochRows,
    (pad_id, kv_groups, lanes): (u32, usize, usize),
    dev: &Device,
    learner: &mut dyn MiniBatchLearner,
) -> Result<usize, RoleError> {
    let g = rows.group_size;
    let n_groups = rows.prompts.len() / g;
    let groups_per_mini = n_groups.div_ceil(cfg.mini_batches);
    let mut minis = 0;
    for epoch in 0..cfg.ppo_epochs {
        // Mini-batches take whole groups in a seeded random order: batches arrive grouped by domain,
        // and consecutive optimizer steps on one domain at a time would pull the policy back and forth.
        let mut order: Vec<usize> = (0..n_groups).collect();
        order.shuffle(&mut StdRng::seed_from_u64(mix_seed(&[
            rows.seed,
            epoch as u64,
        ])));
        for (mini_idx, mini_groups) in order.chunks(groups_per_mini).enumerate() {
            let mini: Vec<usize> = mini_groups
                .iter()
                .flat_map(|&grp| grp * g..(grp + 1) * g)
                .collect();
            let mini_idx_t = index_tensor(&mini, dev)?;
            let mini_tokens = scalar(
                &rows
                    .loss_mask
                    .index_select(&mini_idx_t, 0)
                    .and_then(|x| x.sum_all())
                    .during("mask")?,
            )?;
            if mini_tokens == 0.0 {
                continue;
            }
            let lens: Vec<(usize, usize)> = mini
                .iter()
                .map(|&i| (rows.prompts[i].len(), rows.responses[i].len()))
                .collect();
            for micro in micro_batches_in_lanes(&lens, rows.micro, lanes) {
                // Each lane is a micro-batch of its own, weighted by its share of the mini-batch,
                // so the lanes' gradients sum to the micro-batch's.
                let mut parts = vec![];
                for part in micro {
                    let part: Vec<usize> = part.iter().map(|&k| mini[k]).collect();
                    let pairs: Vec<(&[u32], &[u32])> = part
                        .iter()
                        .map(|&i| (rows.prompts[i].as_slice(), rows.responses[i].as_slice()))
                        .collect();
                    let tb = TrainBatch::new(&pairs, pad_id, kv_groups, dev).during("rl batch")?;
                    let idx = index_tensor(&part, dev)?;
                    let mask = rows
                        .loss_mask
                        .index_select(&idx, 0)
                        .and_then(|x| x.narrow(1, 0, tb.response_width))
                        .during("rl slice")?;
                    let tokens = scalar(&mask.sum_all().during("mask")?)?;
                    let weight = match cfg.policy_loss.agg {
                        LossAgg::TokenMean => tokens / mini_tokens,
                        _ => part.len() as f64 / mini.len() as f64,
                    };
                    parts.push(Micro {
                        first: epoch == 0 && mini_idx == 0,
                        tb,
                        idx,
                        weight,
                        mask,
                    });
                }
                learner.micro(&parts)?;
            }
            learner.mini_done()?;
            minis += 1;
        }
    }
    Ok(minis)
}

/// Sums of per-micro-batch diagnostics, weighted by each micro-batch's share of its mini-batch.
#[derive(Default)]
struct ActorTally {
    pg_loss: f64,
    clip_low: f64,
    clip_high: f64,
    approx_kl: f64,
    entropy: f64,
    grad_norm: f64,
    lr: f64,
    diff_sum: f64,
    diff_tokens: f64,
}

struct ActorLearner<'a> {
    cfg: &'a RlConfig,
    step: &'a ActorStep,
    policy: &'a Transformer,
    opt: &'a mut AdamW,
    acc: GradAccumulator,
    t: ActorTally,
}

/// What one lane's pass of the actor gives: its gradients and its weighted diagnostics.
struct ActorPart {
    grads: GradStore,
    t: ActorTally,
}

/// The actor's forward, losses and backward over one lane of a micro-batch.
fn actor_pass(
    cfg: &RlConfig,
    st: &ActorStep,
    policy: &Transformer,
    mb: &Micro,
) -> Result<ActorPart, RoleError> {
    let agg = cfg.policy_loss.agg;
    let mut t = ActorTally::default();
    let mut tape = Tape::default();
    let (logp, entropy) = response_forward(
        policy,
        &mb.tb,
        st.temperature,
        Numerics::Differentiable,
        true,
        Some(&mut tape),
    )
    .during("actor forward")?;
    let entropy = entropy.ok_or_else(|| RoleError::Setup("entropy was not computed".into()))?;
    let old = mb.slice(&st.old_logp)?;
    if mb.first {
        let d = ((logp.detach() - &old)
            .during("diff")?
            .abs()
            .during("diff")?
            * &mb.tb.response_mask)
            .during("diff")?;
        t.diff_sum = scalar(&d.sum_all().during("diff")?)?;
        t.diff_tokens = scalar(&mb.tb.response_mask.sum_all().during("diff")?)?;
    }
    let adv = mb.slice(&st.adv)?;
    let out = policy_loss(&cfg.policy_loss, &logp, &old, &adv, &mb.mask).during("policy loss")?;
    let mut loss = out.loss.clone();
    if cfg.entropy_coef != 0.0 {
        let bonus = entropy_bonus(&entropy, &mb.mask, agg).during("entropy bonus")?;
        loss = (loss - (bonus * cfg.entropy_coef).during("entropy")?).during("entropy")?;
    }
    if cfg.kl.mode == KlMode::InLoss
        && let Some(ref_logp) = &st.ref_logp
    {
        let kl = kl_penalty(cfg.kl.estimator, &logp, &mb.slice(ref_logp)?).during("kl loss")?;
        let kl = aggregate(&kl, &mb.mask, agg, cfg.policy_loss.norm_len).during("kl loss")?;
        loss = (loss + (kl * st.kl_coef).during("kl loss")?).during("kl loss")?;
    }
    let loss = (loss * mb.weight).during("loss scaling")?;
    let w = mb.weight;
    t.pg_loss = w * scalar(&out.loss)?;
    t.clip_low = w * out.clip_frac_low as f64;
    t.clip_high = w * out.clip_frac_high as f64;
    t.approx_kl = w * out.approx_kl as f64;
    t.entropy = w * mean_of(&entropy.detach(), &mb.mask)?;
    // The loss alone holds the head's piece now, so the backward frees it (the logits) before
    // the layers' gradients pile up.
    drop((logp, entropy, out));
    let grads = tape.backward(loss).during("actor backward")?;
    Ok(ActorPart { grads, t })
}

/// `pass` over every lane, side by side when there are several; results in lane order.
fn lanes_map<T: Send>(
    lanes: &[Micro],
    pass: impl Fn(&Micro) -> Result<T, RoleError> + Sync + Send,
) -> Result<Vec<T>, RoleError> {
    crate::model::threads::side_by_side(lanes, pass)
        .into_iter()
        .collect()
}

impl MiniBatchLearner for ActorLearner<'_> {
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RoleError> {
        let (cfg, st, policy) = (self.cfg, self.step, self.policy);
        // Summed in lane order, so a run is repeatable whatever thread finishes first.
        for part in lanes_map(lanes, |mb| actor_pass(cfg, st, policy, mb))? {
            self.acc
                .add(self.opt.vars(), part.grads)
                .during("actor backward")?;
            self.t.pg_loss += part.t.pg_loss;
            self.t.clip_low += part.t.clip_low;
            self.t.clip_high += part.t.clip_high;
            self.t.approx_kl += part.t.approx_kl;
            self.t.entropy += part.t.entropy;
            self.t.diff_sum += part.t.diff_sum;
            self.t.diff_tokens += part.t.diff_tokens;
        }
        Ok(())
    }

    fn mini_done(&mut self) -> Result<(), RoleError> {
        let acc = std::mem::take(&mut self.acc);
        let stats = self.opt.step(acc).during("actor optimizer step")?;
        self.t.grad_norm += stats.grad_norm;
        self.t.lr = stats.lr;
        Ok(())
    }
}

/// The actor's epochs on `policy` with `opt`; returns the `actor/*` and `train_infer/*` metrics.
/// Micro-batches are cut into the model's [lanes](crate::model::threads::lanes).
pub fn actor_epochs(
    cfg: &RlConfig,
    step: &ActorStep,
    policy: &Transformer,
    pad_id: u32,
    opt: &mut AdamW,
) -> Result<Metrics, RoleError> {
    let lanes = policy.lanes();
    actor_epochs_in_lanes(cfg, step, policy, (pad_id, lanes), opt)
}

/// [`actor_epochs`] with each micro-batch cut into `lanes` parts worked on side by side.
fn actor_epochs_in_lanes(
    cfg: &RlConfig,
    step: &ActorStep,
    policy: &Transformer,
    (pad_id, lanes): (u32, usize),
    opt: &mut AdamW,
) -> Result<Metrics, RoleError> {
    let kv_groups = policy.config().kv_groups();
    let dev = policy.device().clone();
    let mut learner = ActorLearner {
        cfg,
        step,
        policy,
        opt,
        acc: GradAccumulator::default(),
        t: ActorTally::default(),
    };
    let minis = run_epochs(
        cfg,
        &step.rows,
        (pad_id, kv_groups, lanes),
        &dev,
        &mut learner,
    )?;
    let (t, per) = (learner.t, (minis as f64).max(1.0));
    let mut m = Metrics::new();
    m.insert("actor/pg_loss".into(), t.pg_loss / per);
    m.insert("actor/clip_frac_low".into(), t.clip_low / per);
    m.insert("actor/clip_frac_high".into(), t.clip_high / per);
    m.insert("actor/approx_kl".into(), t.approx_kl / per);
    m.insert("actor/entropy".into(), t.entropy / per);
    m.insert("actor/grad_norm".into(), t.grad_norm / per);
    m.insert("actor/lr".into(), t.lr);
    if t.diff_tokens > 0.0 {
        m.insert(
            "train_infer/logprob_abs_diff".into(),
            t.diff_sum / t.diff_tokens,
        );
    }
    Ok(m)
}

struct CriticLearner<'a> {
    cfg: &'a RlConfig,
    critic: &'a mut CriticNet,
    returns: &'a Tensor,
    old_values: &'a Tensor,
    acc: GradAccumulator,
    value_loss: f64,
    grad_norm: f64,
}

impl MiniBatchLearner for CriticLearner<'_> {
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RoleError> {
        let agg = self.cfg.policy_loss.agg;
        let clip = self.cfg.critic.as_ref().and_then(|c| c.value_clip);
        let (critic, returns, old_values) = (&*self.critic, self.returns, self.old_values);
        let parts = lanes_map(lanes, |mb| {
            let mut tape = Tape::default();
            let values = critic
                .values(&mb.tb, Numerics::Differentiable, Some(&mut tape))
                .during("critic forward")?;
            let (old_v, ret) = (mb.slice(old_values)?, mb.slice(returns)?);
            let vl = (value_loss(&values, &old_v, &ret, &mb.mask, clip, agg)
                .during("value loss")?
                * mb.weight)
                .during("value loss")?;
            let value = scalar(&vl)?;
            drop(values);
            Ok((tape.backward(vl).during("critic backward")?, value))
        })?;
        for (grads, vl) in parts {
            self.acc
                .add(self.critic.opt.vars(), grads)
                .during("critic backward")?;
            self.value_loss += vl;
        }
        Ok(())
    }

    fn mini_done(&mut self) -> Result<(), RoleError> {
        let acc = std::mem::take(&mut self.acc);
        let stats = self.critic.opt.step(acc).during("critic optimizer step")?;
        self.grad_norm += stats.grad_norm;
        Ok(())
    }
}

/// The critic's epochs over the same mini-batch plan; returns the `critic/*` training metrics.
pub fn critic_epochs(
    cfg: &RlConfig,
    step: &CriticStep,
    critic: &mut CriticNet,
    pad_id: u32,
) -> Result<Metrics, RoleError> {
    let kv_groups = critic.model.config().kv_groups();
    let lanes = critic.model.lanes();
    let dev = critic.model.device().clone();
    let mut learner = CriticLearner {
        cfg,
        critic,
        returns: &step.returns,
        old_values: &step.old_values,
        acc: GradAccumulator::default(),
        value_loss: 0.0,
        grad_norm: 0.0,
    };
    let minis = run_epochs(
        cfg,
        &step.rows,
        (pad_id, kv_groups, lanes),
        &dev,
        &mut learner,
    )?;
    let per = (minis as f64).max(1.0);
    let mut m = Metrics::new();
    m.insert("critic/value_loss".into(), learner.value_loss / per);
    m.insert("critic/grad_norm".into(), learner.grad_norm / per);
    Ok(m)
}

pub(super) fn index_tensor(rows: &[usize], dev: &Device) -> Result<Tensor, RoleError> {
    let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    Tensor::from_vec(ids, rows.len(), dev).during("row index")
}

pub(super) fn scalar(t: &Tensor) -> Result<f64, RoleError> {
    t.to_dtype(DType::F64)
        .and_then(|x| x.to_scalar::<f64>())
        .during("reading a scalar")
}

pub fn mean_of(x: &Tensor, mask: &Tensor) -> Result<f64, RoleError> {
    scalar(&masked_mean(x, mask).during("metrics")?)
}

#[cfg(test)]
#[path = "epochs_tests.rs"]
pub(crate) mod tests;
