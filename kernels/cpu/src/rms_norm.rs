//! RMSNorm over the last dimension, `y = w * x * r` with `r = (mean(x^2) + eps)^(-1/2)`, as one op.
//!
//! Backward, from `dr/dx_j = -r^3 x_j / d`:
//!   dx_j = r w_j dy_j - (r^3 / d) x_j sum_i(dy_i w_i x_i),      dw_j = sum over rows of dy_j x_j r.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use super::{f32_data, sum_of_squares_f64, unpack};

const NAME: &str = "fused rms_norm";

struct RmsNorm {
    eps: f32,
}

struct RmsNormGrad {
    eps: f32,
}

/// `1 / sqrt(mean(x^2) + eps)` of one row, summed in f64 so long rows do not lose precision (in
/// eight partial sums: a running sum was ~4% of a tiny model's forward+backward).
#[inline(always)]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mean = (sum_of_squares_f64(x) / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// The sum of `a_j b_j c_j` in eight partial sums (as [`inv_rms`], for the same reason).
#[inline(always)]
fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n = a.len().min(b.len()).min(c.len());
    let body = n - n % 8;
    for k in (0..body).step_by(8) {
        for l in 0..8 {
            acc[l] += a[k + l] * b[k + l] * c[k + l];
        }
    }
    for k in body..n {
        acc[k - body] += a[k] * b[k] * c[k];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The rows of x and the weight, with the weight's length checked against the last dimension.
fn operands<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> Result<(usize, &'a [f32], &'a [f32])> {
    let d = *l1.shape().dims().last().unwrap_or(&0);
    let x = f32_data(s1, l1, NAME, "x")?;
    let w = f32_data(s2, l2, NAME, "weight")?;
    if d == 0 || w.len() != d {
        bail!("{NAME}: weight of {} for rows of {d}", w.len());
    }
    Ok((d, x, w))
}

/// Rows per forward task: a task must outweigh its scheduling.
const ROWS_PER_TASK: usize = 64;

// The row loops run as `WithSimd` tasks, compiled for AVX2 where the CPU has it (pulp checks at
// run time; the crate targets baseline x86-64, where these loops ran four lanes wide). The same
// operations in the same order in either case: the same bits.

/// Forward over a block of rows: y = w * x * r.
struct Normed<'a> {
    x: &'a [f32],
    w: &'a [f32],
    y: &'a mut [f32],
    d: usize,
    eps: f32,
}

impl WithSimd for Normed<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        for (y, x) in self.y.chunks_mut(self.d).zip(self.x.chunks(self.d)) {
            let r = inv_rms(x, self.eps);
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(self.w) {
                *y = x * r * w;
            }
        }
    }
}

/// Backward over a block of rows: their dx, and their share of dw (returned).
struct NormGradRows<'a> {
    x: &'a [f32],
    w: &'a [f32],
    dy: &'a [f32],
    dx: &'a mut [f32],
    d: usize,
    eps: f32,
}

impl WithSimd for NormGradRows<'_> {
    type Output = Vec<f32>;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> Vec<f32> {
        let (d, w) = (self.d, self.w);
        let mut dw = vec![0f32; d];
        let rows = self
            .dx
            .chunks_mut(d)
            .zip(self.x.chunks(d))
            .zip(self.dy.chunks(d));
        for ((dx, x), dy) in rows {
            let r = inv_rms(x, self.eps);
            let c = r * r * r * dot3(dy, w, x) / d as f32;
            for j in 0..d {
                dx[j] = r * w[j] * dy[j] - c * x[j];
                dw[j] += dy[j] * x[j] * r;
            }
        }
        dw
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (d, x, w) = operands(s1, l1, s2, l2)?;
        let mut y = vec![0f32; x.len()];
        let arch = pulp::Arch::new();
        let eps = self.eps;
        y.par_chunks_mut(ROWS_PER_TASK * d)
            .zip(x.par_chunks(ROWS_PER_TASK * d))
            .for_each(|(y, x)| arch.dispatch(Normed { x, w, y, d, eps }));
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = backward(x, w, grad, self.eps)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for RmsNormGrad {
    fn name(&self) -> &'static str {
        "fused rms_norm backward"
    }

    /// x, w, dy -> [dx (x's shape) | dw (d)] flat.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (d, x, w) = operands(s1, l1, s2, l2)?;
        let dy = f32_data(s3, l3, NAME, "the gradient")?;
        if dy.len() != x.len() {
            bail!("{NAME}: gradient of {} for x of {}", dy.len(), x.len());
        }
        let n = x.len();
        let mut out = vec![0f32; n + d];
        let (dx, dw) = out.split_at_mut(n);
        // Rows in blocks: each block writes its dx rows and sums its share of dw, and the blocks'
        // partial dw are added at the end (no shared accumulator between threads).
        let block = (n / d)
            .div_ceil(rayon::current_num_threads().max(1) * 4)
            .max(1)
            * d;
        let arch = pulp::Arch::new();
        let eps = self.eps;
        let partial: Vec<Vec<f32>> = dx
            .par_chunks_mut(block)
            .zip(x.par_chunks(block).zip(dy.par_chunks(block)))
            .map(|(dx, (x, dy))| {
                arch.dispatch(NormGradRows {
                    x,
                    w,
                    dy,
                    dx,
                    d,
                    eps,
                })
            })
            .collect();
        for p in partial {
            for (a, b) in dw.iter_mut().zip(p) {
                *a += b;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from(n + d)))
    }
}

/// x: (..., d) f32 on CPU, weight: (d) -> (..., d).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&weight.contiguous()?, RmsNorm { eps: eps as f32 })
}

/// The gradients of [`rms_norm`]: x (..., d), weight (d) and dy (x's shape) -> (dx, dweight).
/// What candle's backward of [`rms_norm`] runs, for a caller differentiating by hand.
pub fn rms_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    backward(&x.contiguous()?, &weight.contiguous()?, dy, eps as f32)
}

fn backward(x: &Tensor, w: &Tensor, dy: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let packed = x.apply_op3_no_bwd(w, &dy.contiguous()?, &RmsNormGrad { eps })?;
    let d = w.elem_count();
    let [dx, dw] = unpack(&packed, [x.dims(), &[d]])?;
    Ok((dx, dw))
}
