//! Loss aggregation: how a `(batch, seq)` loss matrix becomes the scalar that is differentiated.
//!
//! The choice changes how tokens are weighted: token-mean weighs every token equally (long answers
//! dominate), seq-mean-* weighs every sequence equally, and seq-mean-token-sum-norm (Dr.GRPO) divides
//! by a constant so that no length bias enters through the normaliser.

use candle_core::{Result, Tensor, bail};
use serde::{Deserialize, Serialize};

use super::check_dims2;

/// Aggregation mode of a loss matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// `sum(loss * mask) / sum(mask)`.
    #[default]
    TokenMean,
    /// `mean_i sum_t loss * mask`.
    SeqMeanTokenSum,
    /// `mean_i (sum_t loss * mask / sum_t mask)`.
    SeqMeanTokenMean,
    /// `mean_i (sum_t loss * mask / norm_len)`, norm_len a constant (Dr.GRPO).
    SeqMeanTokenSumNorm,
}

/// Aggregates a loss matrix to a scalar; differentiable wrt `loss_mat` (the mask is a constant).
/// Sequence means run over ALL `batch` rows: a fully masked row counts as 0 (as `torch.mean` in ROLL),
/// so dropping samples never up-weights the rest. Empty masks give 0 rather than NaN.
/// `norm_len` is only used by `SeqMeanTokenSumNorm` (default: the `seq` dimension); it must be > 0.
/// Note ROLL's `token_sum_seq_mean_norm` sums over rows instead of averaging; we follow Dr.GRPO and
/// verl (mean over sequences), which differs from ROLL by the constant factor `batch`.
/// loss_mat: (batch, seq), mask: (batch, seq) -> scalar
pub fn aggregate(
    loss_mat: &Tensor,
    mask: &Tensor,
    mode: LossAgg,
    norm_len: Option<f64>,
) -> Result<Tensor> {
    let (b, s) = loss_mat.dims2()?;
    check_dims2("mask", mask, (b, s))?;
    let mask = mask.detach().to_dtype(loss_mat.dtype())?;
    let masked = (loss_mat * &mask)?;
    match mode {
        LossAgg::TokenMean => masked.sum_all()? / mask.sum_all()?.maximum(1.0)?,
        LossAgg::SeqMeanTokenSum => masked.sum(1)?.mean_all(),
        LossAgg::SeqMeanTokenMean => (masked.sum(1)? / mask.sum(1)?.maximum(1.0)?)?.mean_all(),
        LossAgg::SeqMeanTokenSumNorm => {
            let norm = norm_len.unwrap_or(s as f64);
            if norm.is_nan() || norm <= 0.0 {
                bail!("norm_len must be positive, got {norm}");
            }
            masked.sum(1)?.affine(1.0 / norm, 0.0)?.mean_all()
        }
    }
}

/// Mean of `x` over the valid tokens (0 when none); a scalar helper for metrics and KL-in-loss.
/// x: (batch, seq), mask: (batch, seq) -> scalar
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    aggregate(x, mask, LossAgg::TokenMean, None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn inputs() -> (Tensor, Tensor) {
        let d = Device::Cpu;
        let l = Tensor::new(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &d).unwrap();
        let m = Tensor::new(&[[1.0f32, 1.0, 0.0], [1.0, 0.0, 0.0]], &d).unwrap();
        (l, m)
    }

    fn agg(mode: LossAgg, norm: Option<f64>) -> f32 {
        let (l, m) = inputs();
        aggregate(&l, &m, mode, norm)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn modes_by_hand() {
        // Valid: row0 {1, 2}, row1 {4}.
        // token_mean: (1 + 2 + 4) / 3 = 2.3333333
        assert!((agg(LossAgg::TokenMean, None) - 7.0 / 3.0).abs() < 1e-5);
        // seq_mean_token_sum: (3 + 4) / 2 = 3.5
        assert!((agg(LossAgg::SeqMeanTokenSum, None) - 3.5).abs() < 1e-5);
        // seq_mean_token_mean: (1.5 + 4) / 2 = 2.75
        assert!((agg(LossAgg::SeqMeanTokenMean, None) - 2.75).abs() < 1e-5);
        // seq_mean_token_sum_norm, norm = seq = 3: (3/3 + 4/3) / 2 = 7/6; norm 2: (1.5 + 2) / 2 = 1.75
        assert!((agg(LossAgg::SeqMeanTokenSumNorm, None) - 7.0 / 6.0).abs() < 1e-5);
        assert!((agg(LossAgg::SeqMeanTokenSumNorm, Some(2.0)) - 1.75).abs() < 1e-5);
        let (l, m) = inputs();
        assert!(aggregate(&l, &m, LossAgg::SeqMeanTokenSumNorm, Some(0.0)).is_err());
    }

    #[test]
    fn empty_mask_gives_zero() {
        let (l, _) = inputs();
        let z = l.zeros_like().unwrap();
        for mode in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenMean,
            LossAgg::SeqMeanTokenSum,
        ] {
            assert_eq!(
                aggregate(&l, &z, mode, None)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap(),
                0.0
            );
        }
    }

    #[test]
    fn gradient_weights_tokens() {
        // d/dloss of token_mean = mask / 3; of seq_mean_token_mean = mask / (2 * len_i):
        // row0 tokens 1/4 each, row1 token 1/2.
        let (l, m) = inputs();
        let v = Var::from_tensor(&l).unwrap();
        let g = aggregate(v.as_tensor(), &m, LossAgg::SeqMeanTokenMean, None)
            .unwrap()
            .backward()
            .unwrap();
        let g = g
            .get(v.as_tensor())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        let want = [0.25, 0.25, 0.0, 0.5, 0.0, 0.0];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }
        let g = aggregate(v.as_tensor(), &m, LossAgg::TokenMean, None)
            .unwrap()
            .backward()
            .unwrap();
        let g = g
            .get(v.as_tensor())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        let t = 1.0 / 3.0;
        for (a, b) in g.iter().zip([t, t, 0.0, t, 0.0, 0.0]) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }
    }

    #[test]
    fn serde_names() {
        for (k, s) in [
            (LossAgg::TokenMean, "token_mean"),
            (LossAgg::SeqMeanTokenSum, "seq_mean_token_sum"),
            (LossAgg::SeqMeanTokenMean, "seq_mean_token_mean"),
            (LossAgg::SeqMeanTokenSumNorm, "seq_mean_token_sum_norm"),
        ] {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{s}\""));
        }
        assert_eq!(LossAgg::default(), LossAgg::TokenMean);
    }
}
