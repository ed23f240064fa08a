//! algo: the RL math of post-training — advantages, reward normalisation, KL, policy and value losses,
//! loss aggregation, masks and group filters; the preference losses (DPO, cDPO, IPO).
//!
//! Everything here is pure math on candle tensors (or plain slices): no IO, no model code, no config
//! parsing, no logging. Callers own the data; these functions only compute.
//!
//! Conventions shared by every submodule:
//! - token-level tensors are `(batch, seq)` f32 over RESPONSE tokens only;
//! - `mask` is `(batch, seq)` f32 of 0/1, 1 = a real response token; outputs are 0 where the mask is 0;
//! - samples of one prompt are CONSECUTIVE rows, in groups of `group_size` (`batch % group_size == 0`);
//! - standard deviations are the unbiased (Bessel-corrected, `n - 1`) estimate everywhere, matching
//!   `torch.std` as used by ROLL/verl GRPO; with a single value the std is defined as 0.
//!
//! Tensor errors use `candle_core::Result`; malformed inputs (bad group size, missing values for GAE,
//! mismatched shapes) are reported through `candle_core::bail!` with the offending values quoted.

pub mod advantage;
pub mod agentic;
pub mod aggregate;
pub mod distill;
pub mod filter;
pub use roll_cpu_kernels::logprobs as fused_logprobs;
pub mod kl;
pub mod loss;
pub mod mask;
pub mod normalize;
pub mod preference;
pub mod sft;

pub use advantage::{AdvantageEstimator, AdvantageParams, compute_advantages};
pub use aggregate::{LossAgg, aggregate};
pub use filter::{frac_zero_std, groups_with_signal};
pub use kl::{KlController, KlControllerKind, KlEstimator, KlMode, kl_penalty};
pub use loss::{
    PolicyLossKind, PolicyLossOutput, PolicyLossParams, entropy_bonus, policy_loss, value_loss,
};
pub use mask::{DifficultyMask, difficulty_keep, max_length_mask};
pub use normalize::{
    RewardNorm, RunningStats, clip_tensor, clip_values, normalize_rewards, whiten,
};
pub use sft::{masked_cross_entropy, token_entropy, token_logprobs, token_logprobs_and_entropy};

use candle_core::{DType, Result, Tensor, bail};

/// Number of groups in a batch; errors unless `group_size >= 1` divides `batch`.
pub(crate) fn num_groups(batch: usize, group_size: usize) -> Result<usize> {
    if group_size == 0 {
        bail!("group_size must be at least 1, got 0");
    }
    if !batch.is_multiple_of(group_size) {
        bail!("batch size {batch} is not a multiple of group_size {group_size}");
    }
    Ok(batch / group_size)
}

/// Errors unless `t` is 2-D with exactly `dims`; `name` is quoted in the message.
pub(crate) fn check_dims2(name: &str, t: &Tensor, dims: (usize, usize)) -> Result<()> {
    let got = t.dims();
    if got != [dims.0, dims.1] {
        bail!(
            "'{name}' must have shape ({}, {}), got {:?}",
            dims.0,
            dims.1,
            got
        );
    }
    Ok(())
}

/// Copies a 2-D tensor to the host as f32 rows (small, no-grad quantities only).
pub(crate) fn host_rows(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    t.to_dtype(DType::F32)?.to_vec2::<f32>()
}

/// Builds a `(rows.len(), seq)` f32 tensor on `like`'s device from host rows of length `seq`.
pub(crate) fn from_rows(rows: &[Vec<f32>], seq: usize, like: &Tensor) -> Result<Tensor> {
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), seq), like.device())
}

/// Mean and unbiased std (`n - 1`; 0 when `n < 2`) of `xs`, accumulated in f64.
pub(crate) fn mean_std(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = xs.clone().count();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = xs.clone().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let ss: f64 = xs.map(|x| (x - mean) * (x - mean)).sum();
    (mean, (ss / (n - 1) as f64).sqrt())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;

    #[test]
    fn num_groups_checks_divisibility() {
        assert_eq!(num_groups(6, 3).unwrap(), 2);
        assert!(num_groups(5, 2).is_err());
        assert!(num_groups(4, 0).is_err());
    }

    #[test]
    fn mean_std_is_unbiased() {
        // [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, var = 5 / 3.
        let (m, s) = mean_std([1.0, 2.0, 3.0, 4.0].into_iter());
        assert!((m - 2.5).abs() < 1e-12);
        assert!((s - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_std([7.0].into_iter()), (7.0, 0.0));
        assert_eq!(mean_std(std::iter::empty()), (0.0, 0.0));
    }
}
