//! SwiGLU, `silu(gate) * up`, as one op. With `s = sigmoid(g)`, `silu(g) = g s` and
//! `silu'(g) = s (1 + g (1 - s))`, so
//!   d gate = dy * up * s (1 + g (1 - s)),     d up = dy * g s.
//!
//! A backward that did not keep the output (the training layer recomputes it, to hold less) can
//! have it made in the same pass as the gradients ([`swiglu_backward_and_output`]): one sigmoid
//! and one read of the gate and up for the three, where a separate forward read them again.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::fresh::{assume_written, store, unwritten};
use super::{f32_data, unpack, vexp};

const NAME: &str = "fused swiglu";
/// Elements per parallel task: large enough that a task outweighs its scheduling.
const CHUNK: usize = 4096;

struct SwiGlu;
struct SwiGluGrad {
    /// Whether the output is made again with the gradients.
    with_output: bool,
}

/// `sigmoid(g) = 1 / (1 + exp(-g))` of a vector of gates.
#[inline(always)]
fn sigmoid<S: Simd>(simd: S, g: S::f32s) -> S::f32s {
    let one = simd.splat_f32s(1.0);
    let e = vexp::exp_lanes(simd, simd.sub_f32s(simd.splat_f32s(0.0), g));
    simd.div_f32s(one, simd.add_f32s(one, e))
}

/// The same of one gate: [`vexp::exp`] is one lane of `exp_lanes`, so the same bits.
#[inline(always)]
fn sigmoid_one(g: f32) -> f32 {
    1.0 / (1.0 + vexp::exp(-g))
}

/// The output `silu(g) * up = (g s) up` from `s = sigmoid(g)`, multiplied in that order: one
/// definition for the forward and for the backward that makes the output again, whose bits
/// must be the forward's.
#[inline(always)]
fn output<S: Simd>(simd: S, g: S::f32s, s: S::f32s, u: S::f32s) -> S::f32s {
    simd.mul_f32s(simd.mul_f32s(g, s), u)
}

/// The same of one element, with the vectors' bits.
#[inline(always)]
fn output_one(g: f32, s: f32, u: f32) -> f32 {
    g * s * u
}

// Each chunk runs as a `WithSimd` task, compiled for AVX2 and FMA where the CPU has them (pulp
// checks at run time; the crate targets baseline x86-64). A chunk is one pass, a vector at a
// time: the gates' exponentials, the sigmoid and the products together (three passes over the
// chunk before: -g written, its exponentials in place, then the rest). Separate multiplies and
// adds in the formulas' order (no fused multiply-add), so the tail's element-by-element loop
// gives the same bits as the vectors.

/// y = silu(g) * u over one chunk.
struct Forward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    /// Written whole: as long as g and u (`cpu_fwd` checks the shapes).
    y: &'a mut [MaybeUninit<f32>],
}

impl WithSimd for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Forward { g, u, y } = self;
        let (gv, gt) = S::as_simd_f32s(g);
        let (uv, ut) = S::as_simd_f32s(u);
        let (yv, yt) = y.split_at_mut(gv.len() * S::F32_LANES);
        for (y, (&g, &u)) in yv.chunks_exact_mut(S::F32_LANES).zip(gv.iter().zip(uv)) {
            store::<S>(y, output(simd, g, sigmoid(simd, g), u));
        }
        for (y, (&g, &u)) in yt.iter_mut().zip(gt.iter().zip(ut)) {
            y.write(output_one(g, sigmoid_one(g), u));
        }
    }
}

/// d gate and d up over one chunk, and the output again where `y` is given.
struct Backward<'a> {
    g: &'a [f32],
    u: &'a [f32],
    dy: &'a [f32],
    /// Both written whole: as long as the others (`cpu_fwd` checks the lengths).
    dg: &'a mut [MaybeUninit<f32>],
    du: &'a mut [MaybeUninit<f32>],
    /// Written whole when given, with `Forward`'s bits (the same sigmoid and products).
    y: Option<&'a mut [MaybeUninit<f32>]>,
}

