//! actor_train's half of the training loop: the loss of each lane of a micro-batch — RL's policy
//! loss, SFT's negative log-likelihood or a preference loss over pairs, as the role's
//! [`Objective`] says — its backward, and the metrics of the epochs.

use std::collections::BTreeMap;

use candle_core::Tensor;
use candle_core::backprop::GradStore;

use super::{
    ActorReport, ActorStep, Micro, MiniBatchLearner, PolicyTargets, Targets, lanes_map, mean_of,
    run_epochs, scalar,
};
use crate::algo::aggregate::aggregate;
use crate::algo::distill::{KdParams, distill_loss, divergence, gather_logits};
use crate::algo::kl::kl_penalty;
use crate::algo::loss::{entropy_bonus, policy_loss};
use crate::algo::preference::{
    PairLogps, PreferenceParams, PreferenceStats, domain_rewards, preference_stats,
    preference_sums_by_group, preference_terms,
};
use crate::metrics::Metrics;
use crate::model::{Numerics, Tape, Transformer};
use crate::role::recipe::{Objective, PolicyObjective, TrainRecipe};
use crate::role::{RunError, TensorContext};
use crate::train::batch::{head_logprobs, response_hidden};
use crate::train::{AdamW, GradAccumulator, response_forward};

/// Sums of per-micro-batch diagnostics, weighted by each micro-batch's share of its mini-batch.
#[derive(Default)]
struct ActorTally {
    /// The likelihood objective's loss.
    nll: f64,
    pg_loss: f64,
    clip_low: f64,
    clip_high: f64,
    approx_kl: f64,
    entropy: f64,
    grad_norm: f64,
    lr: f64,
    diff_sum: f64,
    diff_tokens: f64,
    /// The preference objective's loss and pair statistics, and per domain index the sums of
    /// its pairs' statistics with their count.
    pref_loss: f64,
    pref: PreferenceStats,
    pref_domains: BTreeMap<u32, (PreferenceStats, usize)>,
    /// Each row's summed log-prob the first time a pass read it (see `ActorReport::row_logps`).
    row_logps: BTreeMap<u32, f32>,
    /// The distillation objective's loss, its CE and KD parts, and the share of the loss tokens
    /// whose most likely token among the teacher's top k is the teacher's first.
    distill: [f64; 4],
    /// Per domain index: the sums of KD, CE and top-1 agreement over its loss tokens, and their
    /// count.
    distill_domains: BTreeMap<u32, [f64; 4]>,
}

impl ActorTally {
    fn add(&mut self, o: &ActorTally) {
        self.nll += o.nll;
        for (sum, part) in self.distill.iter_mut().zip(o.distill) {
            *sum += part;
        }
        for (k, sums) in &o.distill_domains {
            let into = self.distill_domains.entry(*k).or_default();
            for (a, b) in into.iter_mut().zip(sums) {
                *a += b;
            }
        }
        self.pref_loss += o.pref_loss;
        self.pref += &o.pref;
        for (k, (sums, n)) in &o.pref_domains {
            let (into, count) = self.pref_domains.entry(*k).or_default();
            *into += sums;
            *count += n;
        }
        for (&row, &logp) in &o.row_logps {
            self.row_logps.entry(row).or_insert(logp);
        }
        self.pg_loss += o.pg_loss;
        self.clip_low += o.clip_low;
        self.clip_high += o.clip_high;
        self.approx_kl += o.approx_kl;
        self.entropy += o.entropy;
        self.diff_sum += o.diff_sum;
        self.diff_tokens += o.diff_tokens;
    }
}

struct ActorLearner<'a> {
    objective: &'a Objective,
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

