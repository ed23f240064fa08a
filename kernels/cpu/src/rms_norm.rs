//! RMSNorm over the last dimension, `y = w * x * r` with `r = (mean(x^2) + eps)^(-1/2)`, as one op.
//!
//! Backward, from `dr/dx_j = -r^3 x_j / d`:
//!   dx_j = r w_j dy_j - (r^3 / d) x_j sum_i(dy_i w_i x_i),      dw_j = sum over rows of dy_j x_j r.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::fresh::{assume_written, unwritten, zeroed};
use super::{f32_data, storage_f32, sum_of_squares_f64, unpack};

const NAME: &str = "fused rms_norm";

struct RmsNorm {
    eps: f32,
}

struct RmsNormGrad {
    eps: f32,
    /// Added to dx as it is written (x's shape): the gradient the norm's input gets by another
    /// path, a residual connection's, summed in the same pass instead of one of its own.
    plus: Option<Tensor>,
}

/// `1 / sqrt(mean(x^2) + eps)` of one row, summed in f64 so long rows do not lose precision (in
/// eight partial sums: a running sum was ~4% of a tiny model's forward+backward).
#[inline(always)]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mean = (sum_of_squares_f64(x) / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// The sum of `a_j b_j c_j` in eight partial sums (as [`inv_rms`], for the same reason): sum `l`
/// takes the elements `l, l + 8, l + 16, ...` in order, then the tail's element `l`.
///
/// Over chunks of exactly eight, whose lengths the compiler knows: indexed as `a[k + l]` from a
/// stepped range, every element kept three bounds checks and the loop ran one scalar element at
/// a time, 57% of the backward's time; now eight lanes at once, the backward 2.1-2.4x faster
/// (benches/RESULTS.md's git history). The same sums in the same order: the same bits.
#[inline(always)]
fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (
        a[..n].chunks_exact(8),
        b[..n].chunks_exact(8),
        c[..n].chunks_exact(8),
    );
    let tails = a.remainder().iter().zip(b.remainder()).zip(c.remainder());
    for ((a, b), c) in a.zip(b).zip(c) {
        for (((acc, &a), &b), &c) in acc.iter_mut().zip(a).zip(b).zip(c) {
            *acc += a * b * c;
        }
    }
    for (acc, ((&a, &b), &c)) in acc.iter_mut().zip(tails) {
        *acc += a * b * c;
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
    /// Written whole: as long as x, rows of d.
    y: &'a mut [MaybeUninit<f32>],
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
                y.write(x * r * w);
            }
        }
    }
}

