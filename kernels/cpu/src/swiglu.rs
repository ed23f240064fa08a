//! SwiGLU, `silu(gate) * up`, as one op. With `s = sigmoid(g)`, `silu(g) = g s` and
//! `silu'(g) = s (1 + g (1 - s))`, so
//!   d gate = dy * up * s (1 + g (1 - s)),     d up = dy * g s.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::fresh::{assume_written, unwritten, write_all};
use super::{f32_data, unpack, vexp};

const NAME: &str = "fused swiglu";
/// Elements per parallel task: large enough that a task outweighs its scheduling.
const CHUNK: usize = 4096;

struct SwiGlu;
struct SwiGluGrad;

/// `exp(-g)` of every gate written into `e` (vectorised), and `e` as f32s;
/// `sigmoid(g) = 1 / (1 + exp(-g))`.
#[inline(always)]
fn exp_neg<'e, S: Simd>(simd: S, e: &'e mut [MaybeUninit<f32>], g: &[f32]) -> &'e mut [f32] {
    let e = write_all(e, g.iter().map(|&g| -g));
    vexp::exp_in_place_with(simd, e);
    e
}

// Each chunk runs as a `WithSimd` task, compiled for AVX2 and FMA where the CPU has them (pulp
// checks at run time; the crate targets baseline x86-64, where these loops ran four lanes wide).
// The same operations in the same order either way: the same bits.

/// y = silu(g) * u over one chunk.
struct Forward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    y: &'a mut [MaybeUninit<f32>],
}

impl WithSimd for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let y = exp_neg(simd, self.y, self.g);
        for ((y, &g), &u) in y.iter_mut().zip(self.g).zip(self.u) {
            let s = 1.0 / (1.0 + *y);
            *y = g * s * u;
        }
    }
}

/// d gate and d up over one chunk.
struct Backward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    dy: &'a [f32],
    dg: &'a mut [MaybeUninit<f32>],
    /// Written whole: as long as the others (`cpu_fwd` checks the lengths).
    du: &'a mut [MaybeUninit<f32>],
}

impl WithSimd for Backward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Backward { g, u, dy, dg, du } = self;
        let dg = exp_neg(simd, dg, g);
        let n = g
            .len()
            .min(u.len())
            .min(dy.len())
            .min(dg.len())
            .min(du.len());
        for k in 0..n {
            let s = 1.0 / (1.0 + dg[k]);
            dg[k] = dy[k] * u[k] * s * (1.0 + g[k] * (1.0 - s));
            du[k].write(dy[k] * g[k] * s);
        }
    }
}

fn same_len<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> Result<(&'a [f32], &'a [f32])> {
    let g = f32_data(s1, l1, NAME, "gate")?;
    let u = f32_data(s2, l2, NAME, "up")?;
    if l1.shape() != l2.shape() {
        bail!(
            "{NAME}: gate {:?} and up {:?} differ",
            l1.shape().dims(),
            l2.shape().dims()
        );
    }
    Ok((g, u))
}

impl CustomOp2 for SwiGlu {
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
        let (g, u) = same_len(s1, l1, s2, l2)?;
        let mut y = unwritten(g.len());
        let arch = pulp::Arch::new();
        y.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(y, (g, u))| arch.dispatch(Forward { g, u, y }));
        // SAFETY: each chunk of y went through `exp_neg`, which writes all of it.
        #[allow(unsafe_code)]
        let y = unsafe { assume_written(y) };
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dgate, dup) = backward(gate, up, grad)?;
        Ok((Some(dgate), Some(dup)))
    }
}

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "fused swiglu backward"
    }

    /// gate, up, dy -> [d gate | d up] flat.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = same_len(s1, l1, s2, l2)?;
        let dy = f32_data(s3, l3, NAME, "the gradient")?;
        if dy.len() != g.len() {
            bail!("{NAME}: gradient of {} for {} elements", dy.len(), g.len());
        }
        let n = g.len();
        let mut out = unwritten(2 * n);
        let (dg, du) = out.split_at_mut(n);
        let arch = pulp::Arch::new();
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .zip(dy.par_chunks(CHUNK))
            .for_each(|(((dg, du), (g, u)), dy)| {
                arch.dispatch(Backward { g, u, dy, dg, du });
            });
        // SAFETY: each chunk of dg went through `exp_neg`, which writes all of it, and each of
        // du through `Backward`'s loop, over all of it: g, u and dy are as long as dg and du
        // (checked above), so are their chunks.
        #[allow(unsafe_code)]
        let out = unsafe { assume_written(out) };
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }
}

/// gate, up: the same shape, f32 on CPU -> silu(gate) * up.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

/// The gradients of [`swiglu`]: gate, up and dy of one shape -> (dgate, dup). What candle's
/// backward of [`swiglu`] runs, for a caller differentiating by hand.
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    backward(&gate.contiguous()?, &up.contiguous()?, dy)
}

fn backward(gate: &Tensor, up: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let packed = gate.apply_op3_no_bwd(up, &dy.contiguous()?, &SwiGluGrad)?;
    let [dgate, dup] = unpack(&packed, [gate.dims(), up.dims()])?;
    Ok((dgate, dup))
}
