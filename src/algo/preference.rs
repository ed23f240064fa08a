//! Preference losses over (chosen, rejected) pairs, as TRL's `DPOTrainer` defines them:
//! DPO (`sigmoid`), its conservative form cDPO (`sigmoid` with `label_smoothing`), and IPO.
//!
//! [`preference_losses`] takes one value per pair, `(pairs,)` f32: the policy's and the
//! reference's log-probs of the chosen and the rejected completion. For DPO and cDPO these are the
//! completion's summed token log-probs; for IPO its log-ratio per token (TRL divides each
//! completion's summed log-ratio by its length for `ipo`); [`preference_terms`] makes both from
//! per-token log-probs.
//!
//! cDPO is the conservative DPO of TRL before 1.x (`sigmoid` with `label_smoothing`); TRL 1.16's
//! `sigmoid` no longer reads `label_smoothing` (it moved to its `robust`, `exo_pair` and `aot`
//! losses), so cDPO is checked against hand-computed values only.

use candle_core::{Result, Tensor, bail};
use serde::{Deserialize, Serialize};

/// Which preference loss (`dpo.loss_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PreferenceLossType {
    /// DPO: `-log σ(β z)`; with `label_smoothing` ε, cDPO: `-(1-ε) log σ(β z) - ε log σ(-β z)`.
    #[default]
    Sigmoid,
    /// IPO: `(z - 1/(2β))²`, over mean token log-probs.
    Ipo,
}

impl PreferenceLossType {
    /// Whether the loss takes a completion's mean token log-prob instead of its sum.
    pub fn averages_tokens(self) -> bool {
        self == PreferenceLossType::Ipo
    }
}

/// The loss's parameters (`dpo.loss_type`, `dpo.loss_weights`, `dpo.beta`,
/// `dpo.label_smoothing`): `weight` times the mean of the pairs' `loss_type` losses, plus
/// `sft_weight` times the negative log-likelihood of the chosen completions (a mean over their
/// tokens: TRL's `sft` loss type, RPO's term).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PreferenceParams {
    pub loss_type: PreferenceLossType,
    pub beta: f64,
    pub label_smoothing: f64,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default)]
    pub sft_weight: f64,
}

fn one() -> f64 {
    1.0
}

/// The log-probs of a batch of pairs, each `(pairs,)`.
pub struct PairLogps<'a> {
    pub chosen: &'a Tensor,
    pub rejected: &'a Tensor,
    pub ref_chosen: &'a Tensor,
    pub ref_rejected: &'a Tensor,
}

/// Each pair's loss, `(pairs,)`, differentiable with respect to the policy's log-probs.
///
/// z = (chosen - rejected) - (ref_chosen - ref_rejected).
pub fn preference_losses(p: &PreferenceParams, x: &PairLogps<'_>) -> Result<Tensor> {
    if p.beta <= 0.0 {
        bail!("beta must be above 0, got {}", p.beta);
    }
    let z = ((x.chosen - x.rejected)? - (x.ref_chosen - x.ref_rejected)?)?;
    match p.loss_type {
        PreferenceLossType::Sigmoid => {
            let bz = (&z * p.beta)?;
            let pos = (log_sigmoid(&bz)? * (1.0 - p.label_smoothing))?;
            if p.label_smoothing == 0.0 {
                return pos.neg();
            }
            let neg = (log_sigmoid(&bz.neg()?)? * p.label_smoothing)?;
            (pos + neg)?.neg()
        }
        PreferenceLossType::Ipo => (z - 1.0 / (2.0 * p.beta))?.sqr(),
    }
}

/// `log σ(x)`: `-log(1 + e^{-x})` for x >= 0 and `x - log(1 + e^x)` below, each branch fed only
/// its own half of the inputs, so neither overflows and no gradient meets a kink: written as
/// `min(x, 0) - log(1 + e^{-|x|})`, the sub-gradients of `min` and `|x|` at 0 (where a first DPO
/// step with policy = reference puts every pair) would add up to 1.5 instead of σ'(0)/σ(0) = 0.5.
fn log_sigmoid(x: &Tensor) -> Result<Tensor> {
    let zero = x.zeros_like()?;
    let upper = x.ge(0.0)?;
    let pos = upper.where_cond(x, &zero)?;
    let neg = upper.where_cond(&zero, x)?;
    let on_pos = ((pos.neg()?.exp()? + 1.0)?.log()?).neg()?;
    let on_neg = (&neg - (neg.exp()? + 1.0)?.log()?)?;
    upper.where_cond(&on_pos, &on_neg)
}