/// Backward over a block of rows: their dx, and their share of dw (returned).
struct NormGradRows<'a> {
    x: &'a [f32],
    w: &'a [f32],
    dy: &'a [f32],
    /// Written whole: as long as x and dy, rows of d.
    dx: &'a mut [MaybeUninit<f32>],
    /// As long as dx, or empty: added to it.
    plus: &'a [f32],
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
        let mut plus = self.plus.chunks(d);
        // Zipped slices, not indices, so that no bounds check stays in the loops (64.3 -> 55.7 us
        // at 480 x 128, benches/RESULTS.md's git history). The same expressions, so the same
        // bits.
        for ((dx, x), dy) in rows {
            let r = inv_rms(x, self.eps);
            let c = r * r * r * dot3(dy, w, x) / d as f32;
            let terms = dx.iter_mut().zip(x).zip(w).zip(dy);
            match plus.next() {
                // The same two roundings as a sum of its own after the norm's dx: (dx) + plus.
                Some(p) => {
                    for ((((dx, &x), &w), &dy), &p) in terms.zip(p) {
                        dx.write((r * w * dy - c * x) + p);
                    }
                }
                None => {
                    for (((dx, &x), &w), &dy) in terms {
                        dx.write(r * w * dy - c * x);
                    }
                }
            }
            for ((dw, &dy), &x) in dw.iter_mut().zip(dy).zip(x) {
                *dw += dy * x * r;
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
        let mut y = unwritten(x.len());
        let arch = pulp::Arch::new();
        let eps = self.eps;
        y.par_chunks_mut(ROWS_PER_TASK * d)
            .zip(x.par_chunks(ROWS_PER_TASK * d))
            .for_each(|(y, x)| arch.dispatch(Normed { x, w, y, d, eps }));
        // SAFETY: `Normed` writes each of its rows whole, and y's blocks are x's, whose length
        // is a multiple of d (`operands` checks it).
        #[allow(unsafe_code)]
        let y = unsafe { assume_written(y) };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = backward(x, w, grad, self.eps, None)?;
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
        let plus_guard = self.plus.as_ref().map(Tensor::storage_and_layout);
        let plus = match &plus_guard {
            Some((ps, pl)) => {
                let p = storage_f32(ps, pl, NAME, "the added gradient")?;
                if p.len() != n {
                    bail!("{NAME}: added gradient of {} for x of {n}", p.len());
                }
                p
            }
            None => &[],
        };
        let mut out = unwritten(n + d);
        let (dx, dw) = out.split_at_mut(n);
        let dw = zeroed(dw);
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
            .enumerate()
            .map(|(i, (dx, (x, dy)))| {
                let plus = plus.get(i * block..i * block + dx.len()).unwrap_or(&[]);
                arch.dispatch(NormGradRows {
                    x,
                    w,
                    dy,
                    dx,
                    plus,
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
        // SAFETY: dw was written above, and `NormGradRows` writes each of dx's rows whole (its
        // blocks are x's and dy's, of equal lengths, multiples of d).
        #[allow(unsafe_code)]
        let out = unsafe { assume_written(out) };
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
    backward(
        &x.contiguous()?,
        &weight.contiguous()?,
        dy,
        eps as f32,
        None,
    )
}

/// [`rms_norm_backward`] with `plus` (x's shape) added to dx in the same pass: the gradient of a
/// norm's input that also reaches it by a residual connection. The same bits as the sum taken
/// after (each element is `dx + plus`, one rounding, as a sum of its own would be).
pub fn rms_norm_backward_plus(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    eps: f64,
    plus: &Tensor,
) -> Result<(Tensor, Tensor)> {
    if plus.dims() != x.dims() {
        bail!(
            "{NAME}: added gradient {:?} for x {:?}",
            plus.dims(),
            x.dims()
        );
    }
    let plus = plus.contiguous()?;
    backward(
        &x.contiguous()?,
        &weight.contiguous()?,
        dy,
        eps as f32,
        Some(plus),
    )
}

fn backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f32,
    plus: Option<Tensor>,
) -> Result<(Tensor, Tensor)> {
    let packed = x.apply_op3_no_bwd(w, &dy.contiguous()?, &RmsNormGrad { eps, plus })?;
    let d = w.elem_count();
    let [dx, dw] = unpack(&packed, [x.dims(), &[d]])?;
    Ok((dx, dw))
}

#[cfg(test)]
mod tests {
    use super::dot3;

    /// `dot3` sums in the order the doc states, bit for bit: element `j` into partial sum `j % 8`
    /// in order, the sums then added in a fixed tree; with whole chunks, tails and lengths that
    /// differ (the shortest decides). Values of mixed signs and scales, so that another order
    /// rounds differently: the tail added one partial sum off fails it (checked).
    #[test]
    fn dot3_sums_in_its_stated_order() {
        // Magnitudes from 1e-3 to 1e3: a sum taken in another order rounds differently.
        let value =
            |i: usize, f: f32| ((i as f32 + 0.5) * f).sin() * 10f32.powi((i * 5 % 7) as i32 - 3);
        for n in [0, 1, 5, 8, 13, 24, 131] {
            let a: Vec<f32> = (0..n).map(|i| value(i, 0.37)).collect();
            let b: Vec<f32> = (0..n + 3).map(|i| value(i, 1.3)).collect();
            let c: Vec<f32> = (0..n + 1).map(|i| value(i, 0.11)).collect();
            let mut acc = [0f32; 8];
            for j in 0..n {
                acc[j % 8] += a[j] * b[j] * c[j];
            }
            let expected =
                ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            assert_eq!(dot3(&a, &b, &c).to_bits(), expected.to_bits(), "n {n}");
        }
    }
}