impl WithSimd for Backward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Backward {
            g,
            u,
            dy,
            dg,
            du,
            y,
        } = self;
        let lanes = S::F32_LANES;
        let one = simd.splat_f32s(1.0);
        let (gv, gt) = S::as_simd_f32s(g);
        let (uv, ut) = S::as_simd_f32s(u);
        let (dyv, dyt) = S::as_simd_f32s(dy);
        let (dgv, dgt) = dg.split_at_mut(gv.len() * lanes);
        let (duv, dut) = du.split_at_mut(gv.len() * lanes);
        // dy u s (1 + g (1 - s)), and dy g s, multiplied left to right.
        let grads = |g, u, dy, s| {
            let slope = simd.add_f32s(one, simd.mul_f32s(g, simd.sub_f32s(one, s)));
            let dgate = simd.mul_f32s(simd.mul_f32s(simd.mul_f32s(dy, u), s), slope);
            (dgate, simd.mul_f32s(simd.mul_f32s(dy, g), s))
        };
        let outs = dgv.chunks_exact_mut(lanes).zip(duv.chunks_exact_mut(lanes));
        let ins = gv.iter().zip(uv).zip(dyv);
        // Two loops rather than a test of `y` in one: the test would run at every vector.
        let mut yt = match y {
            Some(y) => {
                let (yv, yt) = y.split_at_mut(gv.len() * lanes);
                let outs = outs.zip(yv.chunks_exact_mut(lanes));
                for (((dg, du), y), ((&g, &u), &dy)) in outs.zip(ins) {
                    let s = sigmoid(simd, g);
                    let (dgate, dup) = grads(g, u, dy, s);
                    store::<S>(dg, dgate);
                    store::<S>(du, dup);
                    store::<S>(y, output(simd, g, s, u));
                }
                Some(yt)
            }
            None => {
                for ((dg, du), ((&g, &u), &dy)) in outs.zip(ins) {
                    let (dgate, dup) = grads(g, u, dy, sigmoid(simd, g));
                    store::<S>(dg, dgate);
                    store::<S>(du, dup);
                }
                None
            }
        };
        let tails = dgt.iter_mut().zip(dut.iter_mut());
        for (i, ((dg, du), ((&g, &u), &dy))) in tails.zip(gt.iter().zip(ut).zip(dyt)).enumerate() {
            let s = sigmoid_one(g);
            dg.write(dy * u * s * (1.0 + g * (1.0 - s)));
            du.write(dy * g * s);
            if let Some(yt) = yt.as_deref_mut() {
                yt[i].write(output_one(g, s, u));
            }
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
        // SAFETY: `Forward` writes every element of its chunk of y (vectors, then the tail),
        // and y's chunks are g's and u's, of one length.
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

    /// gate, up, dy -> [d gate | d up] flat, or [y | d gate | d up] with the output.
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
        let parts = if self.with_output { 3 } else { 2 };
        let mut out = unwritten(parts * n);
        let (y, grads) = out.split_at_mut((parts - 2) * n);
        let (dg, du) = grads.split_at_mut(n);
        // No output: an empty y, whose chunks `zip` would end at once, is not chunked.
        let ys: Vec<Option<&mut [MaybeUninit<f32>]>> = if self.with_output {
            y.chunks_mut(CHUNK).map(Some).collect()
        } else {
            (0..n.div_ceil(CHUNK)).map(|_| None).collect()
        };
        let arch = pulp::Arch::new();
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .zip(dy.par_chunks(CHUNK).zip(ys))
            .for_each(|(((dg, du), (g, u)), (dy, y))| {
                arch.dispatch(Backward {
                    g,
                    u,
                    dy,
                    dg,
                    du,
                    y,
                });
            });
        // SAFETY: `Backward` writes every element of its chunks of dg and du, and of y when it
        // is given (vectors, then the tail): g, u and dy are as long as dg, du and y (checked
        // above), so are their chunks, and y is given for every chunk or for none.
        #[allow(unsafe_code)]
        let out = unsafe { assume_written(out) };
        Ok((CpuStorage::F32(out), Shape::from(parts * n)))
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

/// [`swiglu`]'s output and its gradients from one pass: gate, up and dy of one shape -> (y,
/// dgate, dup), y with [`swiglu`]'s bits and the gradients with [`swiglu_backward`]'s. For a
/// backward that needs the output (the next projection's weight gradient reads it) and did not
/// keep it. The three share one allocation, freed when the last is.
pub fn swiglu_backward_and_output(
    gate: &Tensor,
    up: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (gate, up) = (gate.contiguous()?, up.contiguous()?);
    let op = SwiGluGrad { with_output: true };
    let packed = gate.apply_op3_no_bwd(&up, &dy.contiguous()?, &op)?;
    let [y, dgate, dup] = unpack(&packed, [gate.dims(), gate.dims(), up.dims()])?;
    Ok((y, dgate, dup))
}

fn backward(gate: &Tensor, up: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = SwiGluGrad { with_output: false };
    let packed = gate.apply_op3_no_bwd(up, &dy.contiguous()?, &op)?;
    let [dgate, dup] = unpack(&packed, [gate.dims(), up.dims()])?;
    Ok((dgate, dup))
}
