//! Rotary embedding in Hugging Face's "rotate_half" layout, on (batch, seq, heads, head_dim) as the
//! projections produce it, as one op:
//!   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin     (x1, x2 the two halves of a head).
//! A rotation's transpose is the rotation by the opposite angle, so the backward is the same kernel
//! with sin negated.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::f32_data;
use super::fresh::{assume_written, store, unwritten};

const NAME: &str = "fused rope";

struct Rope {
    /// Rotate by the opposite angle (the backward pass).
    inverse: bool,
}

/// (batch, position) rows per parallel task: a task must outweigh its scheduling.
const POSITIONS_PER_TASK: usize = 16;

/// Rotates a block of (batch, position) rows, each `cos.len() / rows` angles, compiled for AVX2
/// where the CPU has it (pulp checks at run time; the crate targets baseline x86-64, where the
/// loop ran four lanes wide). The same operations either way: the same bits.
struct Rotate<'a> {
    x: &'a [f32],
    /// Written whole: as long as x, rows of heads of d (d even).
    y: &'a mut [MaybeUninit<f32>],
    cos: &'a [f32],
    sin: &'a [f32],
    d: usize,
    sign: f32,
}

impl WithSimd for Rotate<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let half = self.d / 2;
        let rows = self.cos.len() / half.max(1);
        let row = self.x.len() / rows.max(1);
        let positions = self.y.chunks_mut(row).zip(self.x.chunks(row));
        for (p, (y, x)) in positions.enumerate() {
            let c = &self.cos[p * half..][..half];
            let s = &self.sin[p * half..][..half];
            for (y, x) in y.chunks_mut(self.d).zip(x.chunks(self.d)) {
                let (x1, x2) = x.split_at(half);
                let (y1, y2) = y.split_at_mut(half);
                if half.is_multiple_of(S::F32_LANES) {
                    rotate_lanes(simd, (y1, y2), (x1, x2), (c, s), self.sign);
                    continue;
                }
                for k in 0..half {
                    let sk = self.sign * s[k];
                    y1[k].write(x1[k] * c[k] - x2[k] * sk);
                    y2[k].write(x2[k] * c[k] + x1[k] * sk);
                }
            }
        }
    }
}

/// One head's rotation a vector at a time, for halves of whole vectors (head dims 32, 64, 128):
/// the element loop above, compiled for a head's 16-element halves, spent more on its set-up
/// than on the rotation (1.5% of a tiny forward+backward). The same operations in the same
/// order, separate multiplies and adds (no fused multiply-add), so the same bits.
#[inline(always)]
fn rotate_lanes<S: Simd>(
    simd: S,
    (y1, y2): (&mut [MaybeUninit<f32>], &mut [MaybeUninit<f32>]),
    (x1, x2): (&[f32], &[f32]),
    (c, s): (&[f32], &[f32]),
    sign: f32,
) {
    let lanes = S::F32_LANES;
    let sign = simd.splat_f32s(sign);
    let (x1, _) = S::as_simd_f32s(x1);
    let (x2, _) = S::as_simd_f32s(x2);
    let (c, _) = S::as_simd_f32s(c);
    let (s, _) = S::as_simd_f32s(s);
    let outs = y1.chunks_exact_mut(lanes).zip(y2.chunks_exact_mut(lanes));
    for ((o1, o2), ((&a, &b), (&c, &s))) in outs.zip(x1.iter().zip(x2).zip(c.iter().zip(s))) {
        let sk = simd.mul_f32s(sign, s);
        let r1 = simd.sub_f32s(simd.mul_f32s(a, c), simd.mul_f32s(b, sk));
        let r2 = simd.add_f32s(simd.mul_f32s(b, c), simd.mul_f32s(a, sk));
        store::<S>(o1, r1);
        store::<S>(o2, r2);
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, t, h, d) = l1.shape().dims4()?;
        let half = d / 2;
        if d == 0
            || d % 2 != 0
            || l2.shape().dims() != [b, t, half]
            || l3.shape().dims() != [b, t, half]
        {
            bail!(
                "{NAME}: x {:?} needs cos and sin of ({b}, {t}, {half}), got {:?} and {:?}",
                l1.shape().dims(),
                l2.shape().dims(),
                l3.shape().dims()
            );
        }
        let x = f32_data(s1, l1, NAME, "x")?;
        let cos = f32_data(s2, l2, NAME, "cos")?;
        let sin = f32_data(s3, l3, NAME, "sin")?;
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let row = h * d;
        if row == 0 {
            // No heads: nothing to rotate (and no chunks of zero length to ask rayon for).
            return Ok((CpuStorage::F32(Vec::new()), l1.shape().clone()));
        }
        let mut y = unwritten(x.len());
        let arch = pulp::Arch::new();
        // Blocks of (batch, position) rows; all heads of a row share its angles.
        y.par_chunks_mut(POSITIONS_PER_TASK * row)
            .zip(x.par_chunks(POSITIONS_PER_TASK * row))
            .enumerate()
            .for_each(|(block, (y, x))| {
                let first = block * POSITIONS_PER_TASK * half;
                let angles = first..first + y.len() / row * half;
                arch.dispatch(Rotate {
                    x,
                    y,
                    cos: &cos[angles.clone()],
                    sin: &sin[angles],
                    d,
                    sign,
                });
            });
        // SAFETY: `Rotate` writes both halves of every head of every row of its block, and the
        // blocks of y are x's, (b, t) rows of h heads of d.
        #[allow(unsafe_code)]
        let y = unsafe { assume_written(y) };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = rotate(grad, cos, sin, !self.inverse)?;
        Ok((Some(dx), None, None))
    }
}

/// x: (b, t, heads, head_dim) f32 on CPU; cos, sin: (b, t, head_dim / 2) -> (b, t, heads, head_dim).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &cos.contiguous()?,
        &sin.contiguous()?,
        Rope { inverse: false },
    )
}

/// The gradient of [`rope`] with respect to x, given dy (x's shape): the inverse rotation of dy.
/// What candle's backward of [`rope`] runs, for a caller differentiating by hand.
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(dy, &cos.contiguous()?, &sin.contiguous()?, true)
}

fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
    x.contiguous()?
        .apply_op3_no_bwd(cos, sin, &Rope { inverse })
}
