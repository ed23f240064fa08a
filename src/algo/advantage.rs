//! Advantage estimators: GAE, REINFORCE reward-to-go, GRPO, REINFORCE++ and RLOO.
//!
//! Advantages are constants for the policy loss, so they are computed on the host in f64 and returned
//! as fresh f32 tensors (no graph). Recursions run over VALID tokens only: a masked position is not a
//! step (it neither discounts nor carries value), and every output is 0 where the mask is 0.

use candle_core::{Result, Tensor, bail};
use serde::{Deserialize, Serialize};

use super::normalize::whiten;
use super::{check_dims2, from_rows, host_rows, mean_std, num_groups};

/// Which advantage estimator a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Generalised advantage estimation with a critic (`values` required).
    Gae,
    /// Discounted reward-to-go per token.
    Reinforce,
    /// Group-relative: sequence score minus its group mean, optionally over the group std.
    #[default]
    Grpo,
    /// Reward-to-go whitened over all valid tokens of the batch.
    ReinforcePlusPlus,
    /// Leave-one-out: score minus the mean of the other samples of its group.
    Rloo,
    /// Agentic, step-wise (`rl.env.mode: step`): GiGPO's episode- plus anchor-state-level
    /// advantages ([`super::agentic::gigpo`]).
    Gigpo,
    /// Agentic, step-wise: each step's discounted return.
    StepReinforce,
    /// Agentic, trajectory-wise: each turn's tokens get the turn's discounted return.
    AgenticReinforce,
}

impl AdvantageEstimator {
    /// Computed per environment step by the agentic pipeline, not from token rewards.
    pub fn is_per_env_step(self) -> bool {
        matches!(
            self,
            AdvantageEstimator::Gigpo
                | AdvantageEstimator::StepReinforce
                | AdvantageEstimator::AgenticReinforce
        )
    }
}

/// Parameters of [`compute_advantages`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvantageParams {
    /// Discount per valid token (gae, reinforce, reinforce_plus_plus).
    pub gamma: f64,
    /// GAE trace decay.
    pub lambda: f64,
    /// Consecutive rows per prompt (grpo, rloo).
    pub group_size: usize,
    /// grpo divides by the unbiased group std (Dr.GRPO turns this off).
    pub std_normalize: bool,
    /// Added to every std before dividing.
    pub eps: f64,
}

impl Default for AdvantageParams {
    fn default() -> Self {
        Self {
            gamma: 1.0,
            lambda: 1.0,
            group_size: 1,
            std_normalize: true,
            eps: 1e-6,
        }
    }
}

/// Computes `(advantages, returns)`, both 0 at masked positions.
///
/// - gae: `delta_t = r_t + gamma V_{t+1} - V_t` (V after the last valid token is 0),
///   `A_t = delta_t + gamma lambda A_{t+1}`, returns `= A + V`.
/// - reinforce: `A_t = returns_t = sum_{k >= t} gamma^(k-t) r_k` over valid tokens.
/// - reinforce_plus_plus: the same returns, advantages whitened over all valid tokens of the batch.
/// - grpo: `score_i = sum_t r_t`; `A_i = (score_i - group mean) / (group std + eps)` (unbiased std,
///   as `torch.std`) or `score_i - group mean`, broadcast over the row; returns `= A` (as verl).
/// - rloo: `A_i = score_i - mean of the other scores of its group`; returns `= A`.
///
/// token_rewards: (batch, seq), values: Option<(batch, seq)>, mask: (batch, seq)
///   -> (advantages: (batch, seq), returns: (batch, seq))
pub fn compute_advantages(
    est: AdvantageEstimator,
    params: &AdvantageParams,
    token_rewards: &Tensor,
    values: Option<&Tensor>,
    mask: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (b, s) = token_rewards.dims2()?;
    check_dims2("mask", mask, (b, s))?;
    let r = host_rows(token_rewards)?;
    let m = host_rows(mask)?;
    let (adv, ret) = match est {
        AdvantageEstimator::Gigpo
        | AdvantageEstimator::StepReinforce
        | AdvantageEstimator::AgenticReinforce => {
            bail!(
                "advantage estimator {est:?} is computed per environment step from episodes, \
                 not from token rewards"
            );
        }
        AdvantageEstimator::Gae => {
            let Some(values) = values else {
                bail!("advantage estimator 'gae' needs values from a critic, got none");
            };
            check_dims2("values", values, (b, s))?;
            gae(&r, &host_rows(values)?, &m, params.gamma, params.lambda)
        }
        AdvantageEstimator::Reinforce => {
            let ret = reward_to_go(&r, &m, params.gamma);
            (ret.clone(), ret)
        }
        AdvantageEstimator::ReinforcePlusPlus => {
            let ret_t = from_rows(&reward_to_go(&r, &m, params.gamma), s, token_rewards)?;
            let adv_t = whiten(&ret_t, mask, true, params.eps)?;
            return Ok((adv_t, ret_t));
        }
        AdvantageEstimator::Grpo => {
            let scores = seq_scores(&r, &m);
            let per_seq = grpo(&scores, params.group_size, params.std_normalize, params.eps)?;
            let adv = broadcast(&per_seq, &m);
            (adv.clone(), adv)
        }
        AdvantageEstimator::Rloo => {
            let per_seq = rloo(&seq_scores(&r, &m), params.group_size)?;
            let adv = broadcast(&per_seq, &m);
            (adv.clone(), adv)
        }
    };
    Ok((
        from_rows(&adv, s, token_rewards)?,
        from_rows(&ret, s, token_rewards)?,
    ))
}

