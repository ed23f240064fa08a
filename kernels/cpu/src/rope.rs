//! Rotary embedding in Hugging Face's "rotate_half" layout, on (batch, seq, heads, head_dim) as the
//! projections produce it, as one op:
//!   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin     (x1, x2 the two halves of a head).
//! A rotation's transpose is the rotation by the opposite angle, so the backward is the same kernel
//! with sin negated.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, bail};
use rayon::prelude::*;

use super::f32_data;

const NAME: &str = "fused rope";

struct Rope {
    /// Rotate by the opposite angle (the backward pass).
    inverse: bool,
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
        let mut y = vec![0f32; x.len()];
        // One (batch, position) at a time: all its heads share the angles.
        y.par_chunks_mut(h * d)
            .zip(x.par_chunks(h * d))
            .enumerate()
            .with_min_len(16)
            .for_each(|(bt, (y, x))| {
                let c = &cos[bt * half..(bt + 1) * half];
                let s = &sin[bt * half..(bt + 1) * half];
                for (y, x) in y.chunks_mut(d).zip(x.chunks(d)) {
                    let (x1, x2) = x.split_at(half);
                    let (y1, y2) = y.split_at_mut(half);
                    for k in 0..half {
                        let sk = sign * s[k];
                        y1[k] = x1[k] * c[k] - x2[k] * sk;
                        y2[k] = x2[k] * c[k] + x1[k] * sk;
                    }
                }
            });
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
