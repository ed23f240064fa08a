//! Reward shaping: normalisation by group / batch / running statistics, clipping, masked whitening.
//!
//! Scalar rewards live on the host as `&[f32]` (one per sample); token-level tensors go through
//! [`whiten`] and [`clip_tensor`]. All standard deviations are unbiased (`n - 1`), 0 for one value.

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

use super::{check_dims2, from_rows, host_rows, mean_std};

/// How sequence rewards are normalised before advantages are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RewardNorm {
    /// Rewards are used as they are.
    #[default]
    None,
    /// `(r - group mean) / (group std + eps)` within each prompt's group.
    Group,
    /// `(r - batch mean) / (batch std + eps)` over the whole batch.
    Batch,
    /// `(r - running mean) / (running std + eps)`; the running stats are updated with the batch first.
    Running,
}

/// Welford's streaming mean and variance over every reward seen so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunningStats {
    count: u64,
    mean: f64,
    m2: f64,
}

impl RunningStats {
    /// Empty statistics (mean 0, std 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds `xs` into the statistics.
    pub fn update(&mut self, xs: &[f32]) {
        for &x in xs {
            let x = f64::from(x);
            self.count += 1;
            let delta = x - self.mean;
            self.mean += delta / self.count as f64;
            self.m2 += delta * (x - self.mean);
        }
    }

    /// Number of values seen.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean of all values seen (0 before any).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Unbiased standard deviation of all values seen (0 before two values).
    pub fn std(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            (self.m2 / (self.count - 1) as f64).sqrt()
        }
    }
}

/// Normalises one reward per sample. `rewards` are grouped in consecutive chunks of `group_size`
/// (a trailing partial chunk is its own group; `group_size` 0 is treated as 1). `running` is only
/// read and updated for [`RewardNorm::Running`].
pub fn normalize_rewards(
    kind: RewardNorm,
    rewards: &[f32],
    group_size: usize,
    running: &mut RunningStats,
    eps: f64,
) -> Vec<f32> {
    let standardise = |xs: &[f32], mean: f64, std: f64| -> Vec<f32> {
        xs.iter()
            .map(|&x| ((f64::from(x) - mean) / (std + eps)) as f32)
            .collect()
    };
    match kind {
        RewardNorm::None => rewards.to_vec(),
        RewardNorm::Group => rewards
            .chunks(group_size.max(1))
            .flat_map(|g| {
                let (m, s) = mean_std(g.iter().map(|&x| f64::from(x)));
                standardise(g, m, s)
            })
            .collect(),
        RewardNorm::Batch => {
            let (m, s) = mean_std(rewards.iter().map(|&x| f64::from(x)));
            standardise(rewards, m, s)
        }
        RewardNorm::Running => {
            running.update(rewards);
            standardise(rewards, running.mean(), running.std())
        }
    }
}

/// Clips every value to `[-clip, clip]`; `None` returns the values unchanged.
pub fn clip_values(x: &[f32], clip: Option<f32>) -> Vec<f32> {
    match clip {
        Some(c) => x.iter().map(|&v| v.clamp(-c.abs(), c.abs())).collect(),
        None => x.to_vec(),
    }
}

/// Clips every element to `[-clip, clip]`; `None` returns the tensor unchanged.
/// x: any shape -> same shape
pub fn clip_tensor(x: &Tensor, clip: Option<f64>) -> Result<Tensor> {
    match clip {
        Some(c) => x.clamp(-c.abs(), c.abs()),
        None => Ok(x.clone()),
    }
}