/// The actor's forward, loss and backward over one lane of a micro-batch.
fn actor_pass(
    objective: &Objective,
    st: &ActorStep,
    policy: &Transformer,
    mb: &Micro,
) -> Result<ActorPart, RunError> {
    match (objective, &st.targets) {
        (Objective::Policy(spec), Targets::Policy(targets)) => {
            policy_pass(spec, targets, policy, mb)
        }
        (Objective::Likelihood, Targets::Likelihood) => likelihood_pass(policy, mb),
        (
            Objective::Preference(params),
            Targets::Preference {
                ref_logp,
                pair_domains,
            },
        ) => preference_pass(params, (ref_logp, pair_domains), policy, mb),
        (
            Objective::Distill { params, weight },
            Targets::Distill {
                topk_ids,
                topk_logp,
                row_domains,
            },
        ) => distill_pass(
            (params, *weight),
            (topk_ids, topk_logp, row_domains),
            policy,
            mb,
        ),
        (objective, targets) => Err(RunError::Setup(format!(
            "actor_train was set up for {} and was handed {}",
            objective_name(objective),
            targets.name()
        ))),
    }
}

fn objective_name(objective: &Objective) -> &'static str {
    match objective {
        Objective::Policy(_) => "an RL policy loss",
        Objective::Value { .. } => "a critic's value loss",
        Objective::Likelihood => "SFT",
        Objective::Preference(_) => "a preference loss",
        Objective::Distill { .. } => "distillation",
    }
}

