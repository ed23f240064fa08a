//! The one training loop of every stage: epochs over mini-batches and micro-batches, gradients
//! accumulated over a mini-batch's micro-batches (cut into lanes worked on side by side), one
//! optimizer step per mini-batch. What the loop minimises is the role's [`TrainRecipe`]: RL's
//! policy loss (actor_train) and, under GAE, the critic's value loss; SFT's negative
//! log-likelihood (actor_train). The actor and the critic are independent — neither reads the
//! other's weights — so each runs its own pass over the same seeded mini-batch plan, and either
//! pass can run in a worker process ([`ActorStep`] and [`CriticStep`] are everything they need;
//! `step_file` carries each as one shared-memory safetensors file).

use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::critic::CriticNet;
use super::recipe::{Objective, TrainRecipe};
use super::{RunError, TensorContext};
use crate::algo::aggregate::{LossAgg, masked_mean};
use crate::algo::loss::value_loss;
use crate::data::mix_seed;
use crate::metrics::Metrics;
use crate::model::threads::micro_batches_in_lanes;
use crate::model::{Numerics, Tape};
use crate::train::{GradAccumulator, TrainBatch};

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

impl EpochRows {
    /// (n, longest response) f32: 1 on every response token, 0 past a row's end.
    pub fn response_mask(responses: &[Vec<u32>], device: &Device) -> candle_core::Result<Tensor> {
        let width = responses.iter().map(Vec::len).max().unwrap_or(0);
        let data: Vec<f32> = responses
            .iter()
            .flat_map(|r| (0..width).map(move |j| f32::from(u8::from(j < r.len()))))
            .collect();
        Tensor::from_vec(data, (responses.len(), width), device)
    }
}

/// Everything actor_train's epochs read: the rows and what the stage's loss needs of them.
pub struct ActorStep {
    pub rows: EpochRows,
    pub targets: Targets,
}

/// What a stage hands actor_train besides the rows; it must match the role's [`Objective`].
pub enum Targets {
    /// RL: the per-token targets of the policy loss.
    Policy(PolicyTargets),
    /// SFT: the rows' responses are the targets themselves.
    Likelihood,
    /// Preference pairs (rows 2k chosen, 2k+1 rejected, `group_size` 2): the reference's
    /// per-token log-probs of every row, (n, R) f32, and each pair's domain as an index (empty:
    /// no per-domain metrics); the role reports `rewards/<index>/*` per domain.
    Preference {
        ref_logp: Tensor,
        pair_domains: Vec<u32>,
    },
    /// Distillation: the teacher's top k at every response position, most likely first: ids
    /// (n, R, k) u32 and log-probs renormalised over the k (n, R, k) f32; and each row's domain
    /// as an index (empty: no per-domain metrics); the role reports `distill/<index>/*`.
    Distill {
        topk_ids: Tensor,
        topk_logp: Tensor,
        row_domains: Vec<u32>,
    },
}

impl Targets {
    fn name(&self) -> &'static str {
        match self {
            Targets::Policy(_) => "an RL step",
            Targets::Likelihood => "an SFT batch",
            Targets::Preference { .. } => "preference pairs",
            Targets::Distill { .. } => "a distillation batch",
        }
    }
}

/// The per-token targets of an RL step's policy loss.
pub struct PolicyTargets {
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
    /// The loss tokens of the whole mini-batch.
    mini_tokens: f64,
    /// The loss tokens of the first row of each of the mini-batch's groups: a preference step's
    /// chosen completions.
    mini_lead_tokens: f64,
    /// Seeds its forward's random choices (LoRA dropout): a function of the step's seed and
    /// where the micro-batch falls in it, so a resumed run or a worker process draws the same.
    seed: u64,
}

impl Micro {
    /// The micro-batch's rows of a (n, R) tensor, cut to its response width.
    fn slice(&self, x: &Tensor) -> Result<Tensor, RunError> {
        x.index_select(&self.idx, 0)
            .and_then(|x| x.narrow(1, 0, self.tb.response_width))
            .during("rl slice")
    }

    /// The micro-batch's rows of a (n, R, k) tensor, cut to its response width, contiguous.
    fn slice3(&self, x: &Tensor) -> Result<Tensor, RunError> {
        self.slice(x)?.contiguous().during("slice")
    }
}

trait MiniBatchLearner {
    /// The lanes of one micro-batch, each a part of its rows: their passes may run side by side.
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RunError>;
    /// Every micro-batch of a mini-batch was seen: take the optimizer step.
    fn mini_done(&mut self) -> Result<(), RunError>;
}

