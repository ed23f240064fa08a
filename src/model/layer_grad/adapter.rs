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
//!
//! With LoRA dropout (PEFT's `lora_dropout` p) the adapter reads its input through a mask M of 0
//! and 1/(1 − p), drawn for each projection of each forward: y = x Wᵀ + s ((x ⊙ M) Aᵀ) Bᵀ, which
//! no merged weight computes, so the forward takes W and the adapter's products apart. The
//! gradients follow with x ⊙ M in x's place — dB = s dyᵀ ((x ⊙ M) Aᵀ), dA = s (dy B)ᵀ (x ⊙ M) —
//! and the input's correction masked: dx = dy W + (s (dy B) A) ⊙ M. The backward draws the same
//! mask again from its seed instead of keeping it.

use candle_core::{DType, Result, Tensor};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use roll_cpu_kernels as fused;

use super::rows;
use crate::model::transformer::LayerWeights;
use crate::seed::mix_seed;

/// One adapted projection's factors, the model's variables (their gradients are keyed by them).
#[derive(Clone)]
pub(in crate::model) struct Factor {
    pub(in crate::model) a: Tensor,
    pub(in crate::model) b: Tensor,
    pub(in crate::model) scale: f64,
    /// LoRA dropout on the adapter's input, in a training forward.
    pub(in crate::model) dropout: Option<Dropout>,
}

/// LoRA dropout of one projection in one forward: each input element the adapter reads is kept
/// with probability 1 − p and scaled by 1/(1 − p), by a mask drawn from `seed`.
#[derive(Clone, Copy, Debug)]
pub(in crate::model) struct Dropout {
    pub(in crate::model) p: f64,
    pub(in crate::model) seed: u64,
}

/// Rows of a dropout mask drawn from one generator: blocks are drawn side by side, each from its
/// own seed, so the mask depends on the seed and the shape only.
const MASK_BLOCK_ROWS: usize = 16;

impl Dropout {
    /// The mask (rows, cols) f32 on `device`: 0, or 1/(1 − p) where kept.
    pub(in crate::model) fn mask(
        &self,
        rows: usize,
        cols: usize,
        device: &candle_core::Device,
    ) -> Result<Tensor> {
        let kept = (1.0 / (1.0 - self.p)) as f32;
        // An element is dropped when its uniform u32 falls below p 2³².
        let threshold = (self.p * 4_294_967_296.0).min(u32::MAX as f64) as u32;
        let mut values = vec![0f32; rows * cols];
        values
            .par_chunks_mut((MASK_BLOCK_ROWS * cols).max(1))
            .enumerate()
            .for_each(|(block, chunk)| {
                let mut rng =
                    rand::rngs::StdRng::seed_from_u64(mix_seed(&[self.seed, block as u64]));
                for v in chunk {
                    *v = if rng.random::<u32>() < threshold {
                        0.0
                    } else {
                        kept
                    };
                }
            });
        Tensor::from_vec(values, (rows, cols), device)
    }
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

    /// The mask of this projection's dropout for an input of (rows, in), if it has one.
    fn mask(&self, x_rows: &Tensor) -> Result<Option<Tensor>> {
        let (n, cols) = x_rows.dims2()?;
        self.dropout
            .map(|d| d.mask(n, cols, x_rows.device()))
            .transpose()
    }

    /// The input as the adapter reads it (rows, in): x, or under dropout x ⊙ M.
    fn adapter_input(&self, x: &Tensor) -> Result<Tensor> {
        let x = rows(x)?;
        match self.mask(&x)? {
            Some(m) => x * m,
            None => Ok(x),
        }
    }

    /// Under dropout, the forward's adapter term: `y += s ((x ⊙ M) Aᵀ) Bᵀ` into y (b, t, out),
    /// the product x Wᵀ just made (the caller's own), given x (b, t, in).
    pub(super) fn add_output(&self, y: &Tensor, x: &Tensor) -> Result<()> {
        let (a, b) = self.values()?;
        let xa = (fused::product::matmul(&self.adapter_input(x)?, &a.t()?)? * self.scale)?;
        fused::product::matmul_add(&rows(y)?, &xa, &b.t()?)
    }

    /// Given dy (rows, out) and the projection's input x (b, t, in): the gradients of A and B,
    /// each with its variable.
    pub(super) fn grads(&self, dy: &Tensor, x: &Tensor) -> Result<[(Tensor, Tensor); 2]> {
        let (a, b) = self.values()?;
        let x = self.adapter_input(x)?;
        let xa = fused::product::matmul(&x, &a.t()?)?;
        let db = (fused::product::matmul(&dy.t()?, &xa)? * self.scale)?;
        let da = fused::product::matmul(&self.scaled_dy_b(dy, &b)?.t()?, &x)?;
        Ok([(self.a.clone(), da), (self.b.clone(), db)])
    }