/// logp, mask: (b, R) -> (b,): each row's sum of masked token log-probs.
pub fn sequence_logps(logp: &Tensor, mask: &Tensor) -> Result<Tensor> {
    (logp * mask)?.sum(1)
}

/// (2k,) rows chosen, rejected, chosen, … -> the chosen (k,) and the rejected (k,).
pub fn pairs_of(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let n = x.dim(0)?;
    if n % 2 != 0 {
        bail!("preference rows come in pairs, got {n} rows");
    }
    let pairs = x.reshape((n / 2, 2))?;
    Ok((
        pairs.narrow(1, 0, 1)?.squeeze(1)?,
        pairs.narrow(1, 1, 1)?.squeeze(1)?,
    ))
}

/// One value per pair for the policy and the reference, each `(pairs,)`.
pub struct PairSeqs {
    pub chosen: Tensor,
    pub rejected: Tensor,
    pub ref_chosen: Tensor,
    pub ref_rejected: Tensor,
}

impl PairSeqs {
    /// Rows chosen, rejected, chosen, … of the policy (`seq`) and the reference (`ref_seq`).
    pub fn from_rows(seq: &Tensor, ref_seq: &Tensor) -> Result<PairSeqs> {
        let (chosen, rejected) = pairs_of(seq)?;
        let (ref_chosen, ref_rejected) = pairs_of(ref_seq)?;
        Ok(PairSeqs {
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
        })
    }

    pub fn logps(&self) -> PairLogps<'_> {
        PairLogps {
            chosen: &self.chosen,
            rejected: &self.rejected,
            ref_chosen: &self.ref_chosen,
            ref_rejected: &self.ref_rejected,
        }
    }
}

/// Each pair's loss, `(pairs,)`, and the pairs' summed log-probs (what the metrics report), from
/// the rows' per-token log-probs of the policy and the reference. logp, ref_logp, mask: (2k, R),
/// rows chosen, rejected, …
///
/// IPO takes each completion's log-ratio per token, as TRL (1.16) does: the summed log-ratio
/// divided by the completion's length; its rewards and log-probs are still reported summed, as
/// TRL logs them.
pub fn preference_terms(
    params: &PreferenceParams,
    logp: &Tensor,
    ref_logp: &Tensor,
    mask: &Tensor,
) -> Result<(Tensor, PairSeqs)> {
    let sums = PairSeqs::from_rows(
        &sequence_logps(logp, mask)?,
        &sequence_logps(ref_logp, mask)?,
    )?;
    if !params.loss_type.averages_tokens() {
        return Ok((preference_losses(params, &sums.logps())?, sums));
    }
    // A row without tokens (refused before it gets here) counts one, so nothing divides by 0.
    let (len_c, len_r) = pairs_of(&mask.sum(1)?.clamp(1.0, f64::INFINITY)?)?;
    let per_token = PairSeqs {
        chosen: (&sums.chosen / &len_c)?,
        rejected: (&sums.rejected / &len_r)?,
        ref_chosen: (&sums.ref_chosen / &len_c)?,
        ref_rejected: (&sums.ref_rejected / &len_r)?,
    };
    Ok((preference_losses(params, &per_token.logps())?, sums))
}

/// The implicit rewards of a batch of pairs, TRL's `rewards/*` and `logps/*` metrics as means
/// over its pairs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PreferenceStats {
    /// β (chosen - ref_chosen), mean.
    pub chosen_reward: f64,
    /// β (rejected - ref_rejected), mean.
    pub rejected_reward: f64,
    /// The fraction of pairs whose chosen reward is above the rejected one (strictly).
    pub accuracy: f64,
    /// chosen_reward - rejected_reward, mean.
    pub margin: f64,
    pub chosen_logp: f64,
    pub rejected_logp: f64,
}

/// The stats of a batch of pairs from the same log-probs the loss took.
pub fn preference_stats(beta: f64, x: &PairLogps<'_>) -> Result<PreferenceStats> {
    let n = x.chosen.dim(0)?;
    let one_group = preference_sums_by_group(beta, x, &vec![0; n])?;
    Ok(match one_group.get(&0) {
        Some((sums, count)) => sums.mean_over(*count),
        None => PreferenceStats::default(),
    })
}

