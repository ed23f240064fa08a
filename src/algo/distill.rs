//! Knowledge distillation's divergences over a teacher's top-k, as ROLL's distill pipeline
//! defines them (`roll/pipeline/distill/various_divergence.py`): `forward_kl`, `reverse_kl`,
//! `adaptive_kl`, `skewed_forward_kl`, `skewed_reverse_kl` and `js_divergence`.
//!
//! What moves from the teacher is, per response position, its k most likely tokens and their
//! log-probs renormalised over those k (ROLL divides the teacher's logits by `kd_temperature`
//! and by `teacher_temperature`, takes the top k, and log-softmaxes them). The student's logits
//! are gathered at the same k ids ([`gather_logits`]), divided by `kd_temperature` and
//! (log-)softmaxed over the k: both distributions live on the teacher's top-k support. With p the
//! teacher's and q the student's distribution over it:
//!
//! - `forward_kl`: Σ p (log p − log q)
//! - `reverse_kl`: Σ q (log q − log p)
//! - `adaptive_kl` (α = `adaptive_kl_alpha`): the teacher's probabilities sorted ascending; the
//!   "tail" is the prefix whose cumulative probability is ≤ α, the "head" the rest; with
//!   g_head = Σ_head |p − q| and g_tail = Σ_tail |p − q| (not differentiated),
//!   (g_head fkl + g_tail rkl) / (g_head + g_tail). Where p = q exactly both gaps are 0 and ROLL
//!   divides 0 by 0; here both divergences are 0 there and so is the result.
//! - `skewed_forward_kl` (λ = `skew_lambda`): Σ p (log p − log (λ p + (1 − λ) q))
//! - `skewed_reverse_kl`: Σ q (log q − log ((1 − λ) p + λ q))
//! - `js_divergence`: with m = (p + q) / 2 and ε = 1e-9 inside each log, as ROLL:
//!   (Σ p (log(p + ε) − log(m + ε)) + Σ q (log(q + ε) − log(m + ε))) / 2
//!
//! The stage's loss is `(1 − w) CE + w KD` (`w` = `distill_loss_weight`), each summed over the
//! batch's response tokens and divided by their count ([`distill_loss`]).

use candle_core::{D, DType, Result, Tensor, bail};
use serde::{Deserialize, Serialize};

/// `distill.kd_objective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KdObjective {
    #[default]
    ForwardKl,
    ReverseKl,
    AdaptiveKl,
    SkewedForwardKl,
    SkewedReverseKl,
    JsDivergence,
}

impl KdObjective {
    pub fn as_str(self) -> &'static str {
        match self {
            KdObjective::ForwardKl => "forward_kl",
            KdObjective::ReverseKl => "reverse_kl",
            KdObjective::AdaptiveKl => "adaptive_kl",
            KdObjective::SkewedForwardKl => "skewed_forward_kl",
            KdObjective::SkewedReverseKl => "skewed_reverse_kl",
            KdObjective::JsDivergence => "js_divergence",
        }
    }
}

/// The divergence's parameters, with ROLL's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KdParams {
    pub objective: KdObjective,
    /// Divides the student's logits (and, before the top-k, the teacher's).
    pub kd_temperature: f64,
    /// `adaptive_kl`'s tail mass α.
    pub adaptive_kl_alpha: f64,
    /// The skewed KLs' λ.
    pub skew_lambda: f64,
}

impl Default for KdParams {
    fn default() -> Self {
        KdParams {
            objective: KdObjective::ForwardKl,
            kd_temperature: 1.0,
            adaptive_kl_alpha: 0.5,
            skew_lambda: 0.1,
        }
    }
}

/// ε inside `js_divergence`'s logs, as ROLL has it.
const JS_EPS: f64 = 1e-9;

/// The student's logits at the teacher's top-k ids: `hidden` (n, h) times the rows `ids` (n, k)
/// u32 of the output head `head` (vocab, h), (n, k) — never the full vocabulary's logits.
/// Differentiable in `hidden` and `head` (candle's graph).
pub fn gather_logits(hidden: &Tensor, head: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (n, h) = hidden.dims2()?;
    let (n_ids, k) = ids.dims2()?;
    if n != n_ids {
        bail!("gather_logits: {n} hidden rows but top-k ids for {n_ids}");
    }
    let rows = head
        .index_select(&ids.flatten_all()?, 0)?
        .to_dtype(hidden.dtype())?
        .reshape((n, k, h))?;
    // (n, k, h) x (n, h, 1) -> (n, k, 1).
    rows.matmul(&hidden.unsqueeze(2)?)?.squeeze(2)
}

