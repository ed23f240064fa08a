//! Fused CPU kernels, each with a hand-written backward pass, for the transformer's hot blocks:
//! RMSNorm, rotary embedding, SwiGLU and causal GQA attention, and for the policy loss: the
//! log-softmax, target gather and entropy of [`logprobs`], also fused with the output head's
//! product in [`head`] (whose backward never holds the whole logits' gradient); [`skinny`], the
//! few-row matrix product of decoding (no backward: inference only); and [`adamw`], the
//! optimizer's step in two passes over memory.
//!
//! Built from candle's elementwise ops, one layer of the model is about a hundred graph nodes, each
//! with its own dispatch, allocation and gradient bookkeeping; at the shapes we train on CPU that
//! bookkeeping, not arithmetic, is where the time goes (benches/RESULTS.md). Each kernel here is one
//! node forward and one backward, parallel over rows with rayon, and works in the (batch, seq,
//! heads, head_dim) layout the projections produce, so attention needs no transposes.
//!
//! Owns numerics only, for contiguous f32 tensors on the CPU ([`applies`]); roll-tui's transformer
//! (`src/model/transformer.rs`) keeps candle's ops for every other device and dtype. The tests
//! check values (1e-5) and gradients (1e-4 relative) against candle's differentiable ops.
//!
//! A package of its own so that it is compiled optimised in every profile: the test suite trains
//! and decodes through these loops, which run 10-50x slower unoptimised.

pub mod accumulate;
pub mod adamw;
pub mod attention;
mod fresh;
pub mod head;
pub mod logprobs;
pub mod product;
pub mod rms_norm;
pub mod rope;
pub mod skinny;
pub mod streamed;
pub mod swiglu;
mod transpose;
pub mod vexp;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor, bail};

/// Whether the fused kernels are on in this process (the default). Off, every [`applies`] of this
/// package answers no, so the engine runs candle's device-generic ops on the CPU too: the code a
/// CUDA device runs, exercised and tested where there is no GPU (roll-tui's `src/device.rs`,
/// `ROLL_KERNELS=generic`). Process-wide because the choice must reach every thread that computes
/// (rollout lanes, rayon's pool), and it is made once, before any model is built.
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turn the fused kernels on or off for this whole process (see [`enabled`]).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the fused kernels are on in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the fused kernels can take this tensor: f32 on the CPU, with the kernels on.
pub fn applies(t: &Tensor) -> bool {
    enabled() && t.device().is_cpu() && t.dtype() == DType::F32
}

/// The contiguous f32 data of a storage, or an error naming the kernel and the operand.
fn f32_data<'a>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: {what} must be f32, got {:?}", s.dtype());
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: {what} must be contiguous"),
    }
}

/// The contiguous f32 data of a tensor's storage (`Tensor::storage_and_layout`), for tensors a
/// kernel reads besides its operands: the mask, or the upstream gradient of a backward kernel.
fn storage_f32<'a>(s: &'a Storage, l: &Layout, op: &str, what: &str) -> Result<&'a [f32]> {
    let Storage::Cpu(cpu) = s else {
        bail!("{op}: {what} must be on the CPU");
    };
    f32_data(cpu, l, op, what)
}

/// The sum of the squares of `x` in f64, in eight independent partial sums added in a fixed order:
/// one running sum made every addition wait for the one before (a 4-cycle latency per element),
/// while eight fill the vector lanes; the order fixed here makes the result the same on any CPU.
/// RMSNorm's mean square and the optimizer's gradient norm.
#[inline(always)]
fn sum_of_squares_f64(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v) * f64::from(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += f64::from(v) * f64::from(v);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Splits a packed 1-D result of a backward kernel into tensors of the given shapes (views of
/// its storage, no copies).
fn unpack<const N: usize>(packed: &Tensor, shapes: [&[usize]; N]) -> Result<[Tensor; N]> {
    let mut at = 0;
    let mut part = |shape: &[usize]| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let t = packed.narrow(0, at, n)?.reshape(shape)?;
        at += n;
        Ok(t)
    };
    let mut out = Vec::with_capacity(N);
    for shape in shapes {
        out.push(part(shape)?);
    }
    out.try_into()
        .map_err(|_| candle_core::Error::Msg("unpack: part count".into()))
}

/// A few-row product's slice function: x (m, k) and w (n, k), both row-major, to y = x wᵀ (m, n).
pub(crate) type RowProduct<W = f32> = fn(&[f32], &[W], usize, usize, usize) -> Vec<f32>;

/// The candle op of the few-row products ([`skinny`], [`streamed`]): checks that x and w are
/// matrices of one depth, naming the kernel, and runs its slice function for w's dtype. No
/// backward.
struct RowsTimesWeight {
    name: &'static str,
    product: RowProduct,
    /// For a bf16 weight read in place, where the kernel has one.
    product_bf16: Option<RowProduct<half::bf16>>,
}

impl CustomOp2 for RowsTimesWeight {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name;
        let x = f32_data(s1, l1, name, "x")?;
        let (&[m, k], &[n, kw]) = (l1.dims(), l2.dims()) else {
            bail!(
                "{name}: x {:?} and weight {:?} must be matrices",
                l1.dims(),
                l2.dims()
            );
        };
        if k != kw {
            bail!("{name}: x has {k} columns, the weight {kw}");
        }
        let y = match (s2, self.product_bf16) {
            (CpuStorage::BF16(w), Some(product)) => match l2.contiguous_offsets() {
                Some((a, b)) => product(x, &w[a..b], m, k, n),
                None => bail!("{name}: the weight must be contiguous"),
            },
            _ => (self.product)(x, f32_data(s2, l2, name, "the weight")?, m, k, n),
        };
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

/// x (rows, k) times w (n, k) transposed -> (rows, n) through a few-row product, for inference:
/// no gradient flows back.
fn rows_times_weight(
    x: &Tensor,
    w: &Tensor,
    name: &'static str,
    product: RowProduct,
    product_bf16: Option<RowProduct<half::bf16>>,
) -> Result<Tensor> {
    let op = RowsTimesWeight {
        name,
        product,
        product_bf16,
    };
    x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &op)
}

#[cfg(test)]
mod tests;
