//! Sample masks: drop responses cut at the maximum length, keep prompts of useful difficulty.

use candle_core::{Result, Tensor, bail};
use serde::{Deserialize, Serialize};

/// Zeroes the rows of responses that were truncated at the maximum generation length, so that an
/// unfinished answer (whose reward is meaningless) contributes neither loss nor gradient.
/// truncated: one flag per row; mask: (batch, seq) -> (batch, seq)
pub fn max_length_mask(truncated: &[bool], mask: &Tensor) -> Result<Tensor> {
    let (b, _) = mask.dims2()?;
    if truncated.len() != b {
        bail!(
            "max_length_mask: {} truncation flags for a batch of {b}",
            truncated.len()
        );
    }
    let keep: Vec<f32> = truncated
        .iter()
        .map(|&t| if t { 0.0 } else { 1.0 })
        .collect();
    let keep = Tensor::from_vec(keep, (b, 1), mask.device())?.to_dtype(mask.dtype())?;
    mask.broadcast_mul(&keep)
}

/// Difficulty band of a prompt, as its group's mean accuracy in `[low, high]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DifficultyMask {
    pub low: f32,
    pub high: f32,
}

impl Default for DifficultyMask {
    /// Keeps every prompt.
    fn default() -> Self {
        Self {
            low: 0.0,
            high: 1.0,
        }
    }
}

impl DifficultyMask {
    /// [`difficulty_keep`] with this band.
    pub fn keep(&self, accuracy: &[f32], group_size: usize) -> Vec<bool> {
        difficulty_keep(accuracy, group_size, self.low, self.high)
    }
}

/// One flag per SAMPLE (each group's verdict repeated over its rows): keep a group when the mean
/// accuracy of its samples lies in `[low, high]` (inclusive). Consecutive chunks of `group_size`
/// (0 is treated as 1) form the groups; a trailing partial chunk is judged on its own.
pub fn difficulty_keep(accuracy: &[f32], group_size: usize, low: f32, high: f32) -> Vec<bool> {
    accuracy
        .chunks(group_size.max(1))
        .flat_map(|g| {
            let mean = g.iter().sum::<f32>() / g.len() as f32;
            std::iter::repeat_n((low..=high).contains(&mean), g.len())
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn truncated_rows_are_zeroed() {
        let m = Tensor::new(&[[1.0f32, 1.0, 0.0], [1.0, 1.0, 1.0]], &Device::Cpu).unwrap();
        let out = max_length_mask(&[false, true], &m)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(out, vec![vec![1.0, 1.0, 0.0], vec![0.0, 0.0, 0.0]]);
        assert!(max_length_mask(&[true], &m).is_err());
    }

    #[test]
    fn difficulty_band() {
        // Group means: [1, 1] -> 1 (too easy), [0, 1] -> 0.5 (kept), [0, 0] -> 0 (too hard).
        let acc = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let keep = difficulty_keep(&acc, 2, 0.1, 0.9);
        assert_eq!(keep, vec![false, false, true, true, false, false]);
        // Bounds are inclusive: [0, 1] keeps everything.
        assert!(DifficultyMask::default().keep(&acc, 2).iter().all(|&k| k));
        // Group of 4 with mean 0.25 = low is kept.
        assert_eq!(
            DifficultyMask {
                low: 0.25,
                high: 0.5
            }
            .keep(&[1.0, 0.0, 0.0, 0.0], 4),
            vec![true; 4]
        );
    }
}