/// Per position, the divergence between the teacher's distribution over its top k (`teacher_logp`,
/// (n, k), log-probs renormalised over the k) and the student's (`student_logits`, (n, k), its
/// logits at the same ids): (n,). Differentiable in the student's logits.
pub fn divergence(
    params: &KdParams,
    student_logits: &Tensor,
    teacher_logp: &Tensor,
) -> Result<Tensor> {
    if student_logits.dims() != teacher_logp.dims() {
        bail!(
            "divergence: student logits {:?} and teacher log-probs {:?} differ in shape",
            student_logits.dims(),
            teacher_logp.dims()
        );
    }
    let z = (student_logits.to_dtype(DType::F32)? / params.kd_temperature)?;
    let lq = candle_nn::ops::log_softmax(&z, D::Minus1)?;
    let q = lq.exp()?;
    let lp = teacher_logp.to_dtype(DType::F32)?.detach();
    let p = lp.exp()?;
    let forward = |lq: &Tensor| (&p * (&lp - lq)?)?.sum(D::Minus1);
    let reverse = || (&q * (&lq - &lp)?)?.sum(D::Minus1);
    match params.objective {
        KdObjective::ForwardKl => forward(&lq),
        KdObjective::ReverseKl => reverse(),
        KdObjective::AdaptiveKl => {
            let (w_head, w_tail) = adaptive_weights(&p, &q, params.adaptive_kl_alpha)?;
            (forward(&lq)? * w_head)? + (reverse()? * w_tail)?
        }
        KdObjective::SkewedForwardKl => {
            let l = params.skew_lambda;
            let m = ((&p * l)? + (&q * (1.0 - l))?)?;
            (&p * (&lp - m.log()?)?)?.sum(D::Minus1)
        }
        KdObjective::SkewedReverseKl => {
            let l = params.skew_lambda;
            let m = ((&p * (1.0 - l))? + (&q * l)?)?;
            (&q * (&lq - m.log()?)?)?.sum(D::Minus1)
        }
        KdObjective::JsDivergence => {
            let m = ((&p + &q)? * 0.5)?;
            let lm = (&m + JS_EPS)?.log()?;
            let lp_eps = (&p + JS_EPS)?.log()?;
            let lq_eps = (&q + JS_EPS)?.log()?;
            let to_teacher = (&p * (lp_eps - &lm)?)?.sum(D::Minus1)?;
            let to_student = (&q * (lq_eps - &lm)?)?.sum(D::Minus1)?;
            (to_teacher + to_student)? * 0.5
        }
    }
}

/// `adaptive_kl`'s weights of the forward and the reverse KL per position, (n,) each, out of
/// candle's graph (ROLL detaches the gaps).
fn adaptive_weights(p: &Tensor, q: &Tensor, alpha: f64) -> Result<(Tensor, Tensor)> {
    let (n, _) = p.dims2()?;
    let (pv, qv) = (p.to_vec2::<f32>()?, q.detach().to_vec2::<f32>()?);
    let mut head = Vec::with_capacity(n);
    let mut tail = Vec::with_capacity(n);
    for (pr, qr) in pv.iter().zip(&qv) {
        let mut order: Vec<usize> = (0..pr.len()).collect();
        // Ascending by the teacher's probability, as `torch.sort` (ties in index order).
        order.sort_by(|&a, &b| pr[a].total_cmp(&pr[b]).then(a.cmp(&b)));
        let (mut cum, mut g_head, mut g_tail) = (0f64, 0f64, 0f64);
        for &i in &order {
            cum += pr[i] as f64;
            let gap = (pr[i] as f64 - qr[i] as f64).abs();
            if cum <= alpha {
                g_tail += gap;
            } else {
                g_head += gap;
            }
        }
        let total = g_head + g_tail;
        // p = q: both divergences are 0, whatever they are weighed by.
        let (h, t) = if total > 0.0 {
            (g_head / total, g_tail / total)
        } else {
            (0.5, 0.5)
        };
        head.push(h as f32);
        tail.push(t as f32);
    }
    let dev = p.device();
    Ok((Tensor::new(head, dev)?, Tensor::new(tail, dev)?))
}

/// The stage's loss over a batch: `(1 − w) CE + w KD`, with `ce_sum` the summed negative
/// log-likelihood of the response tokens, `kd` the per-token divergences (n,) and `mask` (n,)
/// 0/1 which positions count, both sums divided by `tokens` (the batch's response tokens, so
/// micro-batches add up to the batch's loss). Returns (loss, CE part, KD part), the parts before
/// weighting.
pub fn distill_loss(
    ce_sum: &Tensor,
    kd: &Tensor,
    mask: &Tensor,
    tokens: f64,
    weight: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let tokens = tokens.max(1.0);
    let ce = (ce_sum / tokens)?;
    let kd = ((kd * mask)?.sum_all()? / tokens)?;
    let loss = ((&ce * (1.0 - weight))? + (&kd * weight)?)?;
    Ok((loss, ce, kd))
}

#[cfg(test)]
#[path = "distill_tests.rs"]
mod tests;