/// RL: the policy loss over the step's advantages, the entropy bonus and the in-loss KL.
fn policy_pass(
    cfg: &PolicyObjective,
    st: &PolicyTargets,
    policy: &Transformer,
    mb: &Micro,
) -> Result<ActorPart, RunError> {
    let agg = cfg.loss.agg;
    let mut t = ActorTally::default();
    let mut tape = Tape::seeded(mb.seed);
    let (logp, entropy) = response_forward(
        policy,
        &mb.tb,
        st.temperature,
        Numerics::Differentiable,
        true,
        Some(&mut tape),
    )
    .during("actor forward")?;
    let entropy = entropy.ok_or_else(|| RunError::Setup("entropy was not computed".into()))?;
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
    let out = policy_loss(&cfg.loss, &logp, &old, &adv, &mb.mask).during("policy loss")?;
    let mut loss = out.loss.clone();
    if cfg.entropy_coef != 0.0 {
        let bonus = entropy_bonus(&entropy, &mb.mask, agg).during("entropy bonus")?;
        loss = (loss - (bonus * cfg.entropy_coef).during("entropy")?).during("entropy")?;
    }
    if let (Some(estimator), Some(ref_logp)) = (cfg.kl_in_loss, &st.ref_logp) {
        let kl = kl_penalty(estimator, &logp, &mb.slice(ref_logp)?).during("kl loss")?;
        let kl = aggregate(&kl, &mb.mask, agg, cfg.loss.norm_len).during("kl loss")?;
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

/// The lane's per-token log-probs of its responses at temperature 1, taped for the backward.
fn response_logps(
    policy: &Transformer,
    mb: &Micro,
    tape: &mut Tape,
) -> candle_core::Result<Tensor> {
    let (logp, _) = response_forward(
        policy,
        &mb.tb,
        1.0,
        Numerics::Differentiable,
        false,
        Some(tape),
    )?;
    Ok(logp)
}

/// SFT: the negative log-likelihood of the lane's loss tokens over the mini-batch's loss tokens,
/// so the lanes' losses add up to the token mean of the whole mini-batch.
fn likelihood_pass(policy: &Transformer, mb: &Micro) -> Result<ActorPart, RunError> {
    let mut tape = Tape::seeded(mb.seed);
    let logp = response_logps(policy, mb, &mut tape).during("sft forward")?;
    let loss = ((logp * &mb.mask)
        .and_then(|x| x.sum_all())
        .and_then(|x| x.neg())
        .during("sft loss")?
        / mb.mini_tokens)
        .during("sft loss")?;
    let nll = loss.to_scalar::<f32>().during("sft loss")? as f64;
    let grads = tape.backward(loss).during("sft backward")?;
    Ok(ActorPart {
        grads,
        t: ActorTally {
            nll,
            ..Default::default()
        },
    })
}

/// Distillation: `(1 − w) CE + w KD` of the lane's loss tokens over the mini-batch's loss tokens
/// (so the lanes' losses add up to the mini-batch's), CE through the fused head as SFT's, KD from
/// the student's logits at the teacher's top-k ids only (`algo::distill`).
fn distill_pass(
    (params, weight): (&KdParams, f64),
    (topk_ids, topk_logp, row_domains): (&Tensor, &Tensor, &[u32]),
    policy: &Transformer,
    mb: &Micro,
) -> Result<ActorPart, RunError> {
    let mut tape = Tape::seeded(mb.seed);
    let sink = tape.head_sink();
    let hidden = response_hidden(policy, &mb.tb, Numerics::Differentiable, Some(&mut tape))
        .during("distill forward")?;
    let (logp, _) = head_logprobs(
        policy,
        &mb.tb,
        &hidden,
        1.0,
        Numerics::Differentiable,
        false,
        Some(sink),
    )
    .during("distill forward")?;
    // As SFT sums it (with w = 0 the stage is SFT to the bit); by row for the domains.
    let token_logp = (&logp * &mb.mask).during("distill ce")?;
    let ce_sum = token_logp
        .sum_all()
        .and_then(|x| x.neg())
        .during("distill ce")?;
    let (b, r, h) = hidden.dims3().during("distill kd")?;
    let ids = mb.slice3(topk_ids)?;
    let k = ids.dim(2).during("distill kd")?;
    let teacher = mb
        .slice3(topk_logp)?
        .reshape((b * r, k))
        .during("distill kd")?;
    let (head_hidden, head) = policy
        .head_operands(
            &hidden.reshape((b * r, h)).during("distill kd")?,
            Numerics::Differentiable,
        )
        .during("distill kd")?;
    let student = gather_logits(
        &head_hidden,
        &head,
        &ids.reshape((b * r, k)).during("distill kd")?,
    )
    .during("distill kd")?;
    let kd = divergence(params, &student, &teacher).during("distill kd")?;
    let mask = mb.mask.flatten_all().during("distill kd")?;
    let (loss, ce, kd_part) =
        distill_loss(&ce_sum, &kd, &mask, mb.mini_tokens, weight).during("distill loss")?;
    // The student's most likely token among the teacher's k is the teacher's first (index 0).
    let agree_tokens = student
        .argmax(1)
        .and_then(|i| i.eq(0u32))
        .and_then(|x| x.to_dtype(candle_core::DType::F32))
        .and_then(|x| x * &mask)
        .during("distill metrics")?;
    let agree = agree_tokens.sum_all().during("distill metrics")?;
    let mut distill_domains = BTreeMap::new();
    if !row_domains.is_empty() {
        // Per row, then summed by its domain: KD, CE, agreement and loss tokens.
        let per_row = |t: &Tensor| {
            t.reshape((b, r))
                .and_then(|x| x.sum(1))
                .and_then(|x| x.to_vec1::<f32>())
                .during("distill metrics")
        };
        let kd_rows = per_row(&(&kd * &mask).during("distill metrics")?)?;
        let agree_rows = per_row(&agree_tokens)?;
        let token_rows = per_row(&mask)?;
        let ce_rows: Vec<f32> = per_row(&token_logp.detach())?.iter().map(|x| -x).collect();
        let rows = mb.idx.to_vec1::<u32>().during("distill metrics")?;
        for (i, row) in rows.iter().enumerate() {
            let domain = row_domains.get(*row as usize).copied().ok_or_else(|| {
                RunError::Setup(format!("row {row} of the distillation batch has no domain"))
            })?;
            let sums: &mut [f64; 4] = distill_domains.entry(domain).or_default();
            for (into, v) in
                sums.iter_mut()
                    .zip([kd_rows[i], ce_rows[i], agree_rows[i], token_rows[i]])
            {
                *into += v as f64;
            }
        }
    }
    let value = |t: &Tensor| scalar(t);
    let distill = [
        value(&loss)?,
        value(&ce)?,
        value(&kd_part)?,
        value(&agree)? / mb.mini_tokens.max(1.0),
    ];
    drop((hidden, student, kd));
    let grads = tape.backward(loss).during("distill backward")?;
    Ok(ActorPart {
        grads,
        t: ActorTally {
            distill,
            distill_domains,
            ..Default::default()
        },
    })
}

/// Preference pairs: the loss of each pair from the policy's and the reference's log-probs of its
/// two rows (`preference_terms`), averaged over the mini-batch's pairs (the lane's rows are whole
/// pairs, chosen then rejected); TRL's statistics from the summed log-probs.
fn preference_pass(
    params: &PreferenceParams,
    (ref_logp, pair_domains): (&Tensor, &[u32]),
    policy: &Transformer,
    mb: &Micro,
) -> Result<ActorPart, RunError> {
    let mut tape = Tape::seeded(mb.seed);
    let logp = response_logps(policy, mb, &mut tape).during("dpo forward")?;
    let (losses, sums) =
        preference_terms(params, &logp, &mb.slice(ref_logp)?, &mb.mask).during("dpo loss")?;
    let mut loss =
        (losses.mean_all().during("dpo loss")? * (params.weight * mb.weight)).during("dpo loss")?;
    if params.sft_weight != 0.0 {
        // The chosen completions' negative log-likelihood, a mean over the mini-batch's chosen
        // tokens (the lane's part of it).
        let nll = sums
            .chosen
            .sum_all()
            .and_then(|x| x.neg())
            .and_then(|x| x / mb.mini_lead_tokens.max(1.0))
            .and_then(|x| x * params.sft_weight)
            .during("dpo sft loss")?;
        loss = (loss + nll).during("dpo sft loss")?;
    }
    let (chosen_d, rejected_d) = (sums.chosen.detach(), sums.rejected.detach());
    let detached = PairLogps {
        chosen: &chosen_d,
        rejected: &rejected_d,
        ..sums.logps()
    };
    let s = preference_stats(params.beta, &detached).during("dpo metrics")?;
    let mut pref_domains = BTreeMap::new();
    if !pair_domains.is_empty() {
        // The lane's rows are whole pairs, chosen first: row 2k + 1's pair is k.
        let rows = mb.idx.to_vec1::<u32>().during("dpo metrics")?;
        let groups = rows
            .iter()
            .step_by(2)
            .map(|&row| pair_domains.get(row as usize / 2).copied())
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| RunError::Setup("a pair of the step has no domain".into()))?;
        pref_domains =
            preference_sums_by_group(params.beta, &detached, &groups).during("dpo metrics")?;
    }
    // Row 2k of the lane is pair k's chosen completion, row 2k + 1 its rejected one.
    let rows = mb.idx.to_vec1::<u32>().during("dpo metrics")?;
    let chosen = chosen_d.to_vec1::<f32>().during("dpo metrics")?;
    let rejected = rejected_d.to_vec1::<f32>().during("dpo metrics")?;
    let row_logps = rows
        .chunks(2)
        .zip(chosen.iter().zip(&rejected))
        .flat_map(|(pair, (&c, &r))| pair.iter().copied().zip([c, r]))
        .collect();
    let t = ActorTally {
        pref_loss: scalar(&loss)?,
        pref: s.scaled(mb.weight),
        pref_domains,
        row_logps,
        ..Default::default()
    };
    drop((logp, sums, losses));
    let grads = tape.backward(loss).during("dpo backward")?;
    Ok(ActorPart { grads, t })
}

impl MiniBatchLearner for ActorLearner<'_> {
    fn micro(&mut self, lanes: &[Micro]) -> Result<(), RunError> {
        let (objective, st, policy) = (self.objective, self.step, self.policy);
        // Summed in lane order, so a run is repeatable whatever thread finishes first.
        for part in lanes_map(lanes, |mb| actor_pass(objective, st, policy, mb))? {
            self.acc
                .add(self.opt.vars(), part.grads)
                .during("actor backward")?;
            self.t.add(&part.t);
        }
        Ok(())
    }

    fn mini_done(&mut self) -> Result<(), RunError> {
        let acc = std::mem::take(&mut self.acc);
        let stats = self.opt.step(acc).during("actor optimizer step")?;
        self.t.grad_norm += stats.grad_norm;
        self.t.lr = stats.lr;
        Ok(())
    }
}