    /// `dx += s (dy B) A` (⊙ M under dropout): the adapter's part of the input's gradient, into
    /// dx (rows, in), which the caller owns.
    pub(super) fn add_input_grad(&self, dx: &Tensor, dy: &Tensor) -> Result<()> {
        let (a, b) = self.values()?;
        match self.mask(dx)? {
            Some(m) => {
                let part = fused::product::matmul(&self.scaled_dy_b(dy, &b)?, &a)?;
                fused::accumulate::add_in_place(dx, &(part * m)?)
            }
            None => fused::product::matmul_add(dx, &self.scaled_dy_b(dy, &b)?, &a),
        }
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

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;

    fn t(rows: usize, cols: usize, seed: u64) -> Tensor {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((mix_seed(&[seed, i as u64]) % 2001) as f32 - 1000.0) / 1000.0)
            .collect();
        Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("t")
    }

    fn close(a: &Tensor, b: &Tensor, what: &str) {
        let (a, b) = (
            a.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("a"),
            b.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("b"),
        );
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    #[test]
    fn a_dropout_mask_keeps_one_minus_p_scaled_and_depends_on_its_seed_only() {
        let d = Dropout { p: 0.25, seed: 11 };
        let m = d.mask(200, 150, &Device::Cpu).expect("mask");
        let v = m.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("v");
        let dropped = v.iter().filter(|x| **x == 0.0).count() as f64 / v.len() as f64;
        // 30,000 draws: the dropped fraction's standard deviation is 0.0025.
        assert!((dropped - 0.25).abs() < 0.01, "{dropped}");
        assert!(v.iter().all(|x| *x == 0.0 || *x == (1.0f64 / 0.75) as f32));
        let again = d.mask(200, 150, &Device::Cpu).expect("again");
        assert_eq!(
            v,
            again
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("again")
        );
        let other = Dropout { seed: 12, ..d }
            .mask(200, 150, &Device::Cpu)
            .expect("other");
        assert_ne!(
            v,
            other
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("other")
        );
    }

    /// One adapted projection with dropout, y = x Wᵀ + s ((x ⊙ M) Aᵀ) Bᵀ and L = Σ y ⊙ R: the
    /// fused forward term and gradients equal candle's autograd of the same formula, with the
    /// mask the factor draws.
    #[test]
    fn an_adapted_projection_under_dropout_has_candles_values_and_gradients() {
        let (n, inp, out, r, s) = (37, 24, 20, 4, 2.5);
        let x = Var::from_tensor(&t(n, inp, 1)).expect("x");
        let w = t(out, inp, 2);
        let a = Var::from_tensor(&t(r, inp, 3)).expect("a");
        let b = Var::from_tensor(&t(out, r, 4)).expect("b");
        let upstream = t(n, out, 5);
        let dropout = Dropout { p: 0.3, seed: 9 };
        let mask = dropout.mask(n, inp, &Device::Cpu).expect("mask");

        let adapter = ((x.as_tensor() * &mask)
            .expect("xm")
            .matmul(&a.t().expect("at")))
        .and_then(|xa| xa.matmul(&b.t()?))
        .and_then(|d| d * s)
        .expect("adapter");
        let y = (x.matmul(&w.t().expect("wt")).expect("xw") + adapter).expect("y");
        let loss = (&y * &upstream).and_then(|l| l.sum_all()).expect("loss");
        let grads = loss.backward().expect("backward");

        let factor = Factor {
            a: a.as_tensor().clone(),
            b: b.as_tensor().clone(),
            scale: s,
            dropout: Some(dropout),
        };
        // The layer's activations are (b, t, features): one sequence of n tokens.
        let x3 = x.as_tensor().reshape((1, n, inp)).expect("x3");
        let fused_y = fused::product::matmul(x.as_tensor(), &w.t().expect("wt"))
            .and_then(|y| y.reshape((1, n, out)))
            .expect("xw");
        factor.add_output(&fused_y, &x3).expect("add");
        close(&fused_y, &y, "y");
        let [(_, da), (_, db)] = factor.grads(&upstream, &x3).expect("grads");
        close(&da, grads.get(&a).expect("dA"), "dA");
        close(&db, grads.get(&b).expect("dB"), "dB");
        let dx = input_grad(&upstream, &w, Some(&factor)).expect("dx");
        close(&dx, grads.get(&x).expect("dx"), "dx");
    }
}