/// Sum of the valid token rewards of each row.
fn seq_scores(r: &[Vec<f32>], m: &[Vec<f32>]) -> Vec<f64> {
    r.iter()
        .zip(m)
        .map(|(rr, mr)| {
            rr.iter()
                .zip(mr)
                .filter(|(_, m)| **m > 0.0)
                .map(|(x, _)| f64::from(*x))
                .sum()
        })
        .collect()
}

/// Writes each row's scalar onto its valid tokens.
fn broadcast(per_seq: &[f64], m: &[Vec<f32>]) -> Vec<Vec<f32>> {
    per_seq
        .iter()
        .zip(m)
        .map(|(&a, mr)| {
            mr.iter()
                .map(|&v| if v > 0.0 { a as f32 } else { 0.0 })
                .collect()
        })
        .collect()
}

fn grpo(scores: &[f64], group_size: usize, std_normalize: bool, eps: f64) -> Result<Vec<f64>> {
    num_groups(scores.len(), group_size)?;
    let mut out = Vec::with_capacity(scores.len());
    for g in scores.chunks(group_size) {
        let (mean, std) = mean_std(g.iter().copied());
        out.extend(g.iter().map(|&x| {
            if std_normalize {
                (x - mean) / (std + eps)
            } else {
                x - mean
            }
        }));
    }
    Ok(out)
}

fn rloo(scores: &[f64], group_size: usize) -> Result<Vec<f64>> {
    num_groups(scores.len(), group_size)?;
    if group_size < 2 {
        bail!("advantage estimator 'rloo' needs group_size >= 2, got {group_size}");
    }
    let mut out = Vec::with_capacity(scores.len());
    for g in scores.chunks(group_size) {
        let total: f64 = g.iter().sum();
        out.extend(g.iter().map(|&x| x - (total - x) / (group_size - 1) as f64));
    }
    Ok(out)
}

fn reward_to_go(r: &[Vec<f32>], m: &[Vec<f32>], gamma: f64) -> Vec<Vec<f32>> {
    r.iter()
        .zip(m)
        .map(|(rr, mr)| {
            let mut out = vec![0.0f32; rr.len()];
            let mut running = 0.0f64;
            for t in (0..rr.len()).rev() {
                if mr[t] > 0.0 {
                    running = f64::from(rr[t]) + gamma * running;
                    out[t] = running as f32;
                }
            }
            out
        })
        .collect()
}

type Rows = Vec<Vec<f32>>;