/// Masked whitening: `(x - mean) / (std + eps)` with mean and unbiased std over the valid tokens of
/// the whole batch; with `shift_mean == false` the mean is added back (only the scale changes).
/// Result is 0 at masked positions. No gradient is intended (advantages are constants).
/// x: (batch, seq), mask: (batch, seq) -> (batch, seq)
pub fn whiten(x: &Tensor, mask: &Tensor, shift_mean: bool, eps: f64) -> Result<Tensor> {
    let (b, s) = x.dims2()?;
    check_dims2("mask", mask, (b, s))?;
    let xs = host_rows(x)?;
    let ms = host_rows(mask)?;
    let valid = || {
        xs.iter().zip(&ms).flat_map(|(xr, mr)| {
            xr.iter()
                .zip(mr)
                .filter(|(_, m)| **m > 0.0)
                .map(|(x, _)| f64::from(*x))
        })
    };
    let (mean, std) = mean_std(valid());
    let out: Vec<Vec<f32>> = xs
        .iter()
        .zip(&ms)
        .map(|(xr, mr)| {
            xr.iter()
                .zip(mr)
                .map(|(&x, &m)| {
                    if m > 0.0 {
                        let w = (f64::from(x) - mean) / (std + eps);
                        (if shift_mean { w } else { w + mean }) as f32
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    from_rows(&out, s, x)?.to_dtype(x.dtype())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::Device;
    use std::f32::consts::FRAC_1_SQRT_2;

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn welford_matches_two_pass() {
        // [1, 2] then [3, 4]: mean 2.5, var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, std = 1.2909944.
        let mut rs = RunningStats::new();
        assert_eq!((rs.mean(), rs.std()), (0.0, 0.0));
        rs.update(&[1.0, 2.0]);
        rs.update(&[3.0, 4.0]);
        assert_eq!(rs.count(), 4);
        assert!((rs.mean() - 2.5).abs() < 1e-12);
        assert!((rs.std() - 1.290_994_4).abs() < 1e-6);
    }

    #[test]
    fn normalize_none_is_identity() {
        let mut rs = RunningStats::new();
        close(
            &normalize_rewards(RewardNorm::None, &[1.0, -2.0], 2, &mut rs, 1e-6),
            &[1.0, -2.0],
        );
        assert_eq!(rs.count(), 0);
    }

    #[test]
    fn normalize_group() {
        // group [1, 3]: mean 2, std sqrt(((-1)^2 + 1^2) / 1) = sqrt 2 -> -+1/sqrt2 = -+0.7071068.
        // group [0, 0]: zero std -> 0 / (0 + eps) = 0.
        let mut rs = RunningStats::new();
        let out = normalize_rewards(RewardNorm::Group, &[1.0, 3.0, 0.0, 0.0], 2, &mut rs, 1e-8);
        close(&out, &[-FRAC_1_SQRT_2, FRAC_1_SQRT_2, 0.0, 0.0]);
    }

    #[test]
    fn normalize_batch() {
        // [1, 2, 3]: mean 2, std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1].
        let mut rs = RunningStats::new();
        close(
            &normalize_rewards(RewardNorm::Batch, &[1.0, 2.0, 3.0], 3, &mut rs, 1e-8),
            &[-1.0, 0.0, 1.0],
        );
    }

    #[test]
    fn normalize_running_updates_first() {
        let mut rs = RunningStats::new();
        // After [1, 3]: mean 2, std sqrt 2 -> -+0.7071068.
        let a = normalize_rewards(RewardNorm::Running, &[1.0, 3.0], 2, &mut rs, 1e-8);
        close(&a, &[-FRAC_1_SQRT_2, FRAC_1_SQRT_2]);
        // After [1, 3, 2, 6]: mean 3, deviations -2, 0, -1, 3 -> ss 14, var 14/3, std 2.1602469.
        // (2 - 3) / 2.1602469 = -0.4629100, (6 - 3) / 2.1602469 = 1.3887301.
        let b = normalize_rewards(RewardNorm::Running, &[2.0, 6.0], 2, &mut rs, 1e-8);
        close(&b, &[-0.462_910_05, 1.388_73]);
    }

    #[test]
    fn clip_values_symmetric() {
        close(
            &clip_values(&[-3.0, 0.5, 2.0], Some(1.0)),
            &[-1.0, 0.5, 1.0],
        );
        close(&clip_values(&[-3.0, 2.0], None), &[-3.0, 2.0]);
    }

    #[test]
    fn clip_tensor_symmetric() {
        let x = Tensor::new(&[[-3.0f32, 0.5], [2.0, -0.2]], &Device::Cpu).unwrap();
        let y = clip_tensor(&x, Some(1.0))
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(y, vec![vec![-1.0, 0.5], vec![1.0, -0.2]]);
        let z = clip_tensor(&x, None).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(z, x.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn whiten_masked() {
        // Valid values 1, 3, 5 (100 and 7 are masked): mean 3, std sqrt((4 + 0 + 4) / 2) = 2.
        // shifted: [-1, 0, 1]; unshifted (mean added back): [2, 3, 4]; masked positions 0.
        let d = Device::Cpu;
        let x = Tensor::new(&[[1.0f32, 3.0, 100.0], [5.0, 7.0, 0.0]], &d).unwrap();
        let m = Tensor::new(&[[1.0f32, 1.0, 0.0], [1.0, 0.0, 0.0]], &d).unwrap();
        let w = whiten(&x, &m, true, 1e-8)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        close(&w.concat(), &[-1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        let u = whiten(&x, &m, false, 1e-8)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        close(&u.concat(), &[2.0, 3.0, 0.0, 4.0, 0.0, 0.0]);
        let bad = Tensor::zeros((2, 2), candle_core::DType::F32, &d).unwrap();
        assert!(whiten(&x, &bad, true, 1e-8).is_err());
    }

    #[test]
    fn reward_norm_serde_names() {
        for (k, s) in [
            (RewardNorm::None, "\"none\""),
            (RewardNorm::Group, "\"group\""),
            (RewardNorm::Batch, "\"batch\""),
            (RewardNorm::Running, "\"running\""),
        ] {
            assert_eq!(serde_json::to_string(&k).unwrap(), s);
            assert_eq!(serde_json::from_str::<RewardNorm>(s).unwrap(), k);
        }
        assert_eq!(RewardNorm::default(), RewardNorm::None);
    }
}