/// One domain's reward metrics, as the stage records them: `<prefix>/<domain>/chosen`,
/// `…/rejected`, `…/accuracies`, `…/margins`.
pub fn domain_rewards(prefix: &str, domain: &str, s: &PreferenceStats) -> Vec<(String, f64)> {
    [
        ("chosen", s.chosen_reward),
        ("rejected", s.rejected_reward),
        ("accuracies", s.accuracy),
        ("margins", s.margin),
    ]
    .into_iter()
    .map(|(name, v)| (format!("{prefix}/{domain}/{name}"), v))
    .collect()
}

impl PreferenceStats {
    /// Every value through `f`.
    fn map(&self, f: impl Fn(f64) -> f64) -> PreferenceStats {
        PreferenceStats {
            chosen_reward: f(self.chosen_reward),
            rejected_reward: f(self.rejected_reward),
            accuracy: f(self.accuracy),
            margin: f(self.margin),
            chosen_logp: f(self.chosen_logp),
            rejected_logp: f(self.rejected_logp),
        }
    }

    /// These sums over `count` pairs as means.
    pub fn mean_over(&self, count: usize) -> PreferenceStats {
        let k = count.max(1) as f64;
        self.map(|v| v / k)
    }

    /// Every value times `w` (a part's share of a batch's means).
    pub fn scaled(&self, w: f64) -> PreferenceStats {
        self.map(|v| w * v)
    }

    /// TRL's metrics of these stats, each key after `prefix`: `rewards/chosen`,
    /// `rewards/rejected`, `rewards/accuracies`, `rewards/margins`, `logps/chosen`,
    /// `logps/rejected`.
    pub fn metrics(&self, prefix: &str) -> Vec<(String, f64)> {
        [
            ("rewards/chosen", self.chosen_reward),
            ("rewards/rejected", self.rejected_reward),
            ("rewards/accuracies", self.accuracy),
            ("rewards/margins", self.margin),
            ("logps/chosen", self.chosen_logp),
            ("logps/rejected", self.rejected_logp),
        ]
        .into_iter()
        .map(|(key, v)| (format!("{prefix}{key}"), v))
        .collect()
    }
}

impl std::ops::AddAssign<&PreferenceStats> for PreferenceStats {
    fn add_assign(&mut self, o: &PreferenceStats) {
        self.chosen_reward += o.chosen_reward;
        self.rejected_reward += o.rejected_reward;
        self.accuracy += o.accuracy;
        self.margin += o.margin;
        self.chosen_logp += o.chosen_logp;
        self.rejected_logp += o.rejected_logp;
    }
}