fn gae(r: &[Vec<f32>], v: &[Vec<f32>], m: &[Vec<f32>], gamma: f64, lambda: f64) -> (Rows, Rows) {
    let mut adv = Vec::with_capacity(r.len());
    let mut ret = Vec::with_capacity(r.len());
    for ((rr, vr), mr) in r.iter().zip(v).zip(m) {
        let mut a_row = vec![0.0f32; rr.len()];
        let mut g_row = vec![0.0f32; rr.len()];
        let (mut next_value, mut last_adv) = (0.0f64, 0.0f64);
        for t in (0..rr.len()).rev() {
            if mr[t] > 0.0 {
                let value = f64::from(vr[t]);
                let delta = f64::from(rr[t]) + gamma * next_value - value;
                last_adv = delta + gamma * lambda * last_adv;
                a_row[t] = last_adv as f32;
                g_row[t] = (last_adv + value) as f32;
                next_value = value;
            }
        }
        adv.push(a_row);
        ret.push(g_row);
    }
    (adv, ret)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::Device;
    use std::f32::consts::FRAC_1_SQRT_2;

    fn t(rows: &[&[f32]]) -> Tensor {
        let s = rows[0].len();
        let v: Vec<Vec<f32>> = rows.iter().map(|r| r.to_vec()).collect();
        from_rows(
            &v,
            s,
            &Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap()
    }

    fn close(a: &Tensor, b: &[&[f32]]) {
        let a = a.to_vec2::<f32>().unwrap();
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (ra, rb) in a.iter().zip(b) {
            assert_eq!(ra.len(), rb.len(), "{a:?} vs {b:?}");
            for (x, y) in ra.iter().zip(rb.iter()) {
                assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
            }
        }
    }

    fn params(group_size: usize) -> AdvantageParams {
        AdvantageParams {
            group_size,
            eps: 1e-8,
            ..Default::default()
        }
    }

    #[test]
    fn grpo_two_groups_with_masking() {
        // Scores: row0 1, row1 0 | row2 1 + 2 = 3 (the 5 is masked), row3 1.
        // Group 1: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071068 -> +-0.7071068.
        // Group 2: mean 2, std sqrt((1 + 1) / 1) = 1.4142136 -> +-0.7071068.
        let r = t(&[
            &[0.0, 0.0, 1.0],
            &[0.0, 0.0, 0.0],
            &[1.0, 2.0, 5.0],
            &[1.0, 0.0, 0.0],
        ]);
        let m = t(&[
            &[1.0, 1.0, 1.0],
            &[1.0, 1.0, 0.0],
            &[1.0, 1.0, 0.0],
            &[1.0, 0.0, 0.0],
        ]);
        let (a, ret) =
            compute_advantages(AdvantageEstimator::Grpo, &params(2), &r, None, &m).unwrap();
        let p = FRAC_1_SQRT_2;
        let want: &[&[f32]] = &[&[p, p, p], &[-p, -p, 0.0], &[p, p, 0.0], &[-p, 0.0, 0.0]];
        close(&a, want);
        close(&ret, want);
    }

    #[test]
    fn grpo_uses_unbiased_std_and_optional_division() {
        // Scores [1, 0, 0, 0]: mean 0.25, deviations 0.75, -0.25 x3, ss = 0.5625 + 3 * 0.0625 = 0.75,
        // unbiased var 0.75 / 3 = 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5] (population std would
        // give 0.4330). Without std: [0.75, -0.25, -0.25, -0.25].
        let r = t(&[&[1.0], &[0.0], &[0.0], &[0.0]]);
        let m = t(&[&[1.0], &[1.0], &[1.0], &[1.0]]);
        let (a, _) =
            compute_advantages(AdvantageEstimator::Grpo, &params(4), &r, None, &m).unwrap();
        close(&a, &[&[1.5], &[-0.5], &[-0.5], &[-0.5]]);
        let p = AdvantageParams {
            std_normalize: false,
            ..params(4)
        };
        let (a, _) = compute_advantages(AdvantageEstimator::Grpo, &p, &r, None, &m).unwrap();
        close(&a, &[&[0.75], &[-0.25], &[-0.25], &[-0.25]]);
        assert!(compute_advantages(AdvantageEstimator::Grpo, &params(3), &r, None, &m).is_err());
    }

    #[test]
    fn rloo_leave_one_out() {
        // Group [1, 0, 2]: 1 - (0 + 2)/2 = 0, 0 - (1 + 2)/2 = -1.5, 2 - (1 + 0)/2 = 1.5.
        let r = t(&[&[0.0, 1.0], &[0.0, 0.0], &[2.0, 0.0]]);
        let m = t(&[&[1.0, 1.0], &[1.0, 1.0], &[1.0, 0.0]]);
        let (a, _) =
            compute_advantages(AdvantageEstimator::Rloo, &params(3), &r, None, &m).unwrap();
        close(&a, &[&[0.0, 0.0], &[-1.5, -1.5], &[1.5, 0.0]]);
        assert!(compute_advantages(AdvantageEstimator::Rloo, &params(1), &r, None, &m).is_err());
    }

    #[test]
    fn reinforce_reward_to_go_skips_masked_steps() {
        // gamma 0.5. Row0 [1, 0, 2, (9 masked)]: t2 = 2, t1 = 0 + 0.5 * 2 = 1, t0 = 1 + 0.5 * 1 = 1.5.
        // Row1 [1, (5 masked), 4, 0 masked]: t2 = 4, t0 = 1 + 0.5 * 4 = 3 (the hole is not a step).
        let r = t(&[&[1.0, 0.0, 2.0, 9.0], &[1.0, 5.0, 4.0, 0.0]]);
        let m = t(&[&[1.0, 1.0, 1.0, 0.0], &[1.0, 0.0, 1.0, 0.0]]);
        let p = AdvantageParams {
            gamma: 0.5,
            ..params(1)
        };
        let (a, ret) = compute_advantages(AdvantageEstimator::Reinforce, &p, &r, None, &m).unwrap();
        let want: &[&[f32]] = &[&[1.5, 1.0, 2.0, 0.0], &[3.0, 0.0, 4.0, 0.0]];
        close(&a, want);
        close(&ret, want);
    }

    #[test]
    fn reinforce_plus_plus_whitens_over_batch_tokens() {
        // gamma 1. Returns row0 [1, 1], row1 [2, (0 masked)]. Valid 1, 1, 2: mean 4/3,
        // ss = 1/9 + 1/9 + 4/9 = 2/3, unbiased var 1/3, std 0.5773503.
        // -> (-1/3) / 0.5773503 = -0.5773503 (twice), (2/3) / 0.5773503 = 1.1547005.
        let r = t(&[&[0.0, 1.0], &[2.0, 7.0]]);
        let m = t(&[&[1.0, 1.0], &[1.0, 0.0]]);
        let (a, ret) = compute_advantages(
            AdvantageEstimator::ReinforcePlusPlus,
            &params(1),
            &r,
            None,
            &m,
        )
        .unwrap();
        close(&a, &[&[-0.577_350_3, -0.577_350_3], &[1.154_700_5, 0.0]]);
        close(&ret, &[&[1.0, 1.0], &[2.0, 0.0]]);
    }

    #[test]
    fn gae_by_hand() {
        // gamma 0.9, lambda 0.5 (gamma * lambda = 0.45). Row0 r [0, 0, 1], V [0.5, 0.6, 0.8]:
        //   t2: delta = 1 + 0 - 0.8 = 0.2, A = 0.2
        //   t1: delta = 0.9 * 0.8 - 0.6 = 0.12, A = 0.12 + 0.45 * 0.2 = 0.21
        //   t0: delta = 0.9 * 0.6 - 0.5 = 0.04, A = 0.04 + 0.45 * 0.21 = 0.1345
        //   returns = A + V = [0.6345, 0.81, 1.0]
        // Row1 r [1, -, -], V [0.5, -, -]: delta = 1 - 0.5 = 0.5, A = 0.5, return 1.0; masked 0.
        let r = t(&[&[0.0, 0.0, 1.0], &[1.0, 3.0, 3.0]]);
        let v = t(&[&[0.5, 0.6, 0.8], &[0.5, 0.3, 0.7]]);
        let m = t(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
        let p = AdvantageParams {
            gamma: 0.9,
            lambda: 0.5,
            ..params(1)
        };
        let (a, ret) = compute_advantages(AdvantageEstimator::Gae, &p, &r, Some(&v), &m).unwrap();
        close(&a, &[&[0.1345, 0.21, 0.2], &[0.5, 0.0, 0.0]]);
        close(&ret, &[&[0.6345, 0.81, 1.0], &[1.0, 0.0, 0.0]]);
        assert!(compute_advantages(AdvantageEstimator::Gae, &p, &r, None, &m).is_err());
    }

    #[test]
    fn estimator_serde_names() {
        for (k, s) in [
            (AdvantageEstimator::Gae, "\"gae\""),
            (AdvantageEstimator::Reinforce, "\"reinforce\""),
            (AdvantageEstimator::Grpo, "\"grpo\""),
            (
                AdvantageEstimator::ReinforcePlusPlus,
                "\"reinforce_plus_plus\"",
            ),
            (AdvantageEstimator::Rloo, "\"rloo\""),
        ] {
            assert_eq!(serde_json::to_string(&k).unwrap(), s);
            assert_eq!(serde_json::from_str::<AdvantageEstimator>(s).unwrap(), k);
        }
        assert_eq!(AdvantageEstimator::default(), AdvantageEstimator::Grpo);
    }
}
