//! Policy losses (PPO clip with asymmetric ε and dual clip, GSPO, TIS, TOPR, CISPO, RAFT++, vanilla
//! policy gradient), the entropy bonus and the clipped value loss.
//!
//! Sign convention: losses are MINIMISED, so a positive advantage pushes `logp` up (negative gradient).
//! `old_logp`, `advantages` and `mask` are treated as constants (detached); only `logp` carries grad.
//! `ratio = exp(clamp(logp - old_logp, -20, 20))` (the clamp keeps `exp` finite, as in verl).

use candle_core::{Result, Tensor, bail};
use serde::{Deserialize, Serialize};

use super::aggregate::{LossAgg, aggregate};
use super::{check_dims2, host_rows};

/// Bound on log-ratios before `exp`.
const LOG_RATIO_CLAMP: f64 = 20.0;

/// Which policy-gradient objective is optimised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLossKind {
    /// `-min(r A, clip(r, 1-εl, 1+εh) A)`, optional dual clip for `A < 0`.
    #[default]
    Ppo,
    /// PPO clip on the sequence ratio `exp(mean_t log r)`, token-level gradient form.
    Gspo,
    /// `-min(r, tis_cap).detach() A logp`.
    Tis,
    /// `-A logp` for `A >= 0`; `-clamp(r, 0, 1).detach() A logp` for `A < 0`.
    Topr,
    /// `-clip(r, 1-εl, 1+εh).detach() A logp`: clipped weight, gradient on every token.
    Cispo,
    /// PPO clip on samples with `A > 0` only (the others are masked out).
    RaftPp,
    /// `-A logp`.
    Vanilla,
}

/// Parameters of [`policy_loss`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyLossParams {
    pub kind: PolicyLossKind,
    /// Lower clip ε: the ratio is clipped below at `1 - clip_low`.
    pub clip_low: f64,
    /// Upper clip ε: clipped above at `1 + clip_high`; `> clip_low` is DAPO's "clip-higher".
    pub clip_high: f64,
    /// Dual clip constant `c > 1` (PPO only): for `A < 0` the loss is capped at `-c A`.
    pub dual_clip: Option<f64>,
    /// Cap of the truncated importance weight (TIS).
    pub tis_cap: f64,
    pub agg: LossAgg,
    /// Constant length for `LossAgg::SeqMeanTokenSumNorm`.
    pub norm_len: Option<f64>,
}

impl Default for PolicyLossParams {
    fn default() -> Self {
        Self {
            kind: PolicyLossKind::Ppo,
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            tis_cap: 2.0,
            agg: LossAgg::TokenMean,
            norm_len: None,
        }
    }
}

/// The scalar loss plus diagnostics (all diagnostics are over the tokens the loss uses).
#[derive(Debug, Clone)]
pub struct PolicyLossOutput {
    /// Scalar, differentiable wrt `logp`.
    pub loss: Tensor,
    /// Fraction of tokens whose weight/ratio was clipped from below (`r < 1 - clip_low`).
    pub clip_frac_low: f32,
    /// Fraction clipped from above: `r > 1 + clip_high`; TIS: `r > tis_cap`; TOPR: `A < 0 && r > 1`.
    pub clip_frac_high: f32,
    /// `mean 0.5 (logp - old_logp)^2` (ROLL's "approxkl").
    pub approx_kl: f32,
    /// Mean ratio (the sequence ratio for GSPO); 1 when no token is valid.
    pub ratio_mean: f32,
}

/// Policy-gradient loss of one micro-batch.
/// logp, old_logp, advantages, mask: (batch, seq) -> loss: scalar (+ metrics)
pub fn policy_loss(
    p: &PolicyLossParams,
    logp: &Tensor,
    old_logp: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
) -> Result<PolicyLossOutput> {
    let (b, s) = logp.dims2()?;
    check_dims2("old_logp", old_logp, (b, s))?;
    check_dims2("advantages", advantages, (b, s))?;
    check_dims2("mask", mask, (b, s))?;
    if p.clip_low < 0.0 || p.clip_low >= 1.0 || p.clip_high < 0.0 {
        bail!(
            "clip range must satisfy 0 <= clip_low < 1 and clip_high >= 0, got low {} high {}",
            p.clip_low,
            p.clip_high
        );
    }
    if let Some(c) = p.dual_clip.filter(|c| *c <= 1.0) {
        bail!("dual_clip must be > 1, got {c}");
    }
    let dt = logp.dtype();
    let old = old_logp.detach().to_dtype(dt)?;
    let adv = advantages.detach().to_dtype(dt)?;
    let mut loss_mask = mask.detach().to_dtype(dt)?;
    let log_ratio = (logp - &old)?.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)?;
    let ratio = log_ratio.exp()?;
    let (lo, hi) = (1.0 - p.clip_low, 1.0 + p.clip_high);
    // The ratio reported in metrics (per token; the sequence ratio for GSPO).
    let mut metric_ratio = ratio.detach();
    let loss_mat = match p.kind {
        PolicyLossKind::Ppo => ppo_clip(&ratio, &adv, lo, hi, p.dual_clip)?,
        PolicyLossKind::RaftPp => {
            loss_mask = (loss_mask * adv.gt(0.0)?.to_dtype(dt)?)?;
            ppo_clip(&ratio, &adv, lo, hi, None)?
        }
        PolicyLossKind::Gspo => {
            // log s_i = masked mean of log r over the row (a constant), then the token form
            // log s_it = logp_t - sg(logp_t) + sg(log s_i): value s_i, d s_it / d logp_t = s_i.
            let lr = (&log_ratio * &loss_mask)?.sum_keepdim(1)?;
            let seq_log = (lr / loss_mask.sum_keepdim(1)?.maximum(1.0)?)?.detach();
            let tok_log = (logp - logp.detach())?.broadcast_add(&seq_log)?;
            let seq_ratio = tok_log.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)?.exp()?;
            metric_ratio = seq_ratio.detach();
            ppo_clip(&seq_ratio, &adv, lo, hi, None)?
        }
        PolicyLossKind::Tis => weighted_pg(&ratio.detach().minimum(p.tis_cap)?, &adv, logp)?,
        PolicyLossKind::Topr => {
            let neg_w = ratio.detach().clamp(0.0, 1.0)?;
            let w = adv.ge(0.0)?.where_cond(&neg_w.ones_like()?, &neg_w)?;
            weighted_pg(&w, &adv, logp)?
        }
        PolicyLossKind::Cispo => weighted_pg(&ratio.detach().clamp(lo, hi)?, &adv, logp)?,
        PolicyLossKind::Vanilla => (&adv * logp)?.neg()?,
    };
    let loss = aggregate(&loss_mat, &loss_mask, p.agg, p.norm_len)?;
    let (clip_frac_low, clip_frac_high, approx_kl, ratio_mean) = metrics(
        p,
        &host_rows(&metric_ratio)?,
        &host_rows(&log_ratio)?,
        &host_rows(&adv)?,
        &host_rows(&loss_mask)?,
    );
    Ok(PolicyLossOutput {
        loss,
        clip_frac_low,
        clip_frac_high,
        approx_kl,
        ratio_mean,
    })
}