/// actor_train's epochs on `policy` with `opt`; returns the metrics of the recipe's objective
/// (RL: `actor/*` and `train_infer/*`; SFT: `sft/loss`; preference: TRL's names) and
/// `actor/grad_norm`, `actor/lr`, and a preference step's rows' log-probs.
/// Micro-batches are cut into the model's [lanes](crate::model::threads::lanes).
pub fn actor_epochs(
    recipe: &TrainRecipe,
    step: &ActorStep,
    policy: &Transformer,
    pad_id: u32,
    opt: &mut AdamW,
) -> Result<ActorReport, RunError> {
    let lanes = policy.lanes();
    actor_epochs_in_lanes(recipe, step, policy, (pad_id, lanes), opt)
}

/// [`actor_epochs`] with each micro-batch cut into `lanes` parts worked on side by side.
pub(in crate::role) fn actor_epochs_in_lanes(
    recipe: &TrainRecipe,
    step: &ActorStep,
    policy: &Transformer,
    (pad_id, lanes): (u32, usize),
    opt: &mut AdamW,
) -> Result<ActorReport, RunError> {
    let kv_groups = policy.config().kv_groups();
    let dev = policy.device().clone();
    let mut learner = ActorLearner {
        objective: &recipe.objective,
        step,
        policy,
        opt,
        acc: GradAccumulator::default(),
        t: ActorTally::default(),
    };
    let minis = run_epochs(
        recipe,
        &step.rows,
        (pad_id, kv_groups, lanes),
        &dev,
        &mut learner,
    )?;
    let (t, per) = (learner.t, (minis as f64).max(1.0));
    let mut m = Metrics::new();
    match recipe.objective {
        Objective::Likelihood => {
            m.insert("sft/loss".into(), t.nll / per);
        }
        Objective::Distill { .. } => {
            for (key, sum) in ["loss", "ce", "kd", "top1_agreement"].iter().zip(t.distill) {
                m.insert(format!("distill/{key}"), sum / per);
            }
            // Per domain index (the stage names them): means over the domain's loss tokens.
            for (k, [kd, ce, agree, tokens]) in &t.distill_domains {
                let tokens = tokens.max(1.0);
                m.insert(format!("distill/{k}/kd"), kd / tokens);
                m.insert(format!("distill/{k}/ce"), ce / tokens);
                m.insert(format!("distill/{k}/top1_agreement"), agree / tokens);
            }
        }
        // TRL's names.
        Objective::Preference(_) => {
            m.insert("loss".into(), t.pref_loss / per);
            m.extend(t.pref.mean_over(minis).metrics(""));
            // Per domain index (the stage names them): means over the domain's pairs.
            for (k, (sums, n)) in &t.pref_domains {
                m.extend(domain_rewards(
                    "rewards",
                    &k.to_string(),
                    &sums.mean_over(*n),
                ));
            }
        }
        _ => {
            m.insert("actor/pg_loss".into(), t.pg_loss / per);
            m.insert("actor/clip_frac_low".into(), t.clip_low / per);
            m.insert("actor/clip_frac_high".into(), t.clip_high / per);
            m.insert("actor/approx_kl".into(), t.approx_kl / per);
            m.insert("actor/entropy".into(), t.entropy / per);
        }
    }
    m.insert("actor/grad_norm".into(), t.grad_norm / per);
    m.insert("actor/lr".into(), t.lr);
    if t.diff_tokens > 0.0 {
        m.insert(
            "train_infer/logprob_abs_diff".into(),
            t.diff_sum / t.diff_tokens,
        );
    }
    Ok(ActorReport {
        metrics: m,
        row_logps: t.row_logps,
    })
}