/// [`preference_stats`] per group: for each group id of `groups` (one per pair), the sums of its
/// pairs' values (not their means) and its count of pairs, so that sums over several batches
/// still average right.
pub fn preference_sums_by_group(
    beta: f64,
    x: &PairLogps<'_>,
    groups: &[u32],
) -> Result<std::collections::BTreeMap<u32, (PreferenceStats, usize)>> {
    let v = |t: &Tensor| -> Result<Vec<f64>> { t.to_dtype(candle_core::DType::F64)?.to_vec1() };
    let (c, r, rc, rr) = (
        v(x.chosen)?,
        v(x.rejected)?,
        v(x.ref_chosen)?,
        v(x.ref_rejected)?,
    );
    let n = c.len();
    if [r.len(), rc.len(), rr.len()] != [n; 3] {
        bail!(
            "pair log-probs of different lengths: {n}, {}, {}, {}",
            r.len(),
            rc.len(),
            rr.len()
        );
    }
    if groups.len() != n {
        bail!("{} group ids for {n} pairs", groups.len());
    }
    let mut out: std::collections::BTreeMap<u32, (PreferenceStats, usize)> = Default::default();
    for (i, &g) in groups.iter().enumerate() {
        let (s, n) = out.entry(g).or_default();
        let cr = beta * (c[i] - rc[i]);
        let rj = beta * (r[i] - rr[i]);
        s.chosen_reward += cr;
        s.rejected_reward += rj;
        s.accuracy += f64::from(u8::from(cr > rj));
        s.margin += cr - rj;
        s.chosen_logp += c[i];
        s.rejected_logp += r[i];
        *n += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).expect("t")
    }

    fn losses(loss_type: PreferenceLossType, beta: f64, ls: f64) -> Vec<f32> {
        // Pair 0: z = (-1 - -2) - (-1.5 - -1.5) = 1. Pair 1: z = (-4 - -1) - (-2 - -2) = -3.
        let (c, r, rc, rr) = (
            t(&[-1., -4.]),
            t(&[-2., -1.]),
            t(&[-1.5, -2.]),
            t(&[-1.5, -2.]),
        );
        let p = PreferenceParams {
            loss_type,
            beta,
            label_smoothing: ls,
            weight: 1.0,
            sft_weight: 0.0,
        };
        let x = PairLogps {
            chosen: &c,
            rejected: &r,
            ref_chosen: &rc,
            ref_rejected: &rr,
        };
        preference_losses(&p, &x)
            .and_then(|l| l.to_vec1())
            .expect("losses")
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn dpo_cdpo_and_ipo_against_hand_computed_values() {
        // DPO, β = 0.1: -log σ(0.1) = log(1 + e^-0.1) = 0.6443967; -log σ(-0.3) = log(1 + e^0.3)
        // = 0.8543552.
        close(
            &losses(PreferenceLossType::Sigmoid, 0.1, 0.0),
            &[0.644_396_66, 0.854_355_2],
        );
        // cDPO, ε = 0.1: 0.9 log(1 + e^-0.1) + 0.1 log(1 + e^0.1) = 0.9 * 0.6443967 + 0.1 *
        // 0.7443967 = 0.6543967; pair 1: 0.9 * 0.8543552 + 0.1 * log(1 + e^-0.3) (0.5543552)
        // = 0.8243552.
        close(
            &losses(PreferenceLossType::Sigmoid, 0.1, 0.1),
            &[0.654_396_66, 0.824_355_2],
        );
        // IPO, β = 0.1: (1 - 5)^2 = 16, (-3 - 5)^2 = 64.
        close(&losses(PreferenceLossType::Ipo, 0.1, 0.0), &[16.0, 64.0]);
        // Far from 0 log σ stays exact: β z = 200 gives 0 loss, β z = -200 gives 200.
        close(
            &losses(PreferenceLossType::Sigmoid, 200.0, 0.0)[..1],
            &[0.0],
        );
        close(
            &losses(PreferenceLossType::Sigmoid, 200.0 / 3.0, 0.0)[1..],
            &[200.0],
        );
    }

    #[test]
    fn the_gradient_pushes_chosen_up_and_rejected_down() {
        // d/dc of -log σ(β z) = -β σ(-β z); at z = 0 that is -β / 2, and +β / 2 for the rejected.
        let c = Var::new(&[-1f32], &Device::Cpu).expect("c");
        let r = Var::new(&[-1f32], &Device::Cpu).expect("r");
        let zero = t(&[0.]);
        let p = PreferenceParams {
            loss_type: PreferenceLossType::Sigmoid,
            beta: 0.5,
            label_smoothing: 0.0,
            weight: 1.0,
            sft_weight: 0.0,
        };
        let x = PairLogps {
            chosen: c.as_tensor(),
            rejected: r.as_tensor(),
            ref_chosen: &zero,
            ref_rejected: &zero,
        };
        let loss = preference_losses(&p, &x)
            .and_then(|l| l.sum_all())
            .expect("l");
        let g = loss.backward().expect("grads");
        let dc = g
            .get(c.as_tensor())
            .expect("dc")
            .to_vec1::<f32>()
            .expect("v");
        let dr = g
            .get(r.as_tensor())
            .expect("dr")
            .to_vec1::<f32>()
            .expect("v");
        close(&dc, &[-0.25]);
        close(&dr, &[0.25]);
    }

    #[test]
    fn rows_sum_their_loss_tokens_and_pair_up() {
        let logp = Tensor::new(&[[-1f32, -2., -4.], [-0.5, -0.5, 9.]], &Device::Cpu).expect("l");
        let mask = Tensor::new(&[[1f32, 1., 1.], [1., 1., 0.]], &Device::Cpu).expect("m");
        let sum = sequence_logps(&logp, &mask).and_then(|x| x.to_vec1::<f32>());
        assert_eq!(sum.expect("sum"), [-7.0, -1.0]);
        let (c, r) = pairs_of(&t(&[1., 2., 3., 4.])).expect("pairs");
        assert_eq!(c.to_vec1::<f32>().expect("c"), [1., 3.]);
        assert_eq!(r.to_vec1::<f32>().expect("r"), [2., 4.]);
        assert!(pairs_of(&t(&[1., 2., 3.])).is_err());
    }

    #[test]
    fn ipo_takes_log_ratios_per_token_and_reports_sums() {
        // One pair: chosen 3 tokens, rejected 2 (its third column masked out).
        let logp = Tensor::new(&[[-1f32, -1., -1.], [-2., -2., 5.]], &Device::Cpu).expect("l");
        let ref_logp = Tensor::new(&[[-2f32, -2., -2.], [-1., -1., 5.]], &Device::Cpu).expect("r");
        let mask = Tensor::new(&[[1f32, 1., 1.], [1., 1., 0.]], &Device::Cpu).expect("m");
        let p = |loss_type| PreferenceParams {
            loss_type,
            beta: 0.5,
            label_smoothing: 0.0,
            weight: 1.0,
            sft_weight: 0.0,
        };
        // Per token: chosen log-ratio (-3 - -6) / 3 = 1, rejected (-4 - -2) / 2 = -1: z = 2,
        // (2 - 1/(2 * 0.5))^2 = 1. Summed (what DPO takes): z = 3 - (-2) = 5.
        let (ipo, sums) =
            preference_terms(&p(PreferenceLossType::Ipo), &logp, &ref_logp, &mask).expect("ipo");
        close(&ipo.to_vec1::<f32>().expect("v"), &[1.0]);
        assert_eq!(sums.chosen.to_vec1::<f32>().expect("c"), [-3.0]);
        assert_eq!(sums.ref_rejected.to_vec1::<f32>().expect("r"), [-2.0]);
        let (dpo, _) = preference_terms(&p(PreferenceLossType::Sigmoid), &logp, &ref_logp, &mask)
            .expect("dpo");
        // -log σ(0.5 * 5) = log(1 + e^-2.5) = 0.0788897.
        close(&dpo.to_vec1::<f32>().expect("v"), &[0.078_889_7]);
    }

    /// Two pairs: (chosen, rejected, ref chosen, ref rejected) of each.
    fn two_pairs() -> [Tensor; 4] {
        [
            t(&[-1., -2.]),
            t(&[-3., -1.]),
            t(&[-2., -1.]),
            t(&[-2., -1.]),
        ]
    }

    #[test]
    fn group_sums_split_the_pairs_by_their_group() {
        // β = 0.5, the pairs of `stats_as_trl_reports_them`, in groups 7 and 2.
        let [c, r, rc, rr] = two_pairs();
        let x = PairLogps {
            chosen: &c,
            rejected: &r,
            ref_chosen: &rc,
            ref_rejected: &rr,
        };
        let g = preference_sums_by_group(0.5, &x, &[7, 2]).expect("groups");
        assert_eq!(g.keys().copied().collect::<Vec<_>>(), [2, 7]);
        assert_eq!((g[&7].0.accuracy, g[&7].0.margin, g[&7].1), (1.0, 1.0, 1));
        assert_eq!((g[&2].0.accuracy, g[&2].0.margin, g[&2].1), (0.0, -0.5, 1));
        assert!(preference_sums_by_group(0.5, &x, &[1]).is_err());
    }

    #[test]
    fn stats_as_trl_reports_them() {
        // β = 0.5. Pair 0: chosen reward 0.5 (-1 - -2) = 0.5, rejected 0.5 (-3 - -2) = -0.5.
        // Pair 1: chosen 0.5 (-2 - -1) = -0.5, rejected 0.5 (-1 - -1) = 0: wrong way round.
        let [c, r, rc, rr] = two_pairs();
        let x = PairLogps {
            chosen: &c,
            rejected: &r,
            ref_chosen: &rc,
            ref_rejected: &rr,
        };
        let s = preference_stats(0.5, &x).expect("stats");
        assert_eq!(
            s,
            PreferenceStats {
                chosen_reward: 0.0,
                rejected_reward: -0.25,
                accuracy: 0.5,
                margin: 0.25,
                chosen_logp: -1.5,
                rejected_logp: -2.0,
            }
        );
        assert!(
            preference_losses(
                &PreferenceParams {
                    loss_type: PreferenceLossType::Sigmoid,
                    beta: 0.0,
                    label_smoothing: 0.0,
                    weight: 1.0,
                    sft_weight: 0.0,
                },
                &x
            )
            .is_err()
        );
    }
}
