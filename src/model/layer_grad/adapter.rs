//! LoRA in the hand-differentiated layer. An adapted projection computes y = x (W + s B A)ᵀ with
//! W frozen, A (r, in) and B (out, r) trained. Its forward takes the merged weight (the bits every
//! other forward of the adapted model computes: scoring's log-probs and training's agree to the
//! bit, so a PPO ratio starts at exactly 1); its backward never forms W's gradient (out, in),
//! the costliest product of a full fine-tuning backward, but takes A's and B's through r-wide
//! products:
//!
//!   dL/dW = dyᵀ x, so dL/dB = s dyᵀ x Aᵀ = s dyᵀ (x Aᵀ)   and   dL/dA = s Bᵀ dyᵀ x = s (dy B)ᵀ x,
//!
//! and x's gradient dy (W + s B A) = dy W + s (dy B) A, with no merged weight kept from the
//! forward: each product reads W as the model holds it plus an (rows, r) correction.

use candle_core::{DType, Result, Tensor};
use roll_cpu_kernels as fused;

use super::rows;
use crate::model::transformer::LayerWeights;

/// One adapted projection's factors, the model's variables (their gradients are keyed by them).
#[derive(Clone)]
pub(in crate::model) struct Factor {
    pub(in crate::model) a: Tensor,
    pub(in crate::model) b: Tensor,
    pub(in crate::model) scale: f64,
}

/// The factors of a layer's adapted projections (none where a projection is not adapted).
#[derive(Clone, Default)]
pub(in crate::model) struct LayerFactors {
    pub(in crate::model) q: Option<Factor>,
    pub(in crate::model) k: Option<Factor>,
    pub(in crate::model) v: Option<Factor>,
    pub(in crate::model) o: Option<Factor>,
    pub(in crate::model) gate: Option<Factor>,
    pub(in crate::model) up: Option<Factor>,
    pub(in crate::model) down: Option<Factor>,
}

/// A LoRA-adapted layer as its backward differentiates it: the frozen base (out of candle's
/// graph: no gradient is taken of it) and the adapter's factors.
#[derive(Clone)]
pub(in crate::model) struct Adapted {
    pub(in crate::model) base: LayerWeights,
    pub(in crate::model) factors: LayerFactors,
}

impl Factor {
    /// A's and B's values as the fused products take them (f32, out of candle's graph).
    fn values(&self) -> Result<(Tensor, Tensor)> {
        Ok((
            self.a.detach().to_dtype(DType::F32)?,
            self.b.detach().to_dtype(DType::F32)?,
        ))
    }

    /// s (dy B) (rows, r): what both A's gradient and the input's correction read.
    fn scaled_dy_b(&self, dy: &Tensor, b: &Tensor) -> Result<Tensor> {
        fused::product::matmul(dy, b)? * self.scale
    }

    /// Given dy (rows, out) and the projection's input x (b, t, in): the gradients of A and B,
    /// each with its variable.
    pub(super) fn grads(&self, dy: &Tensor, x: &Tensor) -> Result<[(Tensor, Tensor); 2]> {
        let (a, b) = self.values()?;
        let x = rows(x)?;
        let xa = fused::product::matmul(&x, &a.t()?)?;
        let db = (fused::product::matmul(&dy.t()?, &xa)? * self.scale)?;
        let da = fused::product::matmul(&self.scaled_dy_b(dy, &b)?.t()?, &x)?;
        Ok([(self.a.clone(), da), (self.b.clone(), db)])
    }

    /// `dx += s (dy B) A`: the adapter's part of the input's gradient, into dx (rows, in), which
    /// the caller owns.
    pub(super) fn add_input_grad(&self, dx: &Tensor, dy: &Tensor) -> Result<()> {
        let (a, b) = self.values()?;
        fused::product::matmul_add(dx, &self.scaled_dy_b(dy, &b)?, &a)
    }
}

/// For y = x (W + s B A)ᵀ given dy (rows, out): x's gradient dy W (+ s (dy B) A), fresh.
pub(super) fn input_grad(dy: &Tensor, w: &Tensor, factor: Option<&Factor>) -> Result<Tensor> {
    let dx = fused::product::matmul(dy, w)?;
    if let Some(f) = factor {
        f.add_input_grad(&dx, dy)?;
    }
    Ok(dx)
}

/// [`input_grad`] added into `sum` (rows, in), which the caller owns.
pub(super) fn add_input_grad(
    sum: &Tensor,
    dy: &Tensor,
    w: &Tensor,
    factor: Option<&Factor>,
) -> Result<()> {
    fused::product::matmul_add(sum, dy, w)?;
    if let Some(f) = factor {
        f.add_input_grad(sum, dy)?;
    }
    Ok(())
}