/// `max(-r A, -clip(r, lo, hi) A)` = `-min(r A, clip(r) A)`; with dual clip `c`, tokens with `A < 0`
/// take `min(that, -c A)`.
fn ppo_clip(ratio: &Tensor, adv: &Tensor, lo: f64, hi: f64, dual: Option<f64>) -> Result<Tensor> {
    let surr1 = (ratio * adv)?.neg()?;
    let surr2 = (ratio.clamp(lo, hi)? * adv)?.neg()?;
    let loss = surr1.maximum(&surr2)?;
    match dual {
        Some(c) => {
            let capped = loss.minimum(&adv.affine(-c, 0.0)?)?;
            adv.lt(0.0)?.where_cond(&capped, &loss)
        }
        None => Ok(loss),
    }
}

/// `-w A logp` with `w` already detached: a REINFORCE-style surrogate whose gradient is `-w A`.
fn weighted_pg(w: &Tensor, adv: &Tensor, logp: &Tensor) -> Result<Tensor> {
    ((w * adv)? * logp)?.neg()
}

/// (clip_frac_low, clip_frac_high, approx_kl, ratio_mean) over tokens with mask > 0.
fn metrics(
    p: &PolicyLossParams,
    ratio: &[Vec<f32>],
    log_ratio: &[Vec<f32>],
    adv: &[Vec<f32>],
    mask: &[Vec<f32>],
) -> (f32, f32, f32, f32) {
    let (lo, hi) = (1.0 - p.clip_low, 1.0 + p.clip_high);
    let (mut n, mut low, mut high, mut kl, mut rsum) = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for i in 0..mask.len() {
        for t in 0..mask[i].len() {
            if mask[i][t] <= 0.0 {
                continue;
            }
            let (r, a) = (f64::from(ratio[i][t]), f64::from(adv[i][t]));
            n += 1.0;
            kl += 0.5 * f64::from(log_ratio[i][t]).powi(2);
            rsum += r;
            let (is_low, is_high) = match p.kind {
                PolicyLossKind::Ppo
                | PolicyLossKind::RaftPp
                | PolicyLossKind::Gspo
                | PolicyLossKind::Cispo => (r < lo, r > hi),
                PolicyLossKind::Tis => (false, r > p.tis_cap),
                PolicyLossKind::Topr => (false, a < 0.0 && r > 1.0),
                PolicyLossKind::Vanilla => (false, false),
            };
            low += f64::from(u8::from(is_low));
            high += f64::from(u8::from(is_high));
        }
    }
    if n == 0.0 {
        return (0.0, 0.0, 0.0, 1.0);
    }
    (
        (low / n) as f32,
        (high / n) as f32,
        (kl / n) as f32,
        (rsum / n) as f32,
    )
}

/// Aggregated entropy; the caller subtracts `coef * bonus` from the loss.
/// entropy: (batch, seq), mask: (batch, seq) -> scalar
pub fn entropy_bonus(entropy: &Tensor, mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    aggregate(entropy, mask, agg, None)
}

/// Clipped value loss `0.5 max((v - R)^2, (v_clip - R)^2)` with
/// `v_clip = old + clamp(v - old, -clip, clip)`; without `clip` it is `0.5 (v - R)^2`.
/// values, old_values, returns, mask: (batch, seq) -> scalar (differentiable wrt `values`)
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip: Option<f64>,
    agg: LossAgg,
) -> Result<Tensor> {
    let (b, s) = values.dims2()?;
    check_dims2("old_values", old_values, (b, s))?;
    check_dims2("returns", returns, (b, s))?;
    let returns = returns.detach();
    let l1 = (values - &returns)?.sqr()?;
    let mat = match clip {
        Some(c) => {
            let old = old_values.detach();
            let v_clip = ((values - &old)?.clamp(-c.abs(), c.abs())? + &old)?;
            let l2 = (v_clip - &returns)?.sqr()?;
            l1.maximum(&l2)?
        }
        None => l1,
    };
    aggregate(&mat.affine(0.5, 0.0)?, mask, agg, None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
#[path = "loss_tests.rs"]
mod tests;
