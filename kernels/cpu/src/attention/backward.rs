//! Attention's backward: for each (batch row, kv head) it recomputes a query row's probabilities
//! and takes dQ, dK and dV from them (the formulas are in the parent module's header).

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use super::lanes::{axpy, dot, weighted_sum};
use super::{Inputs, NAME, tasks, with_inputs};
use crate::fresh::{assume_written, unwritten};
use crate::{storage_f32, unpack};

impl Inputs<'_> {
    /// dQ (groups * t, head_dim), dK and dV (tk, head_dim) of one (batch row, kv head); `hd` as
    /// for [`Inputs::forward_position`].
    #[inline(always)]
    fn backward_task<S: Simd>(
        &self,
        simd: S,
        (n, kv, hd): (usize, usize, usize),
        out: &[f32],
        grad: &[f32],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let d = &self.d;
        let mut dq = vec![0f32; d.groups * d.t * hd];
        let mut dk = vec![0f32; d.tk * hd];
        let mut dv = vec![0f32; d.tk * hd];
        let mut p = vec![0f32; d.tk];
        let mut ds = vec![0f32; d.tk];
        for (row, dqi) in dq.chunks_mut(hd).enumerate() {
            let (r, i) = (row / d.t, row % d.t);
            let at = d.q_at(n, i, kv * d.groups + r);
            let (qi, doi) = (&self.q[at..][..hd], &grad[at..][..hd]);
            let keys = self.probs(simd, n, kv, hd, r, i, &mut p);
            let di = dot(simd, doi, &out[at..][..hd]);
            let ds = &mut ds[..keys.len()];
            let (dk, dv) = (&mut dk[keys.start * hd..], &mut dv[keys.start * hd..]);
            let rows = p
                .iter()
                .zip(ds.iter_mut())
                .zip(self.kv_rows(self.v, n, kv, hd, keys.clone()))
                .zip(dk.chunks_exact_mut(hd).zip(dv.chunks_exact_mut(hd)));
            for (((&pj, dsj), vj), (dkj, dvj)) in rows {
                *dsj = 0.0;
                if pj == 0.0 {
                    continue;
                }
                *dsj = pj * (dot(simd, doi, vj) - di) * self.scale;
                axpy(simd, dkj, *dsj, qi);
                axpy(simd, dvj, pj, doi);
            }
            weighted_sum(simd, dqi, ds, || {
                self.kv_rows(self.k, n, kv, hd, keys.clone())
            });
        }
        (dq, dk, dv)
    }
}

/// One (batch row, kv head) of the backward, dispatched as the forward's `ForwardTask` is.
struct BackwardTask<'a, 'x> {
    x: &'a Inputs<'x>,
    n: usize,
    kv: usize,
    out: &'a [f32],
    grad: &'a [f32],
}

impl WithSimd for BackwardTask<'_, '_> {
    type Output = (Vec<f32>, Vec<f32>, Vec<f32>);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> Self::Output {
        let (x, n, kv) = (self.x, self.n, self.kv);
        let (out, grad) = (self.out, self.grad);
        match x.d.head_dim {
            32 => x.backward_task(simd, (n, kv, 32), out, grad),
            64 => x.backward_task(simd, (n, kv, 64), out, grad),
            128 => x.backward_task(simd, (n, kv, 128), out, grad),
            hd => x.backward_task(simd, (n, kv, hd), out, grad),
        }
    }
}

/// The backward kernel: its operands are q, k, v; the forward's output and its gradient ride along.
struct AttentionGrad {
    mask: Tensor,
    scale: f32,
    out: Tensor,
    grad: Tensor,
}

impl CustomOp3 for AttentionGrad {
    fn name(&self) -> &'static str {
        "fused attention backward"
    }

    /// q, k, v -> [dq | dk | dv] flat.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (os, ol) = self.out.storage_and_layout();
        let (gs, gl) = self.grad.storage_and_layout();
        let out = storage_f32(&os, ol, NAME, "the output")?;
        let grad = storage_f32(&gs, gl, NAME, "the gradient")?;
        with_inputs(&self.mask, self.scale, s1, l1, s2, l2, s3, l3, |x| {
            let d = x.d;
            if out.len() != d.q_len() || grad.len() != d.q_len() {
                bail!("{NAME}: output or gradient does not match the queries");
            }
            let arch = pulp::Arch::new();
            let parts: Vec<_> = tasks(&d)
                .map(|(n, kv)| {
                    let task = BackwardTask {
                        x,
                        n,
                        kv,
                        out,
                        grad,
                    };
                    (n, kv, arch.dispatch(task))
                })
                .collect();
            let (ql, kl) = (d.q_len(), d.kv_len());
            let mut packed = unwritten(ql + 2 * kl);
            let (dq, rest) = packed.split_at_mut(ql);
            let (dk, dv) = rest.split_at_mut(kl);
            for (n, kv, (q_rows, k_rows, v_rows)) in parts {
                x.scatter_q(dq, n, kv, &q_rows);
                x.scatter_kv(dk, n, kv, &k_rows);
                x.scatter_kv(dv, n, kv, &v_rows);
            }
            // SAFETY: the tasks are every (batch row, kv head): their rows are every element of
            // dq (all query heads' t rows) and of dk and dv (all tk rows of every kv head).
            #[allow(unsafe_code)]
            let packed = unsafe { assume_written(packed) };
            Ok((CpuStorage::F32(packed), Shape::from(ql + 2 * kl)))
        })
    }
}

/// The gradients of [`attention`] with respect to q, k and v, given its output `out` and the
/// output's gradient dy: (dq, dk, dv) in the shapes of q, k and v. q, k, v and mask as
/// [`attention`] took them (keys and values contiguous). What candle's backward of [`attention`]
/// runs, for a caller differentiating by hand.
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    out: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    backward(
        &q.contiguous()?,
        &k.contiguous()?,
        &v.contiguous()?,
        &mask.contiguous()?,
        scale as f32,
        out,
        dy,
    )
}

pub(super) fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f32,
    out: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = AttentionGrad {
        mask: mask.clone(),
        scale,
        out: out.contiguous()?,
        grad: dy.contiguous()?,
    };
    let packed = q.apply_op3_no_bwd(k, v, &op)?;
    let [dq, dk, dv] = unpack(&packed, [q.dims(), k.dims(), v.dims()])?;
    Ok((dq, dk, dv))
}