/// Drive `learner` through the recipe's epochs, each micro-batch cut into `lanes` parts.
/// Returns the mini-batches stepped.
fn run_epochs(
    recipe: &TrainRecipe,
    rows: &EpochRows,
    (pad_id, kv_groups, lanes): (u32, usize, usize),
    dev: &Device,
    learner: &mut dyn MiniBatchLearner,
) -> Result<usize, RunError> {
    let g = rows.group_size;
    let n_groups = rows.prompts.len() / g;
    let groups_per_mini = n_groups.div_ceil(recipe.mini_batches.max(1));
    let mut minis = 0;
    for epoch in 0..recipe.epochs {
        // Mini-batches take whole groups, in a seeded random order when the recipe says so
        // (why: `TrainRecipe::shuffle`).
        let mut order: Vec<usize> = (0..n_groups).collect();
        if recipe.shuffle {
            order.shuffle(&mut StdRng::seed_from_u64(mix_seed(&[
                rows.seed,
                epoch as u64,
            ])));
        }
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
            let leads: Vec<usize> = mini_groups.iter().map(|&grp| grp * g).collect();
            let mini_lead_tokens = scalar(
                &rows
                    .loss_mask
                    .index_select(&index_tensor(&leads, dev)?, 0)
                    .and_then(|x| x.sum_all())
                    .during("mask")?,
            )?;
            let lens: Vec<(usize, usize)> = mini
                .iter()
                .map(|&i| (rows.prompts[i].len(), rows.responses[i].len()))
                .collect();
            let micros = if recipe.objective.keeps_groups_whole() {
                whole_groups(&lens, g, rows.micro, lanes)
            } else {
                micro_batches_in_lanes(&lens, rows.micro, lanes)
            };
            for (micro_idx, micro) in micros.into_iter().enumerate() {
                // Each lane is a micro-batch of its own, weighted by its share of the mini-batch,
                // so the lanes' gradients sum to the micro-batch's.
                let mut parts = vec![];
                for (lane, part) in micro.into_iter().enumerate() {
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
                    let weight = match recipe.objective.agg() {
                        LossAgg::TokenMean => tokens / mini_tokens,
                        _ => part.len() as f64 / mini.len() as f64,
                    };
                    parts.push(Micro {
                        first: epoch == 0 && mini_idx == 0,
                        tb,
                        idx,
                        weight,
                        mask,
                        mini_tokens,
                        mini_lead_tokens,
                        seed: mix_seed(&[
                            rows.seed,
                            epoch as u64,
                            mini_idx as u64,
                            micro_idx as u64,
                            lane as u64,
                        ]),
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

/// [`micro_batches_in_lanes`] over whole groups of `g` consecutive rows (`lens` lists the rows of
/// whole groups): micro-batches of about `micro` rows, lanes of whole groups, each group's rows
/// consecutive and in their order.
fn whole_groups(
    lens: &[(usize, usize)],
    g: usize,
    micro: usize,
    lanes: usize,
) -> Vec<Vec<Vec<usize>>> {
    let g = g.max(1);
    // A group costs what its rows do side by side: its longest prompt and response, g times.
    let group_lens: Vec<(usize, usize)> = lens
        .chunks(g)
        .map(|rows| {
            let p = rows.iter().map(|r| r.0).max().unwrap_or(0);
            let r = rows.iter().map(|r| r.1).max().unwrap_or(0);
            (p, r)
        })
        .collect();
    micro_batches_in_lanes(&group_lens, (micro / g).max(1), lanes)
        .into_iter()
        .map(|lanes| {
            lanes
                .into_iter()
                .map(|groups| {
                    groups
                        .into_iter()
                        .flat_map(|k| k * g..(k + 1) * g)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// `pass` over every lane, side by side when there are several; results in lane order.
fn lanes_map<T: Send>(
    lanes: &[Micro],
    pass: impl Fn(&Micro) -> Result<T, RunError> + Sync + Send,
) -> Result<Vec<T>, RunError> {
    crate::model::threads::side_by_side(lanes, pass)
        .into_iter()
        .collect()
}

struct CriticLearner<'a> {
    clip: Option<f64>,
    agg: LossAgg,
    critic: &'a mut CriticNet,
    returns: &'a Tensor,
    old_values: &'a Tensor,
    acc: GradAccumulator,
    value_loss: f64,
    grad_norm: f64,
}

impl MiniBatchLearner for CriticLearner<'_> {
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RunError> {
        let (agg, clip) = (self.agg, self.clip);
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

    fn mini_done(&mut self) -> Result<(), RunError> {
        let acc = std::mem::take(&mut self.acc);
        let stats = self.critic.opt.step(acc).during("critic optimizer step")?;
        self.grad_norm += stats.grad_norm;
        Ok(())
    }
}

/// The critic's epochs over the same mini-batch plan; returns the `critic/*` training metrics.
pub fn critic_epochs(
    recipe: &TrainRecipe,
    step: &CriticStep,
    critic: &mut CriticNet,
    pad_id: u32,
) -> Result<Metrics, RunError> {
    let kv_groups = critic.model.config().kv_groups();
    let lanes = critic.model.lanes();
    let dev = critic.model.device().clone();
    let Objective::Value { clip, agg } = recipe.objective else {
        return Err(RunError::Setup(
            "the critic was set up without a value loss".into(),
        ));
    };
    let mut learner = CriticLearner {
        clip,
        agg,
        critic,
        returns: &step.returns,
        old_values: &step.old_values,
        acc: GradAccumulator::default(),
        value_loss: 0.0,
        grad_norm: 0.0,
    };
    let minis = run_epochs(
        recipe,
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

pub(super) fn index_tensor(rows: &[usize], dev: &Device) -> Result<Tensor, RunError> {
    let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    Tensor::from_vec(ids, rows.len(), dev).during("row index")
}

pub(super) fn scalar(t: &Tensor) -> Result<f64, RunError> {
    t.to_dtype(DType::F64)
        .and_then(|x| x.to_scalar::<f64>())
        .during("reading a scalar")
}

pub fn mean_of(x: &Tensor, mask: &Tensor) -> Result<f64, RunError> {
    scalar(&masked_mean(x, mask).during("metrics")?)
}

/// What actor_train's epochs over a step give back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActorReport {
    pub metrics: Metrics,
    /// A preference step's rows: each one's summed response log-prob under the policy as the
    /// step's first epoch read it, by the row's index in the step (the pairs' implicit rewards,
    /// which the stage records as samples). Empty for the other objectives.
    pub row_logps: std::collections::BTreeMap<u32, f32>,
}

mod actor;
pub use actor::actor_epochs;

#[cfg(test)]
#[path = "epochs_tests.rs"]
pub(crate) mod tests;
